//! The few module API calls the `redis-module` crate does not wrap.
#![allow(unsafe_code)] // calls into the Redis module API; each block states its invariant

use std::os::raw::c_int;

use redis_module::{Context, RedisString, RedisValue, raw};

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

/// Set the key named `name` to `bytes` through the key API, as SET does:
/// the key then holds exactly these bytes as a string, with no TTL. Closing
/// the key signals WATCH (RM_CloseKey on a key opened for writing), then a
/// `set` keyspace event is sent as SET sends one.
///
/// A key that already holds a string of the same length (a scope's state,
/// rewritten on every fenced write) is overwritten in place through
/// RM_StringDMA, and its TTL if any removed: RM_StringSet would delete the
/// key and add it again (three lookups, the key name and the object freed
/// and allocated again). Any other key gets `value` (the same bytes as a
/// string) through RM_StringSet, which replaces any value and its TTL.
///
/// # Safety
///
/// `raw_ctx` is the calling command's context, on its thread; `name` and
/// `value` are live strings for the whole call, `value` holding `bytes`.
unsafe fn set_key(
    raw_ctx: *mut raw::RedisModuleCtx,
    name: *mut raw::RedisModuleString,
    bytes: &[u8],
    value: *mut raw::RedisModuleString,
) -> Result<(), String> {
    let (
        Some(open),
        Some(set),
        Some(close),
        Some(key_type),
        Some(length),
        Some(dma),
        Some(get_expire),
        Some(set_expire),
    ) = (unsafe {
        // SAFETY: function pointers filled in by RedisModule_Init; read by value.
        (
            raw::RedisModule_OpenKey,
            raw::RedisModule_StringSet,
            raw::RedisModule_CloseKey,
            raw::RedisModule_KeyType,
            raw::RedisModule_ValueLength,
            raw::RedisModule_StringDMA,
            raw::RedisModule_GetExpire,
            raw::RedisModule_SetExpire,
        )
    })
    else {
        return Err("the server lacks the key API".into());
    };
    let no_expire = raw::mstime_t::from(raw::REDISMODULE_NO_EXPIRE);
    let written = unsafe {
        // SAFETY: the caller's strings are live; the key handle is used only
        // before it is closed, exactly once. The DMA pointer is written
        // (`len` bytes, the length Redis reported) before any other call on
        // the key, as RM_StringDMA requires. RM_StringSet takes its own
        // reference to `value` (the documented `StringSet(key, argv[2])`).
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        let handle = open(raw_ctx, name, mode).cast::<raw::RedisModuleKey>();
        if handle.is_null() {
            false
        } else {
            let mut done = false;
            if key_type(handle) == raw::REDISMODULE_KEYTYPE_STRING as c_int
                && length(handle) == bytes.len()
            {
                let mut len = 0usize;
                let p = dma(handle, &mut len, raw::REDISMODULE_WRITE as c_int);
                if !p.is_null() && len == bytes.len() {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.cast::<u8>(), len);
                    if get_expire(handle) != no_expire {
                        set_expire(handle, no_expire);
                    }
                    done = true;
                }
            }
            if !done {
                done = set(handle, value) == raw::REDISMODULE_OK as c_int;
            }
            close(handle);
            done
        }
    };
    if !written {
        return Err("RM_StringSet failed".into());
    }
    if let Some(notify) = unsafe {
        // SAFETY: as above.
        raw::RedisModule_NotifyKeyspaceEvent
    } {
        unsafe {
            // SAFETY: a NUL-terminated static event name and a live key name.
            notify(
                raw_ctx,
                raw::REDISMODULE_NOTIFY_STRING,
                c"set".as_ptr(),
                name,
            );
        }
    }
    Ok(())
}

/// A RedisModuleString copied from `bytes`, owned by the caller (freed
/// with [`free_string`]).
fn create_string(
    raw_ctx: *mut raw::RedisModuleCtx,
    bytes: &[u8],
) -> Option<*mut raw::RedisModuleString> {
    let create = unsafe {
        // SAFETY: filled in by RedisModule_Init; read by value.
        raw::RedisModule_CreateString
    }?;
    let s = unsafe {
        // SAFETY: Redis copies `len` bytes from a live slice.
        create(raw_ctx, bytes.as_ptr().cast(), bytes.len())
    };
    (!s.is_null()).then_some(s)
}

/// Free a string made by [`create_string`] with the same context.
fn free_string(raw_ctx: *mut raw::RedisModuleCtx, s: *mut raw::RedisModuleString) {
    if let Some(free) = unsafe {
        // SAFETY: filled in by RedisModule_Init; read by value.
        raw::RedisModule_FreeString
    } {
        unsafe {
            // SAFETY: `s` was created with `raw_ctx` and is freed once.
            free(raw_ctx, s);
        }
    }
}

/// Set `key` to the string `value` through the key API (RM_OpenKey,
/// RM_StringSet, RM_CloseKey): like SET, it replaces any value and its
/// TTL, closing the key signals WATCH, and a `set` keyspace event is sent
/// as SET sends one. Replicating it is the caller's job (RM_Replicate).
/// Several times cheaper than a SET through RM_Call.
pub fn set_string(ctx: &Context, key: &[u8], value: &[u8]) -> Result<(), String> {
    let raw_ctx = ctx.get_raw();
    let name = create_string(raw_ctx, key);
    let data = create_string(raw_ctx, value);
    let result = match (name, data) {
        (Some(name), Some(data)) => unsafe {
            // SAFETY: both strings live until freed below; `data` holds `value`.
            set_key(raw_ctx, name, value, data)
        },
        _ => Err("RM_CreateString failed".into()),
    };
    for s in [data, name].into_iter().flatten() {
        free_string(raw_ctx, s);
    }
    result
}

/// FENCE.SET's write, in one step of the command: the data key `key` set to
/// `value` (the command's own argument strings, shared as SET shares
/// them, not copied), then `state_key` to `state`, each as
/// [`set_string`] does, and both replicated as ONE `MSET` (which replicas
/// and the AOF apply atomically, without a MULTI/EXEC wrapper). If the
/// first write fails nothing is written or replicated.
pub fn set_pair(
    ctx: &Context,
    key: &RedisString,
    value: &RedisString,
    state_key: &[u8],
    state: &[u8],
) -> Result<(), String> {
    let raw_ctx = ctx.get_raw();
    let name = create_string(raw_ctx, state_key);
    let data = create_string(raw_ctx, state);
    let result = match (name, data) {
        (Some(name), Some(data)) => unsafe {
            // SAFETY: `key` and `value` are the command's argv strings, live
            // for the whole command; `name` and `data` until freed below.
            set_key(raw_ctx, key.inner, value.as_slice(), value.inner)
                .and_then(|()| set_key(raw_ctx, name, state, data))
                .map(|()| replicate_mset(raw_ctx, &mut [key.inner, value.inner, name, data]))
        },
        _ => Err("RM_CreateString failed".into()),
    };
    for s in [data, name].into_iter().flatten() {
        free_string(raw_ctx, s);
    }
    result
}

/// `MSET args…` into the replication stream and the AOF, after whatever the
/// command propagated before (RM_Replicate takes its own references).
///
/// # Safety
///
/// `args` are live strings; `raw_ctx` is the calling command's context.
unsafe fn replicate_mset(
    raw_ctx: *mut raw::RedisModuleCtx,
    args: &mut [*mut raw::RedisModuleString],
) {
    if let Some(replicate) = unsafe {
        // SAFETY: filled in by RedisModule_Init; read by value.
        raw::RedisModule_Replicate
    } {
        unsafe {
            // SAFETY: format "v" consumes a `RedisModuleString **` and a
            // `size_t` count, which is what is passed; Redis retains the
            // strings it keeps.
            replicate(
                raw_ctx,
                c"MSET".as_ptr(),
                c"v".as_ptr(),
                args.as_mut_ptr(),
                args.len(),
            );
        }
    }
}

/// Whether the key named `name` exists (RM_KeyExists, Redis 7.0+), or
/// `None` where the server lacks it (the caller opens the key instead).
pub fn key_exists(ctx: &Context, name: &[u8]) -> Option<bool> {
    let exists = unsafe {
        // SAFETY: filled in by RedisModule_Init; read by value.
        raw::RedisModule_KeyExists
    }?;
    let raw_ctx = ctx.get_raw();
    let s = create_string(raw_ctx, name)?;
    let found = unsafe {
        // SAFETY: a live string and the calling command's context.
        exists(raw_ctx, s)
    };
    free_string(raw_ctx, s);
    Some(found != 0)
}

/// Send `value` as the command's reply with the module API directly (the
/// crate's writer allocates a CString per simple string). A simple string
/// holding a NUL (which RM_ReplyWithSimpleString would cut) goes out as a
/// bulk string; kinds the module never builds go through the crate.
pub fn reply(ctx: &Context, value: RedisValue) {
    let raw_ctx = ctx.get_raw();
    let (Some(array), Some(simple), Some(long), Some(buffer), Some(null)) = (unsafe {
        // SAFETY: function pointers filled in by RedisModule_Init; read by value.
        (
            raw::RedisModule_ReplyWithArray,
            raw::RedisModule_ReplyWithSimpleString,
            raw::RedisModule_ReplyWithLongLong,
            raw::RedisModule_ReplyWithStringBuffer,
            raw::RedisModule_ReplyWithNull,
        )
    }) else {
        ctx.reply(Ok(value));
        return;
    };
    let bulk = |bytes: &[u8]| unsafe {
        // SAFETY: Redis copies `len` bytes from a live slice.
        buffer(raw_ctx, bytes.as_ptr().cast(), bytes.len());
    };
    let status = |text: &str| {
        if text.as_bytes().contains(&0) {
            bulk(text.as_bytes());
            return;
        }
        // NUL-terminated on the stack when short (every status the module
        // sends), else on the heap.
        let mut small = [0u8; 64];
        if let Some(dst) = small.get_mut(..text.len()).filter(|_| text.len() < 64) {
            dst.copy_from_slice(text.as_bytes());
            unsafe {
                // SAFETY: `small` holds the text and at least one NUL after it.
                simple(raw_ctx, small.as_ptr().cast());
            }
        } else if let Ok(c) = std::ffi::CString::new(text) {
            unsafe {
                // SAFETY: a NUL-terminated string, live across the call.
                simple(raw_ctx, c.as_ptr());
            }
        }
    };
    match value {
        RedisValue::Integer(i) => unsafe {
            // SAFETY: the calling command's context.
            long(raw_ctx, i);
        },
        RedisValue::SimpleStringStatic(s) => status(s),
        RedisValue::SimpleString(s) => status(&s),
        RedisValue::BulkString(s) => bulk(s.as_bytes()),
        RedisValue::StringBuffer(b) => bulk(&b),
        RedisValue::Null => unsafe {
            // SAFETY: the calling command's context.
            null(raw_ctx);
        },
        RedisValue::Array(items) => {
            let n = std::os::raw::c_long::try_from(items.len()).unwrap_or(0);
            unsafe {
                // SAFETY: the calling command's context; exactly `n` items follow.
                array(raw_ctx, n);
            }
            for item in items.into_iter().take(usize::try_from(n).unwrap_or(0)) {
                reply(ctx, item);
            }
        }
        other => {
            ctx.reply(Ok(other));
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

/// The number of fields of the hash named `name` and whether `field` (if
/// given) is one of them: `Ok(None)` when the key is absent, an error when
/// it holds another type. One open of the key (RM_OpenKey, RM_KeyType,
/// RM_ValueLength, RM_HashGet with REDISMODULE_HASH_EXISTS).
pub fn hash_shape(
    ctx: &Context,
    name: &[u8],
    field: Option<&std::ffi::CStr>,
) -> Result<Option<(usize, bool)>, String> {
    let (Some(open), Some(close), Some(key_type), Some(length), Some(hash_get)) = (unsafe {
        // SAFETY: function pointers filled in by RedisModule_Init; read by value.
        (
            raw::RedisModule_OpenKey,
            raw::RedisModule_CloseKey,
            raw::RedisModule_KeyType,
            raw::RedisModule_ValueLength,
            raw::RedisModule_HashGet,
        )
    }) else {
        return Err("the server lacks the key API".into());
    };
    let raw_ctx = ctx.get_raw();
    let s = create_string(raw_ctx, name).ok_or("RM_CreateString failed")?;
    let found = unsafe {
        // SAFETY: a live string and the calling command's context; the
        // handle is used only before it is closed, once. RM_HashGet reads
        // (field, out) pairs up to a NULL: one C string and one int here.
        let handle = open(raw_ctx, s, raw::REDISMODULE_READ as c_int).cast::<raw::RedisModuleKey>();
        if handle.is_null() {
            Ok(None)
        } else {
            let kind = key_type(handle);
            let found = if kind == raw::REDISMODULE_KEYTYPE_EMPTY as c_int {
                Ok(None)
            } else if kind == raw::REDISMODULE_KEYTYPE_HASH as c_int {
                let mut exists: c_int = 0;
                let status = match field {
                    None => raw::REDISMODULE_OK as c_int,
                    Some(field) => hash_get(
                        handle,
                        (raw::REDISMODULE_HASH_CFIELDS | raw::REDISMODULE_HASH_EXISTS) as c_int,
                        field.as_ptr(),
                        &mut exists as *mut c_int,
                        std::ptr::null_mut::<std::os::raw::c_void>(),
                    ),
                };
                if status == raw::REDISMODULE_OK as c_int {
                    Ok(Some((length(handle), exists != 0)))
                } else {
                    Err("RM_HashGet failed".to_string())
                }
            } else {
                Err("not a hash".to_string())
            };
            close(handle);
            found
        }
    };
    free_string(raw_ctx, s);
    found
}

/// The number of fields of the hash named `name`: `Ok(None)` when the key
/// is absent, an error when it holds another type. One open of the key,
/// no copy of its fields ([`hash_shape`] without a field).
pub fn hash_length(ctx: &Context, name: &[u8]) -> Result<Option<usize>, String> {
    Ok(hash_shape(ctx, name, None)?.map(|(length, _)| length))
}
