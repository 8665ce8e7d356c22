//! Signed grants end to end: a `SigningCoordinator` over the SQLite
//! coordinator (fake clock), and a SQLite resource (fencecheck-sqlite)
//! whose scopes require signed tokens. Interleavings are forced by explicit
//! clock moves, never sleeps.

use crate::common;

use std::sync::Arc;

use anyhow::{Result, bail, ensure};
use common::{TempDir, runtime};
use fencecheck::{AuthFailure, GrantKey, Policy, Request, Token};
use fencecheck_authority::{
    AcquireOutcome, AuthorityError, Coordinator, Grant, ManualClock, SigningCoordinator,
    SqliteCoordinator,
};
use fencecheck_sqlite::{Fenced, Rejection, fenced_write, install, set_keys};
use rusqlite::Connection;

const LOCK: &str = "report/july";
const TTL: u64 = 30_000;

fn key(id: u32) -> GrantKey {
    GrantKey {
        key_id: id,
        secret: vec![u8::try_from(id).unwrap_or(0); 32],
    }
}

fn granted(outcome: AcquireOutcome) -> Result<Grant> {
    match outcome {
        AcquireOutcome::Acquired(grant) => Ok(grant),
        AcquireOutcome::Busy { holder, .. } => bail!("busy: held by {holder}"),
    }
}

/// The resource: a SQLite database whose `report/` scopes require tokens
/// signed by key 3, with a log table the fenced writes append to.
fn resource(dir: &TempDir) -> Result<Connection> {
    let conn = Connection::open(dir.join("resource.db"))?;
    install(&conn)?;
    set_keys(&conn, "report/", &[key(3)])?;
    conn.execute_batch("CREATE TABLE log (writer TEXT)")?;
    Ok(conn)
}

fn write(conn: &mut Connection, request: &Request, writer: &str) -> Result<Fenced<()>> {
    let mut guest = runtime()?.instance()?;
    Ok(fenced_write(conn, &mut guest, request, |tx, _| {
        tx.execute("INSERT INTO log (writer) VALUES (?1)", [writer])
            .map(|_| ())
    })?)
}

fn log(conn: &Connection) -> Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT writer FROM log ORDER BY rowid")?;
    let rows = stmt.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The decisive test with signed tokens: A's signed grant, paused past its
/// expiry on the coordinator's clock, is still fenced as stale (a valid
/// signature never makes an old token new); B's signed grant applies; a
/// forger's u64::MAX token is refused unsigned, and with A's signature
/// attached, as a bad signature; nothing of theirs is written.
#[test]
fn signed_grants_and_the_paused_owner() -> Result<()> {
    let dir = TempDir::new("signed")?;
    let clock = Arc::new(ManualClock::new(0));
    let plain = SqliteCoordinator::open(&dir.join("locks.db"), runtime()?, clock.clone())?;
    let coordinator = SigningCoordinator::new(plain, &runtime()?, key(3))?;
    ensure!(coordinator.key_id() == 3);
    let mut conn = resource(&dir)?;

    let a = granted(coordinator.acquire(LOCK, "a7", TTL)?)?;
    ensure!(a.signature.as_ref().map(|s| s.lease_id.as_str()) == Some("a7"));
    // A retried acquire (an unknown outcome's recovery) gets the same grant.
    ensure!(granted(coordinator.acquire(LOCK, "a7", TTL)?)? == a);
    // Busy is passed through as it is.
    ensure!(matches!(
        coordinator.acquire(LOCK, "b9", TTL)?,
        AcquireOutcome::Busy { .. }
    ));
    let a_request = Request::new(LOCK, a.token, Policy::Strict);
    let a_request = Request {
        signature: a.signature.clone(),
        ..a_request
    };
    // A pauses; its lease expires on the coordinator's clock; B acquires.
    clock.advance(TTL);
    let b = granted(coordinator.acquire(LOCK, "b9", TTL)?)?;
    ensure!(b.token.grant_order(&a.token).is_gt());
    let b_request = Request {
        signature: b.signature.clone(),
        ..Request::new(LOCK, b.token, Policy::Strict)
    };
    ensure!(write(&mut conn, &b_request, "B")?.is_applied());

    let outcome = write(&mut conn, &a_request, "A")?;
    ensure!(
        matches!(outcome, Fenced::Rejected(Rejection::StaleFence { .. })),
        "A resumed: {outcome:?}"
    );
    let max = Token::new(0, u64::MAX, u64::MAX);
    let forged = Request::new(LOCK, max, Policy::Strict);
    let outcome = write(&mut conn, &forged, "forger")?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::Unsigned)),
        "{outcome:?}"
    );
    let forged = Request {
        signature: a.signature.clone(),
        ..forged
    };
    let outcome = write(&mut conn, &forged, "forger")?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::BadSignature)),
        "{outcome:?}"
    );
    ensure!(log(&conn)? == ["B"]);
    // The signed token text carries the signature and parses back.
    let text = b.token_text().to_string();
    ensure!(text.parse::<fencecheck::SignedTokenText>()? == b.token_text());
    let plain_text = fencecheck::TokenText(b.token).to_string();
    ensure!(text.starts_with(&format!("{plain_text}~3~")), "{text}");
    Ok(())
}

/// A plain coordinator's grants carry no signature and are refused
/// (`unsigned`) where signatures are required; a coordinator signing with
/// a key the resource does not trust is `unknown-key`.
#[test]
fn unsigned_and_untrusted_authorities_are_refused() -> Result<()> {
    let dir = TempDir::new("unsigned")?;
    let clock = Arc::new(ManualClock::new(0));
    let plain = SqliteCoordinator::open(&dir.join("locks.db"), runtime()?, clock.clone())?;
    let grant = granted(plain.acquire(LOCK, "a7", TTL)?)?;
    ensure!(grant.signature.is_none());
    let mut conn = resource(&dir)?;
    let request = Request::new(LOCK, grant.token, Policy::Strict);
    let outcome = write(&mut conn, &request, "plain")?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::Unsigned)),
        "{outcome:?}"
    );
    let other = SqliteCoordinator::open(&dir.join("other.db"), runtime()?, clock)?;
    let untrusted = SigningCoordinator::new(other, &runtime()?, key(4))?;
    let grant = granted(untrusted.acquire(LOCK, "b9", TTL)?)?;
    let request = Request {
        signature: grant.signature,
        ..Request::new(LOCK, grant.token, Policy::Strict)
    };
    let outcome = write(&mut conn, &request, "untrusted")?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::UnknownKey)),
        "{outcome:?}"
    );
    ensure!(log(&conn)?.is_empty());
    Ok(())
}

/// An unusable signing key, or a component without signed tokens (the
/// released 0.1.0), is refused when the coordinator is built, before any
/// grant is made.
#[test]
fn unusable_signers_are_refused_up_front() -> Result<()> {
    let dir = TempDir::new("signer")?;
    let clock = Arc::new(ManualClock::new(0));
    let short = GrantKey {
        key_id: 1,
        secret: vec![1; 8],
    };
    let plain = SqliteCoordinator::open(&dir.join("locks.db"), runtime()?, clock.clone())?;
    match SigningCoordinator::new(plain, &runtime()?, short) {
        Err(AuthorityError::Signing { why }) if why.contains("short-secret") => {}
        other => bail!("{other:?}"),
    }
    let old = fencecheck_tests::upgrade::old_runtime()?;
    let plain = SqliteCoordinator::open(&dir.join("locks.db"), runtime()?, clock)?;
    match SigningCoordinator::new(plain, &old, key(1)) {
        Err(AuthorityError::Signing { why }) if why.contains("0.1.0") => {}
        other => bail!("{other:?}"),
    }
    Ok(())
}
