//! A lease coordinator on PostgreSQL: lease states in a table, one
//! transaction per decision, for teams that outgrow one machine and already
//! operate PostgreSQL.

use std::sync::{Arc, Mutex, PoisonError};

use fencecheck::{Instance, LeaseError, Runtime};
use postgres::{Client, NoTls, Transaction};

use crate::lineage::{
    Export, Imported, Lineage, LineageStore, MigrationStep, Peek, target_verdict,
};
use crate::rules::{self, Decided, Read};
use crate::{AuthorityError, Clock};

/// The coordinator's layout number: `authority-layout` in `fencecheck_meta`
/// (the resource layout's table, host/postgres/schema.sql, same definition).
/// Layout 2 adds `moved_to`, as in the SQLite coordinator; layout 1 is
/// upgraded in place on open.
const LAYOUT: i64 = 2;

/// Serializes concurrent `open`s of one database ("fenceauth" in ASCII).
const OPEN_LOCK: i64 = 0x6665_6e63_6561_7574;

const META: &str = "
CREATE TABLE IF NOT EXISTS fencecheck_meta (
    key   text   NOT NULL PRIMARY KEY,
    value bigint NOT NULL
);";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fencecheck_authority (
    id          integer PRIMARY KEY CHECK (id = 1),
    authority   bigint NOT NULL,  -- u64, stored bit for bit: the lineage
    epoch_floor bigint NOT NULL,  -- u64, stored bit for bit
    moved_to    text              -- set by migrate: the store it moved to
);
ALTER TABLE fencecheck_authority ADD COLUMN IF NOT EXISTS moved_to text;
CREATE TABLE IF NOT EXISTS fencecheck_leases (
    lock  text  PRIMARY KEY,
    state bytea NOT NULL          -- the component's canonical lease state
);";

// bigint is i64; u64 values are stored as their two's-complement bit
// pattern, as in the SQLite coordinator.
fn to_sql(v: u64) -> i64 {
    v as i64
}

fn from_sql(v: i64) -> u64 {
    v as u64
}

/// Opens a connection to the coordinator's database: TLS, credentials and
/// all (see [`PostgresCoordinator::open_with`]).
pub type Connect = Arc<dyn Fn() -> Result<Client, postgres::Error> + Send + Sync>;

struct Inner {
    connect: Connect,
    client: Client,
    guest: Instance,
    /// The last call failed without a server answer: the connection is
    /// gone (the driver does not always notice by itself between calls).
    broken: bool,
}

/// Lease coordinator on a PostgreSQL database.
///
/// Each decision is one READ COMMITTED transaction: it locks the lock's row
/// (a new lock: inserts it, and if another coordinator inserted it first,
/// decides again against that), reads the epoch floor under a share lock
/// (so `restore` waits for decisions in flight, and they for it), reads the
/// clock, lets the component decide, and writes the new state. Any number
/// of coordinator processes on one database are serialized per lock by
/// PostgreSQL and never issue the same or a decreasing token. A broken
/// connection is reopened on the next call.
pub struct PostgresCoordinator {
    inner: Mutex<Inner>,
    authority: u64,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for PostgresCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresCoordinator")
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

impl PostgresCoordinator {
    /// Connect to `url` (libpq key-value or URI form, no TLS) and create the
    /// coordinator's tables if absent. A new database gets a fresh random
    /// authority id, kept forever after.
    pub fn open(
        url: &str,
        runtime: Runtime,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthorityError> {
        let url = url.to_owned();
        Self::open_with(
            Arc::new(move || Client::connect(&url, NoTls)),
            runtime,
            clock,
        )
    }

    /// As [`PostgresCoordinator::open`], with every connection (the first
    /// and each reopened one) made by `connect`: for TLS, or credentials
    /// that must not sit in a connection string.
    pub fn open_with(
        connect: Connect,
        runtime: Runtime,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthorityError> {
        let mut client = connect()?;
        let authority = {
            let mut tx = client.transaction()?;
            prepare(&mut tx)?;
            tx.execute(
                "INSERT INTO fencecheck_authority (id, authority, epoch_floor) VALUES (1, $1, 0)
                 ON CONFLICT (id) DO NOTHING",
                &[&to_sql(crate::sqlite::fresh_authority())],
            )?;
            let authority: i64 = tx
                .query_one("SELECT authority FROM fencecheck_authority", &[])?
                .get(0);
            tx.commit()?;
            from_sql(authority)
        };
        Ok(Self {
            inner: Mutex::new(Inner {
                connect,
                client,
                guest: runtime.instance()?,
                broken: false,
            }),
            authority,
            clock,
        })
    }

    /// Run `f` on the connection, reopening it first if the last call lost
    /// it, and noting when this one does.
    fn with_connection<T>(
        &self,
        f: impl FnOnce(&mut Client, &mut Instance) -> Result<T, AuthorityError>,
    ) -> Result<T, AuthorityError> {
        // A panic cannot leave a half-done decision: the transaction rolls
        // back when dropped, so a poisoned lock is safe to reuse.
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let Inner {
            connect,
            client,
            guest,
            broken,
        } = &mut *inner;
        if *broken || client.is_closed() {
            *client = connect()?;
            *broken = false;
        }
        let result = f(client, guest);
        if let Err(AuthorityError::Postgres(e)) = &result {
            *broken = e.code().is_none();
        }
        result
    }

    /// One decision in one transaction; if `decide` fails or returns no
    /// state, the transaction rolls back untouched.
    fn decide<T>(
        &self,
        lock: &str,
        decide: impl Fn(&mut Instance, Read<'_>) -> Decided<T>,
    ) -> Result<T, AuthorityError> {
        self.with_connection(|client, guest| {
            let mut tx = client.transaction()?;
            // Two rounds at most: the second only when another coordinator
            // created this lock's row between our locking read and our insert.
            for _ in 0..2 {
                let state: Option<Vec<u8>> = tx
                    .query_opt(
                        "SELECT state FROM fencecheck_leases WHERE lock = $1 FOR UPDATE",
                        &[&lock],
                    )?
                    .map(|r| r.get(0));
                let floor = live_floor(&mut tx, "FOR SHARE")?;
                // Read the clock under the locks: decisions on a lock are
                // ordered by commit, and so are the times they saw.
                let read = Read {
                    state: state.as_deref(),
                    floor,
                    now: self.clock.now_ms(),
                };
                let (outcome, next) = decide(guest, read)?;
                let Some(next) = next else { return Ok(outcome) };
                if store(&mut tx, lock, state.is_some(), &next)? {
                    tx.commit()?;
                    return Ok(outcome);
                }
            }
            Err(AuthorityError::Contention {
                lock: lock.to_string(),
                attempts: 2,
            })
        })
    }
}

/// Write the lock's new state; `false` if its row appeared concurrently.
fn store(
    tx: &mut Transaction<'_>,
    lock: &str,
    exists: bool,
    next: &[u8],
) -> Result<bool, AuthorityError> {
    if exists {
        tx.execute(
            "UPDATE fencecheck_leases SET state = $2 WHERE lock = $1",
            &[&lock, &next],
        )?;
        return Ok(true);
    }
    let inserted = tx.execute(
        "INSERT INTO fencecheck_leases (lock, state) VALUES ($1, $2) ON CONFLICT (lock) DO NOTHING",
        &[&lock, &next],
    )?;
    Ok(inserted == 1)
}

rules::transactional_coordinator!(PostgresCoordinator);

impl PostgresCoordinator {
    /// Raise the epoch floor (see [`crate::Coordinator::restore`]).
    fn restore_floor(&self, at_least: u64) -> Result<u64, AuthorityError> {
        self.with_connection(|client, guest| {
            let mut tx = client.transaction()?;
            // FOR UPDATE on the floor waits for every decision in flight (they
            // hold it FOR SHARE) and keeps new ones out until the new floor
            // commits; SHARE on the leases table keeps new locks from appearing.
            let floor = live_floor(&mut tx, "FOR UPDATE")?;
            tx.batch_execute("LOCK TABLE fencecheck_leases IN SHARE MODE")?;
            let locks = all_locks(&mut tx)?;
            let new_floor = rules::restored_floor(
                guest,
                floor,
                at_least,
                locks.iter().map(|(l, s)| (l.as_bytes(), s.as_slice())),
            )?;
            tx.execute(
                "UPDATE fencecheck_authority SET epoch_floor = $1",
                &[&to_sql(new_floor)],
            )?;
            tx.commit()?;
            Ok(new_floor)
        })
    }
}

/// Create the coordinator's tables if absent (upgrading layout 1 in place),
/// serialized with every other `open` by an advisory lock, and read the
/// lineage row: `(lineage, moved_to)`, `None` before first use.
fn prepare(tx: &mut Transaction<'_>) -> Result<Option<(u64, Option<String>)>, AuthorityError> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&OPEN_LOCK])?;
    tx.batch_execute(META)?;
    let layout: Option<i64> = tx
        .query_opt(
            "SELECT value FROM fencecheck_meta WHERE key = 'authority-layout'",
            &[],
        )?
        .map(|r| r.get(0));
    match layout {
        None | Some(1) => {
            tx.batch_execute(SCHEMA)?;
            tx.execute(
                "INSERT INTO fencecheck_meta (key, value) VALUES ('authority-layout', $1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                &[&LAYOUT],
            )?;
        }
        Some(LAYOUT) => {}
        // The caller drops `tx`, which rolls back: nothing is created.
        Some(other) => return Err(AuthorityError::UnsupportedLayout(other.to_string())),
    }
    Ok(tx
        .query_opt(
            "SELECT authority, moved_to FROM fencecheck_authority FOR UPDATE",
            &[],
        )?
        .map(|r| (from_sql(r.get(0)), r.get(1))))
}

/// The epoch floor read with `lock` (`FOR SHARE`, `FOR UPDATE`), or
/// [`AuthorityError::Moved`] once the store is sealed.
fn live_floor(tx: &mut Transaction<'_>, lock: &str) -> Result<u64, AuthorityError> {
    let row = tx.query_one(
        &format!("SELECT epoch_floor, moved_to FROM fencecheck_authority {lock}"),
        &[],
    )?;
    match row.get::<_, Option<String>>(1) {
        Some(to) => Err(AuthorityError::Moved { to }),
        None => Ok(from_sql(row.get(0))),
    }
}

fn all_locks(tx: &mut Transaction<'_>) -> Result<Vec<(String, Vec<u8>)>, AuthorityError> {
    Ok(tx
        .query(
            "SELECT lock, state FROM fencecheck_leases ORDER BY lock",
            &[],
        )?
        .into_iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// A PostgreSQL database as a migration reaches it: by URL, without TLS
/// and without a coordinator (and its clock), so a look changes nothing.
pub(crate) struct PostgresStore {
    url: String,
    runtime: Runtime,
}

impl PostgresStore {
    pub(crate) fn new(url: String, runtime: Runtime) -> Self {
        Self { url, runtime }
    }
}

impl LineageStore for PostgresStore {
    fn identity(&self) -> Result<String, AuthorityError> {
        identity(&self.url)
    }

    fn peek(&self) -> Result<Peek, AuthorityError> {
        peek(&self.url)
    }

    fn seal(&self, target: &str, at_least: u64) -> Result<Export, AuthorityError> {
        seal(&self.url, target, &mut self.runtime.instance()?, at_least)
    }

    /// One transaction; no steps of its own.
    fn import(
        &self,
        export: &Export,
        _step: &mut dyn FnMut(MigrationStep),
    ) -> Result<Imported, AuthorityError> {
        import(&self.url, export)
    }
}

/// The server and database `url` names, without credentials.
fn identity(url: &str) -> Result<String, AuthorityError> {
    let config: postgres::Config = url.parse()?;
    let host = match config.get_hosts().first() {
        Some(postgres::config::Host::Tcp(host)) => host.clone(),
        Some(postgres::config::Host::Unix(path)) => path.display().to_string(),
        None => "localhost".to_owned(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let db = config
        .get_dbname()
        .or(config.get_user())
        .unwrap_or_default();
    Ok(format!("postgres://{host}:{port}/{db}"))
}

/// The lineage and whether there is state, changing nothing.
fn peek(url: &str) -> Result<Peek, AuthorityError> {
    let mut client = Client::connect(url, NoTls)?;
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('fencecheck_authority') IS NOT NULL
                AND to_regclass('fencecheck_leases') IS NOT NULL",
            &[],
        )?
        .get(0);
    if !exists {
        return Ok(Peek::default());
    }
    // Layout 1 has no moved_to: read it only where it exists.
    let moved: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                 WHERE table_schema = current_schema()
                   AND table_name = 'fencecheck_authority' AND column_name = 'moved_to')",
            &[],
        )?
        .get(0);
    let sql = if moved {
        "SELECT authority, moved_to FROM fencecheck_authority"
    } else {
        "SELECT authority, NULL::text FROM fencecheck_authority"
    };
    let held = client.query_opt(sql, &[])?.map(|r| {
        let lineage = from_sql(r.get(0));
        match r.get::<_, Option<String>>(1) {
            Some(to) => Lineage::Moved(lineage, to),
            None => Lineage::Live(lineage),
        }
    });
    let has_state: bool = client
        .query_one("SELECT EXISTS (SELECT 1 FROM fencecheck_leases)", &[])?
        .get(0);
    Ok(Peek {
        held,
        has_state,
        legacy: None,
    })
}

/// Seal the database at `url` for `target` and export it (see `migrate`):
/// the row lock on the lineage row waits for decisions in flight (they
/// hold it `FOR SHARE`) and keeps new ones out until the seal commits.
fn seal(
    url: &str,
    target: &str,
    guest: &mut Instance,
    at_least: u64,
) -> Result<Export, AuthorityError> {
    let mut client = Client::connect(url, NoTls)?;
    let mut tx = client.transaction()?;
    let Some((lineage, moved_to)) = prepare(&mut tx)? else {
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
            tx.execute("UPDATE fencecheck_authority SET moved_to = $1", &[&target])?;
        }
    }
    tx.batch_execute("LOCK TABLE fencecheck_leases IN SHARE MODE")?;
    let floor: i64 = tx
        .query_one("SELECT epoch_floor FROM fencecheck_authority", &[])?
        .get(0);
    // Checked before the seal commits: a damaged state refuses the
    // migration and leaves the source granting.
    let export = Export::checked(
        guest,
        lineage,
        from_sql(floor),
        at_least,
        all_locks(&mut tx)?,
    )?;
    tx.commit()?;
    Ok(export)
}

/// Import `export` into the database at `url` in one transaction.
fn import(url: &str, export: &Export) -> Result<Imported, AuthorityError> {
    let mut client = Client::connect(url, NoTls)?;
    let mut tx = client.transaction()?;
    let held = prepare(&mut tx)?.map(|(lineage, moved_to)| match moved_to {
        Some(to) => Lineage::Moved(lineage, to),
        None => Lineage::Live(lineage),
    });
    tx.batch_execute("LOCK TABLE fencecheck_leases IN EXCLUSIVE MODE")?;
    let has_state: bool = tx
        .query_one("SELECT EXISTS (SELECT 1 FROM fencecheck_leases)", &[])?
        .get(0);
    let own: Option<i64> = tx
        .query_opt("SELECT epoch_floor FROM fencecheck_authority", &[])?
        .map(|r| r.get(0));
    if target_verdict(held.as_ref(), has_state, export.lineage)?.is_some() {
        return Ok(Imported::Already {
            floor: own.map_or(0, from_sql),
        });
    }
    // A sealed store moved back to: above its own floor as well.
    let floor = match own {
        Some(own) => export
            .floor
            .max(from_sql(own).checked_add(1).ok_or(LeaseError::Exhausted)?),
        None => export.floor,
    };
    tx.batch_execute("DELETE FROM fencecheck_leases; DELETE FROM fencecheck_authority;")?;
    tx.execute(
        "INSERT INTO fencecheck_authority (id, authority, epoch_floor, moved_to)
         VALUES (1, $1, $2, NULL)",
        &[&to_sql(export.lineage), &to_sql(floor)],
    )?;
    let insert = tx.prepare("INSERT INTO fencecheck_leases (lock, state) VALUES ($1, $2)")?;
    for (lock, state) in &export.locks {
        tx.execute(&insert, &[lock, state])?;
    }
    tx.commit()?;
    Ok(Imported::Done { floor })
}
