use crate::{LAYOUT_VERSION, ObjectId};

/// An infrastructure failure: the write could not be decided, or not stored.
///
/// None of these is a domain outcome: a stale token is
/// `Ok(Fenced::Rejected(Rejection::StaleFence { .. }))`, definitive. Use
/// [`Error::is_retryable`] to tell a failure worth retrying (serialization
/// failure, deadlock: rolled back for certain) from one that is not, and
/// [`Error::CommitUnknown`] for the one case where the write may have
/// committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PostgreSQL refused or failed before the commit was sent: the
    /// transaction rolled back and nothing changed.
    #[error("PostgreSQL failed while {doing}: {source}")]
    Postgres {
        /// The step that failed.
        doing: &'static str,
        /// The driver's error (its SQLSTATE, if the server sent one).
        #[source]
        source: postgres::Error,
    },
    /// The connection failed while the commit was in flight: the write may
    /// or may not have committed. Read the scope (its version) before
    /// deciding anything; never assume either way.
    #[error("the commit's outcome is unknown: {0}")]
    CommitUnknown(#[source] postgres::Error),
    /// The fence check itself could not run (guest trapped, call too large…).
    #[error("the fence check could not run: {0}")]
    Check(#[from] fencecheck::Error),
    /// The caller's mutation failed; its changes were rolled back with the rest.
    #[error("the fenced mutation failed, nothing was stored: {0}")]
    Mutation(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// [`publish`](crate::publish) named an object that is not staged under
    /// the request's scope: never staged, already collected (or discarded),
    /// or staged for another scope. The transaction rolled back: the fence
    /// state and the catalog pointer are unchanged, the token not used up.
    #[error("object {object} is not staged under scope {scope:?}")]
    UnknownObject {
        /// The object asked for.
        object: ObjectId,
        /// The request's scope.
        scope: String,
    },
    /// An argument or stored value is unusable (e.g. a version beyond
    /// PostgreSQL's bigint).
    #[error("invalid {what}: {why}")]
    Invalid {
        /// Which value.
        what: &'static str,
        /// Why it was refused.
        why: String,
    },
    /// [`install`](crate::install) found another layout number in
    /// `fencecheck_meta` (`found`), so it created and changed nothing. Not
    /// retryable: use a fencecheck version that supports that layout.
    #[error(
        "unsupported fencecheck layout: the database has layout {found}, this version supports only layout {LAYOUT_VERSION}; nothing was installed"
    )]
    UnsupportedLayout {
        /// The database's layout number.
        found: i64,
    },
}

impl Error {
    /// Whether running the same request again may succeed: a serialization
    /// failure (`40001`) or deadlock (`40P01`) rolled the transaction back
    /// and says nothing about the fence. Never true for a fencing outcome
    /// (those are not errors) nor for [`Error::CommitUnknown`].
    ///
    /// Also true when such a failure surfaced inside the caller's mutation
    /// (as a `postgres::Error` it returned): the whole transaction rolled
    /// back just the same.
    pub fn is_retryable(&self) -> bool {
        let transient = |e: &postgres::Error| {
            e.code().is_some_and(|c| {
                *c == postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == postgres::error::SqlState::T_R_DEADLOCK_DETECTED
            })
        };
        match self {
            Error::Postgres { source, .. } => transient(source),
            Error::Mutation(e) => e.downcast_ref::<postgres::Error>().is_some_and(transient),
            _ => false,
        }
    }
}

pub(crate) fn pg(doing: &'static str) -> impl FnOnce(postgres::Error) -> Error {
    move |source| Error::Postgres { doing, source }
}

/// Whether a failure of a statement that commits (COMMIT, or an autocommit
/// statement) says for certain that it rolled back: an ERROR the server
/// sent. A FATAL or PANIC may come after the commit (the session ended
/// between the commit and the answer), and no answer at all says nothing.
pub(crate) fn rolled_back(e: &postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| !matches!(db.severity(), "FATAL" | "PANIC"))
}
