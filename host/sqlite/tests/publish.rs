//! The publish protocol: staging, fenced publication, discard and the
//! garbage collector, with time passed in explicitly.

use crate::common;

use std::time::Duration;

use anyhow::{Result, ensure};
use common::{Db, at_ms, rows, runtime, strict};
use fencecheck_sqlite::{
    Error, Fenced, ObjectId, Rejection, collect_garbage, discard, fenced_write, publish, stage,
    visible,
};
use rusqlite::Connection;

const JULY: &str = "report/july";
const RETENTION: Duration = Duration::from_secs(600);

/// Publish `object` to July with token `0.counter` at `ms`; the inner result
/// is the adapter's own.
fn try_publish(
    conn: &mut Connection,
    counter: u64,
    object: ObjectId,
    ms: u64,
) -> Result<Result<Fenced<()>, Error>> {
    let mut guest = runtime()?.instance()?;
    Ok(publish(
        conn,
        &mut guest,
        &strict(JULY, counter),
        object,
        at_ms(ms),
    ))
}

fn publish_at(
    conn: &mut Connection,
    counter: u64,
    object: ObjectId,
    ms: u64,
) -> Result<Fenced<()>> {
    Ok(try_publish(conn, counter, object, ms)??)
}

fn object_ids(conn: &Connection) -> Result<Vec<String>> {
    rows(conn, "SELECT id FROM fencecheck_objects ORDER BY id")
}

fn id(o: ObjectId) -> String {
    format!("Integer({})", o.get())
}

/// The seed's paused writer: B (42) publishes, A (41) is refused as stale,
/// B's object stays visible, and A may discard its own unpublished object.
#[test]
fn paused_writer_is_fenced_at_the_catalog() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let a = stage(
        &conn,
        JULY,
        "reports/july/a7.tmp",
        b"A's render",
        at_ms(1_000),
    )?;
    let b = stage(
        &conn,
        JULY,
        "reports/july/b9.tmp",
        b"B's render",
        at_ms(31_000),
    )?;
    ensure!(publish_at(&mut conn, 42, b, 32_000)?.is_applied());
    let late = publish_at(&mut conn, 41, a, 45_000)?;
    ensure!(
        matches!(late, Fenced::Rejected(Rejection::StaleFence { .. })),
        "{late:?}"
    );
    let shown = visible(&conn, JULY)?.ok_or_else(|| anyhow::anyhow!("nothing visible"))?;
    ensure!(
        shown.object == b && shown.name == "reports/july/b9.tmp" && shown.body == b"B's render"
    );
    ensure!(shown.version == 1 && shown.published_at == at_ms(32_000));
    ensure!(!discard(&conn, b)?, "discard removed the visible object");
    ensure!(discard(&conn, a)?, "A's unpublished object was kept");
    ensure!(object_ids(&conn)? == [id(b)]);
    Ok(())
}

/// Publishing an object that was never staged, or staged for another scope,
/// is an error and moves nothing.
#[test]
fn publish_refuses_unknown_and_foreign_objects() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let mine = stage(&conn, JULY, "mine", b"1", at_ms(0))?;
    ensure!(publish_at(&mut conn, 1, mine, 0)?.is_applied());
    let foreign = stage(&conn, "report/august", "theirs", b"2", at_ms(0))?;
    let before = rows(
        &conn,
        "SELECT hex(fence_state) || visible_object FROM fencecheck_scopes",
    )?;
    for object in [foreign, ObjectId::from_raw(9_999)] {
        match try_publish(&mut conn, 2, object, 0)? {
            Err(Error::UnknownObject { object: o, .. }) if o == object => {}
            other => anyhow::bail!("{object}: expected UnknownObject, got {other:?}"),
        }
        ensure!(
            rows(
                &conn,
                "SELECT hex(fence_state) || visible_object FROM fencecheck_scopes"
            )? == before
        );
    }
    // Token 2 was not consumed by the failed attempts.
    let next = stage(&conn, JULY, "next", b"3", at_ms(0))?;
    ensure!(publish_at(&mut conn, 2, next, 0)?.is_applied());
    Ok(())
}

/// The publisher never deletes the object it replaces; the collector does,
/// and only once it is unreferenced and older than the retention window.
#[test]
fn collector_keeps_referenced_and_recent_objects() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let old = stage(&conn, JULY, "old", b"1", at_ms(0))?;
    ensure!(publish_at(&mut conn, 1, old, 0)?.is_applied());
    let current = stage(&conn, JULY, "current", b"2", at_ms(0))?;
    ensure!(publish_at(&mut conn, 2, current, 0)?.is_applied());
    ensure!(
        object_ids(&conn)? == [id(old), id(current)],
        "publisher deleted"
    );

    let recent = stage(&conn, JULY, "recent", b"3", at_ms(100_000))?;
    let retention_ms = RETENTION.as_millis() as u64;
    // One millisecond before `recent` leaves the window: only `old` goes.
    let report = collect_garbage(&mut conn, at_ms(100_000 + retention_ms - 1), RETENTION)?;
    ensure!(report.deleted == 1, "{report:?}");
    ensure!(object_ids(&conn)? == [id(current), id(recent)]);
    // At exactly the retention age `recent` goes; `current` is referenced.
    let report = collect_garbage(&mut conn, at_ms(100_000 + retention_ms), RETENTION)?;
    ensure!(report.deleted == 1, "{report:?}");
    ensure!(object_ids(&conn)? == [id(current)]);
    ensure!(visible(&conn, JULY)?.map(|v| v.object) == Some(current));
    Ok(())
}

/// A scope that holds fence state but no catalog pointer does not stop the
/// collector (`NOT IN` over a NULL would).
#[test]
fn scopes_without_a_pointer_do_not_block_collection() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let mut guest = runtime()?.instance()?;
    let plain = fenced_write(&mut conn, &mut guest, &strict("counter/x", 1), |_, _| {
        Ok::<_, rusqlite::Error>(())
    })?;
    ensure!(plain.is_applied());
    stage(&conn, JULY, "orphan", b"1", at_ms(0))?;
    let report = collect_garbage(&mut conn, at_ms(10_000_000), RETENTION)?;
    ensure!(report.deleted == 1, "{report:?}");
    Ok(())
}

/// A backlog larger than one batch is collected completely, batch by batch.
#[test]
fn collector_works_through_a_backlog_in_batches() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let keep = stage(&conn, JULY, "keep", b"k", at_ms(0))?;
    ensure!(publish_at(&mut conn, 1, keep, 0)?.is_applied());
    let tx = conn.transaction()?;
    for i in 0..1_300 {
        stage(&tx, JULY, &format!("junk-{i}"), b"j", at_ms(0))?;
    }
    tx.commit()?;
    let report = collect_garbage(&mut conn, at_ms(10_000_000), RETENTION)?;
    ensure!(report.deleted == 1_300, "{report:?}");
    ensure!(object_ids(&conn)? == [id(keep)]);
    Ok(())
}

/// A writer slower than the retention window finds its object collected:
/// publish fails with UnknownObject instead of exposing a missing object.
#[test]
fn publishing_a_collected_object_fails_closed() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let first = stage(&conn, JULY, "first", b"1", at_ms(0))?;
    ensure!(publish_at(&mut conn, 1, first, 0)?.is_applied());
    let slow = stage(&conn, JULY, "slow", b"2", at_ms(1_000))?;
    collect_garbage(&mut conn, at_ms(1_000_000), RETENTION)?;
    let result = try_publish(&mut conn, 2, slow, 1_000_001)?;
    ensure!(
        matches!(result, Err(Error::UnknownObject { .. })),
        "{result:?}"
    );
    ensure!(visible(&conn, JULY)?.map(|v| v.object) == Some(first));
    Ok(())
}

/// Ids are never reused, even after the collector deleted the highest one,
/// and staged objects cannot be modified.
#[test]
fn objects_are_immutable_and_ids_never_reused() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let first = stage(&conn, JULY, "first", b"1", at_ms(0))?;
    let changed = conn.execute("UPDATE fencecheck_objects SET body = x'00'", []);
    ensure!(
        matches!(&changed, Err(e) if e.to_string().contains("immutable")),
        "{changed:?}"
    );
    ensure!(collect_garbage(&mut conn, at_ms(10_000_000), RETENTION)?.deleted == 1);
    let second = stage(&conn, JULY, "second", b"2", at_ms(0))?;
    ensure!(second > first, "{second} reuses {first}");
    Ok(())
}

/// Unusable arguments are refused before touching the database.
#[test]
fn invalid_arguments_are_refused() -> Result<()> {
    let db = Db::new()?;
    let conn = db.open()?;
    let long = "s".repeat(fencecheck::MAX_SCOPE_BYTES + 1);
    for scope in ["", long.as_str()] {
        let result = stage(&conn, scope, "x", b"1", at_ms(0));
        ensure!(
            matches!(result, Err(Error::Invalid { what: "scope", .. })),
            "{result:?}"
        );
    }
    let before_epoch = std::time::UNIX_EPOCH - Duration::from_secs(1);
    let result = stage(&conn, JULY, "x", b"1", before_epoch);
    ensure!(matches!(result, Err(Error::Invalid { .. })), "{result:?}");
    ensure!(object_ids(&conn)?.is_empty());
    Ok(())
}
