//! Stopping the gateway: SIGTERM closes the listeners, lets each request in
//! flight finish and exits as soon as none is left (never sleeping out
//! Pingora's grace period), or at `--drain-timeout` anyway; SIGINT exits at
//! once. No path panics, with SQLite or with `--postgres` (whose pooled
//! synchronous clients once panicked when dropped on a runtime thread), and
//! an acknowledged write survives the stop.
//!
//! No test times the exit: each gives `--drain-timeout` far more than the
//! test's own bound on waiting, so an exit within the bound shows that the
//! drain, not the timeout, ended the process; the log says which.

use crate::common;

use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use common::Gateway;
use fencecheck_tests::pgserver::PgServer;

/// Longer than any test waits: reaching it would fail the test first.
const NEVER: &str = "3600";

fn signal(gw: &Gateway, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &gw.child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -{name} failed");
    Ok(())
}

/// The exit status, waiting at most a minute (a hang fails the test).
fn exited(gw: &mut Gateway) -> anyhow::Result<ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = gw.child.try_wait()? {
            return Ok(status);
        }
        ensure!(Instant::now() < deadline, "the gateway did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Wait (bounded) until the log has a line containing `text`.
fn logged(log: &Path, text: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::fs::read_to_string(log)?.contains(text) {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the log never said {text:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The log holds no panic and no abort.
fn clean(log: &Path) -> anyhow::Result<String> {
    let text = std::fs::read_to_string(log)?;
    for bad in ["panicked", "Cannot start a runtime", "abort"] {
        ensure!(!text.contains(bad), "the log has {bad:?}:\n{text}");
    }
    Ok(text)
}

/// A gateway with `--auth` (every request presents the root secret) and
/// its log at info level in `log`.
fn start(data: &Path, log: &Path, extra: &[&str]) -> anyhow::Result<Gateway> {
    let file = common::root_auth(data)?.display().to_string();
    let mut args = vec!["--auth", file.as_str()];
    args.extend_from_slice(extra);
    let mut gw = Gateway::spawn_logged(
        data,
        &args,
        Some(common::ROOT_SECRET.to_owned()),
        Some((log, "info,s3s=off")),
        &[],
    )?;
    gw.wait_healthy()?;
    Ok(gw)
}

fn put(gw: &Gateway, key: &str, token: &str, body: &[u8]) -> anyhow::Result<u16> {
    Ok(gw
        .request(
            "PUT",
            &format!("/objects/{key}"),
            &[("Fence-Token", token)],
            body,
        )?
        .status)
}

/// A request on a fresh connection gets no answer: the listener is closed.
fn refused(gw: &Gateway) -> anyhow::Result<()> {
    match gw.request("GET", "/healthz", &[], b"") {
        Ok(r) => bail!("a new connection was served after SIGTERM: {}", r.status),
        Err(_) => Ok(()),
    }
}

/// The slow-PUT scenario: a PUT is mid-body when SIGTERM arrives; new
/// connections are refused while it runs; its body then completes, it is
/// answered 201 and the process exits 0 without waiting out the timeout.
/// Restarted on the same store, the object is there.
fn slow_put_then_exit(extra: &[&str]) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let (data, log) = (dir.path().join("data"), dir.path().join("gw.log"));
    let mut args = vec!["--drain-timeout", NEVER];
    args.extend_from_slice(extra);
    let mut gw = start(&data, &log, &args)?;
    ensure!(put(&gw, "warm", "0.1", b"x")? == 201, "warm-up PUT");

    let half = vec![b'a'; 64 << 10];
    let mut open = gw.open(
        "PUT",
        "/objects/report",
        &[("Fence-Token", "0.7")],
        Some(2 * half.len()),
    )?;
    open.send(&half)?;
    in_flight(&gw)?;
    signal(&gw, "TERM")?;
    // Pingora's phase (the drain's log line) comes before its accept loops
    // end; only then is a new connection refused.
    logged(&log, "listeners closed")?;
    refused(&gw)?;
    ensure!(
        gw.child.try_wait()?.is_none(),
        "exited with a PUT in flight"
    );
    open.send(&half)?;
    let answer = open.finish()?;
    ensure!(
        answer.status == 201,
        "the PUT in flight got {}",
        answer.status
    );
    let status = exited(&mut gw)?;
    ensure!(status.success(), "exit status {status}");
    let text = clean(&log)?;
    ensure!(text.contains("drained"), "no drain in the log:\n{text}");

    let gw = start(&data, &dir.path().join("again.log"), extra)?;
    let got = gw.request("GET", "/objects/report", &[], b"")?;
    ensure!(
        got.status == 200 && got.body.len() == 2 * half.len(),
        "the acknowledged PUT is gone after the stop: {}",
        got.status
    );
    Ok(text)
}

/// Wait (bounded) until the gateway has accepted the open connection: the
/// gauge counts it and this probe. A connection still in the kernel's
/// backlog at SIGTERM is dropped with the listener, never in flight.
fn in_flight(gw: &Gateway) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.metric("fencecheck_gateway_connections")? != Some(2.0) {
        ensure!(
            Instant::now() < deadline,
            "the PUT's connection was not accepted"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn pg_url(server: &PgServer) -> String {
    format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=10",
        server.port()
    )
}

/// An idle gateway exits 0 on SIGTERM without sleeping out its drain
/// timeout (an hour here), and says it drained.
#[test]
fn idle_sigterm_exits_at_once() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("gw.log");
    let mut gw = start(&dir.path().join("data"), &log, &["--drain-timeout", NEVER])?;
    ensure!(put(&gw, "k", "0.1", b"v")? == 201, "PUT");
    signal(&gw, "TERM")?;
    let status = exited(&mut gw)?;
    ensure!(status.success(), "exit status {status}");
    let text = clean(&log)?;
    ensure!(text.contains("drained"), "no drain in the log:\n{text}");
    Ok(())
}

/// SQLite: a slow PUT in flight at SIGTERM completes (201, durable), new
/// connections are refused meanwhile, then the process exits 0.
#[test]
fn sigterm_lets_a_slow_put_finish() -> anyhow::Result<()> {
    slow_put_then_exit(&[]).map(drop)
}

/// `--postgres`: the same, with the pool's clients closed cleanly (no
/// "Cannot start a runtime from within a runtime" panic, exit status 0).
#[test]
fn sigterm_drains_with_postgres() -> anyhow::Result<()> {
    let server = PgServer::start()?;
    let url = pg_url(&server);
    slow_put_then_exit(&["--postgres", &url, "--pg-pool", "4"]).map(drop)
}

/// A request that never finishes is cut at `--drain-timeout`: the process
/// still exits 0, having logged the cut, with no panic while the runtimes
/// drop their tasks and the pooled PostgreSQL clients with them.
#[test]
fn drain_timeout_cuts_a_stalled_request() -> anyhow::Result<()> {
    let server = PgServer::start()?;
    let url = pg_url(&server);
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("gw.log");
    let mut gw = start(
        &dir.path().join("data"),
        &log,
        &[
            "--postgres",
            &url,
            "--drain-timeout",
            "1",
            "--body-timeout",
            NEVER,
            "--min-rate",
            "0",
        ],
    )?;
    ensure!(put(&gw, "warm", "0.1", b"x")? == 201, "warm-up PUT");
    let mut open = gw.open(
        "PUT",
        "/objects/stalled",
        &[("Fence-Token", "0.2")],
        Some(10),
    )?;
    open.send(b"abc")?;
    in_flight(&gw)?;
    signal(&gw, "TERM")?;
    let status = exited(&mut gw)?;
    ensure!(status.success(), "exit status {status}");
    let text = clean(&log)?;
    ensure!(
        text.contains("--drain-timeout passed") && text.contains("stopped"),
        "the cut is not in the log:\n{text}"
    );
    // The stalled PUT was never published.
    let mut admin = server.client()?;
    let rows = admin
        .query_one(
            "SELECT count(*) FROM fencecheck_scopes WHERE scope = 'stalled'",
            &[],
        )
        .context("reading the scopes")?;
    ensure!(rows.get::<_, i64>(0) == 0, "the cut PUT was published");
    Ok(())
}

/// SIGINT exits at once, a PUT in flight or not: the process is gone before
/// the PUT's body ends, with status 0 and no panic (`--postgres`).
#[test]
fn sigint_is_fast() -> anyhow::Result<()> {
    let server = PgServer::start()?;
    let url = pg_url(&server);
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("gw.log");
    let mut gw = start(
        &dir.path().join("data"),
        &log,
        &["--postgres", &url, "--drain-timeout", NEVER],
    )?;
    ensure!(put(&gw, "warm", "0.1", b"x")? == 201, "warm-up PUT");
    let mut open = gw.open("PUT", "/objects/cut", &[("Fence-Token", "0.2")], Some(10))?;
    open.send(b"abc")?;
    signal(&gw, "INT")?;
    let status = exited(&mut gw)?;
    ensure!(status.success(), "exit status {status}");
    clean(&log)?;
    Ok(())
}
