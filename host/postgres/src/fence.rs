//! The fenced transaction: lock the scope's state → check → store the new
//! state → the caller's mutation → commit, in one transaction.

use fencecheck::{Accepted, Checker, Fenced, Request, accept_signed};
use postgres::types::Type;
use postgres::{Client, Transaction};

use crate::Error;
use crate::error::{pg, rolled_back};

// The state, locked, and whether any key prefix starts the scope, in one
// round trip: an existing unkeyed scope, the common case, costs no second
// statement. (FOR UPDATE locks only the scope's row, not the keys.)
const LOCK_STATE: &str = "SELECT fence_state, \
    EXISTS (SELECT 1 FROM fencecheck_keys WHERE starts_with($1, scope_prefix)) \
    FROM fencecheck_scopes WHERE scope = $1 FOR UPDATE";

// ON CONFLICT DO NOTHING: when two writers create one scope at once, the
// second waits for the first to commit, inserts nothing, and decides again
// against the state the first stored.
const INSERT_STATE: &str = "INSERT INTO fencecheck_scopes (scope, fence_state, version) \
     VALUES ($1, $2, $3) ON CONFLICT (scope) DO NOTHING RETURNING 1";

const UPDATE_STATE: &str =
    "UPDATE fencecheck_scopes SET fence_state = $2, version = $3 WHERE scope = $1";

/// The scope's stored fence state, or `None` if it never accepted a token.
pub fn stored_state(client: &mut Client, scope: &str) -> Result<Option<Vec<u8>>, Error> {
    client
        .query_opt(
            "SELECT fence_state FROM fencecheck_scopes WHERE scope = $1",
            &[&scope],
        )
        .map(|row| row.map(|r| r.get(0)))
        .map_err(pg("reading the fence state"))
}

/// Run `mutation` under the fence in one transaction (at the session's
/// isolation level): lock the scope's row, read its signing keys if it
/// requires signed tokens ([`crate::set_keys`]), check `request`, and only on
/// `applied` store the new state and run the mutation, then commit. On a
/// rejection or any error the transaction rolls back and nothing changes.
///
/// - READ COMMITTED (PostgreSQL's default): concurrent writers of one scope
///   queue on its row lock; each decides against the state the previous
///   one committed, including two writers creating a new scope at once.
/// - REPEATABLE READ / SERIALIZABLE: a concurrent write the snapshot cannot
///   see fails with a serialization error instead ([`Error::is_retryable`]);
///   never a stale result.
///
/// The mutation receives the open transaction (do every write of the
/// protected operation through it) and what the fence accepted. It must not
/// end the transaction itself (no `COMMIT` through `batch_execute`).
pub fn fenced_write<C, T, E>(
    client: &mut Client,
    checker: &mut C,
    request: &Request,
    mutation: impl FnOnce(&mut Transaction<'_>, &Accepted) -> Result<T, E>,
) -> Result<Fenced<T>, Error>
where
    C: Checker + ?Sized,
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    let result = run(client, checker, request, |tx, accepted| {
        mutation(tx, accepted).map_err(|e| Error::Mutation(e.into()))
    });
    fencecheck::record_decision("write", Some(request.token), &result);
    result
}

/// [`fenced_write`] for this crate's own mutations (the publish protocol),
/// whose failures are already this crate's [`Error`]s.
pub(crate) fn run<C, T>(
    client: &mut Client,
    checker: &mut C,
    request: &Request,
    mutation: impl FnOnce(&mut Transaction<'_>, &Accepted) -> Result<T, Error>,
) -> Result<Fenced<T>, Error>
where
    C: Checker + ?Sized,
{
    run_keeping_state(client, checker, request, mutation).map(|(fenced, _)| fenced)
}

/// [`run`], also returning the scope's stored state as the write left it
/// (the new state if it applied, the one it read if rejected) when the
/// scope has no signing keys: what a [`crate::StateCache`] may keep (a
/// keyed scope's decision depends on more than the state).
pub(crate) fn run_keeping_state<C, T>(
    client: &mut Client,
    checker: &mut C,
    request: &Request,
    mutation: impl FnOnce(&mut Transaction<'_>, &Accepted) -> Result<T, Error>,
) -> Result<(Fenced<T>, Option<Vec<u8>>), Error>
where
    C: Checker + ?Sized,
{
    let mut tx = client
        .transaction()
        .map_err(pg("beginning the fenced transaction"))?;
    // Two rounds at most: the second only after another writer created the
    // scope between this one's locking read (no row) and its insert.
    let mut accepted = None;
    for _ in 0..2 {
        // `query_typed`: parse, bind and execute in one round trip (the
        // driver would otherwise prepare every statement first, a second).
        let rows = tx
            .query_typed(LOCK_STATE, &[(&request.scope, Type::TEXT)])
            .map_err(pg("locking the fence state"))?;
        let (stored, keyed): (Option<Vec<u8>>, bool) = match rows.first() {
            Some(r) => (Some(r.get(0)), r.get(1)),
            // A new scope: no row to say it, so look the keys up.
            None => (None, true),
        };
        // After the row lock: a key change waits for this write (schema.sql).
        let keys = if keyed {
            crate::scope_keys(&mut tx, &request.scope)?
        } else {
            None
        };
        let outcome = checker.decide(stored.as_deref(), request, keys.as_deref())?;
        let (decided, state) = match accept_signed(outcome) {
            Ok(applied) => applied,
            // Dropping `tx` rolls back: a rejection changes nothing.
            // The state read under the row lock is still the stored one.
            Err(rejection) => {
                let current = if keys.is_none() { stored } else { None };
                return Ok((Fenced::Rejected(rejection), current));
            }
        };
        let version = stored_version(decided.version)?;
        let params: [(&(dyn postgres::types::ToSql + Sync), Type); 3] = [
            (&request.scope, Type::TEXT),
            (&state, Type::BYTEA),
            (&version, Type::INT8),
        ];
        if stored.is_some() {
            tx.query_typed(UPDATE_STATE, &params)
                .map_err(pg("storing the fence state"))?;
        } else if tx
            .query_typed(INSERT_STATE, &params)
            .map_err(pg("storing the first fence state"))?
            .is_empty()
        {
            continue;
        }
        accepted = Some((decided, keys.is_none().then_some(state)));
        break;
    }
    let (accepted, state) = accepted.ok_or_else(|| Error::Invalid {
        what: "scope row",
        why: "created and removed concurrently twice".into(),
    })?;
    let value = mutation(&mut tx, &accepted)?;
    commit(tx)?;
    let applied = Fenced::Applied {
        version: accepted.version,
        highest: accepted.highest,
        value,
    };
    Ok((applied, state))
}

/// Commit `tx`. A server error at commit (e.g. a serialization failure)
/// means it rolled back; no answer at all, or the session ending, means it
/// may have committed.
pub(crate) fn commit(tx: Transaction<'_>) -> Result<(), Error> {
    tx.commit().map_err(|e| {
        if rolled_back(&e) {
            Error::Postgres {
                doing: "committing",
                source: e,
            }
        } else {
            Error::CommitUnknown(e)
        }
    })
}

/// A version as PostgreSQL's bigint stores it; one beyond is refused.
pub(crate) fn stored_version(version: u64) -> Result<i64, Error> {
    i64::try_from(version).map_err(|_| Error::Invalid {
        what: "version",
        why: format!("{version} does not fit a PostgreSQL bigint"),
    })
}
