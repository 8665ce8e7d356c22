//! Signed tokens: which scopes require them and with which keys, and the
//! key FENCE.ACQUIRE signs its grants with; `FENCE.KEYS` sets both.
//!
//! A standalone server keeps them in two node-wide keys: the hash
//! `fencecheck:signing-keys` (scope prefix → key set) and the string
//! `fencecheck:grant-key`. A cluster cannot use node-wide keys (see
//! [`keys::slot_lineage_key`]: other slots' commands do not see them, and a
//! slot holding one cannot be handed over), so there every slot keeps its
//! own table, `fencecheck:signing-keys:{T}` ([`keys::slot_signing_key`]),
//! which moves with the slot's scopes and locks. FENCE.KEYS writes the
//! table of every slot its node serves.
//!
//! In a cluster the table also tells "no scope of this slot requires
//! signatures" apart from "the table has already left with a migrating
//! slot" (which would let an unsigned token through on the node the scope's
//! state has not left yet): every slot that holds fence state or a lease
//! holds a table, since the first applied write or grant in a slot writes
//! an empty one ([`mark`]). A missing table then means a slot's first write
//! or a move in progress, which `settled` tells apart (`-TRYAGAIN` while
//! the slot moves), and the common case costs one key lookup and one open
//! of the table, no call.

use fencecheck::{GrantKey, KeysText};
use redis_module::{
    CallOptionsBuilder, CallReply, CallResult, Context, ContextFlags, RedisString, RedisValue,
};

use crate::commands::{arity, bytes, read_string, replicated, served_slots, store, with_guest};
use crate::ffi;
use crate::keys;
use crate::rules::{self, Refusal};

/// In a cluster, the signing table of a command's slot, looked up once:
/// the decision, `settled` and the mark all use this one lookup.
pub(crate) struct Table {
    /// `fencecheck:signing-keys:{T}` of the slot.
    pub(crate) key: Vec<u8>,
    /// Whether the slot has its table (see [`mark`]).
    pub(crate) present: bool,
}

impl Table {
    /// The table a command on `key` reads in a cluster (the table of the
    /// key's slot); `None` outside a cluster, where the node-wide keys
    /// hold the same.
    pub(crate) fn of(ctx: &Context, cluster: bool, key: &[u8]) -> Option<Self> {
        cluster.then(|| {
            let key = keys::slot_signing_key(keys::slot(key));
            let present = ffi::key_exists(ctx, &key) == Some(true);
            Self { key, present }
        })
    }

    /// The key to give the slot before an applied write, when it has none.
    pub(crate) fn unmarked(&self) -> Option<&[u8]> {
        (!self.present).then_some(self.key.as_slice())
    }
}

/// The keys `scope` requires: the set stored under the longest prefix that
/// starts the scope, in the node-wide hash or, in a cluster, in `table`.
/// Read on every call, never cached: a stale cache could let an unsigned
/// token through a scope that requires signing.
pub(crate) fn scope_keys(
    ctx: &Context,
    scope: &[u8],
    table: Option<&Table>,
) -> Result<Option<Vec<GrantKey>>, Refusal> {
    let hash = match table {
        // Absent is the common case outside a cluster, answered by one
        // lookup (no key handle).
        None => {
            let hash = keys::SIGNING_KEYS_KEY.as_bytes();
            if ffi::key_exists(ctx, hash) == Some(false) {
                return Ok(None);
            }
            match ffi::hash_length(ctx, hash).map_err(|e| not_a_hash(hash, &e))? {
                None => return Ok(None),
                Some(_) => hash,
            }
        }
        // In a cluster: a table holding only its grant field, the common
        // case, is answered by one open of the key, without its fields.
        Some(table) => {
            node_wide_refused(ctx, keys::SIGNING_KEYS_KEY)?;
            if !table.present {
                return Ok(None);
            }
            let hash = table.key.as_slice();
            match ffi::hash_shape(ctx, hash, Some(keys::GRANT_FIELD_C))
                .map_err(|e| not_a_hash(hash, &e))?
            {
                None | Some((1, true)) => return Ok(None),
                Some(_) => hash,
            }
        }
    };
    let entries = hash_entries(ctx, hash)?;
    let mut best: Option<(&[u8], &[u8])> = None;
    for (prefix, set) in &entries {
        if !keys::reserved(prefix)
            && scope.starts_with(prefix)
            && best.is_none_or(|(p, _)| p.len() < prefix.len())
        {
            best = Some((prefix, set));
        }
    }
    match best {
        None => Ok(None),
        Some((_, set)) => rules::key_set(set).map(Some),
    }
}

/// The key grants are signed with, if any: the node-wide string, or in a
/// cluster the grant field of `table` (empty: grants are not signed).
pub(crate) fn grant_key(ctx: &Context, table: Option<&Table>) -> Result<Option<GrantKey>, Refusal> {
    let text = match table {
        None => read_string(ctx, keys::GRANT_KEY_KEY.as_bytes())?,
        Some(table) => {
            node_wide_refused(ctx, keys::GRANT_KEY_KEY)?;
            if table.present {
                field(ctx, &table.key, keys::GRANT_FIELD)?
            } else {
                None
            }
        }
    };
    match text {
        None => Ok(None),
        Some(text) if text.is_empty() => Ok(None),
        Some(text) => one_key(&text).map(Some),
    }
}

/// Give a slot its (empty) table if it has none: called by the first
/// applied write or grant in a slot, so every slot holding state holds a
/// table, and by FENCE.RESTORE for every slot its node serves.
pub(crate) fn mark(ctx: &Context, table: &[u8]) -> Result<(), Refusal> {
    call(ctx, "HSETNX", &[table, keys::GRANT_FIELD.as_bytes(), b""])
}

/// In a cluster, a node-wide key (written as outside a cluster, e.g. by
/// `HSET fencecheck:signing-keys`) would hold for some slots only, or none
/// (Valkey 8 files it under its own slot): refuse rather than let it look
/// effective. An operator moves it into the slots with FENCE.KEYS.
fn node_wide_refused(ctx: &Context, name: &str) -> Result<(), Refusal> {
    if ffi::key_exists(ctx, name.as_bytes()) == Some(true) {
        return Err(Refusal::new(
            "INVALIDKEYS",
            format!(
                "{name} is a node-wide key, which a cluster does not read: set the keys with \
                 FENCE.KEYS on every master, then delete it (docs/redis.md)"
            ),
        ));
    }
    Ok(())
}

fn not_a_hash(key: &[u8], e: &str) -> Refusal {
    Refusal::new(
        "INVALIDKEYS",
        format!("{}: {e}", String::from_utf8_lossy(key)),
    )
}

/// One hash field's bytes, `None` when the field or the key is absent.
fn field(ctx: &Context, hash: &[u8], name: &str) -> Result<Option<Vec<u8>>, Refusal> {
    let key = ctx.open_key(&RedisString::create_from_slice(ctx.get_raw(), hash));
    match key.key_type() {
        redis_module::KeyType::Empty => Ok(None),
        redis_module::KeyType::Hash => key
            .hash_get(name)
            .map(|v| v.map(|s| s.as_slice().to_vec()))
            .map_err(|e| Refusal::new("FENCERUNTIME", e)),
        _ => Err(not_a_hash(hash, "not a hash")),
    }
}

/// Every field and value of a hash (HGETALL), in the server's order.
/// A hash's fields and values, in the server's order.
type Entries = Vec<(Vec<u8>, Vec<u8>)>;

fn hash_entries(ctx: &Context, hash: &[u8]) -> Result<Entries, Refusal> {
    let all: CallResult = ctx.call_ext(
        "HGETALL",
        &CallOptionsBuilder::new().errors_as_replies().build(),
        &[hash],
    );
    let Ok(CallReply::Array(items)) = all else {
        return Err(Refusal::new("FENCERUNTIME", "reading the signing keys"));
    };
    let flat: Vec<Vec<u8>> = items
        .iter()
        .map(|item| match item {
            Ok(CallReply::String(s)) => s.as_bytes().to_vec(),
            _ => Vec::new(),
        })
        .collect();
    Ok(flat
        .chunks(2)
        .filter_map(|pair| match pair {
            [f, v] => Some((f.clone(), v.clone())),
            _ => None,
        })
        .collect())
}

/// A write command through RM_Call, replicated; its error as a refusal.
fn call(ctx: &Context, command: &str, args: &[&[u8]]) -> Result<(), Refusal> {
    let result: CallResult = ctx.call_ext(command, &replicated(), args);
    match result {
        Ok(_) => Ok(()),
        Err(e) => Err(Refusal::new("FENCERUNTIME", format!("{command}: {e}"))),
    }
}

fn one_key(text: &[u8]) -> Result<GrantKey, Refusal> {
    let text = std::str::from_utf8(text)
        .map_err(|_| Refusal::new("INVALIDKEYS", "the grant key is not text"))?;
    text.parse::<KeysText>()
        .and_then(|k| k.signing_key())
        .map_err(|_| Refusal::new("INVALIDKEYS", "the grant key is not one ID:HEX"))
}

/// A key the component accepts for signing and checking: it signs a token
/// with it (the component's own rules on secret lengths, one copy of them).
fn usable(key: &GrantKey) -> Result<(), Refusal> {
    let token = rules::token(b"1.1")?.token;
    with_guest(|g| g.sign("fencecheck:keys", token, "check", key))?
        .map(|_| ())
        .map_err(|e| Refusal::new("INVALIDKEYS", format!("key {}: {e}", key.key_id)))
}

/// What FENCE.KEYS changes.
enum Change<'a> {
    /// Scopes starting with the prefix require tokens signed by one of
    /// these keys (the set's text, checked).
    Require(&'a [u8], &'a [u8]),
    /// They no longer do.
    Drop(&'a [u8]),
    /// FENCE.ACQUIRE signs with this key (`ID:HEX`), or not at all.
    Grant(Option<&'a [u8]>),
}

/// `FENCE.KEYS REQUIRE prefix ID:HEX[,…] | DROP prefix | GRANT ID:HEX|OFF |
/// LIST`: sets the signing keys, where the commands read them (node-wide,
/// or in a cluster in every slot this node serves), each key checked
/// first; a bad key changes nothing. LIST shows key ids, never secrets.
pub(crate) fn fence_keys(ctx: &Context, args: &[RedisString]) -> Result<RedisValue, Refusal> {
    arity(args, 2)?;
    let a = bytes(args);
    let usage = || {
        Refusal::syntax(
            "usage: FENCE.KEYS REQUIRE prefix ID:HEX[,...] | DROP prefix | GRANT ID:HEX|OFF | LIST",
        )
    };
    let change = match (a[1].to_ascii_uppercase().as_slice(), &a[2..]) {
        (b"REQUIRE", [prefix, set]) => {
            prefix_allowed(prefix)?;
            let keys = rules::key_set(set)?;
            if keys.is_empty() {
                return Err(Refusal::new("INVALIDKEYS", "no-keys"));
            }
            keys.iter().try_for_each(usable)?;
            Change::Require(prefix, set)
        }
        (b"DROP", [prefix]) => {
            prefix_allowed(prefix)?;
            Change::Drop(prefix)
        }
        (b"GRANT", [key]) if key.eq_ignore_ascii_case(b"OFF") => Change::Grant(None),
        (b"GRANT", [key]) => {
            usable(&one_key(key)?)?;
            Change::Grant(Some(key))
        }
        (b"LIST", []) => return list(ctx),
        _ => return Err(usage()),
    };
    let written = apply(ctx, &change)?;
    Ok(RedisValue::Array(vec![
        RedisValue::SimpleStringStatic("updated"),
        RedisValue::Integer(i64::try_from(written).unwrap_or(i64::MAX)),
    ]))
}

fn prefix_allowed(prefix: &[u8]) -> Result<(), Refusal> {
    if keys::reserved(prefix) {
        return Err(Refusal::syntax(
            "scopes starting with fencecheck: belong to the module; no prefix of them can match",
        ));
    }
    if prefix.len() > fencecheck::MAX_SCOPE_BYTES {
        return Err(Refusal::syntax(format!(
            "a prefix longer than a scope may be ({} bytes) can match no scope",
            fencecheck::MAX_SCOPE_BYTES
        )));
    }
    Ok(())
}

/// The node's slots when it is a cluster node, refusing where a per-slot
/// write would go astray; `None` outside a cluster.
fn cluster_slots(ctx: &Context) -> Result<Option<Vec<u16>>, Refusal> {
    let flags = ctx.get_flags();
    if !flags.contains(ContextFlags::CLUSTER) {
        return Ok(None);
    }
    // Inside MULTI or a script Valkey 8 files every key under the
    // transaction's slot: the other slots' tables would go astray.
    if flags.contains(ContextFlags::MULTI) || flags.contains(ContextFlags::LUA) {
        return Err(Refusal::syntax(
            "in a cluster FENCE.KEYS runs on its own, not in MULTI or a script",
        ));
    }
    served_slots(ctx).map(Some)
}

/// Write `change` where the commands read it; the number of copies written.
fn apply(ctx: &Context, change: &Change) -> Result<usize, Refusal> {
    let Some(slots) = cluster_slots(ctx)? else {
        let hash = keys::SIGNING_KEYS_KEY.as_bytes();
        match change {
            Change::Require(prefix, set) => call(ctx, "HSET", &[hash, prefix, set])?,
            Change::Drop(prefix) => call(ctx, "HDEL", &[hash, prefix])?,
            Change::Grant(Some(key)) => store(ctx, keys::GRANT_KEY_KEY.as_bytes(), key)?,
            Change::Grant(None) => call(ctx, "DEL", &[keys::GRANT_KEY_KEY.as_bytes()])?,
        }
        return Ok(1);
    };
    for &slot in &slots {
        let table = keys::slot_signing_key(slot);
        let grant = keys::GRANT_FIELD.as_bytes();
        match change {
            Change::Require(prefix, set) => {
                mark(ctx, &table)?;
                call(ctx, "HSET", &[&table, prefix, set])?;
            }
            Change::Drop(prefix) => {
                mark(ctx, &table)?;
                call(ctx, "HDEL", &[&table, prefix])?;
            }
            Change::Grant(key) => call(ctx, "HSET", &[&table, grant, key.unwrap_or_default()])?,
        }
    }
    Ok(slots.len())
}

/// One table's contents as shown: grant key id, then each prefix with its
/// key ids, sorted so two tables compare by value.
type Shown = (Option<u32>, Vec<(Vec<u8>, Vec<u32>)>);

fn shown(grant: Option<Vec<u8>>, entries: Entries) -> Result<Shown, Refusal> {
    let grant = match grant {
        Some(text) if !text.is_empty() => Some(one_key(&text)?.key_id),
        _ => None,
    };
    let mut prefixes = Vec::new();
    for (prefix, set) in entries {
        if keys::reserved(&prefix) {
            continue;
        }
        let ids = rules::key_set(&set)?.iter().map(|k| k.key_id).collect();
        prefixes.push((prefix, ids));
    }
    prefixes.sort();
    Ok((grant, prefixes))
}

/// `FENCE.KEYS LIST`: `grant` (the key id, or nil), `require` (prefix, key
/// ids), `slots` (the tables read: the node's slots in a cluster, else 1)
/// and `unlike` (how many of them differ from the first, or lack a table):
/// after a failover or a move, `unlike 0` on every master is the check
/// that the cluster holds one configuration.
fn list(ctx: &Context) -> Result<RedisValue, Refusal> {
    let (first, slots, unlike) = match cluster_slots(ctx)? {
        None => {
            let grant = read_string(ctx, keys::GRANT_KEY_KEY.as_bytes())?;
            let hash = keys::SIGNING_KEYS_KEY.as_bytes();
            let entries = match ffi::hash_length(ctx, hash).map_err(|e| not_a_hash(hash, &e))? {
                None => Vec::new(),
                Some(_) => hash_entries(ctx, hash)?,
            };
            (shown(grant, entries)?, 1, 0)
        }
        Some(slots) => {
            let mut first: Option<Option<Shown>> = None;
            let mut unlike = 0usize;
            for &slot in &slots {
                let table = keys::slot_signing_key(slot);
                let this =
                    match ffi::hash_length(ctx, &table).map_err(|e| not_a_hash(&table, &e))? {
                        None => None,
                        Some(_) => Some(shown(
                            field(ctx, &table, keys::GRANT_FIELD)?,
                            hash_entries(ctx, &table)?,
                        )?),
                    };
                match &first {
                    None => first = Some(this),
                    Some(f) if *f != this || this.is_none() => unlike += 1,
                    Some(_) => {}
                }
            }
            let first = first.flatten();
            // The first slot lacking a table counts as unlike, too.
            let unlike = if first.is_none() && !slots.is_empty() {
                unlike + 1
            } else {
                unlike
            };
            (first.unwrap_or_default(), slots.len(), unlike)
        }
    };
    let (grant, prefixes) = first;
    let count = |n: usize| RedisValue::Integer(i64::try_from(n).unwrap_or(i64::MAX));
    Ok(RedisValue::Array(vec![
        RedisValue::SimpleStringStatic("grant"),
        grant.map_or(RedisValue::Null, |id| RedisValue::Integer(i64::from(id))),
        RedisValue::SimpleStringStatic("require"),
        RedisValue::Array(
            prefixes
                .into_iter()
                .map(|(prefix, ids)| {
                    RedisValue::Array(vec![
                        RedisValue::StringBuffer(prefix),
                        RedisValue::Array(
                            ids.into_iter()
                                .map(|id| RedisValue::Integer(i64::from(id)))
                                .collect(),
                        ),
                    ])
                })
                .collect(),
        ),
        RedisValue::SimpleStringStatic("slots"),
        count(slots),
        RedisValue::SimpleStringStatic("unlike"),
        count(unlike),
    ]))
}
