//! A lease coordinator on PostgreSQL: lease states in a table, one
//! transaction per decision, for teams that outgrow one machine and already
//! operate PostgreSQL.

use std::sync::{Arc, Mutex, PoisonError};

use fencecheck::{Instance, Runtime};
use postgres::{Client, NoTls, Transaction};

use crate::rules::{self, Decided, Read};
use crate::{AuthorityError, Clock};

/// The coordinator's layout number: `authority-layout` in `fencecheck_meta`
/// (the resource layout's table, host/postgres/schema.sql, same definition).
const LAYOUT: i64 = 1;

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
    authority   bigint NOT NULL,  -- u64, stored bit for bit
    epoch_floor bigint NOT NULL   -- u64, stored bit for bit
);
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

struct Inner {
    url: String,
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
        let mut client = Client::connect(url, NoTls)?;
        let authority = {
            let mut tx = client.transaction()?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&OPEN_LOCK])?;
            tx.batch_execute(META)?;
            let layout: Option<i64> = tx
                .query_opt(
                    "SELECT value FROM fencecheck_meta WHERE key = 'authority-layout'",
                    &[],
                )?
                .map(|r| r.get(0));
            match layout {
                None => {
                    tx.execute(
                        "INSERT INTO fencecheck_meta (key, value) VALUES ('authority-layout', $1)",
                        &[&LAYOUT],
                    )?;
                }
                Some(LAYOUT) => {}
                // Dropping `tx` rolls back: nothing is created.
                Some(other) => return Err(AuthorityError::UnsupportedLayout(other.to_string())),
            }
            tx.batch_execute(SCHEMA)?;
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
                url: url.to_string(),
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
            url,
            client,
            guest,
            broken,
        } = &mut *inner;
        if *broken || client.is_closed() {
            *client = Client::connect(url, NoTls)?;
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
                let floor: i64 = tx
                    .query_one(
                        "SELECT epoch_floor FROM fencecheck_authority FOR SHARE",
                        &[],
                    )?
                    .get(0);
                // Read the clock under the locks: decisions on a lock are
                // ordered by commit, and so are the times they saw.
                let read = Read {
                    state: state.as_deref(),
                    floor: from_sql(floor),
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
            let floor: i64 = tx
                .query_one(
                    "SELECT epoch_floor FROM fencecheck_authority FOR UPDATE",
                    &[],
                )?
                .get(0);
            tx.batch_execute("LOCK TABLE fencecheck_leases IN SHARE MODE")?;
            let locks: Vec<(String, Vec<u8>)> = tx
                .query(
                    "SELECT lock, state FROM fencecheck_leases ORDER BY lock",
                    &[],
                )?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            let new_floor = rules::restored_floor(
                guest,
                from_sql(floor),
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
