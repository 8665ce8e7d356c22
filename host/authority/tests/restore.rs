//! Restoring the SQLite coordinator from a backup, and the token history of
//! concurrent coordinators on one database.

use crate::common;
use crate::lease_history;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Result, bail, ensure};
use common::{Catalog, TempDir, World, runtime};
use fencecheck::{Decision, Policy, Request, Token};
use fencecheck_authority::{
    AcquireOutcome, Coordinator, Grant, ManualClock, ReleaseOutcome, SqliteCoordinator,
};
use fencecheck_tests::history::check_issued;

const LOCK: &str = "report/july";

fn grant(outcome: AcquireOutcome) -> Result<Grant> {
    match outcome {
        AcquireOutcome::Acquired(g) => Ok(g),
        AcquireOutcome::Busy { holder, .. } => bail!("busy: held by {holder}"),
    }
}

/// Back up the coordinator, keep granting until the resource has accepted a
/// much higher token, restore the old backup: without a new epoch its next
/// grant would be stale at the resource; after `restore` the next grant is
/// accepted while every stale holder is still rejected.
#[test]
fn restore_from_backup_starts_an_epoch_above_the_resource() -> Result<()> {
    let dir = TempDir::new("restore")?;
    let live = dir.join("coordinator.db");
    let backup = dir.join("backup.db");
    let world = World::on_file(&live)?;
    let mut catalog = Catalog::open(&dir.join("resource.db"))?;

    let first = grant(world.coordinator.acquire(LOCK, "lease-0", 1_000)?)?;
    {
        let conn = rusqlite::Connection::open(&live)?;
        conn.execute("VACUUM INTO ?1", [backup.display().to_string()])?;
    }
    let mut last = first.clone();
    for i in 1..=50u64 {
        world.coordinator_clock.advance(1_000);
        last = grant(
            world
                .coordinator
                .acquire(LOCK, &format!("lease-{i}"), 1_000)?,
        )?;
        let published = catalog.publish(&Request::new(LOCK, last.token, Policy::Strict), "obj")?;
        ensure!(
            matches!(published, Ok(Decision::Applied { .. })),
            "{published:?}"
        );
    }
    ensure!(last.token.counter == 51);
    drop(world);

    // Disaster: the coordinator comes back from the old backup.
    std::fs::copy(&backup, &live)?;
    let clock = Arc::new(ManualClock::new(1_000_000));
    let restored = SqliteCoordinator::open(&live, runtime()?, clock.clone())?;
    ensure!(
        restored.authority() == first.token.authority,
        "the authority survives a backup"
    );
    let reused = grant(restored.acquire(LOCK, "too-early", 1_000)?)?;
    ensure!(
        reused.token.counter == 2,
        "the backup reissues old counters: {:?}",
        reused.token
    );
    let published = catalog.publish(&Request::new(LOCK, reused.token, Policy::Strict), "bad")?;
    ensure!(
        matches!(published, Ok(Decision::StaleFence { .. })),
        "the resource refuses the reissued token: {published:?}"
    );

    let floor = restored.restore(0)?;
    ensure!(floor >= 1);
    clock.advance(1_000);
    let fresh = grant(restored.acquire(LOCK, "after-restore", 1_000)?)?;
    ensure!(
        fresh.token == Token::new(first.token.authority, floor, 1),
        "{:?}",
        fresh.token
    );
    let published = catalog.publish(&Request::new(LOCK, fresh.token, Policy::Strict), "good")?;
    ensure!(
        matches!(published, Ok(Decision::Applied { .. })),
        "{published:?}"
    );
    for stale in [first.token, reused.token, last.token] {
        let refused = catalog.publish(&Request::new(LOCK, stale, Policy::Strict), "stale")?;
        ensure!(
            matches!(refused, Ok(Decision::StaleFence { .. })),
            "{stale:?}: {refused:?}"
        );
    }
    ensure!(catalog.visible(LOCK)? == Some(("good".into(), 51)));

    // A lock the backup never knew also starts at the new floor.
    let other = grant(restored.acquire("report/august", "x", 1_000)?)?;
    ensure!(
        other.token.epoch == floor && other.token.counter == 1,
        "{:?}",
        other.token
    );
    Ok(())
}

/// Restoring twice from the same backup must not reuse an epoch: the
/// operator's `at_least` (taken from outside the backup, e.g. wall-clock
/// seconds) keeps epochs increasing.
#[test]
fn repeated_restore_from_one_backup_uses_at_least() -> Result<()> {
    let dir = TempDir::new("restore-twice")?;
    let live = dir.join("coordinator.db");
    let backup = dir.join("backup.db");
    let world = World::on_file(&live)?;
    grant(world.coordinator.acquire(LOCK, "a", 1_000)?)?;
    drop(world);
    std::fs::copy(&live, &backup)?;
    let mut epochs = Vec::new();
    for at_least in [100u64, 200] {
        std::fs::copy(&backup, &live)?;
        let coordinator =
            SqliteCoordinator::open(&live, runtime()?, Arc::new(ManualClock::new(10_000)))?;
        let floor = coordinator.restore(at_least)?;
        epochs.push(grant(coordinator.acquire(LOCK, "b", 1_000)?)?.token.epoch);
        ensure!(floor == at_least);
    }
    ensure!(epochs == [100, 200], "{epochs:?}");
    Ok(())
}

/// Several coordinators (own connections, own component instances) on one
/// database file, acquiring and releasing in a loop from threads: the
/// grants the database committed (a trigger logs every stored lease state in
/// commit order) pass the shared checker's `check_issued`, every
/// acknowledged grant is committed as told and nothing else was granted, and
/// an acquisition that started after another one finished always got a
/// greater token.
#[test]
fn concurrent_coordinators_issue_one_increasing_sequence() -> Result<()> {
    let dir = TempDir::new("history")?;
    let db = dir.join("coordinator.db");
    let clock = Arc::new(ManualClock::new(0));
    // The coordinator's tables, then a log of every state it stores, written
    // by the decision's own transaction (rowid order = commit order).
    SqliteCoordinator::open(&db, runtime()?, clock.clone())?;
    rusqlite::Connection::open(&db)?.execute_batch(
        "CREATE TABLE lease_log (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                                 lock TEXT NOT NULL, state BLOB NOT NULL);
         CREATE TRIGGER lease_log_insert AFTER INSERT ON fencecheck_leases
         BEGIN INSERT INTO lease_log (lock, state) VALUES (NEW.lock, NEW.state); END;
         CREATE TRIGGER lease_log_update AFTER UPDATE ON fencecheck_leases
         BEGIN INSERT INTO lease_log (lock, state) VALUES (NEW.lock, NEW.state); END;",
    )?;
    // A global logical clock orders events across threads without sleeps.
    let ticks = Arc::new(AtomicU64::new(0));
    // Stop on a global grant count, not a per-worker one: the test is about
    // the token history, and SQLite owes no thread fairness.
    const GRANTS: u64 = 160;
    let granted = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..4)
        .map(|worker| {
            let db = db.clone();
            let clock = clock.clone();
            let ticks = ticks.clone();
            let granted = granted.clone();
            std::thread::spawn(move || -> Result<Vec<(u64, u64, String, Token)>> {
                let coordinator = SqliteCoordinator::open(&db, runtime()?, clock)?;
                let mut history = Vec::new();
                let mut attempts = 0u64;
                while granted.load(Ordering::SeqCst) < GRANTS && attempts < 1_000_000 {
                    attempts += 1;
                    let start = ticks.fetch_add(1, Ordering::SeqCst);
                    let id = format!("w{worker}-{attempts}");
                    match coordinator.acquire(LOCK, &id, 60_000)? {
                        AcquireOutcome::Acquired(g) => {
                            let end = ticks.fetch_add(1, Ordering::SeqCst);
                            history.push((start, end, id.clone(), g.token));
                            granted.fetch_add(1, Ordering::SeqCst);
                            ensure!(
                                coordinator.release(LOCK, &id, g.token)?
                                    == ReleaseOutcome::Released
                            );
                        }
                        AcquireOutcome::Busy { .. } => std::thread::yield_now(),
                    }
                }
                Ok(history)
            })
        })
        .collect();
    let mut history = Vec::new();
    for h in handles {
        history.extend(h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??);
    }
    let states: Vec<(String, Vec<u8>)> = rusqlite::Connection::open(&db)?
        .prepare("SELECT lock, state FROM lease_log ORDER BY seq")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let stored = lease_history::grants(&states)?;
    check_issued(&lease_history::issued(&stored))?;
    let acked: Vec<(String, String, Token)> = history
        .iter()
        .map(|(_, _, id, t)| (LOCK.to_owned(), id.clone(), *t))
        .collect();
    // Every decision's error ended the test, so no outcome is unknown.
    lease_history::account(&acked, &[], &stored)?;
    for (s1, e1, _, t1) in &history {
        for (s2, _, _, t2) in &history {
            if e1 < s2 {
                ensure!(
                    t2.grant_order(t1).is_gt(),
                    "{t2:?} started after {t1:?} finished"
                );
            }
        }
        ensure!(s1 < e1);
    }
    ensure!(
        history.len() as u64 >= GRANTS,
        "only {} grants",
        history.len()
    );
    Ok(())
}

/// A lock state filed under another lock's key makes `restore` refuse
/// everything and change nothing (no partial epoch).
#[test]
fn restore_refuses_a_misfiled_state() -> Result<()> {
    let dir = TempDir::new("restore-misfiled")?;
    let db = dir.join("coordinator.db");
    let world = World::on_file(&db)?;
    grant(world.coordinator.acquire(LOCK, "a", 1_000)?)?;
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute(
        "INSERT INTO fencecheck_leases (lock, state)
         SELECT 'report/august', state FROM fencecheck_leases WHERE lock = ?1",
        [LOCK],
    )?;
    let before: Vec<Vec<u8>> = conn
        .prepare("SELECT state FROM fencecheck_leases ORDER BY lock")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    match world.coordinator.restore(0) {
        Err(fencecheck_authority::AuthorityError::Refused {
            error: fencecheck::LeaseError::LockMismatch(found),
        }) => ensure!(found == LOCK),
        other => bail!("expected a lock mismatch, got {other:?}"),
    }
    let after: Vec<Vec<u8>> = conn
        .prepare("SELECT state FROM fencecheck_leases ORDER BY lock")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    ensure!(before == after, "a refused restore changed a lock");
    let floor: i64 = conn.query_row("SELECT epoch_floor FROM fencecheck_authority", [], |r| {
        r.get(0)
    })?;
    ensure!(floor == 0);
    Ok(())
}

/// A restore writes only the epoch floor: no lock state changes, every
/// lock's next grant is `(floor, 1)` (what rewriting each lock to its next
/// epoch gave), and a lock whose stored epoch stands above the floor (a
/// state written by the old per-lock restore) pushes the floor above it.
#[test]
fn restore_raises_only_the_floor() -> Result<()> {
    let dir = TempDir::new("restore-floor")?;
    let db = dir.join("coordinator.db");
    let world = World::on_file(&db)?;
    let auth = world.coordinator.authority();
    for lock in ["a", "b", "c"] {
        grant(world.coordinator.acquire(lock, "first", 1_000)?)?;
    }
    // "c" carries epoch 9 from an earlier per-lock restore.
    let conn = rusqlite::Connection::open(&db)?;
    let mut guest = runtime()?.instance()?;
    let mut state: Vec<u8> = conn.query_row(
        "SELECT state FROM fencecheck_leases WHERE lock = 'c'",
        [],
        |r| r.get(0),
    )?;
    for _ in 0..9 {
        state = guest.restore(Some(&state))??.1;
    }
    conn.execute(
        "UPDATE fencecheck_leases SET state = ?1 WHERE lock = 'c'",
        [&state],
    )?;
    let states = |conn: &rusqlite::Connection| -> Result<Vec<Vec<u8>>> {
        Ok(conn
            .prepare("SELECT state FROM fencecheck_leases ORDER BY lock")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?)
    };
    let before = states(&conn)?;

    let floor = world.coordinator.restore(3)?;
    ensure!(floor == 10, "above c's epoch 9: {floor}");
    ensure!(states(&conn)? == before, "restore rewrote a lock state");

    world.coordinator_clock.advance(1_000);
    for lock in ["a", "b", "c", "never-seen"] {
        let next = grant(world.coordinator.acquire(lock, "second", 1_000)?)?;
        ensure!(next.token == Token::new(auth, 10, 1), "{lock}: {next:?}");
    }
    Ok(())
}

/// The coordinator records its layout number beside the resource layout's
/// (one `fencecheck_meta` table, one file for both), and refuses a database
/// whose coordinator layout it does not know, creating nothing.
#[test]
fn coordinator_layout_is_recorded_and_checked() -> Result<()> {
    let dir = TempDir::new("authority-layout")?;
    let db = dir.join("shared.db");
    // A resource store and a coordinator in one file.
    fencecheck_sqlite::install(&rusqlite::Connection::open(&db)?)?;
    drop(World::on_file(&db)?);
    let conn = rusqlite::Connection::open(&db)?;
    let keys: Vec<(String, i64)> = conn
        .prepare("SELECT key, value FROM fencecheck_meta ORDER BY key")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    ensure!(
        keys == [
            ("authority-layout".to_string(), 2),
            ("layout".to_string(), fencecheck_sqlite::LAYOUT_VERSION)
        ],
        "{keys:?}"
    );
    fencecheck_sqlite::install(&conn)?;

    let newer = dir.join("newer.db");
    let conn = rusqlite::Connection::open(&newer)?;
    conn.execute_batch(
        "CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO fencecheck_meta VALUES ('authority-layout', 3);",
    )?;
    match SqliteCoordinator::open(&newer, runtime()?, Arc::new(ManualClock::new(0))) {
        Err(fencecheck_authority::AuthorityError::UnsupportedLayout(found)) => {
            ensure!(found.contains('3'), "{found}")
        }
        other => bail!("expected UnsupportedLayout, got {other:?}"),
    }
    let tables: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE name LIKE 'fencecheck_%' AND name != 'fencecheck_meta'",
        [],
        |r| r.get(0),
    )?;
    ensure!(tables == 0, "a refused open created {tables} tables");
    Ok(())
}

/// A layout-1 database (before `moved_to`) is upgraded in place on open: its
/// lineage, floor and locks are kept, and the layout number says 2.
#[test]
fn layout_1_is_upgraded_in_place() -> Result<()> {
    let dir = TempDir::new("authority-layout-1")?;
    let db = dir.join("old.db");
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(
        "CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO fencecheck_meta VALUES ('authority-layout', 1);
         CREATE TABLE fencecheck_authority (
             id INTEGER PRIMARY KEY CHECK (id = 1),
             authority INTEGER NOT NULL, epoch_floor INTEGER NOT NULL);
         INSERT INTO fencecheck_authority VALUES (1, 77, 5);
         CREATE TABLE fencecheck_leases (lock TEXT PRIMARY KEY, state BLOB NOT NULL);",
    )?;
    let world = World::on_file(&db)?;
    ensure!(world.coordinator.authority() == 77);
    let first = grant(world.coordinator.acquire("a", "x", 1_000)?)?;
    ensure!(first.token == Token::new(77, 5, 1), "{first:?}");
    let layout: i64 = conn.query_row(
        "SELECT value FROM fencecheck_meta WHERE key = 'authority-layout'",
        [],
        |r| r.get(0),
    )?;
    ensure!(layout == 2);
    Ok(())
}
