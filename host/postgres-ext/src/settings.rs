//! The extension's settings.
//!
//! - `fencecheck.token`, `fencecheck.op_id`, `fencecheck.expected_version`:
//!   what a fenced-table write presents beside its row (a DELETE's token; the
//!   guards of `allow-equal`). Each counts only in the transaction that set
//!   it: `SET` (unlike `SET LOCAL`) outlives its transaction, and on a pooled
//!   connection the next client would inherit a token it was never given. So
//!   the check hook notes the transaction and value of every explicit `SET`,
//!   and [`presented`] gives a value only when both still hold. A value
//!   from anywhere else (a setting made before the library was loaded,
//!   `ALTER ROLE … SET`, the configuration file) is never presented.
//! - `fencecheck.log_stale`: the level of the log line each stale rejection
//!   writes (`off` to write none).
#![allow(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::ffi::{CStr, CString, c_char, c_void};

use pgrx::pg_sys;
use pgrx::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

/// The three settings a write presents.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Presented {
    Token = 0,
    OpId = 1,
    ExpectedVersion = 2,
}

impl Presented {
    fn name(self) -> &'static CStr {
        match self {
            Presented::Token => c"fencecheck.token",
            Presented::OpId => c"fencecheck.op_id",
            Presented::ExpectedVersion => c"fencecheck.expected_version",
        }
    }

    fn setting(self) -> &'static GucSetting<Option<CString>> {
        match self {
            Presented::Token => &TOKEN,
            Presented::OpId => &OP_ID,
            Presented::ExpectedVersion => &EXPECTED_VERSION,
        }
    }
}

/// A presented setting's value.
pub(crate) enum Value {
    /// Unset or empty.
    Absent,
    /// Set, but not in this transaction by an explicit `SET`: never used.
    Stale,
    /// Set in this transaction.
    Current(&'static [u8]),
}

/// The level of the log line a stale rejection writes.
#[derive(Clone, Copy, Debug, PostgresGucEnum)]
pub(crate) enum LogStale {
    Off,
    Debug1,
    Log,
    Info,
    Notice,
    Warning,
}

static TOKEN: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static OP_ID: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static EXPECTED_VERSION: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
pub(crate) static LOG_STALE: GucSetting<LogStale> = GucSetting::<LogStale>::new(LogStale::Log);

/// The local transaction id and value of a setting's last explicit `SET`.
type Noted = Option<(pg_sys::LocalTransactionId, Vec<u8>)>;

thread_local! {
    /// Per presented setting, its last explicit `SET` in this session.
    static NOTED: RefCell<[Noted; 3]> = const { RefCell::new([None, None, None]) };
    /// True while `_PG_init` defines the settings: a value set before the
    /// library was loaded is reapplied then, and must not count.
    static DEFINING: Cell<bool> = const { Cell::new(false) };
}

/// This backend's current (top-level) local transaction id.
fn local_xid() -> pg_sys::LocalTransactionId {
    // SAFETY: MyProc is this backend's PGPROC, set before any SQL runs.
    unsafe {
        let proc = pg_sys::MyProc;
        if proc.is_null() {
            return 0;
        }
        #[cfg(any(feature = "pg17", feature = "pg18"))]
        {
            (*proc).vxid.lxid
        }
        #[cfg(not(any(feature = "pg17", feature = "pg18")))]
        {
            (*proc).lxid
        }
    }
}

fn note(which: Presented, newval: *mut *mut c_char, source: pg_sys::GucSource::Type) {
    let value = if newval.is_null() {
        None
    } else {
        // SAFETY: PostgreSQL passes the candidate value, NULL or a C string.
        let p = unsafe { *newval };
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_bytes().to_vec())
    };
    let explicit = source == pg_sys::GucSource::PGC_S_SESSION && !DEFINING.with(Cell::get);
    let noted = explicit.then(|| (local_xid(), value.unwrap_or_default()));
    NOTED.with(|n| {
        if let Ok(mut n) = n.try_borrow_mut() {
            n[which as usize] = noted;
        }
    });
}

macro_rules! check_hook {
    ($name:ident, $which:expr) => {
        /// Notes an explicit `SET` (see the module docs); accepts every value.
        #[pgrx::pg_guard]
        unsafe extern "C-unwind" fn $name(
            newval: *mut *mut c_char,
            _extra: *mut *mut c_void,
            source: pg_sys::GucSource::Type,
        ) -> bool {
            note($which, newval, source);
            true
        }
    };
}

check_hook!(check_token, Presented::Token);
check_hook!(check_op_id, Presented::OpId);
check_hook!(check_expected_version, Presented::ExpectedVersion);

/// Whether the placeholder PostgreSQL made for `name` (a `SET` before the
/// library was loaded) holds a value set in the current transaction: GUC
/// keeps a stack of a setting's changes within the transaction, and only
/// then. PostgreSQL 13 to 15 list their settings in one array.
#[cfg(any(feature = "pg13", feature = "pg14", feature = "pg15"))]
fn set_in_this_transaction(name: &CStr) -> bool {
    // SAFETY: the settings array and its count, read in _PG_init, before
    // DefineCustomStringVariable replaces the placeholder.
    unsafe {
        let vars = pg_sys::get_guc_variables();
        let n = usize::try_from(pg_sys::GetNumConfigOptions()).unwrap_or(0);
        if vars.is_null() {
            return false;
        }
        (0..n).any(|i| {
            let var = *vars.add(i);
            !var.is_null()
                && !(*var).name.is_null()
                && CStr::from_ptr((*var).name) == name
                && !(*var).stack.is_null()
        })
    }
}

/// PostgreSQL 16 keeps its settings in a hash table this extension does not
/// read: a value set before the library was loaded never counts
/// (docs/postgres.md says to load it first, or preload it).
#[cfg(not(any(feature = "pg13", feature = "pg14", feature = "pg15")))]
fn set_in_this_transaction(_name: &CStr) -> bool {
    false
}

/// Define the settings (from `_PG_init`).
pub(crate) fn define() {
    let carried: Vec<Presented> = [
        Presented::Token,
        Presented::OpId,
        Presented::ExpectedVersion,
    ]
    .into_iter()
    .filter(|p| set_in_this_transaction(p.name()))
    .collect();
    DEFINING.with(|d| d.set(true));
    let presented = [
        (
            &TOKEN,
            c"fencecheck.token",
            c"The token a DELETE from a fenced table presents, in this transaction only.",
            Some(check_token as unsafe extern "C-unwind" fn(_, _, _) -> bool),
        ),
        (
            &OP_ID,
            c"fencecheck.op_id",
            c"The op-id that guards a fenced-table write, in this transaction only.",
            Some(check_op_id as unsafe extern "C-unwind" fn(_, _, _) -> bool),
        ),
        (
            &EXPECTED_VERSION,
            c"fencecheck.expected_version",
            c"The version a fenced-table write expects the scope at, in this transaction only.",
            Some(check_expected_version as unsafe extern "C-unwind" fn(_, _, _) -> bool),
        ),
    ];
    for (setting, name, short, hook) in presented {
        // SAFETY: the hooks are guarded and only note values.
        unsafe {
            GucRegistry::define_string_guc_with_hooks(
                name,
                short,
                c"Counts only in the transaction that set it (docs/postgres.md#settings).",
                setting,
                GucContext::Userset,
                GucFlags::default(),
                hook,
                None,
                None,
            );
        }
    }
    GucRegistry::define_enum_guc(
        c"fencecheck.log_stale",
        c"The level of the log line each stale-fence rejection writes (off for none).",
        c"The line names the operation, the table, the scope, and the presented and highest tokens.",
        &LOG_STALE,
        GucContext::Suset,
        GucFlags::default(),
    );
    DEFINING.with(|d| d.set(false));
    // A value SET in this very transaction before the library was loaded
    // (the DELETE that loads it is in the same transaction) counts.
    for which in carried {
        // SAFETY: as in `presented`.
        let value = unsafe { pg_sys::GetConfigOption(which.name().as_ptr(), true, false) };
        let value = if value.is_null() {
            Vec::new()
        } else {
            // SAFETY: a NUL-terminated string from PostgreSQL.
            unsafe { CStr::from_ptr(value) }.to_bytes().to_vec()
        };
        NOTED.with(|n| n.borrow_mut()[which as usize] = Some((local_xid(), value)));
    }
    #[cfg(not(any(feature = "pg13", feature = "pg14")))]
    // SAFETY: reserves the prefix once the settings exist.
    unsafe {
        pg_sys::MarkGUCPrefixReserved(c"fencecheck".as_ptr());
    }
}

/// The value of `which` as a write in this transaction presents it.
pub(crate) fn presented(which: Presented) -> Value {
    // The setting's own variable, which PostgreSQL keeps current (defined
    // in _PG_init, before any trigger of this library can run): no lookup
    // by name on the row trigger's path. SAFETY: NULL or a string in GUC
    // memory that lives until the setting changes, which cannot happen
    // while a trigger or function of this extension runs.
    let value = unsafe { *which.setting().as_ptr() };
    if value.is_null() {
        return Value::Absent;
    }
    // SAFETY: a NUL-terminated string from PostgreSQL.
    let bytes: &'static [u8] = unsafe { CStr::from_ptr(value) }.to_bytes();
    if bytes.is_empty() {
        return Value::Absent;
    }
    let current = NOTED.with(|n| {
        n.borrow()[which as usize]
            .as_ref()
            .is_some_and(|(xid, noted)| *xid == local_xid() && noted.as_slice() == bytes)
    });
    if current {
        Value::Current(bytes)
    } else {
        Value::Stale
    }
}
