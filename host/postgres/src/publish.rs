//! The seed's publish protocol: immutable objects staged under unique keys, a
//! fenced catalog pointer, and an asynchronous collector. The publisher never
//! deletes the object it replaces; only the collector deletes, and never an
//! object the catalog references or one staged within the retention window.
//!
//! # Publish against collect (READ COMMITTED)
//!
//! The collector's "unreferenced?" test and its `DELETE` cannot be one
//! statement: a `DELETE … WHERE NOT EXISTS (pointer)` that waits for a row
//! lock proceeds after the wait without re-evaluating the subquery (the row
//! itself did not change), so it would delete an object a publish had just
//! pointed at. Instead rows are locked, and the reference is re-checked by a
//! later statement (a fresh snapshot):
//!
//! - [`publish`], inside the fenced transaction, locks the object's row
//!   `FOR KEY SHARE` (which also proves it is staged under the scope) before
//!   moving the pointer to it, and holds that lock until it commits.
//! - [`collect_garbage`] (and [`discard`]) lock candidates `FOR UPDATE`,
//!   which conflicts with `KEY SHARE`; the collector `SKIP LOCKED`s, so it
//!   never waits on a publisher. Then a separate `DELETE` statement re-checks
//!   that no pointer references the row and deletes it.
//!
//! Either the publish locks first: the collector skips the row, or locks it
//! only after the publish committed, and then its `DELETE`'s snapshot (taken
//! after the lock was granted) sees the pointer and keeps the row. Or the
//! collector locks first: the publish waits, finds the row deleted, and
//! fails with [`Error::UnknownObject`] (rolled back: no dangling pointer,
//! the token not used up). Neither waits for a lock the other may hold
//! while waiting, so no deadlock. The collector and [`discard`] run their
//! transactions at READ COMMITTED explicitly, whatever the session default,
//! since the re-check relies on a new snapshot per statement.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fencecheck::{Checker, MAX_SCOPE_BYTES, Request};
use postgres::{Client, IsolationLevel, Transaction};

use crate::error::pg;
use crate::fence::{commit, run};
use crate::{Error, Fenced};

/// A staged object's key: assigned by PostgreSQL (an identity column), unique
/// for the life of the database (never reused, even after the object is
/// collected).
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
/// many row locks for long.
const GC_BATCH: i64 = 512;

// Proves the object is staged under the scope and keeps it from being
// deleted until the publish commits (see the module docs).
const LOCK_OBJECT: &str = "SELECT 1 FROM fencecheck_objects WHERE id = $1 AND scope = $2 \
     FOR KEY SHARE";

const POINT: &str = "UPDATE fencecheck_scopes SET visible_object = $2, published_at_ms = $3 \
     WHERE scope = $1";

// Candidates: old enough, unreferenced in this statement's snapshot, and not
// locked by anyone (a publish pointing at one holds KEY SHARE).
const LOCK_GARBAGE: &str = "
SELECT o.id FROM fencecheck_objects o
 WHERE o.staged_at_ms <= $1
   AND NOT EXISTS (SELECT 1 FROM fencecheck_scopes s WHERE s.visible_object = o.id)
 ORDER BY o.id
 LIMIT $2
 FOR UPDATE SKIP LOCKED";

// The re-check, in a later statement than the lock: a pointer committed
// before the lock was granted is visible here. NOT EXISTS, not NOT IN: a
// scope without a pointer (NULL) must not stop collection.
const DELETE_UNREFERENCED: &str = "
DELETE FROM fencecheck_objects o
 WHERE o.id = ANY($1)
   AND NOT EXISTS (SELECT 1 FROM fencecheck_scopes s WHERE s.visible_object = o.id)";

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

/// A READ COMMITTED transaction whatever the session's default (the
/// collector's re-check needs a new snapshot per statement).
fn read_committed<'a>(
    client: &'a mut Client,
    doing: &'static str,
) -> Result<Transaction<'a>, Error> {
    client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .map_err(pg(doing))
}

/// Stage an immutable object for `scope` (step 2 of the seed's protocol).
///
/// It is invisible until [`publish`] moves the scope's pointer to it, and
/// collectable once unreferenced and older than the retention window. `now`
/// is the stager's clock; the collector compares it with its own `now`.
/// `body` may be empty (bytes kept elsewhere, the row only names them).
pub fn stage(
    client: &mut Client,
    scope: &str,
    name: &str,
    body: &[u8],
    now: SystemTime,
) -> Result<ObjectId, Error> {
    check_scope(scope)?;
    let at = millis("staging time", now)?;
    client
        .query_one(
            "INSERT INTO fencecheck_objects (scope, name, body, staged_at_ms)
             VALUES ($1, $2, $3, $4) RETURNING id",
            &[&scope, &name, &body, &at],
        )
        .map(|r| ObjectId(r.get(0)))
        .map_err(pg("staging an object"))
}

/// Fenced publish: check `request` and, only on `applied`, point the scope's
/// catalog entry at `object` and store the new fence state, atomically (one
/// transaction, through [`fenced_write`](crate::fenced_write)'s machinery: the
/// scope's row locked `FOR UPDATE`, so concurrent publishers of one scope
/// queue and each decides against the state the previous one committed; the
/// first publish of a scope creates its row). The object replaced stays in
/// place for the collector.
///
/// `object` must be staged under `request.scope`, else
/// [`Error::UnknownObject`] and nothing changes. A rejected request is
/// answered as such whatever `object` is (the check comes first).
pub fn publish<C>(
    client: &mut Client,
    checker: &mut C,
    request: &Request,
    object: ObjectId,
    now: SystemTime,
) -> Result<Fenced<()>, Error>
where
    C: Checker + ?Sized,
{
    let result = publish_unrecorded(client, checker, request, object, now);
    fencecheck::record_decision("publish", Some(request.token), &result);
    result
}

fn publish_unrecorded<C>(
    client: &mut Client,
    checker: &mut C,
    request: &Request,
    object: ObjectId,
    now: SystemTime,
) -> Result<Fenced<()>, Error>
where
    C: Checker + ?Sized,
{
    let at_ms = millis("publication time", now)?;
    run(client, checker, request, |tx, _accepted| {
        let staged = tx
            .query_opt(LOCK_OBJECT, &[&object.0, &request.scope])
            .map_err(pg("locking the object to publish"))?;
        if staged.is_none() {
            // Returning the error drops the transaction: rolled back.
            return Err(Error::UnknownObject {
                object,
                scope: request.scope.clone(),
            });
        }
        let changed = tx
            .execute(POINT, &[&request.scope, &object.0, &at_ms])
            .map_err(pg("publishing the catalog pointer"))?;
        if changed != 1 {
            // Unreachable: the row was locked (or inserted) by this
            // transaction.
            return Err(Error::Invalid {
                what: "scope row",
                why: format!("the pointer update changed {changed} rows"),
            });
        }
        Ok(())
    })
}

/// The object `scope`'s catalog pointer makes visible, read in one statement
/// (pointer and bytes from the same snapshot); `None` before the first publish.
pub fn visible(client: &mut Client, scope: &str) -> Result<Option<Visible>, Error> {
    let row = client
        .query_opt(
            "SELECT o.id, o.name, o.body, s.version, s.published_at_ms
               FROM fencecheck_scopes s
               JOIN fencecheck_objects o ON o.id = s.visible_object
              WHERE s.scope = $1",
            &[&scope],
        )
        .map_err(pg("reading the visible object"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let version: i64 = row.get(3);
    let at_ms: Option<i64> = row.get(4);
    let version = u64::try_from(version).map_err(|_| Error::Invalid {
        what: "stored version",
        why: format!("{version} is negative"),
    })?;
    let at = at_ms
        .and_then(|ms| u64::try_from(ms).ok())
        .ok_or_else(|| Error::Invalid {
            what: "stored published_at_ms",
            why: format!("{at_ms:?} is not a time since 1970"),
        })?;
    Ok(Some(Visible {
        object: ObjectId(row.get(0)),
        name: row.get(1),
        body: row.get(2),
        version,
        published_at: UNIX_EPOCH + Duration::from_millis(at),
    }))
}

/// Delete an object its owner staged but could not publish (after a
/// `stale-fence`, say). Deletes nothing, and returns `false`, if any catalog
/// pointer references it (including one a concurrent publish is moving to it:
/// the row lock waits for that publish to end), or if it does not exist.
pub fn discard(client: &mut Client, object: ObjectId) -> Result<bool, Error> {
    let mut tx = read_committed(client, "beginning a discard")?;
    let locked = tx
        .query_opt(
            "SELECT 1 FROM fencecheck_objects WHERE id = $1 FOR UPDATE",
            &[&object.0],
        )
        .map_err(pg("locking the object to discard"))?;
    if locked.is_none() {
        return Ok(false);
    }
    let deleted = tx
        .execute(DELETE_UNREFERENCED, &[&vec![object.0]])
        .map_err(pg("discarding an object"))?;
    commit(tx)?;
    Ok(deleted == 1)
}

/// The asynchronous collector: delete every object that no catalog pointer
/// references and that was staged at least `retention` before `now`.
///
/// This is also crash recovery: an object staged by a writer that died before
/// publishing was never visible, and is deleted once the window has passed.
/// The window must exceed the longest a writer may take between staging and
/// publishing; a writer slower than that gets [`Error::UnknownObject`] from
/// [`publish`], never a dangling pointer. Works in batches of bounded size,
/// each its own READ COMMITTED transaction; objects a concurrent publish has
/// locked are skipped (and left for a later pass if still unreferenced).
pub fn collect_garbage(
    client: &mut Client,
    now: SystemTime,
    retention: Duration,
) -> Result<GcReport, Error> {
    let now_ms = millis("collection time", now)?;
    let keep_ms = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
    let cutoff = now_ms.saturating_sub(keep_ms);
    let mut report = GcReport::default();
    loop {
        let mut tx = read_committed(client, "beginning a collection batch")?;
        let ids: Vec<i64> = tx
            .query(LOCK_GARBAGE, &[&cutoff, &GC_BATCH])
            .map_err(pg("locking unreferenced objects"))?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let deleted = if ids.is_empty() {
            0
        } else {
            tx.execute(DELETE_UNREFERENCED, &[&ids])
                .map_err(pg("collecting unreferenced objects"))?
        };
        commit(tx)?;
        report.deleted += deleted;
        // Fewer than a batch locked: nothing else is collectable right now
        // (SKIP LOCKED rows do not count against the LIMIT).
        if (ids.len() as i64) < GC_BATCH {
            return Ok(report);
        }
    }
}
