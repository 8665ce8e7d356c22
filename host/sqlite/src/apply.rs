//! The one-statement publish: a connection-local SQL function runs the fence
//! check inside the UPDATE that stores its answer, so an applied publish to
//! an existing scope is ONE statement (no separate read of the state, no
//! BEGIN/COMMIT around it).
//!
//! The function is not a general SQL function: it decides for the publish in
//! progress on this thread (its checker and request sit in a thread-local
//! slot for the duration of one statement) and records what it decided, so
//! the caller returns the same `Fenced` value as the read-then-write path.
//! Its name carries a per-process random suffix, so a function someone else
//! registered cannot be called in its place.
#![allow(unsafe_code)] // one lifetime-erased pointer in a scoped slot, see `with_call`

use std::any::Any;
use std::cell::Cell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::OnceLock;

use fencecheck::{SignedOutcome, Token};
use rusqlite::Connection;
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::types::ValueRef;

use crate::fence::{Rejection, decision};

/// The function's name and the two statements that call it (publish's and
/// `fenced_write`'s), made once per process. The suffix comes from std's
/// random hash keys, so no function of that name can be on the connection
/// before this crate registers it: if a statement prepares, it calls this
/// crate's function. That matters because an autocommit statement commits
/// before the caller could look at what was recorded.
struct Names {
    function: String,
    publish: String,
    write: String,
}

fn names() -> &'static Names {
    static NAMES: OnceLock<Names> = OnceLock::new();
    NAMES.get_or_init(|| {
        let function = format!(
            "fencecheck_apply_{:016x}",
            RandomState::new().hash_one("fencecheck_apply")
        );
        Names {
            publish: format!("{PUBLISH_HEAD}{function}{PUBLISH_TAIL}"),
            write: format!("{PUBLISH_HEAD}{function}{WRITE_TAIL}"),
            function,
        }
    })
}

// The pointer, the state and its version in one statement, only if the
// object is staged under this scope. The function decides on the row's
// current state and raises on anything but applied (the statement then
// changes nothing); it checks that `version + 1` is the new state's version.
// Single spaces (`\` continuations): rusqlite's statement cache hashes and
// compares the whole text on every publish.
const PUBLISH_HEAD: &str = "UPDATE fencecheck_scopes SET fence_state = ";
// A scope that requires signed tokens matches no row here (the check inside
// the statement is `check`, without keys) and takes read-then-write, which
// reads its keys; deciding that inside this statement, under its write
// lock, leaves no moment for a key change to slip between.
const PUBLISH_TAIL: &str = "(fence_state, version), \
    version = version + 1, visible_object = ?2, published_at_ms = ?3 \
    WHERE scope = ?1 \
    AND EXISTS (SELECT 1 FROM fencecheck_objects WHERE id = ?2 AND scope = ?1) \
    AND NOT EXISTS (SELECT 1 FROM fencecheck_keys \
    WHERE substr(?1, 1, length(scope_prefix)) = scope_prefix)";

// `fenced_write`'s state, checked and stored in one statement inside its
// `BEGIN IMMEDIATE` transaction, before the caller's mutation runs (which
// needs the decision); keyed scopes match no row and take read-then-write,
// as in publish.
const WRITE_TAIL: &str = "(fence_state, version), \
    version = version + 1 \
    WHERE scope = ?1 \
    AND NOT EXISTS (SELECT 1 FROM fencecheck_keys \
    WHERE substr(?1, 1, length(scope_prefix)) = scope_prefix)";

/// The checker call a statement makes: state in, decision out.
pub(crate) type Decide<'a> =
    dyn FnMut(Option<&[u8]>) -> Result<SignedOutcome, fencecheck::Error> + 'a;

/// What the function did during one statement.
pub(crate) enum Recorded {
    /// Not called: the UPDATE matched no row.
    NotCalled,
    /// Applied: the new state went back to SQLite, and the row's `version`
    /// column plus one is `version`.
    Applied { version: u64, highest: Token },
    /// Any other decision or check error: the function raised, so the
    /// statement changed nothing.
    Rejected(Rejection),
    /// The checker could not run; the function raised.
    Failed(fencecheck::Error),
    /// The checker panicked; the function raised, the caller resumes it.
    Panicked(Box<dyn Any + Send>),
    /// The row is not what this path expects (state not a BLOB, `version`
    /// not the state's version, or a version past i64): the function raised
    /// and the caller falls back to read-then-write, which reports or
    /// repairs it exactly as before.
    Fallback,
}

/// One statement's call: the checker and what it answered.
struct Call<'a, 'b> {
    decide: &'a mut Decide<'b>,
    recorded: Recorded,
}

thread_local! {
    /// The call in progress on this thread, type- and lifetime-erased. Set
    /// only inside `with_call`; the function takes it out (one decision per
    /// statement, and a re-entrant call finds it empty).
    static CURRENT: Cell<Option<NonNull<()>>> = const { Cell::new(None) };
}

/// Restores the slot when `with_call` ends, also on unwind, so it never
/// outlives the call it points at.
struct Restore(Option<NonNull<()>>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0;
        CURRENT.with(|slot| slot.set(previous));
    }
}

/// Publish `object` to `scope` with one UPDATE that decides through
/// `decide`; returns the statement's result and what the function recorded.
/// Run in autocommit mode, the statement is its own write transaction: it
/// takes the write lock before it reads the row, and commits, or on an error
/// rolls back, by itself.
pub(crate) fn publish_one(
    conn: &Connection,
    decide: &mut Decide<'_>,
    scope: &str,
    object: i64,
    at_ms: i64,
) -> (rusqlite::Result<usize>, Recorded) {
    with_call(decide, || {
        prepared(conn, &names().publish)?.execute(rusqlite::params![scope, object, at_ms])
    })
}

/// Decide through `decide` and store the new state of `scope` with one
/// UPDATE (no row changes unless applied), for `fenced_write`, inside the
/// caller's transaction: a raise aborts this statement only, and the caller
/// rolls back or falls back to read-then-write.
pub(crate) fn write_one(
    conn: &Connection,
    decide: &mut Decide<'_>,
    scope: &str,
) -> (rusqlite::Result<usize>, Recorded) {
    with_call(decide, || prepared(conn, &names().write)?.execute([scope]))
}

/// `sql` from the connection's statement cache; the first time on this
/// connection, the function is registered and the statement prepared again
/// (a real error, e.g. no tables, shows then).
fn prepared<'c>(
    conn: &'c Connection,
    sql: &str,
) -> rusqlite::Result<rusqlite::CachedStatement<'c>> {
    match conn.prepare_cached(sql) {
        Ok(statement) => Ok(statement),
        Err(_) => {
            register(conn, &names().function)?;
            conn.prepare_cached(sql)
        }
    }
}

/// Run `statement` with `decide` reachable from the function, and return its
/// result with what the function recorded.
fn with_call<T>(decide: &mut Decide<'_>, statement: impl FnOnce() -> T) -> (T, Recorded) {
    let mut call = Call {
        decide,
        recorded: Recorded::NotCalled,
    };
    let pointer = NonNull::from(&mut call).cast::<()>();
    let restore = Restore(CURRENT.with(|slot| slot.replace(Some(pointer))));
    let result = statement();
    // The slot is cleared before `call` is read or dropped.
    drop(restore);
    (result, call.recorded)
}

/// Register the function on `conn`.
///
/// Not deterministic (it depends on the call in progress, so SQLite must
/// never factor it out or reuse a result) and `DIRECTONLY`: it records a
/// decision, so schema objects (triggers, views) may not call it.
fn register(conn: &Connection, name: &str) -> rusqlite::Result<()> {
    conn.create_scalar_function(
        name,
        2,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DIRECTONLY,
        apply,
    )
}

fn raise(message: &str) -> rusqlite::Error {
    rusqlite::Error::UserFunctionError(message.into())
}

/// `fencecheck_apply_…(fence_state, version)`: the new state on `applied`;
/// raises on anything else, so the statement aborts and changes nothing.
fn apply(ctx: &Context<'_>) -> rusqlite::Result<Vec<u8>> {
    let Some(pointer) = CURRENT.with(Cell::take) else {
        return Err(raise(
            "fencecheck_apply runs only inside fencecheck_sqlite::publish",
        ));
    };
    // SAFETY: `pointer` was made from a live `&mut Call` by `with_call` on
    // this thread, which clears the slot before that `Call` is touched again
    // or dropped; we are inside `with_call`'s statement. Taking it out of the
    // slot makes this the only reference: a second or re-entrant call (from
    // the checker, say) finds the slot empty.
    let call = unsafe { pointer.cast::<Call<'_, '_>>().as_mut() };
    let (state, version) = match (ctx.get_raw(0), ctx.get_raw(1)) {
        (ValueRef::Blob(state), ValueRef::Integer(version)) => (state, version),
        _ => return fallback(call),
    };
    let outcome = match catch_unwind(AssertUnwindSafe(|| (call.decide)(Some(state)))) {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => {
            call.recorded = Recorded::Failed(e);
            return Err(raise("the fence check could not run"));
        }
        Err(payload) => {
            call.recorded = Recorded::Panicked(payload);
            return Err(raise("the fence check panicked"));
        }
    };
    match decision(outcome) {
        Ok((next, highest, new_state)) => {
            // `version = version + 1` in the same UPDATE stores the state's
            // version only if the column held the state's version before.
            let follows = u64::try_from(version)
                .ok()
                .and_then(|v| v.checked_add(1))
                .is_some_and(|v| v == next && i64::try_from(v).is_ok());
            if !follows {
                return fallback(call);
            }
            call.recorded = Recorded::Applied {
                version: next,
                highest,
            };
            Ok(new_state)
        }
        Err(rejection) => {
            let message = rejection.name();
            call.recorded = Recorded::Rejected(rejection);
            Err(raise(message))
        }
    }
}

fn fallback(call: &mut Call<'_, '_>) -> rusqlite::Result<Vec<u8>> {
    call.recorded = Recorded::Fallback;
    Err(raise(
        "fencecheck_apply: unexpected row, deciding by read-then-write",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ObjectId, install, publish, stage};
    use fencecheck::{Checker, Native, Policy, Request};
    use std::time::UNIX_EPOCH;

    type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

    /// An in-memory store with `s` published once (token 0.1) and an object
    /// staged for the next publish.
    fn store() -> Result<(Connection, ObjectId)> {
        let mut conn = Connection::open_in_memory()?;
        install(&conn)?;
        let first = stage(&conn, "s", "first", b"1", UNIX_EPOCH)?;
        let request = Request::new("s", Token::new(0, 0, 1), Policy::Strict);
        assert!(publish(&mut conn, &mut Native, &request, first, UNIX_EPOCH)?.is_applied());
        let next = stage(&conn, "s", "next", b"2", UNIX_EPOCH)?;
        Ok((conn, next))
    }

    /// The scope's row as SQL text, whatever the columns hold.
    fn row(conn: &Connection) -> Result<String> {
        Ok(conn.query_row(
            "SELECT quote(fence_state) || quote(version) || quote(visible_object)
               FROM fencecheck_scopes",
            [],
            |r| r.get(0),
        )?)
    }

    /// A checker that panics inside the statement: the function records the
    /// payload (the caller resumes it), the statement changes nothing, and
    /// the slot is empty again for the next statement.
    #[test]
    fn a_panicking_checker_changes_nothing_and_clears_the_slot() -> Result<()> {
        let (conn, next) = store()?;
        let before = row(&conn)?;
        let mut panics = |_: Option<&[u8]>| -> std::result::Result<fencecheck::SignedOutcome, fencecheck::Error> {
            panic!("checker bug")
        };
        let (changed, recorded) = publish_one(&conn, &mut panics, "s", next.get(), 5);
        assert!(changed.is_err());
        assert!(matches!(recorded, Recorded::Panicked(_)));
        assert_eq!(row(&conn)?, before);
        assert!(CURRENT.with(Cell::get).is_none());

        let request = Request::new("s", Token::new(0, 0, 2), Policy::Strict);
        let mut decide = |state: Option<&[u8]>| Native.decide(state, &request, None);
        let (changed, recorded) = publish_one(&conn, &mut decide, "s", next.get(), 5);
        assert_eq!(changed?, 1);
        assert!(matches!(recorded, Recorded::Applied { version: 2, .. }));
        Ok(())
    }

    /// A row the statement does not expect (a TEXT state, a non-integer
    /// version) is left to the read-then-write path: the function raises
    /// without deciding, and nothing changes.
    #[test]
    fn unexpected_rows_fall_back() -> Result<()> {
        let (conn, next) = store()?;
        let request = Request::new("s", Token::new(0, 0, 2), Policy::Strict);
        for damage in [
            "UPDATE fencecheck_scopes SET version = 'one'",
            "UPDATE fencecheck_scopes SET version = 1, fence_state = CAST(fence_state AS TEXT)",
        ] {
            conn.execute(damage, [])?;
            let before = row(&conn)?;
            let mut calls = 0;
            let mut decide = |state: Option<&[u8]>| {
                calls += 1;
                Native.decide(state, &request, None)
            };
            let (changed, recorded) = publish_one(&conn, &mut decide, "s", next.get(), 5);
            assert!(changed.is_err(), "{damage}");
            assert!(matches!(recorded, Recorded::Fallback), "{damage}");
            assert_eq!(calls, 0, "{damage}: decided on a row it cannot store");
            assert_eq!(row(&conn)?, before, "{damage}");
        }
        Ok(())
    }

    /// Outside a publish, and from a trigger (DIRECTONLY), the function
    /// refuses to run.
    #[test]
    fn the_function_runs_only_inside_publish() -> Result<()> {
        let (conn, _) = store()?;
        let name = &names().function;
        let outside = conn.query_row(&format!("SELECT {name}(x'00', 1)"), [], |r| {
            r.get::<_, Vec<u8>>(0)
        });
        let message = outside.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("only inside"), "{message}");

        conn.execute_batch(&format!(
            "CREATE TABLE t (x);
             CREATE TRIGGER t_apply AFTER INSERT ON t BEGIN SELECT {name}(x'00', 1); END;"
        ))?;
        let before = row(&conn)?;
        let request = Request::new("s", Token::new(0, 0, 2), Policy::Strict);
        let mut decide = |state: Option<&[u8]>| Native.decide(state, &request, None);
        let (from_trigger, recorded) =
            with_call(&mut decide, || conn.execute("INSERT INTO t VALUES (1)", []));
        let message = from_trigger
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(message.contains("unsafe use"), "{message}");
        assert!(matches!(recorded, Recorded::NotCalled));
        assert_eq!(row(&conn)?, before);
        Ok(())
    }
}
