//! What a fenced table tells its operator: decisions counted by operation
//! and outcome in `fencecheck.decisions` (cluster-wide when the library is
//! preloaded, per session when not), by epoch too under the cross-host
//! metric table's name in `fencecheck.metrics()` (docs/design.md §12), a
//! log line per stale rejection at
//! `fencecheck.log_stale`'s level; and that each backend's cached view of
//! the keys follows `fencecheck.keys` exactly.

use std::collections::HashMap;
use std::thread;

use crate::common::{PgServer, SECRET, protected_catalog, signed, sqlstate};
use anyhow::{Result, anyhow, ensure};
use fencecheck_tests::pgserver::wait_for_lock_waiter;
use postgres::Client;

const JULY: &str = "report/july";

fn update(db: &mut Client, token: &str) -> Result<u64, postgres::Error> {
    db.execute(
        "UPDATE report_catalog SET visible_object = 'x', fence_token = $1 WHERE report_id = $2",
        &[&token, &JULY],
    )
}

/// Decisions by (operation, outcome).
type Counts = HashMap<(String, String), i64>;

/// `fencecheck.decisions` as (operation, outcome) → count, and its coverage.
fn decisions(db: &mut Client) -> Result<(Counts, String)> {
    let rows = db.query(
        "SELECT operation, outcome, decisions, coverage FROM fencecheck.decisions",
        &[],
    )?;
    let coverage = rows
        .first()
        .map(|r| r.get::<_, String>(3))
        .ok_or_else(|| anyhow!("fencecheck.decisions is empty"))?;
    ensure!(
        rows.len() == 35,
        "5 operations × 7 outcomes, got {}",
        rows.len()
    );
    Ok((
        rows.iter()
            .map(|r| ((r.get(0), r.get(1)), r.get(2)))
            .collect(),
        coverage,
    ))
}

fn count(map: &Counts, operation: &str, outcome: &str) -> i64 {
    map.get(&(operation.to_string(), outcome.to_string()))
        .copied()
        .unwrap_or(-1)
}

/// Preloaded: two sessions' decisions add up in one cluster-wide view
/// (applied, stale, refused, fence_next), and each stale rejection writes
/// one log line naming the table, the scope and both tokens.
#[test]
fn decisions_are_counted_cluster_wide_and_stale_ones_logged() -> Result<()> {
    let server = PgServer::start_with_settings(&["shared_preload_libraries=fencecheck"])?;
    let mut db = server.client()?;
    db.batch_execute("CREATE EXTENSION fencecheck")?;
    protected_catalog(&mut db, "strict")?;
    db.execute(
        "INSERT INTO report_catalog (report_id, fence_token) VALUES ($1, '0.42')",
        &[&JULY],
    )?;
    let mut other = server.client()?;
    ensure!(update(&mut other, "0.43")? == 1);
    let stale = update(&mut other, "0.41");
    ensure!(sqlstate(&stale).as_deref() == Some("5F001"), "{stale:?}");
    let bare = other.execute("UPDATE report_catalog SET visible_object = 'y'", &[]);
    ensure!(sqlstate(&bare).as_deref() == Some("5F011"), "{bare:?}");
    let next = other.query_one(
        "SELECT fence_next(fence_state, report_id, '0.1', 'strict', NULL, NULL) FROM report_catalog",
        &[],
    );
    ensure!(sqlstate(&next).as_deref() == Some("5F001"), "{next:?}");
    let (map, coverage) = decisions(&mut db)?;
    ensure!(coverage == "cluster", "{coverage}");
    for (operation, outcome, want) in [
        ("insert", "applied", 1),
        ("update", "applied", 1),
        ("update", "stale-fence", 1),
        ("update", "refused", 1),
        ("fence_next", "stale-fence", 1),
        ("delete", "applied", 0),
    ] {
        ensure!(
            count(&map, operation, outcome) == want,
            "{operation} {outcome}: {} (want {want})",
            count(&map, operation, outcome)
        );
    }
    // The same decisions by epoch, under the cross-host table's name.
    let text: String = db.query_one("SELECT fencecheck.metrics()", &[])?.get(0);
    let seen = fencecheck_tests::signals::check_exposition(&text, "fencecheck_postgres_")?;
    fencecheck_tests::signals::expect_seen(
        &seen,
        &[(
            "fencecheck_decisions_total",
            &[
                ("operation", "insert"),
                ("operation", "next"),
                ("epoch", "none"),
            ],
        )],
    )?;
    let mut got: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    got.sort_unstable();
    let mut want = vec![
        r#"fencecheck_decisions_total{operation="insert",outcome="applied",epoch="0"} 1"#,
        r#"fencecheck_decisions_total{operation="update",outcome="applied",epoch="0"} 1"#,
        r#"fencecheck_decisions_total{operation="update",outcome="stale-fence",epoch="0"} 1"#,
        r#"fencecheck_decisions_total{operation="update",outcome="refused",epoch="none"} 1"#,
        r#"fencecheck_decisions_total{operation="next",outcome="stale-fence",epoch="0"} 1"#,
    ];
    want.sort_unstable();
    ensure!(got == want, "fencecheck.metrics() answered:\n{text}");
    let log = server.log();
    ensure!(
        log.contains(
            "fencecheck: stale-fence: UPDATE on report_catalog, scope \"report/july\": presented 0.41, highest accepted 0.43"
        ),
        "no stale line in the log:\n{log}"
    );
    ensure!(
        log.contains("fencecheck: stale-fence: fence_next, scope \"report/july\": presented 0.1")
    );
    // Off: no line.
    db.execute("ALTER SYSTEM SET fencecheck.log_stale = off", &[])?;
    db.execute("SELECT pg_reload_conf()", &[])?;
    let mut third = server.client()?;
    let again = update(&mut third, "0.40");
    ensure!(sqlstate(&again).as_deref() == Some("5F001"), "{again:?}");
    ensure!(
        !server.log().contains("presented 0.40"),
        "logged with log_stale = off"
    );
    Ok(())
}

/// Not preloaded: the view says `session` and counts this session's own
/// decisions only.
#[test]
fn without_preloading_each_session_counts_its_own() -> Result<()> {
    let (server, mut db) = crate::common::server()?;
    protected_catalog(&mut db, "strict")?;
    db.execute(
        "INSERT INTO report_catalog (report_id, fence_token) VALUES ($1, '0.42')",
        &[&JULY],
    )?;
    let (map, coverage) = decisions(&mut db)?;
    ensure!(coverage == "session");
    ensure!(count(&map, "insert", "applied") == 1);
    let mut fresh = server.client()?;
    let (map, _) = decisions(&mut fresh)?;
    ensure!(count(&map, "insert", "applied") == 0);
    Ok(())
}

/// A backend that cached "no keys" sees a key set the moment it commits:
/// the key change waits for a fenced write in flight, and the next unsigned
/// write on the cached backend is 5F014; removing the keys opens the scope
/// to unsigned tokens again.
#[test]
fn key_changes_reach_every_backend_and_wait_for_writes_in_flight() -> Result<()> {
    let (server, mut db) = crate::common::server()?;
    protected_catalog(&mut db, "strict")?;
    db.execute(
        "INSERT INTO report_catalog (report_id, fence_token) VALUES ($1, '0.42')",
        &[&JULY],
    )?;
    let mut writer = server.client()?;
    ensure!(update(&mut writer, "0.43")? == 1); // caches "no keys"
    // A write in flight; the key change must wait for it.
    let mut tx = writer.transaction()?;
    ensure!(
        tx.execute(
            "UPDATE report_catalog SET visible_object = 'y', fence_token = '0.44' WHERE report_id = $1",
            &[&JULY]
        )? == 1
    );
    let url = server.url();
    let keyer = thread::spawn(move || -> Result<()> {
        let mut admin = postgres::Client::connect(&url, postgres::NoTls)?;
        admin.execute(
            "INSERT INTO fencecheck.keys VALUES ('report/', 3, $1)",
            &[&SECRET.as_slice()],
        )?;
        Ok(())
    });
    wait_for_lock_waiter(&mut db)?;
    tx.commit()?;
    keyer
        .join()
        .map_err(|_| anyhow!("the key change panicked"))??;
    let unsigned = update(&mut writer, "0.45");
    ensure!(
        sqlstate(&unsigned).as_deref() == Some("5F014"),
        "{unsigned:?}"
    );
    ensure!(update(&mut writer, &signed(JULY, 46)?)? == 1);
    db.batch_execute("DELETE FROM fencecheck.keys")?;
    ensure!(update(&mut writer, "1.47")? == 1);
    Ok(())
}
