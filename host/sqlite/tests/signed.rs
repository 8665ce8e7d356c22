//! Signed tokens on SQLite: scopes opted in with `set_keys` (the shared
//! `fencecheck_keys` table) refuse every token their authority did not sign,
//! on both write paths (read-then-write and the one-statement publish).

use crate::common;

use anyhow::{Result, bail, ensure};
use common::{Db, at_ms, rows, runtime};
use fencecheck::{
    AuthFailure, GrantKey, GrantSignature, Instance, KeyProblem, Policy, Request, Token,
};
use fencecheck_sqlite::{
    Error, Fenced, Rejection, fenced_write, key_prefixes, publish, remove_keys, scope_keys,
    set_keys, stage, visible,
};
use rusqlite::Connection;

const JULY: &str = "report/july";

fn key(id: u32, fill: u8) -> GrantKey {
    GrantKey {
        key_id: id,
        secret: vec![fill; 32],
    }
}

/// A request for `scope` with token `0.1.counter`, signed by `key` for
/// lease `lease` through the component (what the authority attaches).
fn signed(guest: &mut Instance, scope: &str, counter: u64, k: &GrantKey) -> Result<Request> {
    let token = Token::new(0, 1, counter);
    let signature = match guest.sign(scope, token, "lease-1", k)? {
        Ok(s) => s,
        Err(e) => bail!("signing: {e}"),
    };
    Ok(Request::new(scope, token, Policy::Strict).with_signature(signature))
}

fn unsigned(scope: &str, epoch: u64, counter: u64) -> Request {
    Request::new(scope, Token::new(0, epoch, counter), Policy::Strict)
}

/// A fenced write that records the token it was applied under.
fn write(conn: &mut Connection, guest: &mut Instance, request: &Request) -> Result<Fenced<()>> {
    Ok(fenced_write(conn, guest, request, |tx, accepted| {
        tx.execute(
            "INSERT INTO log (counter) VALUES (?1)",
            [accepted.highest.counter as i64],
        )
        .map(|_| ())
    })?)
}

fn setup() -> Result<(Db, Connection, Instance)> {
    let db = Db::new()?;
    let conn = db.open()?;
    conn.execute_batch("CREATE TABLE log (counter INTEGER)")?;
    Ok((db, conn, runtime()?.instance()?))
}

fn state(conn: &Connection) -> Result<Vec<String>> {
    rows(
        conn,
        "SELECT quote(scope) || quote(fence_state) || version FROM fencecheck_scopes ORDER BY scope",
    )
}

/// The lock-out attack: without keys, any client presents u64::MAX and no
/// honest grant is ever accepted again on that scope; with the scope opted
/// in, the forged token is refused, nothing changes, and the honest signed
/// grant is applied.
#[test]
fn a_forged_maximum_token_locks_out_unsigned_scopes_only() -> Result<()> {
    let (_db, mut conn, mut guest) = setup()?;
    let k = key(3, 0x33);
    let forged = unsigned(JULY, u64::MAX, u64::MAX);

    // Not opted in: the forger takes the scope for good.
    ensure!(write(&mut conn, &mut guest, &forged)?.is_applied());
    let honest = signed(&mut guest, JULY, 42, &k)?;
    let outcome = write(&mut conn, &mut guest, &honest)?;
    ensure!(
        matches!(outcome, Fenced::Rejected(Rejection::StaleFence { .. })),
        "{outcome:?}"
    );

    // Opted in, on a fresh scope: the forger is refused, signed or not.
    let scope = "report/august";
    set_keys(&conn, "report/", std::slice::from_ref(&k))?;
    let mut forged = unsigned(scope, u64::MAX, u64::MAX);
    let before = (state(&conn)?, rows(&conn, "SELECT counter FROM log")?);
    let outcome = write(&mut conn, &mut guest, &forged)?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::Unsigned)),
        "{outcome:?}"
    );
    // A signature copied from an honest grant does not cover the forged token.
    forged.signature = signed(&mut guest, scope, 42, &k)?.signature;
    let outcome = write(&mut conn, &mut guest, &forged)?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::BadSignature)),
        "{outcome:?}"
    );
    ensure!((state(&conn)?, rows(&conn, "SELECT counter FROM log")?) == before);
    let honest = signed(&mut guest, scope, 42, &k)?;
    ensure!(write(&mut conn, &mut guest, &honest)?.is_applied());
    // The forger's u64::MAX (stored as i64: -1) on July, the honest 42 on August.
    ensure!(rows(&conn, "SELECT counter FROM log")? == ["Integer(-1)", "Integer(42)"]);
    Ok(())
}

/// Tampered, replayed-into-another-scope, unknown-key and unsigned tokens
/// are each refused with their own reason, on the read-then-write path and
/// on publish (whose one-statement path a keyed scope never takes), and
/// none changes anything.
#[test]
fn every_unauthenticated_token_is_refused_on_both_paths() -> Result<()> {
    let (_db, mut conn, mut guest) = setup()?;
    let k3 = key(3, 0x33);
    set_keys(&conn, "report/", std::slice::from_ref(&k3))?;
    // An applied grant first, so the publish below would take the
    // one-statement path for an unkeyed scope.
    let first = signed(&mut guest, JULY, 1, &k3)?;
    let object = stage(&conn, JULY, "a", b"one", at_ms(1))?;
    ensure!(publish(&mut conn, &mut guest, &first, object, at_ms(2))?.is_applied());

    let good = signed(&mut guest, JULY, 2, &k3)?;
    let mut tampered = good.clone();
    tampered.token.counter = 3;
    let mut replayed = signed(&mut guest, "report/june", 2, &k3)?;
    replayed.scope = JULY.into();
    let by_unknown_key = signed(&mut guest, JULY, 2, &key(9, 0x99))?;
    let mut malformed = good.clone();
    if let Some(s) = malformed.signature.as_mut() {
        s.tag.truncate(16);
    }
    let cases = [
        (tampered, AuthFailure::BadSignature),
        (replayed, AuthFailure::BadSignature),
        (by_unknown_key, AuthFailure::UnknownKey),
        (unsigned(JULY, 1, 2), AuthFailure::Unsigned),
        (malformed, AuthFailure::MalformedSignature),
    ];
    for (request, reason) in cases {
        let before = state(&conn)?;
        let want = Fenced::Rejected(Rejection::Unauthenticated(reason));
        let outcome = write(&mut conn, &mut guest, &request)?;
        ensure!(outcome == want, "fenced_write {reason:?}: {outcome:?}");
        let object = stage(&conn, JULY, "b", b"two", at_ms(3))?;
        let outcome = publish(&mut conn, &mut guest, &request, object, at_ms(4))?;
        ensure!(outcome == want, "publish {reason:?}: {outcome:?}");
        ensure!(state(&conn)? == before, "{reason:?} changed the scope");
        ensure!(visible(&conn, JULY)?.map(|v| v.body) == Some(b"one".to_vec()));
    }
    let object = stage(&conn, JULY, "c", b"three", at_ms(5))?;
    ensure!(publish(&mut conn, &mut guest, &good, object, at_ms(6))?.is_applied());
    ensure!(visible(&conn, JULY)?.map(|v| v.body) == Some(b"three".to_vec()));
    Ok(())
}

/// The longest prefix decides; removing it hands its scopes to the next
/// shorter one, and removing every prefix makes scopes take unsigned
/// tokens again. A signed token on a scope that is not opted in applies.
#[test]
fn the_longest_prefix_decides() -> Result<()> {
    let (_db, mut conn, mut guest) = setup()?;
    let (k1, k2) = (key(1, 0x11), key(2, 0x22));
    set_keys(&conn, "", std::slice::from_ref(&k1))?;
    set_keys(&conn, "report/", std::slice::from_ref(&k2))?;
    ensure!(scope_keys(&conn, "report/july")? == Some(vec![k2.clone()]));
    ensure!(scope_keys(&conn, "invoice/9")? == Some(vec![k1.clone()]));
    ensure!(scope_keys(&conn, "repor")? == Some(vec![k1.clone()]));
    ensure!(key_prefixes(&conn)? == [("".to_string(), vec![1]), ("report/".to_string(), vec![2])]);

    let by_k1 = signed(&mut guest, JULY, 1, &k1)?;
    let outcome = write(&mut conn, &mut guest, &by_k1)?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::UnknownKey)),
        "{outcome:?}"
    );
    ensure!(remove_keys(&conn, "report/")?);
    ensure!(!remove_keys(&conn, "report/")?);
    ensure!(write(&mut conn, &mut guest, &by_k1)?.is_applied());
    ensure!(remove_keys(&conn, "")?);
    ensure!(scope_keys(&conn, JULY)?.is_none());
    ensure!(write(&mut conn, &mut guest, &unsigned(JULY, 1, 2))?.is_applied());
    // Not opted in: the signature is ignored (it is not even checked).
    let mut stray = signed(&mut guest, JULY, 3, &k1)?;
    if let Some(s) = stray.signature.as_mut() {
        s.tag = vec![0; 32];
    }
    ensure!(write(&mut conn, &mut guest, &stray)?.is_applied());
    Ok(())
}

/// Rotation: with {3, 4} grants of both keys apply; with {4}, a grant still
/// signed by 3 is unknown-key and its holder must re-acquire.
#[test]
fn keys_rotate_without_rewriting_states() -> Result<()> {
    let (_db, mut conn, mut guest) = setup()?;
    let (k3, k4) = (key(3, 0x33), key(4, 0x44));
    let grant = |guest: &mut Instance, counter, k: &GrantKey| signed(guest, JULY, counter, k);
    set_keys(&conn, JULY, std::slice::from_ref(&k3))?;
    let r = grant(&mut guest, 1, &k3)?;
    ensure!(write(&mut conn, &mut guest, &r)?.is_applied());
    set_keys(&conn, JULY, &[k3.clone(), k4.clone()])?;
    let r = grant(&mut guest, 2, &k3)?;
    ensure!(write(&mut conn, &mut guest, &r)?.is_applied());
    let r = grant(&mut guest, 3, &k4)?;
    ensure!(write(&mut conn, &mut guest, &r)?.is_applied());
    set_keys(&conn, JULY, std::slice::from_ref(&k4))?;
    let r = grant(&mut guest, 4, &k3)?;
    let outcome = write(&mut conn, &mut guest, &r)?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::UnknownKey)),
        "{outcome:?}"
    );
    let r = grant(&mut guest, 4, &k4)?;
    ensure!(write(&mut conn, &mut guest, &r)?.is_applied());
    Ok(())
}

/// Unusable key sets are refused by `set_keys` and change nothing; a
/// usable set stored with a short secret behind the adapter's back is the
/// `invalid-keys` rejection, never an unsigned write.
#[test]
fn unusable_key_sets_are_refused() -> Result<()> {
    let (_db, mut conn, mut guest) = setup()?;
    let short = GrantKey {
        key_id: 1,
        secret: vec![1; 15],
    };
    for (keys, why) in [
        (vec![], "no-keys"),
        (vec![short.clone()], "short-secret"),
        (vec![key(1, 1), key(1, 2)], "duplicate-key-id"),
    ] {
        match set_keys(&conn, "report/", &keys) {
            Err(Error::Invalid { why: w, .. }) if w == why => {}
            other => bail!("{why}: {other:?}"),
        }
    }
    ensure!(set_keys(&conn, &"x".repeat(1025), &[key(1, 1)]).is_err());
    ensure!(key_prefixes(&conn)?.is_empty());

    conn.execute(
        "INSERT INTO fencecheck_keys VALUES ('report/', 1, ?1)",
        [&short.secret],
    )?;
    let request = unsigned(JULY, 1, 1).with_signature(GrantSignature {
        key_id: 1,
        lease_id: "l".into(),
        tag: vec![0; 32],
    });
    let outcome = write(&mut conn, &mut guest, &request)?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::InvalidKeys(KeyProblem::ShortSecret)),
        "{outcome:?}"
    );
    ensure!(state(&conn)?.is_empty());
    // The layout's own constraints refuse what no key can be.
    for bad in [
        "INSERT INTO fencecheck_keys VALUES ('p', -1, x'00')",
        "INSERT INTO fencecheck_keys VALUES ('p', 4294967296, x'00')",
        "INSERT INTO fencecheck_keys VALUES ('p', 1, 'text')",
        "INSERT INTO fencecheck_keys VALUES (x'00', 1, x'00')",
    ] {
        ensure!(conn.execute(bad, []).is_err(), "{bad}");
    }
    Ok(())
}
