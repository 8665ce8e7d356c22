//! The client-side adapter's signals against the metric table of
//! docs/design.md §12: through a recorder installed for the test (as an
//! application installs its exporter), every fenced write, publish and
//! one-statement execute against a real PostgreSQL server counts one
//! `fencecheck_decisions_total` with the table's labels and values only.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::{Result, ensure};
use fencecheck::{Policy, Request, Token};
use fencecheck_postgres::{
    Fenced, Rejection, StateCache, fenced_execute, fenced_write, install, publish, stage,
};
use fencecheck_tests::pgserver::PgServer;
use fencecheck_tests::signals::{check_recorded, expect_seen};
use metrics_util::debugging::DebuggingRecorder;

fn request(scope: &str, epoch: u64, counter: u64) -> Request {
    Request::new(scope, Token::new(0, epoch, counter), Policy::Strict)
}

const AUDIT: &str = "INSERT INTO audit VALUES ($1, (SELECT version FROM fencecheck_accepted), $2)";

/// Every outcome of the three write paths is counted once, under its
/// operation, outcome and the presented token's bounded epoch.
#[test]
fn writes_publishes_and_executes_count_the_tables_decisions() -> Result<()> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    install(&mut db)?;
    db.batch_execute("CREATE TABLE audit (scope text, version bigint, payload text UNIQUE)")?;
    let mut guest = fencecheck_tests::runtime()?.instance()?;
    let now = UNIX_EPOCH + Duration::from_secs(1_000);
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || -> Result<()> {
        let noop = |_: &mut postgres::Transaction<'_>, _: &_| Ok::<(), postgres::Error>(());
        ensure!(fenced_write(&mut db, &mut guest, &request("a", 0, 42), noop)?.is_applied());
        let stale = fenced_write(&mut db, &mut guest, &request("a", 0, 41), noop)?;
        ensure!(matches!(
            stale,
            Fenced::Rejected(Rejection::StaleFence { .. })
        ));
        // A failing mutation: no decision took effect.
        let failed = fenced_write(&mut db, &mut guest, &request("a", 0, 43), |tx, _| {
            tx.execute("SELECT 1/0", &[]).map(|_| ())
        });
        ensure!(failed.is_err(), "{failed:?}");

        let object = stage(&mut db, "r", "b.tmp", b"b", now)?;
        ensure!(publish(&mut db, &mut guest, &request("r", 3, 7), object, now)?.is_applied());
        let object = stage(&mut db, "r", "a.tmp", b"a", now)?;
        let stale = publish(&mut db, &mut guest, &request("r", 3, 6), object, now)?;
        ensure!(matches!(
            stale,
            Fenced::Rejected(Rejection::StaleFence { .. })
        ));

        let mut cache = StateCache::new();
        let first = fenced_execute(
            &mut db,
            &mut guest,
            &mut cache,
            &request("e", 99, 1),
            AUDIT,
            &[&"e", &"one"],
        )?;
        ensure!(first.is_applied(), "{first:?}");
        let stale = fenced_execute(
            &mut db,
            &mut guest,
            &mut cache,
            &request("e", 98, 1),
            AUDIT,
            &[&"e", &"two"],
        )?;
        ensure!(
            matches!(stale, Fenced::Rejected(Rejection::StaleFence { .. })),
            "{stale:?}"
        );
        Ok(())
    })?;

    let recorded = check_recorded(&snapshotter)?;
    expect_seen(
        &recorded.seen,
        &[(
            "fencecheck_decisions_total",
            &[
                ("operation", "write"),
                ("operation", "publish"),
                ("operation", "execute"),
            ],
        )],
    )?;
    let got = recorded.counters("fencecheck_decisions_total");
    let want: BTreeMap<String, u64> = [
        ("epoch=0,operation=write,outcome=applied", 1),
        ("epoch=0,operation=write,outcome=stale-fence", 1),
        ("epoch=0,operation=write,outcome=error", 1),
        ("epoch=3,operation=publish,outcome=applied", 1),
        ("epoch=3,operation=publish,outcome=stale-fence", 1),
        ("epoch=other,operation=execute,outcome=applied", 1),
        ("epoch=other,operation=execute,outcome=stale-fence", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    ensure!(got == want, "counted {got:#?}, expected {want:#?}");
    Ok(())
}
