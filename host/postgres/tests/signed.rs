//! Signed tokens on the client-side PostgreSQL adapter: scopes opted in with
//! `set_keys` refuse every token the authority did not sign, on fenced
//! writes and publishes; key changes wait for writes in flight.

use std::sync::mpsc;
use std::thread;
use std::time::SystemTime;

use anyhow::{Result, bail, ensure};
use fencecheck::{AuthFailure, GrantKey, Instance, Policy, Request, Token};
use fencecheck_postgres::{
    Fenced, Rejection, fenced_write, install, key_prefixes, publish, remove_keys, scope_keys,
    set_keys, stage, visible,
};
use fencecheck_tests::pgserver::{PgServer, wait_for_lock_waiter};

const JULY: &str = "report/july";

fn guest() -> Result<Instance> {
    Ok(fencecheck_tests::runtime()?.instance()?)
}

fn key(id: u32) -> GrantKey {
    GrantKey {
        key_id: id,
        secret: vec![u8::try_from(id).unwrap_or(0); 32],
    }
}

fn signed(guest: &mut Instance, counter: u64, k: &GrantKey) -> Result<Request> {
    let token = Token::new(0, 1, counter);
    let Ok(signature) = guest.sign(JULY, token, "lease-1", k)? else {
        bail!("signing failed");
    };
    Ok(Request::new(JULY, token, Policy::Strict).with_signature(signature))
}

fn write(db: &mut postgres::Client, guest: &mut Instance, r: &Request) -> Result<Fenced<()>> {
    Ok(fenced_write(db, guest, r, |tx, _| {
        tx.execute("INSERT INTO log VALUES ($1)", &[&(r.token.counter as i64)])
            .map(|_| ())
    })?)
}

fn logged(db: &mut postgres::Client) -> Result<Vec<i64>> {
    Ok(db
        .query("SELECT counter FROM log ORDER BY counter", &[])?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The lock-out attack: without keys a forged u64::MAX token takes the
/// scope; with `report/` keyed, it is refused (unsigned, and bad-signature
/// with an honest signature on it) on fenced_write and publish, nothing is
/// written, the signed grant applies; removing the keys reopens the scope.
#[test]
fn forged_tokens_are_refused_on_keyed_scopes() -> Result<()> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    install(&mut db)?;
    db.batch_execute("CREATE TABLE log (counter bigint)")?;
    let mut guest = guest()?;
    let k3 = key(3);

    let lockout = Request::new("notes/a", Token::new(0, u64::MAX, u64::MAX), Policy::Strict);
    ensure!(write(&mut db, &mut guest, &lockout)?.is_applied());

    set_keys(&mut db, "report/", std::slice::from_ref(&k3))?;
    ensure!(scope_keys(&mut db, JULY)? == Some(vec![k3.clone()]));
    ensure!(key_prefixes(&mut db)? == [("report/".to_string(), vec![3])]);
    let mut forged = Request::new(JULY, Token::new(0, u64::MAX, u64::MAX), Policy::Strict);
    let outcome = write(&mut db, &mut guest, &forged)?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::Unsigned)),
        "{outcome:?}"
    );
    forged.signature = signed(&mut guest, 42, &k3)?.signature;
    let object = stage(&mut db, JULY, "forged", b"x", SystemTime::now())?;
    let outcome = publish(&mut db, &mut guest, &forged, object, SystemTime::now())?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::BadSignature)),
        "{outcome:?}"
    );
    ensure!(visible(&mut db, JULY)?.is_none());
    let honest = signed(&mut guest, 42, &k3)?;
    ensure!(write(&mut db, &mut guest, &honest)?.is_applied());
    let by_other = signed(&mut guest, 43, &key(4))?;
    let outcome = write(&mut db, &mut guest, &by_other)?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::UnknownKey)),
        "{outcome:?}"
    );
    ensure!(logged(&mut db)? == [-1, 42]);
    ensure!(remove_keys(&mut db, "report/")?);
    ensure!(
        write(
            &mut db,
            &mut guest,
            &Request::new(JULY, Token::new(0, 1, 50), Policy::Strict)
        )?
        .is_applied()
    );
    Ok(())
}

/// A key change waits for a fenced write in flight (it holds the scope's row
/// lock): the write decides with the keys it read, and commits, before the
/// change; the next write decides with the new keys.
#[test]
fn key_changes_wait_for_writes_in_flight() -> Result<()> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    install(&mut db)?;
    db.batch_execute("CREATE TABLE log (counter bigint)")?;
    let mut first = guest()?;
    ensure!(
        write(
            &mut db,
            &mut first,
            &Request::new(JULY, Token::new(0, 1, 1), Policy::Strict)
        )?
        .is_applied()
    );

    let (in_write, entered) = mpsc::channel::<()>();
    let (release, go) = mpsc::channel::<()>();
    let mut writer = server.client()?;
    let handle = thread::spawn(move || -> Result<Fenced<()>> {
        let mut guest = guest()?;
        let request = Request::new(JULY, Token::new(0, 1, 2), Policy::Strict);
        Ok(fenced_write(&mut writer, &mut guest, &request, |tx, _| {
            tx.execute("INSERT INTO log VALUES (2)", &[])?;
            let _ = in_write.send(());
            let _ = go.recv();
            Ok::<_, postgres::Error>(())
        })?)
    });
    entered.recv()?;
    let mut admin = server.client()?;
    let (changed, done) = mpsc::channel();
    let changer = thread::spawn(move || {
        let result = set_keys(&mut admin, "report/", &[key(3)]);
        let _ = changed.send(());
        result
    });
    // The change queues on the lock the write holds (seen in pg_locks, not
    // guessed from time), and has not committed.
    wait_for_lock_waiter(&mut db)?;
    ensure!(
        done.try_recv().is_err(),
        "the key change did not wait for the write in flight"
    );
    release.send(())?;
    let outcome = handle
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))??;
    ensure!(outcome.is_applied(), "{outcome:?}");
    changer
        .join()
        .map_err(|_| anyhow::anyhow!("changer panicked"))??;
    let unsigned = Request::new(JULY, Token::new(0, 1, 3), Policy::Strict);
    let outcome = write(&mut db, &mut first, &unsigned)?;
    ensure!(
        outcome == Fenced::Rejected(Rejection::Unauthenticated(AuthFailure::Unsigned)),
        "{outcome:?}"
    );
    ensure!(logged(&mut db)? == [1, 2]);
    Ok(())
}
