//! The released 0.1.0 component (`tests/fixtures/`) and what the upgrade
//! tests build around it: a packed-batch encoder and a newer-format frame.

use std::path::PathBuf;
use std::sync::OnceLock;

use anyhow::{Context, Result, ensure};
use fencecheck::{FORMAT_VERSION, Limits, Policy, Request, Runtime};

/// SHA-256 of `tests/fixtures/fencecheck-0.1.0.wasm` (tests/fixtures/README.md).
pub const FIXTURE_SHA256: &str = "4f8715e9dd1ed6e2db15338c2c3d2f490c588f89e49ecb5dba1731d3c6f29f7a";

/// `tests/fixtures/fencecheck-0.1.0.wasm`: the released 0.1.0 component.
pub fn fixture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/fencecheck-0.1.0.wasm")
}

/// The process-wide runtime over the 0.1.0 fixture with default limits
/// (compiled once per test process; the default, core transport).
pub fn old_runtime() -> Result<Runtime> {
    static OLD: OnceLock<Runtime> = OnceLock::new();
    if let Some(rt) = OLD.get() {
        return Ok(rt.clone());
    }
    let path = fixture_path();
    let rt = Runtime::from_file(&path, Limits::default())
        .with_context(|| format!("loading {}", path.display()))?;
    Ok(OLD.get_or_init(|| rt).clone())
}

/// CRC-32C (Castagnoli, reflected), as the guest's frame uses: written out
/// here so the test forges frames the way an independent writer would.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A well-formed frame of format `FORMAT_VERSION + 1` made from `state` (a
/// fence or lease state this build wrote): the format byte raised and the
/// CRC-32C recomputed, as a future writer would, body unchanged. (Only the
/// frame is known to be shared across versions; the body layout a future
/// format will have is not, so an old reader must refuse it whole.)
pub fn newer_format(state: &[u8]) -> Result<Vec<u8>> {
    ensure!(state.len() >= 11, "a frame is at least 11 bytes");
    ensure!(state[2] == FORMAT_VERSION, "not a current-format frame");
    let mut out = state.to_vec();
    out[2] = FORMAT_VERSION + 1;
    let body = out.len() - 4;
    let crc = crc32c(&out[..body]);
    out[body..].copy_from_slice(&crc.to_le_bytes());
    Ok(out)
}

/// `items` in the `check-packed` input format (wit/fence.wit), written
/// independently of the runtime's encoder.
pub fn pack(items: &[(Option<&[u8]>, &Request)]) -> Vec<u8> {
    fn put(out: &mut Vec<u8>, bytes: &[u8]) {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    let mut out = (items.len() as u32).to_le_bytes().to_vec();
    for (state, r) in items {
        let flags = u8::from(state.is_some())
            | u8::from(r.op_id.is_some()) << 1
            | u8::from(r.expected_version.is_some()) << 2
            | u8::from(r.policy == Policy::AllowEqual) << 3;
        out.push(flags);
        for v in [r.token.authority, r.token.epoch, r.token.counter] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        if let Some(v) = r.expected_version {
            out.extend_from_slice(&v.to_le_bytes());
        }
        put(&mut out, r.scope.as_bytes());
        if let Some(op) = &r.op_id {
            put(&mut out, op.as_bytes());
        }
        if let Some(s) = state {
            put(&mut out, s);
        }
    }
    out
}
