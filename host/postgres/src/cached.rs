//! The fenced write in one round trip when the writer's cached state is
//! current: the normal case, one lease holder writing its scope.
//!
//! [`fenced_write`](crate::fenced_write) must read the state before it can
//! decide (BEGIN, the locking read, the state write, the mutation, COMMIT).
//! A writer that made the scope's last write already knows that state, so
//! [`fenced_execute`] decides against its cached copy first and sends one
//! autocommit statement that stores the new state only if the stored one is
//! still the cached one, and runs the caller's mutation with it:
//!
//! ```sql
//! WITH fencecheck_accepted AS (SELECT v AS version),   -- the caller's statement may read it
//!      fencecheck_cas AS (UPDATE fencecheck_scopes SET fence_state = new, version = v
//!                          WHERE scope = s AND fence_state = cached AND <no signing keys>
//!                          RETURNING 1),
//!      fencecheck_guard AS (INSERT INTO fencecheck_scopes SELECT NULL, NULL, NULL
//!                            WHERE 1 / (SELECT count(*) FROM fencecheck_cas) = 0)
//! <the caller's statement>
//! ```
//!
//! One statement is one transaction: when the compare matched no row (another
//! writer moved the state, the scope gained signing keys, or its row is
//! gone), the guard divides by zero and the whole statement, mutation
//! included, rolls back; the write then goes the locking way, which decides
//! against what is really stored. So the cache only ever saves round trips:
//! a decision it made is kept only if the stored state was the one it was
//! made against, which is exactly the decision the locking path would make
//! (the check is a pure function of state and request). Under READ
//! COMMITTED a concurrent committed write is seen by the UPDATE's re-check
//! of its row; under REPEATABLE READ it is a serialization failure.

use std::collections::HashMap;

use fencecheck::{Accepted, Checker, Fenced, Request, accept_signed};
use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, Statement};

use crate::Error;
use crate::error::rolled_back;
use crate::fence::{run_keeping_state, stored_version};

/// Scopes a [`StateCache`] remembers; past it, one is forgotten per new one
/// (a forgotten scope costs its next write the locking path, nothing else).
const MAX_SCOPES: usize = 4096;

/// Prepared statements a [`StateCache`] keeps; past it, all are dropped.
const MAX_STATEMENTS: usize = 256;

// The parameters after the caller's: $n+1 the accepted write's version
// (what `fencecheck_accepted` shows the caller's statement), then for the
// compare-and-set $n+2 the new state, $n+3 the scope, $n+4 the cached
// state. Types are spelled out so the caller's statement decides nothing
// about them.
fn prefix(n: usize, compare: bool) -> String {
    let version = n + 1;
    let accepted = format!("fencecheck_accepted AS (SELECT ${version}::int8 AS version)");
    if !compare {
        return accepted;
    }
    let (new, scope, cached) = (n + 2, n + 3, n + 4);
    format!(
        "{accepted}, \
         fencecheck_cas AS (UPDATE fencecheck_scopes SET fence_state = ${new}::bytea, version = ${version}::int8 \
         WHERE scope = ${scope}::text AND fence_state = ${cached}::bytea \
         AND NOT EXISTS (SELECT 1 FROM fencecheck_keys WHERE starts_with(${scope}::text, scope_prefix)) \
         RETURNING 1), \
         fencecheck_guard AS (INSERT INTO fencecheck_scopes (scope, fence_state, version) \
         SELECT NULL, NULL, NULL WHERE 1 / (SELECT count(*)::int4 FROM fencecheck_cas) = 0)"
    )
}

/// `sql` with the fence's parts in front (the compare-and-set only if
/// `compare`).
fn wrap(sql: &str, params: usize, compare: bool) -> String {
    with_first(&prefix(params, compare), sql)
}

/// `sql` with the common table expressions `ours` in front: a leading
/// `WITH` (or `WITH RECURSIVE`) of the caller's own is extended rather than
/// nested.
fn with_first(ours: &str, sql: &str) -> String {
    let body = sql.trim_start();
    let word = |s: &str, w: &str| {
        s.get(..w.len()).is_some_and(|p| p.eq_ignore_ascii_case(w))
            && s[w.len()..].starts_with(|c: char| c.is_whitespace())
    };
    if word(body, "with") {
        let rest = body[4..].trim_start();
        if word(rest, "recursive") {
            let rest = rest[9..].trim_start();
            return format!("WITH RECURSIVE {ours}, {rest}");
        }
        return format!("WITH {ours}, {rest}");
    }
    format!("WITH {ours} {body}")
}

/// What one writer knows: for each scope it wrote, the fence state its last
/// write stored there, and the statements [`fenced_execute`] prepared.
///
/// One cache per connection (its prepared statements live on that
/// connection) and per writer; make a new one after reconnecting. A cache
/// that is out of date costs a round trip, never a wrong decision.
#[derive(Debug, Default)]
pub struct StateCache {
    states: HashMap<String, Vec<u8>>,
    // By the caller's SQL: with the compare-and-set, and without (the
    // locking path's).
    one_statement: HashMap<String, Statement>,
    locking: HashMap<String, Statement>,
    stats: CacheStats,
}

/// How a [`StateCache`]'s writes went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Writes decided on the cached state and stored in one round trip.
    pub one_round_trip: u64,
    /// Writes whose one statement was rolled back and that took the
    /// locking path: the cached state was out of date (another writer moved
    /// it, or signing keys appeared), or the statement failed on its own
    /// (the locking path then reports that failure).
    pub stale: u64,
    /// Writes with no cached state (a scope's first write from this cache,
    /// or a rejection on the cached state) that took the locking path.
    pub uncached: u64,
}

impl StateCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forget `scope`'s state: its next write takes the locking path.
    pub fn forget(&mut self, scope: &str) {
        self.states.remove(scope);
    }

    /// How the writes through this cache went so far.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    fn remember(&mut self, scope: &str, state: Vec<u8>) {
        if self.states.len() >= MAX_SCOPES
            && !self.states.contains_key(scope)
            && let Some(victim) = self.states.keys().next().cloned()
        {
            self.states.remove(&victim);
        }
        self.states.insert(scope.to_owned(), state);
    }

    fn statement(
        &mut self,
        client: &mut Client,
        sql: &str,
        params: usize,
        compare: bool,
    ) -> Result<Statement, Error> {
        let map = if compare {
            &mut self.one_statement
        } else {
            &mut self.locking
        };
        if let Some(statement) = map.get(sql) {
            return Ok(statement.clone());
        }
        if map.len() >= MAX_STATEMENTS {
            map.clear();
        }
        let prepare = |client: &mut Client, text: &str| {
            client.prepare(text).map_err(|source| Error::Postgres {
                doing: "preparing the fenced statement",
                source,
            })
        };
        // The caller's statement alone (with a parameterless
        // `fencecheck_accepted`) must declare exactly its parameters: a `$n`
        // past them would silently be one of ours. Once per statement.
        let alone = prepare(
            client,
            &with_first("fencecheck_accepted AS (SELECT NULL::int8 AS version)", sql),
        )?;
        if alone.params().len() != params {
            return Err(Error::Invalid {
                what: "fenced statement",
                why: format!(
                    "it uses {} parameters, {params} were given",
                    alone.params().len()
                ),
            });
        }
        let statement = prepare(client, &wrap(sql, params, compare))?;
        map.insert(sql.to_owned(), statement.clone());
        Ok(statement)
    }

    fn forget_statements(&mut self) {
        self.one_statement.clear();
        self.locking.clear();
    }
}

/// What the one-statement attempt came to.
enum Attempt {
    Done(Fenced<u64>, Vec<u8>),
    /// Go the locking way (nothing was stored).
    Locking,
}

/// Run one statement under the fence, in one round trip when `cache` holds
/// the scope's current state, else as [`fenced_write`](crate::fenced_write)
/// does; returns the rows the statement affected.
///
/// `sql` is one statement with parameters `$1…$n` (`params`, exactly as
/// many), the protected mutation: an `INSERT`, `UPDATE` or `DELETE` (with
/// or without `RETURNING` or a `WITH` of its own). It may read the accepted
/// write's version as `(SELECT version FROM fencecheck_accepted)` (an
/// audit row's key, say). It must not touch `fencecheck_scopes`, and it
/// sees the database as it was before the fence's own write (PostgreSQL's
/// rule for a statement's `WITH` parts). The connection must not be inside
/// a transaction: the one-statement write is its own transaction, and so is
/// the locking one.
///
/// Outcomes and errors are those of [`fenced_write`](crate::fenced_write)
/// with the statement as its mutation: only a success is answered from the
/// one statement. A rejection on the cached state, or any failure of the
/// one statement that rolled it back, is decided again by the locking path
/// (so the statement's own failure is reported from there, as
/// [`Error::Mutation`]). A lost connection during the one statement is
/// [`Error::CommitUnknown`] (the statement was its own commit). A statement
/// whose parameters do not match `params` is [`Error::Invalid`] before
/// anything is decided.
pub fn fenced_execute<C>(
    client: &mut Client,
    checker: &mut C,
    cache: &mut StateCache,
    request: &Request,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Fenced<u64>, Error>
where
    C: Checker + ?Sized,
{
    let result = execute_unrecorded(client, checker, cache, request, sql, params);
    fencecheck::record_decision("execute", Some(request.token), &result);
    result
}

fn execute_unrecorded<C>(
    client: &mut Client,
    checker: &mut C,
    cache: &mut StateCache,
    request: &Request,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Fenced<u64>, Error>
where
    C: Checker + ?Sized,
{
    // Prepared (and checked) before any decision: both paths need it.
    let locking = cache.statement(client, sql, params.len(), false)?;
    if let Attempt::Done(fenced, state) =
        one_statement(client, checker, cache, request, sql, params)?
    {
        cache.stats.one_round_trip += 1;
        cache.remember(&request.scope, state);
        return Ok(fenced);
    }
    // Whatever the cache held may not be what is stored.
    cache.forget(&request.scope);
    let (fenced, state) =
        run_keeping_state(client, checker, request, |tx, accepted: &Accepted| {
            let version = stored_version(accepted.version)?;
            let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 1);
            all.extend_from_slice(params);
            all.push(&version);
            tx.execute(&locking, &all)
                .map_err(|e| Error::Mutation(Box::new(e)))
        })?;
    if let Some(state) = state {
        cache.remember(&request.scope, state);
    }
    Ok(fenced)
}

fn one_statement<C>(
    client: &mut Client,
    checker: &mut C,
    cache: &mut StateCache,
    request: &Request,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Attempt, Error>
where
    C: Checker + ?Sized,
{
    let Some(cached) = cache.states.get(&request.scope).cloned() else {
        cache.stats.uncached += 1;
        return Ok(Attempt::Locking);
    };
    // Cached scopes have no signing keys (the compare re-checks that).
    let Ok((decided, state)) = accept_signed(checker.decide(Some(&cached), request, None)?) else {
        // Only the stored state may reject: the locking path confirms it.
        cache.stats.uncached += 1;
        return Ok(Attempt::Locking);
    };
    let Ok(version) = stored_version(decided.version) else {
        // The locking path refuses it with its error.
        return Ok(Attempt::Locking);
    };
    let statement = cache.statement(client, sql, params.len(), true)?;
    let mut all: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(params.len() + 4);
    all.extend_from_slice(params);
    all.extend_from_slice(&[&version, &state, &request.scope, &cached]);
    match client.execute(&statement, &all) {
        Ok(rows) => Ok(Attempt::Done(
            Fenced::Applied {
                version: decided.version,
                highest: decided.highest,
                value: rows,
            },
            state,
        )),
        // Rolled back for certain. The guard (the stored state is not the
        // cached one) divides by zero, but the caller's statement runs first
        // and may fail first because the cache was stale (a key its
        // `fencecheck_accepted` version already has, say): only the locking
        // path can tell, so it decides, and reports the statement's own
        // failure if that recurs.
        Err(e) if rolled_back(&e) => {
            if e.code() == Some(&SqlState::INVALID_SQL_STATEMENT_NAME) {
                // The prepared statement is gone (DISCARD ALL, a pooler).
                cache.forget_statements();
            }
            cache.stats.stale += 1;
            Ok(Attempt::Locking)
        }
        // The driver refuses a parameter's value before sending anything.
        Err(source)
            if source
                .to_string()
                .starts_with("error serializing parameter") =>
        {
            Err(Error::Postgres {
                doing: "encoding the fenced statement's parameters",
                source,
            })
        }
        // No answer, or the session ended: the statement was its own
        // commit, which may have happened.
        Err(e) => Err(Error::CommitUnknown(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn a_leading_with_is_extended_not_nested() {
        let plain = wrap("UPDATE t SET a = $1", 1, true);
        assert!(plain.starts_with("WITH fencecheck_accepted AS (SELECT $2::int8"));
        assert!(plain.contains("$3::bytea") && plain.contains("$5::bytea"));
        assert!(plain.ends_with(") UPDATE t SET a = $1"));
        let with = wrap("  with x AS (SELECT 1) UPDATE t SET a = 1", 0, true);
        assert!(
            with.starts_with("WITH fencecheck_accepted AS (") && with.contains("fencecheck_cas")
        );
        assert!(with.ends_with("), x AS (SELECT 1) UPDATE t SET a = 1"));
        let recursive = wrap("WITH RECURSIVE r AS (SELECT 1) DELETE FROM t", 0, false);
        assert!(
            recursive.starts_with("WITH RECURSIVE fencecheck_accepted AS (")
                && !recursive.contains("fencecheck_cas")
        );
        assert!(recursive.ends_with("), r AS (SELECT 1) DELETE FROM t"));
        // A table named like the keyword is not a WITH clause.
        assert!(wrap("withdrawals", 0, false).ends_with(") withdrawals"));
        // Not a char boundary at 4 bytes: no panic.
        assert!(wrap("wité", 0, false).ends_with(") wité"));
    }
}
