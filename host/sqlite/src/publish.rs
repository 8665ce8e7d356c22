//! The seed's publish protocol: immutable objects staged under unique keys, a
//! fenced catalog pointer, and an asynchronous collector. The publisher never
//! deletes the object it replaces; only the collector deletes, and never an
//! object the catalog references or one staged within the retention window.

use std::convert::Infallible;
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencecheck::{Checker, MAX_SCOPE_BYTES, Request};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::apply::{self, Recorded};
use crate::error::sql;
use crate::fence::{Store, run};
use crate::{Error, Fenced};

/// A staged object's key: assigned by SQLite, unique for the life of the
/// database (never reused, even after the object is collected).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId(i64);

impl ObjectId {
    /// An id as stored (e.g. read back from another process's output).
    pub const fn from_raw(id: i64) -> Self {
        Self(id)
    }

    /// The stored integer.
    pub const fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The object a scope's catalog pointer makes visible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Visible {
    /// Its key.
    pub object: ObjectId,
    /// The name it was staged with.
    pub name: String,
    /// Its bytes.
    pub body: Vec<u8>,
    /// The scope's version when it was published.
    pub version: u64,
    /// When it was published (the time passed to [`publish`]).
    pub published_at: SystemTime,
}

/// What one collection pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Objects deleted.
    pub deleted: u64,
}

/// Objects deleted per collector transaction, so a large backlog never holds
/// the write lock for long.
const GC_BATCH: i64 = 512;

fn millis(what: &'static str, t: SystemTime) -> Result<i64, Error> {
    let since = t.duration_since(UNIX_EPOCH).map_err(|_| Error::Invalid {
        what,
        why: "before 1970-01-01".into(),
    })?;
    i64::try_from(since.as_millis()).map_err(|_| Error::Invalid {
        what,
        why: "too far in the future".into(),
    })
}

fn check_scope(scope: &str) -> Result<(), Error> {
    if scope.is_empty() || scope.len() > MAX_SCOPE_BYTES {
        return Err(Error::Invalid {
            what: "scope",
            why: format!("must be 1 to {MAX_SCOPE_BYTES} bytes, got {}", scope.len()),
        });
    }
    Ok(())
}

/// Stage an immutable object for `scope` (step 2 of the seed's protocol).
///
/// It is invisible until [`publish`] moves the scope's pointer to it, and
/// collectable once unreferenced and older than the retention window. `now`
/// is the stager's clock; the collector compares it with its own `now`.
pub fn stage(
    conn: &Connection,
    scope: &str,
    name: &str,
    body: &[u8],
    now: SystemTime,
) -> Result<ObjectId, Error> {
    check_scope(scope)?;
    let at = millis("staging time", now)?;
    conn.prepare_cached(
        "INSERT INTO fencecheck_objects (scope, name, body, staged_at_ms)
         VALUES (?1, ?2, ?3, ?4) RETURNING id",
    )
    .and_then(|mut s| s.query_row(params![scope, name, body, at], |r| r.get(0)))
    .map(ObjectId)
    .map_err(sql("staging an object"))
}

/// Fenced publish: check `request` and, only on `applied`, point the scope's
/// catalog entry at `object` and store the new fence state, atomically. The
/// object replaced stays in place for the collector.
///
/// `object` must be staged under `request.scope`, else [`Error::UnknownObject`]
/// and nothing changes.
///
/// A publish to an existing scope is ONE statement: an UPDATE that runs the
/// check itself (through a function this crate registers on `conn`), writes
/// only on `applied`, and, in autocommit mode, is its own write transaction
/// (SQLite takes the write lock before the statement reads the row). The
/// first publish of a scope, an object not staged under it, a `conn` already
/// inside a transaction, or a row that statement does not expect take the
/// read-then-write path instead, in one `BEGIN IMMEDIATE` transaction. The
/// outcome is the same either way.
pub fn publish<C>(
    conn: &mut Connection,
    checker: &mut C,
    request: &Request,
    object: ObjectId,
    now: SystemTime,
) -> Result<Fenced<()>, Error>
where
    C: Checker + ?Sized,
{
    let result = publish_unrecorded(conn, checker, request, object, now);
    fencecheck::record_decision("publish", Some(request.token), &result);
    result
}

fn publish_unrecorded<C>(
    conn: &mut Connection,
    checker: &mut C,
    request: &Request,
    object: ObjectId,
    now: SystemTime,
) -> Result<Fenced<()>, Error>
where
    C: Checker + ?Sized,
{
    let at_ms = millis("publication time", now)?;
    if conn.is_autocommit() {
        let (changed, recorded) = {
            let mut decide = |state: Option<&[u8]>| checker.decide(state, request, None);
            apply::publish_one(conn, &mut decide, &request.scope, object.get(), at_ms)
        };
        match (changed, recorded) {
            // Committed by the statement itself.
            (Ok(1), Recorded::Applied { version, highest }) => {
                return Ok(Fenced::Applied {
                    version,
                    highest,
                    value: (),
                });
            }
            // The function raised: the statement changed nothing.
            (Err(_), Recorded::Rejected(rejection)) => return Ok(Fenced::Rejected(rejection)),
            (Err(_), Recorded::Failed(e)) => return Err(Error::Check(e)),
            (_, Recorded::Panicked(payload)) => std::panic::resume_unwind(payload),
            // No row for the scope yet, or the object is not staged under it
            // (the check did not run), or a row it would not decide for.
            (Ok(0), _) | (Err(_), Recorded::Fallback) => {}
            (Err(e), _) => return Err(sql("publishing the catalog pointer")(e)),
            // A row changed without this crate's decision: unreachable while
            // the function's name is private to this process.
            (Ok(n), _) => {
                return Err(sql("publishing the catalog pointer")(
                    rusqlite::Error::StatementChangedRows(n),
                ));
            }
        }
    }
    run(
        conn,
        checker,
        request,
        Store::Publish { object, at_ms },
        |_, _| Ok::<(), Infallible>(()),
    )
}

/// The object `scope`'s catalog pointer makes visible, read in one statement
/// (pointer and bytes from the same snapshot); `None` before the first publish.
pub fn visible(conn: &Connection, scope: &str) -> Result<Option<Visible>, Error> {
    let row = conn
        .prepare_cached(
            "SELECT o.id, o.name, o.body, s.version, s.published_at_ms
               FROM fencecheck_scopes s
               JOIN fencecheck_objects o ON o.id = s.visible_object
              WHERE s.scope = ?1",
        )
        .and_then(|mut s| {
            s.query_row([scope], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, Vec<u8>>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                ))
            })
            .optional()
        })
        .map_err(sql("reading the visible object"))?;
    let Some((id, name, body, version, at_ms)) = row else {
        return Ok(None);
    };
    let version = u64::try_from(version).map_err(|_| Error::OutOfRange {
        what: "version",
        value: version,
    })?;
    let at = u64::try_from(at_ms).map_err(|_| Error::OutOfRange {
        what: "published_at_ms",
        value: at_ms,
    })?;
    Ok(Some(Visible {
        object: ObjectId(id),
        name,
        body,
        version,
        published_at: UNIX_EPOCH + Duration::from_millis(at),
    }))
}

/// Delete an object its owner staged but could not publish (after a
/// `stale-fence`, say). Deletes nothing, and returns `false`, if any catalog
/// pointer references it; the check and the delete are one statement.
pub fn discard(conn: &Connection, object: ObjectId) -> Result<bool, Error> {
    let deleted = conn
        .prepare_cached(
            "DELETE FROM fencecheck_objects
              WHERE id = ?1
                AND id NOT IN (SELECT visible_object FROM fencecheck_scopes
                                WHERE visible_object IS NOT NULL)",
        )
        .and_then(|mut s| s.execute([object.0]))
        .map_err(sql("discarding an object"))?;
    Ok(deleted == 1)
}

/// The asynchronous collector: delete every object that no catalog pointer
/// references and that was staged at least `retention` before `now`.
///
/// This is also crash recovery: an object staged by a writer that died before
/// publishing was never visible, and is deleted once the window has passed.
/// The window must exceed the longest a writer may take between staging and
/// publishing; a writer slower than that gets [`Error::UnknownObject`] from
/// [`publish`], never a dangling pointer. Works in batches, each its own
/// transaction that reads reachability and deletes together.
pub fn collect_garbage(
    conn: &mut Connection,
    now: SystemTime,
    retention: Duration,
) -> Result<GcReport, Error> {
    let now_ms = millis("collection time", now)?;
    let keep_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now_ms.saturating_sub(keep_ms);
    let mut report = GcReport::default();
    loop {
        let tx = conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("beginning a collection batch"))?;
        // `IS NOT NULL` matters: `x NOT IN (…, NULL)` is NULL, never true, so
        // one scope without a pointer would otherwise stop all collection.
        let deleted = tx
            .prepare_cached(
                "DELETE FROM fencecheck_objects WHERE id IN (
                   SELECT id FROM fencecheck_objects
                    WHERE staged_at_ms <= ?1
                      AND id NOT IN (SELECT visible_object FROM fencecheck_scopes
                                      WHERE visible_object IS NOT NULL)
                    ORDER BY id LIMIT ?2)",
            )
            .and_then(|mut s| s.execute(params![cutoff, GC_BATCH]))
            .map_err(sql("collecting unreferenced objects"))?;
        tx.commit().map_err(sql("committing a collection batch"))?;
        report.deleted += deleted as u64;
        if (deleted as i64) < GC_BATCH {
            return Ok(report);
        }
    }
}
