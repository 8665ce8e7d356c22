//! Crash recovery with real processes killed by SIGKILL at a known point.

use crate::common;

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use common::{Db, Worker, at_ms, open, rows, runtime, strict};
use fencecheck_sqlite::{ObjectId, collect_garbage, publish, stage, stored_state, visible};

const JULY: &str = "report/july";
const RETENTION: Duration = Duration::from_secs(600);
const STAGED_AT: u64 = 5_000_000;

/// A database where token 0.1 already published object `first`.
fn published_db() -> Result<(Db, ObjectId)> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let first = stage(&conn, JULY, "first", b"v1", at_ms(0))?;
    let mut guest = runtime()?.instance()?;
    ensure!(publish(&mut conn, &mut guest, &strict(JULY, 1), first, at_ms(0))?.is_applied());
    Ok((db, first))
}

fn staged_id(line: &str) -> Result<ObjectId> {
    let id = line
        .strip_prefix("staged ")
        .context("expected `staged ID`")?;
    Ok(ObjectId::from_raw(id.parse()?))
}

/// A writer killed between staging and publication exposes nothing: the
/// catalog still shows the old object, the orphan survives only its
/// retention window, and the next grant publishes normally.
#[test]
fn crash_between_staging_and_publication_exposes_nothing() -> Result<()> {
    let (db, first) = published_db()?;
    let mut worker = Worker::spawn(&db.path, STAGED_AT, &["stage-then-wait", JULY, "crashed"])?;
    let orphan = staged_id(&worker.line()?)?;
    worker.kill()?;

    let mut conn = db.open()?;
    ensure!(
        visible(&conn, JULY)?.map(|v| v.object) == Some(first),
        "orphan exposed"
    );
    ensure!(
        rows(&conn, "SELECT name FROM fencecheck_objects ORDER BY id")?
            == ["Text(\"first\")", "Text(\"crashed\")"]
    );
    let retention_ms = RETENTION.as_millis() as u64;
    let early = collect_garbage(&mut conn, at_ms(STAGED_AT + retention_ms - 1), RETENTION)?;
    ensure!(early.deleted == 0, "collected inside the window: {early:?}");
    let late = collect_garbage(&mut conn, at_ms(STAGED_AT + retention_ms), RETENTION)?;
    ensure!(late.deleted == 1, "{late:?}");
    ensure!(
        rows(&conn, "SELECT id FROM fencecheck_objects")? == [format!("Integer({})", first.get())]
    );

    let next = stage(&conn, JULY, "next", b"v2", at_ms(STAGED_AT))?;
    ensure!(next != orphan);
    let mut guest = runtime()?.instance()?;
    ensure!(
        publish(
            &mut conn,
            &mut guest,
            &strict(JULY, 2),
            next,
            at_ms(STAGED_AT)
        )?
        .is_applied()
    );
    ensure!(visible(&conn, JULY)?.map(|v| v.object) == Some(next));
    Ok(())
}

/// Control for the test above: the same worker, told to go on instead of
/// being killed, does publish its object.
#[test]
fn resumed_worker_publishes_its_staged_object() -> Result<()> {
    let (db, _) = published_db()?;
    let mut worker = Worker::spawn(&db.path, STAGED_AT, &["stage-then-wait", JULY, "resumed"])?;
    let object = staged_id(&worker.line()?)?;
    worker.send("publish 0.2")?;
    ensure!(worker.line()? == "applied");
    let (_, status) = worker.finish()?;
    ensure!(status.success(), "{status:?}");
    ensure!(visible(&db.open()?, JULY)?.map(|v| v.object) == Some(object));
    Ok(())
}

/// A writer killed inside the fenced transaction (after its mutation, before
/// the commit) leaves neither the mutation nor a new fence state, and its
/// write lock dies with it.
#[test]
fn crash_inside_the_fenced_transaction_rolls_back() -> Result<()> {
    let (db, _) = published_db()?;
    let conn = db.open()?;
    conn.execute_batch("CREATE TABLE worker_audit (scope TEXT, token TEXT, version INTEGER)")?;
    let before = stored_state(&conn, JULY)?;

    let mut worker = Worker::spawn(&db.path, STAGED_AT, &["hold-in-transaction", JULY, "0.2"])?;
    ensure!(worker.line()? == "in-transaction");
    // The worker really holds the write lock: a writer that will not wait
    // is refused.
    let impatient = open(&db.path, Duration::ZERO)?;
    let blocked = impatient.execute_batch("BEGIN IMMEDIATE");
    ensure!(blocked.is_err(), "the worker did not hold the write lock");
    worker.kill()?;

    ensure!(stored_state(&conn, JULY)? == before, "fence state moved");
    ensure!(
        rows(&conn, "SELECT token FROM worker_audit")?.is_empty(),
        "mutation survived"
    );
    let mut conn = db.open()?;
    let next = stage(&conn, JULY, "next", b"v2", at_ms(STAGED_AT))?;
    let mut guest = runtime()?.instance()?;
    ensure!(
        publish(
            &mut conn,
            &mut guest,
            &strict(JULY, 2),
            next,
            at_ms(STAGED_AT)
        )?
        .is_applied()
    );
    Ok(())
}
