//! The fencing decision of fencecheck, in one place.
//!
//! This crate is compiled twice from the same source: to `wasm32-unknown-unknown`
//! and then encoded as the fencecheck component (the one implementation every
//! host loads), and natively, as the reference implementation that the wasm
//! build is compared against byte for byte.
//!
//! # Layout
//!
//! - `types`: tokens, requests, decisions and errors (the WIT types, in Rust).
//! - `state`: the canonical, checksummed encoding of a scope's state.
//! - `check`: the fence check's decision rules (docs/design.md §3), in order.
//! - `lease`: the lease authority's grant rules and the lease state encoding.
//! - `frame`: the checksummed frame both encodings share.
//! - `auth`: signed tokens: the grant message, HMAC-SHA256 signing and
//!   verification (rule 1b), `check-signed`.
//! - `packed`: `check-packed`, many checks over one byte buffer each way,
//!   and its one-item form (`check_one_packed`).
//! - `alloc` (wasm only): the counting bump allocator every call allocates from.
//! - `one` (wasm only): the single-check core export: one crossing per check
//!   over persistent input and output buffers (docs/design.md §7).
//! - `crc`: CRC-32C, hand-written to keep the component small.
//! - `bindings` (wasm only): the wit-bindgen exports, a thin conversion layer.
//!
//! The logic is pure: no clock, no I/O, no randomness, no floats, and no panic
//! on any input (arithmetic is checked, slices are taken with `get`/`split_at_checked`).
//!
//! # Example
//!
//! ```
//! use fencecheck_guest::{check, Decision, Policy, Request, Token};
//!
//! let first = Request::new("report/july", Token::new(0, 0, 41), Policy::Strict);
//! let Ok(Decision::Applied { state, .. }) = check(None, &first) else { panic!() };
//! let newer = Request::new("report/july", Token::new(0, 0, 42), Policy::Strict);
//! let Ok(Decision::Applied { state, .. }) = check(Some(&state), &newer) else { panic!() };
//! // The paused owner of token 41 comes back: refused, definitively.
//! assert!(matches!(check(Some(&state), &first), Ok(Decision::StaleFence { .. })));
//! ```
#![deny(
    clippy::panic,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::float_arithmetic
)]

// wit-bindgen's generated ABI glue, the allocator and the single-check
// core export are the only unsafe code in the guest (wasm only).
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod alloc;
mod auth;
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod bindings;
mod check;
mod crc;
mod frame;
mod lease;
#[cfg(target_arch = "wasm32")]
#[allow(unsafe_code)]
mod one;
mod packed;
mod state;
mod types;

pub use auth::{
    AuthFailure, GrantKey, GrantSignature, KeyProblem, MAX_KEYS, MAX_SECRET_BYTES,
    MAX_SIGNED_LEASE_ID_BYTES, MIN_SECRET_BYTES, SignError, SignedCheckError, TAG_BYTES,
    check_keys, check_signed, grant_message, sign,
};
pub use check::check;
pub use frame::FORMAT_VERSION;
pub use lease::{
    Acquire, AcquireRequest, Holder, LeaseError, LeaseInfo, LeaseInvalidReason, MAX_LEASE_ID_BYTES,
    MAX_LOCK_BYTES, Release, ReleaseRequest, Renew, RenewRequest, acquire, inspect_lease, release,
    renew, restore,
};
pub use packed::{BatchError, check_one_packed, check_packed};
pub use state::{WINDOW_CAPACITY, inspect};
pub use types::{
    CheckError, Corruption, Decision, InvalidReason, MAX_OP_ID_BYTES, MAX_SCOPE_BYTES, Policy,
    Request, StateInfo, Token, WindowEntry,
};
