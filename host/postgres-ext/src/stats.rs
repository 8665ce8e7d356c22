//! Decisions counted by operation and outcome (the view
//! `fencecheck.decisions`), and the log line of each stale rejection, as
//! the seed asks of every protected resource: "record accepted fence,
//! rejected stale fence, scope, operation type … with bounded-cardinality
//! labels. Alert on any stale rejection."
//!
//! With the library in `shared_preload_libraries` the counters live in
//! shared memory and count every backend's decisions since the server
//! started (`coverage = 'cluster'`). Without it there is no shared memory
//! to ask for, and each session counts its own decisions since it loaded
//! the library (`coverage = 'session'`). Labels are fixed: 5 operations × 7
//! outcomes, never a scope.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use pgrx::pg_sys;

use crate::settings::{LOG_STALE, LogStale};
use crate::sqlstate::{Raise, SqlState};
use fencecheck::{Decision, Token, TokenText};

/// What was asked of the fence.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Operation {
    Insert = 0,
    Update = 1,
    Delete = 2,
    FenceCheck = 3,
    FenceNext = 4,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Insert => "INSERT",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::FenceCheck => "fence_check",
            Operation::FenceNext => "fence_next",
        }
    }
}

/// How it ended. The order is the view's (`sql/protect.sql`) and
/// `fencecheck::OUTCOME_LABELS`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Outcome {
    Applied = 0,
    Duplicate = 1,
    StaleFence = 2,
    VersionConflict = 3,
    Unauthenticated = 4,
    /// Every other refusal: no token, a bad token or request, a corrupt
    /// state, an unsound fence…
    Refused = 5,
    /// The component could not decide (5F900).
    Error = 6,
}

const OPERATIONS: usize = 5;
const OUTCOMES: usize = fencecheck::OUTCOME_LABELS.len();
/// The epoch labels of docs/design.md §12: `0`–`15`, `other`, `none`.
const EPOCHS: usize = fencecheck::EPOCH_LABELS.len();
const COUNTERS: usize = OPERATIONS * OUTCOMES * EPOCHS;

/// `fencecheck.metrics()`'s operation names, in [`Operation`]'s order.
const OPERATION_LABELS: [&str; OPERATIONS] = ["insert", "update", "delete", "check", "next"];

thread_local! {
    /// The epoch label index of the token the decision being made
    /// presented: set when its request is built (the only place a token is
    /// parsed), taken by the count that follows every decision, so a
    /// decision refused before its token parsed counts as `none`.
    static PRESENTED: Cell<usize> = const { Cell::new(EPOCHS - 1) };
}

/// The request being decided presented `token`.
pub(crate) fn presented(token: Token) {
    PRESENTED.with(|p| p.set(fencecheck::epoch_index(Some(token))));
}

impl Outcome {
    pub(crate) fn of_decision(decision: &Decision) -> Self {
        match decision {
            Decision::Applied { .. } => Outcome::Applied,
            Decision::Duplicate { .. } => Outcome::Duplicate,
            Decision::StaleFence { .. } => Outcome::StaleFence,
            Decision::VersionConflict { .. } => Outcome::VersionConflict,
        }
    }

    pub(crate) fn of_raise(raise: &Raise) -> Self {
        match raise.state {
            SqlState::StaleFence => Outcome::StaleFence,
            SqlState::Duplicate => Outcome::Duplicate,
            SqlState::VersionConflict => Outcome::VersionConflict,
            SqlState::Unauthenticated => Outcome::Unauthenticated,
            SqlState::RuntimeError => Outcome::Error,
            _ => Outcome::Refused,
        }
    }
}

/// The shared counters (`cluster` coverage), once shared memory is attached.
static SHARED: AtomicPtr<AtomicU64> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    /// This session's counters, when there is no shared memory.
    static LOCAL: [Cell<u64>; COUNTERS] = const { [const { Cell::new(0) }; COUNTERS] };
}

fn shared() -> Option<&'static [AtomicU64]> {
    let p = SHARED.load(Ordering::Acquire);
    // SAFETY: set once, to COUNTERS atomics in shared memory that live as
    // long as the server.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p, COUNTERS) })
}

/// Count one decision, under the epoch its request presented.
pub(crate) fn count(operation: Operation, outcome: Outcome) {
    let epoch = PRESENTED.with(|p| p.replace(EPOCHS - 1));
    let i = (operation as usize * OUTCOMES + outcome as usize) * EPOCHS + epoch;
    match shared() {
        Some(counters) => {
            counters[i].fetch_add(1, Ordering::Relaxed);
        }
        None => LOCAL.with(|l| l[i].set(l[i].get().wrapping_add(1))),
    }
}

/// Count the outcome of a call that either applied or raised.
pub(crate) fn count_result<T>(operation: Operation, result: &Result<T, Raise>) {
    count(
        operation,
        match result {
            Ok(_) => Outcome::Applied,
            Err(raise) => Outcome::of_raise(raise),
        },
    );
}

/// Every counter's value, operation-major, then outcome, then epoch.
fn values() -> Vec<u64> {
    match shared() {
        Some(counters) => counters.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        None => LOCAL.with(|l| l.iter().map(Cell::get).collect()),
    }
}

/// `fencecheck.decision_counts()`: operation × outcome, operation-major,
/// every epoch summed (the view `fencecheck.decisions`).
pub(crate) fn counts() -> Vec<i64> {
    values()
        .chunks(EPOCHS)
        .map(|epochs| {
            let sum = epochs.iter().fold(0u64, |a, n| a.saturating_add(*n));
            i64::try_from(sum).unwrap_or(i64::MAX)
        })
        .collect()
}

/// `fencecheck.metrics()`: every nonzero counter as Prometheus text, under
/// the cross-host table's name and labels (docs/design.md §12).
pub(crate) fn exposition() -> String {
    fencecheck::decisions_text(&OPERATION_LABELS, &values())
}

/// `fencecheck.decision_coverage()`.
pub(crate) fn coverage() -> &'static str {
    if shared().is_some() {
        "cluster"
    } else {
        "session"
    }
}

/// Write the log line of a stale rejection at `fencecheck.log_stale`'s level.
pub(crate) fn log_stale(
    operation: Operation,
    table: Option<pg_sys::Oid>,
    scope: &[u8],
    presented: Token,
    highest: Token,
) {
    let level = LOG_STALE.get();
    if matches!(level, LogStale::Off) {
        return;
    }
    // Bounded and printable, whatever the scope holds.
    let scope: String = String::from_utf8_lossy(scope)
        .chars()
        .take(200)
        .flat_map(char::escape_default)
        .collect();
    let on = table.map_or(String::new(), |oid| {
        // SAFETY: a syscache lookup; NULL for a relation that is gone.
        let name = unsafe { pg_sys::get_rel_name(oid) };
        if name.is_null() {
            format!(" on relation {}", u32::from(oid))
        } else {
            // SAFETY: a palloc'd C string.
            format!(
                " on {}",
                unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy()
            )
        }
    });
    let line = format!(
        "fencecheck: stale-fence: {}{on}, scope \"{scope}\": presented {}, highest accepted {}",
        operation.name(),
        TokenText(presented),
        TokenText(highest)
    );
    match level {
        LogStale::Off => {}
        LogStale::Debug1 => pgrx::debug1!("{line}"),
        LogStale::Log => pgrx::log!("{line}"),
        LogStale::Info => pgrx::info!("{line}"),
        LogStale::Notice => pgrx::notice!("{line}"),
        LogStale::Warning => pgrx::warning!("{line}"),
    }
}

/// `_PG_init` while the library is being preloaded: ask for the shared
/// counters and attach them at shared-memory startup.
pub(crate) fn request_shared_memory() {
    // SAFETY: plain reads and hook installation in the postmaster's
    // _PG_init, before any backend exists.
    unsafe {
        if !pg_sys::process_shared_preload_libraries_in_progress {
            return;
        }
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        pg_sys::RequestAddinShmemSpace(size_of::<[AtomicU64; COUNTERS]>());
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        {
            PREV_REQUEST = pg_sys::shmem_request_hook;
            pg_sys::shmem_request_hook = Some(on_request);
        }
        PREV_STARTUP = pg_sys::shmem_startup_hook;
        pg_sys::shmem_startup_hook = Some(on_startup);
    }
}

static mut PREV_REQUEST: Option<unsafe extern "C-unwind" fn()> = None;
static mut PREV_STARTUP: Option<unsafe extern "C-unwind" fn()> = None;

#[cfg(not(any(feature = "pg13", feature = "pg14")))]
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_request() {
    // SAFETY: the postmaster's shmem_request_hook chain.
    unsafe {
        if let Some(prev) = PREV_REQUEST {
            prev();
        }
        pg_sys::RequestAddinShmemSpace(size_of::<[AtomicU64; COUNTERS]>());
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn on_startup() {
    // SAFETY: the shmem_startup_hook chain; ShmemInitStruct under
    // AddinShmemInitLock (MainLWLockArray[21]), as PostgreSQL's own
    // extensions attach theirs.
    unsafe {
        if let Some(prev) = PREV_STARTUP {
            prev();
        }
        let lock = &raw mut (*pg_sys::MainLWLockArray.add(21)).lock;
        pg_sys::LWLockAcquire(lock, pg_sys::LWLockMode::LW_EXCLUSIVE);
        let mut found = false;
        let p = pg_sys::ShmemInitStruct(
            c"fencecheck decisions".as_ptr(),
            size_of::<[AtomicU64; COUNTERS]>(),
            &mut found,
        )
        .cast::<AtomicU64>();
        if !found {
            for i in 0..COUNTERS {
                p.add(i).write(AtomicU64::new(0));
            }
        }
        SHARED.store(p, Ordering::Release);
        pg_sys::LWLockRelease(lock);
    }
}
