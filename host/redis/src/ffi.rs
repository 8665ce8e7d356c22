//! The few module API calls the `redis-module` crate does not wrap.
#![allow(unsafe_code)] // calls into the Redis module API; each block states its invariant

use std::os::raw::c_int;

use redis_module::{Context, RedisString, raw};

/// The argument positions (into `argv`, `argv[0]` being the command name)
/// that the command `argv` names as keys, as Redis's own key specs find
/// them (`RM_GetCommandKeys`, Redis 7.0+). An unknown command or wrong
/// arity is an error.
pub fn command_keys(ctx: &Context, argv: &[RedisString]) -> Result<Vec<usize>, String> {
    let get = unsafe {
        // SAFETY: function pointers filled in once by RedisModule_Init,
        // before any command runs; read by value.
        raw::RedisModule_GetCommandKeys
    }
    .ok_or("this server has no RM_GetCommandKeys (Redis 7.0 or later is needed)")?;
    let free = unsafe {
        // SAFETY: as above.
        raw::RedisModule_Free
    }
    .ok_or("this server has no RM_Free")?;
    let mut ptrs: Vec<*mut raw::RedisModuleString> = argv.iter().map(|s| s.inner).collect();
    let argc = c_int::try_from(ptrs.len()).map_err(|_| "too many arguments")?;
    let mut count: c_int = 0;
    let positions = unsafe {
        // SAFETY: `ptrs` holds `argc` live RedisModuleStrings owned by the
        // calling command's argv; Redis only reads them. `count` is written.
        get(ctx.get_raw(), ptrs.as_mut_ptr(), argc, &mut count)
    };
    if positions.is_null() {
        // NULL: the command is unknown, its arity wrong, or it has no keys.
        let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        return match errno {
            0 => Ok(Vec::new()),
            e if e == libc_enoent() => Err("unknown command".into()),
            _ => Err("wrong number of arguments for the command".into()),
        };
    }
    let n = usize::try_from(count).unwrap_or(0);
    let found = unsafe {
        // SAFETY: Redis returned an array of `count` ints it allocated with
        // RM_Alloc; copied out, then freed once.
        let out = std::slice::from_raw_parts(positions, n)
            .iter()
            .filter_map(|&p| usize::try_from(p).ok())
            .collect();
        free(positions.cast());
        out
    };
    Ok(found)
}

const fn libc_enoent() -> i32 {
    2
}

/// The server's Unix time in milliseconds.
pub fn milliseconds() -> i64 {
    match unsafe {
        // SAFETY: filled in by RedisModule_Init; read by value.
        raw::RedisModule_Milliseconds
    } {
        Some(f) => unsafe {
            // SAFETY: takes no arguments, reads the server clock.
            f()
        },
        None => 0,
    }
}

/// A random non-zero u64 from the server's generator (a new lineage id).
pub fn random_nonzero_u64() -> u64 {
    let mut bytes = [0u8; 8];
    if let Some(f) = unsafe {
        // SAFETY: filled in by RedisModule_Init; read by value.
        raw::RedisModule_GetRandomBytes
    } {
        unsafe {
            // SAFETY: writes exactly `len` bytes into `bytes`.
            f(bytes.as_mut_ptr(), bytes.len());
        }
    }
    match u64::from_le_bytes(bytes) {
        0 => milliseconds().unsigned_abs() | 1,
        v => v,
    }
}

/// Set `key` to the string `value` through the key API (RM_OpenKey,
/// RM_StringSet, RM_CloseKey): like SET, it replaces any value and its
/// TTL, closing the key signals WATCH, and a `set` keyspace event is sent
/// as SET sends one. Replicating it is the caller's job (RM_Replicate).
/// Several times cheaper than a SET through RM_Call.
pub fn set_string(ctx: &Context, key: &[u8], value: &[u8]) -> Result<(), String> {
    let (Some(open), Some(set), Some(close), Some(create), Some(free)) = (unsafe {
        // SAFETY: function pointers filled in by RedisModule_Init; read by value.
        (
            raw::RedisModule_OpenKey,
            raw::RedisModule_StringSet,
            raw::RedisModule_CloseKey,
            raw::RedisModule_CreateString,
            raw::RedisModule_FreeString,
        )
    }) else {
        return Err("the server lacks the key API".into());
    };
    let raw_ctx = ctx.get_raw();
    unsafe {
        // SAFETY: the strings are created from live slices (copied by
        // Redis), used on the calling command's thread, and freed once
        // after the key is closed; the key handle is closed exactly once.
        let name = create(raw_ctx, key.as_ptr().cast(), key.len());
        let data = create(raw_ctx, value.as_ptr().cast(), value.len());
        let handle =
            open(raw_ctx, name, raw::REDISMODULE_WRITE as c_int).cast::<raw::RedisModuleKey>();
        let status = if handle.is_null() {
            raw::REDISMODULE_ERR as c_int
        } else {
            let s = set(handle, data);
            close(handle);
            s
        };
        if status == raw::REDISMODULE_OK as c_int
            && let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent
        {
            notify(
                raw_ctx,
                raw::REDISMODULE_NOTIFY_STRING,
                c"set".as_ptr(),
                name,
            );
        }
        free(raw_ctx, data);
        free(raw_ctx, name);
        if status == raw::REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err("RM_StringSet failed".into())
        }
    }
}

/// A server log level.
#[derive(Clone, Copy)]
pub enum Level {
    Notice,
    Warning,
}

/// Write `message` to the server log. Not `Context::log_*`: those pass the
/// message as RM_Log's printf format (a `%n` in a module argument would be
/// a write through a wild pointer) and panic on a NUL byte. Here the format
/// is `"%s"` and the message is printable ASCII.
pub fn log(ctx: &Context, level: Level, message: &str) {
    let Some(log) = (unsafe {
        // SAFETY: filled in by RedisModule_Init; read by value.
        raw::RedisModule_Log
    }) else {
        return;
    };
    let level = match level {
        Level::Notice => c"notice",
        Level::Warning => c"warning",
    };
    let mut text: Vec<u8> = crate::rules::wire_line(message).into_bytes();
    text.push(0);
    unsafe {
        // SAFETY: both strings are NUL-terminated and live across the call;
        // the format consumes exactly one `char *` argument.
        log(
            ctx.get_raw(),
            level.as_ptr(),
            c"%s".as_ptr(),
            text.as_ptr().cast::<std::os::raw::c_char>(),
        );
    }
}
