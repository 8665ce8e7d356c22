//! Fenced tables: the triggers `fence_protect` installs, and the entry
//! points of `fence_protect` and `fence_unprotect`.
//!
//! Every INSERT, UPDATE and DELETE of a protected row must present a token
//! the component applies against the row's own state; the trigger then
//! stores the new state in the row. The paths, and why each is closed:
//!
//! - **INSERT** must set the token column; the state column must be NULL
//!   (only the trigger writes it). A scope deleted before is decided
//!   against its tombstone, so deleting a row never resets its fence; the
//!   tombstone goes away only in the AFTER INSERT trigger, with the row
//!   that replaces it (an INSERT PostgreSQL skips keeps it).
//! - **UPDATE** must name the token column in its SET list (PostgreSQL's
//!   `tg_updatedcols`), so an UPDATE that does not present a token is
//!   refused, and re-presenting the stored token is `stale-fence` under
//!   `strict`. It may not write the state column nor change the scope.
//! - **DELETE** carries no new row, so it presents its token in the setting
//!   `fencecheck.token`, set in the same transaction (`settings.rs`); the
//!   final state becomes the scope's tombstone in `fencecheck.tombstones`.
//! - **TRUNCATE** is refused by a statement trigger.
//! - The token column keeps the token without its signature: what a reader
//!   sees is never a credential.
//! - Before reading a row, the trigger checks that its table is one
//!   `fence_protect` registered and is sound now (`registry.rs`), and on
//!   every firing that the columns have the types it reads them as.
//!
//! The tombstone and key tables are readable and writable only by the
//! extension's owner: the triggers switch to that role just for their
//! statements on them.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_int};

use pgrx::IntoDatum;
use pgrx::pg_sys;
use pgrx::prelude::*;

use crate::calls::{self, Args};
use crate::registry::{self, Fenced, as_owner};
use crate::settings::{self, Presented, Value};
use crate::sqlstate::{Raise, SqlState, hint};
use crate::stats::{self, Operation};
use fencecheck::{Decision, TokenText};

use crate::soundness::{INSERTED_TRIGGER, ROW_TRIGGER};

fn required(detail: impl std::fmt::Display) -> Raise {
    Raise::new(SqlState::FenceRequired, detail).with_hint(hint::FENCE_REQUIRED)
}

/// A presented guard setting: a value set in an earlier transaction counts
/// as none (it only ever makes an equal token refused).
fn guard(which: Presented) -> Option<&'static [u8]> {
    match settings::presented(which) {
        Value::Current(v) => Some(v),
        Value::Absent | Value::Stale => None,
    }
}

fn expected_version() -> Result<Option<i64>, Raise> {
    let Some(text) = guard(Presented::ExpectedVersion) else {
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

/// A varlena datum's bytes, detoasted. Inline values (short or 4-byte
/// headers, uncompressed) are read in place without calling PostgreSQL, as
/// `pg_detoast_datum_packed` itself would return them; compressed or
/// out-of-line ones go through it.
///
/// # Safety
/// `datum` must be a non-null varlena datum that lives for `'a`.
unsafe fn bytes<'a>(datum: pg_sys::Datum) -> &'a [u8] {
    let mut p = datum.cast_mut_ptr::<pg_sys::varlena>();
    // SAFETY: per the caller; the header tests read only the first bytes.
    unsafe {
        if pgrx::varlena::varatt_is_4b_c(p) || pgrx::varlena::varatt_is_1b_e(p) {
            p = pg_sys::pg_detoast_datum_packed(p);
        }
        pgrx::varlena::varlena_to_byte_slice(p)
    }
}

/// Columns `attnums` of `tuple` as bytes (text, varchar, bytea), detoasted,
/// NULL as `None`: one pass over the tuple (`heap_deform_tuple`) rather
/// than one walk and one call into PostgreSQL per column.
///
/// # Safety
/// `tuple` and `desc` must belong together, and every `attnum` must be a
/// column of a varlena type ([`Fenced::check_types`] checked them).
unsafe fn values<'a, const N: usize>(
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    attnums: [c_int; N],
) -> [Option<&'a [u8]>; N] {
    /// Tables up to this many columns are read from stack buffers.
    const MAX: usize = 64;
    let mut out = [None; N];
    // SAFETY: per the caller.
    let natts = usize::try_from(unsafe { (*desc).natts }).unwrap_or(0);
    if natts > MAX {
        for (o, &attnum) in out.iter_mut().zip(&attnums) {
            let mut is_null = false;
            // SAFETY: per the caller.
            *o = unsafe {
                let datum = pg_sys::SPI_getbinval(tuple, desc, attnum, &mut is_null);
                (!is_null && !datum.is_null()).then(|| bytes(datum))
            };
        }
        return out;
    }
    let mut datums = [pg_sys::Datum::from(0); MAX];
    let mut nulls = [true; MAX];
    // SAFETY: buffers of at least natts entries; the datums point into
    // `tuple`, which outlives the firing.
    unsafe { pg_sys::heap_deform_tuple(tuple, desc, datums.as_mut_ptr(), nulls.as_mut_ptr()) };
    for (o, &attnum) in out.iter_mut().zip(&attnums) {
        let Some(i) = usize::try_from(attnum - 1).ok().filter(|&i| i < natts) else {
            continue;
        };
        if !nulls[i] && !datums[i].is_null() {
            // SAFETY: a varlena column of the tuple, per the caller.
            *o = Some(unsafe { bytes(datums[i]) });
        }
    }
    out
}

/// `tuple` with its state column replaced, and its token column too when
/// the presented token was signed (stored without the signature).
///
/// # Safety
/// As [`value`].
unsafe fn with_state(
    tuple: pg_sys::HeapTuple,
    desc: pg_sys::TupleDesc,
    fenced: &Fenced,
    state: &[u8],
    unsigned_token: Option<&str>,
) -> Result<pg_sys::Datum, Raise> {
    let datum = |d: Option<pg_sys::Datum>| {
        d.ok_or_else(|| Raise::new(SqlState::RuntimeError, "a value has no datum"))
    };
    let mut columns = [fenced.state, fenced.token];
    let mut values = [datum(state.into_datum())?, pg_sys::Datum::from(0)];
    let mut nulls = [false; 2];
    let mut n = 1;
    if let Some(token) = unsigned_token {
        values[1] = datum(token.into_datum())?;
        n = 2;
    }
    // SAFETY: the first `n` columns of this descriptor, one value and flag
    // each; PostgreSQL copies the returned tuple.
    let tuple = unsafe {
        pg_sys::heap_modify_tuple_by_cols(
            tuple,
            desc,
            n,
            columns.as_mut_ptr(),
            values.as_mut_ptr(),
            nulls.as_mut_ptr(),
        )
    };
    Ok(pg_sys::Datum::from(tuple))
}

/// A fenced-table trigger's firing, checked: its name, its table as sound,
/// and its columns' types.
struct Firing<'a> {
    data: &'a pg_sys::TriggerData,
    trig: &'a pg_sys::Trigger,
    event: pgrx::trigger_support::TriggerEvent,
    relid: pg_sys::Oid,
    desc: pg_sys::TupleDesc,
    fenced: Fenced,
}

impl Firing<'_> {
    /// Trigger argument `i` (1: the token column, 2: the state column), for
    /// messages only.
    fn arg(&self, i: usize) -> String {
        let n = usize::try_from(self.trig.tgnargs).unwrap_or(0);
        if i >= n || self.trig.tgargs.is_null() {
            return String::new();
        }
        // SAFETY: tgargs holds tgnargs NUL-terminated strings, which live in
        // the relation's trigger descriptor while the trigger fires.
        unsafe { CStr::from_ptr(*self.trig.tgargs.add(i)) }
            .to_string_lossy()
            .into_owned()
    }
}

/// The fired trigger's arguments, checked: four, UTF-8.
fn trigger_args(trig: &pg_sys::Trigger) -> Result<Vec<&str>, Raise> {
    let nargs = usize::try_from(trig.tgnargs).unwrap_or(0);
    if nargs != 4 || trig.tgargs.is_null() {
        return Err(registry::unsound("the trigger does not take 4 arguments"));
    }
    (0..nargs)
        .map(|i| {
            // SAFETY: tgargs holds tgnargs NUL-terminated strings, which
            // live in the relation's trigger descriptor while it fires.
            unsafe { CStr::from_ptr(*trig.tgargs.add(i)) }
                .to_str()
                .map_err(|_| registry::unsound("an argument is not UTF-8"))
        })
        .collect()
}

/// # Safety
/// `fcinfo` must be the one PostgreSQL passed to a trigger function.
unsafe fn firing<'a>(fcinfo: pg_sys::FunctionCallInfo, name: &str) -> Result<Firing<'a>, Raise> {
    // SAFETY: PostgreSQL's fcinfo; `from_fcinfo` checks it is a trigger call.
    let trigger = unsafe { PgTrigger::from_fcinfo(&*fcinfo) }
        .map_err(|e| registry::unsound(format!("not called as a trigger: {e}")))?;
    let trig: &'a pg_sys::Trigger = trigger.trigger();
    let relid = trigger
        .relid()
        .map_err(|e| registry::unsound(format!("no relation: {e}")))?;
    let data = trigger.trigger_data();
    // SAFETY: a trigger's relation is open and locked while it fires.
    let desc = unsafe { (*data.tg_relation).rd_att };
    // A table found sound stays cached until a relcache invalidation of it
    // (any change to its triggers, and so to their arguments, is one): its
    // trigger's arguments are the registered ones, checked when the entry
    // was made. Only a miss reads and checks them again.
    let fenced = match registry::cached(relid) {
        Some(fenced) => fenced,
        // SAFETY: desc is relid's descriptor.
        None => unsafe { registry::fenced(relid, desc, &trigger_args(trig)?)? },
    };
    // The table is sound, so its trigger of this name is the one
    // fence_protect made with these arguments: the firing must be it.
    // SAFETY: tgname is the fired trigger's NUL-terminated name.
    let fired = unsafe { CStr::from_ptr(trig.tgname) };
    if fired.to_bytes() != name.as_bytes() {
        return Err(registry::unsound(format!(
            "trigger {:?} is not one fence_protect made",
            fired.to_string_lossy()
        )));
    }
    // SAFETY: as above.
    unsafe { fenced.check_types(desc)? };
    Ok(Firing {
        data,
        trig,
        event: trigger.event(),
        relid,
        desc,
        fenced,
    })
}

/// The trigger `fence_protect` installs as `zz_fencecheck_row` (BEFORE
/// INSERT OR UPDATE OR DELETE, FOR EACH ROW; arguments: scope column, token
/// column, state column, policy).
///
/// # Safety
/// `fcinfo` must be the one PostgreSQL passed to the trigger function.
pub(crate) unsafe fn row_trigger(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Raise> {
    // SAFETY: per the caller.
    let f = unsafe { firing(fcinfo, ROW_TRIGGER)? };
    if !(f.event.fired_before() && f.event.fired_for_row()) {
        return Err(registry::unsound("must fire BEFORE … FOR EACH ROW"));
    }
    let operation = if f.event.fired_by_insert() {
        Operation::Insert
    } else if f.event.fired_by_update() {
        Operation::Update
    } else if f.event.fired_by_delete() {
        Operation::Delete
    } else {
        return Err(registry::unsound("fired by an unexpected event"));
    };
    // SAFETY: the firing's own tuples and descriptor, types checked.
    let result = unsafe { row_write(&f, operation) };
    stats::count_result(operation, &result);
    result
}

/// # Safety
/// As [`row_trigger`], for the checked firing `f`.
unsafe fn row_write(f: &Firing<'_>, operation: Operation) -> Result<pg_sys::Datum, Raise> {
    let (desc, fenced) = (f.desc, &f.fenced);
    let op_id = guard(Presented::OpId);
    let expected_version = expected_version()?;
    // The decision, logged if stale, and the new state if applied; the
    // token text to store instead of a signed one.
    let decide = |state: Option<&[u8]>, scope: Option<&[u8]>, token: &[u8], keys| {
        let request = Args {
            scope,
            token: Some(token),
            policy: Some(fenced.policy()),
            op_id,
            expected_version,
        }
        .request()?;
        let decision = calls::decide_request(state, &request, keys)?;
        if let Decision::StaleFence { presented, highest } = &decision {
            stats::log_stale(
                operation,
                Some(f.relid),
                scope.unwrap_or_default(),
                *presented,
                *highest,
            );
        }
        let unsigned = request
            .signature
            .is_some()
            .then(|| TokenText(request.token).to_string());
        Ok::<_, Raise>((calls::applied(decision)?, unsigned))
    };

    match operation {
        Operation::Insert => {
            let new = f.data.tg_trigtuple;
            // SAFETY: the new row of this relation, and its checked columns.
            let [scope, token, state] =
                unsafe { values(new, desc, [fenced.scope, fenced.token, fenced.state]) };
            if state.is_some() {
                return Err(required(format!(
                    "{} is written by fencecheck only: insert it as NULL",
                    f.arg(2)
                )));
            }
            let token = token.ok_or_else(|| {
                required(format!(
                    "an INSERT into a fenced table must set {} to the writer's token",
                    f.arg(1)
                ))
            })?;
            let scope_text = calls::text("scope", scope)?;
            let mark = take_mark(fenced.owner, f.relid, scope_text)?;
            let keys = registry::scope_keys(scope_text)?;
            let (state, unsigned) = decide(mark.as_deref(), scope, token, keys.as_deref())?;
            // SAFETY: as above.
            unsafe { with_state(new, desc, fenced, &state, unsigned.as_deref()) }
        }
        Operation::Update => {
            let (old, new) = (f.data.tg_trigtuple, f.data.tg_newtuple);
            // SAFETY: the old and new versions of a row of this relation.
            let ([old_scope, old_state], [new_scope, new_state, token]) = unsafe {
                (
                    values(old, desc, [fenced.scope, fenced.state]),
                    values(new, desc, [fenced.scope, fenced.state, fenced.token]),
                )
            };
            if old_scope != new_scope {
                return Err(required("a fenced row cannot move to another scope"));
            }
            if old_state != new_state {
                return Err(required(format!(
                    "{} is written by fencecheck only",
                    f.arg(2)
                )));
            }
            // SAFETY: tg_updatedcols is the SET list's column set (PostgreSQL
            // 13+), offset by FirstLowInvalidHeapAttributeNumber.
            let presented = unsafe {
                pg_sys::bms_is_member(
                    fenced.token - pg_sys::FirstLowInvalidHeapAttributeNumber,
                    f.data.tg_updatedcols,
                )
            };
            let token = token.filter(|_| presented).ok_or_else(|| {
                required(format!(
                    "an UPDATE of a fenced table must SET {} to the writer's token",
                    f.arg(1)
                ))
            })?;
            let keys = registry::scope_keys(calls::text("scope", old_scope)?)?;
            let (state, unsigned) = decide(old_state, old_scope, token, keys.as_deref())?;
            // SAFETY: as above.
            unsafe { with_state(new, desc, fenced, &state, unsigned.as_deref()) }
        }
        Operation::Delete => {
            let old = f.data.tg_trigtuple;
            // SAFETY: the deleted row of this relation.
            let [scope, state] = unsafe { values(old, desc, [fenced.scope, fenced.state]) };
            let token = match settings::presented(Presented::Token) {
                Value::Current(token) => token,
                Value::Absent => {
                    return Err(required(
                        "a DELETE from a fenced table must present a token: SET LOCAL fencecheck.token = '…' in its transaction",
                    ));
                }
                Value::Stale => {
                    return Err(required(
                        "fencecheck.token was not set in this transaction (a session-level SET outlives the transaction it was meant for): SET LOCAL fencecheck.token = '…' in the DELETE's transaction",
                    ));
                }
            };
            let scope_text = calls::text("scope", scope)?;
            let keys = registry::scope_keys(scope_text)?;
            let (state, _) = decide(state, scope, token, keys.as_deref())?;
            keep_mark(fenced.owner, f.relid, scope_text, &state)?;
            Ok(pg_sys::Datum::from(old))
        }
        Operation::FenceCheck | Operation::FenceNext => {
            Err(registry::unsound("fired by an unexpected event"))
        }
    }
}

/// The trigger `fence_protect` installs as `fencecheck_inserted` (AFTER
/// INSERT, FOR EACH ROW, the row trigger's arguments): the inserted row now
/// holds its scope's state, so the tombstone (or the slot the INSERT
/// locked) goes.
///
/// # Safety
/// `fcinfo` must be the one PostgreSQL passed to the trigger function.
pub(crate) unsafe fn inserted_trigger(
    fcinfo: pg_sys::FunctionCallInfo,
) -> Result<pg_sys::Datum, Raise> {
    // SAFETY: per the caller.
    let f = unsafe { firing(fcinfo, INSERTED_TRIGGER)? };
    if !(f.event.fired_after() && f.event.fired_for_row() && f.event.fired_by_insert()) {
        return Err(registry::unsound("must fire AFTER INSERT … FOR EACH ROW"));
    }
    // SAFETY: the inserted row of this relation, its scope column checked.
    let [scope] = unsafe { values(f.data.tg_trigtuple, f.desc, [f.fenced.scope]) };
    drop_mark(f.fenced.owner, f.relid, calls::text("scope", scope)?)?;
    Ok(pg_sys::Datum::from(0))
}

/// `fence_protect(tbl, scope_column, token_column, state_column, policy)`:
/// `fencecheck.protect` (sql/protect.sql) runs as the extension's owner for
/// the calling role, which it checks owns the table: only the owner (or a
/// superuser) may change how a table is fenced.
pub(crate) fn fence_protect(
    tbl: Option<pg_sys::Oid>,
    columns: [Option<&str>; 3],
    policy: Option<&str>,
) -> Result<(), Raise> {
    // SAFETY: the current user, as PostgreSQL's own permission checks read it.
    let caller = unsafe { pg_sys::GetUserId() };
    let [scope, token, state] = columns;
    refusal(as_owner(crate::soundness::extension_owner()?, |client| {
        client
            .update(
                "SELECT fencecheck.protect($1::pg_catalog.oid::pg_catalog.regclass, $2, $3, $4, $5, $6)",
                None,
                &[
                    tbl.into(),
                    scope.into(),
                    token.into(),
                    state.into(),
                    policy.into(),
                    caller.into(),
                ],
            )
            .and_then(|rows| rows.first().get_one::<String>())
            .map_err(|e| Raise::new(SqlState::RuntimeError, e))
    })?)
}

/// `fencecheck.protect`'s answer: NULL, or a refusal as 'SQLSTATE message'.
fn refusal(answer: Option<String>) -> Result<(), Raise> {
    let Some(answer) = answer else {
        return Ok(());
    };
    let (code, message) = answer.split_at(answer.find(' ').unwrap_or(0));
    Err(match SqlState::from_code(code) {
        // The SQL's own HINT does not survive the EXCEPTION block that turns
        // the error into this answer, so the hint is the state's.
        Some(state) => Raise {
            state,
            message: message.trim_start().to_string(),
            hint: match state {
                SqlState::InvalidArgument => Some(hint::PROTECT),
                SqlState::UnsoundFence => Some(hint::UNSOUND),
                _ => None,
            },
        },
        None => Raise::new(SqlState::RuntimeError, answer),
    })
}

/// `fence_unprotect(tbl)`, as [`fence_protect`].
pub(crate) fn fence_unprotect(tbl: Option<pg_sys::Oid>) -> Result<(), Raise> {
    // SAFETY: as in fence_protect.
    let caller = unsafe { pg_sys::GetUserId() };
    refusal(as_owner(crate::soundness::extension_owner()?, |client| {
        client
            .update(
                "SELECT fencecheck.unprotect($1::pg_catalog.oid::pg_catalog.regclass, $2)",
                None,
                &[tbl.into(), caller.into()],
            )
            .and_then(|rows| rows.first().get_one::<String>())
            .map_err(|e| Raise::new(SqlState::RuntimeError, e))
    })?)
}

/// The statement trigger on `fencecheck.keys`: every backend drops its
/// copy of the keys (a relcache invalidation of the table, sent at commit),
/// and the change waits for the fenced writes in flight while new ones
/// wait for it (SHARE ROW EXCLUSIVE on every fenced table, in one order):
/// no write commits after the change decided by the keys before it.
///
/// # Safety
/// `fcinfo` must be the one PostgreSQL passed to the trigger function.
pub(crate) unsafe fn keys_changed(
    fcinfo: pg_sys::FunctionCallInfo,
) -> Result<pg_sys::Datum, Raise> {
    // SAFETY: PostgreSQL's fcinfo; `from_fcinfo` checks it is a trigger call.
    let trigger = unsafe { PgTrigger::from_fcinfo(&*fcinfo) }
        .map_err(|e| registry::unsound(format!("not called as a trigger: {e}")))?;
    let relid = trigger
        .relid()
        .map_err(|e| registry::unsound(format!("no relation: {e}")))?;
    pgrx::spi::Spi::run(
        "DO $lock$ DECLARE r pg_catalog.regclass; BEGIN \
           FOR r IN SELECT relid FROM fencecheck.protected ORDER BY relid::pg_catalog.oid LOOP \
             EXECUTE pg_catalog.format('LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE', r); \
           END LOOP; END $lock$",
    )
    .map_err(|e| Raise::new(SqlState::RuntimeError, e))?;
    // SAFETY: queues an invalidation of this relation for commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
    Ok(pg_sys::Datum::from(0))
}

/// Lock the scope's tombstone slot and return its state. The upsert waits
/// for a concurrent DELETE of the scope to finish and then sees its
/// tombstone (READ COMMITTED), or fails with a serialization error
/// (REPEATABLE READ, SERIALIZABLE): never decides without it.
fn take_mark(
    owner: pg_sys::Oid,
    relid: pg_sys::Oid,
    scope: &str,
) -> Result<Option<Vec<u8>>, Raise> {
    as_owner(owner, |client| {
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
fn drop_mark(owner: pg_sys::Oid, relid: pg_sys::Oid, scope: &str) -> Result<(), Raise> {
    as_owner(owner, |client| {
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
fn keep_mark(
    owner: pg_sys::Oid,
    relid: pg_sys::Oid,
    scope: &str,
    state: &[u8],
) -> Result<(), Raise> {
    as_owner(owner, |client| {
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
