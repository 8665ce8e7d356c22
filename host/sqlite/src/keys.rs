//! Which scopes require signed tokens, and with which keys: the
//! `fencecheck_keys` table of the shared layout (`schema.sql`), read with the
//! one query every host runs (`keys.sql`).

use fencecheck::{GrantKey, MAX_SCOPE_BYTES, check_keys};
use rusqlite::{Connection, Transaction, TransactionBehavior, params};

use crate::Error;
use crate::error::sql;

/// The keys of the longest prefix that starts a scope (host/sqlite/keys.sql).
const SCOPE_KEYS: &str = include_str!("../keys.sql");

/// The keys `scope` requires its tokens to be signed with: those of the
/// longest configured prefix that starts it; `None` if no prefix does (the
/// scope takes unsigned tokens). Fenced writes read this inside their
/// transaction; it is public for tools and tests.
pub fn scope_keys(conn: &Connection, scope: &str) -> Result<Option<Vec<GrantKey>>, Error> {
    let keys = conn
        .prepare_cached(SCOPE_KEYS)
        .and_then(|mut s| {
            s.query_map([scope], |r| {
                Ok(GrantKey {
                    key_id: r.get(0)?,
                    secret: r.get(1)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql("reading the scope's signing keys"))?;
    Ok((!keys.is_empty()).then_some(keys))
}

/// Require signed tokens on every scope that starts with `scope_prefix`
/// (`""`: every scope), verified with `keys`, replacing the prefix's keys if
/// it had any. The longest prefix that starts a scope decides, so a longer
/// prefix can give a part of a namespace keys of its own.
///
/// `keys` must be a usable set ([`check_keys`]); else [`Error::Invalid`] and
/// nothing changes. One `BEGIN IMMEDIATE` transaction: writes that begin
/// after it commits require the new keys. To rotate: set `{old, new}`, move
/// the authority to `new`, and once no token signed by `old` can still be
/// held (the longest lease), set `{new}`.
pub fn set_keys(conn: &Connection, scope_prefix: &str, keys: &[GrantKey]) -> Result<(), Error> {
    check_prefix(scope_prefix)?;
    check_keys(keys).map_err(|problem| Error::Invalid {
        what: "key set",
        why: problem.name().into(),
    })?;
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
        .map_err(sql("beginning the key change"))?;
    tx.execute(
        "DELETE FROM fencecheck_keys WHERE scope_prefix = ?1",
        [scope_prefix],
    )
    .map_err(sql("replacing the prefix's keys"))?;
    for key in keys {
        tx.execute(
            "INSERT INTO fencecheck_keys (scope_prefix, key_id, secret) VALUES (?1, ?2, ?3)",
            params![scope_prefix, key.key_id, key.secret],
        )
        .map_err(sql("storing a signing key"))?;
    }
    tx.commit().map_err(sql("committing the key change"))
}

/// Stop requiring signed tokens under `scope_prefix` (scopes it decided for
/// fall to the next shorter prefix, or take unsigned tokens). Returns whether
/// the prefix had keys.
pub fn remove_keys(conn: &Connection, scope_prefix: &str) -> Result<bool, Error> {
    let removed = conn
        .execute(
            "DELETE FROM fencecheck_keys WHERE scope_prefix = ?1",
            [scope_prefix],
        )
        .map_err(sql("removing the prefix's keys"))?;
    Ok(removed > 0)
}

/// Every configured prefix with its key ids (never the secrets), by prefix.
pub fn key_prefixes(conn: &Connection) -> Result<Vec<(String, Vec<u32>)>, Error> {
    let rows = conn
        .prepare_cached(
            "SELECT scope_prefix, key_id FROM fencecheck_keys ORDER BY scope_prefix, key_id",
        )
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(sql("listing the signing keys"))?;
    let mut out: Vec<(String, Vec<u32>)> = Vec::new();
    for (prefix, id) in rows {
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
