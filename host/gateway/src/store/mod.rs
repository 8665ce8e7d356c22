//! Pointers and fence states, through the publish protocol: in
//! `DIR/fencecheck.db` (`fencecheck-sqlite`, the embedded default), or in a
//! PostgreSQL database (`fencecheck-postgres`, `--postgres URL`) that any
//! number of gateway processes share, one high-water mark per key. Object
//! ids, never reused, name the blobs (with the store's id as prefix, see
//! [`crate::Blobs`]); the rows themselves hold no bytes. The gateway's own
//! facts about blobs live beside them ([`schema`]).
//!
//! All calls here block (the database, the component): the gateway runs
//! them on tokio's blocking pool, each under an in-flight permit.

mod group;
mod pool;
mod schema;

use std::io::Read;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencecheck::{Checker, Instance, Request, Runtime, SignedOutcome};
use fencecheck_sqlite::{Fenced, ObjectId, publish, stage};
use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, io};
use crate::pgtls::PgConnect;
use pool::{Backend, Conn, Pool};

thread_local! {
    /// Each thread's read-only connection (see [`Store::head_here`]).
    static READER: std::cell::RefCell<Option<(std::path::PathBuf, Connection)>> =
        const { std::cell::RefCell::new(None) };
    /// Each thread's component instance for early checks (see
    /// [`Store::early_here`]), with the pool generation it was made from.
    static GUEST: std::cell::RefCell<Option<(u64, Instance)>> =
        const { std::cell::RefCell::new(None) };
}

/// How long SQLite waits for the write lock before the request gets 503.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// What a staged object stands for; stored as the object's name together
/// with the token text of the writer, so GET can report the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A body, in a blob.
    Blob,
    /// A DELETE: the key reads as absent.
    Tombstone,
}

/// The visible version of a key.
#[derive(Clone, Debug)]
pub struct Current {
    /// The staged object's id (its blob's name, after the store prefix).
    pub object: ObjectId,
    /// Body or tombstone.
    pub kind: Kind,
    /// The token text of the writer that published it.
    pub fence: String,
    /// The scope's version.
    pub version: u64,
    /// When it was published (Last-Modified).
    pub published_at: SystemTime,
    /// Its length, if the gateway recorded it (objects of older gateways
    /// did not).
    pub length: Option<u64>,
    /// The Content-Type its writer sent.
    pub content_type: Option<String>,
    /// Its S3 ETag (without quotes), if written through the S3 front.
    pub etag: Option<String>,
    /// Its S3 user metadata (a JSON object), if its writer sent any.
    pub metadata: Option<String>,
}

/// A key's state before a write: its version (0: never written; a delete
/// counts) and what is visible.
#[derive(Clone, Debug, Default)]
pub struct Head {
    /// The scope's version.
    pub version: u64,
    /// The visible object or tombstone.
    pub visible: Option<Current>,
}

impl Head {
    /// The version of the visible body, if there is one.
    pub fn body_version(&self) -> Option<u64> {
        self.visible
            .as_ref()
            .filter(|c| c.kind == Kind::Blob)
            .map(|c| c.version)
    }
}

/// What the gateway records about a staged object once its bytes are
/// stored (before the publish).
#[derive(Clone, Debug)]
pub struct Meta {
    /// Bytes.
    pub length: u64,
    /// SHA-256 of the bytes; all zero for a tombstone (never a body's).
    pub sha256: [u8; 32],
    /// Content-Type to serve.
    pub content_type: String,
    /// The Idempotency-Key it was written under.
    pub op_id: Option<String>,
    /// The S3 ETag (without quotes): MD5 or the multipart form.
    pub etag: Option<String>,
    /// S3 user metadata, a JSON object (`None`: none sent).
    pub metadata: Option<String>,
}

impl Meta {
    /// A tombstone's facts: no bytes, type or metadata.
    pub fn tombstone(op_id: Option<String>) -> Self {
        Self {
            length: 0,
            sha256: [0; 32],
            content_type: String::new(),
            op_id,
            etag: None,
            metadata: None,
        }
    }

    /// A multipart part's facts: its bytes and MD5 only (the object it
    /// becomes part of carries the type, the op-id and the metadata).
    pub fn part(length: u64, sha256: [u8; 32], etag: String) -> Self {
        Self {
            length,
            sha256,
            content_type: String::new(),
            op_id: None,
            etag: Some(etag),
            metadata: None,
        }
    }
}

/// An S3 multipart upload in progress.
#[derive(Clone, Debug)]
pub struct Upload {
    /// The fenced key it will publish.
    pub scope: String,
    /// The token text it began under (Complete's default token).
    pub fence: String,
    /// The Content-Type the object will have.
    pub content_type: Option<String>,
    /// The Idempotency-Key it began under.
    pub op_id: Option<String>,
    /// The S3 user metadata the object will have.
    pub metadata: Option<String>,
}

/// One part of an upload.
#[derive(Clone, Debug)]
pub struct Part {
    /// Its part number (1 to 10,000).
    pub number: i32,
    /// Its staged object (blob).
    pub object: ObjectId,
    /// Bytes.
    pub length: u64,
    /// Its MD5, hex.
    pub etag: String,
    /// When it was stored (ListParts' LastModified).
    pub staged_at: SystemTime,
}

/// One multipart upload in progress (ListMultipartUploads).
#[derive(Clone, Debug)]
pub struct PendingUpload {
    /// Its UploadId.
    pub id: ObjectId,
    /// The fenced key it will publish.
    pub scope: String,
    /// When it began.
    pub initiated: SystemTime,
}

/// One entry of a listing.
#[derive(Clone, Debug)]
pub struct Listed {
    /// The key.
    pub key: String,
    /// Its version (the ETag).
    pub version: u64,
    /// The writer's token text.
    pub fence: String,
    /// Last-Modified.
    pub published_at: SystemTime,
    /// Bytes, if recorded.
    pub length: Option<u64>,
    /// Content-Type, if recorded.
    pub content_type: Option<String>,
    /// The S3 ETag, if written through the S3 front.
    pub etag: Option<String>,
}

/// Database connections with their component instances.
pub struct Store {
    pool: Pool,
    /// Every blob name starts with this (empty for a store created before
    /// blob prefixes: its blobs keep their bare ids).
    id: String,
    /// SQLite writers queue here rather than in SQLite's busy handler,
    /// which sleeps and retries (slow under contention); SQLite still
    /// arbitrates between processes. PostgreSQL writers lock rows instead.
    writer: Mutex<()>,
    /// SQLite with group commit (the default): publishes share fsyncs.
    group: Option<group::GroupSync>,
}

impl Store {
    /// Open (creating if needed) the store in `dir`, deciding with `runtime`.
    pub fn open(dir: &Path, runtime: Runtime) -> Result<Self, Error> {
        std::fs::create_dir_all(dir).map_err(io("creating the data directory"))?;
        Self::with_backend(Backend::Sqlite(dir.join("fencecheck.db")), runtime, 64)
    }

    /// Open the store in the PostgreSQL database `connect` reaches (see
    /// [`PgConnect`]), at most `pool` connections, installing the layout if
    /// absent. Every gateway given the same database shares one pointer and
    /// one high-water mark per key.
    pub fn open_postgres(connect: PgConnect, runtime: Runtime, pool: usize) -> Result<Self, Error> {
        Self::with_backend(Backend::Postgres(Box::new(connect)), runtime, pool)
    }

    fn with_backend(backend: Backend, runtime: Runtime, size: usize) -> Result<Self, Error> {
        let pool = Pool::new(backend, runtime, size)?;
        let id = pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => {
                fencecheck_sqlite::install(c)?;
                install_sqlite(c)
            }
            Conn::Postgres(c) => {
                fencecheck_postgres::install(c)?;
                install_postgres(c)
            }
        })?;
        let group = pool
            .sqlite_path()
            .map(|db| group::GroupSync::new(db.to_owned()));
        Ok(Self {
            pool,
            id,
            writer: Mutex::new(()),
            group,
        })
    }

    /// SQLite: sync each publish on its own (`synchronous=FULL`) instead of
    /// in groups; for comparing the two (BENCHMARKS.md).
    pub fn per_publish_sync(mut self) -> Self {
        self.group = None;
        self
    }

    /// The prefix of this store's blob names.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Use `runtime` for every check from now on (see [`Pool::swap`]).
    pub fn swap(&self, runtime: Runtime) {
        self.pool.swap(runtime);
    }

    /// Close the pool's idle database connections (at shutdown: PostgreSQL
    /// is told goodbye rather than seeing the sockets drop).
    pub fn close_idle(&self) {
        self.pool.close_idle();
    }

    /// The turn of an SQLite writer (see `writer`); none for PostgreSQL.
    fn turn(&self) -> Option<std::sync::MutexGuard<'_, ()>> {
        if self.pool.is_sqlite() {
            self.writer.lock().ok()
        } else {
            None
        }
    }

    /// The early check: read the key's head and decide `request` against
    /// the current state without storing anything (with the head's version
    /// as the expected one if `guarded`, a precondition's). Saves an upload
    /// that is stale already; the publish decides again.
    pub fn early(
        &self,
        mut request: Request,
        guarded: bool,
    ) -> Result<(SignedOutcome, Head, Request), Error> {
        self.pool.with(|conn, guest| {
            let head = head(conn, &request.scope)?;
            if guarded {
                request.expected_version = Some(head.version);
            }
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
            let outcome = guest.decide(state.as_deref(), &request, keys.as_deref())?;
            Ok((outcome, head, request))
        })
    }

    /// [`Store::early`] on the calling thread, through its read-only
    /// connection and its own component instance (SQLite in WAL mode: reads
    /// that never wait for a writer), so a write's early check needs no hop
    /// to the blocking pool. `None` (PostgreSQL, or anything failed here):
    /// use [`Store::early`], which reports its own errors. Advisory like
    /// the pooled one: the publish decides again under the write lock.
    pub fn early_here(
        &self,
        request: &Request,
        guarded: bool,
    ) -> Option<(SignedOutcome, Head, Request)> {
        let db = self.pool.sqlite_path()?;
        let (generation, runtime) = self.pool.current_runtime().ok()?;
        READER.with(|reader| {
            GUEST.with(|guest| {
                let mut reader = reader.try_borrow_mut().ok()?;
                let mut guest = guest.try_borrow_mut().ok()?;
                if reader.as_ref().is_none_or(|(path, _)| path != db) {
                    *reader = Some((db.to_owned(), pool::reader(db).ok()?));
                }
                if guest.as_ref().is_none_or(|(g, _)| *g != generation) {
                    *guest = Some((generation, runtime.instance().ok()?));
                }
                let (_, c) = reader.as_ref()?;
                let (_, g) = guest.as_mut()?;
                let mut request = request.clone();
                let decided = (|| -> Result<_, Error> {
                    let head = head_from(head_sqlite(c, &request.scope)?)?;
                    if guarded {
                        request.expected_version = Some(head.version);
                    }
                    let state = fencecheck_sqlite::stored_state(c, &request.scope)?;
                    let keys = fencecheck_sqlite::scope_keys(c, &request.scope)?;
                    Ok((g.decide(state.as_deref(), &request, keys.as_deref())?, head))
                })();
                match decided {
                    Ok((outcome, head)) => Some((outcome, head, request)),
                    Err(_) => {
                        // A trapped guest or a failed read: start afresh next
                        // time; the pooled path answers this one.
                        *guest = None;
                        None
                    }
                }
            })
        })
    }

    /// Stage an object for `scope`; its bytes go to the blob named by its id.
    pub fn stage(&self, scope: &str, kind: Kind, fence: &str) -> Result<ObjectId, Error> {
        let name = match kind {
            Kind::Blob => format!("blob {fence}"),
            Kind::Tombstone => format!("tombstone {fence}"),
        };
        self.stage_named(scope, &name)
    }

    /// Stage an object named `name`: a blob or tombstone to publish, or
    /// one never visible itself, an S3 upload (`upload TOKEN`) or one of
    /// its parts (`part UPLOAD`).
    fn stage_named(&self, scope: &str, name: &str) -> Result<ObjectId, Error> {
        if let Some(group) = &self.group {
            // Batched with the other writes, answered at once: a staged row
            // needs no fsync of its own (see `relaxed`).
            let (scope, name) = (scope.to_owned(), name.to_owned());
            return group.run(&self.pool, &self.writer, move |conn, _| {
                let Conn::Sqlite(c) = conn else {
                    return Err(Error::Task("group commit is for SQLite".into()));
                };
                Ok((stage(c, &scope, &name, b"", SystemTime::now())?, false))
            });
        }
        let _turn = self.turn();
        self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => relaxed(c, |c| Ok(stage(c, scope, name, b"", SystemTime::now())?)),
            Conn::Postgres(c) => {
                let id = fencecheck_postgres::stage(c, scope, name, b"", SystemTime::now())?;
                Ok(ObjectId::from_raw(id.get()))
            }
        })
    }

    /// Begin an S3 multipart upload of `scope` under `fence`: the upload's
    /// id, with `meta` (its Content-Type and Idempotency-Key) recorded.
    pub fn begin_upload(&self, scope: &str, fence: &str, meta: &Meta) -> Result<ObjectId, Error> {
        let upload = self.stage_named(scope, &format!("upload {fence}"))?;
        let _turn = self.turn();
        self.pool.with(|conn, _| record(conn, upload, meta))?;
        Ok(upload)
    }

    /// An upload still kept: its scope, the token text it began under,
    /// and its Content-Type and Idempotency-Key.
    pub fn upload(&self, upload: ObjectId) -> Result<Option<Upload>, Error> {
        type Row = (
            String,
            String,
            Option<String>,
            Option<String>,
            Option<String>,
        );
        let row: Option<Row> = self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached(schema::SQLITE_UPLOAD)
                .and_then(|mut s| {
                    s.query_row([upload.get()], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                    })
                    .optional()
                })
                .map_err(sqlite("reading an upload")),
            Conn::Postgres(c) => c
                .query_opt(schema::POSTGRES_UPLOAD, &[&upload.get()])
                .map(|row| row.map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))))
                .map_err(|e| postgres_error("reading an upload", e)),
        })?;
        Ok(
            row.map(|(scope, name, content_type, op_id, metadata)| Upload {
                scope,
                fence: name.strip_prefix("upload ").unwrap_or("").to_owned(),
                content_type,
                op_id,
                metadata,
            }),
        )
    }

    /// Stage part `part` of `upload` (of `scope`); its bytes go to the
    /// blob named by the returned id.
    pub fn stage_part(&self, scope: &str, upload: ObjectId) -> Result<ObjectId, Error> {
        self.stage_named(scope, &format!("part {}", upload.get()))
    }

    /// Record a written part: its facts, and its place in the upload.
    pub fn add_part(
        &self,
        upload: ObjectId,
        part: i32,
        object: ObjectId,
        meta: &Meta,
    ) -> Result<Vec<ObjectId>, Error> {
        let _turn = self.turn();
        // One transaction: the new part in, the earlier objects of its
        // number out of the list (returned, for the caller to discard; if
        // that fails the collector takes them, as any unpublished object).
        let replaced: Vec<i64> = self.pool.with(|conn, _| {
            record(conn, object, meta)?;
            match conn {
                Conn::Sqlite(c) => relaxed(c, |c| {
                    let tx = c.transaction().map_err(sqlite("recording a part"))?;
                    let replaced = tx
                        .prepare_cached(
                            "DELETE FROM fencecheck_gateway_parts WHERE upload = ?1 AND part = ?2 RETURNING object",
                        )
                        .and_then(|mut s| {
                            s.query_map(params![upload.get(), part], |r| r.get(0))?
                                .collect::<Result<Vec<i64>, _>>()
                        })
                        .map_err(sqlite("recording a part"))?;
                    tx.prepare_cached(
                        "INSERT INTO fencecheck_gateway_parts (upload, part, object) VALUES (?1, ?2, ?3)",
                    )
                    .and_then(|mut s| s.execute(params![upload.get(), part, object.get()]))
                    .map_err(sqlite("recording a part"))?;
                    tx.commit().map_err(sqlite("recording a part"))?;
                    Ok(replaced)
                }),
                Conn::Postgres(c) => {
                    let mut tx = c
                        .transaction()
                        .map_err(|e| postgres_error("recording a part", e))?;
                    let replaced = tx
                        .query(
                            "DELETE FROM fencecheck_gateway_parts WHERE upload = $1 AND part = $2 RETURNING object",
                            &[&upload.get(), &part],
                        )
                        .map_err(|e| postgres_error("recording a part", e))?
                        .iter()
                        .map(|r| r.get(0))
                        .collect();
                    tx.execute(
                        "INSERT INTO fencecheck_gateway_parts (upload, part, object) VALUES ($1, $2, $3)",
                        &[&upload.get(), &part, &object.get()],
                    )
                    .map_err(|e| postgres_error("recording a part", e))?;
                    tx.commit()
                        .map_err(|e| postgres_error("recording a part", e))?;
                    Ok(replaced)
                }
            }
        })?;
        Ok(replaced.into_iter().map(ObjectId::from_raw).collect())
    }

    /// The parts of `upload`, by part number (the latest object of each).
    pub fn parts(&self, upload: ObjectId) -> Result<Vec<Part>, Error> {
        type Row = (i32, i64, i64, Option<String>, Option<i64>);
        let rows: Vec<Row> = self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached(schema::SQLITE_PARTS)
                .and_then(|mut s| {
                    s.query_map([upload.get()], |r| {
                        Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                    })?
                    .collect()
                })
                .map_err(sqlite("reading the parts of an upload")),
            Conn::Postgres(c) => c
                .query(schema::POSTGRES_PARTS, &[&upload.get()])
                .map(|rows| {
                    rows.iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
                        .collect()
                })
                .map_err(|e| postgres_error("reading the parts of an upload", e)),
        })?;
        let mut parts: Vec<Part> = Vec::new();
        for (number, object, length, etag, staged_at) in rows {
            let part = Part {
                number,
                object: ObjectId::from_raw(object),
                length: unsigned("length", length)?,
                etag: etag.unwrap_or_default(),
                staged_at: millis_time(staged_at),
            };
            match parts.last_mut() {
                Some(last) if last.number == number => *last = part,
                _ => parts.push(part),
            }
        }
        Ok(parts)
    }

    /// Uploads in progress begun within `since`, in (key, UploadId) order:
    /// at most `limit` whose keys start with `prefix`, after `after` (a
    /// key and an UploadId; the UploadId 0 takes every upload of that key).
    pub fn uploads(
        &self,
        prefix: &str,
        after: Option<(&str, i64)>,
        since: Duration,
        limit: usize,
    ) -> Result<Vec<PendingUpload>, Error> {
        let cutoff = cutoff_ms(since);
        let upper = upper_bound(prefix);
        // Nothing sorts below the empty key: "after ('', 0)" is everything.
        let (after_key, after_id) = after.unwrap_or(("", 0));
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<(i64, String, i64)> = self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached(schema::SQLITE_UPLOADS)
                .and_then(|mut s| {
                    s.query_map(
                        params![cutoff, prefix, upper, after_key, after_id, limit],
                        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                    )?
                    .collect()
                })
                .map_err(sqlite("listing uploads")),
            Conn::Postgres(c) => c
                .query(
                    schema::POSTGRES_UPLOADS,
                    &[&cutoff, &prefix, &upper, &after_key, &after_id, &limit],
                )
                .map(|rows| {
                    rows.iter()
                        .map(|r| (r.get(0), r.get(1), r.get(2)))
                        .collect()
                })
                .map_err(|e| postgres_error("listing uploads", e)),
        })?;
        Ok(rows
            .into_iter()
            .map(|(id, scope, at)| PendingUpload {
                id: ObjectId::from_raw(id),
                scope,
                initiated: millis_time(Some(at)),
            })
            .collect())
    }

    /// Remember that `upload` of `scope` was published as `version` with
    /// `etag` (a retried Complete gets the same answer).
    pub fn record_completed(
        &self,
        upload: ObjectId,
        scope: &str,
        version: u64,
        etag: &str,
    ) -> Result<(), Error> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let version = i64::try_from(version).map_err(|_| Error::Io {
            doing: "recording a completed upload",
            source: std::io::Error::other("the version is over i64"),
        })?;
        let _turn = self.turn();
        self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached(
                    "INSERT OR REPLACE INTO fencecheck_gateway_completed (upload, scope, version, etag, completed_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                )
                .and_then(|mut s| s.execute(params![upload.get(), scope, version, etag, now]))
                .map(|_| ())
                .map_err(sqlite("recording a completed upload")),
            Conn::Postgres(c) => c
                .execute(
                    "INSERT INTO fencecheck_gateway_completed (upload, scope, version, etag, completed_ms)
                     VALUES ($1, $2, $3, $4, $5) ON CONFLICT (upload) DO NOTHING",
                    &[&upload.get(), &scope, &version, &etag, &now],
                )
                .map(|_| ())
                .map_err(|e| postgres_error("recording a completed upload", e)),
        })
    }

    /// What `upload` of `scope` was published as, if it was (and the
    /// record is still kept): its version and ETag.
    pub fn completed(&self, upload: ObjectId, scope: &str) -> Result<Option<(u64, String)>, Error> {
        let row: Option<(i64, String)> = self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached(
                    "SELECT version, etag FROM fencecheck_gateway_completed WHERE upload = ?1 AND scope = ?2",
                )
                .and_then(|mut s| {
                    s.query_row(params![upload.get(), scope], |r| Ok((r.get(0)?, r.get(1)?)))
                        .optional()
                })
                .map_err(sqlite("reading a completed upload")),
            Conn::Postgres(c) => c
                .query_opt(
                    "SELECT version, etag FROM fencecheck_gateway_completed WHERE upload = $1 AND scope = $2",
                    &[&upload.get(), &scope],
                )
                .map(|row| row.map(|r| (r.get(0), r.get(1))))
                .map_err(|e| postgres_error("reading a completed upload", e)),
        })?;
        row.map(|(version, etag)| Ok((unsigned("version", version)?, etag)))
            .transpose()
    }

    /// Every object of `upload` (its parts, then the
    /// upload itself), for discarding.
    pub fn upload_objects(&self, upload: ObjectId) -> Result<Vec<ObjectId>, Error> {
        let rows: Vec<i64> = self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached("SELECT object FROM fencecheck_gateway_parts WHERE upload = ?1")
                .and_then(|mut s| s.query_map([upload.get()], |r| r.get(0))?.collect())
                .map_err(sqlite("reading the parts of an upload")),
            Conn::Postgres(c) => c
                .query(
                    "SELECT object FROM fencecheck_gateway_parts WHERE upload = $1",
                    &[&upload.get()],
                )
                .map(|rows| rows.iter().map(|r| r.get(0)).collect())
                .map_err(|e| postgres_error("reading the parts of an upload", e)),
        })?;
        let mut objects: Vec<ObjectId> = rows.into_iter().map(ObjectId::from_raw).collect();
        objects.push(upload);
        Ok(objects)
    }

    /// Record `meta` for `object`, then the fenced publish: check and move
    /// the pointer in one transaction (whose trigger also records the
    /// Idempotency-Key's body hash, see [`schema`]).
    pub fn publish(
        &self,
        request: &Request,
        object: ObjectId,
        meta: &Meta,
    ) -> Result<Fenced<()>, Error> {
        if let Some(group) = &self.group {
            // Batched with the other writes under way (see [`group`]): an
            // applied publish is answered after the batch's fsync.
            let (request, meta) = (request.clone(), meta.clone());
            return group.run(&self.pool, &self.writer, move |conn, guest| {
                let Conn::Sqlite(c) = conn else {
                    return Err(Error::Task("group commit is for SQLite".into()));
                };
                record_sqlite(c, object, &meta)?;
                let outcome = publish(c, guest, &request, object, SystemTime::now())?;
                let durable = matches!(outcome, Fenced::Applied { .. });
                Ok((outcome, durable))
            });
        }
        let _turn = self.turn();
        self.pool.with(|conn, guest| {
            record(conn, object, meta)?;
            match conn {
                Conn::Sqlite(c) => Ok(publish(c, guest, request, object, SystemTime::now())?),
                Conn::Postgres(c) => Ok(fencecheck_postgres::publish(
                    c,
                    guest,
                    request,
                    fencecheck_postgres::ObjectId::from_raw(object.get()),
                    SystemTime::now(),
                )?),
            }
        })
    }

    /// The body hash `op_id` was applied with on `scope` at `version`, if
    /// still recorded.
    pub fn op_hash(
        &self,
        scope: &str,
        op_id: &str,
        version: u64,
    ) -> Result<Option<Vec<u8>>, Error> {
        let version = i64::try_from(version).map_err(|_| Error::Task("version overflow".into()))?;
        self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached(
                    "SELECT sha256 FROM fencecheck_gateway_ops WHERE scope = ?1 AND op_id = ?2 AND version = ?3",
                )
                .and_then(|mut s| {
                    s.query_row(params![scope, op_id, version], |r| r.get(0))
                        .optional()
                })
                .map_err(sqlite("reading an idempotency record")),
            Conn::Postgres(c) => c
                .query_opt(
                    "SELECT sha256 FROM fencecheck_gateway_ops WHERE scope = $1 AND op_id = $2 AND version = $3",
                    &[&scope, &op_id, &version],
                )
                .map(|row| row.map(|r| r.get(0)))
                .map_err(|e| postgres_error("reading an idempotency record", e)),
        })
    }

    /// Drop the row of an object that was not published, unless a pointer
    /// references it; `true` if it is gone (its blob may go too).
    pub fn discard(&self, object: ObjectId) -> Result<bool, Error> {
        let _turn = self.turn();
        self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => relaxed(c, |c| {
                c.prepare_cached(schema::SQLITE_DISCARD)
                    .and_then(|mut s| s.execute([object.get()]))
                    .map(|n| n == 1)
                    .map_err(sqlite("discarding an object"))
            }),
            Conn::Postgres(c) => Ok(fencecheck_postgres::discard(
                c,
                fencecheck_postgres::ObjectId::from_raw(object.get()),
            )?),
        })
    }

    /// The key's head: version and visible object (tombstones included).
    pub fn head(&self, scope: &str) -> Result<Head, Error> {
        self.pool.with(|conn, _| head(conn, scope))
    }

    /// The key's head read on the calling thread, through a read-only
    /// connection of its own (SQLite in WAL mode: one indexed read that
    /// never waits for a writer), so a GET needs no hop to the blocking
    /// pool. `None` (PostgreSQL, or the reader failed): use [`Store::head`].
    pub fn head_here(&self, scope: &str) -> Option<Head> {
        let db = self.pool.sqlite_path()?;
        READER.with(|slot| {
            let mut slot = slot.try_borrow_mut().ok()?;
            if slot.as_ref().is_none_or(|(path, _)| path != db) {
                *slot = Some((db.to_owned(), pool::reader(db).ok()?));
            }
            let (_, reader) = slot.as_ref()?;
            head_sqlite(reader, scope).and_then(head_from).ok()
        })
    }

    /// Up to `limit` visible objects with keys starting with `prefix`, after
    /// `after`, in byte order of their keys.
    pub fn list(
        &self,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<Listed>, Error> {
        let upper = upper_bound(prefix);
        let after = after.unwrap_or("");
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.pool.with(|conn, _| {
            let rows: Vec<ListRow> = match conn {
                Conn::Sqlite(c) => c
                    .prepare_cached(schema::SQLITE_LIST)
                    .and_then(|mut s| {
                        s.query_map(params![prefix, after, upper, limit], |r| {
                            Ok((
                                r.get(0)?,
                                r.get(1)?,
                                r.get(2)?,
                                r.get(3)?,
                                r.get(4)?,
                                r.get(5)?,
                                r.get(6)?,
                            ))
                        })?
                        .collect()
                    })
                    .map_err(sqlite("listing objects"))?,
                Conn::Postgres(c) => c
                    .query(schema::POSTGRES_LIST, &[&prefix, &after, &upper, &limit])
                    .map_err(|e| postgres_error("listing objects", e))?
                    .iter()
                    .map(|r| {
                        (
                            r.get(0),
                            r.get(1),
                            r.get(2),
                            r.get(3),
                            r.get(4),
                            r.get(5),
                            r.get(6),
                        )
                    })
                    .collect(),
            };
            rows.into_iter()
                .map(|(key, version, at, name, length, content_type, etag)| {
                    let (_, fence) = parse_name(&name)?;
                    Ok(Listed {
                        key,
                        version: unsigned("version", version)?,
                        fence: fence.to_owned(),
                        published_at: millis_time(at),
                        length: length.map(|n| unsigned("length", n)).transpose()?,
                        content_type,
                        etag,
                    })
                })
                .collect()
        })
    }

    /// A liveness probe: one query on a pooled connection.
    pub fn ping(&self) -> Result<(), Error> {
        self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .query_row("SELECT 1", [], |_| Ok(()))
                .map_err(sqlite("probing")),
            Conn::Postgres(c) => c
                .simple_query("SELECT 1")
                .map(|_| ())
                .map_err(|source| postgres_error("probing", source)),
        })
    }

    /// One bounded collection batch: at most `batch` unreferenced objects
    /// staged more than `retention` ago (S3 uploads and their parts:
    /// `upload_retention`) lose their rows; returns their ids, whose blobs
    /// may go. A row a publish points at in between is kept.
    pub fn collect(
        &self,
        retention: Duration,
        upload_retention: Duration,
        batch: usize,
    ) -> Result<Vec<ObjectId>, Error> {
        let cutoff = cutoff_ms(retention);
        let upload_cutoff = cutoff_ms(upload_retention);
        let outer = cutoff.max(upload_cutoff);
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let _turn = self.turn();
        // Completed uploads' answers are kept as long as unpublished blobs.
        self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached("DELETE FROM fencecheck_gateway_completed WHERE completed_ms < ?1")
                .and_then(|mut s| s.execute([cutoff]))
                .map(|_| ())
                .map_err(sqlite("pruning completed uploads")),
            Conn::Postgres(c) => c
                .execute(
                    "DELETE FROM fencecheck_gateway_completed WHERE completed_ms < $1",
                    &[&cutoff],
                )
                .map(|_| ())
                .map_err(|e| postgres_error("pruning completed uploads", e)),
        })?;
        let ids: Vec<i64> = self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => c
                .prepare_cached(schema::SQLITE_COLLECT)
                .and_then(|mut s| {
                    s.query_map([outer, batch, cutoff, upload_cutoff], |r| r.get(0))?
                        .collect()
                })
                .map_err(sqlite("collecting unreferenced objects")),
            Conn::Postgres(c) => {
                let mut tx = c
                    .build_transaction()
                    .isolation_level(postgres::IsolationLevel::ReadCommitted)
                    .start()
                    .map_err(|e| postgres_error("beginning a collection batch", e))?;
                let locked: Vec<i64> = tx
                    .query(
                        schema::POSTGRES_LOCK_GARBAGE,
                        &[&outer, &batch, &cutoff, &upload_cutoff],
                    )
                    .map_err(|e| postgres_error("locking unreferenced objects", e))?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                let gone = if locked.is_empty() {
                    Vec::new()
                } else {
                    tx.query(schema::POSTGRES_DELETE_UNREFERENCED, &[&locked])
                        .map_err(|e| postgres_error("collecting unreferenced objects", e))?
                        .iter()
                        .map(|r| r.get(0))
                        .collect()
                };
                tx.commit()
                    .map_err(|e| postgres_error("committing a collection batch", e))?;
                Ok(gone)
            }
        })?;
        Ok(ids.into_iter().map(ObjectId::from_raw).collect())
    }

    /// Which of `ids` still have a row (one query for a batch).
    pub fn existing(&self, ids: &[i64]) -> Result<Vec<i64>, Error> {
        self.pool.with(|conn, _| match conn {
            Conn::Sqlite(c) => {
                let mut found = Vec::new();
                let mut s = c
                    .prepare_cached("SELECT 1 FROM fencecheck_objects WHERE id = ?1")
                    .map_err(sqlite("looking up objects"))?;
                for id in ids {
                    if s.query_row([id], |_| Ok(()))
                        .optional()
                        .map_err(sqlite("looking up objects"))?
                        .is_some()
                    {
                        found.push(*id);
                    }
                }
                Ok(found)
            }
            Conn::Postgres(c) => c
                .query(
                    "SELECT id FROM fencecheck_objects WHERE id = ANY($1)",
                    &[&ids],
                )
                .map(|rows| rows.iter().map(|r| r.get(0)).collect())
                .map_err(|source| postgres_error("looking up objects", source)),
        })
    }
}

fn sqlite(doing: &'static str) -> impl FnOnce(rusqlite::Error) -> Error {
    move |source| Error::Sqlite { doing, source }
}

fn postgres_error(doing: &'static str, source: postgres::Error) -> Error {
    Error::Postgres(fencecheck_postgres::Error::Postgres { doing, source })
}

fn unsigned(what: &'static str, n: i64) -> Result<u64, Error> {
    u64::try_from(n).map_err(|_| Error::Task(format!("stored {what} {n} is negative")))
}

/// The time `ago` before now, in ms since the epoch (a store's clock).
fn cutoff_ms(ago: Duration) -> i64 {
    SystemTime::now()
        .checked_sub(ago)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn millis_time(ms: Option<i64>) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms.and_then(|m| u64::try_from(m).ok()).unwrap_or(0))
}

/// The least string above every string that starts with `prefix` (`None`
/// for the empty prefix): its last character plus one, skipping surrogates.
/// UTF-8 byte order is code point order, so this bounds a key range.
fn upper_bound(prefix: &str) -> Option<String> {
    let mut chars: Vec<char> = prefix.chars().collect();
    while let Some(last) = chars.pop() {
        let next = match u32::from(last) {
            0xD7FF => Some('\u{E000}'),
            n => char::from_u32(n + 1),
        };
        if let Some(next) = next {
            chars.push(next);
            return Some(chars.into_iter().collect());
        }
    }
    None
}

fn random_id() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(io("reading /dev/urandom for the store id"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

fn install_sqlite(c: &mut Connection) -> Result<String, Error> {
    let tx = c
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(sqlite("beginning the gateway install"))?;
    let legacy: bool = tx
        .query_row(
            "SELECT NOT EXISTS (SELECT 1 FROM sqlite_master WHERE name = 'fencecheck_gateway_meta')
                 AND EXISTS (SELECT 1 FROM fencecheck_objects)",
            [],
            |r| r.get(0),
        )
        .map_err(sqlite("inspecting the database"))?;
    tx.execute_batch(schema::SQLITE)
        .map_err(sqlite("creating the gateway tables"))?;
    // Columns added since the table was first made (SQLite has no
    // ADD COLUMN IF NOT EXISTS: run each only where it is missing).
    for (column, alter) in [
        ("etag", schema::SQLITE_ETAG),
        ("metadata", schema::SQLITE_METADATA),
    ] {
        let has: bool = tx
            .query_row(
                "SELECT EXISTS (SELECT 1 FROM pragma_table_info('fencecheck_gateway_objects') WHERE name = ?1)",
                [column],
                |r| r.get(0),
            )
            .map_err(sqlite("inspecting the gateway tables"))?;
        if !has {
            tx.execute_batch(alter)
                .map_err(sqlite("adding a gateway column"))?;
        }
    }
    // A store that already holds objects from before blob prefixes keeps
    // bare ids as blob names ("").
    let id = if legacy { String::new() } else { random_id()? };
    tx.execute(
        "INSERT OR IGNORE INTO fencecheck_gateway_meta (key, value) VALUES ('store', ?1)",
        [&id],
    )
    .map_err(sqlite("recording the store id"))?;
    let id: String = tx
        .query_row(
            "SELECT value FROM fencecheck_gateway_meta WHERE key = 'store'",
            [],
            |r| r.get(0),
        )
        .map_err(sqlite("reading the store id"))?;
    tx.commit()
        .map_err(sqlite("committing the gateway install"))?;
    Ok(id)
}

fn install_postgres(c: &mut postgres::Client) -> Result<String, Error> {
    let pg = |doing| move |e| postgres_error(doing, e);
    let mut tx = c
        .transaction()
        .map_err(pg("beginning the gateway install"))?;
    // Gateways starting together take turns (DDL races otherwise).
    tx.execute("SELECT pg_advisory_xact_lock(7460911273)", &[])
        .map_err(pg("locking the gateway install"))?;
    let legacy: bool = tx
        .query_one(
            "SELECT to_regclass('fencecheck_gateway_meta') IS NULL
                AND EXISTS (SELECT 1 FROM fencecheck_objects)",
            &[],
        )
        .map_err(pg("inspecting the database"))?
        .get(0);
    tx.batch_execute(schema::POSTGRES)
        .map_err(pg("creating the gateway tables"))?;
    tx.batch_execute(schema::POSTGRES_ETAG)
        .map_err(pg("adding the etag column"))?;
    tx.batch_execute(schema::POSTGRES_METADATA)
        .map_err(pg("adding the metadata column"))?;
    let id = if legacy { String::new() } else { random_id()? };
    tx.execute(
        "INSERT INTO fencecheck_gateway_meta (key, value) VALUES ('store', $1) ON CONFLICT DO NOTHING",
        &[&id],
    )
    .map_err(pg("recording the store id"))?;
    let id: String = tx
        .query_one(
            "SELECT value FROM fencecheck_gateway_meta WHERE key = 'store'",
            &[],
        )
        .map_err(pg("reading the store id"))?
        .get(0);
    tx.commit().map_err(pg("committing the gateway install"))?;
    Ok(id)
}

/// Insert `meta` (before the publish; in SQLite not synced on its own: the
/// publish's commit syncs the WAL, and a lost row only loses metadata of an
/// object that was then never published either).
fn record(conn: &mut Conn, object: ObjectId, meta: &Meta) -> Result<(), Error> {
    let length = i64::try_from(meta.length).map_err(|_| Error::Task("length overflow".into()))?;
    match conn {
        Conn::Sqlite(c) => relaxed(c, |c| record_sqlite(c, object, meta)),
        Conn::Postgres(c) => c
            .execute(
                "INSERT INTO fencecheck_gateway_objects (object, length, sha256, content_type, op_id, etag, metadata)
                 VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (object) DO NOTHING",
                &[
                    &object.get(),
                    &length,
                    &&meta.sha256[..],
                    &meta.content_type,
                    &meta.op_id,
                    &meta.etag,
                    &meta.metadata,
                ],
            )
            .map(|_| ())
            .map_err(|e| postgres_error("recording an object", e)),
    }
}

/// Run `f` with `synchronous=NORMAL`: its commit is not fsynced on its own.
/// Safe for staging, recording and discarding: a WAL commit is durable once
/// any later commit is synced, so a publish's sync makes the rows before it
/// durable too, and a lost staging or discard only leaves work for the
/// collector. Publishes under group commit sync afterwards ([`group`]).
/// The connection is back at FULL afterwards, or it is not reused.
fn relaxed<T>(
    conn: &mut Connection,
    f: impl FnOnce(&mut Connection) -> Result<T, Error>,
) -> Result<T, Error> {
    let sync = |conn: &Connection, level: &str| {
        conn.pragma_update(None, "synchronous", level)
            .map_err(sqlite("setting synchronous"))
    };
    sync(conn, "NORMAL")?;
    let result = f(conn);
    sync(conn, "FULL")?;
    result
}

/// [`record`] on SQLite, at the connection's current `synchronous`.
fn record_sqlite(c: &Connection, object: ObjectId, meta: &Meta) -> Result<(), Error> {
    let length = i64::try_from(meta.length).map_err(|_| Error::Task("length overflow".into()))?;
    c.prepare_cached(
        "INSERT OR REPLACE INTO fencecheck_gateway_objects (object, length, sha256, content_type, op_id, etag, metadata)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    )
    .and_then(|mut s| {
        s.execute(params![
            object.get(),
            length,
            &meta.sha256[..],
            meta.content_type,
            meta.op_id,
            meta.etag,
            meta.metadata
        ])
    })
    .map(|_| ())
    .map_err(sqlite("recording an object"))
}

/// Split a stored object name: `blob TOKEN` or `tombstone TOKEN`.
fn parse_name(name: &str) -> Result<(Kind, &str), Error> {
    match name.split_once(' ') {
        Some(("blob", fence)) => Ok((Kind::Blob, fence)),
        Some(("tombstone", fence)) => Ok((Kind::Tombstone, fence)),
        // Not written by the gateway: fail closed rather than guess.
        _ => Err(Error::Io {
            doing: "reading the visible object",
            source: std::io::Error::other(format!("unknown object name {name:?}")),
        }),
    }
}

type ListRow = (
    String,
    i64,
    Option<i64>,
    String,
    Option<i64>,
    Option<String>,
    Option<String>,
);

type HeadRow = (
    i64,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn head_sqlite(c: &Connection, scope: &str) -> Result<Option<HeadRow>, Error> {
    c.prepare_cached(schema::SQLITE_HEAD)
        .and_then(|mut s| {
            s.query_row([scope], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                ))
            })
            .optional()
        })
        .map_err(sqlite("reading the visible object"))
}

fn head(conn: &mut Conn, scope: &str) -> Result<Head, Error> {
    let row = match conn {
        Conn::Sqlite(c) => head_sqlite(c, scope)?,
        Conn::Postgres(c) => c
            .query_opt(schema::POSTGRES_HEAD, &[&scope])
            .map_err(|e| postgres_error("reading the visible object", e))?
            .map(|r| {
                (
                    r.get(0),
                    r.get(1),
                    r.get(2),
                    r.get(3),
                    r.get(4),
                    r.get(5),
                    r.get(6),
                    r.get(7),
                )
            }),
    };
    head_from(row)
}

fn head_from(row: Option<HeadRow>) -> Result<Head, Error> {
    let Some((version, at, object, name, length, content_type, etag, metadata)) = row else {
        return Ok(Head::default());
    };
    let version = unsigned("version", version)?;
    let visible = match (object, name) {
        (Some(object), Some(name)) => {
            let (kind, fence) = parse_name(&name)?;
            Some(Current {
                object: ObjectId::from_raw(object),
                kind,
                fence: fence.to_owned(),
                version,
                published_at: millis_time(at),
                length: length.map(|n| unsigned("length", n)).transpose()?,
                content_type,
                etag,
                metadata,
            })
        }
        _ => None,
    };
    Ok(Head { version, visible })
}

#[cfg(test)]
mod tests {
    use super::{Kind, Meta, Store, schema, upper_bound};

    /// Writes from many threads at once go through group commit's batches
    /// (stage and publish interleaved): each is answered by its own fenced
    /// decision (per key, exactly one of the writers holding the same
    /// token is applied, and accepted versions rise with no gaps), every
    /// applied publish was covered by an fsync, and batches and fsyncs are
    /// fewer than writes. Barriers start all writers together.
    #[test]
    fn batched_writes_keep_every_decision() -> Result<(), Box<dyn std::error::Error>> {
        use fencecheck::{Policy, Request, Token};
        use fencecheck_sqlite::Fenced;
        use std::sync::{Arc, Barrier};
        const THREADS: usize = 16;
        const ROUNDS: u64 = 20;
        let dir = tempfile::tempdir()?;
        let store = Arc::new(Store::open(dir.path(), fencecheck::Runtime::new()?)?);
        let barrier = Arc::new(Barrier::new(THREADS));
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (store, barrier) = (store.clone(), barrier.clone());
                std::thread::spawn(move || -> Result<Vec<(String, u64, u64)>, String> {
                    let mut applied = Vec::new();
                    // Four threads per key; each round's token is shared by
                    // the four, so exactly one of them may apply it.
                    let key = format!("k{}", t % 4);
                    for round in 1..=ROUNDS {
                        barrier.wait();
                        let fence = format!("0.{round}");
                        let object = store
                            .stage(&key, Kind::Blob, &fence)
                            .map_err(|e| e.to_string())?;
                        let request = Request::new(&key, Token::new(0, 0, round), Policy::Strict);
                        let meta = Meta::part(1, [1; 32], "e".into());
                        match store
                            .publish(&request, object, &meta)
                            .map_err(|e| e.to_string())?
                        {
                            Fenced::Applied { version, .. } => {
                                applied.push((key.clone(), round, version));
                            }
                            Fenced::Rejected(_) => {}
                        }
                    }
                    Ok(applied)
                })
            })
            .collect();
        let mut applied = Vec::new();
        for worker in workers {
            applied.extend(worker.join().map_err(|_| "a writer panicked")??);
        }
        applied.sort();
        for k in 0..4 {
            let key = format!("k{k}");
            let mine: Vec<(u64, u64)> = applied
                .iter()
                .filter(|(a, _, _)| *a == key)
                .map(|(_, r, v)| (*r, *v))
                .collect();
            let expected: Vec<(u64, u64)> = (1..=ROUNDS).map(|r| (r, r)).collect();
            assert_eq!(
                mine, expected,
                "{key}: one applied writer per token, versions 1, 2, …"
            );
        }
        let group = store.group.as_ref().ok_or("no group commit")?;
        let (syncs, batches) = group.counts();
        let writes = (THREADS as u64) * ROUNDS * 2;
        assert!(
            syncs >= 1 && syncs <= batches,
            "{syncs} fsyncs, {batches} batches"
        );
        assert!(batches < writes, "{batches} batches for {writes} writes");
        Ok(())
    }

    /// The statements of the hot path reach rows through an index: none
    /// scans every pointer or every object, so their work does not grow
    /// with the number of keys. (The collector's batch is bounded in rows
    /// deleted, not in rows read: it skips every old object still visible.)
    #[test]
    fn hot_path_statements_use_indexes() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let _store = Store::open(dir.path(), fencecheck::Runtime::new()?)?;
        let conn = rusqlite::Connection::open(dir.path().join("fencecheck.db"))?;
        let ops_prune = "DELETE FROM fencecheck_gateway_ops WHERE scope = ?1 AND version <= \
             (SELECT version FROM fencecheck_gateway_ops WHERE scope = ?1 \
              ORDER BY version DESC LIMIT 1 OFFSET 64)";
        let op_hash = "SELECT sha256 FROM fencecheck_gateway_ops WHERE scope = ?1 AND op_id = ?2 AND version = ?3";
        for sql in [
            schema::SQLITE_HEAD,
            schema::SQLITE_DISCARD,
            schema::SQLITE_LIST,
            ops_prune,
            op_hash,
        ] {
            let mut plan = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}"))?;
            let nulls = std::iter::repeat_n(rusqlite::types::Null, plan.parameter_count());
            let steps: Vec<String> = plan
                .query_map(rusqlite::params_from_iter(nulls), |r| r.get::<_, String>(3))?
                .collect::<Result<_, _>>()?;
            for step in &steps {
                assert!(
                    !step.starts_with("SCAN"),
                    "{sql}\nscans: {step} (plan: {steps:?})"
                );
            }
        }
        Ok(())
    }

    /// A store made before the S3 front's columns (`etag`, `metadata`)
    /// gets them when a gateway opens it, and keeps its rows.
    #[test]
    fn older_stores_gain_the_s3_columns() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        drop(Store::open(dir.path(), fencecheck::Runtime::new()?)?);
        let conn = rusqlite::Connection::open(dir.path().join("fencecheck.db"))?;
        conn.execute(
            "INSERT INTO fencecheck_gateway_objects (object, length, sha256, content_type) VALUES (7, 1, x'00', 'text/plain')",
            [],
        )?;
        for column in ["etag", "metadata"] {
            conn.execute_batch(&format!(
                "ALTER TABLE fencecheck_gateway_objects DROP COLUMN {column}"
            ))?;
        }
        drop(Store::open(dir.path(), fencecheck::Runtime::new()?)?);
        let (etag, metadata, kept): (Option<String>, Option<String>, i64) = conn.query_row(
            "SELECT etag, metadata, length FROM fencecheck_gateway_objects WHERE object = 7",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        assert_eq!((etag, metadata, kept), (None, None, 1));
        Ok(())
    }

    #[test]
    fn upper_bounds() {
        assert_eq!(upper_bound(""), None);
        assert_eq!(upper_bound("ab").as_deref(), Some("ac"));
        assert_eq!(upper_bound("a/").as_deref(), Some("a0"));
        assert_eq!(upper_bound("a\u{D7FF}").as_deref(), Some("a\u{E000}"));
        assert_eq!(upper_bound("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(upper_bound("\u{10FFFF}"), None);
    }
}
