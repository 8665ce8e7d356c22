use crate::{LAYOUT_VERSION, ObjectId};

/// An infrastructure failure: the write could not be decided, or not stored.
///
/// None of these is a domain outcome. A stale token is never an `Error`: it is
/// `Ok(Fenced::Rejected(Rejection::StaleFence { .. }))`, definitive and not
/// retryable. Whenever an `Error` is returned, the transaction was rolled back
/// and nothing changed, except after [`Error::TransactionEnded`]: the
/// caller's mutation ended the transaction itself, so what it wrote before
/// that stands if it committed (with the new fence state, which
/// [`fenced_write`](crate::fenced_write) stores before the mutation runs).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// SQLite refused or failed (busy, locked, I/O, constraint…).
    #[error("SQLite failed while {doing}: {source}")]
    Sqlite {
        /// The step that failed.
        doing: &'static str,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The fence check itself could not run (guest trapped, call too large…).
    #[error("the fence check could not run: {0}")]
    Check(#[from] fencecheck::Error),
    /// The caller's mutation failed; its changes were rolled back with the rest.
    #[error("the fenced mutation failed, nothing was stored: {0}")]
    Mutation(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
    /// The caller's mutation ended the transaction itself (e.g. ran `COMMIT`
    /// or `ROLLBACK`): `fenced_write` stored the new fence state before the
    /// mutation ran, so a `COMMIT` committed it with what the mutation wrote
    /// before, and a `ROLLBACK` undid both.
    #[error(
        "the fenced mutation ended the transaction itself (a COMMIT in it committed the fence state with its writes; a ROLLBACK undid both)"
    )]
    TransactionEnded,
    /// `publish` named an object that is not staged under the request's scope:
    /// never staged, already collected, or staged for another scope.
    #[error("object {object} is not staged under scope {scope:?}")]
    UnknownObject {
        /// The object asked for.
        object: ObjectId,
        /// The request's scope.
        scope: String,
    },
    /// An argument is unusable (e.g. a time before 1970, an empty scope).
    #[error("invalid {what}: {why}")]
    Invalid {
        /// Which argument.
        what: &'static str,
        /// Why it was refused.
        why: String,
    },
    /// [`install`](crate::install) found a database laid out for another
    /// version: `fencecheck_meta`'s `layout` row is not
    /// [`LAYOUT_VERSION`] (`found`: the stored value as SQL text, e.g. `2` or
    /// `'1'`) or is missing (`None`). Nothing was created or changed. Not
    /// retryable: use a fencecheck version that supports that layout.
    #[error(
        "unsupported fencecheck layout: the database has {}, this version supports only layout {}; nothing was installed",
        found_layout(.found),
        LAYOUT_VERSION
    )]
    UnsupportedLayout {
        /// The `layout` value found, as SQL text; `None`: no `layout` row.
        found: Option<String>,
    },
    /// A stored column holds a value this crate never writes.
    #[error("stored {what} is out of range: {value}")]
    OutOfRange {
        /// Which column.
        what: &'static str,
        /// The value found.
        value: i64,
    },
}

impl Error {
    /// `SQLITE_BUSY` or `SQLITE_LOCKED`: another connection held the lock past
    /// the busy timeout. Nothing changed; the whole write may be retried (the
    /// fence check runs again, so a retry can still come back stale).
    pub fn is_busy(&self) -> bool {
        matches!(
            self,
            Error::Sqlite {
                source: rusqlite::Error::SqliteFailure(e, _),
                ..
            } if matches!(
                e.code,
                rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
            )
        )
    }
}

/// `map_err` helper: label a SQLite failure with the step it happened in.
pub(crate) fn sql(doing: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
    move |source| Error::Sqlite { doing, source }
}

fn found_layout(found: &Option<String>) -> String {
    match found {
        Some(value) => format!("layout {value}"),
        None => "no layout row in fencecheck_meta".into(),
    }
}
