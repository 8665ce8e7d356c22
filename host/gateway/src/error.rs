//! The gateway's infrastructure errors. Domain outcomes (stale, duplicate,
//! conflict) are never errors: they are answers with their own status codes.

/// A failure that left the request undecided; the client gets 503 with
/// `Retry-After`, never 409 (nothing says its token is stale).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The SQLite store (pointers and fence states) failed.
    #[error(transparent)]
    Store(#[from] fencecheck_sqlite::Error),
    /// The PostgreSQL store (`--postgres`) failed.
    #[error(transparent)]
    Postgres(#[from] fencecheck_postgres::Error),
    /// SQLite failed outside the publish protocol (opening, configuring).
    #[error("SQLite failed while {doing}: {source}")]
    Sqlite {
        /// The step that failed.
        doing: &'static str,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The component could not decide (trapped, failed to load…).
    #[error("the fence check could not run: {0}")]
    Check(#[from] fencecheck::Error),
    /// Reading or writing a blob failed.
    #[error("blob I/O failed while {doing}: {source}")]
    Io {
        /// The step that failed.
        doing: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The upstream file server failed or answered unexpectedly.
    #[error("upstream failed while {doing}: {detail}")]
    Upstream {
        /// The step that failed.
        doing: &'static str,
        /// What happened.
        detail: String,
    },
    /// The gateway's configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// A publish committed but its fsync failed: it is visible now, and may
    /// not survive a power loss (answered as an unknown commit).
    #[error("the committed publish could not be synced: {0}")]
    Unsynced(#[source] std::io::Error),
    /// A blocking task died (panicked or was cancelled).
    #[error("a storage task did not finish: {0}")]
    Task(String),
}

impl Error {
    /// Whether the blob store or the database ran out of space (ENOSPC,
    /// EDQUOT, SQLite's "database or disk is full", an upstream 507): the
    /// client gets 507, not 503.
    pub fn is_full(&self) -> bool {
        if let Error::Upstream { detail, .. } = self {
            return detail == "status 507";
        }
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<std::io::Error>()
                && matches!(io.raw_os_error(), Some(28 | 122))
            {
                return true;
            }
            if let Some(rusqlite::Error::SqliteFailure(f, _)) = e.downcast_ref::<rusqlite::Error>()
                && f.code == rusqlite::ErrorCode::DiskFull
            {
                return true;
            }
            cause = e.source();
        }
        false
    }

    /// Whether a PostgreSQL commit was in flight when the connection failed:
    /// the publish may or may not have committed.
    pub fn is_commit_unknown(&self) -> bool {
        matches!(
            self,
            Error::Postgres(fencecheck_postgres::Error::CommitUnknown(_)) | Error::Unsynced(_)
        )
    }
}

/// `map_err` helper for I/O steps.
pub(crate) fn io(doing: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |source| Error::Io { doing, source }
}
