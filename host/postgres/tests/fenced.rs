//! Client-side fenced writes against a real PostgreSQL server.

use std::sync::mpsc;
use std::thread;

use anyhow::{Result, bail, ensure};
use fencecheck::{Instance, Policy, Request, Token};
use fencecheck_postgres::{Error, Fenced, Rejection, fenced_write, install, stored_state};
use fencecheck_tests::pgserver::{PgServer, wait_for_lock_waiter};

fn guest() -> Result<Instance> {
    Ok(fencecheck_tests::runtime()?.instance()?)
}

fn tok(counter: u64) -> Token {
    Token {
        authority: 0,
        epoch: 0,
        counter,
    }
}

fn setup() -> Result<(PgServer, postgres::Client)> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    install(&mut db)?;
    db.batch_execute(
        "CREATE TABLE report_catalog (report_id text PRIMARY KEY, visible_object text NOT NULL)",
    )?;
    Ok((server, db))
}

fn publish(
    db: &mut postgres::Client,
    guest: &mut Instance,
    token: u64,
    object: &str,
) -> Result<Fenced<u64>, Error> {
    let request = Request::new("report/july", tok(token), Policy::Strict);
    fenced_write(db, guest, &request, |tx, _| {
        tx.execute(
            "INSERT INTO report_catalog VALUES ('report/july', $1)
             ON CONFLICT (report_id) DO UPDATE SET visible_object = EXCLUDED.visible_object",
            &[&object],
        )
    })
}

fn visible(db: &mut postgres::Client) -> Result<Option<String>> {
    Ok(db
        .query_opt("SELECT visible_object FROM report_catalog", &[])?
        .map(|r| r.get(0)))
}

/// 0.42 applies with its mutation; 0.41 afterwards is stale-fence and its
/// mutation never runs; the state row is the SQLite layout's.
#[test]
fn newer_applies_older_is_stale() -> Result<()> {
    let (_server, mut db) = setup()?;
    let mut guest = guest()?;
    ensure!(matches!(
        publish(&mut db, &mut guest, 42, "b9")?,
        Fenced::Applied { version: 1, .. }
    ));
    let stale = publish(&mut db, &mut guest, 41, "a7")?;
    ensure!(
        stale
            == Fenced::Rejected(Rejection::StaleFence {
                presented: tok(41),
                highest: tok(42)
            }),
        "{stale:?}"
    );
    ensure!(visible(&mut db)?.as_deref() == Some("b9"));
    let row = db.query_one(
        "SELECT version FROM fencecheck_scopes WHERE scope = 'report/july'",
        &[],
    )?;
    ensure!(row.get::<_, i64>(0) == 1);
    ensure!(stored_state(&mut db, "report/july")?.is_some());
    Ok(())
}

/// A failing mutation rolls back the new state with it: the token is not
/// used up, and a retry applies.
#[test]
fn failed_mutation_stores_nothing() -> Result<()> {
    let (_server, mut db) = setup()?;
    let mut guest = guest()?;
    let request = Request::new("report/july", tok(42), Policy::Strict);
    let failed = fenced_write(&mut db, &mut guest, &request, |tx, _| {
        tx.execute("INSERT INTO no_such_table VALUES (1)", &[])
    });
    ensure!(matches!(failed, Err(Error::Mutation(_))), "{failed:?}");
    ensure!(stored_state(&mut db, "report/july")?.is_none());
    ensure!(matches!(
        publish(&mut db, &mut guest, 42, "b9")?,
        Fenced::Applied { version: 1, .. }
    ));
    Ok(())
}

/// Two clients create one new scope at once (READ COMMITTED): the second's
/// insert waits for the first to commit, then it is decided against the
/// first's state: the same token is stale, never a second "first write".
#[test]
fn first_writes_of_a_scope_do_not_race() -> Result<()> {
    let (server, mut db) = setup()?;
    let (inside_tx, inside) = mpsc::channel::<()>();
    let (release_tx, release) = mpsc::channel::<()>();
    let url = server.url();
    let first = thread::spawn(move || -> Result<Fenced<()>> {
        let mut db = postgres::Client::connect(&url, postgres::NoTls)?;
        let mut guest = guest()?;
        let request = Request::new("report/july", tok(42), Policy::Strict);
        Ok(fenced_write(&mut db, &mut guest, &request, |_, _| {
            // Its state row is inserted, not committed: hold here.
            let _ = inside_tx.send(());
            release
                .recv()
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })?)
    });
    inside.recv()?;
    let url = server.url();
    let second = thread::spawn(move || -> Result<Fenced<()>> {
        let mut db = postgres::Client::connect(&url, postgres::NoTls)?;
        let mut guest = guest()?;
        let request = Request::new("report/july", tok(42), Policy::Strict);
        Ok(fenced_write(&mut db, &mut guest, &request, |_, _| {
            Ok::<(), Error>(())
        })?)
    });
    wait_for_lock_waiter(&mut db)?;
    release_tx.send(())?;
    let first = first
        .join()
        .map_err(|_| anyhow::anyhow!("first panicked"))??;
    let second = second
        .join()
        .map_err(|_| anyhow::anyhow!("second panicked"))??;
    ensure!(
        matches!(first, Fenced::Applied { version: 1, .. }),
        "{first:?}"
    );
    ensure!(
        second
            == Fenced::Rejected(Rejection::StaleFence {
                presented: tok(42),
                highest: tok(42)
            }),
        "{second:?}"
    );
    Ok(())
}

/// The same race under SERIALIZABLE: the second writer gets a retryable
/// serialization failure, never a stale result nor a second first write;
/// its retry is decided against the first's state.
#[test]
fn serializable_race_is_retryable_not_stale() -> Result<()> {
    let (server, mut db) = setup()?;
    let mut second_db = server.client()?;
    second_db.batch_execute("SET default_transaction_isolation = 'serializable'")?;
    let mut first_db = server.client()?;
    let mut second_guest = guest()?;
    let mut first_guest = guest()?;
    // The second opens its snapshot first (a read inside its transaction),
    // then the first commits the scope's creation, then the second writes.
    let mut tx = second_db.transaction()?;
    tx.query_one("SELECT count(*) FROM fencecheck_scopes", &[])?;
    ensure!(matches!(
        publish(&mut first_db, &mut first_guest, 42, "b9")?,
        Fenced::Applied { .. }
    ));
    // fenced_write opens its own transaction; emulate the second writer's
    // stale snapshot with the same statements inside `tx`.
    let request = Request::new("report/july", tok(43), Policy::Strict);
    let read = tx.query_opt(
        "SELECT fence_state FROM fencecheck_scopes WHERE scope = $1 FOR UPDATE",
        &[&request.scope],
    )?;
    ensure!(read.is_none(), "the snapshot predates the first write");
    let insert = tx.execute(
        "INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES ($1, '\\x00', 1)
         ON CONFLICT (scope) DO NOTHING",
        &[&request.scope],
    );
    let code = insert.err().and_then(|e| e.code().cloned());
    ensure!(
        code == Some(postgres::error::SqlState::T_R_SERIALIZATION_FAILURE),
        "{code:?}"
    );
    drop(tx);
    // Through the adapter itself: a retry decides against the first's state.
    let retried = fenced_write(&mut second_db, &mut second_guest, &request, |_, _| {
        Ok::<(), Error>(())
    })?;
    ensure!(
        matches!(retried, Fenced::Applied { version: 2, .. }),
        "{retried:?}"
    );
    let _ = &mut db;
    Ok(())
}

/// Two SERIALIZABLE writers of one existing scope, interleaved so the
/// second's snapshot predates the first's commit: the adapter returns a
/// retryable error (is_retryable), not a fencing outcome.
#[test]
fn serializable_conflict_through_the_adapter_is_retryable() -> Result<()> {
    let (server, mut db) = setup()?;
    let mut guest0 = guest()?;
    ensure!(matches!(
        publish(&mut db, &mut guest0, 40, "a")?,
        Fenced::Applied { .. }
    ));
    let (inside_tx, inside) = mpsc::channel::<()>();
    let (release_tx, release) = mpsc::channel::<()>();
    let url = server.url();
    let first = thread::spawn(move || -> Result<()> {
        let mut db = postgres::Client::connect(&url, postgres::NoTls)?;
        db.batch_execute("SET default_transaction_isolation = 'serializable'")?;
        let mut guest = guest()?;
        let request = Request::new("report/july", tok(41), Policy::Strict);
        let outcome = fenced_write(&mut db, &mut guest, &request, |_, _| {
            let _ = inside_tx.send(());
            release
                .recv()
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)
        })?;
        ensure!(
            matches!(outcome, Fenced::Applied { version: 2, .. }),
            "{outcome:?}"
        );
        Ok(())
    });
    inside.recv()?;
    let url = server.url();
    let second = thread::spawn(move || -> Result<Result<Fenced<()>, Error>> {
        let mut db = postgres::Client::connect(&url, postgres::NoTls)?;
        db.batch_execute("SET default_transaction_isolation = 'serializable'")?;
        let mut guest = guest()?;
        let request = Request::new("report/july", tok(42), Policy::Strict);
        Ok(fenced_write(&mut db, &mut guest, &request, |_, _| {
            Ok::<(), Error>(())
        }))
    });
    wait_for_lock_waiter(&mut db)?;
    release_tx.send(())?;
    first
        .join()
        .map_err(|_| anyhow::anyhow!("first panicked"))??;
    match second
        .join()
        .map_err(|_| anyhow::anyhow!("second panicked"))??
    {
        Err(e) if e.is_retryable() => {}
        other => bail!("expected a retryable serialization failure, got {other:?}"),
    }
    Ok(())
}

/// `install` is idempotent, upgrades layout 1 in place (adding
/// `fencecheck_keys`), and refuses another layout number, creating nothing.
#[test]
fn install_refuses_another_layout() -> Result<()> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    install(&mut db)?;
    install(&mut db)?;
    db.batch_execute(
        "DROP TABLE fencecheck_keys; UPDATE fencecheck_meta SET value = 1 WHERE key = 'layout'",
    )?;
    install(&mut db)?;
    let upgraded: (i64, bool) = db
        .query_one(
            "SELECT (SELECT value FROM fencecheck_meta WHERE key = 'layout'), \
                    to_regclass('fencecheck_keys') IS NOT NULL",
            &[],
        )
        .map(|r| (r.get(0), r.get(1)))?;
    ensure!(upgraded == (2, true), "{upgraded:?}");
    db.batch_execute("UPDATE fencecheck_meta SET value = 3 WHERE key = 'layout'")?;
    match install(&mut db) {
        Err(Error::UnsupportedLayout { found: 3 }) => {}
        other => bail!("{other:?}"),
    }
    let mut fresh = server.client()?;
    fresh.batch_execute("CREATE DATABASE other")?;
    let mut other = postgres::Client::connect(
        &server.url().replace("dbname=postgres", "dbname=other"),
        postgres::NoTls,
    )?;
    other.batch_execute("CREATE TABLE fencecheck_meta (key text PRIMARY KEY, value bigint NOT NULL); INSERT INTO fencecheck_meta VALUES ('layout', 7)")?;
    match install(&mut other) {
        Err(Error::UnsupportedLayout { found: 7 }) => {}
        r => bail!("{r:?}"),
    }
    let created: bool = other
        .query_one("SELECT to_regclass('fencecheck_scopes') IS NOT NULL", &[])?
        .get(0);
    ensure!(!created, "nothing is created on a refused layout");
    Ok(())
}
