//! The C entry points PostgreSQL calls, and raising an error with the
//! extension's own SQLSTATE.
//!
//! Why not `#[pg_extern]`: pgrx reports errors only with the SQLSTATEs of
//! its `PgSqlErrorCode` enum, which has no room for the extension's class
//! `5F` (`sqlstate.rs`). So each entry point is a V1 C function written
//! here: the work runs inside pgrx's guard (PostgreSQL errors raised within,
//! from detoasting or SPI, pass through with their own codes), and a
//! [`Raise`] it returns is reported from the entry point's own frame, after
//! every Rust value is dropped, exactly as pgrx reports its own errors.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char, c_int};

use pgrx::IntoDatum;
use pgrx::pg_sys;

use crate::calls::{self, Args};
use crate::protect;
use crate::soundness;
use crate::sqlstate::{Raise, SqlState, hint};
use crate::stats::{self, Operation, Outcome};

unsafe extern "C-unwind" {
    // PostgreSQL's error reporting (elog.h); pgrx keeps them out of its
    // bindings on purpose, so they are declared here, used only in `raise`.
    fn errstart(elevel: c_int, domain: *const c_char) -> bool;
    fn errcode(sqlerrcode: c_int) -> c_int;
    fn errmsg(fmt: *const c_char, ...) -> c_int;
    fn errhint(fmt: *const c_char, ...) -> c_int;
    fn errfinish(filename: *const c_char, lineno: c_int, funcname: *const c_char);
}

/// The result of one call: a datum, SQL NULL, or a refusal.
pub(crate) enum Out {
    Datum(pg_sys::Datum),
    Null,
}

/// Report `raise` as an ERROR. Never returns: PostgreSQL longjmps out.
///
/// # Safety
/// Call only from an entry point's outermost frame, with nothing left to
/// drop on the Rust stack (the strings made here are dropped first).
unsafe fn raise(raise: Raise) -> ! {
    let message = CString::new(raise.message.replace('\0', "\\0")).unwrap_or_default();
    let hint = raise.hint.and_then(|h| CString::new(h).ok());
    let code = raise.state.packed();
    drop(raise);
    // SAFETY: the elog protocol: errstart, the fields (each copies its
    // formatted text into the error data), errfinish. `%s` keeps the texts
    // from being read as format strings.
    unsafe {
        if errstart(pg_sys::PGERROR as c_int, std::ptr::null()) {
            errcode(code);
            errmsg(c"%s".as_ptr(), message.as_ptr());
            if let Some(hint) = &hint {
                errhint(c"%s".as_ptr(), hint.as_ptr());
            }
        }
        drop(message);
        drop(hint);
        errfinish(c"fencecheck".as_ptr(), 0, std::ptr::null());
    }
    // errfinish at ERROR does not return; if it ever did, stop hard rather
    // than return a value PostgreSQL would take as a result.
    std::process::abort()
}

/// Run `work` under pgrx's guard, then hand its datum back or raise.
///
/// # Safety
/// `fcinfo` must be the call info PostgreSQL passed to the entry point.
unsafe fn entry(
    fcinfo: pg_sys::FunctionCallInfo,
    work: fn(pg_sys::FunctionCallInfo) -> Result<Out, Raise>,
) -> pg_sys::Datum {
    // SAFETY: called at the top of an extern "C-unwind" entry point, whose
    // frame holds nothing with a destructor.
    let result = unsafe { pg_sys::panic::pgrx_extern_c_guard(|| work(fcinfo)) };
    match result {
        Ok(Out::Datum(datum)) => datum,
        // SAFETY: fcinfo is PostgreSQL's.
        Ok(Out::Null) => unsafe { pgrx::pg_return_null(fcinfo) },
        // SAFETY: the outermost frame; `result` was moved into `raise`.
        Err(e) => unsafe { raise(e) },
    }
}

/// Argument `n` as bytes (bytea or text), detoasted; `None` for NULL.
///
/// # Safety
/// `fcinfo` must be PostgreSQL's, with at least `n + 1` varlena arguments.
unsafe fn bytes_arg<'a>(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<&'a [u8]> {
    // SAFETY: per the caller; the detoasted copy lives in the call's memory
    // context, which outlives this call.
    unsafe { pgrx::pg_getarg::<&[u8]>(fcinfo, n) }
}

/// `(state, scope, token, policy, op_id, expected_version)`.
fn check_args<'a>(fcinfo: pg_sys::FunctionCallInfo) -> (Option<&'a [u8]>, Args<'a>) {
    // SAFETY: the SQL declarations (sql/fencecheck.sql) fix the six
    // argument types: bytea, text, text, text, text, bigint.
    unsafe {
        (
            bytes_arg(fcinfo, 0),
            Args {
                scope: bytes_arg(fcinfo, 1),
                token: bytes_arg(fcinfo, 2),
                policy: bytes_arg(fcinfo, 3),
                op_id: bytes_arg(fcinfo, 4),
                expected_version: pgrx::pg_getarg::<i64>(fcinfo, 5),
            },
        )
    }
}

/// The 7-argument forms' `keys` (text): the scope requires signed tokens.
/// NULL, or the 6-argument forms: it does not.
fn keys_arg(fcinfo: pg_sys::FunctionCallInfo) -> Result<Option<Vec<fencecheck::GrantKey>>, Raise> {
    // SAFETY: PostgreSQL's fcinfo; the 7-argument declarations make
    // argument 6 text.
    let nargs = unsafe { (*fcinfo).nargs };
    if nargs < 7 {
        return Ok(None);
    }
    // SAFETY: as above.
    match unsafe { bytes_arg(fcinfo, 6) } {
        None => Ok(None),
        Some(text) => calls::keys(text).map(Some),
    }
}

fn fence_check(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    let (state, args) = check_args(fcinfo);
    let decision = keys_arg(fcinfo).and_then(|keys| calls::decide(state, &args, keys.as_deref()));
    match &decision {
        Ok(d) => stats::count(Operation::FenceCheck, Outcome::of_decision(d)),
        Err(e) => stats::count(Operation::FenceCheck, Outcome::of_raise(e)),
    }
    Ok(datum(decision?.name().into_datum()))
}

fn fence_next(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    let (state, args) = check_args(fcinfo);
    let next = keys_arg(fcinfo)
        .and_then(|keys| calls::decide(state, &args, keys.as_deref()))
        .and_then(|decision| {
            if let fencecheck::Decision::StaleFence { presented, highest } = &decision {
                let scope = args.scope.unwrap_or_default();
                stats::log_stale(Operation::FenceNext, None, scope, *presented, *highest);
            }
            calls::applied(decision)
        });
    stats::count_result(Operation::FenceNext, &next);
    Ok(datum(next?.as_slice().into_datum()))
}

fn fence_inspect(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    // SAFETY: declared (bytea) STRICT: never called with NULL.
    let Some(state) = (unsafe { bytes_arg(fcinfo, 0) }) else {
        return Ok(Out::Null);
    };
    Ok(datum(pgrx::JsonB(calls::inspect(state)?).into_datum()))
}

fn fence_version(_fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    Ok(datum(calls::component_version()?.into_datum()))
}

fn datum(d: Option<pg_sys::Datum>) -> Out {
    d.map_or(Out::Null, Out::Datum)
}

fn row_trigger(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    // SAFETY: declared RETURNS trigger; `protect` checks it was called as one.
    unsafe { protect::row_trigger(fcinfo) }.map(Out::Datum)
}

fn inserted_trigger(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    // SAFETY: declared RETURNS trigger; `protect` checks it was called as one.
    unsafe { protect::inserted_trigger(fcinfo) }.map(Out::Datum)
}

fn keys_changed(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    // SAFETY: declared RETURNS trigger; `protect` checks it was called as one.
    unsafe { protect::keys_changed(fcinfo) }.map(Out::Datum)
}

/// Argument `n` as text, NULL as `None`; not UTF-8 is refused.
fn text_arg<'a>(
    fcinfo: pg_sys::FunctionCallInfo,
    n: usize,
    what: &str,
) -> Result<Option<&'a str>, Raise> {
    // SAFETY: the declarations make argument `n` text.
    match unsafe { bytes_arg(fcinfo, n) } {
        None => Ok(None),
        Some(bytes) => calls::text(what, Some(bytes)).map(Some),
    }
}

fn fence_protect(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    // SAFETY: declared (regclass, text, text, text, text).
    let tbl = unsafe { pgrx::pg_getarg::<pg_sys::Oid>(fcinfo, 0) };
    protect::fence_protect(
        tbl,
        [
            text_arg(fcinfo, 1, "scope_column")?,
            text_arg(fcinfo, 2, "token_column")?,
            text_arg(fcinfo, 3, "state_column")?,
        ],
        text_arg(fcinfo, 4, "policy")?,
    )?;
    Ok(Out::Null)
}

fn fence_unprotect(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    // SAFETY: declared (regclass).
    protect::fence_unprotect(unsafe { pgrx::pg_getarg::<pg_sys::Oid>(fcinfo, 0) })?;
    Ok(Out::Null)
}

/// A `regclass` argument (NULL: `None`).
fn relid_arg(fcinfo: pg_sys::FunctionCallInfo, n: usize) -> Option<pg_sys::Oid> {
    // SAFETY: the declaration makes argument `n` regclass.
    unsafe { pgrx::pg_getarg::<pg_sys::Oid>(fcinfo, n) }
}

fn reason(reason: Option<String>) -> Out {
    reason.map_or(Out::Null, |r| datum(r.as_str().into_datum()))
}

fn unfit(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    // Declared STRICT: no argument is NULL.
    let Some(relid) = relid_arg(fcinfo, 0) else {
        return Ok(Out::Null);
    };
    let column = |n, what| text_arg(fcinfo, n, what).map(Option::unwrap_or_default);
    let columns = [
        column(1, "scope_column")?,
        column(2, "token_column")?,
        column(3, "state_column")?,
    ];
    Ok(reason(soundness::unfit_of(relid, columns)))
}

fn trigger_trouble(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    let Some(relid) = relid_arg(fcinfo, 0) else {
        return Ok(Out::Null);
    };
    // SAFETY: declared (regclass, boolean, name); the name may be NULL.
    let complete = unsafe { pgrx::pg_getarg::<bool>(fcinfo, 1) }.unwrap_or(true);
    // A `name` datum points at its NUL-terminated NameData.
    let just = unsafe { pgrx::pg_getarg::<&std::ffi::CStr>(fcinfo, 2) }
        .map(|n| n.to_string_lossy().into_owned());
    Ok(reason(soundness::trigger_trouble_of(
        relid,
        complete,
        just.as_deref(),
    )?))
}

fn unsound(fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    let Some(relid) = relid_arg(fcinfo, 0) else {
        return Ok(Out::Null);
    };
    Ok(reason(soundness::unsound(relid)?))
}

fn decision_counts(_fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    Ok(datum(stats::counts().into_datum()))
}

fn metrics(_fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    Ok(datum(stats::exposition().into_datum()))
}

fn decision_coverage(_fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    Ok(datum(stats::coverage().into_datum()))
}

fn truncate_trigger(_fcinfo: pg_sys::FunctionCallInfo) -> Result<Out, Raise> {
    Err(Raise::new(
        SqlState::FenceRequired,
        "TRUNCATE of a fenced table is refused: delete rows with a token, or fence_unprotect the table first",
    )
    .with_hint(hint::FENCE_REQUIRED))
}

/// The V1 calling-convention record every entry point declares.
static V1: pg_sys::Pg_finfo_record = pg_sys::Pg_finfo_record { api_version: 1 };

macro_rules! entry_points {
    ($($name:ident, $finfo:ident => $work:ident;)*) => {$(
        #[doc = concat!("PostgreSQL's `", stringify!($name), "` (V1 calling convention).")]
        ///
        /// # Safety
        /// Only PostgreSQL calls this, with a valid `fcinfo`.
        #[unsafe(no_mangle)]
        pub unsafe extern "C-unwind" fn $name(fcinfo: pg_sys::FunctionCallInfo) -> pg_sys::Datum {
            // SAFETY: PostgreSQL's fcinfo.
            unsafe { entry(fcinfo, $work) }
        }

        #[doc = concat!("The calling convention of `", stringify!($name), "`.")]
        #[unsafe(no_mangle)]
        pub extern "C" fn $finfo() -> &'static pg_sys::Pg_finfo_record {
            &V1
        }
    )*};
}

entry_points! {
    fencecheck_fence_check, pg_finfo_fencecheck_fence_check => fence_check;
    fencecheck_fence_next, pg_finfo_fencecheck_fence_next => fence_next;
    fencecheck_fence_inspect, pg_finfo_fencecheck_fence_inspect => fence_inspect;
    fencecheck_fence_version, pg_finfo_fencecheck_fence_version => fence_version;
    fencecheck_row_trigger, pg_finfo_fencecheck_row_trigger => row_trigger;
    fencecheck_truncate_trigger, pg_finfo_fencecheck_truncate_trigger => truncate_trigger;
    fencecheck_inserted_trigger, pg_finfo_fencecheck_inserted_trigger => inserted_trigger;
    fencecheck_keys_changed, pg_finfo_fencecheck_keys_changed => keys_changed;
    fencecheck_fence_protect, pg_finfo_fencecheck_fence_protect => fence_protect;
    fencecheck_fence_unprotect, pg_finfo_fencecheck_fence_unprotect => fence_unprotect;
    fencecheck_decision_counts, pg_finfo_fencecheck_decision_counts => decision_counts;
    fencecheck_decision_coverage, pg_finfo_fencecheck_decision_coverage => decision_coverage;
    fencecheck_metrics, pg_finfo_fencecheck_metrics => metrics;
    fencecheck_unfit, pg_finfo_fencecheck_unfit => unfit;
    fencecheck_trigger_trouble, pg_finfo_fencecheck_trigger_trouble => trigger_trouble;
    fencecheck_unsound, pg_finfo_fencecheck_unsound => unsound;
}
