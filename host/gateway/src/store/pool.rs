//! A bounded pool of database connections, each with its own component
//! instance. A caller that finds every connection busy waits (blocking: it
//! runs on tokio's blocking pool) at most `WAIT`, then gets an error (503).

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use fencecheck::{Instance, Runtime};
use rusqlite::Connection;

use super::BUSY_TIMEOUT;
use crate::error::Error;

/// Longest wait for a free connection.
const WAIT: Duration = Duration::from_secs(5);

/// Where pointers and fence states live.
#[derive(Clone, Debug)]
pub(crate) enum Backend {
    /// `DIR/fencecheck.db`.
    Sqlite(PathBuf),
    /// How to connect (TLS, credentials).
    Postgres(Box<crate::pgtls::PgConnect>),
}

/// One pooled connection.
pub(crate) enum Conn {
    Sqlite(Connection),
    Postgres(Box<postgres::Client>),
}

struct Slot {
    conn: Conn,
    guest: Instance,
    /// The component generation `guest` was made from.
    generation: u64,
}

struct Slots {
    idle: Vec<Slot>,
    /// Connections in existence (idle or in use).
    open: usize,
}

pub(crate) struct Pool {
    backend: Backend,
    size: usize,
    /// The current component and its generation (bumped by each swap).
    runtime: RwLock<(u64, Runtime)>,
    slots: Mutex<Slots>,
    freed: Condvar,
}

impl Pool {
    pub fn new(backend: Backend, runtime: Runtime, size: usize) -> Result<Self, Error> {
        if size == 0 {
            return Err(Error::Config(
                "the pool needs at least one connection".into(),
            ));
        }
        Ok(Self {
            backend,
            size,
            runtime: RwLock::new((0, runtime)),
            slots: Mutex::new(Slots {
                idle: Vec::new(),
                open: 0,
            }),
            freed: Condvar::new(),
        })
    }

    pub fn is_sqlite(&self) -> bool {
        matches!(self.backend, Backend::Sqlite(_))
    }

    /// The SQLite database file, if that is the backend.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.backend {
            Backend::Sqlite(db) => Some(db),
            Backend::Postgres(_) => None,
        }
    }

    /// The current component and its generation.
    pub(crate) fn current_runtime(&self) -> Result<(u64, Runtime), Error> {
        self.runtime
            .read()
            .map(|r| (r.0, r.1.clone()))
            .map_err(|_| Error::Task("the component lock is poisoned".into()))
    }

    /// Use `runtime` for every check from now on. Slots in use finish their
    /// call on the old component and are dropped when returned.
    pub fn swap(&self, runtime: Runtime) {
        if let Ok(mut current) = self.runtime.write() {
            *current = (current.0 + 1, runtime);
        }
        if let Ok(mut slots) = self.slots.lock() {
            let idle = std::mem::take(&mut slots.idle);
            slots.open -= idle.len();
            retire(idle);
        }
        self.freed.notify_all();
    }

    /// Close the idle connections now (at shutdown, off any runtime).
    pub fn close_idle(&self) {
        if let Ok(mut slots) = self.slots.lock() {
            let idle = std::mem::take(&mut slots.idle);
            slots.open -= idle.len();
            retire(idle);
        }
    }

    /// An idle slot, or room to open one (`None`), waiting up to `WAIT`.
    fn take(&self) -> Result<Option<Slot>, Error> {
        let poisoned = || Error::Task("the pool lock is poisoned".into());
        let deadline = Instant::now() + WAIT;
        let mut slots = self.slots.lock().map_err(|_| poisoned())?;
        loop {
            if let Some(slot) = slots.idle.pop() {
                // A connection the server or the network closed while it was
                // idle is dropped here rather than failing a request.
                if let Conn::Postgres(client) = &slot.conn
                    && client.is_closed()
                {
                    slots.open = slots.open.saturating_sub(1);
                    retire(vec![slot]);
                    continue;
                }
                return Ok(Some(slot));
            }
            if slots.open < self.size {
                slots.open += 1;
                return Ok(None);
            }
            let left = deadline
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| {
                    Error::Task(format!(
                        "all {} database connections stayed busy for {WAIT:?}",
                        self.size
                    ))
                })?;
            slots = self
                .freed
                .wait_timeout(slots, left)
                .map_err(|_| poisoned())?
                .0;
        }
    }

    /// Give a slot back (`None`: it failed and is dropped).
    fn give(&self, slot: Option<Slot>) {
        let current = self.runtime.read().map(|r| r.0).ok();
        if let Ok(mut slots) = self.slots.lock() {
            match slot {
                Some(slot) if current == Some(slot.generation) => slots.idle.push(slot),
                other => {
                    slots.open = slots.open.saturating_sub(1);
                    retire(other.into_iter().collect());
                }
            }
        }
        self.freed.notify_one();
    }

    /// Run `f` on a pooled connection and instance. A slot whose call failed
    /// is dropped, not reused: a fresh one costs little, a wedged one a lot.
    pub fn with<T>(
        &self,
        f: impl FnOnce(&mut Conn, &mut Instance) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut slot = match self.take()? {
            Some(slot) => slot,
            None => match self.connect() {
                Ok(slot) => slot,
                Err(e) => {
                    self.give(None);
                    return Err(e);
                }
            },
        };
        let result = f(&mut slot.conn, &mut slot.guest);
        self.give(result.is_ok().then_some(slot));
        result
    }

    fn connect(&self) -> Result<Slot, Error> {
        let (generation, runtime) = self.current_runtime()?;
        let conn = match &self.backend {
            Backend::Sqlite(db) => Conn::Sqlite(connect_sqlite(db)?),
            Backend::Postgres(pg) => Conn::Postgres(Box::new(pg.connect().map_err(|source| {
                Error::Postgres(fencecheck_postgres::Error::Postgres {
                    doing: "connecting",
                    source,
                })
            })?)),
        };
        Ok(Slot {
            conn,
            guest: runtime.instance()?,
            generation,
        })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Ok(slots) = self.slots.get_mut() {
            retire(std::mem::take(&mut slots.idle));
        }
    }
}

/// Drop slots where that is allowed. A synchronous `postgres::Client` says
/// goodbye to the server from its `Drop` on a runtime of its own, which
/// panics on a thread that belongs to a tokio runtime ("Cannot start a
/// runtime from within a runtime"): a swap from the SIGHUP task, or the
/// pool freed with the service at shutdown. Such slots are dropped on a
/// thread of their own; if none can be started they are leaked (the
/// process's sockets close with it), never dropped in place.
fn retire(slots: Vec<Slot>) {
    let postgres = slots.iter().any(|s| matches!(s.conn, Conn::Postgres(_)));
    if !postgres || tokio::runtime::Handle::try_current().is_err() {
        return drop(slots);
    }
    let held = std::sync::Arc::new(Mutex::new(Some(slots)));
    let moved = held.clone();
    let spawned = std::thread::Builder::new()
        .name("fencecheck-pg-close".into())
        .spawn(move || drop(moved.lock().ok().and_then(|mut s| s.take())));
    if spawned.is_err() {
        std::mem::forget(held.lock().ok().and_then(|mut s| s.take()));
    }
}

/// A read-only connection for the calling thread (see `Store::head_here`).
pub(crate) fn reader(db: &Path) -> Result<Connection, Error> {
    let sqlite = |doing| move |source| Error::Sqlite { doing, source };
    let conn = Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(sqlite("opening a reader"))?;
    // A WAL reader waits only in rare cases (recovery); never long here.
    conn.busy_timeout(std::time::Duration::from_millis(20))
        .map_err(sqlite("setting the busy timeout"))?;
    Ok(conn)
}

fn connect_sqlite(db: &Path) -> Result<Connection, Error> {
    let sqlite = |doing| move |source| Error::Sqlite { doing, source };
    let conn = Connection::open(db).map_err(sqlite("opening the database"))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(sqlite("setting the busy timeout"))?;
    // WAL lets GETs read while a publish writes; FULL: an acknowledged
    // publish survives power loss too, not only a process crash.
    conn.pragma_update(None, "journal_mode", "WAL")
        .map_err(sqlite("enabling WAL"))?;
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(sqlite("setting synchronous"))?;
    Ok(conn)
}
