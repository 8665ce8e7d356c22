//! Shared helpers for fencecheck's integration tests: one runtime per test
//! process (the component is compiled once), and the vector files.

pub mod fuzzing;
pub mod history;
pub mod netns;
pub mod pgserver;
pub mod s3server;
pub mod signals;
pub mod upgrade;

use std::path::PathBuf;

use anyhow::{Context, Result};
use fencecheck::Runtime;

/// The process-wide runtime over the embedded component, compiled once.
pub fn runtime() -> Result<Runtime> {
    Runtime::shared().context("loading the embedded component")
}

/// `tests/vectors/`.
pub fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vectors")
}

/// Every `*.json` file in `tests/vectors/`, sorted.
pub fn vector_files() -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(vectors_dir()).context("listing tests/vectors")? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// `[workspace.package] version` from the root Cargo.toml, the version every
/// artifact carries (scripts/version reads the same line).
pub fn workspace_version() -> Result<String> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
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
