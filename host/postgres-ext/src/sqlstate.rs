//! Every refusal the extension raises, each with its own SQLSTATE, so a
//! client tells a definitive stale result from a transient failure by code,
//! never by parsing a message.
//!
//! Class `5F` ("fence"): class codes beginning with `5` are left to
//! implementations by the SQL standard, and PostgreSQL uses none starting
//! `5F`. PostgreSQL's own errors (serialization failure `40001`, deadlock
//! `40P01`, connection loss `08xxx`) pass through unchanged: those are the
//! transient ones, worth a retry; nothing in class `5F` is.

/// A refusal: the SQLSTATE, and a message that starts with the outcome's
/// name (`stale-fence: token 0.41 is not above the highest accepted 0.42`),
/// worded exactly as the SQLite extension words it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Raise {
    pub(crate) state: SqlState,
    pub(crate) message: String,
    pub(crate) hint: Option<&'static str>,
}

impl Raise {
    pub(crate) fn new(state: SqlState, detail: impl std::fmt::Display) -> Self {
        Raise {
            state,
            message: format!("{}: {detail}", state.name()),
            hint: None,
        }
    }

    pub(crate) fn with_hint(mut self, hint: &'static str) -> Self {
        self.hint = Some(hint);
        self
    }
}

/// The HINTs, each ending in the section of docs/postgres.md that explains
/// what to do (scripts/check-links fails on an anchor the guide lacks).
pub(crate) mod hint {
    /// 5F001: the grant is over.
    pub(crate) const STALE: &str = "a newer owner holds this scope: stop, and do not retry with this token (docs/postgres.md#sqlstates)";
    /// 5F011: a write to a fenced table without its token.
    pub(crate) const FENCE_REQUIRED: &str =
        "every write to a fenced table presents its token (docs/postgres.md#fenced-tables)";
    /// 5F012 from fence_protect or fence_unprotect.
    pub(crate) const PROTECT: &str =
        "one row per scope, written only through this table (docs/postgres.md#fenced-tables)";
    /// 5F016: the table's fencing changed, or would.
    pub(crate) const UNSOUND: &str = "to change how a table is fenced: fence_unprotect, change it, fence_protect (docs/postgres.md#changing-a-fenced-table)";
    /// 5F016: the table was changed behind the guard.
    pub(crate) const REFENCE: &str = "the table's fencing changed behind fence_protect: its owner can fence_protect it again (docs/postgres.md#changing-a-fenced-table)";
    /// 5F016: the library is newer than the extension's SQL objects.
    pub(crate) const UPGRADE: &str = "run ALTER EXTENSION fencecheck UPDATE in every database that has the extension (docs/postgres.md#upgrading)";
}

/// The outcomes with their codes. The table in docs/postgres.md is this list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SqlState {
    /// `5F001` the token is below (or, under `strict`, equal to) the highest
    /// accepted: definitive, never retry with this grant.
    StaleFence,
    /// `5F002` `expected_version` differs from the scope's version.
    VersionConflict,
    /// `5F003` this op-id was already applied under this token.
    Duplicate,
    /// `5F004` the token text is not `EPOCH.COUNTER` / `AUTHORITY:EPOCH.COUNTER`.
    InvalidToken,
    /// `5F005` the component's `invalid-request` (missing token, empty or
    /// over-long scope or op-id, an unguarded equal token).
    InvalidRequest,
    /// `5F006` the stored state bytes are damaged.
    CorruptState,
    /// `5F007` the state was written by a newer format.
    UnsupportedStateVersion,
    /// `5F008` the state belongs to another scope.
    ScopeMismatch,
    /// `5F009` the token comes from another grant authority.
    ForeignAuthority,
    /// `5F010` the scope's version counter would overflow.
    Exhausted,
    /// `5F011` a write to a fenced table that presents no token (or one set
    /// in an earlier transaction), writes the state column, moves a row to
    /// another scope, or truncates.
    FenceRequired,
    /// `5F012` an argument of the wrong shape (NULL where a value is needed,
    /// unknown policy, negative version, bad `fence_protect` target).
    InvalidArgument,
    /// `5F013` an argument too large to copy into the guest at all.
    TooLarge,
    /// `5F014` the scope requires signed tokens and this token is not
    /// proven to come from its authority (unsigned, unknown key, forged,
    /// tampered, replayed): definitive, this token never passes.
    Unauthenticated,
    /// `5F015` the keys configured for the scope are unusable (no key, a
    /// secret outside 16-64 bytes, an id twice): fix the configuration.
    InvalidKeys,
    /// `5F016` a fenced table is not fenced soundly (a trigger, column,
    /// key or inheritance that would open a path around the fence), or DDL
    /// would make it so: writes fail closed until its owner fixes it.
    UnsoundFence,
    /// `42501` PostgreSQL's insufficient_privilege: a role that does not own
    /// a fenced table tried to change how it is fenced.
    InsufficientPrivilege,
    /// `5F900` the component could not decide: it trapped, or the runtime
    /// failed. Nothing changed; not a fencing outcome.
    RuntimeError,
}

impl SqlState {
    /// The five-character SQLSTATE.
    pub(crate) fn code(self) -> &'static str {
        match self {
            SqlState::StaleFence => "5F001",
            SqlState::VersionConflict => "5F002",
            SqlState::Duplicate => "5F003",
            SqlState::InvalidToken => "5F004",
            SqlState::InvalidRequest => "5F005",
            SqlState::CorruptState => "5F006",
            SqlState::UnsupportedStateVersion => "5F007",
            SqlState::ScopeMismatch => "5F008",
            SqlState::ForeignAuthority => "5F009",
            SqlState::Exhausted => "5F010",
            SqlState::FenceRequired => "5F011",
            SqlState::InvalidArgument => "5F012",
            SqlState::TooLarge => "5F013",
            SqlState::Unauthenticated => "5F014",
            SqlState::InvalidKeys => "5F015",
            SqlState::UnsoundFence => "5F016",
            SqlState::InsufficientPrivilege => "42501",
            SqlState::RuntimeError => "5F900",
        }
    }

    /// The name a message starts with: the component's own names, plus the
    /// extension's (`fence-required`, `invalid-argument`, `too-large`,
    /// `runtime-error`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            SqlState::StaleFence => "stale-fence",
            SqlState::VersionConflict => "version-conflict",
            SqlState::Duplicate => "duplicate",
            SqlState::InvalidToken => "invalid-token",
            SqlState::InvalidRequest => "invalid-request",
            SqlState::CorruptState => "corrupt-state",
            SqlState::UnsupportedStateVersion => "unsupported-state-version",
            SqlState::ScopeMismatch => "scope-mismatch",
            SqlState::ForeignAuthority => "foreign-authority",
            SqlState::Exhausted => "exhausted",
            SqlState::FenceRequired => "fence-required",
            SqlState::InvalidArgument => "invalid-argument",
            SqlState::TooLarge => "too-large",
            SqlState::Unauthenticated => "unauthenticated",
            SqlState::InvalidKeys => "invalid-keys",
            SqlState::UnsoundFence => "unsound-fence",
            SqlState::InsufficientPrivilege => "insufficient-privilege",
            SqlState::RuntimeError => "runtime-error",
        }
    }

    /// PostgreSQL's packed form of [`SqlState::code`] (`MAKE_SQLSTATE`).
    pub(crate) fn packed(self) -> i32 {
        self.code().bytes().enumerate().fold(0, |acc, (i, c)| {
            acc | ((i32::from(c.wrapping_sub(b'0')) & 0x3F) << (6 * i))
        })
    }

    /// The state of a five-character SQLSTATE this extension raises, if it
    /// is one.
    pub(crate) fn from_code(code: &str) -> Option<Self> {
        use SqlState as S;
        [
            S::StaleFence,
            S::VersionConflict,
            S::Duplicate,
            S::InvalidToken,
            S::InvalidRequest,
            S::CorruptState,
            S::UnsupportedStateVersion,
            S::ScopeMismatch,
            S::ForeignAuthority,
            S::Exhausted,
            S::FenceRequired,
            S::InvalidArgument,
            S::TooLarge,
            S::Unauthenticated,
            S::InvalidKeys,
            S::UnsoundFence,
            S::InsufficientPrivilege,
            S::RuntimeError,
        ]
        .into_iter()
        .find(|s| s.code() == code)
    }

    /// The state for one of the component's check errors.
    pub(crate) fn of_check_error(e: &fencecheck::CheckError) -> Self {
        use fencecheck::CheckError as E;
        match e {
            E::InvalidRequest(_) => SqlState::InvalidRequest,
            E::CorruptState(_) => SqlState::CorruptState,
            E::UnsupportedStateVersion(_) => SqlState::UnsupportedStateVersion,
            E::ScopeMismatch(_) => SqlState::ScopeMismatch,
            E::ForeignAuthority { .. } => SqlState::ForeignAuthority,
            E::Exhausted => SqlState::Exhausted,
        }
    }
}
