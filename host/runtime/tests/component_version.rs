//! The component's version is its WIT package version; a runtime reports the
//! one it loaded and refuses, at load, a component whose version it does not
//! support (src/version.rs). The "future" components are the real one with
//! the version in every `fencecheck:fence…` name rewritten (same length) and
//! validated: they differ from it only in the version they claim.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use fencecheck::{
    COMPONENT, Decision, Error, Limits, Loaded, Policy, Precompiled, Request, Runtime, Token,
    Transport, WIT_VERSION, rewrite_wit_version,
};

/// `[workspace.package] version` from the root Cargo.toml.
fn workspace_version() -> Result<String> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml");
    let text = std::fs::read_to_string(&manifest).context("reading the root Cargo.toml")?;
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[workspace.package]";
        } else if in_section && let Some(value) = line.strip_prefix("version") {
            return Ok(value
                .trim_start()
                .trim_start_matches('=')
                .trim()
                .trim_matches('"')
                .to_string());
        }
    }
    bail!(
        "no version in [workspace.package] of {}",
        manifest.display()
    )
}

/// `package fencecheck:fence@V;` from wit/fence.wit.
fn wit_file_version() -> Result<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../wit/fence.wit");
    let text = std::fs::read_to_string(&path).context("reading wit/fence.wit")?;
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("package fencecheck:fence@")?
                .strip_suffix(';')
        })
        .map(str::to_string)
        .context("no package line in wit/fence.wit")
}

/// The WIT package versions the interface: on the release's line
/// (Cargo.toml's, this crate's) and never ahead of it (a release that
/// changes no interface keeps it: 0.1.2 ships 0.1.1), and the embedded
/// component carries it in its exports.
#[test]
fn wit_version_is_on_the_release_line() -> Result<()> {
    let wit = wit_file_version()?;
    let release = workspace_version()?;
    ensure!(release == env!("CARGO_PKG_VERSION"));
    let parts = |v: &str| -> Option<Vec<u64>> { v.split('.').map(|p| p.parse().ok()).collect() };
    let (Some(w), Some(r)) = (parts(&wit), parts(&release)) else {
        bail!("unparsable versions: wit/fence.wit {wit}, Cargo.toml {release}");
    };
    ensure!(
        w.len() == 3 && r.len() == 3 && w[..2] == r[..2] && w[2] <= r[2],
        "wit/fence.wit says {wit}: not on release {release}'s line, or ahead of it"
    );
    ensure!(
        WIT_VERSION == wit,
        "built against {WIT_VERSION}, the WIT says {wit}"
    );
    let runtime = Runtime::new()?;
    ensure!(
        runtime.component_version() == wit,
        "{}",
        runtime.component_version()
    );
    Ok(())
}

/// The version is read from the loaded component whichever way its machine
/// code came: precompiled artifacts or compiled in this process.
#[test]
fn both_load_paths_report_the_version() -> Result<()> {
    let precompiled = Runtime::from_bytes(COMPONENT, Limits::default())?;
    let damaged = Precompiled {
        sha256: [0; 32],
        ..fencecheck::PRECOMPILED
    };
    let compiled = Runtime::from_precompiled(COMPONENT, &damaged, Limits::default())?;
    ensure!(
        compiled.loaded() == Loaded::Compiled,
        "{:?}",
        compiled.loaded()
    );
    for rt in [precompiled, compiled] {
        ensure!(
            rt.component_version() == WIT_VERSION,
            "{}",
            rt.component_version()
        );
    }
    Ok(())
}

fn expect_refused(result: Result<Runtime, Error>, found: &str) -> Result<()> {
    match result {
        Err(e) if matches!(e, Error::UnsupportedComponent { .. }) => {
            if let Error::UnsupportedComponent {
                found: f,
                supported,
            } = &e
            {
                ensure!(f == found, "found {f:?}, want {found:?}");
                ensure!(supported == "fencecheck:fence@0.1.x", "{supported}");
            }
            let text = e.to_string();
            ensure!(
                text == format!(
                    "component exports {found}; this host supports fencecheck:fence@0.1.x"
                ),
                "{text}"
            );
            Ok(())
        }
        Err(other) => bail!("refused, but as {other:?}"),
        Ok(rt) => bail!("loaded a component claiming {}", rt.component_version()),
    }
}

/// A component claiming 0.2.0 or 1.0.0 (another contract) is refused by
/// `from_bytes`, `from_file` and `from_precompiled`, with what it exports
/// and what this host supports.
#[test]
fn other_versions_are_refused_at_load() -> Result<()> {
    ensure!(
        WIT_VERSION.starts_with("0.1."),
        "update the fixtures with the WIT version"
    );
    let dir = tempfile::tempdir()?;
    for version in ["0.2.0", "1.0.0", "0.0.9"] {
        let future = rewrite_wit_version(COMPONENT, version)?;
        let found = format!("fencecheck:fence/check@{version}");
        expect_refused(Runtime::from_bytes(&future, Limits::default()), &found)?;
        let path = dir.path().join(format!("fencecheck-{version}.wasm"));
        std::fs::write(&path, &future)?;
        expect_refused(Runtime::from_file(&path, Limits::default()), &found)?;
        expect_refused(
            Runtime::from_precompiled(&future, &fencecheck::PRECOMPILED, Limits::default()),
            &found,
        )?;
    }
    Ok(())
}

/// A valid component that does not export fencecheck:fence/check at all is
/// refused as such, naming what it does export.
#[test]
fn a_component_without_the_interface_is_refused() -> Result<()> {
    let empty = b"\0asm\x0d\0\x01\0";
    expect_refused(
        Runtime::from_bytes(empty, Limits::default()),
        "no fencecheck:fence/check interface (its exports: nothing)",
    )?;
    let renamed = rewrite_renamed(COMPONENT)?;
    match Runtime::from_bytes(&renamed, Limits::default()) {
        Err(Error::UnsupportedComponent { found, .. }) => {
            ensure!(
                found.starts_with("no fencecheck:fence/check interface (its exports: "),
                "{found}"
            );
            let chock = format!("fencecheck:fence/chock@{WIT_VERSION}");
            ensure!(found.contains(&chock), "{found}");
        }
        other => bail!("{other:?}"),
    }
    Ok(())
}

/// The real component with `fencecheck:fence/check` renamed `.../chock`.
fn rewrite_renamed(component: &[u8]) -> Result<Vec<u8>> {
    let (from, to) = (b"fencecheck:fence/check@", b"fencecheck:fence/chock@");
    let mut out = component.to_vec();
    let mut n = 0;
    let mut i = 0;
    while i + from.len() <= out.len() {
        if out[i..].starts_with(from) {
            out[i..i + to.len()].copy_from_slice(to);
            n += 1;
        }
        i += 1;
    }
    ensure!(n > 0, "no check interface in the component");
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(&out)
        .context("the renamed component does not validate")?;
    Ok(out)
}

/// A later patch of the same 0.1 line is run (wasmtime binds its exports
/// semver-compatibly), reports its own version, keeps the fast transport and
/// decides as the embedded one does.
#[test]
fn a_compatible_patch_is_run() -> Result<()> {
    let patch = rewrite_wit_version(COMPONENT, "0.1.9")?;
    let rt = Runtime::from_bytes(&patch, Limits::default())?;
    ensure!(
        rt.component_version() == "0.1.9",
        "{}",
        rt.component_version()
    );
    ensure!(rt.transport() == Transport::Core, "{:?}", rt.transport());
    for rt in [rt.clone(), rt.with_component_transport()] {
        let mut guest = rt.instance()?;
        let request = Request::new("s", Token::new(0, 0, 3), Policy::Strict);
        let Ok(Decision::Applied { state, .. }) = guest.check(None, &request)? else {
            bail!("the first token was not applied");
        };
        let stale = Request::new("s", Token::new(0, 0, 2), Policy::Strict);
        let outcome = guest.check(Some(&state), &stale)?;
        ensure!(
            matches!(outcome, Ok(Decision::StaleFence { .. })),
            "{outcome:?}"
        );
    }
    Ok(())
}

/// The rewrite is honest: it refuses a version of another length, and a
/// rewrite back to the built version gives the original bytes.
#[test]
fn the_fixture_differs_only_in_the_version() -> Result<()> {
    ensure!(rewrite_wit_version(COMPONENT, "0.10.0").is_err());
    let future = rewrite_wit_version(COMPONENT, "0.2.0")?;
    ensure!(future.len() == COMPONENT.len() && future != COMPONENT);
    // Back: every byte that changed was a version digit.
    let mut back = future.clone();
    for (b, orig) in back.iter_mut().zip(COMPONENT) {
        if *b != *orig {
            ensure!(
                b.is_ascii_digit() && orig.is_ascii_digit(),
                "a non-version byte changed"
            );
            *b = *orig;
        }
    }
    ensure!(back == COMPONENT);
    Ok(())
}
