//! The built component's shape and the runtime's failure handling.

use anyhow::{Context, Result, bail, ensure};
use fencecheck::{
    Allocation, COMPONENT, CheckError, Checker, Decision, Error, InvalidReason, Limits, Loaded,
    Native, PRECOMPILED, Policy, Precompiled, Request, Runtime, Token, Transport,
};
use fencecheck_tests::runtime;
use wasmparser::{Parser, Payload};

/// The component imports nothing at all (no WASI, no host functions), checked
/// by parsing its binary: the outer component has no imports and no core
/// module inside it imports anything either.
#[test]
fn component_imports_nothing() -> Result<()> {
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(COMPONENT) {
        match payload.context("parsing the component")? {
            // Nested components (wit-component's type ascriptions for exported
            // interfaces) import types from their parent; only the outermost
            // component's imports reach the host.
            Payload::ComponentImportSection(section) if depth == 0 => {
                for import in section {
                    imports.push(format!("component import {}", import?.name.0));
                }
            }
            Payload::ImportSection(section) => {
                for import in section {
                    let import = import?;
                    imports.push(format!("core import {}::{}", import.module, import.name));
                }
            }
            Payload::ComponentExportSection(section) if depth == 0 => {
                for export in section {
                    exports.push(export?.name.0.to_string());
                }
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => depth += 1,
            Payload::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    ensure!(imports.is_empty(), "the component imports: {imports:?}");
    exports.sort();
    ensure!(
        exports
            == [
                "fencecheck:fence/auth@0.1.1",
                "fencecheck:fence/check@0.1.1",
                "fencecheck:fence/lease@0.1.1",
                "fencecheck:fence/types@0.1.1"
            ],
        "unexpected exports {exports:?}"
    );
    Ok(())
}

/// The component stays small: under 96 KiB. The budget was 64 KiB until
/// signed tokens (0.1.1) took it from 62,968 to 87,972 bytes: SHA-256's
/// unrolled compression alone is 7.9 KB of code, and the `auth` exports'
/// glue, verification and signing most of the rest. The compact SHA-256
/// would save about 6.5 KB at 1.6 times the fuel per verification
/// (docs/signed-tokens.md); speed on the write path was chosen over size.
#[test]
fn component_is_small() {
    assert!(COMPONENT.len() < 96 * 1024, "{} bytes", COMPONENT.len());
}

/// A trapping guest (here: out of memory while receiving a batch) is reported
/// as `Error::Trapped`, and the same `Instance` works again afterwards.
#[test]
fn trap_is_an_error_and_the_instance_recovers() -> Result<()> {
    let limits = Limits {
        memory_bytes: 2 << 20,
        ..Limits::default()
    };
    let rt = Runtime::from_bytes(COMPONENT, limits)?;
    let mut guest = rt.instance()?;
    let big = "x".repeat(1000);
    let request = Request::new(big.as_str(), Token::new(0, 0, 1), Policy::Strict);
    let items: Vec<(Option<&[u8]>, &Request)> = (0..4000).map(|_| (None, &request)).collect();
    match guest.check_batch(&items) {
        Err(Error::Trapped { call, .. }) => ensure!(call == "check-packed", "{call}"),
        other => bail!("expected a trap, got {other:?}"),
    }
    let ok = Request::new("report/july", Token::new(0, 0, 1), Policy::Strict);
    let outcome = guest.check(None, &ok)?;
    ensure!(
        matches!(outcome, Ok(Decision::Applied { version: 1, .. })),
        "{outcome:?}"
    );
    Ok(())
}

/// Under metering (any component loaded from a path, or asked for), a guest
/// that runs out of fuel is stopped and reported, not left running, over
/// both transports.
#[test]
fn fuel_bounds_each_call() -> Result<()> {
    let limits = Limits {
        fuel_per_check: 50,
        fuel_per_input_byte: 0,
        ..Limits::default()
    };
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("fencecheck.wasm");
    std::fs::write(&path, COMPONENT)?;
    let from_file = Runtime::from_file(&path, limits)?;
    ensure!(from_file.metered(), "a component from a path runs metered");
    let metered = Runtime::from_bytes_metered(COMPONENT, limits)?;
    let request = Request::new("s", Token::new(0, 0, 1), Policy::Strict);
    for rt in [
        from_file.clone(),
        from_file.with_component_transport(),
        metered,
    ] {
        match rt.instance()?.check(None, &request) {
            Err(Error::Trapped { message, .. }) => ensure!(message.contains("fuel"), "{message}"),
            other => bail!("expected an out-of-fuel trap, got {other:?}"),
        }
    }
    Ok(())
}

/// The embedded component runs unmetered: the fuel limit does not apply,
/// no fuel is reported, and it decides as the metered runtime does, which
/// reports what each call consumed.
#[test]
fn the_embedded_component_runs_unmetered() -> Result<()> {
    let starved = Limits {
        fuel_per_check: 1,
        ..Limits::default()
    };
    let rt = Runtime::from_bytes(COMPONENT, starved)?;
    ensure!(!rt.metered() && !Runtime::new()?.metered());
    let request = Request::new("s", Token::new(0, 0, 1), Policy::Strict);
    let mut guest = rt.instance()?;
    let outcome = guest.check(None, &request)?;
    ensure!(
        matches!(outcome, Ok(Decision::Applied { .. })),
        "{outcome:?}"
    );
    ensure!(guest.last_fuel().is_none());
    let mut metered = Runtime::from_bytes_metered(COMPONENT, Limits::default())?.instance()?;
    ensure!(metered.check(None, &request)? == outcome);
    let used = metered.last_fuel();
    ensure!(matches!(used, Some(1..=100_000)), "{used:?}");
    Ok(())
}

/// Inputs above the transport bound are refused before reaching the guest.
#[test]
fn oversized_calls_are_refused_before_the_guest() -> Result<()> {
    let limits = Limits {
        call_bytes: 4096,
        ..Limits::default()
    };
    let mut guest = Runtime::from_bytes(COMPONENT, limits)?.instance()?;
    let request = Request::new("s".repeat(5000), Token::new(0, 0, 1), Policy::Strict);
    match guest.check(None, &request) {
        Err(Error::TooLarge { bytes: 5000, .. }) => Ok(()),
        other => bail!("expected TooLarge, got {other:?}"),
    }
}

/// A multi-megabyte scope within the transport bound reaches the guest and is
/// refused as an invalid request, not a trap.
#[test]
fn huge_scope_is_an_invalid_request() -> Result<()> {
    let mut guest = runtime()?.instance()?;
    let request = Request::new("s".repeat(4 << 20), Token::new(0, 0, 1), Policy::Strict);
    let outcome = guest.check(None, &request)?;
    ensure!(
        outcome == Err(CheckError::InvalidRequest(InvalidReason::ScopeTooLong)),
        "{outcome:?}"
    );
    Ok(())
}

/// Bytes that are not a component are a load error, not a panic.
#[test]
fn garbage_component_is_a_load_error() {
    let result = Runtime::from_bytes(b"\0asm not really", Limits::default());
    assert!(matches!(result, Err(Error::Load(_))), "{result:?}");
}

/// One runtime serves many threads, each with its own instance, and every
/// thread gets the native reference's answer.
#[test]
fn one_runtime_many_threads() -> Result<()> {
    let rt = runtime()?;
    let handles: Vec<_> = (0..8u64)
        .map(|i| {
            let rt = rt.clone();
            std::thread::spawn(move || -> Result<()> {
                let mut guest = rt.instance()?;
                let mut state: Option<Vec<u8>> = None;
                for counter in 1..=200u64 {
                    let r = Request::new(
                        format!("scope/{i}"),
                        Token::new(i, 1, counter),
                        Policy::Strict,
                    );
                    let wasm = guest.check(state.as_deref(), &r)?;
                    let native = Native.check(state.as_deref(), &r)?;
                    ensure!(wasm == native, "thread {i}: {wasm:?} != {native:?}");
                    if let Ok(Decision::Applied { state: next, .. }) = wasm {
                        state = Some(next);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("thread panicked"))??;
    }
    Ok(())
}

/// The embedded component loads from its precompiled artifacts (no compile
/// in a new process), for on-demand and pooled allocation alike, and uses the
/// core transport.
#[test]
fn embedded_component_is_precompiled() -> Result<()> {
    for allocation in [Allocation::OnDemand, Allocation::Pooling { instances: 4 }] {
        let rt = Runtime::from_bytes(
            COMPONENT,
            Limits {
                allocation,
                ..Limits::default()
            },
        )?;
        ensure!(
            rt.loaded() == Loaded::Precompiled,
            "{allocation:?}: {:?}",
            rt.loaded()
        );
        ensure!(rt.transport() == Transport::Core);
        let request = Request::new("report/july", Token::new(0, 0, 1), Policy::Strict);
        ensure!(matches!(
            rt.instance()?.check(None, &request)?,
            Ok(Decision::Applied { .. })
        ));
    }
    Ok(())
}

/// A precompiled artifact that is damaged (one byte flipped, in either part,
/// or its checksum), made for other bytes, or made under another engine
/// configuration is never deserialized: the runtime compiles the component
/// instead and decides exactly as the precompiled one does.
#[test]
fn damaged_or_mismatched_artifacts_fall_back_to_compiling() -> Result<()> {
    let request = Request::new("report/july", Token::new(0, 0, 1), Policy::Strict);
    let expected = Runtime::new()?.instance()?.check(None, &request)?;
    let mut component = PRECOMPILED.component.to_vec();
    let middle = component.len() / 2;
    component[middle] ^= 0x01;
    let mut core = PRECOMPILED.core.to_vec();
    let middle = core.len() / 2;
    core[middle] ^= 0x80;
    let mut sha256 = PRECOMPILED.sha256;
    sha256[0] ^= 0x01;
    // Under another configuration (fuel on, where the embedded artifacts
    // are unmetered): checksummed as if genuine, so only wasmtime's own
    // compatibility check can refuse it.
    let mut other = wasmtime::Config::new();
    other.consume_fuel(true);
    let wasm = |e: wasmtime::Error| anyhow::anyhow!("{e:#}");
    let engine = wasmtime::Engine::new(&other).map_err(wasm)?;
    let foreign_component = engine.precompile_component(COMPONENT).map_err(wasm)?;
    let foreign_core = PRECOMPILED.core.to_vec();
    let foreign_sha = digest(COMPONENT, &foreign_component, &foreign_core);
    let cases: [(&str, &[u8], Precompiled<'_>); 5] = [
        (
            "component flipped",
            COMPONENT,
            Precompiled {
                component: &component,
                ..PRECOMPILED
            },
        ),
        (
            "core flipped",
            COMPONENT,
            Precompiled {
                core: &core,
                ..PRECOMPILED
            },
        ),
        (
            "checksum flipped",
            COMPONENT,
            Precompiled {
                sha256,
                ..PRECOMPILED
            },
        ),
        (
            "another configuration",
            COMPONENT,
            Precompiled {
                component: &foreign_component,
                core: &foreign_core,
                sha256: foreign_sha,
            },
        ),
        (
            "empty",
            COMPONENT,
            Precompiled {
                component: &[],
                core: &[],
                sha256: [0; 32],
            },
        ),
    ];
    for (what, bytes, precompiled) in cases {
        let rt = Runtime::from_precompiled(bytes, &precompiled, Limits::default())?;
        ensure!(rt.loaded() == Loaded::Compiled, "{what}: {:?}", rt.loaded());
        ensure!(rt.instance()?.check(None, &request)? == expected, "{what}");
    }
    // The genuine artifacts, through the same entry point, are used.
    let rt = Runtime::from_precompiled(COMPONENT, &PRECOMPILED, Limits::default())?;
    ensure!(rt.loaded() == Loaded::Precompiled);
    Ok(())
}

fn digest(bytes: &[u8], component: &[u8], core: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    for part in [bytes, component, core] {
        digest.update((part.len() as u64).to_le_bytes());
        digest.update(part);
    }
    digest.finalize().into()
}

/// The documented fuel bound (`FUEL_BOUND_BASE + FUEL_BOUND_PER_BYTE ×
/// input bytes`) holds on the costliest inputs each export takes: the
/// longest scope and op-id on a full window, a signed check with the most
/// keys and the longest lease id, a 1 MiB invalid scope (validated byte by
/// byte), a packed batch of many such items, lease calls on the longest
/// lock. The fuzz target `fuel_bound` explores the rest; this pins the
/// known worst cases, and prints each call's fuel per byte for the
/// constants' documentation.
#[test]
fn worst_case_calls_stay_under_the_fuel_bound() -> Result<()> {
    use fencecheck::{
        AcquireRequest, FUEL_BOUND_BASE, FUEL_BOUND_PER_BYTE, GrantKey, MAX_KEYS,
        MAX_LEASE_ID_BYTES, MAX_LOCK_BYTES, MAX_OP_ID_BYTES, MAX_SCOPE_BYTES,
        MAX_SIGNED_LEASE_ID_BYTES, WINDOW_CAPACITY,
    };
    // Fuel enough never to trap: the bound, not the budget, is under test.
    let limits = Limits {
        fuel_per_check: 1 << 40,
        ..Limits::default()
    };
    let rt = Runtime::from_bytes_metered(COMPONENT, limits)?;
    let mut core = rt.instance()?;
    let mut component = rt.with_component_transport().instance()?;
    let within = |guest: &fencecheck::Instance, what: &str, bytes: usize| -> Result<()> {
        let fuel = guest
            .last_fuel()
            .context("a metered call reports its fuel")?;
        let bound = FUEL_BOUND_BASE + FUEL_BOUND_PER_BYTE * bytes as u64;
        println!(
            "{what}: {fuel} fuel, {bytes} bytes ({} per byte above the base)",
            fuel.saturating_sub(FUEL_BOUND_BASE) / bytes.max(1) as u64
        );
        ensure!(
            fuel <= bound,
            "{what}: {fuel} fuel > bound {bound} for {bytes} bytes"
        );
        Ok(())
    };
    // A full window of the longest op-ids on the longest scope.
    let scope = "s".repeat(MAX_SCOPE_BYTES);
    let mut state = None;
    for i in 0..=WINDOW_CAPACITY as u64 {
        let mut request = Request::new(&scope, Token::new(0, 1, i + 1), Policy::Strict);
        request.op_id = Some(format!("{i:0>width$}", width = MAX_OP_ID_BYTES));
        let Ok(Decision::Applied { state: next, .. }) = Native.check(state.as_deref(), &request)?
        else {
            bail!("filling the window");
        };
        state = Some(next);
    }
    let state = state.context("a state")?;
    let mut request = Request::new(&scope, Token::new(0, 1, 100), Policy::Strict);
    request.op_id = Some("o".repeat(MAX_OP_ID_BYTES));
    let bytes = state.len() + scope.len() + MAX_OP_ID_BYTES;
    for (name, guest) in [("core", &mut core), ("component", &mut component)] {
        let outcome = guest.check(Some(&state), &request)?;
        ensure!(
            matches!(outcome, Ok(Decision::Applied { .. })),
            "{outcome:?}"
        );
        within(guest, &format!("check, full window ({name})"), bytes)?;
    }
    ensure!(component.inspect(&state)?.is_ok());
    within(&component, "inspect, full window", state.len())?;

    // Signed: the most keys, the longest lease id, the longest scope.
    let keys: Vec<GrantKey> = (0..MAX_KEYS as u32)
        .map(|id| GrantKey {
            key_id: id,
            secret: vec![id as u8; 64],
        })
        .collect();
    let lease_id = "l".repeat(MAX_SIGNED_LEASE_ID_BYTES);
    let last = keys.last().context("keys")?;
    let signature = fencecheck_guest::sign(&scope, request.token, &lease_id, last)
        .map_err(|e| anyhow::anyhow!("signing: {e}"))?;
    let signed = request.clone().with_signature(signature);
    let bytes =
        bytes + lease_id.len() + keys.iter().map(|k| 5 + k.secret.len()).sum::<usize>() + 32;
    for (name, guest) in [("core", &mut core), ("component", &mut component)] {
        let outcome = guest.check_signed(Some(&state), &signed, &keys)?;
        ensure!(outcome.is_ok(), "{outcome:?}");
        within(guest, &format!("check-signed, full window ({name})"), bytes)?;
    }

    // An invalid 1 MiB scope: refused, after validating it.
    let huge = Request::new("é".repeat(1 << 19), Token::new(0, 1, 1), Policy::Strict);
    for (name, guest) in [("core", &mut core), ("component", &mut component)] {
        let outcome = guest.check(None, &huge)?;
        ensure!(
            outcome == Err(CheckError::InvalidRequest(InvalidReason::ScopeTooLong)),
            "{outcome:?}"
        );
        within(
            guest,
            &format!("check, 1 MiB scope ({name})"),
            huge.scope.len(),
        )?;
    }

    // A batch of 64 full-window items.
    let items: Vec<(Option<&[u8]>, &Request)> = (0..64)
        .map(|_| (Some(state.as_slice()), &request))
        .collect();
    let batch_bytes = 64 * (state.len() + scope.len() + MAX_OP_ID_BYTES + 45);
    for (name, guest) in [("core", &mut core), ("component", &mut component)] {
        let outcomes = guest.check_batch(&items)?;
        ensure!(
            outcomes
                .iter()
                .all(|o| matches!(o, Ok(Decision::Applied { .. })))
        );
        within(
            guest,
            &format!("check-packed, 64 items ({name})"),
            batch_bytes,
        )?;
    }

    // A batch of the smallest signed items: an HMAC each over a few bytes,
    // the highest cost per input byte there is.
    let key = GrantKey {
        key_id: 1,
        secret: vec![7; fencecheck::MIN_SECRET_BYTES],
    };
    let small = Request::new("s", Token::new(0, 1, 1), Policy::Strict);
    let small_signature = fencecheck_guest::sign("s", small.token, "l", &key)
        .map_err(|e| anyhow::anyhow!("signing: {e}"))?;
    let small = small.with_signature(small_signature);
    let outcome = component.check_signed(None, &small, std::slice::from_ref(&key))?;
    ensure!(
        matches!(outcome, Ok(Decision::Applied { .. })),
        "{outcome:?}"
    );
    let small_bytes = 1 + 1 + 5 + key.secret.len() + 32;
    within(&component, "check-signed, smallest", small_bytes)?;
    let outcome = core.check_signed(None, &small, std::slice::from_ref(&key))?;
    ensure!(
        matches!(outcome, Ok(Decision::Applied { .. })),
        "{outcome:?}"
    );
    within(&core, "check-signed, smallest (core)", small_bytes)?;

    // ... and a packed batch of 128 of them (94 bytes each).
    let mut batch = 128u32.to_le_bytes().to_vec();
    for _ in 0..128 {
        batch.push(0x30); // keys and signature
        for word in [0u64, 1, 1] {
            batch.extend_from_slice(&word.to_le_bytes());
        }
        batch.extend_from_slice(&1u32.to_le_bytes());
        batch.push(b's');
        batch.push(1);
        batch.extend_from_slice(&key.key_id.to_le_bytes());
        batch.push(key.secret.len() as u8);
        batch.extend_from_slice(&key.secret);
        let signature = small.signature.as_ref().context("signed")?;
        batch.extend_from_slice(&signature.key_id.to_le_bytes());
        batch.extend_from_slice(&1u32.to_le_bytes());
        batch.push(b'l');
        batch.push(signature.tag.len() as u8);
        batch.extend_from_slice(&signature.tag);
    }
    for (name, guest) in [("core", &mut core), ("component", &mut component)] {
        let answer = guest.check_packed_raw(&batch)?;
        ensure!(answer.is_ok(), "{answer:?}");
        within(
            guest,
            &format!("check-packed, 128 smallest signed ({name})"),
            batch.len(),
        )?;
    }

    // Lease calls on the longest lock and lease id.
    let acquire = AcquireRequest {
        lock: "k".repeat(MAX_LOCK_BYTES),
        lease_id: "l".repeat(MAX_LEASE_ID_BYTES),
        authority: 0,
        epoch_floor: 1,
        now: 1_000,
        ttl: 500,
    };
    let bytes = MAX_LOCK_BYTES + MAX_LEASE_ID_BYTES;
    let Ok(fencecheck::Acquire::Acquired { state: lease, .. }) =
        component.acquire(None, &acquire)?
    else {
        bail!("acquire");
    };
    within(&component, "acquire", bytes)?;
    ensure!(component.inspect_lease(&lease)?.is_ok());
    within(&component, "inspect-lease", lease.len())?;
    ensure!(component.restore(Some(&lease))?.is_ok());
    within(&component, "restore", lease.len())?;
    Ok(())
}
