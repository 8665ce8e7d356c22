//! The adapter's signals against the metric table of docs/design.md §12:
//! through a recorder installed for the test (as an application installs
//! its exporter), every fenced write and publish counts one
//! `fencecheck_decisions_total` with the table's labels and values only.

use crate::common;

use std::collections::BTreeMap;

use anyhow::{Result, ensure};
use common::{Db, at_ms, runtime, strict};
use fencecheck::{Policy, Request, Token};
use fencecheck_sqlite::{Error, Fenced, Rejection, fenced_write, publish, stage};
use fencecheck_tests::signals::{check_exposition, check_recorded, expect_seen};
use metrics_exporter_prometheus::PrometheusBuilder;
use metrics_util::debugging::DebuggingRecorder;
use rusqlite::Connection;

/// A fenced write whose mutation does nothing, or fails when `fail`.
fn attempt(
    conn: &mut Connection,
    request: &Request,
    fail: bool,
) -> Result<Result<Fenced<()>, Error>> {
    let mut guest = runtime()?.instance()?;
    Ok(fenced_write(conn, &mut guest, request, |_, _| match fail {
        true => Err("the mutation failed"),
        false => Ok(()),
    }))
}

/// A fenced write that does nothing.
fn write(conn: &mut Connection, request: &Request) -> Result<Fenced<()>> {
    Ok(attempt(conn, request, false)??)
}

/// Every outcome of a fenced write and a publish is counted once, under its
/// operation, outcome and the presented token's bounded epoch.
#[test]
fn writes_and_publishes_count_the_tables_decisions() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || -> Result<()> {
        ensure!(write(&mut conn, &strict("a", 42))?.is_applied());
        let stale = write(&mut conn, &strict("a", 41))?;
        ensure!(matches!(
            stale,
            Fenced::Rejected(Rejection::StaleFence { .. })
        ));
        let mut once = strict("a", 43);
        once.op_id = Some("op-1".into());
        ensure!(write(&mut conn, &once)?.is_applied());
        let again = write(&mut conn, &once)?;
        ensure!(
            matches!(again, Fenced::Rejected(Rejection::Duplicate { .. })),
            "{again:?}"
        );
        let mut expecting = strict("a", 44);
        expecting.expected_version = Some(99);
        let conflict = write(&mut conn, &expecting)?;
        ensure!(matches!(
            conflict,
            Fenced::Rejected(Rejection::VersionConflict { .. })
        ));
        // A malformed request (an empty scope) is refused, not an error.
        let refused = write(&mut conn, &strict("", 45))?;
        ensure!(
            matches!(refused, Fenced::Rejected(Rejection::Refused(_))),
            "{refused:?}"
        );
        // The zero token is no token: refused, epoch `none`.
        let zero = write(&mut conn, &strict("a", 0))?;
        ensure!(
            matches!(zero, Fenced::Rejected(Rejection::Refused(_))),
            "{zero:?}"
        );
        // A failed mutation: no decision took effect.
        ensure!(attempt(&mut conn, &strict("a", 46), true)?.is_err());
        // Epoch 20 is above the label's bound.
        let late = Request::new("b", Token::new(0, 20, 1), Policy::Strict);
        ensure!(write(&mut conn, &late)?.is_applied());

        let mut guest = runtime()?.instance()?;
        let object = stage(&conn, "r", "b.tmp", b"b", at_ms(1_000))?;
        ensure!(
            publish(&mut conn, &mut guest, &strict("r", 7), object, at_ms(1_000))?.is_applied()
        );
        let object = stage(&conn, "r", "a.tmp", b"a", at_ms(1_000))?;
        let stale = publish(&mut conn, &mut guest, &strict("r", 6), object, at_ms(1_000))?;
        ensure!(matches!(
            stale,
            Fenced::Rejected(Rejection::StaleFence { .. })
        ));
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
                ("epoch", "other"),
            ],
        )],
    )?;
    let got = recorded.counters("fencecheck_decisions_total");
    let want: BTreeMap<String, u64> = [
        ("epoch=0,operation=write,outcome=applied", 2),
        ("epoch=0,operation=write,outcome=stale-fence", 1),
        ("epoch=0,operation=write,outcome=duplicate", 1),
        ("epoch=0,operation=write,outcome=version-conflict", 1),
        ("epoch=0,operation=write,outcome=refused", 1),
        ("epoch=none,operation=write,outcome=refused", 1),
        ("epoch=0,operation=write,outcome=error", 1),
        ("epoch=other,operation=write,outcome=applied", 1),
        ("epoch=0,operation=publish,outcome=applied", 1),
        ("epoch=0,operation=publish,outcome=stale-fence", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    ensure!(got == want, "counted {got:#?}, expected {want:#?}");
    Ok(())
}

/// Through a real exporter (metrics-exporter-prometheus, as in
/// `examples/prometheus.rs`), the exposition's `fencecheck_*` families are
/// the table's: one applied and one stale write, each counted once.
#[test]
fn a_prometheus_exporter_shows_the_tables_decisions() -> Result<()> {
    let recorder = PrometheusBuilder::new().build_recorder();
    let exporter = recorder.handle();
    let db = Db::new()?;
    let mut conn = db.open()?;
    metrics::with_local_recorder(&recorder, || -> Result<()> {
        ensure!(write(&mut conn, &strict("report/july", 42))?.is_applied());
        ensure!(!write(&mut conn, &strict("report/july", 41))?.is_applied());
        Ok(())
    })?;
    let text = exporter.render();
    let seen = check_exposition(&text, "fencecheck_sqlite_")?;
    expect_seen(
        &seen,
        &[(
            "fencecheck_decisions_total",
            &[
                ("operation", "write"),
                ("outcome", "applied"),
                ("outcome", "stale-fence"),
            ],
        )],
    )?;
    for outcome in ["applied", "stale-fence"] {
        let series = format!(
            "fencecheck_decisions_total{{operation=\"write\",outcome=\"{outcome}\",epoch=\"0\"}} 1"
        );
        ensure!(
            text.lines().any(|l| l == series),
            "no `{series}` in:\n{text}"
        );
    }
    Ok(())
}
