//! Shared by the CLI's integration tests: running the binary as a user does.

use std::process::{Command, Output};

use anyhow::{Context, Result};

/// Run `fencecheck ARGS` with the embedded component (any
/// `FENCECHECK_COMPONENT` of the test's environment removed).
pub fn fencecheck(args: &[&str]) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_fencecheck"))
        .args(args)
        .env_remove("FENCECHECK_COMPONENT")
        .output()
        .context("running fencecheck")
}
