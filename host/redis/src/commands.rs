//! The commands, on Redis's main thread: read the state key, let the
//! component decide, and only on `applied` run the write and store the new
//! state, all inside one command execution (so inside MULTI and scripts
//! too). What replicas and the AOF receive is the effect, never a FENCE
//! command: state keys (and FENCE.SET's data key) are set through the key
//! API and replicated as `SET`/`MSET`; FENCE.DEL's and FENCE.EXEC's
//! command runs through `RM_Call` with `!` and propagates itself, and Redis
//! wraps a command's several effects in one MULTI/EXEC. A replica or an AOF
//! replay needs no module.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use fencecheck::{
    AcquireRequest, Checker, Instance, LeaseError, ReleaseRequest, RenewRequest, Request, Runtime,
    SignedTokenText, Token,
};
use redis_module::{
    CallOptionResp, CallOptions, CallOptionsBuilder, CallReply, CallResult, Context, ContextFlags,
    KeyType, RedisError, RedisResult, RedisString, RedisValue, Status,
};

use crate::ffi;
use crate::keys;
use crate::rules::{self, Refusal, Verdict};
use crate::signals::{self, Operation};
use crate::signing::{self, Table, fence_keys};

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static INSTANCE: Mutex<Option<Instance>> = Mutex::new(None);
/// Load argument `TEST-CLOCK`: lease commands accept `NOW ms`. For the
/// conformance vectors only; never load it in production.
static TEST_CLOCK: AtomicBool = AtomicBool::new(false);
/// `COMMAND INFO` verdicts for FENCE.EXEC, by lower-case `name` or `name|sub`.
static ALLOWED: Mutex<Option<Verdicts>> = Mutex::new(None);

/// Whether FENCE.EXEC may run a command, or the error line saying why not.
type Verdicts = HashMap<Vec<u8>, Result<(), String>>;

type Handler = fn(&Context, &[RedisString]) -> Result<RedisValue, Refusal>;

/// Module load: one component runtime per server, made now, so a server
/// that cannot run the component refuses the module instead of failing
/// later.
pub fn init(ctx: &Context, args: &[RedisString]) -> Status {
    for arg in args {
        match arg.as_slice().to_ascii_uppercase().as_slice() {
            b"TEST-CLOCK" => TEST_CLOCK.store(true, Ordering::SeqCst),
            other => {
                ffi::log(
                    ctx,
                    ffi::Level::Warning,
                    &format!(
                        "fencecheck: unknown module argument {:?}",
                        String::from_utf8_lossy(other)
                    ),
                );
                return Status::Err;
            }
        }
    }
    let runtime = match RUNTIME.get() {
        Some(rt) => rt.clone(),
        None => match Runtime::new() {
            Ok(rt) => RUNTIME.get_or_init(|| rt).clone(),
            Err(e) => {
                ffi::log(
                    ctx,
                    ffi::Level::Warning,
                    &format!("fencecheck: loading the component: {e}"),
                );
                return Status::Err;
            }
        },
    };
    match runtime.instance() {
        Ok(instance) => match INSTANCE.lock() {
            Ok(mut slot) => *slot = Some(instance),
            Err(_) => return Status::Err,
        },
        Err(e) => {
            ffi::log(
                ctx,
                ffi::Level::Warning,
                &format!("fencecheck: instantiating the component: {e}"),
            );
            return Status::Err;
        }
    }
    ffi::log(
        ctx,
        ffi::Level::Notice,
        &format!(
            "fencecheck: component fencecheck:fence@{} loaded",
            runtime.component_version()
        ),
    );
    Status::Ok
}

/// Run a handler and send its reply. Nothing here may unwind into Redis: a
/// panic across the module's C entry point aborts the whole server, every
/// client's data with it. So the reply is made safe for the writers (error
/// lines printable ASCII, see [`Refusal::wire`]; a simple string holding a
/// NUL goes out as a bulk string, [`ffi::reply`]) and sent inside the same
/// `catch_unwind`; a caught panic is logged and answered `-FENCERUNTIME`.
fn guarded(ctx: &Context, args: &[RedisString], handler: Handler) -> RedisResult {
    let sent = catch_unwind(AssertUnwindSafe(|| match handler(ctx, args) {
        Ok(value) => ffi::reply(ctx, value),
        Err(refusal) => {
            ctx.reply(Err(RedisError::String(refusal.wire())));
        }
    }));
    if let Err(panic) = sent {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        ffi::log(
            ctx,
            ffi::Level::Warning,
            &format!("fencecheck: a command panicked (caught; answered FENCERUNTIME): {what}"),
        );
        ctx.reply_error_string("FENCERUNTIME internal error (a panic, caught; see the server log)");
    }
    Ok(RedisValue::NoReply)
}

pub(crate) fn with_guest<T>(
    f: impl FnOnce(&mut Instance) -> Result<T, fencecheck::Error>,
) -> Result<T, Refusal> {
    let mut slot = match INSTANCE.lock() {
        Ok(slot) => slot,
        Err(poisoned) => {
            // A panic (caught by `guarded`) held the instance: its state is
            // unknown, so a fresh instance replaces it.
            INSTANCE.clear_poison();
            let mut slot = poisoned.into_inner();
            *slot = RUNTIME.get().and_then(|rt| rt.instance().ok());
            slot
        }
    };
    let guest = slot
        .as_mut()
        .ok_or_else(|| Refusal::new("FENCERUNTIME", "the component is not loaded"))?;
    f(guest).map_err(|e| rules::runtime_error(&e))
}

pub(crate) fn arity(args: &[RedisString], min: usize) -> Result<(), Refusal> {
    if args.len() < min {
        let name = args
            .first()
            .map(|a| String::from_utf8_lossy(a.as_slice()).to_ascii_lowercase())
            .unwrap_or_default();
        return Err(Refusal::syntax(format!(
            "wrong number of arguments for '{name}' command"
        )));
    }
    Ok(())
}

pub(crate) fn bytes(args: &[RedisString]) -> Vec<&[u8]> {
    args.iter().map(|a| a.as_slice()).collect()
}

/// A string key's bytes; `None` if absent; WRONGTYPE for any other type.
pub(crate) fn read_string(ctx: &Context, key: &[u8]) -> Result<Option<Vec<u8>>, Refusal> {
    // From the bytes: key names may hold NUL (Context::create_string panics on one).
    let name = RedisString::create_from_slice(ctx.get_raw(), key);
    let handle = ctx.open_key(&name);
    match handle.key_type() {
        KeyType::Empty => Ok(None),
        KeyType::String => handle
            .read()
            .map(|v| v.map(<[u8]>::to_vec))
            .map_err(|e| Refusal::new("FENCERUNTIME", e)),
        _ => Err(Refusal::new(
            "WRONGTYPE",
            format!(
                "{} holds the wrong kind of value for a fencecheck state",
                String::from_utf8_lossy(key)
            ),
        )),
    }
}

pub(crate) fn replicated() -> CallOptions {
    CallOptionsBuilder::new()
        .replicate()
        .errors_as_replies()
        .resp(CallOptionResp::Resp2)
        .build()
}

/// Set a string key and replicate it as `SET key value` (the replication
/// stream and the AOF see exactly that, after whatever the command
/// propagated before, in one MULTI/EXEC).
pub(crate) fn store(ctx: &Context, key: &[u8], value: &[u8]) -> Result<(), Refusal> {
    ffi::set_string(ctx, key, value)
        .map_err(|e| Refusal::new("FENCERUNTIME", format!("storing a key: {e}")))?;
    ctx.replicate("SET", &[key, value]);
    Ok(())
}

fn scope_key(scope: &[u8]) -> Result<Vec<u8>, Refusal> {
    if keys::reserved(scope) {
        return Err(Refusal::syntax(
            "keys and scopes starting with fencecheck: belong to the module",
        ));
    }
    keys::fence_key(scope).map_err(|_| {
        Refusal::syntax("a name with '}' needs a hash tag ({tag}) so its state can share its slot")
    })
}

/// Read the scope's state and decide: the shared first half of every
/// fenced command. The presented token, once parsed, is left in `seen`
/// (for the metrics' epoch label, so it is parsed once).
fn decide(
    ctx: &Context,
    scope: &[u8],
    token: &[u8],
    options: &[&[u8]],
    data: &[&[u8]],
    seen: &mut Option<Token>,
) -> Result<Decided, Refusal> {
    let state_key = scope_key(scope)?;
    let (opts, _) = rules::options(options, &[])?;
    let request: Request = rules::request(scope, token, opts)?;
    *seen = Some(request.token);
    let cluster = ctx.get_flags().contains(ContextFlags::CLUSTER);
    // The slot's signing table is part of the decision: mid-move, the node
    // that has the state but not the table must not decide.
    let table = Table::of(ctx, cluster, &state_key);
    settled(ctx, &state_key, data, table.as_ref())?;
    let state = read_string(ctx, &state_key)?;
    let keys = signing::scope_keys(ctx, scope, table.as_ref())?;
    let outcome = with_guest(|g| g.decide(state.as_deref(), &request, keys.as_deref()))?;
    Ok(Decided {
        state_key,
        verdict: rules::verdict(outcome)?,
        unmarked: table.and_then(|t| t.unmarked().map(<[u8]>::to_vec)),
    })
}

/// A fenced command's decision, before its write.
struct Decided {
    state_key: Vec<u8>,
    verdict: Verdict,
    /// In a cluster, the slot's signing table when the slot has none yet:
    /// the write that applies gives it one ([`signing::mark`]).
    unmarked: Option<Vec<u8>>,
}

impl Decided {
    /// Before an applied write: give the slot its table if it lacks one
    /// (first, so a failure leaves nothing written).
    fn mark(&self, ctx: &Context) -> Result<(), Refusal> {
        match &self.unmarked {
            Some(table) => signing::mark(ctx, table),
            None => Ok(()),
        }
    }
}

/// In a cluster, while a slot moves (MIGRATING on this node, or IMPORTING
/// and the client sent ASKING), a scope's keys can be split between the two
/// nodes, and a decision on a state key that has not arrived (or has left)
/// would start from nothing: a stale token applied, a lease granted twice.
/// Redis routes by the command's first argument only and cannot see the
/// derived state key, so the module applies Redis's own rule for multi-key
/// commands: with every key here, decide; with one missing while the slot
/// moves, `-TRYAGAIN` (clients retry it). Outside a migration a missing key
/// is simply new. `table` (the slot's signing table, looked up once by the
/// caller) is one of the keys that must be here.
///
/// Only when a key is missing does the module ask whether the slot moves,
/// and it asks Redis's own rule: an `EXISTS` of every key through RM_Call,
/// which a cluster routes as a client's command (the caller's ASKING
/// included). Redis answers it here when the slot is not moving or every
/// key is here, and otherwise refuses it (ASK while migrating, TRYAGAIN
/// while importing: a multi-key command with a key missing), which the
/// module answers as `-TRYAGAIN`. That costs about a tenth of `CLUSTER
/// NODES` (11 µs of server time, once per new scope; BENCHMARKS.md). One
/// key alone (a lock's renew or release) is no multi-key command, so there
/// the module reads `CLUSTER NODES` itself.
fn settled(
    ctx: &Context,
    state_key: &[u8],
    data: &[&[u8]],
    table: Option<&Table>,
) -> Result<(), Refusal> {
    if !ctx.get_flags().contains(ContextFlags::CLUSTER) {
        return Ok(());
    }
    let present = |k: &[u8]| ffi::key_exists(ctx, k) == Some(true);
    if table.is_none_or(|t| t.present) && present(state_key) && data.iter().all(|k| present(k)) {
        return Ok(());
    }
    let mut all: Vec<&[u8]> = Vec::with_capacity(data.len() + 2);
    all.push(state_key);
    all.extend(data.iter().copied().filter(|k| *k != state_key));
    all.extend(table.map(|t| t.key.as_slice()));
    if all.len() > 1 {
        let routed: CallResult = ctx.call_ext(
            "EXISTS",
            &CallOptionsBuilder::new().errors_as_replies().build(),
            all.as_slice(),
        );
        return match routed {
            Ok(CallReply::I64(_)) => Ok(()),
            // Redirected (the slot moves and a key is elsewhere), or
            // unknown: refuse rather than decide on half a scope.
            _ => Err(Refusal::new(
                "TRYAGAIN",
                "the scope's slot is being migrated and its keys are not all on this node",
            )),
        };
    }
    let nodes: CallResult = ctx.call_ext(
        "CLUSTER",
        &CallOptionsBuilder::new().errors_as_replies().build(),
        &[b"NODES".as_slice()],
    );
    let moving = match &nodes {
        Ok(CallReply::String(text)) => slot_moving(text.as_bytes(), keys::slot(state_key)),
        // Unknown: refuse rather than decide on what may be half a scope.
        _ => true,
    };
    if moving {
        return Err(Refusal::new(
            "TRYAGAIN",
            "the scope's slot is being migrated and its keys are not all on this node",
        ));
    }
    Ok(())
}

/// Whether `CLUSTER NODES` marks `slot` as migrating from or importing to
/// this node (`[slot->-id]`, `[slot-<-id]` on the `myself` line).
fn slot_moving(nodes: &[u8], slot: u16) -> bool {
    let Some(me) = nodes.split(|&b| b == b'\n').find(|line| {
        line.split(|&b| b == b' ')
            .nth(2)
            .is_some_and(|flags| flags.split(|&b| b == b',').any(|f| f == b"myself"))
    }) else {
        return true;
    };
    me.split(|&b| b == b' ').any(|field| {
        let Some(rest) = field.strip_prefix(b"[") else {
            return false;
        };
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        std::str::from_utf8(&rest[..digits])
            .ok()
            .and_then(|d| d.parse::<u16>().ok())
            == Some(slot)
    })
}

fn applied(version: u64) -> RedisValue {
    RedisValue::Array(vec![
        RedisValue::SimpleStringStatic("applied"),
        int(version),
    ])
}

fn duplicate(version: u64) -> RedisValue {
    RedisValue::Array(vec![
        RedisValue::SimpleStringStatic("duplicate"),
        int(version),
    ])
}

/// u64 as an integer reply, or as decimal text above i64's range.
fn int(v: u64) -> RedisValue {
    match i64::try_from(v) {
        Ok(i) => RedisValue::Integer(i),
        Err(_) => RedisValue::BulkString(v.to_string()),
    }
}

fn data_key(key: &[u8]) -> Result<(), Refusal> {
    if keys::reserved(key) {
        return Err(Refusal::syntax(
            "keys starting with fencecheck: belong to the module",
        ));
    }
    Ok(())
}

/// `FENCE.SET key token value [POLICY p] [OPID id] [VERSION n]`
fn decided_set(
    ctx: &Context,
    args: &[RedisString],
    seen: &mut Option<Token>,
) -> Result<RedisValue, Refusal> {
    let a = bytes(args);
    data_key(a[1])?;
    let decided = decide(ctx, a[1], a[2], &a[4..], &[a[1]], seen)?;
    match &decided.verdict {
        Verdict::Duplicate { version } => Ok(duplicate(*version)),
        Verdict::Apply { version, state } => {
            // Both keys, replicated as ONE command (MSET), which replicas
            // and the AOF apply atomically without a MULTI/EXEC wrapper.
            decided.mark(ctx)?;
            ffi::set_pair(ctx, &args[1], &args[3], &decided.state_key, state)
                .map_err(|e| Refusal::new("FENCERUNTIME", format!("storing a key: {e}")))?;
            Ok(applied(*version))
        }
    }
}

/// `FENCE.DEL key token [POLICY p] [OPID id] [VERSION n]`: deletes the key;
/// the mark stays, so the key cannot be re-created with an older token.
fn decided_del(
    ctx: &Context,
    args: &[RedisString],
    seen: &mut Option<Token>,
) -> Result<RedisValue, Refusal> {
    let a = bytes(args);
    data_key(a[1])?;
    let decided = decide(ctx, a[1], a[2], &a[3..], &[a[1]], seen)?;
    match &decided.verdict {
        Verdict::Duplicate { version } => Ok(duplicate(*version)),
        Verdict::Apply { version, state } => {
            decided.mark(ctx)?;
            let result: CallResult = ctx.call_ext("DEL", &replicated(), &[a[1]]);
            if let Err(e) = result {
                return Err(Refusal(e.to_string()));
            }
            store(ctx, &decided.state_key, state)?;
            Ok(applied(*version))
        }
    }
}

/// `FENCE.CHECK scope token [options]`: the decision, nothing written.
fn decided_check(
    ctx: &Context,
    args: &[RedisString],
    seen: &mut Option<Token>,
) -> Result<RedisValue, Refusal> {
    let a = bytes(args);
    let verdict = decide(ctx, a[1], a[2], &a[3..], &[], seen)?.verdict;
    Ok(match verdict {
        Verdict::Apply { version, .. } => applied(version),
        Verdict::Duplicate { version } => duplicate(version),
    })
}

/// Whether FENCE.EXEC may run this command: a write command (flag `write`),
/// not admin, not refused in scripts, not `@dangerous`, not ours.
fn command_allowed(ctx: &Context, inner: &[&[u8]]) -> Result<(), Refusal> {
    let name = inner[0].to_ascii_lowercase();
    if name.starts_with(b"fence.") {
        return Err(Refusal::syntax("FENCE.EXEC cannot run FENCE commands"));
    }
    let sub = inner.get(1).map(|s| s.to_ascii_lowercase());
    let mut cache = ALLOWED
        .lock()
        .map_err(|_| Refusal::new("FENCERUNTIME", "command cache unavailable"))?;
    let cache = cache.get_or_insert_with(HashMap::new);
    let mut cache_key = name.clone();
    if let Some(verdict) = cache.get(&cache_key) {
        return verdict.clone().map_err(Refusal);
    }
    if let Some(sub) = &sub {
        cache_key.push(b'|');
        cache_key.extend_from_slice(sub);
        if let Some(verdict) = cache.get(&cache_key) {
            return verdict.clone().map_err(Refusal);
        }
    }
    let info: CallResult = ctx.call_ext(
        "COMMAND",
        &CallOptionsBuilder::new()
            .errors_as_replies()
            .resp(CallOptionResp::Resp2)
            .build(),
        &[b"INFO".as_slice(), name.as_slice()],
    );
    let shown = String::from_utf8_lossy(&name)
        .chars()
        .take(64)
        .collect::<String>();
    let entry = match &info {
        Ok(CallReply::Array(list)) => match list.get(0) {
            Some(Ok(CallReply::Array(entry))) => entry,
            _ => return Err(Refusal::syntax(format!("unknown command '{shown}'"))),
        },
        _ => return Err(Refusal::new("FENCERUNTIME", "COMMAND INFO failed")),
    };
    let strings = |i: usize| -> Vec<Vec<u8>> {
        match entry.get(i) {
            Some(Ok(CallReply::Array(items))) => items
                .iter()
                .filter_map(|x| match x {
                    Ok(CallReply::String(s)) => Some(s.as_bytes().to_ascii_lowercase()),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        }
    };
    // A container (CONFIG, XGROUP…): judge the subcommand's own entry.
    let mut flags = strings(2);
    let mut categories = strings(6);
    let mut judged = name.clone();
    if let Some(Ok(CallReply::Array(subs))) = entry.get(9)
        && subs.len() > 0
    {
        let Some(sub) = &sub else {
            return Err(Refusal::syntax(format!("'{shown}' needs a subcommand")));
        };
        let mut full = name.clone();
        full.push(b'|');
        full.extend_from_slice(sub);
        let found = subs.iter().find_map(|s| match s {
            Ok(CallReply::Array(e)) => {
                let named = matches!(
                    e.get(0),
                    Some(Ok(CallReply::String(n))) if n.as_bytes().eq_ignore_ascii_case(&full)
                );
                named.then_some(e)
            }
            _ => None,
        });
        let Some(e) = found else {
            return Err(Refusal::syntax(format!("unknown subcommand of '{shown}'")));
        };
        let collect = |i: usize| -> Vec<Vec<u8>> {
            match e.get(i) {
                Some(Ok(CallReply::Array(items))) => items
                    .iter()
                    .filter_map(|x| match x {
                        Ok(CallReply::String(s)) => Some(s.as_bytes().to_ascii_lowercase()),
                        _ => None,
                    })
                    .collect(),
                _ => Vec::new(),
            }
        };
        flags = collect(2);
        categories = collect(6);
        judged = full;
    }
    let has = |list: &[Vec<u8>], what: &[u8]| list.iter().any(|f| f == what);
    let verdict = if !has(&flags, b"write") {
        Err(format!(
            "ERR FENCE.EXEC runs write commands only, not '{shown}'"
        ))
    } else if has(&flags, b"admin") || has(&flags, b"noscript") || has(&categories, b"@dangerous") {
        Err(format!(
            "ERR FENCE.EXEC does not run '{shown}' (admin, no-script or dangerous)"
        ))
    } else {
        Ok(())
    };
    cache.insert(judged, verdict.clone());
    verdict.map_err(Refusal)
}

/// `FENCE.EXEC scope token [options] -- COMMAND arg…`
fn decided_exec(
    ctx: &Context,
    args: &[RedisString],
    seen: &mut Option<Token>,
) -> Result<RedisValue, Refusal> {
    let a = bytes(args);
    let split = a
        .iter()
        .position(|x| *x == b"--")
        .ok_or_else(|| Refusal::syntax("FENCE.EXEC needs -- before the command"))?;
    let (head, inner) = a.split_at(split);
    let inner = &inner[1..];
    let inner_strings = &args[split + 1..];
    if inner.is_empty() || head.len() < 3 {
        return Err(Refusal::syntax(
            "usage: FENCE.EXEC scope token [options] -- COMMAND arg...",
        ));
    }
    if inner[0].contains(&0) || inner[0].len() > 64 {
        return Err(Refusal::syntax("invalid command name"));
    }
    command_allowed(ctx, inner)?;
    // The command's keys: at least one, none of the module's own, and in a
    // cluster all in the scope's slot.
    let positions = ffi::command_keys(ctx, inner_strings)
        .map_err(|e| Refusal::syntax(format!("FENCE.EXEC: {e}")))?;
    if positions.is_empty() {
        return Err(Refusal::syntax(
            "FENCE.EXEC runs commands that name at least one key",
        ));
    }
    let cluster = ctx.get_flags().contains(ContextFlags::CLUSTER);
    let scope_slot = keys::slot(head[1]);
    let mut data = Vec::with_capacity(positions.len());
    for p in positions {
        let key = inner.get(p).copied().unwrap_or_default();
        data.push(key);
        data_key(key)?;
        if cluster && keys::slot(key) != scope_slot {
            return Err(Refusal::new(
                "CROSSSLOT",
                "the command's keys must hash to the scope's slot",
            ));
        }
    }
    let decided = decide(ctx, head[1], head[2], &head[3..], &data, seen)?;
    match &decided.verdict {
        Verdict::Duplicate { version } => Ok(duplicate(*version)),
        Verdict::Apply { version, state } => {
            decided.mark(ctx)?;
            // As the calling user (ACL), in script mode (no deny-script
            // commands, min-replicas and disk-error checks), replicated.
            let opts = CallOptionsBuilder::new()
                .replicate()
                .errors_as_replies()
                .verify_acl()
                .script_mode()
                .resp(CallOptionResp::Resp2)
                .build();
            let name = String::from_utf8_lossy(inner[0]).into_owned();
            let rest: Vec<&RedisString> = inner_strings[1..].iter().collect();
            let result: CallResult = ctx.call_ext(&name, &opts, rest.as_slice());
            let reply = match &result {
                Ok(reply) => value(reply),
                Err(e) => return Err(Refusal(e.to_string())),
            };
            store(ctx, &decided.state_key, state)?;
            Ok(RedisValue::Array(vec![
                RedisValue::SimpleStringStatic("applied"),
                int(*version),
                reply,
            ]))
        }
    }
}

/// A nested reply relayed to the client (RESP2: strings as bulk strings,
/// so no byte of a value can break the protocol).
fn value(reply: &CallReply) -> RedisValue {
    match reply {
        CallReply::I64(i) => RedisValue::Integer(i.to_i64()),
        CallReply::String(s) => RedisValue::StringBuffer(s.as_bytes().to_vec()),
        CallReply::Array(items) => RedisValue::Array(
            items
                .iter()
                .map(|item| match item {
                    Ok(r) => value(&r),
                    Err(e) => RedisValue::StringBuffer(e.as_bytes().to_vec()),
                })
                .collect(),
        ),
        CallReply::Bool(b) => RedisValue::Integer(i64::from(b.to_bool())),
        CallReply::Double(d) => RedisValue::BulkString(d.to_double().to_string()),
        _ => RedisValue::Null,
    }
}

/// `FENCE.INSPECT scope [LEASE]`: the state decoded as JSON, nil if none.
fn fence_inspect(ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
    arity(args, 2)?;
    let a = bytes(args);
    let lease = match a.get(2) {
        None => false,
        Some(x) if x.eq_ignore_ascii_case(b"LEASE") && a.len() == 3 => true,
        _ => return Err(Refusal::syntax("usage: FENCE.INSPECT scope [LEASE]")),
    };
    if keys::reserved(a[1]) {
        return Err(Refusal::syntax(
            "scopes starting with fencecheck: belong to the module",
        ));
    }
    let key = if lease {
        keys::lease_key(a[1])
    } else {
        keys::fence_key(a[1])
    }
    .map_err(|_| Refusal::syntax("a name with '}' needs a hash tag"))?;
    let Some(state) = read_string(ctx, &key)? else {
        return Ok(RedisValue::Null);
    };
    let json = if lease {
        let info = with_guest(|g| g.inspect_lease(&state))?.map_err(|e| rules::lease_error(&e))?;
        serde_json::to_string(&info)
    } else {
        let info = with_guest(|g| g.inspect(&state))?.map_err(|e| rules::check_error(&e))?;
        serde_json::to_string(&info)
    };
    json.map(RedisValue::BulkString)
        .map_err(|e| Refusal::new("FENCERUNTIME", e))
}

// ---- leases ----

/// A u64 stored as canonical decimal text under one of the module's keys;
/// anything else is an error, never read as 0.
fn read_u64(ctx: &Context, key: &[u8]) -> Result<Option<u64>, Refusal> {
    match read_string(ctx, key)? {
        None => Ok(None),
        Some(v) => {
            let canonical =
                !v.is_empty() && v.iter().all(u8::is_ascii_digit) && (v.len() == 1 || v[0] != b'0');
            std::str::from_utf8(&v)
                .ok()
                .filter(|_| canonical)
                .and_then(|s| s.parse::<u64>().ok())
                .map(Some)
                .ok_or_else(|| {
                    Refusal::new(
                        "CORRUPTSTATE",
                        format!("{} is not a canonical u64", String::from_utf8_lossy(key)),
                    )
                })
        }
    }
}

fn now(more: &[(String, &[u8])]) -> Result<u64, Refusal> {
    match more.iter().find(|(n, _)| n == "NOW") {
        Some((_, v)) if TEST_CLOCK.load(Ordering::SeqCst) => rules::number("NOW", v),
        Some(_) => Err(Refusal::syntax(
            "NOW needs the module loaded with TEST-CLOCK",
        )),
        None => u64::try_from(ffi::milliseconds())
            .map_err(|_| Refusal::new("FENCERUNTIME", "the clock is before 1970")),
    }
}

fn lock_key(lock: &[u8]) -> Result<Vec<u8>, Refusal> {
    if keys::reserved(lock) {
        return Err(Refusal::syntax(
            "locks starting with fencecheck: belong to the module",
        ));
    }
    keys::lease_key(lock).map_err(|_| Refusal::syntax("a lock name with '}' needs a hash tag"))
}

/// `FENCE.ACQUIRE lock lease-id ttl-ms`: the component's lease rules on the
/// lock's lease state; the token is minted in the same step.
fn fence_acquire(ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
    arity(args, 4)?;
    let a = bytes(args);
    let key = lock_key(a[1])?;
    let cluster = ctx.get_flags().contains(ContextFlags::CLUSTER);
    let (lineage_key, floor_key) = lineage_keys(cluster, &key);
    // In a cluster the slot's lineage and floor are part of the decision:
    // mid-move, a node that lacks them must not decide from nothing.
    let table = Table::of(ctx, cluster, &key);
    let slot_keys: Vec<&[u8]> = match &table {
        Some(_) => vec![lineage_key.as_slice(), floor_key.as_slice()],
        None => Vec::new(),
    };
    settled(ctx, &key, &slot_keys, table.as_ref())?;
    let lock = rules::text("lock", a[1])?;
    let lease_id = rules::text("lease-id", a[2])?;
    let ttl = rules::number("ttl-ms", a[3])?;
    let more = options_only(&a[4..], &["NOW"])?;
    let now = now(&more)?;
    let (authority, new_lineage) = match read_u64(ctx, &lineage_key)? {
        Some(id) => (id, false),
        None => (ffi::random_nonzero_u64(), true),
    };
    let stored_floor = read_u64(ctx, &floor_key)?;
    let floor = stored_floor.unwrap_or(0);
    let state = read_string(ctx, &key)?;
    let mut request = AcquireRequest {
        lock: lock.to_string(),
        lease_id: lease_id.to_string(),
        authority,
        epoch_floor: floor,
        now,
        ttl,
    };
    let signing = signing::grant_key(ctx, table.as_ref())?;
    let unmarked = table.as_ref().and_then(Table::unmarked);
    let mut decided = with_guest(|g| g.acquire(state.as_deref(), &request))?;
    // A lock's state pins the authority it was first granted under. In a
    // cluster the slot's lineage moves with the lock, but a lock granted by
    // an earlier module (one lineage per node) may have another: it goes on
    // in its own authority (its epochs and counters are in its state),
    // instead of refusing every later acquire.
    if let Err(LeaseError::ForeignAuthority { stored, .. }) = decided
        && cluster
    {
        request.authority = stored;
        decided = with_guest(|g| g.acquire(state.as_deref(), &request))?;
    }
    match decided.map_err(|e| rules::lease_error(&e))? {
        fencecheck::Acquire::Acquired {
            token,
            expires_at,
            state: new_state,
        } => {
            let text = match &signing {
                None => rules::token_text(token),
                Some(k) => {
                    let signature = with_guest(|g| g.sign(lock, token, lease_id, k))?
                        .map_err(|e| Refusal::new("INVALIDKEYS", e))?;
                    SignedTokenText {
                        token,
                        signature: Some(signature),
                    }
                    .to_string()
                }
            };
            if let Some(table) = unmarked {
                signing::mark(ctx, table)?;
            }
            if new_lineage {
                store(ctx, &lineage_key, request.authority.to_string().as_bytes())?;
            }
            // A cluster slot's floor exists from its first grant on, so a
            // slot being moved never looks floorless on either node.
            if cluster && stored_floor.is_none() {
                store(ctx, &floor_key, b"0")?;
            }
            if state.as_deref() != Some(new_state.as_slice()) {
                store(ctx, &key, &new_state)?;
            }
            Ok(RedisValue::Array(vec![
                RedisValue::SimpleStringStatic("acquired"),
                RedisValue::BulkString(text),
                int(expires_at),
                // The clock the decision used: a retried acquire returns
                // the original grant, whose time left is expires_at - now.
                int(now),
            ]))
        }
        fencecheck::Acquire::Busy { holder, expires_at } => Ok(RedisValue::Array(vec![
            RedisValue::SimpleStringStatic("busy"),
            RedisValue::BulkString(holder),
            int(expires_at),
        ])),
    }
}

fn options_only<'a>(args: &[&'a [u8]], extra: &[&str]) -> Result<rules::Extra<'a>, Refusal> {
    let (opts, more) = rules::options(args, extra)?;
    if opts != rules::Options::default() {
        return Err(Refusal::syntax(
            "POLICY, OPID and VERSION are for fenced writes",
        ));
    }
    Ok(more)
}

/// The token of a lease command: the lineage's authority if the text has
/// none, so clients may present `EPOCH.COUNTER` or the full text.
fn lease_token(text: &[u8]) -> Result<fencecheck::Token, Refusal> {
    Ok(rules::token(text)?.token)
}

/// `FENCE.RENEW lock lease-id token ttl-ms`
fn fence_renew(ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
    arity(args, 5)?;
    let a = bytes(args);
    let key = lock_key(a[1])?;
    settled(ctx, &key, &[], None)?;
    let request = RenewRequest {
        lease_id: rules::text("lease-id", a[2])?.to_string(),
        token: lease_token(a[3])?,
        now: 0,
        ttl: rules::number("ttl-ms", a[4])?,
    };
    let more = options_only(&a[5..], &["NOW"])?;
    let request = RenewRequest {
        now: now(&more)?,
        ..request
    };
    let state = read_string(ctx, &key)?;
    match with_guest(|g| g.renew(state.as_deref(), &request))?
        .map_err(|e| rules::lease_error(&e))?
    {
        fencecheck::Renew::Renewed {
            expires_at,
            state: new_state,
        } => {
            store(ctx, &key, &new_state)?;
            Ok(RedisValue::Array(vec![
                RedisValue::SimpleStringStatic("renewed"),
                int(expires_at),
            ]))
        }
        fencecheck::Renew::Lost => Ok(RedisValue::Array(vec![RedisValue::SimpleStringStatic(
            "lost",
        )])),
    }
}

/// `FENCE.RELEASE lock lease-id token`
fn fence_release(ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
    arity(args, 4)?;
    let a = bytes(args);
    if a.len() != 4 {
        return Err(Refusal::syntax("usage: FENCE.RELEASE lock lease-id token"));
    }
    let key = lock_key(a[1])?;
    settled(ctx, &key, &[], None)?;
    let request = ReleaseRequest {
        lease_id: rules::text("lease-id", a[2])?.to_string(),
        token: lease_token(a[3])?,
    };
    let state = read_string(ctx, &key)?;
    match with_guest(|g| g.release(state.as_deref(), &request))?
        .map_err(|e: LeaseError| rules::lease_error(&e))?
    {
        fencecheck::Release::Released { state: new_state } => {
            store(ctx, &key, &new_state)?;
            Ok(RedisValue::Array(vec![RedisValue::SimpleStringStatic(
                "released",
            )]))
        }
        fencecheck::Release::NotOwner => {
            Ok(RedisValue::Array(vec![RedisValue::SimpleStringStatic(
                "not-owner",
            )]))
        }
    }
}

/// The keys of the lineage and the epoch floor a lock's grants use: the
/// server's, or in a cluster its slot's ([`keys::slot_lineage_key`]).
fn lineage_keys(cluster: bool, lease_key: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if cluster {
        let slot = keys::slot(lease_key);
        (keys::slot_lineage_key(slot), keys::slot_floor_key(slot))
    } else {
        (
            keys::LINEAGE_KEY.as_bytes().to_vec(),
            keys::FLOOR_KEY.as_bytes().to_vec(),
        )
    }
}

/// `FENCE.RESTORE [at-least]`: raise the epoch floor to
/// `max(floor + 1, at-least)` (default: the server's Unix time in ms), so
/// every later grant of every lock compares above every token issued before.
/// In a cluster, the floor of every slot this node serves, to one value
/// above the highest of them; a slot with no lineage yet gets the node's
/// (so every lock the node serves grants under a lineage its replicas
/// already have).
fn fence_restore(ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
    arity(args, 1)?;
    let a = bytes(args);
    let at_least = match a.get(1..) {
        Some([]) | None => u64::try_from(ffi::milliseconds()).unwrap_or(0),
        Some([v]) => rules::number("at-least", v)?,
        Some(_) => return Err(Refusal::syntax("usage: FENCE.RESTORE [at-least]")),
    };
    let raise = |floor: u64| -> Result<u64, Refusal> {
        Ok(floor
            .checked_add(1)
            .ok_or_else(|| Refusal::new("EXHAUSTED", "the epoch floor would overflow"))?
            .max(at_least))
    };
    let flags = ctx.get_flags();
    if !flags.contains(ContextFlags::CLUSTER) {
        let floor = read_u64(ctx, keys::FLOOR_KEY.as_bytes())?.unwrap_or(0);
        let next = raise(floor)?;
        store(ctx, keys::FLOOR_KEY.as_bytes(), next.to_string().as_bytes())?;
        return Ok(restored(next));
    }
    // Inside MULTI or a script the server files every key under the
    // transaction's slot (Valkey 8): the other slots' floors would go astray.
    if flags.contains(ContextFlags::MULTI) || flags.contains(ContextFlags::LUA) {
        return Err(Refusal::syntax(
            "in a cluster FENCE.RESTORE runs on its own, not in MULTI or a script",
        ));
    }
    let slots = served_slots(ctx)?;
    let mut highest = 0;
    let mut lineage = None;
    for &slot in &slots {
        highest = highest.max(read_u64(ctx, &keys::slot_floor_key(slot))?.unwrap_or(0));
        if lineage.is_none() {
            lineage = read_u64(ctx, &keys::slot_lineage_key(slot))?;
        }
    }
    let next = raise(highest)?;
    let lineage = lineage.unwrap_or_else(ffi::random_nonzero_u64).to_string();
    let text = next.to_string();
    for slot in slots {
        let lineage_key = keys::slot_lineage_key(slot);
        if read_string(ctx, &lineage_key)?.is_none() {
            store(ctx, &lineage_key, lineage.as_bytes())?;
        }
        store(ctx, &keys::slot_floor_key(slot), text.as_bytes())?;
        signing::mark(ctx, &keys::slot_signing_key(slot))?;
    }
    Ok(restored(next))
}

fn restored(floor: u64) -> RedisValue {
    RedisValue::Array(vec![RedisValue::SimpleStringStatic("restored"), int(floor)])
}

/// The slots this cluster node serves (its `myself` line of `CLUSTER
/// NODES`); `-TRYAGAIN` while one of them is being moved in or out, when
/// its keys may be on either node.
pub(crate) fn served_slots(ctx: &Context) -> Result<Vec<u16>, Refusal> {
    let nodes: CallResult = ctx.call_ext(
        "CLUSTER",
        &CallOptionsBuilder::new().errors_as_replies().build(),
        &[b"NODES".as_slice()],
    );
    let Ok(CallReply::String(text)) = &nodes else {
        return Err(Refusal::new("FENCERUNTIME", "CLUSTER NODES failed"));
    };
    let text = text.as_bytes();
    let me = text
        .split(|&b| b == b'\n')
        .find(|line| {
            line.split(|&b| b == b' ')
                .nth(2)
                .is_some_and(|flags| flags.split(|&b| b == b',').any(|f| f == b"myself"))
        })
        .ok_or_else(|| Refusal::new("FENCERUNTIME", "CLUSTER NODES names no myself"))?;
    let mut slots = Vec::new();
    for field in me.split(|&b| b == b' ').skip(8) {
        if field.starts_with(b"[") {
            return Err(Refusal::new(
                "TRYAGAIN",
                "a slot of this node is being migrated: restore once it has moved",
            ));
        }
        let field = std::str::from_utf8(field).unwrap_or_default().trim();
        if field.is_empty() {
            continue;
        }
        let (first, last) = field.split_once('-').unwrap_or((field, field));
        match (first.parse::<u16>(), last.parse::<u16>()) {
            (Ok(first), Ok(last)) if first <= last && last < 16384 => slots.extend(first..=last),
            _ => {
                return Err(Refusal::new(
                    "FENCERUNTIME",
                    format!("CLUSTER NODES: bad slot range {field:?}"),
                ));
            }
        }
    }
    Ok(slots)
}

/// `FENCE.VERSION`: the WIT package version of the component the module
/// runs (the one built into it), as every host reports it.
fn fence_version(_ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
    if args.len() != 1 {
        return Err(Refusal::syntax("usage: FENCE.VERSION"));
    }
    let runtime = RUNTIME
        .get()
        .ok_or_else(|| Refusal::new("FENCERUNTIME", "the component is not loaded"))?;
    Ok(RedisValue::BulkString(
        runtime.component_version().to_string(),
    ))
}

// Entry points named in the module's command table (lib.rs).
macro_rules! entry_points {
    ($($name:ident => $handler:ident),* $(,)?) => {$(
        pub fn $name(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
            guarded(ctx, &args, $handler)
        }
    )*};
}

entry_points! {
    set => fence_set,
    del => fence_del,
    exec => fence_exec,
    check => fence_check,
    inspect => fence_inspect,
    acquire => fence_acquire,
    renew => fence_renew,
    release => fence_release,
    restore => fence_restore,
    keys => fence_keys,
    version => fence_version,
    metrics => fence_metrics,
}

/// Whether a fenced command's reply is `duplicate`.
fn is_duplicate(value: &RedisValue) -> bool {
    matches!(value, RedisValue::Array(v) if matches!(v.first(), Some(RedisValue::SimpleStringStatic("duplicate"))))
}

// The fenced commands, counted: once their arity is right, every reply is
// one decision (`fencecheck_decisions_total`, docs/design.md §12).
macro_rules! counted {
    ($($name:ident => $decided:ident, $operation:expr, $arity:expr);* $(;)?) => {$(
        fn $name(ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
            arity(args, $arity)?;
            let mut seen = None;
            let result = $decided(ctx, args, &mut seen);
            let epoch = match seen {
                Some(token) => fencecheck::epoch_index(Some(token)),
                // Refused before the token was parsed: parse it for the label.
                None => signals::epoch_index(args.get(2).map(|t| t.as_slice()).unwrap_or_default()),
            };
            signals::count($operation, epoch, &result, is_duplicate);
            result
        }
    )*};
}

counted! {
    fence_set => decided_set, Operation::Put, 4;
    fence_del => decided_del, Operation::Delete, 3;
    fence_exec => decided_exec, Operation::Execute, 5;
    fence_check => decided_check, Operation::Check, 3;
}

/// `FENCE.METRICS`: the decisions counted since the module loaded, as
/// Prometheus text exposition (for a scraper's sidecar or a script).
fn fence_metrics(_ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
    if args.len() != 1 {
        return Err(Refusal::syntax("FENCE.METRICS takes no arguments"));
    }
    Ok(RedisValue::BulkString(signals::exposition()))
}
