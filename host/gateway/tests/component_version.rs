//! The gateway runs only components of a WIT package version it supports:
//! `--component` of another version stops it at startup, a SIGHUP reload to
//! one is refused (the old component keeps serving), and
//! `fencecheck_gateway_component_info` names the version serving. The other
//! versions are the real component with its version rewritten (validated).

use crate::common;

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, ensure};
use common::Gateway;
use fencecheck::{COMPONENT, WIT_VERSION, rewrite_wit_version};

const REFUSAL: &str =
    "component exports fencecheck:fence/check@0.2.0; this host supports fencecheck:fence@0.1.x";

fn metrics(gw: &Gateway) -> anyhow::Result<String> {
    Ok(String::from_utf8(
        gw.request("GET", "/metrics", &[], b"")?.body,
    )?)
}

fn serving(gw: &Gateway) -> anyhow::Result<Vec<String>> {
    let prefix = "fencecheck_gateway_component_info{version=\"";
    Ok(metrics(gw)?
        .lines()
        .filter_map(|l| l.strip_prefix(prefix)?.strip_suffix("\"} 1"))
        .map(str::to_string)
        .collect())
}

fn reloads(gw: &Gateway, result: &str) -> anyhow::Result<u64> {
    let prefix = format!("fencecheck_gateway_reloads_total{{result=\"{result}\"}} ");
    Ok(metrics(gw)?
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or(0))
}

fn hangup_and_wait(gw: &Gateway, result: &str, n: u64) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-HUP", &gw.child.id().to_string()])
        .status()?;
    ensure!(status.success(), "kill -HUP failed");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while reloads(gw, result)? < n {
        ensure!(
            std::time::Instant::now() < deadline,
            "no {result} reload #{n}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `--component` claiming 0.2.0 stops the gateway before it listens, with
/// the refusal naming what the component exports and what is supported.
#[test]
fn another_version_is_refused_at_startup() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let component = dir.path().join("future.wasm");
    std::fs::write(&component, rewrite_wit_version(COMPONENT, "0.2.0")?)?;
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
        .args(["--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .arg("--component")
        .arg(&component)
        .output()?;
    ensure!(!out.status.success(), "{:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        stderr.contains(&format!("refusing the component: loading: {REFUSAL}")),
        "{stderr}"
    );
    Ok(())
}

/// The gateway reports the embedded version; a SIGHUP to a 0.2.0 file is
/// refused and the 0.1.0 component keeps deciding; a SIGHUP to a 0.1.9
/// file (same contract) is taken and reported.
#[test]
fn reload_vets_the_version() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let component = dir.path().join("fence.wasm");
    std::fs::write(&component, COMPONENT)?;
    let path = component.to_str().context("path")?;
    let gw = Gateway::start(&dir.path().join("data"), &["--component", path])?;
    ensure!(serving(&gw)? == [WIT_VERSION], "{:?}", serving(&gw)?);
    let r = gw.request("PUT", "/objects/v/a", &[("Fence-Token", "0.5")], b"five")?;
    ensure!(r.status == 201, "{r:?}");

    std::fs::write(&component, rewrite_wit_version(COMPONENT, "0.2.0")?)?;
    hangup_and_wait(&gw, "refused", 1)?;
    ensure!(serving(&gw)? == [WIT_VERSION], "{:?}", serving(&gw)?);
    let r = gw.request("PUT", "/objects/v/a", &[("Fence-Token", "0.4")], b"four")?;
    ensure!(r.status == 409, "the old component still fences: {r:?}");

    std::fs::write(&component, rewrite_wit_version(COMPONENT, "0.1.9")?)?;
    hangup_and_wait(&gw, "ok", 1)?;
    ensure!(serving(&gw)? == ["0.1.9"], "{:?}", serving(&gw)?);
    let r = gw.request("PUT", "/objects/v/a", &[("Fence-Token", "0.6")], b"six")?;
    ensure!(r.status == 200, "{r:?}");
    let r = gw.request("PUT", "/objects/v/a", &[("Fence-Token", "0.5")], b"five")?;
    ensure!(r.status == 409, "{r:?}");
    Ok(())
}
