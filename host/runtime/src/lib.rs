//! Run the fencecheck component inside your own atomic write path.
//!
//! fencecheck is the stale-owner rule for distributed locks: every protected
//! mutation carries a fencing token, and the resource refuses any token below
//! the highest it has accepted. The rule lives in one WebAssembly component;
//! this crate loads it with wasmtime (or runs the same code natively, as the
//! reference) and hands back decisions as values.
//!
//! # Layout
//!
//! - [`Runtime`]: one per process. Shares the wasmtime engine, the compiled
//!   component and its pre-instantiation; cheap to clone and `Send + Sync`.
//!   The embedded component is loaded from machine code precompiled at build
//!   time ([`Loaded`]); [`Limits`] bound every call, [`Allocation`] chooses
//!   on-demand memory (default) or a pool.
//! - [`Instance`]: one per thread or connection. Bounded per call by its
//!   input size and in memory, and by fuel for any component but the embedded
//!   one ([`Runtime::metered`]); re-instantiated after a trap, which is
//!   reported as [`Error::Trapped`].
//!   Checks cross into the guest over the component's core module
//!   ([`Transport::Core`], several times cheaper than the component API on
//!   wasmtime 48) when its shape allows, else the component API.
//! - [`Native`]: the reference implementation, compiled from the same guest
//!   source; implements the same [`Checker`] trait.
//! - `vectors` (feature `vectors`): the cross-runtime conformance runner
//!   (docs/design.md); not part of the embedding API.
//! - [`Runtime::component_version`]: the WIT package version of the loaded
//!   component (`0.1.0`); a component whose version this crate does not
//!   support ([`supported_components`]) is refused at load with
//!   [`Error::UnsupportedComponent`].
//! - Signed tokens (opt-in per scope): [`Instance::check_signed`] with the
//!   [`GrantKey`]s a host trusts for a scope, [`Instance::sign`] for
//!   authorities; [`SignedTokenText`] carries the [`GrantSignature`].
//! - [`TokenText`]: the canonical text form of a token (`EPOCH.COUNTER` or
//!   `AUTHORITY:EPOCH.COUNTER`), shared by the CLI, SQL and HTTP.
//! - Signals: [`record_decision`] counts a fenced write's result as
//!   `fencecheck_decisions_total` (docs/design.md §12) through the `metrics`
//!   facade; [`epoch_label`] and [`Rejection::outcome_label`] are the
//!   table's label values, for hosts with their own registry, and
//!   [`decisions_text`] the text of a host's fixed counter array.
//!
//! Two layers of result: infrastructure failures (a trapped guest, a call too
//! large) are [`Error`]s; the decision itself is an [`Outcome`]: either a
//! [`Decision`] (`applied`, `duplicate`, `stale-fence`, `version-conflict`) or a
//! [`CheckError`] (the request or the stored state is unusable). Both mean
//! "change nothing" unless the decision is `applied`.
//!
//! # Example
//!
//! ```
//! use fencecheck::{Decision, Policy, Request, Runtime, Token};
//!
//! # fn main() -> Result<(), fencecheck::Error> {
//! let runtime = Runtime::new()?;            // once per process
//! let mut guest = runtime.instance()?;      // once per thread
//!
//! // Inside your transaction: read the scope's state, check, then write.
//! let stored: Option<Vec<u8>> = None;
//! let request = Request::new("report/july", Token::new(0, 0, 41), Policy::Strict);
//! match guest.check(stored.as_deref(), &request)? {
//!     Ok(Decision::Applied { state, .. }) => { /* apply mutation, store `state`, commit */ }
//!     Ok(Decision::StaleFence { .. }) => { /* roll back; never retry under this grant */ }
//!     Ok(other) => { /* duplicate or version conflict: roll back */ let _ = other; }
//!     Err(refused) => { /* invalid request or corrupt state: roll back */ let _ = refused; }
//! }
//! # Ok(()) }
//! ```
#![deny(clippy::expect_used, clippy::panic)]

mod abi;
mod checker;
mod core;
mod engine;
mod error;
mod fenced;
mod instance;
mod packed;
mod runtime;
mod shape;
mod signals;
mod text;
#[cfg(feature = "vectors")]
pub mod vectors;
mod version;

#[doc(hidden)]
pub use checker::NativePacked;
pub use checker::{Checker, Native};
pub use error::Error;
pub use fencecheck_guest::{
    Acquire, AcquireRequest, AuthFailure, BatchError, CheckError, Corruption, Decision,
    FORMAT_VERSION, GrantKey, GrantSignature, Holder, InvalidReason, KeyProblem, LeaseError,
    LeaseInfo, LeaseInvalidReason, MAX_KEYS, MAX_LEASE_ID_BYTES, MAX_LOCK_BYTES, MAX_OP_ID_BYTES,
    MAX_SCOPE_BYTES, MAX_SECRET_BYTES, MAX_SIGNED_LEASE_ID_BYTES, MIN_SECRET_BYTES, Policy,
    Release, ReleaseRequest, Renew, RenewRequest, Request, SignError, SignedCheckError, StateInfo,
    TAG_BYTES, Token, WINDOW_CAPACITY, WindowEntry, check_keys, grant_message,
};
pub use fenced::{Accepted, Fenced, Rejection, accept, accept_signed};
pub use instance::Instance;
pub use runtime::{
    Allocation, COMPONENT, FUEL_BOUND_BASE, FUEL_BOUND_PER_BYTE, Limits, Loaded, PRECOMPILED,
    Precompiled, Runtime, Transport,
};
pub use signals::{
    DECISIONS, EPOCH_LABELS, MAX_EPOCH_LABEL, OUTCOME_LABELS, decisions_text, epoch_index,
    epoch_label, record_decision,
};
pub use text::{KeysText, KeysTextError, SignedTokenText, TokenText, TokenTextError};
pub use version::{
    WIT_PACKAGE, WIT_VERSION, rewrite_wit_version, supported as supported_components,
};

/// A decision, or the reason no decision could be made. Either way it is
/// deterministic: the same state and request give the same outcome in every
/// runtime. Only `Ok(Decision::Applied { .. })` permits a change.
pub type Outcome = Result<Decision, CheckError>;

/// The outcome of a check on a scope that requires signed tokens: a
/// [`Decision`], or why none was made ([`SignedCheckError`]: the check's
/// own errors, an unusable key set, or `unauthenticated`).
pub type SignedOutcome = Result<Decision, SignedCheckError>;
