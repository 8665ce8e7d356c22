//! `fencecheck-gateway --version` prints the project's one version.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// `[workspace.package] version` from the root Cargo.toml, the version every
/// artifact carries (scripts/version reads the same line).
fn workspace_version() -> Result<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let text = std::fs::read_to_string(&manifest).context("reading the root Cargo.toml")?;
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[workspace.package]";
        } else if in_section && let Some(value) = line.strip_prefix("version") {
            let value = value.trim_start().trim_start_matches('=').trim();
            return Ok(value.trim_matches('"').to_string());
        }
    }
    anyhow::bail!(
        "no version in [workspace.package] of {}",
        manifest.display()
    )
}

/// `fencecheck-gateway --version` prints `fencecheck-gateway VERSION` with the workspace's version and exits 0.
#[test]
fn version_is_the_workspace_version() -> Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck-gateway"))
        .arg("--version")
        .output()
        .context("running fencecheck-gateway --version")?;
    ensure!(out.status.success(), "exit {:?}", out.status);
    let printed = String::from_utf8(out.stdout)?;
    let want = format!("fencecheck-gateway {}\n", workspace_version()?);
    ensure!(printed == want, "printed {printed:?}, want {want:?}");
    Ok(())
}
