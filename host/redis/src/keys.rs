//! Where the module keeps its state: key names derived from a scope or a
//! lock, always in the cluster slot of the name they are derived from.

/// Every key the module writes starts with this; FENCE.SET, FENCE.DEL and
/// FENCE.EXEC refuse to touch such keys as data, so no fenced path can
/// overwrite a mark.
pub const PREFIX: &[u8] = b"fencecheck:";

/// A server's authority id (lineage), decimal u64, made at the first
/// acquire. Outside a cluster only: see [`slot_lineage_key`].
pub const LINEAGE_KEY: &str = "fencecheck:lineage";

/// A server's epoch floor, decimal u64 (absent = 0), raised by
/// FENCE.RESTORE. Outside a cluster only: see [`slot_floor_key`].
pub const FLOOR_KEY: &str = "fencecheck:epoch-floor";

/// Signing keys of the scopes that require signed tokens: a hash from
/// scope prefix to key set text (`ID:HEX,…`).
pub const SIGNING_KEYS_KEY: &str = "fencecheck:signing-keys";

/// The authority's own signing key (`ID:HEX`), if grants are signed.
/// Outside a cluster only, as [`SIGNING_KEYS_KEY`]: see [`slot_signing_key`].
pub const GRANT_KEY_KEY: &str = "fencecheck:grant-key";

/// The field of a slot's signing table ([`slot_signing_key`]) that holds
/// the grant key (`ID:HEX`, or empty when grants are not signed). Present
/// in every table, so a table always exists once written; it can never
/// be a scope prefix (scopes starting with `fencecheck:` are refused).
pub const GRANT_FIELD: &str = match GRANT_FIELD_C.to_str() {
    Ok(name) => name,
    Err(_) => panic!("GRANT_FIELD_C is ASCII"),
};

/// [`GRANT_FIELD`] as the module API's C field name (no copy per call).
pub const GRANT_FIELD_C: &std::ffi::CStr = c"fencecheck:grant-key";

/// In a cluster, the lineage of the locks of `slot`: `fencecheck:lineage:{T}`
/// where `T` is the slot's tag ([`slot_tag`]), so the key is in that slot.
///
/// A cluster keeps no node-wide keys: Valkey 8 (per-slot keyspaces, as in
/// Redis 7.4+) files a key a command writes or reads under the command's
/// own slot, so a key of another slot is per slot anyway (and a slot
/// holding one cannot be handed over), and Redis 7.0 files it under a slot
/// the node may not serve. Kept
/// per slot, the lineage and the floor of a slot are read by the commands
/// on its locks and move with them (MIGRATE, replicas, RDB and AOF alike).
pub fn slot_lineage_key(slot: u16) -> Vec<u8> {
    slot_key(b"fencecheck:lineage:", slot)
}

/// In a cluster, the epoch floor of the locks of `slot`:
/// `fencecheck:epoch-floor:{T}` (see [`slot_lineage_key`]).
pub fn slot_floor_key(slot: u16) -> Vec<u8> {
    slot_key(b"fencecheck:epoch-floor:", slot)
}

/// In a cluster, the signing table of `slot`: `fencecheck:signing-keys:{T}`,
/// a hash holding [`GRANT_FIELD`] and, for each scope prefix that requires
/// signed tokens, prefix → key set (as [`SIGNING_KEYS_KEY`] holds them
/// outside a cluster). Kept per slot for the reasons of
/// [`slot_lineage_key`]: it moves with its slot's scopes and locks.
pub fn slot_signing_key(slot: u16) -> Vec<u8> {
    slot_key(b"fencecheck:signing-keys:", slot)
}

fn slot_key(kind: &[u8], slot: u16) -> Vec<u8> {
    let tag = slot_tag(slot);
    let mut key = Vec::with_capacity(kind.len() + tag.len() + 2);
    key.extend_from_slice(kind);
    key.push(b'{');
    key.extend_from_slice(tag.as_bytes());
    key.push(b'}');
    key
}

/// The smallest decimal number whose text hashes to `slot` (every slot has
/// one below 2^20; the table is made once, in milliseconds).
pub fn slot_tag(slot: u16) -> String {
    static TAGS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; 16384];
        let mut left = tags.len();
        let mut n: u32 = 0;
        while left > 0 && n < 1 << 20 {
            let s = usize::from(crc16(n.to_string().as_bytes()) % 16384);
            if tags[s] == u32::MAX {
                tags[s] = n;
                left -= 1;
            }
            n += 1;
        }
        tags
    });
    tags[usize::from(slot % 16384)].to_string()
}

/// A name the module cannot derive a key for in the name's own slot.
#[derive(Debug, PartialEq, Eq)]
pub struct NoSlotKey;

/// The hash tag Redis Cluster hashes for `name`: the bytes between the
/// first `{` and the first `}` after it, when non-empty; else `None` (the
/// whole name is hashed).
pub fn hash_tag(name: &[u8]) -> Option<&[u8]> {
    let open = name.iter().position(|&b| b == b'{')?;
    let rest = name.get(open + 1..)?;
    let close = rest.iter().position(|&b| b == b'}')?;
    match rest.get(..close) {
        Some(tag) if !tag.is_empty() => Some(tag),
        _ => None,
    }
}

/// The cluster slot of a key name (CRC16/XMODEM of its hash tag, mod 16384).
pub fn slot(name: &[u8]) -> u16 {
    let hashed = hash_tag(name).unwrap_or(name);
    crc16(hashed) % 16384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The key that holds `name`'s state, under `kind` (`b"fencecheck:"` for a
/// scope's fence state, `b"fencecheck:lease:"` for a lock's lease state):
///
/// - a name with no `}`: `<kind>{<name>}`; its hash tag is the whole name,
///   which is what Redis hashes for the name itself;
/// - a name with a hash tag `{T}`: `<kind>{T}:<name>`, the same tag;
/// - a name with a `}` but no hash tag (`a}b`, `{}x`): no key can share its
///   slot through a tag, so it is refused: give such names a hash tag.
///
/// The two forms never collide: only the second has bytes after the first
/// `}`.
pub fn state_key(kind: &[u8], name: &[u8]) -> Result<Vec<u8>, NoSlotKey> {
    let mut key = Vec::with_capacity(kind.len() + name.len() + 3);
    key.extend_from_slice(kind);
    if !name.contains(&b'}') {
        key.push(b'{');
        key.extend_from_slice(name);
        key.push(b'}');
    } else if let Some(tag) = hash_tag(name) {
        key.push(b'{');
        key.extend_from_slice(tag);
        key.extend_from_slice(b"}:");
        key.extend_from_slice(name);
    } else {
        return Err(NoSlotKey);
    }
    Ok(key)
}

/// The fence state key of a scope.
pub fn fence_key(scope: &[u8]) -> Result<Vec<u8>, NoSlotKey> {
    state_key(PREFIX, scope)
}

/// The lease state key of a lock.
pub fn lease_key(lock: &[u8]) -> Result<Vec<u8>, NoSlotKey> {
    state_key(b"fencecheck:lease:", lock)
}

/// Whether `key` is in the module's namespace (never a data key).
pub fn reserved(key: &[u8]) -> bool {
    key.starts_with(PREFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference values Redis documents for its key hash slot.
    #[test]
    fn slots_match_redis() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
    }

    /// Every derived key is in its name's slot, for names with and without
    /// tags, braces, and arbitrary bytes; names that cannot be are refused.
    #[test]
    fn derived_keys_share_the_slot() {
        let names: [&[u8]; 12] = [
            b"report/july",
            b"{user1}:profile",
            b"a{b}",
            b"a{b",
            b"{",
            b"x{{y}}",
            b"\xff\x00\r\n",
            b"{a}{b}",
            b"fencecheck:{x}",
            b"}{a}",
            b"a}{b}",
            b"z",
        ];
        for name in names {
            for key in [fence_key(name), lease_key(name)] {
                match key {
                    Ok(key) => assert_eq!(slot(&key), slot(name), "{name:?} -> {key:?}"),
                    Err(NoSlotKey) => panic!("{name:?} refused"),
                }
            }
        }
        assert_eq!(fence_key(b"a}b"), Err(NoSlotKey));
        assert_eq!(fence_key(b"{}x"), Err(NoSlotKey));
        assert_eq!(
            fence_key(b"report/july").ok(),
            Some(b"fencecheck:{report/july}".to_vec())
        );
        assert_eq!(
            fence_key(b"{u1}:p").ok(),
            Some(b"fencecheck:{u1}:{u1}:p".to_vec())
        );
    }

    /// A brute force over short names from a small alphabet: no two scopes
    /// share a state key, and fence and lease keys never meet.
    #[test]
    fn derived_keys_are_distinct() {
        let alphabet: [u8; 4] = [b'a', b'{', b'}', b':'];
        let mut names: Vec<Vec<u8>> = vec![Vec::new()];
        let mut all = Vec::new();
        for _ in 0..5 {
            let mut next = Vec::new();
            for n in &names {
                for &c in &alphabet {
                    let mut m = n.clone();
                    m.push(c);
                    next.push(m);
                }
            }
            all.extend(next.iter().cloned());
            names = next;
        }
        let mut seen = std::collections::HashMap::new();
        for name in &all {
            for key in [fence_key(name), lease_key(name)].into_iter().flatten() {
                assert_eq!(slot(&key), slot(name));
                if let Some(other) = seen.insert(key.clone(), name.clone()) {
                    assert_eq!(&other, name, "{key:?} shared");
                }
            }
        }
    }

    /// Every slot has a tag, and the per-slot keys are in their slot and
    /// never meet a scope's or a lock's state key.
    #[test]
    fn slot_keys_are_in_their_slot() {
        for s in 0..16384u16 {
            let tag = slot_tag(s);
            assert_ne!(tag, u32::MAX.to_string(), "slot {s} has no tag");
            for key in [slot_lineage_key(s), slot_floor_key(s), slot_signing_key(s)] {
                assert_eq!(slot(&key), s, "{key:?}");
                assert!(reserved(&key));
                assert!(
                    !key.starts_with(b"fencecheck:{") && !key.starts_with(b"fencecheck:lease:")
                );
            }
        }
        assert_eq!(
            slot_lineage_key(slot(b"0")),
            b"fencecheck:lineage:{0}".to_vec()
        );
    }

    /// The module's namespace, byte for byte (Redis keys are case-sensitive).
    #[test]
    fn reserved_prefix() {
        assert!(reserved(b"fencecheck:{x}"));
        assert!(reserved(b"fencecheck:"));
        assert!(!reserved(b"Fencecheck:{x}"));
        assert!(!reserved(b"fencecheck"));
        assert!(!reserved(b"report/july"));
    }
}
