//! The embedded coordinator: lease states in SQLite, one `BEGIN IMMEDIATE`
//! transaction per decision.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencecheck::{Instance, Runtime};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::rules::{self, Decided, Read};
use crate::{AuthorityError, Clock};

/// The coordinator's layout number, kept under `authority-layout` in
/// `fencecheck_meta` (the table the resource layout, `host/sqlite/schema.sql`,
/// also uses: a coordinator and a resource may share one database file).
/// Bump it, and make old coordinators fail, when these tables change.
const LAYOUT: i64 = 1;

// Identical to the definition in host/sqlite/schema.sql, so whichever is
// created first serves both.
const META: &str = "
CREATE TABLE IF NOT EXISTS fencecheck_meta (
    key   TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fencecheck_authority (
    id          INTEGER PRIMARY KEY CHECK (id = 1),
    authority   INTEGER NOT NULL,  -- u64, stored bit for bit
    epoch_floor INTEGER NOT NULL   -- u64, stored bit for bit
);
CREATE TABLE IF NOT EXISTS fencecheck_leases (
    lock  TEXT PRIMARY KEY,
    state BLOB NOT NULL            -- the component's canonical lease state
);";

// SQLite integers are i64; u64 values are stored as their two's-complement
// bit pattern, so the whole u64 range round-trips.
fn to_sql(v: u64) -> i64 {
    v as i64
}

fn from_sql(v: i64) -> u64 {
    v as u64
}

struct Inner {
    conn: Connection,
    guest: Instance,
}

/// Lease coordinator on a SQLite database (the embedded default).
///
/// The decision, the clock reading and the state write happen inside one
/// `BEGIN IMMEDIATE` transaction, so concurrent coordinators on the same file
/// (threads or processes) are serialised by SQLite and can never issue the
/// same token twice.
pub struct SqliteCoordinator {
    inner: Mutex<Inner>,
    authority: u64,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for SqliteCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteCoordinator")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl SqliteCoordinator {
    /// Open (or create) the coordinator's tables in the database at `path`.
    /// A new database gets a fresh random authority id, kept forever after
    /// (also across backup and restore).
    pub fn open(
        path: &Path,
        runtime: Runtime,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthorityError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        Self::with_connection(conn, runtime, clock)
    }

    /// A coordinator on a private in-memory database (tests, examples).
    pub fn open_in_memory(runtime: Runtime, clock: Arc<dyn Clock>) -> Result<Self, AuthorityError> {
        Self::with_connection(Connection::open_in_memory()?, runtime, clock)
    }

    fn with_connection(
        mut conn: Connection,
        runtime: Runtime,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthorityError> {
        conn.busy_timeout(Duration::from_secs(10))?;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        tx.execute_batch(META)?;
        let layout: Option<rusqlite::types::Value> = tx
            .query_row(
                "SELECT value FROM fencecheck_meta WHERE key = 'authority-layout'",
                [],
                |r| r.get(0),
            )
            .optional()?;
        match layout {
            // Tables from before the number existed have this layout: adopt them.
            None => {
                tx.execute(
                    "INSERT INTO fencecheck_meta (key, value) VALUES ('authority-layout', ?1)",
                    [LAYOUT],
                )?;
            }
            Some(rusqlite::types::Value::Integer(LAYOUT)) => {}
            // Dropping `tx` rolls back: nothing is created.
            Some(other) => return Err(AuthorityError::UnsupportedLayout(format!("{other:?}"))),
        }
        tx.execute_batch(SCHEMA)?;
        let existing: Option<i64> = tx
            .query_row("SELECT authority FROM fencecheck_authority", [], |r| {
                r.get(0)
            })
            .optional()?;
        let authority = match existing {
            Some(a) => from_sql(a),
            None => {
                let a = fresh_authority();
                tx.execute(
                    "INSERT INTO fencecheck_authority (id, authority, epoch_floor) VALUES (1, ?1, 0)",
                    [to_sql(a)],
                )?;
                a
            }
        };
        tx.commit()?;
        Ok(Self {
            inner: Mutex::new(Inner {
                conn,
                guest: runtime.instance()?,
            }),
            authority,
            clock,
        })
    }

    /// One decision: read the lock's state and the epoch floor, let `decide`
    /// consult the component, store the state it returns, commit. If `decide`
    /// fails or returns no state, the transaction rolls back untouched.
    fn decide<T>(
        &self,
        lock: &str,
        decide: impl FnOnce(&mut Instance, Read<'_>) -> Decided<T>,
    ) -> Result<T, AuthorityError> {
        // A panic elsewhere cannot leave a half-done decision behind: the
        // transaction is rolled back when dropped, so a poisoned lock is safe
        // to reuse.
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Inner { conn, guest } = &mut *inner;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let state: Option<Vec<u8>> = tx
            .query_row(
                "SELECT state FROM fencecheck_leases WHERE lock = ?1",
                [lock],
                |r| r.get(0),
            )
            .optional()?;
        let floor: i64 = tx.query_row("SELECT epoch_floor FROM fencecheck_authority", [], |r| {
            r.get(0)
        })?;
        // Read the clock inside the write transaction: decisions are ordered
        // by commit, and so are the times they saw.
        let now = self.clock.now_ms();
        let read = Read {
            state: state.as_deref(),
            floor: from_sql(floor),
            now,
        };
        let (outcome, next) = decide(guest, read)?;
        if let Some(next) = next {
            tx.execute(
                "INSERT INTO fencecheck_leases (lock, state) VALUES (?1, ?2)
                 ON CONFLICT (lock) DO UPDATE SET state = excluded.state",
                params![lock, next],
            )?;
            tx.commit()?;
        }
        Ok(outcome)
    }
}

rules::transactional_coordinator!(SqliteCoordinator);

impl SqliteCoordinator {
    /// Raise the epoch floor (see [`crate::Coordinator::restore`]).
    fn restore_floor(&self, at_least: u64) -> Result<u64, AuthorityError> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Inner { conn, guest } = &mut *inner;
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let floor: i64 = tx.query_row("SELECT epoch_floor FROM fencecheck_authority", [], |r| {
            r.get(0)
        })?;
        let locks: Vec<(String, Vec<u8>)> = tx
            .prepare("SELECT lock, state FROM fencecheck_leases ORDER BY lock")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        let new_floor = rules::restored_floor(
            guest,
            from_sql(floor),
            at_least,
            locks.iter().map(|(l, s)| (l.as_bytes(), s.as_slice())),
        )?;
        tx.execute(
            "UPDATE fencecheck_authority SET epoch_floor = ?1",
            [to_sql(new_floor)],
        )?;
        tx.commit()?;
        Ok(new_floor)
    }
}

/// A random, non-zero authority id from the standard library's per-process
/// random hasher keys (no extra dependency; uniqueness, not secrecy, matters).
pub(crate) fn fresh_authority() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish().max(1)
}
