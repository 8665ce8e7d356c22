//! Pointers and fence states in `DIR/fencecheck.db`, through the SQLite
//! publish protocol (`fencecheck-sqlite`). Its object ids, never reused,
//! name the blobs (see [`crate::Blobs`]); the rows themselves hold no bytes.
//!
//! All calls here block (SQLite, the component): the gateway runs them on
//! tokio's blocking pool.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use fencecheck::{Instance, Outcome, Request, Runtime};
use fencecheck_sqlite::{Fenced, ObjectId, collect_garbage, discard, publish, stage, visible};
use rusqlite::{Connection, OptionalExtension};

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
    conn: Connection,
    guest: Instance,
    /// The component generation `guest` was made from.
    generation: u64,
}

/// SQLite connections with their component instances, and the blob directory.
pub struct Store {
    db: PathBuf,
    /// The current component and its generation (bumped by each swap).
    runtime: std::sync::RwLock<(u64, Runtime)>,
    pool: Mutex<Vec<Slot>>,
    /// Writers queue here rather than in SQLite's busy handler, which
    /// sleeps and retries (slow under contention); SQLite still arbitrates
    /// between processes.
    writer: Mutex<()>,
}

impl Store {
    /// Open (creating if needed) the store in `dir`, deciding with `runtime`.
    pub fn open(dir: &Path, runtime: Runtime) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(io("creating the data directory"))?;
        let store = Self {
            db: dir.join("fencecheck.db"),
            runtime: std::sync::RwLock::new((0, runtime)),
            pool: Mutex::new(Vec::new()),
            writer: Mutex::new(()),
        };
        let slot = store.connect()?;
        fencecheck_sqlite::install(&slot.conn)?;
        store.put_back(slot);
        Ok(store)
    }

    fn connect(&self) -> Result<Slot, Error> {
        let sqlite = |doing| move |source| Error::Sqlite { doing, source };
        let conn = Connection::open(&self.db).map_err(sqlite("opening the database"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(sqlite("setting the busy timeout"))?;
        // WAL lets GETs read while a publish writes; FULL: an acknowledged
        // publish survives power loss too, not only a process crash.
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(sqlite("enabling WAL"))?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(sqlite("setting synchronous"))?;
        let (generation, runtime) = self.current_runtime()?;
        let guest = runtime.instance()?;
        Ok(Slot {
            conn,
            guest,
            generation,
        })
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
        f: impl FnOnce(&mut Connection, &mut Instance) -> Result<T, Error>,
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
    pub fn early(&self, request: &Request) -> Result<(Outcome, bool), Error> {
        self.with(|conn, guest| {
            let state = fencecheck_sqlite::stored_state(conn, &request.scope)?;
            let outcome = guest.check(state.as_deref(), request)?;
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
        let _turn = self.writer.lock();
        self.with(|conn, _| {
            relaxed(conn, |conn| {
                Ok(stage(conn, scope, &name, b"", SystemTime::now())?)
            })
        })
    }

    /// The fenced publish: check and move the pointer in one transaction.
    pub fn publish(&self, request: &Request, object: ObjectId) -> Result<Fenced<()>, Error> {
        let _turn = self.writer.lock();
        self.with(|conn, guest| Ok(publish(conn, guest, request, object, SystemTime::now())?))
    }

    /// Drop the row of an object that was not published, unless a pointer
    /// references it; `true` if it is gone (its blob may go too).
    pub fn discard(&self, object: ObjectId) -> Result<bool, Error> {
        let _turn = self.writer.lock();
        self.with(|conn, _| relaxed(conn, |conn| Ok(discard(conn, object)?)))
    }

    /// The key's visible version, if any (tombstones included).
    pub fn current(&self, scope: &str) -> Result<Option<Current>, Error> {
        self.with(|conn, _| current(conn, scope))
    }

    /// A liveness probe: one query on a pooled connection.
    pub fn ping(&self) -> Result<(), Error> {
        self.with(|conn, _| {
            conn.query_row("SELECT 1", [], |_| Ok(()))
                .map_err(|source| Error::Sqlite {
                    doing: "probing",
                    source,
                })
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
        let candidates = self.with(|conn, _| {
            conn.prepare_cached(
                "SELECT id FROM fencecheck_objects
                  WHERE staged_at_ms <= ?1
                    AND id NOT IN (SELECT visible_object FROM fencecheck_scopes
                                    WHERE visible_object IS NOT NULL)",
            )
            .and_then(|mut s| {
                s.query_map([cutoff], |r| r.get::<_, i64>(0))?
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|source| Error::Sqlite {
                doing: "listing collectable objects",
                source,
            })
        })?;
        self.with(|conn, _| Ok(collect_garbage(conn, now, retention)?))?;
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
        self.with(|conn, _| {
            conn.prepare_cached("SELECT 1 FROM fencecheck_objects WHERE id = ?1")
                .and_then(|mut s| s.query_row([id], |_| Ok(())).optional())
                .map(|row| row.is_some())
                .map_err(|source| Error::Sqlite {
                    doing: "looking up an object",
                    source,
                })
        })
    }
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

fn current(conn: &Connection, scope: &str) -> Result<Option<Current>, Error> {
    let Some(v) = visible(conn, scope)? else {
        return Ok(None);
    };
    let (kind, fence) = match v.name.split_once(' ') {
        Some(("blob", fence)) => (Kind::Blob, fence),
        Some(("tombstone", fence)) => (Kind::Tombstone, fence),
        // Not written by the gateway: fail closed rather than guess.
        _ => {
            return Err(Error::Io {
                doing: "reading the visible object",
                source: std::io::Error::other(format!("unknown object name {:?}", v.name)),
            });
        }
    };
    Ok(Some(Current {
        object: v.object,
        kind,
        fence: fence.to_owned(),
        version: v.version,
    }))
}
