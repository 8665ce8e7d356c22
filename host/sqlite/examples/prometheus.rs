//! Fenced writes on SQLite with their decisions exported to Prometheus:
//! the application installs `metrics-exporter-prometheus` once, and every
//! `fenced_write` and `publish` counts `fencecheck_decisions_total`
//! (docs/design.md §12). Prints the text exposition an application would
//! serve on its `/metrics`.
//!
//!     cargo run -p fencecheck-sqlite --example prometheus

use anyhow::Result;
use fencecheck::{Policy, Request, Runtime, Token};
use fencecheck_sqlite::{fenced_write, install};
use metrics_exporter_prometheus::PrometheusBuilder;

fn main() -> Result<()> {
    // Once per process, before the first write.
    let exporter = PrometheusBuilder::new().install_recorder()?;

    let mut conn = rusqlite::Connection::open_in_memory()?;
    install(&conn)?;
    conn.execute_batch("CREATE TABLE report (body TEXT)")?;
    let mut guest = Runtime::new()?.instance()?;
    // B (token 42) writes; A (token 41) resumes after a pause, too late.
    for (counter, body) in [(42, "B's report"), (41, "A's stale report")] {
        let request = Request::new("report/july", Token::new(0, 0, counter), Policy::Strict);
        let outcome = fenced_write(&mut conn, &mut guest, &request, |tx, _| {
            tx.execute("INSERT INTO report VALUES (?1)", [body])
        })?;
        eprintln!("token 0.{counter}: {}", outcome.name());
    }

    print!("{}", exporter.render());
    Ok(())
}
