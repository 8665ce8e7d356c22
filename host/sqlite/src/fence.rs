//! The fenced transaction: read state → check → store state → mutation, in
//! one `BEGIN IMMEDIATE` transaction (publish: mutation, then the state with
//! the pointer).

pub use fencecheck::{Accepted, Fenced, Rejection};
use fencecheck::{Checker, Request, SignedOutcome, Token};
use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};

use crate::apply::{self, Recorded};
use crate::error::sql;
use crate::{Error, ObjectId};

/// How the new state is stored once the mutation has run.
pub(crate) enum Store {
    /// Only the fence state (and version) of the scope's row.
    State,
    /// The fence state and the catalog pointer in one statement, only if the
    /// object is staged under the same scope.
    Publish { object: ObjectId, at_ms: i64 },
}

const READ_STATE: &str = "SELECT fence_state FROM fencecheck_scopes WHERE scope = ?1";

// The state and whether any key prefix starts the scope, in one statement
// (always one row): an unkeyed scope, the common case, then costs no
// second statement. The keys themselves are read only when there are some.
const READ_STATE_KEYED: &str = "SELECT (SELECT fence_state FROM fencecheck_scopes WHERE scope = ?1), \
    EXISTS (SELECT 1 FROM fencecheck_keys WHERE substr(?1, 1, length(scope_prefix)) = scope_prefix)";

// The row's existence is known from the read under the write lock, so an
// existing row takes a plain UPDATE (cheaper than an upsert's failed insert).
const INSERT_STATE: &str =
    "INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES (?1, ?2, ?3)";

const UPDATE_STATE: &str =
    "UPDATE fencecheck_scopes SET fence_state = ?2, version = ?3 WHERE scope = ?1";

// One statement moves the pointer and stores the state, and only if the
// object is staged under this scope: the catalog can never point at nothing.
const INSERT_PUBLISH: &str = "
INSERT INTO fencecheck_scopes (scope, fence_state, version, visible_object, published_at_ms)
SELECT ?1, ?2, ?3, ?4, ?5
 WHERE EXISTS (SELECT 1 FROM fencecheck_objects WHERE id = ?4 AND scope = ?1)";

const UPDATE_PUBLISH: &str = "
UPDATE fencecheck_scopes
   SET fence_state = ?2, version = ?3, visible_object = ?4, published_at_ms = ?5
 WHERE scope = ?1
   AND EXISTS (SELECT 1 FROM fencecheck_objects WHERE id = ?4 AND scope = ?1)";

/// Run `mutation` under the fence in one `BEGIN IMMEDIATE` transaction: read
/// the scope's state (and its signing keys, if the scope requires signed
/// tokens: [`crate::set_keys`]), check `request`, and only on `applied`
/// store the new state and run the mutation, then commit. On a rejection or
/// any error the transaction rolls back and nothing changes.
///
/// For an existing, unkeyed scope the read, the check and the store are ONE
/// UPDATE that decides inside itself (as [`crate::publish`] does), so the
/// transaction is that statement, the mutation's, and `BEGIN`/`COMMIT`.
///
/// The mutation receives the open transaction (do every write of the
/// protected operation through it) and what the fence accepted. It must not
/// end the transaction itself. The new state is already written in the
/// transaction when it runs.
pub fn fenced_write<C, T, E>(
    conn: &mut Connection,
    checker: &mut C,
    request: &Request,
    mutation: impl FnOnce(&Transaction<'_>, &Accepted) -> Result<T, E>,
) -> Result<Fenced<T>, Error>
where
    C: Checker + ?Sized,
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    let result = run(conn, checker, request, Store::State, mutation);
    fencecheck::record_decision("write", Some(request.token), &result);
    result
}

/// The scope's stored fence state, or `None` if it never accepted a token.
pub fn stored_state(conn: &Connection, scope: &str) -> Result<Option<Vec<u8>>, Error> {
    conn.prepare_cached(READ_STATE)
        .and_then(|mut s| s.query_row([scope], |r| r.get(0)).optional())
        .map_err(sql("reading the fence state"))
}

/// The new version, highest token and state of an `applied` outcome; any
/// other outcome as the rejection it is.
pub(crate) fn decision(outcome: SignedOutcome) -> Result<(u64, Token, Vec<u8>), Rejection> {
    fencecheck::accept_signed(outcome).map(|(a, state)| (a.version, a.highest, state))
}

pub(crate) fn run<C, T, E>(
    conn: &mut Connection,
    checker: &mut C,
    request: &Request,
    store: Store,
    mutation: impl FnOnce(&Transaction<'_>, &Accepted) -> Result<T, E>,
) -> Result<Fenced<T>, Error>
where
    C: Checker + ?Sized,
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    // IMMEDIATE takes the write lock before the read, so no other writer can
    // move the state between our read and our write (and WAL readers never
    // see a half-done publish).
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("beginning the fenced transaction"))?;
    if let Store::State = store {
        // Read, check and store in one statement: the function decides on
        // the row's current value under the write lock BEGIN IMMEDIATE took.
        let (changed, recorded) = {
            let mut decide = |state: Option<&[u8]>| checker.decide(state, request, None);
            apply::write_one(&tx, &mut decide, &request.scope)
        };
        match (changed, recorded) {
            (Ok(1), Recorded::Applied { version, highest }) => {
                return finish(tx, Accepted { version, highest }, mutation);
            }
            // The function raised: the statement changed nothing, and
            // dropping `tx` rolls back the rest.
            (Err(_), Recorded::Rejected(rejection)) => return Ok(Fenced::Rejected(rejection)),
            (Err(_), Recorded::Failed(e)) => return Err(Error::Check(e)),
            (_, Recorded::Panicked(payload)) => std::panic::resume_unwind(payload),
            // No row yet, a scope that requires signed tokens, or a row the
            // statement would not decide for: read-then-write below, in the
            // same transaction (the raise undid only its own statement).
            (Ok(0), _) | (Err(_), Recorded::Fallback) => {}
            (Err(e), _) => return Err(sql("storing the fence state")(e)),
            // A row changed without this crate's decision: unreachable while
            // the function's name is private to this process.
            (Ok(n), _) => {
                return Err(sql("storing the fence state")(
                    rusqlite::Error::StatementChangedRows(n),
                ));
            }
        }
        // A raise aborts only its statement; should SQLite ever have ended
        // the transaction instead, the read and the store below must not
        // run as two autocommit statements.
        if tx.is_autocommit() {
            return Err(sql("storing the fence state")(
                rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                    Some("the fenced transaction ended".into()),
                ),
            ));
        }
    }
    // Under the write lock, state and keys together: a key change is
    // ordered before or after this write, never in between.
    let (stored, keyed): (Option<Vec<u8>>, bool) = tx
        .prepare_cached(READ_STATE_KEYED)
        .and_then(|mut s| s.query_row([&request.scope], |r| Ok((r.get(0)?, r.get(1)?))))
        .map_err(sql("reading the fence state"))?;
    let keys = if keyed {
        crate::scope_keys(&tx, &request.scope)?
    } else {
        None
    };
    let outcome = checker.decide(stored.as_deref(), request, keys.as_deref())?;
    let (version, highest, state) = match decision(outcome) {
        Ok(applied) => applied,
        // Dropping `tx` rolls back: a rejection changes nothing.
        Err(rejection) => return Ok(Fenced::Rejected(rejection)),
    };
    let stored_version = i64::try_from(version).map_err(|_| Error::Invalid {
        what: "version",
        why: format!("{version} does not fit a SQLite INTEGER"),
    })?;
    let accepted = Accepted { version, highest };
    let exists = stored.is_some();
    match store {
        Store::State => {
            // The state first, then the mutation, as the one-statement path
            // does: whatever the mutation does, it commits with its state.
            let statement = if exists { UPDATE_STATE } else { INSERT_STATE };
            tx.prepare_cached(statement)
                .and_then(|mut s| s.execute(params![request.scope, state, stored_version]))
                .map_err(sql("storing the fence state"))?;
            finish(tx, accepted, mutation)
        }
        Store::Publish { object, at_ms } => {
            let value = mutation(&tx, &accepted).map_err(|e| Error::Mutation(e.into()))?;
            if tx.is_autocommit() {
                return Err(Error::TransactionEnded);
            }
            let statement = if exists {
                UPDATE_PUBLISH
            } else {
                INSERT_PUBLISH
            };
            let changed = tx
                .prepare_cached(statement)
                .and_then(|mut s| {
                    s.execute(params![
                        request.scope,
                        state,
                        stored_version,
                        object.get(),
                        at_ms
                    ])
                })
                .map_err(sql("publishing the catalog pointer"))?;
            if changed != 1 {
                return Err(Error::UnknownObject {
                    object,
                    scope: request.scope.clone(),
                });
            }
            commit(tx)?;
            Ok(Fenced::Applied {
                version,
                highest,
                value,
            })
        }
    }
}

/// The state is stored in `tx`: run the mutation, then commit.
fn finish<T, E>(
    tx: Transaction<'_>,
    accepted: Accepted,
    mutation: impl FnOnce(&Transaction<'_>, &Accepted) -> Result<T, E>,
) -> Result<Fenced<T>, Error>
where
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    let value = mutation(&tx, &accepted).map_err(|e| Error::Mutation(e.into()))?;
    if tx.is_autocommit() {
        return Err(Error::TransactionEnded);
    }
    commit(tx)?;
    Ok(Fenced::Applied {
        version: accepted.version,
        highest: accepted.highest,
        value,
    })
}

/// `COMMIT` from the connection's statement cache (rusqlite's
/// `Transaction::commit` parses it on every call). Committed, `tx` finds the
/// connection in autocommit mode and its drop does nothing; if COMMIT
/// failed, the drop rolls back, as `Transaction::commit` would have.
fn commit(tx: Transaction<'_>) -> Result<(), Error> {
    tx.prepare_cached("COMMIT")
        .and_then(|mut s| s.execute([]))
        .map_err(sql("committing the fenced write"))?;
    Ok(())
}
