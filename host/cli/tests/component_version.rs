//! `fencecheck component-version` prints the running component's WIT package
//! version, and `--component` refuses a component of another version.

use std::process::Command;

use anyhow::{Context, Result, ensure};
use fencecheck::{COMPONENT, WIT_VERSION, rewrite_wit_version};

/// Without --component it prints the embedded component's version, the one
/// the WIT declares (`package fencecheck:fence@0.1.1;`): the interface's
/// version, on the release's line and never ahead of it.
#[test]
fn prints_the_embedded_components_version() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck"))
        .arg("component-version")
        .output()
        .context("running fencecheck component-version")?;
    ensure!(out.status.success(), "exit {:?}", out.status);
    let printed = String::from_utf8(out.stdout)?;
    ensure!(printed == format!("{WIT_VERSION}\n"), "{printed:?}");
    let line = |v: &str| v.rsplit_once('.').map(|(line, _)| line.to_string());
    ensure!(line(WIT_VERSION) == line(env!("CARGO_PKG_VERSION")));
    let patch = |v: &str| v.rsplit('.').next().and_then(|p| p.parse::<u32>().ok());
    ensure!(patch(WIT_VERSION) <= patch(env!("CARGO_PKG_VERSION")));
    Ok(())
}

/// `--component` with a same-line patch prints its version; with a 0.2.0
/// component every command fails at load with the refusal and exit 1.
#[test]
fn other_components_are_vetted() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let patch = dir.path().join("patch.wasm");
    std::fs::write(&patch, rewrite_wit_version(COMPONENT, "0.1.9")?)?;
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck"))
        .arg("--component")
        .arg(&patch)
        .arg("component-version")
        .output()?;
    ensure!(out.status.success(), "exit {:?}", out.status);
    ensure!(
        out.stdout == b"0.1.9\n",
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );

    let future = dir.path().join("future.wasm");
    std::fs::write(&future, rewrite_wit_version(COMPONENT, "0.2.0")?)?;
    for args in [
        &["component-version"][..],
        &["component", "--out", "x.wasm"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_fencecheck"))
            .current_dir(dir.path())
            .arg("--component")
            .arg(&future)
            .args(args)
            .output()?;
        ensure!(
            out.status.code() == Some(1),
            "{args:?}: exit {:?}",
            out.status
        );
        ensure!(out.stdout.is_empty(), "{args:?} printed {:?}", out.stdout);
        let stderr = String::from_utf8(out.stderr)?;
        ensure!(
            stderr
                == "fencecheck: component exports fencecheck:fence/check@0.2.0; this host supports fencecheck:fence@0.1.x\n",
            "{args:?}: {stderr:?}"
        );
        ensure!(
            !dir.path().join("x.wasm").exists(),
            "a refused component was written"
        );
    }
    Ok(())
}
