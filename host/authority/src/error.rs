use fencecheck::LeaseError;

/// Why a coordinator could not decide. Nothing has changed.
///
/// None of these is `busy`, `lost` or `not-owner`: those are outcomes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthorityError {
    /// The SQLite store failed (locked past the busy timeout, I/O, …).
    #[error("lease store (SQLite): {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The PostgreSQL store failed (connection, serialization failure, …).
    #[error("lease store (PostgreSQL): {0}")]
    Postgres(#[from] postgres::Error),
    /// The etcd store failed or could not be reached.
    #[error("lease store (etcd): {0}")]
    Etcd(String),
    /// The Redis or Valkey store failed, could not be reached, or answered
    /// something the module never answers.
    #[error("lease store (Redis): {0}")]
    Redis(String),
    /// TLS to etcd failed before any request was executed: a certificate or
    /// key file that cannot be used, a member certificate not signed by the
    /// CA given or not naming the endpoint's host, or a member refusing the
    /// client certificate (none given, or one from another CA). Definitive:
    /// fix the certificates; retrying changes nothing.
    #[error("etcd TLS: {0}")]
    Tls(String),
    /// etcd did not let the coordinator in as its user: a wrong user name or
    /// password, a cluster with authentication enabled but no credentials
    /// given, or credentials given to a cluster without authentication
    /// (refused rather than ignored). Nothing was executed.
    #[error("etcd authentication failed: {0}")]
    AuthenticationFailed(String),
    /// etcd refused a request because the user's roles do not cover the
    /// coordinator's keys. etcd checks a transaction's permissions before
    /// applying any of it, so nothing changed. Grant the user's role
    /// read-write on the whole prefix.
    #[error(
        "etcd permission denied: user {user:?} may not {operation} keys under {prefix:?}; \
         grant its role readwrite on that prefix (nothing was changed)"
    )]
    PermissionDenied {
        /// The etcd user (empty if none was given).
        user: String,
        /// What was refused: `read` or `write` (a write transaction also
        /// reads what it compares).
        operation: &'static str,
        /// The coordinator's key prefix.
        prefix: String,
    },
    /// A [`crate::SigningCoordinator`] cannot sign: its key or component is
    /// unusable (refused at construction), or, after a grant was made, the
    /// component refused to sign it (retry the acquire with the same lease
    /// id: it returns that grant).
    #[error("signing grants: {why}")]
    Signing {
        /// What is wrong (never the key's secret).
        why: String,
    },
    /// The component could not run (trapped, refused to load).
    #[error("fencecheck component: {0}")]
    Guest(#[from] fencecheck::Error),
    /// The component refused the request or the stored state (invalid input,
    /// corrupt or foreign state, exhausted counter). Deterministic: retrying
    /// the same request gives the same answer.
    #[error("lease refused: {error}")]
    Refused {
        /// The component's error.
        error: LeaseError,
    },
    /// The database's coordinator tables are of a layout this version does
    /// not know (`authority-layout` in `fencecheck_meta`; carries what was
    /// found). Nothing was created or changed: upgrade this coordinator.
    #[error(
        "the coordinator's store layout is {0}; this version supports 1 (upgraded in place) and 2"
    )]
    UnsupportedLayout(String),
    /// `fencecheck authority migrate` moved this store's lineage to another
    /// store: this one grants, renews and releases nothing any more, so two
    /// coordinators never issue tokens for one lineage. Definitive here:
    /// point the coordinator at the store named.
    #[error("this lease store was moved to {to}: use that store")]
    Moved {
        /// The store it was moved to (as `migrate` named it).
        to: String,
    },
    /// A migration into this store has not finished: it grants nothing
    /// until `fencecheck authority migrate` is re-run to completion.
    #[error("a migration into this lease store has not finished: re-run the migration")]
    MigrationIncomplete,
    /// `migrate` refused to run (the target holds another lineage or live
    /// state, the source was moved elsewhere, …). Nothing changed.
    #[error("migration refused: {0}")]
    MigrationRefused(String),
    /// Compare-and-swap lost to concurrent coordinators too many times in a row.
    #[error("gave up after {attempts} conflicting concurrent updates of lock {lock:?}")]
    Contention {
        /// The lock.
        lock: String,
        /// How many times the compare-and-swap failed.
        attempts: u32,
    },
}

impl From<LeaseError> for AuthorityError {
    fn from(error: LeaseError) -> Self {
        AuthorityError::Refused { error }
    }
}

impl AuthorityError {
    /// The metric table's `kind` (docs/design.md §12) of a coordinator call
    /// that got no answer: `quorum-lost`, `unreachable`, `timeout` or
    /// `other`; `None` for an answer (a refusal, contention, a moved store),
    /// which is not a coordinator error.
    pub fn signal_kind(&self) -> Option<&'static str> {
        crate::signals::kind(self)
    }
}
