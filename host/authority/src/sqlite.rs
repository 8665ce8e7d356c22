//! The embedded coordinator: lease states in SQLite, one `BEGIN IMMEDIATE`
//! transaction per decision.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencecheck::{Instance, LeaseError, Runtime};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::lineage::{
    Export, Imported, Lineage, LineageStore, MigrationStep, Peek, target_verdict,
};
use crate::rules::{self, Decided, Read};
use crate::{AuthorityError, Clock};

/// The coordinator's layout number, kept under `authority-layout` in
/// `fencecheck_meta` (the table the resource layout, `host/sqlite/schema.sql`,
/// also uses: a coordinator and a resource may share one database file).
/// Bump it, and make old coordinators fail, when these tables change.
///
/// Layout 2 adds `moved_to` (set when a migration seals the store); layout 1
/// is upgraded in place on open, and coordinators from before layout 2
/// refuse a sealed store instead of granting from it.
const LAYOUT: i64 = 2;

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
    authority   INTEGER NOT NULL,  -- u64, stored bit for bit: the lineage
    epoch_floor INTEGER NOT NULL,  -- u64, stored bit for bit
    moved_to    TEXT               -- set by migrate: the store it moved to
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
        let existing = prepare(&tx)?.map(|(lineage, _)| lineage);
        let authority = match existing {
            Some(a) => a,
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
        let floor = live_floor(&tx)?;
        // Read the clock inside the write transaction: decisions are ordered
        // by commit, and so are the times they saw.
        let now = self.clock.now_ms();
        let read = Read {
            state: state.as_deref(),
            floor,
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
        let floor = live_floor(&tx)?;
        let locks = all_locks(&tx)?;
        let new_floor = rules::restored_floor(
            guest,
            floor,
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

/// Create the coordinator's tables if absent (upgrading layout 1 in place)
/// and read its lineage row: `(lineage, moved_to)`, `None` before first use.
fn prepare(tx: &Transaction<'_>) -> Result<Option<(u64, Option<String>)>, AuthorityError> {
    tx.execute_batch(META)?;
    let layout: Option<rusqlite::types::Value> = tx
        .query_row(
            "SELECT value FROM fencecheck_meta WHERE key = 'authority-layout'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    match layout {
        // No number: tables from before it existed (layout 1), or none.
        None | Some(rusqlite::types::Value::Integer(1)) => {
            tx.execute_batch(SCHEMA)?;
            let has_moved_to: bool = tx.query_row(
                "SELECT count(*) > 0 FROM pragma_table_info('fencecheck_authority')
                  WHERE name = 'moved_to'",
                [],
                |r| r.get(0),
            )?;
            if !has_moved_to {
                tx.execute_batch("ALTER TABLE fencecheck_authority ADD COLUMN moved_to TEXT")?;
            }
            tx.execute(
                "INSERT INTO fencecheck_meta (key, value) VALUES ('authority-layout', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [LAYOUT],
            )?;
        }
        Some(rusqlite::types::Value::Integer(LAYOUT)) => {}
        // The caller drops `tx`, which rolls back: nothing is created.
        Some(other) => return Err(AuthorityError::UnsupportedLayout(format!("{other:?}"))),
    }
    Ok(tx
        .query_row(
            "SELECT authority, moved_to FROM fencecheck_authority",
            [],
            |r| Ok((from_sql(r.get(0)?), r.get(1)?)),
        )
        .optional()?)
}

/// The epoch floor, or [`AuthorityError::Moved`] once the store is sealed.
fn live_floor(tx: &Transaction<'_>) -> Result<u64, AuthorityError> {
    let (floor, moved_to): (i64, Option<String>) = tx.query_row(
        "SELECT epoch_floor, moved_to FROM fencecheck_authority",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    match moved_to {
        Some(to) => Err(AuthorityError::Moved { to }),
        None => Ok(from_sql(floor)),
    }
}

fn all_locks(tx: &Transaction<'_>) -> Result<Vec<(String, Vec<u8>)>, AuthorityError> {
    Ok(tx
        .prepare("SELECT lock, state FROM fencecheck_leases ORDER BY lock")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?)
}

fn open_store(path: &Path) -> Result<Connection, AuthorityError> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.busy_timeout(Duration::from_secs(10))?;
    Ok(conn)
}

/// A SQLite coordinator database as a migration reaches it: by path,
/// without a coordinator (and its clock), so a look changes nothing.
pub(crate) struct SqliteStore {
    path: PathBuf,
    runtime: Runtime,
}

impl SqliteStore {
    pub(crate) fn new(path: PathBuf, runtime: Runtime) -> Self {
        Self { path, runtime }
    }
}

impl LineageStore for SqliteStore {
    /// `sqlite:` and the absolute path.
    fn identity(&self) -> Result<String, AuthorityError> {
        Ok(format!("sqlite:{}", absolute(&self.path)?.display()))
    }

    /// A missing file is an empty store.
    fn peek(&self) -> Result<Peek, AuthorityError> {
        peek(&self.path)
    }

    fn seal(&self, target: &str, at_least: u64) -> Result<Export, AuthorityError> {
        seal(&self.path, target, &mut self.runtime.instance()?, at_least)
    }

    /// One transaction; no steps of its own.
    fn import(
        &self,
        export: &Export,
        _step: &mut dyn FnMut(MigrationStep),
    ) -> Result<Imported, AuthorityError> {
        import(&self.path, export)
    }
}

/// `path` made absolute, resolving symbolic links in its directory (the
/// file itself may not exist yet).
fn absolute(path: &Path) -> Result<PathBuf, AuthorityError> {
    let io = |e: std::io::Error| {
        AuthorityError::MigrationRefused(format!("cannot resolve {}: {e}", path.display()))
    };
    let path = std::path::absolute(path).map_err(io)?;
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if dir.exists() => Ok(dir.canonicalize().map_err(io)?.join(name)),
        _ => Ok(path),
    }
}

/// The lineage and whether there is state, changing nothing (a missing
/// file is an empty store).
fn peek(path: &Path) -> Result<Peek, AuthorityError> {
    if !path.exists() {
        return Ok(Peek::default());
    }
    let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let tables: i64 = conn.query_row(
        "SELECT count(*) FROM sqlite_master
          WHERE name IN ('fencecheck_authority', 'fencecheck_leases')",
        [],
        |r| r.get(0),
    )?;
    if tables < 2 {
        return Ok(Peek::default());
    }
    // Layout 1 has no moved_to: read it only where it exists.
    let moved: bool = conn.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info('fencecheck_authority') WHERE name = 'moved_to'",
        [],
        |r| r.get(0),
    )?;
    let sql = if moved {
        "SELECT authority, moved_to FROM fencecheck_authority"
    } else {
        "SELECT authority, NULL FROM fencecheck_authority"
    };
    let held = conn
        .query_row(sql, [], |r| {
            Ok((from_sql(r.get(0)?), r.get::<_, Option<String>>(1)?))
        })
        .optional()?
        .map(|(l, moved_to)| match moved_to {
            Some(to) => Lineage::Moved(l, to),
            None => Lineage::Live(l),
        });
    let has_state: bool =
        conn.query_row("SELECT EXISTS (SELECT 1 FROM fencecheck_leases)", [], |r| {
            r.get(0)
        })?;
    Ok(Peek {
        held,
        has_state,
        legacy: None,
    })
}

/// Seal the store at `path` for `target` and export it (see `migrate`).
fn seal(
    path: &Path,
    target: &str,
    guest: &mut Instance,
    at_least: u64,
) -> Result<Export, AuthorityError> {
    if !path.exists() {
        return Err(AuthorityError::MigrationRefused(format!(
            "the source {} does not exist",
            path.display()
        )));
    }
    let mut conn = open_store(path)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some((lineage, moved_to)) = prepare(&tx)? else {
        return Err(AuthorityError::MigrationRefused(
            "the source has no lineage: no coordinator ever used it".into(),
        ));
    };
    match moved_to.as_deref() {
        Some(to) if to != target => {
            return Err(AuthorityError::MigrationRefused(format!(
                "the source was already moved to {to}"
            )));
        }
        Some(_) => {}
        None => {
            tx.execute("UPDATE fencecheck_authority SET moved_to = ?1", [target])?;
        }
    }
    let floor: i64 = tx.query_row("SELECT epoch_floor FROM fencecheck_authority", [], |r| {
        r.get(0)
    })?;
    // Checked before the seal commits: a damaged state refuses the
    // migration and leaves the source granting.
    let export = Export::checked(guest, lineage, from_sql(floor), at_least, all_locks(&tx)?)?;
    tx.commit()?;
    Ok(export)
}

/// Import `export` into the store at `path` in one transaction.
fn import(path: &Path, export: &Export) -> Result<Imported, AuthorityError> {
    let mut conn = open_store(path)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let held = prepare(&tx)?.map(|(lineage, moved_to)| match moved_to {
        Some(to) => Lineage::Moved(lineage, to),
        None => Lineage::Live(lineage),
    });
    let has_state: bool =
        tx.query_row("SELECT EXISTS (SELECT 1 FROM fencecheck_leases)", [], |r| {
            r.get(0)
        })?;
    if target_verdict(held.as_ref(), has_state, export.lineage)?.is_some() {
        let floor: i64 = tx.query_row("SELECT epoch_floor FROM fencecheck_authority", [], |r| {
            r.get(0)
        })?;
        return Ok(Imported::Already {
            floor: from_sql(floor),
        });
    }
    // A sealed store moved back to: above its own floor as well.
    let own: Option<i64> = tx
        .query_row("SELECT epoch_floor FROM fencecheck_authority", [], |r| {
            r.get(0)
        })
        .optional()?;
    let floor = match own {
        Some(own) => export
            .floor
            .max(from_sql(own).checked_add(1).ok_or(LeaseError::Exhausted)?),
        None => export.floor,
    };
    tx.execute_batch("DELETE FROM fencecheck_leases; DELETE FROM fencecheck_authority;")?;
    tx.execute(
        "INSERT INTO fencecheck_authority (id, authority, epoch_floor, moved_to)
         VALUES (1, ?1, ?2, NULL)",
        [to_sql(export.lineage), to_sql(floor)],
    )?;
    {
        let mut insert =
            tx.prepare("INSERT INTO fencecheck_leases (lock, state) VALUES (?1, ?2)")?;
        for (lock, state) in &export.locks {
            insert.execute(params![lock, state])?;
        }
    }
    tx.commit()?;
    Ok(Imported::Done { floor })
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
