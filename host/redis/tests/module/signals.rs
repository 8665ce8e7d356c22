//! The module's decision counters against the metric table of
//! docs/design.md §12: FENCE.METRICS answers Prometheus text whose
//! `fencecheck_*` families, labels and values are the table's, with one
//! count per fenced command (Redis 7.0 and Valkey 8).

use crate::common::{Options, each_server};
use anyhow::{Context, Result, ensure};
use fencecheck_tests::signals::{check_exposition, expect_seen};

/// Every fenced command's reply is counted once under its operation,
/// outcome and the token's bounded epoch; a wrong arity is not a decision.
#[test]
fn fence_metrics_counts_the_tables_decisions() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut c = server.conn()?;
        c.ok(&["FENCE.SET", "report/july", "0.42", "b9"])?;
        let stale = c.cmd(&["FENCE.SET", "report/july", "0.41", "a7"])?;
        ensure!(
            stale.error().is_some_and(|e| e.starts_with("STALEFENCE")),
            "{stale:?}"
        );
        c.ok(&["FENCE.SET", "report/july", "0.43", "c", "OPID", "op-1"])?;
        let again = c.ok(&["FENCE.SET", "report/july", "0.43", "c", "OPID", "op-1"])?;
        ensure!(
            again.items().first().and_then(|v| v.text()).as_deref() == Some("duplicate"),
            "{again:?}"
        );
        let conflict = c.cmd(&["FENCE.SET", "report/july", "0.44", "d", "VERSION", "9"])?;
        ensure!(
            conflict
                .error()
                .is_some_and(|e| e.starts_with("VERSIONCONFLICT")),
            "{conflict:?}"
        );
        let bad = c.cmd(&["FENCE.SET", "report/july", "0.4x", "x"])?;
        ensure!(bad.error().is_some(), "{bad:?}");
        c.ok(&["FENCE.DEL", "report/july", "20.1"])?;
        c.ok(&["FENCE.EXEC", "counter", "0.1", "--", "INCR", "counter"])?;
        c.ok(&["FENCE.CHECK", "counter", "0.2"])?;
        // Not a decision: the arity is wrong.
        ensure!(c.cmd(&["FENCE.SET", "report/july"])?.error().is_some());

        // Arguments are refused, and change nothing.
        let extra = c.cmd(&["FENCE.METRICS", "x"])?;
        ensure!(
            extra.error().is_some_and(|e| e.contains("no arguments")),
            "{extra:?}"
        );
        let text = c.ok(&["FENCE.METRICS"])?.text().context("a bulk string")?;
        let seen = check_exposition(&text, "fencecheck_redis_")?;
        expect_seen(
            &seen,
            &[(
                "fencecheck_decisions_total",
                &[
                    ("operation", "put"),
                    ("operation", "delete"),
                    ("operation", "execute"),
                    ("operation", "check"),
                ],
            )],
        )?;
        let mut got: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        got.sort_unstable();
        let mut want = vec![
            r#"fencecheck_decisions_total{operation="put",outcome="applied",epoch="0"} 2"#,
            r#"fencecheck_decisions_total{operation="put",outcome="stale-fence",epoch="0"} 1"#,
            r#"fencecheck_decisions_total{operation="put",outcome="duplicate",epoch="0"} 1"#,
            r#"fencecheck_decisions_total{operation="put",outcome="version-conflict",epoch="0"} 1"#,
            r#"fencecheck_decisions_total{operation="put",outcome="refused",epoch="none"} 1"#,
            r#"fencecheck_decisions_total{operation="delete",outcome="applied",epoch="other"} 1"#,
            r#"fencecheck_decisions_total{operation="execute",outcome="applied",epoch="0"} 1"#,
            r#"fencecheck_decisions_total{operation="check",outcome="applied",epoch="0"} 1"#,
        ];
        want.sort_unstable();
        ensure!(got == want, "FENCE.METRICS answered:\n{text}");
        Ok(())
    })
}
