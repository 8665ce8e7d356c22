//! What a fenced write did, the same in every adapter (SQLite, PostgreSQL…):
//! applied, or a definitive [`Rejection`]. Infrastructure failures are each
//! adapter's own error type, never one of these.

use crate::{
    AuthFailure, CheckError, Decision, KeyProblem, Outcome, SignedCheckError, SignedOutcome, Token,
};

/// What the fence accepted; handed to the mutation before it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Accepted {
    /// The scope's version once this write commits (count of applied writes).
    pub version: u64,
    /// The highest accepted token once this write commits.
    pub highest: Token,
}

/// What a fenced write did.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use = "a rejected write changed nothing; the caller must look"]
pub enum Fenced<T> {
    /// The fence accepted the token; the mutation ran and the new state was
    /// stored, committed together.
    Applied {
        /// The scope's version after this write.
        version: u64,
        /// The highest accepted token after this write.
        highest: Token,
        /// What the mutation returned.
        value: T,
    },
    /// The fence refused; the mutation did not run and nothing changed.
    Rejected(Rejection),
}

/// Why the fence refused a write. Every case is definitive for this request:
/// retrying the same request gives the same answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The op-id was already applied under the highest token; carries the
    /// version that original write produced.
    Duplicate {
        /// The version the original write produced.
        version: u64,
    },
    /// A newer grant has written (or, under strict, this grant already did).
    /// Stop; never retry under this grant.
    StaleFence {
        /// The token the request carried.
        presented: Token,
        /// The highest token the scope has accepted.
        highest: Token,
    },
    /// The request's expected version is not the scope's.
    VersionConflict {
        /// The version the request expected.
        expected: u64,
        /// The scope's version.
        actual: u64,
    },
    /// The request or the stored state is unusable (invalid request, corrupt
    /// state, scope mismatch, foreign authority…).
    Refused(CheckError),
    /// The scope requires signed tokens and this token is not proven to
    /// come from its authority: unsigned, an unknown key, or a forged,
    /// tampered or replayed signature. Stop: the same token never passes.
    Unauthenticated(AuthFailure),
    /// The scope requires signed tokens but the keys configured for it are
    /// unusable (no key, a short secret…): the resource's configuration is
    /// at fault, not the caller; nothing is accepted until it is fixed.
    InvalidKeys(KeyProblem),
}

impl Rejection {
    /// The kebab-case name used across fencecheck (`stale-fence`,
    /// `corrupt-state`…).
    pub fn name(&self) -> &'static str {
        match self {
            Rejection::Duplicate { .. } => "duplicate",
            Rejection::StaleFence { .. } => "stale-fence",
            Rejection::VersionConflict { .. } => "version-conflict",
            Rejection::Refused(e) => e.name(),
            Rejection::Unauthenticated(_) => "unauthenticated",
            Rejection::InvalidKeys(_) => "invalid-keys",
        }
    }
}

impl<T> Fenced<T> {
    /// `applied`, or the rejection's name.
    pub fn name(&self) -> &'static str {
        match self {
            Fenced::Applied { .. } => "applied",
            Fenced::Rejected(r) => r.name(),
        }
    }

    /// Whether the write was applied.
    pub fn is_applied(&self) -> bool {
        matches!(self, Fenced::Applied { .. })
    }
}

/// The parts of an `applied` outcome (what was accepted, and the new state
/// to store); any other outcome as the [`Rejection`] it is.
pub fn accept(outcome: Outcome) -> Result<(Accepted, Vec<u8>), Rejection> {
    accept_signed(outcome.map_err(SignedCheckError::Check))
}

/// [`accept`] for the outcome of [`crate::Checker::decide`] or
/// [`crate::Checker::check_signed`].
pub fn accept_signed(outcome: SignedOutcome) -> Result<(Accepted, Vec<u8>), Rejection> {
    match outcome {
        Ok(Decision::Applied {
            version,
            highest,
            state,
        }) => Ok((Accepted { version, highest }, state)),
        Ok(Decision::Duplicate { version }) => Err(Rejection::Duplicate { version }),
        Ok(Decision::StaleFence { presented, highest }) => {
            Err(Rejection::StaleFence { presented, highest })
        }
        Ok(Decision::VersionConflict { expected, actual }) => {
            Err(Rejection::VersionConflict { expected, actual })
        }
        Err(SignedCheckError::Check(e)) => Err(Rejection::Refused(e)),
        Err(SignedCheckError::Unauthenticated(a)) => Err(Rejection::Unauthenticated(a)),
        Err(SignedCheckError::InvalidKeys(p)) => Err(Rejection::InvalidKeys(p)),
    }
}
