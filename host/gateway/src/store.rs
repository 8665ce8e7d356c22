//! Pointers and fence states, through the publish protocol: in
//! `DIR/fencecheck.db` (`fencecheck-sqlite`, the embedded default), or in a
//! PostgreSQL database (`fencecheck-postgres`, `--postgres URL`) that any
//! number of gateway processes share, one high-water mark per key. Object
//! ids, never reused, name the blobs (see [`crate::Blobs`]); the rows
//! themselves hold no bytes.
//!
//! All calls here block (the database, the component): the gateway runs
//! them on tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fencecheck::{Checker, Instance, Request, Runtime, SignedOutcome};
use fencecheck_sqlite::{Fenced, ObjectId, collect_garbage, discard, publish, stage, visible};
use rusqlite::{Connection, OptionalExtension};

/// Where pointers and fence states live.
#[derive(Clone, Debug)]
enum Backend {
    /// `DIR/fencecheck.db`.
    Sqlite(PathBuf),
    /// A PostgreSQL connection string.
    Postgres(String),
}

/// One pooled connection.
enum Conn {
    Sqlite(Connection),
    Postgres(Box<postgres::Client>),
}

use crate::error::{Error, io};

/// How long SQLite waits for the write lock before the request gets 503.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What a staged object stands for; stored as the object's name together
/// with the token text of the writer, so GET can report the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A body, in `blobs/<id>`.
    Blob,
    /// A DELETE: the key reads as absent.
    Tombstone,
}

/// The visible version of a key.
#[derive(Clone, Debug)]
pub struct Current {
    /// The staged object's id (its blob's file name).
    pub object: ObjectId,
    /// Body or tombstone.
    pub kind: Kind,
    /// The token text of the writer that published it.
    pub fence: String,
    /// The scope's version.
    pub version: u64,
}

struct Slot {
    conn: Conn,
    guest: Instance,
    /// The component generation `guest` was made from.
    generation: u64,
}

/// Database connections with their component instances.
pub struct Store {
    backend: Backend,
    /// The current component and its generation (bumped by each swap).
    runtime: std::sync::RwLock<(u64, Runtime)>,
    pool: Mutex<Vec<Slot>>,
    /// SQLite writers queue here rather than in SQLite's busy handler,
    /// which sleeps and retries (slow under contention); SQLite still
    /// arbitrates between processes. PostgreSQL writers lock rows instead.
    writer: Mutex<()>,
}

impl Store {
    /// Open (creating if needed) the store in `dir`, deciding with `runtime`.
    pub fn open(dir: &Path, runtime: Runtime) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(io("creating the data directory"))?;
        Self::with_backend(Backend::Sqlite(dir.join("fencecheck.db")), runtime)
    }

    /// Open the store in the PostgreSQL database `url` (libpq form, no
    /// TLS), installing the layout if absent. Every gateway given the same
    /// database shares one pointer and one high-water mark per key.
    pub fn open_postgres(url: &str, runtime: Runtime) -> Result<Self, Error> {
        Self::with_backend(Backend::Postgres(url.to_owned()), runtime)
    }

    fn with_backend(backend: Backend, runtime: Runtime) -> Result<Self, Error> {
        let store = Self {
            backend,
            runtime: std::sync::RwLock::new((0, runtime)),
            pool: Mutex::new(Vec::new()),
            writer: Mutex::new(()),
        };
        let mut slot = store.connect()?;
        match &mut slot.conn {
            Conn::Sqlite(conn) => fencecheck_sqlite::install(conn)?,
            Conn::Postgres(client) => fencecheck_postgres::install(client)?,
        }
        store.put_back(slot);
        Ok(store)
    }

    /// The turn of an SQLite writer (see `writer`); none for PostgreSQL.
    fn turn(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        match self.backend {
            Backend::Sqlite(_) => self.writer.lock().ok(),
            Backend::Postgres(_) => None,
        }
    }

    fn connect(&self) -> Result<Slot, Error> {
        let (generation, runtime) = self.current_runtime()?;
        let conn = match &self.backend {
            Backend::Sqlite(db) => Conn::Sqlite(Self::connect_sqlite(db)?),
            Backend::Postgres(url) => Conn::Postgres(Box::new(
                postgres::Client::connect(url, postgres::NoTls).map_err(|source| {
                    Error::Postgres(fencecheck_postgres::Error::Postgres {
                        doing: "connecting",
                        source,
                    })
                })?,
            )),
        };
        Ok(Slot {
            conn,
            guest: runtime.instance()?,
            generation,
        })
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

    fn current_runtime(&self) -> Result<(u64, Runtime), Error> {
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
        if let Ok(mut pool) = self.pool.lock() {
            pool.clear();
        }
    }

    fn put_back(&self, slot: Slot) {
        let current = self.runtime.read().map(|r| r.0).ok();
        if current == Some(slot.generation)
            && let Ok(mut pool) = self.pool.lock()
        {
            pool.push(slot);
        }
    }

    /// Run `f` on a pooled connection and instance. A slot whose call failed
    /// is dropped, not reused: a fresh one costs little, a wedged one a lot.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Conn, &mut Instance) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let pooled = self.pool.lock().ok().and_then(|mut pool| pool.pop());
        let mut slot = match pooled {
            Some(slot) => slot,
            None => self.connect()?,
        };
        let result = f(&mut slot.conn, &mut slot.guest);
        if result.is_ok() {
            self.put_back(slot);
        }
        result
    }

    /// The early check: decide `request` against the current state without
    /// storing anything, and say whether the key has a visible body. Saves an
    /// upload that is stale already; the publish decides again.
    pub fn early(&self, request: &Request) -> Result<(SignedOutcome, bool), Error> {
        self.with(|conn, guest| {
            let (state, keys) = match conn {
                Conn::Sqlite(c) => (
                    fencecheck_sqlite::stored_state(c, &request.scope)?,
                    fencecheck_sqlite::scope_keys(c, &request.scope)?,
                ),
                Conn::Postgres(c) => (
                    fencecheck_postgres::stored_state(c, &request.scope)?,
                    fencecheck_postgres::scope_keys(c.as_mut(), &request.scope)?,
                ),
            };
            let outcome = guest.decide(state.as_deref(), request, keys.as_deref())?;
            let exists = current(conn, &request.scope)?.is_some_and(|c| c.kind == Kind::Blob);
            Ok((outcome, exists))
        })
    }

    /// Stage an object for `scope`; its bytes go to the blob named by its id.
    pub fn stage(&self, scope: &str, kind: Kind, fence: &str) -> Result<ObjectId, Error> {
        let name = match kind {
            Kind::Blob => format!("blob {fence}"),
            Kind::Tombstone => format!("tombstone {fence}"),
        };
        let _turn = self.turn();
        self.with(|conn, _| match conn {
            Conn::Sqlite(c) => relaxed(c, |c| Ok(stage(c, scope, &name, b"", SystemTime::now())?)),
            Conn::Postgres(c) => {
                let id = fencecheck_postgres::stage(c, scope, &name, b"", SystemTime::now())?;
                Ok(ObjectId::from_raw(id.get()))
            }
        })
    }

    /// The fenced publish: check and move the pointer in one transaction.
    pub fn publish(&self, request: &Request, object: ObjectId) -> Result<Fenced<()>, Error> {
        let _turn = self.turn();
        self.with(|conn, guest| match conn {
            Conn::Sqlite(c) => Ok(publish(c, guest, request, object, SystemTime::now())?),
            Conn::Postgres(c) => Ok(fencecheck_postgres::publish(
                c,
                guest,
                request,
                fencecheck_postgres::ObjectId::from_raw(object.get()),
                SystemTime::now(),
            )?),
        })
    }

    /// Drop the row of an object that was not published, unless a pointer
    /// references it; `true` if it is gone (its blob may go too).
    pub fn discard(&self, object: ObjectId) -> Result<bool, Error> {
        let _turn = self.turn();
        self.with(|conn, _| match conn {
            Conn::Sqlite(c) => relaxed(c, |c| Ok(discard(c, object)?)),
            Conn::Postgres(c) => Ok(fencecheck_postgres::discard(
                c,
                fencecheck_postgres::ObjectId::from_raw(object.get()),
            )?),
        })
    }

    /// The key's visible version, if any (tombstones included).
    pub fn current(&self, scope: &str) -> Result<Option<Current>, Error> {
        self.with(|conn, _| current(conn, scope))
    }

    /// A liveness probe: one query on a pooled connection.
    pub fn ping(&self) -> Result<(), Error> {
        self.with(|conn, _| match conn {
            Conn::Sqlite(c) => {
                c.query_row("SELECT 1", [], |_| Ok(()))
                    .map_err(|source| Error::Sqlite {
                        doing: "probing",
                        source,
                    })
            }
            Conn::Postgres(c) => c
                .simple_query("SELECT 1")
                .map(|_| ())
                .map_err(|source| postgres_error("probing", source)),
        })
    }

    /// One collection pass over the rows: unreferenced objects staged more
    /// than `retention` ago are deleted; returns their ids, whose blobs may go.
    /// Candidates are read first and reported only if their row is gone after
    /// the pass (one published in between keeps its row and its blob).
    pub fn collect(&self, retention: Duration) -> Result<Vec<ObjectId>, Error> {
        let now = SystemTime::now();
        let cutoff = now
            .checked_sub(retention)
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        const CANDIDATES: &str = "SELECT id FROM fencecheck_objects
              WHERE staged_at_ms <= $1
                AND id NOT IN (SELECT visible_object FROM fencecheck_scopes
                                WHERE visible_object IS NOT NULL)";
        let candidates = self.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached(&CANDIDATES.replace("$1", "?1"))
                .and_then(|mut s| {
                    s.query_map([cutoff], |r| r.get::<_, i64>(0))?
                        .collect::<Result<Vec<_>, _>>()
                })
                .map_err(|source| Error::Sqlite {
                    doing: "listing collectable objects",
                    source,
                }),
            Conn::Postgres(c) => c
                .query(CANDIDATES, &[&cutoff])
                .map(|rows| rows.iter().map(|r| r.get::<_, i64>(0)).collect())
                .map_err(|source| postgres_error("listing collectable objects", source)),
        })?;
        self.with(|conn, _| match conn {
            Conn::Sqlite(c) => Ok(collect_garbage(c, now, retention).map(|_| ())?),
            Conn::Postgres(c) => {
                Ok(fencecheck_postgres::collect_garbage(c, now, retention).map(|_| ())?)
            }
        })?;
        let mut gone = Vec::new();
        for id in candidates {
            if !self.exists(id)? {
                gone.push(ObjectId::from_raw(id));
            }
        }
        Ok(gone)
    }

    /// Whether object `id` still has a row.
    pub fn exists(&self, id: i64) -> Result<bool, Error> {
        self.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached("SELECT 1 FROM fencecheck_objects WHERE id = ?1")
                .and_then(|mut s| s.query_row([id], |_| Ok(())).optional())
                .map(|row| row.is_some())
                .map_err(|source| Error::Sqlite {
                    doing: "looking up an object",
                    source,
                }),
            Conn::Postgres(c) => c
                .query_opt("SELECT 1 FROM fencecheck_objects WHERE id = $1", &[&id])
                .map(|row| row.is_some())
                .map_err(|source| postgres_error("looking up an object", source)),
        })
    }
}

fn postgres_error(doing: &'static str, source: postgres::Error) -> Error {
    Error::Postgres(fencecheck_postgres::Error::Postgres { doing, source })
}

/// Run `f` with `synchronous=NORMAL`: its commit is not fsynced on its own.
/// Safe for staging and discarding: a WAL commit is durable once any later
/// commit is synced, so a publish (FULL) makes the staging before it durable
/// too, and a lost staging or discard only leaves work for the collector.
/// The connection is back at FULL afterwards, or it is not reused.
fn relaxed<T>(
    conn: &mut Connection,
    f: impl FnOnce(&mut Connection) -> Result<T, Error>,
) -> Result<T, Error> {
    let sync = |conn: &Connection, level: &str| {
        conn.pragma_update(None, "synchronous", level)
            .map_err(|source| Error::Sqlite {
                doing: "setting synchronous",
                source,
            })
    };
    sync(conn, "NORMAL")?;
    let result = f(conn);
    sync(conn, "FULL")?;
    result
}

fn current(conn: &mut Conn, scope: &str) -> Result<Option<Current>, Error> {
    let found = match conn {
        Conn::Sqlite(c) => visible(c, scope)?.map(|v| (v.object, v.name, v.version)),
        Conn::Postgres(c) => fencecheck_postgres::visible(c, scope)?
            .map(|v| (ObjectId::from_raw(v.object.get()), v.name, v.version)),
    };
    let Some((object, name, version)) = found else {
        return Ok(None);
    };
    let (kind, fence) = match name.split_once(' ') {
        Some(("blob", fence)) => (Kind::Blob, fence),
        Some(("tombstone", fence)) => (Kind::Tombstone, fence),
        // Not written by the gateway: fail closed rather than guess.
        _ => {
            return Err(Error::Io {
                doing: "reading the visible object",
                source: std::io::Error::other(format!("unknown object name {name:?}")),
            });
        }
    };
    Ok(Some(Current {
        object,
        kind,
        fence: fence.to_owned(),
        version,
    }))
}
