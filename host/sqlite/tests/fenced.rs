//! `fenced_write`: read state → check → store state and mutation, atomically.

use crate::common;

use std::cell::{Cell, RefCell};
use std::time::Duration;

use anyhow::{Result, ensure};
use common::{Db, rows, runtime, strict};
use fencecheck::{CheckError, Checker, Corruption, Decision, Native, Policy, Request, Token};
use fencecheck_sqlite::{Error, Fenced, Rejection, fenced_write, stored_state};
use rusqlite::Connection;
use rusqlite::trace::{TraceEvent, TraceEventCodes};

const SCOPE: &str = "report/july";

fn setup() -> Result<(Db, Connection)> {
    let db = Db::new()?;
    let conn = db.open()?;
    conn.execute_batch("CREATE TABLE ledger (scope TEXT, version INTEGER, note TEXT)")?;
    Ok((db, conn))
}

/// Appends to `ledger` under the fence and returns the new row count.
fn write(conn: &mut Connection, request: &Request, note: &str) -> Result<Fenced<i64>> {
    let mut guest = runtime()?.instance()?;
    Ok(fenced_write(conn, &mut guest, request, |tx, accepted| {
        tx.execute(
            "INSERT INTO ledger VALUES (?1, ?2, ?3)",
            rusqlite::params![request.scope, accepted.version as i64, note],
        )?;
        tx.query_row("SELECT count(*) FROM ledger", [], |r| r.get::<_, i64>(0))
    })?)
}

/// Everything a write could have touched, for "nothing changed" checks.
fn snapshot(conn: &Connection) -> Result<(Vec<String>, Vec<String>)> {
    Ok((
        rows(conn, "SELECT note FROM ledger ORDER BY rowid")?,
        rows(
            conn,
            "SELECT hex(fence_state) || version FROM fencecheck_scopes",
        )?,
    ))
}

/// An applied write commits the mutation and the new state together, and the
/// mutation sees what the fence accepted.
#[test]
fn applied_write_commits_mutation_and_state_together() -> Result<()> {
    let (_db, mut conn) = setup()?;
    let first = write(&mut conn, &strict(SCOPE, 41), "a")?;
    ensure!(
        first
            == Fenced::Applied {
                version: 1,
                highest: Token::new(0, 0, 41),
                value: 1
            },
        "{first:?}"
    );
    let second = write(&mut conn, &strict(SCOPE, 42), "b")?;
    ensure!(second.is_applied(), "{second:?}");
    ensure!(
        rows(&conn, "SELECT version FROM ledger ORDER BY rowid")? == ["Integer(1)", "Integer(2)"]
    );
    let state = stored_state(&conn, SCOPE)?.ok_or_else(|| anyhow::anyhow!("no state"))?;
    let info = Native
        .inspect(&state)?
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    ensure!(
        info.version == 2 && info.highest == Token::new(0, 0, 42),
        "{info:?}"
    );
    Ok(())
}

/// Every rejection (stale, duplicate, version conflict, invalid request)
/// leaves the mutation unrun and the database byte for byte unchanged.
#[test]
fn rejected_writes_run_no_mutation_and_change_nothing() -> Result<()> {
    let (_db, mut conn) = setup()?;
    let opened = Request::new(SCOPE, Token::new(0, 0, 42), Policy::AllowEqual).with_op_id("op-1");
    ensure!(write(&mut conn, &opened, "first")?.is_applied());
    let before = snapshot(&conn)?;
    let cases = [
        (strict(SCOPE, 41), "stale-fence"),
        (strict(SCOPE, 42), "stale-fence"),
        (opened.clone(), "duplicate"),
        (
            Request::new(SCOPE, Token::new(0, 0, 42), Policy::AllowEqual).with_expected_version(7),
            "version-conflict",
        ),
        (strict(SCOPE, 0), "invalid-request"),
        (strict("", 43), "invalid-request"),
    ];
    let mut guest = runtime()?.instance()?;
    for (request, expected) in cases {
        let ran = Cell::new(false);
        let outcome = fenced_write(&mut conn, &mut guest, &request, |_, _| {
            ran.set(true);
            Ok::<_, rusqlite::Error>(())
        })?;
        ensure!(outcome.name() == expected, "{request:?}: {outcome:?}");
        ensure!(!ran.get(), "{expected}: the mutation ran");
        ensure!(snapshot(&conn)? == before, "{expected}: something changed");
    }
    Ok(())
}

/// A stale answer carries both tokens, so the caller can log the race.
#[test]
fn stale_fence_reports_presented_and_highest() -> Result<()> {
    let (_db, mut conn) = setup()?;
    ensure!(write(&mut conn, &strict(SCOPE, 42), "b")?.is_applied());
    let outcome = write(&mut conn, &strict(SCOPE, 41), "a")?;
    ensure!(
        outcome
            == Fenced::Rejected(Rejection::StaleFence {
                presented: Token::new(0, 0, 41),
                highest: Token::new(0, 0, 42)
            }),
        "{outcome:?}"
    );
    Ok(())
}

/// A failing mutation rolls back its own writes and the fence state: the
/// token is not consumed.
#[test]
fn failing_mutation_rolls_back_everything() -> Result<()> {
    let (_db, mut conn) = setup()?;
    ensure!(write(&mut conn, &strict(SCOPE, 41), "a")?.is_applied());
    let before = snapshot(&conn)?;
    let mut guest = runtime()?.instance()?;
    let result = fenced_write(&mut conn, &mut guest, &strict(SCOPE, 42), |tx, _| {
        tx.execute("INSERT INTO ledger VALUES ('x', 0, 'half')", [])?;
        tx.execute("INSERT INTO no_such_table VALUES (1)", [])
    });
    ensure!(matches!(result, Err(Error::Mutation(_))), "{result:?}");
    ensure!(snapshot(&conn)? == before);
    // The same token still works: the failed attempt consumed nothing.
    ensure!(write(&mut conn, &strict(SCOPE, 42), "b")?.is_applied());
    Ok(())
}

/// A damaged stored state is refused as corrupt-state and left as it is.
#[test]
fn corrupt_state_is_refused_and_left_alone() -> Result<()> {
    let (_db, mut conn) = setup()?;
    ensure!(write(&mut conn, &strict(SCOPE, 41), "a")?.is_applied());
    let mut state = stored_state(&conn, SCOPE)?.unwrap_or_default();
    ensure!(state.len() > 9);
    state[9] ^= 0x02;
    conn.execute("UPDATE fencecheck_scopes SET fence_state = ?1", [&state])?;
    let before = snapshot(&conn)?;
    let outcome = write(&mut conn, &strict(SCOPE, 43), "c")?;
    ensure!(
        outcome
            == Fenced::Rejected(Rejection::Refused(CheckError::CorruptState(
                Corruption::ChecksumMismatch
            ))),
        "{outcome:?}"
    );
    ensure!(snapshot(&conn)? == before);
    Ok(())
}

/// A mutation that commits on its own is reported, and the fence state is not
/// stored after it.
#[test]
fn mutation_that_ends_the_transaction_is_an_error() -> Result<()> {
    let (_db, mut conn) = setup()?;
    let mut guest = runtime()?.instance()?;
    let result = fenced_write(&mut conn, &mut guest, &strict(SCOPE, 41), |tx, _| {
        tx.execute_batch("ROLLBACK")
    });
    ensure!(matches!(result, Err(Error::TransactionEnded)), "{result:?}");
    ensure!(stored_state(&conn, SCOPE)?.is_none());
    Ok(())
}

/// A database locked by another writer is an infrastructure error marked
/// busy (retryable), never a rejection; nothing changes.
#[test]
fn busy_database_is_an_error_not_a_rejection() -> Result<()> {
    let (db, mut conn) = setup()?;
    conn.busy_timeout(Duration::ZERO)?;
    let holder = db.open()?;
    holder.execute_batch("BEGIN IMMEDIATE")?;
    let result = write(&mut conn, &strict(SCOPE, 41), "a");
    holder.execute_batch("ROLLBACK")?;
    let err = match result {
        Err(e) => e.downcast::<Error>()?,
        Ok(outcome) => anyhow::bail!("expected busy, got {outcome:?}"),
    };
    ensure!(err.is_busy(), "{err}");
    ensure!(stored_state(&conn, SCOPE)?.is_none());
    ensure!(write(&mut conn, &strict(SCOPE, 41), "a")?.is_applied());
    Ok(())
}

/// The stored bytes are exactly what the native reference computes: the
/// adapter stores the component's state unchanged.
#[test]
fn stored_state_matches_the_native_reference() -> Result<()> {
    let (_db, mut conn) = setup()?;
    let mut reference: Option<Vec<u8>> = None;
    for (i, counter) in [3u64, 5, 5, 4, 9].into_iter().enumerate() {
        let request = strict(SCOPE, counter);
        let outcome = write(&mut conn, &request, &format!("n{i}"))?;
        match Native.check(reference.as_deref(), &request)? {
            Ok(Decision::Applied { state, .. }) => {
                ensure!(outcome.is_applied(), "{counter}: {outcome:?}");
                reference = Some(state);
            }
            other => ensure!(!outcome.is_applied(), "{counter}: {outcome:?} vs {other:?}"),
        }
        ensure!(
            stored_state(&conn, SCOPE)? == reference,
            "{counter}: bytes differ"
        );
    }
    Ok(())
}

thread_local! {
    /// The statements traced on this test's thread.
    static TRACED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn record(event: TraceEvent<'_>) {
    if let TraceEvent::Stmt(_, sql) = event {
        TRACED.with(|t| {
            t.borrow_mut()
                .push(sql.split_whitespace().collect::<Vec<_>>().join(" "))
        });
    }
}

/// `write`, returning the statements it ran (first words only).
fn traced(
    conn: &mut Connection,
    request: &Request,
    note: &str,
) -> Result<(Fenced<i64>, Vec<String>)> {
    TRACED.with(|t| t.take());
    conn.trace_v2(TraceEventCodes::SQLITE_TRACE_STMT, Some(record));
    let outcome = write(conn, request, note);
    conn.trace_v2(TraceEventCodes::empty(), None);
    let statements = TRACED.with(|t| t.take());
    Ok((
        outcome?,
        statements
            .iter()
            .map(|s| s.split(' ').take(2).collect::<Vec<_>>().join(" "))
            .collect(),
    ))
}

/// A write to an existing, unkeyed scope reads, checks and stores the state
/// in ONE UPDATE under `BEGIN IMMEDIATE`, before the mutation: no separate
/// read of the state; the first write of a scope reads, then inserts.
#[test]
fn existing_scope_is_checked_and_stored_by_one_statement() -> Result<()> {
    let (_db, mut conn) = setup()?;
    let (first, statements) = traced(&mut conn, &strict(SCOPE, 41), "a")?;
    ensure!(first.is_applied(), "{first:?}");
    ensure!(
        statements
            == [
                "BEGIN IMMEDIATE",
                "UPDATE fencecheck_scopes",
                "SELECT (SELECT",
                "INSERT INTO",
                "INSERT INTO",
                "SELECT count(*)",
                "COMMIT",
            ],
        "{statements:?}"
    );
    let (second, statements) = traced(&mut conn, &strict(SCOPE, 42), "b")?;
    ensure!(second.is_applied(), "{second:?}");
    ensure!(
        statements
            == [
                "BEGIN IMMEDIATE",
                "UPDATE fencecheck_scopes",
                "INSERT INTO",
                "SELECT count(*)",
                "COMMIT",
            ],
        "{statements:?}"
    );
    let (stale, statements) = traced(&mut conn, &strict(SCOPE, 42), "c")?;
    ensure!(stale.name() == "stale-fence", "{stale:?}");
    ensure!(
        statements == ["BEGIN IMMEDIATE", "UPDATE fencecheck_scopes", "ROLLBACK"],
        "{statements:?}"
    );
    ensure!(
        rows(&conn, "SELECT note FROM ledger ORDER BY rowid")? == ["Text(\"a\")", "Text(\"b\")"]
    );
    Ok(())
}

/// The state is stored before the mutation runs, so a mutation that commits
/// by itself commits the new state with what it wrote: a mutation's writes
/// never stand without their state.
#[test]
fn mutation_that_commits_commits_its_state() -> Result<()> {
    let (_db, mut conn) = setup()?;
    ensure!(write(&mut conn, &strict(SCOPE, 41), "a")?.is_applied());
    let mut guest = runtime()?.instance()?;
    let result = fenced_write(&mut conn, &mut guest, &strict(SCOPE, 42), |tx, _| {
        tx.execute_batch("INSERT INTO ledger VALUES ('report/july', 2, 'b'); COMMIT")
    });
    ensure!(matches!(result, Err(Error::TransactionEnded)), "{result:?}");
    let state = stored_state(&conn, SCOPE)?.ok_or_else(|| anyhow::anyhow!("no state"))?;
    let info = Native
        .inspect(&state)?
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    ensure!(
        info.version == 2 && info.highest == Token::new(0, 0, 42),
        "{info:?}"
    );
    ensure!(rows(&conn, "SELECT count(*) FROM ledger")? == ["Integer(2)"]);
    Ok(())
}

/// A row whose `version` column is out of step with its state is decided by
/// read-then-write in the same transaction, exactly as before: applied once,
/// the column set to the state's version, the mutation run once.
#[test]
fn version_out_of_step_is_decided_by_read_then_write() -> Result<()> {
    let (_db, mut conn) = setup()?;
    ensure!(write(&mut conn, &strict(SCOPE, 41), "a")?.is_applied());
    conn.execute("UPDATE fencecheck_scopes SET version = 7", [])?;
    let (outcome, statements) = traced(&mut conn, &strict(SCOPE, 42), "b")?;
    ensure!(
        outcome
            == Fenced::Applied {
                version: 2,
                highest: Token::new(0, 0, 42),
                value: 2
            },
        "{outcome:?}"
    );
    ensure!(
        statements
            == [
                "BEGIN IMMEDIATE",
                "UPDATE fencecheck_scopes",
                "SELECT (SELECT",
                "UPDATE fencecheck_scopes",
                "INSERT INTO",
                "SELECT count(*)",
                "COMMIT",
            ],
        "{statements:?}"
    );
    ensure!(rows(&conn, "SELECT version FROM fencecheck_scopes")? == ["Integer(2)"]);
    Ok(())
}
