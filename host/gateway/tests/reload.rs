//! Component reload on SIGHUP: vetted by the conformance vectors, swapped
//! mid-traffic without losing a request; a bad component is refused.

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, ensure};
use common::Gateway;

fn hangup(gw: &Gateway) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-HUP", &gw.child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -HUP failed");
    Ok(())
}

fn reloads(gw: &Gateway, result: &str) -> anyhow::Result<u64> {
    let text = String::from_utf8(gw.request("GET", "/metrics", &[], b"")?.body)?;
    let prefix = format!("fencecheck_gateway_reloads_total{{result=\"{result}\"}} ");
    Ok(text
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0))
}

fn wait_for(gw: &Gateway, result: &str, n: u64) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while reloads(gw, result)? < n {
        ensure!(
            std::time::Instant::now() < deadline,
            "no {result} reload #{n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Three SIGHUP reloads of the `--component` file while 8 writers PUT with
/// rising tokens: every request gets its fenced answer (201/200/409, no 5xx,
/// no dropped connection). Then the file is replaced by garbage: the reload
/// is refused, and the gateway keeps deciding with the old component.
#[test]
fn sighup_reload_mid_traffic() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let component = dir.path().join("fence.wasm");
    std::fs::write(&component, fencecheck::COMPONENT)?;
    let data = dir.path().join("data");
    let path = component.to_str().context("path")?;
    let gw = Arc::new(Gateway::start(&data, &["--component", path])?);

    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (gw, stop, next) = (gw.clone(), stop.clone(), next.clone());
            std::thread::spawn(move || -> anyhow::Result<u64> {
                let mut answered = 0;
                while !stop.load(Ordering::Relaxed) {
                    let token = format!("0.{}", next.fetch_add(1, Ordering::SeqCst) + 1);
                    let r = gw.request(
                        "PUT",
                        &format!("/objects/reload/{}", w % 2),
                        &[("Fence-Token", &token)],
                        token.as_bytes(),
                    )?;
                    ensure!(matches!(r.status, 200 | 201 | 409), "{token}: {r:?}");
                    answered += 1;
                }
                Ok(answered)
            })
        })
        .collect();
    for n in 1..=3 {
        std::thread::sleep(Duration::from_millis(300));
        hangup(&gw)?;
        wait_for(&gw, "ok", n)?;
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for w in writers {
        answered += w.join().map_err(|_| anyhow::anyhow!("writer panicked"))??;
    }
    ensure!(answered > 50, "only {answered} requests");

    std::fs::write(&component, b"not a component")?;
    hangup(&gw)?;
    wait_for(&gw, "refused", 1)?;
    let token = format!("0.{}", next.load(Ordering::SeqCst) + 1);
    let r = gw.request(
        "PUT",
        "/objects/reload/0",
        &[("Fence-Token", &token)],
        b"after",
    )?;
    ensure!(r.status == 200, "{r:?}");
    let r = gw.request(
        "PUT",
        "/objects/reload/0",
        &[("Fence-Token", "0.1")],
        b"stale",
    )?;
    ensure!(r.status == 409, "{r:?}");
    Ok(())
}

/// With `--postgres`, a SIGHUP swap closes the pool's idle PostgreSQL
/// connections off the runtime (dropped on the reload task's thread they
/// panicked and poisoned the pool): writes before and after each of two
/// reloads are decided, a stale one refused, and the log has no panic.
#[test]
fn sighup_reload_with_postgres() -> anyhow::Result<()> {
    let server = fencecheck_tests::pgserver::PgServer::start()?;
    let url = format!(
        "host=127.0.0.1 port={} user=postgres dbname=postgres connect_timeout=10",
        server.port()
    );
    let dir = tempfile::tempdir()?;
    let component = dir.path().join("fence.wasm");
    std::fs::write(&component, fencecheck::COMPONENT)?;
    let log = dir.path().join("gw.log");
    let path = component.to_str().context("path")?;
    let mut gw = Gateway::spawn_logged(
        &dir.path().join("data"),
        &["--component", path, "--postgres", &url, "--pg-pool", "4"],
        None,
        Some((&log, "info,s3s=off")),
        &[],
    )?;
    gw.wait_healthy()?;
    let put = |token: &str| -> anyhow::Result<u16> {
        Ok(gw
            .request(
                "PUT",
                "/objects/reload/pg",
                &[("Fence-Token", token)],
                token.as_bytes(),
            )?
            .status)
    };
    ensure!(put("0.1")? == 201, "first PUT");
    for n in 1..=2 {
        hangup(&gw)?;
        wait_for(&gw, "ok", n)?;
        let token = format!("0.{}", n + 1);
        ensure!(put(&token)? == 200, "PUT {token} after reload #{n}");
    }
    ensure!(put("0.1")? == 409, "a stale PUT after the reloads");
    let text = std::fs::read_to_string(&log)?;
    ensure!(!text.contains("panicked"), "{text}");
    Ok(())
}

/// A `--component` that is not a fencecheck component stops the gateway at
/// startup (nonzero exit), before it listens.
#[test]
fn bad_component_is_refused_at_startup() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let component = dir.path().join("bad.wasm");
    std::fs::write(&component, b"\0asm garbage")?;
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
        .args(["--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .arg("--component")
        .arg(&component)
        .output()?;
    ensure!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(stderr.contains("refusing the component"), "{stderr}");
    Ok(())
}
