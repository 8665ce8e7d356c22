//! `fencecheck-gateway --version` prints the project's one version.

use std::process::Command;

use anyhow::{Context, Result, ensure};

/// `fencecheck-gateway --version` prints `fencecheck-gateway VERSION` with the workspace's version and exits 0.
#[test]
fn version_is_the_workspace_version() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
        .arg("--version")
        .output()
        .context("running fencecheck-gateway --version")?;
    ensure!(out.status.success(), "exit {:?}", out.status);
    let printed = String::from_utf8(out.stdout)?;
    let want = format!(
        "fencecheck-gateway {}\n",
        fencecheck_tests::workspace_version()?
    );
    ensure!(printed == want, "printed {printed:?}, want {want:?}");
    Ok(())
}
