//! The MariaDB side: the UDF entry points (`udf` crate), the process-wide
//! component runtime with its pool of instances, and how a refusal becomes
//! an SQL error.
//!
//! No panic reaches the server: `init` and `process` run under
//! `catch_unwind`, and a caught panic is an SQL error (the instance that
//! panicked is dropped, never reused).
//!
//! A UDF can only return NULL with an error flag, and MariaDB turns that
//! into a NULL value, not an error. So a refusal is raised the way the
//! server's own functions raise: `my_message(1644, "stale-fence: …")` on the
//! calling thread, which fails the statement with error 1644, SQLSTATE
//! HY000, and the message. `my_message` is looked up in the running server
//! (`dlsym`); where it is absent (a server that does not export it) the
//! function returns NULL with the error flag only, which a `NOT NULL` state
//! column under a strict `sql_mode` still refuses (docs/mariadb.md).
#![allow(unsafe_code)] // `#[register]` exports C entry points; dlsym

use std::ffi::{CString, c_char, c_uint, c_ulong};
use std::num::NonZeroU8;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, OnceLock};

use fencecheck::{Instance, Runtime};
use udf::prelude::*;

use crate::functions::{self, Arg, Clock, Output, SqlError};

/// The server process's environment variable that lets lease calls take an
/// explicit `now_ms` (`@fencecheck_now_ms`): for tests only, as the Redis
/// module's `TEST-CLOCK`. Read once.
pub const TEST_CLOCK_ENV: &str = "FENCECHECK_MARIADB_TEST_CLOCK";

fn system_ms() -> Result<u64, SqlError> {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| u64::try_from(d.as_millis()).ok())
        .ok_or_else(|| SqlError("runtime-error: the clock is before 1970".into()))
}

fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(|| Clock {
        test_clock: std::env::var_os(TEST_CLOCK_ENV).is_some_and(|v| v == "1"),
        system_ms,
    })
}

/// `ER_SIGNAL_EXCEPTION`: the error number of an unhandled `SIGNAL`, so a
/// refusal from the functions and one from a fenced table's trigger share
/// the number (the triggers set their own SQLSTATE, class `5F`).
pub const ER_FENCE: c_uint = 1644;

/// One component runtime per server process; an error is kept and reported
/// by every call instead of retried per statement.
static RUNTIME: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// Idle instances. A statement takes one in `init` and gives it back when
/// MariaDB drops the function's state (`deinit`); a server thread never
/// shares one.
static POOL: Mutex<Vec<Instance>> = Mutex::new(Vec::new());

/// Instances kept idle beyond this are dropped (memory bound after a burst).
const POOL_MAX: usize = 64;

fn runtime() -> Result<&'static Runtime, SqlError> {
    RUNTIME
        .get_or_init(|| Runtime::new().map_err(|e| format!("runtime-error: {e}")))
        .as_ref()
        .map_err(|e| SqlError(e.clone()))
}

fn take_instance() -> Result<Instance, SqlError> {
    let pooled = match POOL.lock() {
        Ok(mut pool) => pool.pop(),
        Err(poisoned) => poisoned.into_inner().pop(),
    };
    match pooled {
        Some(instance) => Ok(instance),
        None => runtime()?
            .instance()
            .map_err(|e| SqlError(format!("runtime-error: {e}"))),
    }
}

fn give_back(instance: Instance) {
    let mut pool = match POOL.lock() {
        Ok(pool) => pool,
        Err(poisoned) => poisoned.into_inner(),
    };
    if pool.len() < POOL_MAX {
        pool.push(instance);
    }
}

/// The server's `my_message`, if the process exports it.
type MyMessage = unsafe extern "C" fn(c_uint, *const c_char, c_ulong);

fn my_message() -> Option<MyMessage> {
    static SYMBOL: OnceLock<Option<MyMessage>> = OnceLock::new();
    *SYMBOL.get_or_init(|| {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only
        // looks a symbol up.
        let ptr = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"my_message".as_ptr()) };
        if ptr.is_null() {
            None
        } else {
            // SAFETY: MariaDB and MySQL declare
            // `void my_message(uint my_err, const char *str, myf MyFlags)`,
            // `myf` an unsigned long on LP64.
            Some(unsafe { std::mem::transmute::<*mut libc::c_void, MyMessage>(ptr) })
        }
    })
}

/// Fail the running statement with `message` (see the module comment).
fn raise(message: &str) -> ProcessError {
    // NULs cannot cross into C; the server copies at most 511 bytes.
    let mut text: String = message.replace('\0', "\\0");
    if text.len() > 500 {
        let mut end = 500;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    if let (Some(f), Ok(c)) = (my_message(), CString::new(text)) {
        // SAFETY: called on the server thread that runs the statement, with
        // a NUL-terminated message that lives across the call.
        unsafe { f(ER_FENCE, c.as_ptr(), 0) };
    }
    ProcessError
}

fn args_of<'a>(args: &'a ArgList<'a, Process>) -> Vec<Arg<'a>> {
    args.iter()
        .map(|a| match a.value() {
            SqlResult::String(Some(b)) => Arg::Text(b),
            SqlResult::Int(Some(i)) => Arg::Integer(i),
            SqlResult::Real(Some(_)) => Arg::Real,
            SqlResult::Decimal(Some(d)) => Arg::Decimal(d),
            SqlResult::String(None)
            | SqlResult::Int(None)
            | SqlResult::Real(None)
            | SqlResult::Decimal(None) => Arg::Null,
            _ => Arg::Real,
        })
        .collect()
}

/// Every function's state between `init` and `deinit`: its instance (none
/// for `fence_version`) and the bytes of the last result, which MariaDB
/// reads after `process` returns.
struct Call {
    instance: Option<Instance>,
    out: Vec<u8>,
}

impl Drop for Call {
    fn drop(&mut self) {
        if let Some(instance) = self.instance.take() {
            give_back(instance);
        }
    }
}

fn init_call(
    args: &ArgList<'_, Init>,
    counts: &[usize],
    with_instance: bool,
) -> Result<Call, String> {
    let run = || -> Result<Call, String> {
        if !counts.contains(&args.len()) {
            let expected = counts
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(" or ");
            return Err(format!(
                "invalid-argument: expected {expected} arguments, got {}",
                args.len()
            ));
        }
        let instance = if with_instance {
            Some(take_instance().map_err(|e| e.0)?)
        } else {
            None
        };
        Ok(Call {
            instance,
            out: Vec::new(),
        })
    };
    catch_unwind(AssertUnwindSafe(run))
        .unwrap_or_else(|_| Err("runtime-error: the plugin panicked".to_string()))
}

/// Run `body` on this call's instance and keep its result in `call.out`;
/// `Ok(None)` is SQL NULL.
fn process_call<'a, F>(
    call: &'a mut Call,
    args: &ArgList<'_, Process>,
    body: F,
) -> Result<Option<&'a [u8]>, ProcessError>
where
    F: FnOnce(&mut dyn fencecheck::Checker, &[Arg<'_>]) -> Result<Output, SqlError>,
{
    let result = catch_unwind(AssertUnwindSafe(|| {
        let args = args_of(args);
        match call.instance.as_mut() {
            Some(instance) => body(instance, &args),
            None => Err(SqlError("runtime-error: no component instance".into())),
        }
    }));
    let output = match result {
        Ok(Ok(output)) => output,
        Ok(Err(SqlError(message))) => return Err(raise(&message)),
        Err(_) => {
            // The instance may be mid-call: never reuse it.
            call.instance = None;
            return Err(raise("runtime-error: the plugin panicked"));
        }
    };
    call.out.clear();
    match output {
        Output::Null => return Ok(None),
        Output::Name(name) => call.out.extend_from_slice(name.as_bytes()),
        Output::Text(text) => call.out = text.into_bytes(),
        Output::Blob(bytes) => call.out = bytes,
    }
    Ok(Some(&call.out))
}

/// `fence_check(state, scope, token, policy, op_id, expected_version[, keys])`.
pub struct FenceCheck(Call);

#[register]
impl BasicUdf for FenceCheck {
    type Returns<'a> = Option<&'a [u8]>;

    fn init(cfg: &UdfCfg<Init>, args: &ArgList<Init>) -> Result<Self, String> {
        cfg.set_max_len(32);
        init_call(args, &[6, 7], true).map(Self)
    }

    fn process<'a>(
        &'a mut self,
        _cfg: &UdfCfg<Process>,
        args: &ArgList<Process>,
        _error: Option<NonZeroU8>,
    ) -> Result<Self::Returns<'a>, ProcessError> {
        process_call(&mut self.0, args, functions::fence_check)
    }
}

/// `fence_next(...same...)`: the new state on `applied`, else an error.
pub struct FenceNext(Call);

#[register]
impl BasicUdf for FenceNext {
    type Returns<'a> = Option<&'a [u8]>;

    fn init(cfg: &UdfCfg<Init>, args: &ArgList<Init>) -> Result<Self, String> {
        cfg.set_max_len(65_535);
        init_call(args, &[6, 7], true).map(Self)
    }

    fn process<'a>(
        &'a mut self,
        _cfg: &UdfCfg<Process>,
        args: &ArgList<Process>,
        _error: Option<NonZeroU8>,
    ) -> Result<Self::Returns<'a>, ProcessError> {
        process_call(&mut self.0, args, functions::fence_next)
    }
}

/// `fence_inspect(state)`: the state as JSON, NULL for NULL.
pub struct FenceInspect(Call);

#[register]
impl BasicUdf for FenceInspect {
    type Returns<'a> = Option<&'a [u8]>;

    fn init(cfg: &UdfCfg<Init>, args: &ArgList<Init>) -> Result<Self, String> {
        cfg.set_max_len(262_143);
        init_call(args, &[1], true).map(Self)
    }

    fn process<'a>(
        &'a mut self,
        _cfg: &UdfCfg<Process>,
        args: &ArgList<Process>,
        _error: Option<NonZeroU8>,
    ) -> Result<Self::Returns<'a>, ProcessError> {
        process_call(&mut self.0, args, functions::fence_inspect)
    }
}

/// `fence_version()`: the embedded component's WIT package version.
pub struct FenceVersion(Call);

#[register]
impl BasicUdf for FenceVersion {
    type Returns<'a> = Option<&'a [u8]>;

    fn init(cfg: &UdfCfg<Init>, args: &ArgList<Init>) -> Result<Self, String> {
        cfg.set_max_len(64);
        init_call(args, &[0], false).map(Self)
    }

    fn process<'a>(
        &'a mut self,
        _cfg: &UdfCfg<Process>,
        args: &ArgList<Process>,
        _error: Option<NonZeroU8>,
    ) -> Result<Self::Returns<'a>, ProcessError> {
        let version = catch_unwind(AssertUnwindSafe(|| {
            functions::fence_version(runtime()?.component_version(), &args_of(args))
        }));
        match version {
            Ok(Ok(Output::Text(v))) => {
                self.0.out = v.into_bytes();
                Ok(Some(&self.0.out))
            }
            Ok(Ok(_)) => Err(raise("runtime-error: unexpected result")),
            Ok(Err(SqlError(message))) => Err(raise(&message)),
            Err(_) => Err(raise("runtime-error: the plugin panicked")),
        }
    }
}

/// `fence_lease_acquire(state, lock, lease_id, ttl_ms, authority,
/// epoch_floor, now_ms)`: the decision as JSON (`fencecheck.acquire`).
pub struct FenceLeaseAcquire(Call);

#[register]
impl BasicUdf for FenceLeaseAcquire {
    type Returns<'a> = Option<&'a [u8]>;

    fn init(cfg: &UdfCfg<Init>, args: &ArgList<Init>) -> Result<Self, String> {
        cfg.set_max_len(262_143);
        init_call(args, &[7], true).map(Self)
    }

    fn process<'a>(
        &'a mut self,
        _cfg: &UdfCfg<Process>,
        args: &ArgList<Process>,
        _error: Option<NonZeroU8>,
    ) -> Result<Self::Returns<'a>, ProcessError> {
        process_call(&mut self.0, args, |c, a| {
            functions::fence_lease_acquire(c, clock(), a)
        })
    }
}

/// `fence_lease_renew(state, lease_id, token, ttl_ms, authority, now_ms)`.
pub struct FenceLeaseRenew(Call);

#[register]
impl BasicUdf for FenceLeaseRenew {
    type Returns<'a> = Option<&'a [u8]>;

    fn init(cfg: &UdfCfg<Init>, args: &ArgList<Init>) -> Result<Self, String> {
        cfg.set_max_len(262_143);
        init_call(args, &[6], true).map(Self)
    }

    fn process<'a>(
        &'a mut self,
        _cfg: &UdfCfg<Process>,
        args: &ArgList<Process>,
        _error: Option<NonZeroU8>,
    ) -> Result<Self::Returns<'a>, ProcessError> {
        process_call(&mut self.0, args, |c, a| {
            functions::fence_lease_renew(c, clock(), a)
        })
    }
}

/// `fence_lease_release(state, lease_id, token, authority)`.
pub struct FenceLeaseRelease(Call);

#[register]
impl BasicUdf for FenceLeaseRelease {
    type Returns<'a> = Option<&'a [u8]>;

    fn init(cfg: &UdfCfg<Init>, args: &ArgList<Init>) -> Result<Self, String> {
        cfg.set_max_len(262_143);
        init_call(args, &[4], true).map(Self)
    }

    fn process<'a>(
        &'a mut self,
        _cfg: &UdfCfg<Process>,
        args: &ArgList<Process>,
        _error: Option<NonZeroU8>,
    ) -> Result<Self::Returns<'a>, ProcessError> {
        process_call(&mut self.0, args, functions::fence_lease_release)
    }
}
