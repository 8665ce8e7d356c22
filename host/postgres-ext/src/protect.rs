//! Fenced tables: the row trigger `fence_protect` installs.
//!
//! Every INSERT, UPDATE and DELETE of a protected row must present a token
//! the component applies against the row's own state; the trigger then
//! stores the new state in the row. The paths, and why each is closed:
//!
//! - **INSERT** must set the token column; the state column must be NULL
//!   (only the trigger writes it). A scope deleted before is decided
//!   against its tombstone, so deleting a row never resets its fence.
//! - **UPDATE** must name the token column in its SET list (PostgreSQL's
//!   `tg_updatedcols`), so an UPDATE that does not present a token is
//!   refused, and re-presenting the stored token is `stale-fence` under
//!   `strict`. It may not write the state column nor change the scope.
//! - **DELETE** carries no new row, so it presents its token in the
//!   transaction-local setting `fencecheck.token`; the final state becomes
//!   the scope's tombstone in `fencecheck.tombstones`.
//! - **TRUNCATE** is refused by a statement trigger (`ffi.rs`).
//! - Guards for `allow-equal` (and op-ids under either policy) come from the
//!   settings `fencecheck.op_id` and `fencecheck.expected_version`.
//!
//! The tombstone table is readable and writable only by the extension's
//! owner: the trigger switches to that role just for its two statements, so
//! no writer can erase a tombstone to resurrect a scope below its mark.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int};

use pgrx::pg_sys;
use pgrx::prelude::*;
use pgrx::spi::Spi;
use pgrx::{FromDatum, IntoDatum};

use crate::calls::{self, Args};
use crate::sqlstate::{Raise, SqlState};
use fencecheck::GrantKey;

fn required(detail: impl std::fmt::Display) -> Raise {
    Raise::new(SqlState::FenceRequired, detail)
}

fn misconfigured(detail: impl std::fmt::Display) -> Raise {
    Raise::new(
        SqlState::InvalidArgument,
        format!("fencecheck_row_trigger: {detail}"),
    )
}

/// A transaction's fencing settings (`SET LOCAL fencecheck.token = …`);
/// unset and empty are the same: absent.
fn setting(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: missing_ok = true returns NULL for a setting never made; the
    // string lives in GUC memory until the setting changes, which cannot
    // happen during this trigger call.
    let value = unsafe { pg_sys::GetConfigOption(name.as_ptr(), true, false) };
    if value.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated string from PostgreSQL.
    let bytes = unsafe { CStr::from_ptr(value) }.to_bytes();
    (!bytes.is_empty()).then_some(bytes)
}

fn expected_version() -> Result<Option<i64>, Raise> {
    let Some(text) = setting(c"fencecheck.expected_version") else {
        return Ok(None);
    };
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .map(Some)
        .ok_or_else(|| {
            Raise::new(
                SqlState::InvalidArgument,
                "fencecheck.expected_version must be an integer",
            )
        })
}

/// One protected table's trigger arguments, resolved against its tuple
/// descriptor.
struct Columns<'a> {
    scope: c_int,
    token: c_int,
    state: c_int,
    token_name: &'a str,
    state_name: &'a str,
    policy: &'a [u8],
}

/// A column's value as bytes (text, varchar, bytea), detoasted.
///
/// # Safety
/// `tuple` and `desc` must belong together; `attnum` must be a column of it.
unsafe fn value<'a>(
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    attnum: c_int,
) -> Option<&'a [u8]> {
    let mut is_null = false;
    // SAFETY: per the caller.
    unsafe {
        let datum = pg_sys::SPI_getbinval(tuple, desc, attnum, &mut is_null);
        <&[u8]>::from_datum(datum, is_null)
    }
}

/// Replace one column of `tuple`.
///
/// # Safety
/// As [`value`].
unsafe fn with_state(
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    attnum: c_int,
    state: &[u8],
) -> Result<pg_sys::Datum, Raise> {
    let mut datum = state
        .into_datum()
        .ok_or_else(|| Raise::new(SqlState::RuntimeError, "the new state has no datum"))?;
    let mut is_null = false;
    let mut column = attnum;
    // SAFETY: one replaced column; PostgreSQL copies the returned tuple.
    let tuple = unsafe {
        pg_sys::heap_modify_tuple_by_cols(tuple, desc, 1, &mut column, &mut datum, &mut is_null)
    };
    Ok(pg_sys::Datum::from(tuple))
}

/// The trigger `fence_protect` installs (BEFORE INSERT OR UPDATE OR DELETE,
/// FOR EACH ROW, arguments: scope column, token column, state column,
/// policy).
///
/// # Safety
/// `fcinfo` must be the one PostgreSQL passed to the trigger function.
pub(crate) unsafe fn row_trigger(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Raise> {
    // SAFETY: PostgreSQL's fcinfo; `from_fcinfo` checks it is a trigger call.
    let trigger = unsafe { PgTrigger::from_fcinfo(&*fcinfo) }
        .map_err(|e| misconfigured(format!("not called as a trigger: {e}")))?;
    let event = trigger.event();
    if !(event.fired_before() && event.fired_for_row()) {
        return Err(misconfigured("must fire BEFORE … FOR EACH ROW"));
    }
    let data = trigger.trigger_data();
    let trig = trigger.trigger();
    if trig.tgnargs != 4 || trig.tgargs.is_null() {
        return Err(misconfigured("expects 4 arguments"));
    }
    // SAFETY: tgargs holds tgnargs NUL-terminated strings.
    let arg = |i: usize| -> Result<&str, Raise> {
        unsafe { CStr::from_ptr(*trig.tgargs.add(i)) }
            .to_str()
            .map_err(|_| misconfigured("an argument is not UTF-8"))
    };
    // SAFETY: a trigger's relation is open and locked while it fires.
    let desc = unsafe { (*data.tg_relation).rd_att };
    let attnum = |i: usize| -> Result<c_int, Raise> {
        let name = arg(i)?;
        let c = std::ffi::CString::new(name).map_err(|_| misconfigured("bad column name"))?;
        // SAFETY: a valid descriptor and NUL-terminated name.
        let n = unsafe { pg_sys::SPI_fnumber(desc, c.as_ptr()) };
        if n <= 0 {
            return Err(misconfigured(format!("no column {name:?}")));
        }
        Ok(n)
    };
    let cols = Columns {
        scope: attnum(0)?,
        token: attnum(1)?,
        state: attnum(2)?,
        token_name: arg(1)?,
        state_name: arg(2)?,
        policy: arg(3)?.as_bytes(),
    };
    let relid = trigger
        .relid()
        .map_err(|e| misconfigured(format!("no relation: {e}")))?;
    let op_id = setting(c"fencecheck.op_id");
    let expected_version = expected_version()?;
    let args = |scope, token| Args {
        scope,
        token,
        policy: Some(cols.policy),
        op_id,
        expected_version,
    };

    if event.fired_by_insert() {
        let new = data.tg_trigtuple;
        // SAFETY: the new row of this relation, and its columns.
        let (scope, token, state) = unsafe {
            (
                value(new, desc, cols.scope),
                value(new, desc, cols.token),
                value(new, desc, cols.state),
            )
        };
        if state.is_some() {
            return Err(required(format!(
                "{} is written by fencecheck only: insert it as NULL",
                cols.state_name
            )));
        }
        let token = token.ok_or_else(|| {
            required(format!(
                "an INSERT into a fenced table must set {} to the writer's token",
                cols.token_name
            ))
        })?;
        let scope_text = calls::text("scope", scope)?;
        let mark = take_mark(relid, scope_text)?;
        let keys = scope_keys(scope_text)?;
        let decision = calls::decide(mark.as_deref(), &args(scope, Some(token)), keys.as_deref())?;
        let state = calls::applied(decision)?;
        drop_mark(relid, scope_text)?;
        // SAFETY: as above.
        return unsafe { with_state(new, desc, cols.state, &state) };
    }

    if event.fired_by_update() {
        let (old, new) = (data.tg_trigtuple, data.tg_newtuple);
        // SAFETY: the old and new versions of a row of this relation.
        let (old_scope, old_state, new_scope, new_state, token) = unsafe {
            (
                value(old, desc, cols.scope),
                value(old, desc, cols.state),
                value(new, desc, cols.scope),
                value(new, desc, cols.state),
                value(new, desc, cols.token),
            )
        };
        if old_scope != new_scope {
            return Err(required("a fenced row cannot move to another scope"));
        }
        if old_state != new_state {
            return Err(required(format!(
                "{} is written by fencecheck only",
                cols.state_name
            )));
        }
        // SAFETY: tg_updatedcols is the SET list's column set (PostgreSQL
        // 13+), offset by FirstLowInvalidHeapAttributeNumber.
        let presented = unsafe {
            pg_sys::bms_is_member(
                cols.token - pg_sys::FirstLowInvalidHeapAttributeNumber,
                data.tg_updatedcols,
            )
        };
        let token = token.filter(|_| presented).ok_or_else(|| {
            required(format!(
                "an UPDATE of a fenced table must SET {} to the writer's token",
                cols.token_name
            ))
        })?;
        let keys = scope_keys(calls::text("scope", old_scope)?)?;
        let decision = calls::decide(old_state, &args(old_scope, Some(token)), keys.as_deref())?;
        let state = calls::applied(decision)?;
        // SAFETY: as above.
        return unsafe { with_state(new, desc, cols.state, &state) };
    }

    if event.fired_by_delete() {
        let old = data.tg_trigtuple;
        // SAFETY: the deleted row of this relation.
        let (scope, state) =
            unsafe { (value(old, desc, cols.scope), value(old, desc, cols.state)) };
        let token = setting(c"fencecheck.token").ok_or_else(|| {
            required(
                "a DELETE from a fenced table must present a token: SET LOCAL fencecheck.token = '…' first",
            )
        })?;
        let scope_text = calls::text("scope", scope)?;
        let keys = scope_keys(scope_text)?;
        let state = calls::applied(calls::decide(
            state,
            &args(scope, Some(token)),
            keys.as_deref(),
        )?)?;
        keep_mark(relid, scope_text, &state)?;
        return Ok(pg_sys::Datum::from(old));
    }

    Err(misconfigured("fired by an unexpected event"))
}

/// Runs `f` as the owner of schema `fencecheck` (the extension's owner),
/// then switches back, also when `f` unwinds.
fn as_owner<T>(
    f: impl FnOnce(&mut pgrx::spi::SpiClient<'_>) -> Result<T, Raise>,
) -> Result<T, Raise> {
    Spi::connect_mut(|client| {
        let owner = client
            .select(
                "SELECT nspowner FROM pg_catalog.pg_namespace \
                 WHERE nspname OPERATOR(pg_catalog.=) 'fencecheck'",
                Some(1),
                &[],
            )
            .and_then(|rows| rows.first().get_one::<pg_sys::Oid>())
            .map_err(|e| Raise::new(SqlState::RuntimeError, e))?
            .ok_or_else(|| Raise::new(SqlState::RuntimeError, "schema fencecheck is missing"))?;
        struct Restore(pg_sys::Oid, c_int);
        impl Drop for Restore {
            fn drop(&mut self) {
                // SAFETY: restores what GetUserIdAndSecContext returned.
                unsafe { pg_sys::SetUserIdAndSecContext(self.0, self.1) }
            }
        }
        let mut user = pg_sys::Oid::INVALID;
        let mut context: c_int = 0;
        // SAFETY: plain reads and a transient, restored switch (PostgreSQL
        // also restores it if the transaction aborts).
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
            pg_sys::SetUserIdAndSecContext(
                owner,
                context
                    | pg_sys::SECURITY_LOCAL_USERID_CHANGE as c_int
                    | pg_sys::SECURITY_RESTRICTED_OPERATION as c_int,
            );
        }
        let _restore = Restore(user, context);
        f(client)
    })
}

/// The keys `scope` requires signed tokens with: those of the longest
/// `fencecheck.keys` prefix that starts it (as `host/postgres/keys.sql` and
/// `host/sqlite/keys.sql` choose), `None` if no prefix does. Read as the
/// extension's owner: writers never see a secret.
fn scope_keys(scope: &str) -> Result<Option<Vec<GrantKey>>, Raise> {
    let rows = as_owner(|client| {
        let table = client
            .select(
                "SELECT key_id, secret FROM fencecheck.keys \
                 WHERE scope_prefix OPERATOR(pg_catalog.=) ( \
                     SELECT scope_prefix FROM fencecheck.keys \
                      WHERE pg_catalog.starts_with($1, scope_prefix) \
                      ORDER BY pg_catalog.length(scope_prefix) DESC LIMIT 1) \
                 ORDER BY key_id",
                None,
                &[scope.into()],
            )
            .map_err(|e| Raise::new(SqlState::RuntimeError, e))?;
        let mut keys = Vec::new();
        for row in table {
            let id = row
                .get::<i64>(1)
                .map_err(|e| Raise::new(SqlState::RuntimeError, e))?;
            let secret = row
                .get::<Vec<u8>>(2)
                .map_err(|e| Raise::new(SqlState::RuntimeError, e))?;
            let (Some(id), Some(secret)) = (id, secret) else {
                return Err(misconfigured("fencecheck.keys holds a NULL"));
            };
            let key_id = u32::try_from(id)
                .map_err(|_| misconfigured(format!("fencecheck.keys: key id {id} is not a u32")))?;
            keys.push(GrantKey { key_id, secret });
        }
        Ok(keys)
    })?;
    Ok((!rows.is_empty()).then_some(rows))
}

/// Lock the scope's tombstone slot and return its state. The upsert waits
/// for a concurrent DELETE of the scope to finish and then sees its
/// tombstone (READ COMMITTED), or fails with a serialization error
/// (REPEATABLE READ, SERIALIZABLE): never decides without it.
fn take_mark(relid: pg_sys::Oid, scope: &str) -> Result<Option<Vec<u8>>, Raise> {
    as_owner(|client| {
        client
            .update(
                "INSERT INTO fencecheck.tombstones AS t (relid, scope) \
                 VALUES ($1::pg_catalog.oid::pg_catalog.regclass, $2) \
                 ON CONFLICT (relid, scope) DO UPDATE SET scope = EXCLUDED.scope \
                 RETURNING t.fence_state",
                Some(1),
                &[relid.into(), scope.into()],
            )
            .and_then(|rows| rows.first().get_one::<Vec<u8>>())
            .map_err(|e| Raise::new(SqlState::RuntimeError, e))
    })
}

/// The scope's row exists again: its state is in the row, not here.
fn drop_mark(relid: pg_sys::Oid, scope: &str) -> Result<(), Raise> {
    as_owner(|client| {
        client
            .update(
                "DELETE FROM fencecheck.tombstones \
                 WHERE relid OPERATOR(pg_catalog.=) $1::pg_catalog.oid::pg_catalog.regclass \
                 AND scope OPERATOR(pg_catalog.=) $2",
                None,
                &[relid.into(), scope.into()],
            )
            .map(|_| ())
            .map_err(|e| Raise::new(SqlState::RuntimeError, e))
    })
}

/// The row is going: its final state stays as the scope's tombstone.
fn keep_mark(relid: pg_sys::Oid, scope: &str, state: &[u8]) -> Result<(), Raise> {
    as_owner(|client| {
        client
            .update(
                "INSERT INTO fencecheck.tombstones (relid, scope, fence_state) \
                 VALUES ($1::pg_catalog.oid::pg_catalog.regclass, $2, $3) \
                 ON CONFLICT (relid, scope) DO UPDATE SET fence_state = EXCLUDED.fence_state",
                None,
                &[relid.into(), scope.into(), state.into()],
            )
            .map(|_| ())
            .map_err(|e| Raise::new(SqlState::RuntimeError, e))
    })
}
