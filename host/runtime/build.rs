//! Builds the guest crate for `wasm32-unknown-unknown` and encodes it as the
//! fencecheck component, so a plain `cargo build` embeds the component bytes;
//! then precompiles the component and its core module for the host with the
//! runtime's own engine configuration (`src/engine.rs`), so a new process
//! deserializes machine code instead of running Cranelift. The runtime
//! checks the artifacts' SHA-256 (written here) before it deserializes them
//! and compiles the component instead if they do not match or wasmtime finds
//! them incompatible.
//!
//! The nested cargo uses its own target directory (`<target>/guest`): the
//! outer cargo holds the lock on its profile directory while build scripts run.
//! Everything is built once per change of `guest/` or `wit/`, not per test.

use std::env;
use std::error::Error;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

#[path = "src/engine.rs"]
mod engine;
#[path = "src/shape.rs"]
mod shape;
use shape::only_core_module;

fn main() -> Result<(), Box<dyn Error>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir
        .parent()
        .and_then(Path::parent)
        .ok_or("host/runtime must sit two levels below the workspace root")?
        .to_path_buf();
    for watched in [
        "guest/src",
        "guest/Cargo.toml",
        "wit",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    // The engine configuration and the core-module finder are shared with
    // the runtime: the artifacts must be remade whenever they change.
    for shared in ["src/engine.rs", "src/shape.rs"] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest_dir.join(shared).display()
        );
    }
    println!("cargo:rerun-if-env-changed=CARGO_TARGET_DIR");

    // The WIT package version this crate is built against (src/version.rs):
    // read from the WIT itself, so there is no second copy to forget.
    let wit = fs::read_to_string(root.join("wit/fence.wit"))?;
    let version = wit
        .lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("package fencecheck:fence@")?
                .strip_suffix(';')
        })
        .ok_or("wit/fence.wit has no `package fencecheck:fence@VERSION;` line")?;
    println!("cargo:rustc-env=FENCECHECK_WIT_VERSION={version}");

    let target_dir = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("guest");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(&root)
        .args(["build", "--package", "fencecheck-guest"])
        .args(["--target", "wasm32-unknown-unknown", "--profile", "guest"])
        .arg("--target-dir")
        .arg(&target_dir);
    // The outer build's flags and wrappers (clippy, coverage, host RUSTFLAGS)
    // are for the host target; they must not leak into the wasm build.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        build.env_remove(var);
    }
    let status = build.status()?;
    if !status.success() {
        return Err(format!("building the guest for wasm32-unknown-unknown failed ({status}); is the target installed? `rustup target add wasm32-unknown-unknown`").into());
    }

    let module_path = target_dir.join("wasm32-unknown-unknown/guest/fencecheck_guest.wasm");
    let module =
        fs::read(&module_path).map_err(|e| format!("reading {}: {e}", module_path.display()))?;
    let component = wit_component::ComponentEncoder::default()
        .module(&module)?
        .validate(true)
        .encode()?;
    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    fs::write(out_dir.join("fencecheck.wasm"), &component)?;

    // Precompiled only for the machine kind that builds (a cross build's
    // artifacts would be compiled for another CPU's features anyway and be
    // refused at load): otherwise empty artifacts, and the runtime compiles.
    let (cwasm, core_cwasm) = if env::var("TARGET")? == env::var("HOST")? {
        // Unmetered: the embedded component is the one the runtime trusts
        // to be bounded by its input (src/engine.rs).
        let engine = wasmtime::Engine::new(&engine::config(false))?;
        let core = only_core_module(&component).ok_or("the component has no single core module")?;
        (
            engine.precompile_component(&component)?,
            engine.precompile_module(core)?,
        )
    } else {
        (Vec::new(), Vec::new())
    };
    let mut digest = Sha256::new();
    for part in [&component[..], &cwasm, &core_cwasm] {
        digest.update((part.len() as u64).to_le_bytes());
        digest.update(part);
    }
    fs::write(out_dir.join("fencecheck.cwasm"), &cwasm)?;
    fs::write(out_dir.join("fencecheck-core.cwasm"), &core_cwasm)?;
    fs::write(out_dir.join("fencecheck.cwasm.sha256"), digest.finalize())?;
    Ok(())
}
