//! The WIT contract's types, as plain Rust.

use core::cmp::Ordering;
use core::fmt;

/// Longest scope accepted, in bytes of UTF-8.
pub const MAX_SCOPE_BYTES: usize = 1024;
/// Longest op-id accepted, in bytes of UTF-8.
pub const MAX_OP_ID_BYTES: usize = 256;

/// A fencing token: one grant of one lock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Token {
    /// The grant authority that issued it; tokens of different authorities are
    /// never compared.
    pub authority: u64,
    /// Raised on coordinator restore; compared before `counter`.
    pub epoch: u64,
    /// Per-lock grant counter within an epoch.
    pub counter: u64,
}

impl Token {
    /// A token from its three parts.
    pub const fn new(authority: u64, epoch: u64, counter: u64) -> Self {
        Self {
            authority,
            epoch,
            counter,
        }
    }

    /// `epoch = counter = 0` means no token was presented.
    pub const fn is_missing(&self) -> bool {
        self.epoch == 0 && self.counter == 0
    }

    /// Grant order: `(epoch, counter)` lexicographically. The authority is not
    /// part of the order; callers must check it matches first.
    pub fn grant_order(&self, other: &Token) -> Ordering {
        (self.epoch, self.counter).cmp(&(other.epoch, other.counter))
    }
}

/// How a token equal to the highest accepted one is treated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "kebab-case"))]
pub enum Policy {
    /// One mutation per grant.
    #[default]
    Strict,
    /// Several mutations per grant, each guarded by an op-id or expected version.
    AllowEqual,
}

/// One protected mutation, as presented to the resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Fencing domain: non-empty UTF-8, at most [`MAX_SCOPE_BYTES`].
    pub scope: String,
    /// The grant the caller holds.
    pub token: Token,
    /// How an equal token is treated.
    pub policy: Policy,
    /// Idempotency key, 1 to [`MAX_OP_ID_BYTES`] bytes.
    pub op_id: Option<String>,
    /// The scope version the caller saw.
    pub expected_version: Option<u64>,
    /// The grant's signature, when the token came signed by its authority.
    /// Only [`crate::check_signed`] (a scope that requires signed tokens)
    /// reads it; [`crate::check`] ignores it, so a client may always send
    /// its signed token and resources opt scopes in one by one. In WIT it is
    /// `check-signed`'s own argument, not a field of `request`.
    pub signature: Option<crate::GrantSignature>,
}

impl Request {
    /// A request with no op-id and no expected version.
    pub fn new(scope: impl Into<String>, token: Token, policy: Policy) -> Self {
        Self {
            scope: scope.into(),
            token,
            policy,
            op_id: None,
            expected_version: None,
            signature: None,
        }
    }

    /// The same request carrying an idempotency key.
    pub fn with_op_id(mut self, op_id: impl Into<String>) -> Self {
        self.op_id = Some(op_id.into());
        self
    }

    /// The same request guarded by an expected scope version.
    pub fn with_expected_version(mut self, version: u64) -> Self {
        self.expected_version = Some(version);
        self
    }

    /// The same request carrying its grant's signature.
    pub fn with_signature(mut self, signature: crate::GrantSignature) -> Self {
        self.signature = Some(signature);
        self
    }
}

/// What the resource must do. Only [`Decision::Applied`] changes anything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Apply the mutation and store `state` in the same transaction.
    Applied {
        /// Scope version after this mutation.
        version: u64,
        /// Highest accepted token after this mutation.
        highest: Token,
        /// The new encoded state.
        state: Vec<u8>,
    },
    /// The op-id was already applied under the highest token, producing `version`.
    Duplicate {
        /// The version the original attempt produced.
        version: u64,
    },
    /// A newer grant has written (or, under strict, this grant already did).
    /// Definitive: never retry under the same grant.
    StaleFence {
        /// The token presented.
        presented: Token,
        /// The highest token the scope has accepted.
        highest: Token,
    },
    /// The expected version does not match.
    VersionConflict {
        /// The version the request expected.
        expected: u64,
        /// The scope's current version.
        actual: u64,
    },
}

/// Why a request is malformed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// `epoch = counter = 0`.
    MissingToken,
    /// Empty scope.
    EmptyScope,
    /// Scope longer than [`MAX_SCOPE_BYTES`].
    ScopeTooLong,
    /// Empty op-id.
    EmptyOpId,
    /// Op-id longer than [`MAX_OP_ID_BYTES`].
    OpIdTooLong,
    /// Equal token under allow-equal with neither op-id nor expected version.
    EqualTokenUnguarded,
}

/// How a stored state failed to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Corruption {
    /// Shorter than the fixed frame (this includes an empty state).
    Truncated,
    /// The length field disagrees with the byte count.
    LengthMismatch,
    /// The checksum does not match.
    ChecksumMismatch,
    /// Checksum matches, but a field is invalid or non-canonical.
    Malformed,
}

/// Why the check could not decide. Nothing may change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckError {
    /// The request is malformed.
    InvalidRequest(InvalidReason),
    /// The stored state is damaged.
    CorruptState(Corruption),
    /// The state was written by a newer format version.
    UnsupportedStateVersion(u8),
    /// The state belongs to another scope (carried here).
    ScopeMismatch(String),
    /// The token's authority is not the scope's.
    ForeignAuthority {
        /// The scope's authority.
        stored: u64,
        /// The token's authority.
        presented: u64,
    },
    /// The scope's version counter would overflow.
    Exhausted,
}

/// One op-id applied under the highest token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WindowEntry {
    /// The op-id.
    pub op_id: String,
    /// The version its application produced.
    pub version: u64,
}

/// A decoded state.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StateInfo {
    /// Encoding format version.
    pub format_version: u8,
    /// The scope.
    pub scope: String,
    /// The authority the scope is pinned to.
    pub authority: u64,
    /// Highest accepted token.
    pub highest: Token,
    /// Count of applied mutations.
    pub version: u64,
    /// Op-ids applied under `highest`, oldest first.
    pub window: Vec<WindowEntry>,
}

impl InvalidReason {
    /// The reason's kebab-case name, as in WIT (`missing-token`…).
    pub const fn name(self) -> &'static str {
        match self {
            InvalidReason::MissingToken => "missing-token",
            InvalidReason::EmptyScope => "empty-scope",
            InvalidReason::ScopeTooLong => "scope-too-long",
            InvalidReason::EmptyOpId => "empty-op-id",
            InvalidReason::OpIdTooLong => "op-id-too-long",
            InvalidReason::EqualTokenUnguarded => "equal-token-unguarded",
        }
    }
}

impl Corruption {
    /// The case's kebab-case name, as in WIT (`checksum-mismatch`…).
    pub const fn name(self) -> &'static str {
        match self {
            Corruption::Truncated => "truncated",
            Corruption::LengthMismatch => "length-mismatch",
            Corruption::ChecksumMismatch => "checksum-mismatch",
            Corruption::Malformed => "malformed",
        }
    }
}

impl CheckError {
    /// The error's kebab-case name, as in WIT and in conformance vectors.
    /// Stable: hosts and clients match on it.
    pub fn name(&self) -> &'static str {
        match self {
            CheckError::InvalidRequest(_) => "invalid-request",
            CheckError::CorruptState(_) => "corrupt-state",
            CheckError::UnsupportedStateVersion(_) => "unsupported-state-version",
            CheckError::ScopeMismatch(_) => "scope-mismatch",
            CheckError::ForeignAuthority { .. } => "foreign-authority",
            CheckError::Exhausted => "exhausted",
        }
    }

    /// The kebab-case sub-case of `invalid-request` and `corrupt-state`
    /// (`missing-token`, `checksum-mismatch`…); `None` for the other errors.
    pub fn reason(&self) -> Option<&'static str> {
        match self {
            CheckError::InvalidRequest(r) => Some(r.name()),
            CheckError::CorruptState(c) => Some(c.name()),
            _ => None,
        }
    }
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `name: detail`, e.g. `corrupt-state: checksum-mismatch` or
/// `scope-mismatch: the state belongs to scope "report/june"`. The name is
/// stable; the detail is for people.
impl fmt::Display for CheckError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.name())?;
        match self {
            CheckError::InvalidRequest(r) => f.write_str(r.name()),
            CheckError::CorruptState(c) => f.write_str(c.name()),
            CheckError::UnsupportedStateVersion(v) => write!(
                f,
                "the state has format version {v}, newer than this component reads"
            ),
            CheckError::ScopeMismatch(s) => write!(f, "the state belongs to scope {s:?}"),
            CheckError::ForeignAuthority { stored, presented } => write!(
                f,
                "the scope is pinned to authority {stored}, the token is from {presented}"
            ),
            CheckError::Exhausted => f.write_str("the scope's version counter would overflow"),
        }
    }
}

impl std::error::Error for CheckError {}

impl Decision {
    /// The outcome's kebab-case name, as in WIT and in conformance vectors.
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Applied { .. } => "applied",
            Decision::Duplicate { .. } => "duplicate",
            Decision::StaleFence { .. } => "stale-fence",
            Decision::VersionConflict { .. } => "version-conflict",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{LeaseError, LeaseInvalidReason};

    /// Every error prints as `name: detail`, its name is the WIT case, and
    /// the sub-case of invalid-request / corrupt-state is the detail itself.
    #[test]
    fn errors_name_themselves() {
        let checks = [
            (
                CheckError::InvalidRequest(InvalidReason::EqualTokenUnguarded),
                "invalid-request: equal-token-unguarded",
            ),
            (
                CheckError::CorruptState(Corruption::LengthMismatch),
                "corrupt-state: length-mismatch",
            ),
            (
                CheckError::UnsupportedStateVersion(2),
                "unsupported-state-version: the state has format version 2, newer than this component reads",
            ),
            (
                CheckError::ScopeMismatch("a".into()),
                "scope-mismatch: the state belongs to scope \"a\"",
            ),
            (
                CheckError::ForeignAuthority {
                    stored: 1,
                    presented: 2,
                },
                "foreign-authority: the scope is pinned to authority 1, the token is from 2",
            ),
            (
                CheckError::Exhausted,
                "exhausted: the scope's version counter would overflow",
            ),
        ];
        for (e, text) in checks {
            assert_eq!(e.to_string(), text);
            assert!(text.starts_with(e.name()));
        }
        assert_eq!(
            CheckError::CorruptState(Corruption::Truncated).reason(),
            Some("truncated")
        );
        assert_eq!(CheckError::Exhausted.reason(), None);
        let lease = LeaseError::InvalidRequest(LeaseInvalidReason::ZeroTtl);
        assert_eq!(lease.to_string(), "invalid-request: zero-ttl");
        assert_eq!(lease.reason(), Some("zero-ttl"));
        assert_eq!(
            LeaseError::LockMismatch("b".into()).to_string(),
            "lock-mismatch: the state belongs to lock \"b\""
        );
    }
}
