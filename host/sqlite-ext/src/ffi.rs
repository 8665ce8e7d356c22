//! The C side: the entry point SQLite calls when it loads the library, the
//! three function trampolines, and the part of `sqlite3_api_routines` they
//! use. Everything SQLite-facing is here; `functions.rs` is safe Rust.
//!
//! No panic crosses into SQLite: every entry from C runs under
//! `catch_unwind`, and a caught panic becomes an SQL error.
#![allow(unsafe_code)] // FFI with SQLite; each block states its invariant

use std::ffi::{c_char, c_int, c_uchar, c_void};
use std::mem::{offset_of, size_of};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use fencecheck::{Instance, Runtime};

use crate::functions::{self, Arg, Output, SqlError};

/// `sqlite3` (opaque).
#[repr(C)]
pub struct Sqlite3 {
    _opaque: [u8; 0],
}

/// `sqlite3_context` (opaque).
#[repr(C)]
pub struct Context {
    _opaque: [u8; 0],
}

/// `sqlite3_value` (opaque).
#[repr(C)]
pub struct Value {
    _opaque: [u8; 0],
}

const SQLITE_OK: c_int = 0;
const SQLITE_ERROR: c_int = 1;
const SQLITE_INTEGER: c_int = 1;
const SQLITE_FLOAT: c_int = 2;
const SQLITE_TEXT: c_int = 3;
const SQLITE_BLOB: c_int = 4;
const SQLITE_UTF8: c_int = 1;
const SQLITE_DETERMINISTIC: c_int = 0x800;
/// `SQLITE_TRANSIENT`: SQLite copies the bytes before the call returns. The
/// destructor parameter is declared as `isize` below so that -1 needs no cast
/// to a function pointer (same size and calling convention as a pointer).
const SQLITE_TRANSIENT: isize = -1;
/// `SQLITE_STATIC`: the bytes outlive the statement (`&'static str`), so
/// SQLite keeps the pointer instead of copying.
const SQLITE_STATIC: isize = 0;

type Slot = *const c_void;
type XFunc = unsafe extern "C" fn(*mut Context, c_int, *mut *mut Value);
type XFinal = unsafe extern "C" fn(*mut Context);
type XDestroy = unsafe extern "C" fn(*mut c_void);
type CreateFunctionV2 = unsafe extern "C" fn(
    *mut Sqlite3,
    *const c_char,
    c_int,
    c_int,
    *mut c_void,
    Option<XFunc>,
    Option<XFunc>,
    Option<XFinal>,
    Option<XDestroy>,
) -> c_int;

/// The first 163 entries of `struct sqlite3_api_routines` (sqlite3ext.h). The
/// table only ever grows at the end, so this prefix is valid for every SQLite
/// since 3.7.3 (which added `create_function_v2`). Entries not used here are
/// opaque slots; the assertions below pin each used entry to its index.
#[repr(C)]
pub struct ApiRoutines {
    _unused_0: [Slot; 68],
    malloc: Option<unsafe extern "C" fn(c_int) -> *mut c_void>,
    _unused_69: [Slot; 9],
    result_blob: Option<unsafe extern "C" fn(*mut Context, *const c_void, c_int, isize)>,
    _unused_79: [Slot; 1],
    result_error: Option<unsafe extern "C" fn(*mut Context, *const c_char, c_int)>,
    _unused_81: [Slot; 3],
    result_null: Option<unsafe extern "C" fn(*mut Context)>,
    result_text: Option<unsafe extern "C" fn(*mut Context, *const c_char, c_int, isize)>,
    _unused_86: [Slot; 15],
    user_data: Option<unsafe extern "C" fn(*mut Context) -> *mut c_void>,
    value_blob: Option<unsafe extern "C" fn(*mut Value) -> *const c_void>,
    value_bytes: Option<unsafe extern "C" fn(*mut Value) -> c_int>,
    _unused_104: [Slot; 3],
    value_int64: Option<unsafe extern "C" fn(*mut Value) -> i64>,
    _unused_108: [Slot; 1],
    value_text: Option<unsafe extern "C" fn(*mut Value) -> *const c_uchar>,
    _unused_110: [Slot; 3],
    value_type: Option<unsafe extern "C" fn(*mut Value) -> c_int>,
    _unused_114: [Slot; 48],
    create_function_v2: Option<CreateFunctionV2>,
}

// Each entry's index in sqlite3ext.h, counted from `aggregate_context` = 0.
const _: () = {
    const P: usize = size_of::<Slot>();
    assert!(offset_of!(ApiRoutines, malloc) == 68 * P);
    assert!(offset_of!(ApiRoutines, result_blob) == 78 * P);
    assert!(offset_of!(ApiRoutines, result_error) == 80 * P);
    assert!(offset_of!(ApiRoutines, result_null) == 84 * P);
    assert!(offset_of!(ApiRoutines, result_text) == 85 * P);
    assert!(offset_of!(ApiRoutines, user_data) == 101 * P);
    assert!(offset_of!(ApiRoutines, value_blob) == 102 * P);
    assert!(offset_of!(ApiRoutines, value_bytes) == 103 * P);
    assert!(offset_of!(ApiRoutines, value_int64) == 107 * P);
    assert!(offset_of!(ApiRoutines, value_text) == 109 * P);
    assert!(offset_of!(ApiRoutines, value_type) == 113 * P);
    assert!(offset_of!(ApiRoutines, create_function_v2) == 162 * P);
    assert!(size_of::<ApiRoutines>() == 163 * P);
};

/// The routines this library calls, checked non-null once at load.
#[derive(Clone, Copy)]
struct Api {
    table: usize,
    malloc: unsafe extern "C" fn(c_int) -> *mut c_void,
    result_blob: unsafe extern "C" fn(*mut Context, *const c_void, c_int, isize),
    result_error: unsafe extern "C" fn(*mut Context, *const c_char, c_int),
    result_null: unsafe extern "C" fn(*mut Context),
    result_text: unsafe extern "C" fn(*mut Context, *const c_char, c_int, isize),
    user_data: unsafe extern "C" fn(*mut Context) -> *mut c_void,
    value_blob: unsafe extern "C" fn(*mut Value) -> *const c_void,
    value_bytes: unsafe extern "C" fn(*mut Value) -> c_int,
    value_int64: unsafe extern "C" fn(*mut Value) -> i64,
    value_text: unsafe extern "C" fn(*mut Value) -> *const c_uchar,
    value_type: unsafe extern "C" fn(*mut Value) -> c_int,
    create_function_v2: CreateFunctionV2,
}

impl Api {
    fn from_table(t: &ApiRoutines) -> Option<Self> {
        Some(Self {
            table: std::ptr::from_ref(t) as usize,
            malloc: t.malloc?,
            result_blob: t.result_blob?,
            result_error: t.result_error?,
            result_null: t.result_null?,
            result_text: t.result_text?,
            user_data: t.user_data?,
            value_blob: t.value_blob?,
            value_bytes: t.value_bytes?,
            value_int64: t.value_int64?,
            value_text: t.value_text?,
            value_type: t.value_type?,
            create_function_v2: t.create_function_v2?,
        })
    }
}

/// The routines of the SQLite library that loaded us. A process has one
/// copy of this library (it is never unloaded, see build.rs), so it can
/// serve only one SQLite library: a second, different one is refused at load.
static API: OnceLock<Api> = OnceLock::new();

/// One component runtime per process (engine, compiled component).
static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// Per connection: its own component instance, shared by its functions.
struct PerConnection {
    runtime: Runtime,
    instance: Mutex<Instance>,
}

impl PerConnection {
    /// The instance; after a panic poisoned it, a fresh one replaces it.
    fn lock(&self) -> Result<MutexGuard<'_, Instance>, SqlError> {
        match self.instance.lock() {
            Ok(guard) => Ok(guard),
            Err(poisoned) => {
                self.instance.clear_poison();
                let mut guard = poisoned.into_inner();
                *guard = self
                    .runtime
                    .instance()
                    .map_err(|e| SqlError(format!("runtime-error: {e}")))?;
                Ok(guard)
            }
        }
    }
}

type Function = fn(&mut dyn fencecheck::Checker, &[Arg<'_>]) -> Result<Output, SqlError>;

// fence_check and fence_next with 7 arguments take the scope's keys last
// (signed tokens); SQLite picks the registration by argument count.
const FUNCTIONS: [(&std::ffi::CStr, c_int, XFunc); 6] = [
    (c"fence_check", 6, fence_check),
    (c"fence_check", 7, fence_check),
    (c"fence_next", 6, fence_next),
    (c"fence_next", 7, fence_next),
    (c"fence_inspect", 1, fence_inspect),
    (c"fence_version", 0, fence_version),
];

/// The entry point SQLite looks for by default.
///
/// # Safety
/// Called by SQLite's extension loader with a valid connection, error-message
/// slot and routine table.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sqlite3_extension_init(
    db: *mut Sqlite3,
    err: *mut *mut c_char,
    api: *const ApiRoutines,
) -> c_int {
    // SAFETY: the caller's contract is ours.
    unsafe { sqlite3_fencecheck_init(db, err, api) }
}

/// The same entry point under this extension's own name.
///
/// # Safety
/// Called by SQLite's extension loader with a valid connection, error-message
/// slot and routine table.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn sqlite3_fencecheck_init(
    db: *mut Sqlite3,
    err: *mut *mut c_char,
    api: *const ApiRoutines,
) -> c_int {
    // SAFETY: `api` is null or SQLite's routine table, valid for the process.
    let Some(api) = (unsafe { api.as_ref() }).and_then(Api::from_table) else {
        return SQLITE_ERROR;
    };
    let loaded = catch_unwind(AssertUnwindSafe(|| init(db, api)));
    let message = match loaded {
        Ok(Ok(())) => return SQLITE_OK,
        Ok(Err(message)) => message,
        Err(_) => "internal-error: the fencecheck extension panicked while loading".into(),
    };
    // SAFETY: `err` is SQLite's slot for a message it frees with sqlite3_free.
    unsafe { set_load_error(&api, err, &message) };
    SQLITE_ERROR
}

fn init(db: *mut Sqlite3, api: Api) -> Result<(), String> {
    let first = *API.get_or_init(|| api);
    if first.table != api.table {
        return Err(
            "runtime-error: fencecheck is already loaded by another SQLite library in this process"
                .into(),
        );
    }
    let runtime = match RUNTIME.get() {
        Some(rt) => rt.clone(),
        None => {
            let rt = Runtime::new().map_err(|e| format!("runtime-error: {e}"))?;
            RUNTIME.get_or_init(|| rt).clone()
        }
    };
    let instance = runtime
        .instance()
        .map_err(|e| format!("runtime-error: {e}"))?;
    let shared = Arc::new(PerConnection {
        runtime,
        instance: Mutex::new(instance),
    });
    for (name, args, func) in FUNCTIONS {
        let data = Box::into_raw(Box::new(Arc::clone(&shared))).cast::<c_void>();
        // SAFETY: `db` is the loading connection; `data` is owned by SQLite
        // from here on and released through `destroy` (also on failure).
        let rc = unsafe {
            (api.create_function_v2)(
                db,
                name.as_ptr(),
                args,
                SQLITE_UTF8 | SQLITE_DETERMINISTIC,
                data,
                Some(func),
                None,
                None,
                Some(destroy),
            )
        };
        if rc != SQLITE_OK {
            return Err(format!(
                "registering {}: SQLite error {rc}",
                name.to_string_lossy()
            ));
        }
    }
    Ok(())
}

/// Hand `message` to SQLite in memory it owns (`sqlite3_malloc`).
///
/// # Safety
/// `err` is null or a valid slot for SQLite's error message.
unsafe fn set_load_error(api: &Api, err: *mut *mut c_char, message: &str) {
    if err.is_null() {
        return;
    }
    let bytes: Vec<u8> = message.bytes().filter(|b| *b != 0).collect();
    let Ok(size) = c_int::try_from(bytes.len() + 1) else {
        return;
    };
    // SAFETY: sqlite3_malloc returns null or `size` writable bytes; we write
    // `bytes.len()` bytes and the terminating NUL.
    unsafe {
        let out = (api.malloc)(size).cast::<u8>();
        if out.is_null() {
            return;
        }
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, bytes.len());
        *out.add(bytes.len()) = 0;
        *err = out.cast::<c_char>();
    }
}

unsafe extern "C" fn destroy(data: *mut c_void) {
    if data.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `data` came from `Box::into_raw` in `init`; SQLite calls
        // this exactly once per registration.
        drop(unsafe { Box::from_raw(data.cast::<Arc<PerConnection>>()) });
    }));
}

unsafe extern "C" fn fence_check(ctx: *mut Context, argc: c_int, argv: *mut *mut Value) {
    // SAFETY: called by SQLite with its own context and arguments.
    unsafe { dispatch(ctx, argc, argv, functions::fence_check) }
}

unsafe extern "C" fn fence_next(ctx: *mut Context, argc: c_int, argv: *mut *mut Value) {
    // SAFETY: called by SQLite with its own context and arguments.
    unsafe { dispatch(ctx, argc, argv, functions::fence_next) }
}

unsafe extern "C" fn fence_inspect(ctx: *mut Context, argc: c_int, argv: *mut *mut Value) {
    // SAFETY: called by SQLite with its own context and arguments.
    unsafe { dispatch(ctx, argc, argv, functions::fence_inspect) }
}

unsafe extern "C" fn fence_version(ctx: *mut Context, argc: c_int, argv: *mut *mut Value) {
    // SAFETY: called by SQLite with its own context and arguments.
    unsafe {
        with_connection(ctx, argc, argv, |shared, args| {
            functions::fence_version(shared.runtime.component_version(), args)
        })
    }
}

/// Read the arguments, run `function` on this connection's instance, and set
/// the result or the error.
///
/// # Safety
/// `ctx`, `argc` and `argv` are what SQLite passed to a function registered
/// by `init`.
unsafe fn dispatch(ctx: *mut Context, argc: c_int, argv: *mut *mut Value, function: Function) {
    // SAFETY: the caller's contract is ours.
    unsafe {
        with_connection(ctx, argc, argv, |shared, args| {
            let mut instance = shared.lock()?;
            function(&mut *instance, args)
        })
    }
}

/// Read the arguments, run `function` with this connection's state, and set
/// the result or the error.
///
/// # Safety
/// As [`dispatch`].
unsafe fn with_connection(
    ctx: *mut Context,
    argc: c_int,
    argv: *mut *mut Value,
    function: impl FnOnce(&PerConnection, &[Arg<'_>]) -> Result<Output, SqlError>,
) {
    // Registered only after API was set.
    let Some(api) = API.get().copied() else {
        return;
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: user data is the `Arc<PerConnection>` boxed in `init`,
        // alive until SQLite calls `destroy`, after the last call.
        let shared = unsafe { (api.user_data)(ctx).cast::<Arc<PerConnection>>().as_ref() }
            .ok_or_else(|| SqlError("runtime-error: function called without its state".into()))?;
        // SAFETY: SQLite's arguments for this call.
        let (args, count) = unsafe { read_args(&api, argc, argv) }?;
        function(shared, &args[..count])
    }));
    let result = match outcome {
        Ok(result) => result,
        Err(_) => Err(SqlError(
            "internal-error: the fencecheck extension panicked; nothing was decided".into(),
        )),
    };
    // SAFETY: `ctx` is this call's context.
    unsafe { set_result(&api, ctx, result) }
}

/// The most arguments any function here takes.
const MAX_ARGS: usize = 7;

/// Borrow SQLite's arguments for the duration of one call (on the stack: no
/// allocation per call). More than [`MAX_ARGS`] is refused.
///
/// # Safety
/// `argv` holds `argc` valid values for this call.
unsafe fn read_args<'a>(
    api: &Api,
    argc: c_int,
    argv: *mut *mut Value,
) -> Result<([Arg<'a>; MAX_ARGS], usize), SqlError> {
    let count = usize::try_from(argc).unwrap_or(0);
    if count > MAX_ARGS {
        return Err(SqlError(format!(
            "invalid-argument: at most {MAX_ARGS} arguments, got {count}"
        )));
    }
    let mut args = [Arg::Null; MAX_ARGS];
    for (i, arg) in args.iter_mut().enumerate().take(count) {
        // SAFETY: `i < argc`; each value stays valid until the call returns,
        // and each is read once (text/blob pointer first, then its length, as
        // SQLite documents).
        unsafe {
            let value = *argv.add(i);
            *arg = match (api.value_type)(value) {
                SQLITE_INTEGER => Arg::Integer((api.value_int64)(value)),
                SQLITE_FLOAT => Arg::Real,
                SQLITE_TEXT => Arg::Text(bytes(
                    (api.value_text)(value).cast(),
                    (api.value_bytes)(value),
                )),
                SQLITE_BLOB => Arg::Blob(bytes(
                    (api.value_blob)(value).cast(),
                    (api.value_bytes)(value),
                )),
                _ => Arg::Null,
            };
        }
    }
    Ok((args, count))
}

/// # Safety
/// `ptr` is null or points at `len` bytes valid for `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: c_int) -> &'a [u8] {
    match usize::try_from(len) {
        // SAFETY: as promised by the caller.
        Ok(len) if !ptr.is_null() && len > 0 => unsafe { std::slice::from_raw_parts(ptr, len) },
        _ => &[],
    }
}

/// # Safety
/// `ctx` is the current call's context.
unsafe fn set_result(api: &Api, ctx: *mut Context, result: Result<Output, SqlError>) {
    let (bytes, text, destructor) = match &result {
        // SAFETY: `ctx` is this call's context.
        Ok(Output::Null) => return unsafe { (api.result_null)(ctx) },
        Ok(Output::Name(name)) => (name.as_bytes(), true, SQLITE_STATIC),
        Ok(Output::Text(s)) => (s.as_bytes(), true, SQLITE_TRANSIENT),
        Ok(Output::Blob(b)) => (b.as_slice(), false, SQLITE_TRANSIENT),
        // SAFETY: as above.
        Err(e) => return unsafe { set_error(api, ctx, e) },
    };
    let Ok(n) = c_int::try_from(bytes.len()) else {
        let too_large = SqlError("too-large: the result does not fit an SQLite value".into());
        // SAFETY: as above.
        return unsafe { set_error(api, ctx, &too_large) };
    };
    // SAFETY: SQLite copies the bytes before these calls return
    // (SQLITE_TRANSIENT) or keeps a pointer to a `&'static str`
    // (SQLITE_STATIC); `n` is their length.
    unsafe {
        if text {
            (api.result_text)(ctx, bytes.as_ptr().cast(), n, destructor);
        } else {
            (api.result_blob)(ctx, bytes.as_ptr().cast(), n, destructor);
        }
    }
}

/// # Safety
/// `ctx` is the current call's context.
unsafe fn set_error(api: &Api, ctx: *mut Context, SqlError(message): &SqlError) {
    let n = c_int::try_from(message.len()).unwrap_or(c_int::MAX);
    // SAFETY: SQLite always copies an error message; `n` bounds the read.
    unsafe { (api.result_error)(ctx, message.as_ptr().cast(), n) }
}
