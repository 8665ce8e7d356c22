//! Which scopes require signed tokens, and with which keys: the
//! `fencecheck_keys` table of the layout (`schema.sql`), read with the one
//! query every host runs (`keys.sql`).

use fencecheck::{GrantKey, MAX_SCOPE_BYTES, check_keys};
use postgres::GenericClient;

use crate::Error;
use crate::error::pg;

/// The keys of the longest prefix that starts a scope (host/postgres/keys.sql).
const SCOPE_KEYS: &str = include_str!("../keys.sql");

/// Key changes wait for fenced writes in flight and block new ones until
/// they commit (see schema.sql): EXCLUSIVE conflicts with the ROW SHARE a
/// locking read holds, not with plain reads.
const LOCK_WRITERS: &str = "LOCK TABLE fencecheck_scopes IN EXCLUSIVE MODE";

/// The keys `scope` requires its tokens to be signed with: those of the
/// longest configured prefix that starts it; `None` if no prefix does (the
/// scope takes unsigned tokens). Fenced writes read this inside their
/// transaction, after locking the scope's state.
pub fn scope_keys(
    client: &mut impl GenericClient,
    scope: &str,
) -> Result<Option<Vec<GrantKey>>, Error> {
    let rows = client
        .query(SCOPE_KEYS, &[&scope])
        .map_err(pg("reading the scope's signing keys"))?;
    let mut keys = Vec::with_capacity(rows.len());
    for row in rows {
        let id: i64 = row.get(0);
        // The table's CHECK keeps ids in u32; a value outside it is refused.
        let key_id = u32::try_from(id).map_err(|_| Error::Invalid {
            what: "stored key id",
            why: format!("{id} is not a u32"),
        })?;
        keys.push(GrantKey {
            key_id,
            secret: row.get(1),
        });
    }
    Ok((!keys.is_empty()).then_some(keys))
}

/// Require signed tokens on every scope that starts with `scope_prefix`
/// (`""`: every scope), verified with `keys`, replacing the prefix's keys if
/// it had any; the longest prefix that starts a scope decides. `keys` must
/// be a usable set ([`check_keys`]), else [`Error::Invalid`] and nothing
/// changes. One transaction, which waits for fenced writes in flight: every
/// write that commits after it decides with the new keys. To rotate: set
/// `{old, new}`, move the authority to `new`, then set `{new}` once no token
/// signed by `old` can still be held.
pub fn set_keys(
    client: &mut postgres::Client,
    scope_prefix: &str,
    keys: &[GrantKey],
) -> Result<(), Error> {
    check_prefix(scope_prefix)?;
    check_keys(keys).map_err(|problem| Error::Invalid {
        what: "key set",
        why: problem.name().into(),
    })?;
    let mut tx = client
        .transaction()
        .map_err(pg("beginning the key change"))?;
    tx.batch_execute(LOCK_WRITERS)
        .map_err(pg("waiting for fenced writes in flight"))?;
    tx.execute(
        "DELETE FROM fencecheck_keys WHERE scope_prefix = $1",
        &[&scope_prefix],
    )
    .map_err(pg("replacing the prefix's keys"))?;
    for key in keys {
        tx.execute(
            "INSERT INTO fencecheck_keys (scope_prefix, key_id, secret) VALUES ($1, $2, $3)",
            &[&scope_prefix, &i64::from(key.key_id), &key.secret],
        )
        .map_err(pg("storing a signing key"))?;
    }
    tx.commit().map_err(pg("committing the key change"))
}

/// Stop requiring signed tokens under `scope_prefix`; returns whether it had
/// keys. Ordered against fenced writes as [`set_keys`].
pub fn remove_keys(client: &mut postgres::Client, scope_prefix: &str) -> Result<bool, Error> {
    let mut tx = client
        .transaction()
        .map_err(pg("beginning the key change"))?;
    tx.batch_execute(LOCK_WRITERS)
        .map_err(pg("waiting for fenced writes in flight"))?;
    let removed = tx
        .execute(
            "DELETE FROM fencecheck_keys WHERE scope_prefix = $1",
            &[&scope_prefix],
        )
        .map_err(pg("removing the prefix's keys"))?;
    tx.commit().map_err(pg("committing the key change"))?;
    Ok(removed > 0)
}

/// Every configured prefix with its key ids (never the secrets), by prefix.
pub fn key_prefixes(client: &mut impl GenericClient) -> Result<Vec<(String, Vec<u32>)>, Error> {
    let rows = client
        .query(
            "SELECT scope_prefix, key_id FROM fencecheck_keys ORDER BY scope_prefix, key_id",
            &[],
        )
        .map_err(pg("listing the signing keys"))?;
    let mut out: Vec<(String, Vec<u32>)> = Vec::new();
    for row in rows {
        let prefix: String = row.get(0);
        let id = u32::try_from(row.get::<_, i64>(1)).unwrap_or(u32::MAX);
        match out.last_mut() {
            Some((last, ids)) if *last == prefix => ids.push(id),
            _ => out.push((prefix, vec![id])),
        }
    }
    Ok(out)
}

fn check_prefix(prefix: &str) -> Result<(), Error> {
    if prefix.len() > MAX_SCOPE_BYTES {
        return Err(Error::Invalid {
            what: "scope prefix",
            why: format!(
                "{} bytes; a scope has at most {MAX_SCOPE_BYTES}",
                prefix.len()
            ),
        });
    }
    Ok(())
}
