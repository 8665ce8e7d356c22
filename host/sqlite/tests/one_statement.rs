//! `publish` to an existing scope runs as ONE autocommit UPDATE that checks
//! inside the statement. These pin that it decides exactly as the
//! read-then-write path did: the same `Fenced` values, the same errors, and
//! nothing changed by anything but `applied`.

use crate::common;

use std::cell::RefCell;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use common::{Db, at_ms, rows, runtime, strict};
use fencecheck::{
    CheckError, Checker, Corruption, Decision, InvalidReason, Limits, Native, Policy, Request,
    Runtime, Token,
};
use fencecheck_sqlite::{
    Error, Fenced, ObjectId, Rejection, publish, stage, stored_state, visible,
};
use rusqlite::Connection;
use rusqlite::trace::{TraceEvent, TraceEventCodes};

const JULY: &str = "report/july";

/// Every column of both tables, for "nothing changed" checks.
fn snapshot(conn: &Connection) -> Result<Vec<String>> {
    let mut all = rows(
        conn,
        "SELECT scope || ' ' || hex(fence_state) || ' ' || version || ' '
                || ifnull(visible_object, '-') || ' ' || ifnull(published_at_ms, '-')
           FROM fencecheck_scopes ORDER BY scope",
    )?;
    all.extend(rows(
        conn,
        "SELECT id || scope || name || hex(body) || staged_at_ms FROM fencecheck_objects ORDER BY id",
    )?);
    Ok(all)
}

/// What the read-then-write path answers for `request` on the stored state:
/// the native reference's decision as the adapter reports it.
fn expected(conn: &Connection, request: &Request) -> Result<Fenced<()>> {
    let stored = stored_state(conn, &request.scope)?;
    Ok(match Native.check(stored.as_deref(), request)? {
        Ok(Decision::Applied {
            version, highest, ..
        }) => Fenced::Applied {
            version,
            highest,
            value: (),
        },
        Ok(Decision::Duplicate { version }) => Fenced::Rejected(Rejection::Duplicate { version }),
        Ok(Decision::StaleFence { presented, highest }) => {
            Fenced::Rejected(Rejection::StaleFence { presented, highest })
        }
        Ok(Decision::VersionConflict { expected, actual }) => {
            Fenced::Rejected(Rejection::VersionConflict { expected, actual })
        }
        Err(e) => Fenced::Rejected(Rejection::Refused(e)),
    })
}

/// The `version` column equals the stored state's version.
fn version_in_step(conn: &Connection, scope: &str) -> Result<()> {
    let column: i64 = conn.query_row(
        "SELECT version FROM fencecheck_scopes WHERE scope = ?1",
        [scope],
        |r| r.get(0),
    )?;
    let state = stored_state(conn, scope)?.context("no state")?;
    let info = Native
        .inspect(&state)?
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(
        u64::try_from(column) == Ok(info.version),
        "column {column} vs state {}",
        info.version
    );
    Ok(())
}

/// A scope with one publication under `0.42` (allow-equal, op-id `op-1`)
/// and a fresh object staged for the next publish.
fn opened() -> Result<(Db, Connection, ObjectId, Request)> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let first = stage(&conn, JULY, "first", b"1", at_ms(0))?;
    let opening = Request::new(JULY, Token::new(0, 0, 42), Policy::AllowEqual).with_op_id("op-1");
    let mut guest = runtime()?.instance()?;
    ensure!(publish(&mut conn, &mut guest, &opening, first, at_ms(1))?.is_applied());
    let next = stage(&conn, JULY, "next", b"2", at_ms(2))?;
    Ok((db, conn, next, opening))
}

/// Stale, strict-equal, duplicate, version-conflict, invalid and
/// foreign-authority requests are refused by the one statement with the
/// same value the read-then-write path gives, and change nothing; the
/// object is still publishable afterwards.
#[test]
fn refusals_match_the_reference_and_change_nothing() -> Result<()> {
    let (_db, mut conn, next, opening) = opened()?;
    let mut guest = runtime()?.instance()?;
    let before = snapshot(&conn)?;
    let eq = || Request::new(JULY, Token::new(0, 0, 42), Policy::AllowEqual);
    let cases = [
        (strict(JULY, 41), "stale-fence"),
        (strict(JULY, 42), "stale-fence"),
        (opening.clone(), "duplicate"),
        (eq().with_expected_version(7), "version-conflict"),
        (eq(), "invalid-request"),
        (strict(JULY, 0), "invalid-request"),
        (strict(JULY, 43).with_op_id(""), "invalid-request"),
        (
            Request::new(JULY, Token::new(9, 0, 43), Policy::Strict),
            "foreign-authority",
        ),
    ];
    for (request, name) in cases {
        let reference = expected(&conn, &request)?;
        let outcome = publish(&mut conn, &mut guest, &request, next, at_ms(3))?;
        ensure!(outcome.name() == name, "{request:?}: {outcome:?}");
        ensure!(
            outcome == reference,
            "{request:?}: {outcome:?} vs {reference:?}"
        );
        ensure!(snapshot(&conn)? == before, "{name}: something changed");
    }
    // The exact values, once each.
    let stale = publish(&mut conn, &mut guest, &strict(JULY, 41), next, at_ms(3))?;
    ensure!(
        stale
            == Fenced::Rejected(Rejection::StaleFence {
                presented: Token::new(0, 0, 41),
                highest: Token::new(0, 0, 42)
            }),
        "{stale:?}"
    );
    let duplicate = publish(&mut conn, &mut guest, &opening, next, at_ms(3))?;
    ensure!(
        duplicate == Fenced::Rejected(Rejection::Duplicate { version: 1 }),
        "{duplicate:?}"
    );
    let unguarded = publish(&mut conn, &mut guest, &eq(), next, at_ms(3))?;
    ensure!(
        unguarded
            == Fenced::Rejected(Rejection::Refused(CheckError::InvalidRequest(
                InvalidReason::EqualTokenUnguarded
            ))),
        "{unguarded:?}"
    );
    // Nothing was consumed: the next token publishes.
    ensure!(publish(&mut conn, &mut guest, &strict(JULY, 43), next, at_ms(4))?.is_applied());
    ensure!(visible(&conn, JULY)?.map(|v| v.object) == Some(next));
    version_in_step(&conn, JULY)
}

/// A damaged state is refused as corrupt-state by the one statement and
/// left exactly as it is.
#[test]
fn corrupt_state_is_refused_and_left_alone() -> Result<()> {
    let (_db, mut conn, next, _) = opened()?;
    let mut state = stored_state(&conn, JULY)?.context("no state")?;
    ensure!(state.len() > 12);
    state[12] ^= 0x10;
    conn.execute(
        "UPDATE fencecheck_scopes SET fence_state = ?1 WHERE scope = ?2",
        rusqlite::params![state, JULY],
    )?;
    let before = snapshot(&conn)?;
    let mut guest = runtime()?.instance()?;
    let outcome = publish(&mut conn, &mut guest, &strict(JULY, 43), next, at_ms(3))?;
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

/// A sequence of publishes under mixed policies, op-ids and expected
/// versions: every outcome, every stored state byte and the version column
/// are what the native reference gives; the pointer moves only on applied.
#[test]
fn outcomes_and_states_match_the_reference() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let mut guest = runtime()?.instance()?;
    let eq = |op: &str| Request::new(JULY, Token::new(0, 0, 7), Policy::AllowEqual).with_op_id(op);
    let steps = [
        strict(JULY, 5),
        strict(JULY, 7),
        eq("a"),
        eq("b"),
        eq("a"),
        Request::new(JULY, Token::new(0, 0, 7), Policy::AllowEqual).with_expected_version(4),
        Request::new(JULY, Token::new(0, 0, 7), Policy::AllowEqual).with_expected_version(3),
        strict(JULY, 6),
        strict(JULY, 8),
    ];
    let mut reference: Option<Vec<u8>> = None;
    let mut shown = None;
    for (i, request) in steps.iter().enumerate() {
        let object = stage(&conn, JULY, &format!("o{i}"), b"x", at_ms(0))?;
        let want = expected(&conn, request)?;
        let got = publish(&mut conn, &mut guest, request, object, at_ms(i as u64))?;
        ensure!(got == want, "step {i}: {got:?} vs {want:?}");
        if let Ok(Decision::Applied { state, .. }) = Native.check(reference.as_deref(), request)? {
            reference = Some(state);
            shown = Some(object);
        }
        ensure!(
            stored_state(&conn, JULY)? == reference,
            "step {i}: bytes differ"
        );
        ensure!(visible(&conn, JULY)?.map(|v| v.object) == shown, "step {i}");
        version_in_step(&conn, JULY)?;
    }
    Ok(())
}

/// A `version` column out of step with the state (written by hand, say) is
/// never extended: that publish takes the read-then-write path, which
/// writes the state's version, as before.
#[test]
fn version_column_out_of_step_is_rewritten() -> Result<()> {
    let (_db, mut conn, next, _) = opened()?;
    conn.execute("UPDATE fencecheck_scopes SET version = 99", [])?;
    let mut guest = runtime()?.instance()?;
    let outcome = publish(&mut conn, &mut guest, &strict(JULY, 43), next, at_ms(3))?;
    ensure!(
        outcome
            == Fenced::Applied {
                version: 2,
                highest: Token::new(0, 0, 43),
                value: ()
            },
        "{outcome:?}"
    );
    version_in_step(&conn, JULY)
}

/// The decision comes before the object check, as on the read-then-write
/// path: a stale token with an unknown object is stale-fence; a fresh token
/// with an unknown or foreign object is UnknownObject; neither changes
/// anything.
#[test]
fn decision_comes_before_the_object_check() -> Result<()> {
    let (_db, mut conn, _, _) = opened()?;
    let foreign = stage(&conn, "report/august", "theirs", b"3", at_ms(0))?;
    let before = snapshot(&conn)?;
    let mut guest = runtime()?.instance()?;
    for object in [foreign, ObjectId::from_raw(9_999)] {
        let stale = publish(&mut conn, &mut guest, &strict(JULY, 41), object, at_ms(3))?;
        ensure!(stale.name() == "stale-fence", "{object}: {stale:?}");
        match publish(&mut conn, &mut guest, &strict(JULY, 43), object, at_ms(3)) {
            Err(Error::UnknownObject { object: o, .. }) if o == object => {}
            other => bail!("{object}: expected UnknownObject, got {other:?}"),
        }
        ensure!(snapshot(&conn)? == before);
    }
    Ok(())
}

/// A checker that cannot run (here: a call bound below the request's size)
/// is an infrastructure error from the one statement, not a rejection, and
/// changes nothing.
#[test]
fn checker_failure_is_an_error_and_changes_nothing() -> Result<()> {
    let (_db, mut conn, next, _) = opened()?;
    let before = snapshot(&conn)?;
    let tight = Runtime::from_bytes(
        fencecheck::COMPONENT,
        Limits {
            call_bytes: 32,
            ..Limits::default()
        },
    )?;
    let mut guest = tight.instance()?;
    let result = publish(&mut conn, &mut guest, &strict(JULY, 43), next, at_ms(3));
    ensure!(
        matches!(
            result,
            Err(Error::Check(fencecheck::Error::TooLarge { .. }))
        ),
        "{result:?}"
    );
    ensure!(snapshot(&conn)? == before);
    let mut guest = runtime()?.instance()?;
    ensure!(publish(&mut conn, &mut guest, &strict(JULY, 43), next, at_ms(4))?.is_applied());
    Ok(())
}

/// A connection already inside a transaction does not get its publish
/// folded into that transaction: it is refused as before, nothing changes.
#[test]
fn publish_inside_an_open_transaction_is_refused() -> Result<()> {
    let (_db, mut conn, next, _) = opened()?;
    let before = snapshot(&conn)?;
    conn.execute_batch("BEGIN")?;
    let mut guest = runtime()?.instance()?;
    let result = publish(&mut conn, &mut guest, &strict(JULY, 43), next, at_ms(3));
    conn.execute_batch("ROLLBACK")?;
    ensure!(matches!(result, Err(Error::Sqlite { .. })), "{result:?}");
    ensure!(snapshot(&conn)? == before);
    Ok(())
}

/// Another writer holding the lock makes the one statement fail busy
/// (retryable), never a rejection; nothing changes, and a retry applies.
#[test]
fn busy_database_is_an_error_not_a_rejection() -> Result<()> {
    let (db, mut conn, next, _) = opened()?;
    conn.busy_timeout(Duration::ZERO)?;
    let before = snapshot(&conn)?;
    let holder = db.open()?;
    holder.execute_batch("BEGIN IMMEDIATE")?;
    let mut guest = runtime()?.instance()?;
    let result = publish(&mut conn, &mut guest, &strict(JULY, 43), next, at_ms(3));
    holder.execute_batch("ROLLBACK")?;
    match result {
        Err(e) => ensure!(e.is_busy(), "{e}"),
        Ok(outcome) => bail!("expected busy, got {outcome:?}"),
    }
    ensure!(snapshot(&conn)? == before);
    ensure!(publish(&mut conn, &mut guest, &strict(JULY, 43), next, at_ms(4))?.is_applied());
    Ok(())
}

/// Two connections alternate on one scope: each one's statement decides on
/// the state the other committed (the write lock is taken before the row is
/// read), so the later token always wins and versions count every publish.
#[test]
fn two_connections_see_each_others_states() -> Result<()> {
    let (db, mut a, _, _) = opened()?;
    let mut b = db.open()?;
    let mut guest = runtime()?.instance()?;
    for counter in 43..53u64 {
        let conn = if counter % 2 == 0 { &mut a } else { &mut b };
        let object = stage(conn, JULY, "o", b"x", at_ms(counter))?;
        ensure!(
            publish(
                conn,
                &mut guest,
                &strict(JULY, counter),
                object,
                at_ms(counter)
            )?
            .is_applied()
        );
        let other = if counter % 2 == 0 { &mut b } else { &mut a };
        let late = stage(other, JULY, "late", b"y", at_ms(counter))?;
        let refused = publish(
            other,
            &mut guest,
            &strict(JULY, counter),
            late,
            at_ms(counter),
        )?;
        ensure!(refused.name() == "stale-fence", "{counter}: {refused:?}");
    }
    ensure!(visible(&a, JULY)?.map(|v| v.version) == Some(11));
    version_in_step(&b, JULY)
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

/// An applied publish to an existing scope, and a refused one, are ONE
/// statement each: the UPDATE, no BEGIN, no read, no COMMIT. The first
/// publish of a scope takes the read-then-write transaction, whose one read
/// also says whether the scope has signing keys (none here: the keys query
/// of host/sqlite/keys.sql does not run).
#[test]
fn an_existing_scope_is_published_with_one_statement() -> Result<()> {
    let db = Db::new()?;
    let mut conn = db.open()?;
    let mut guest = runtime()?.instance()?;
    let first = stage(&conn, JULY, "first", b"1", at_ms(0))?;
    let second = stage(&conn, JULY, "second", b"2", at_ms(0))?;
    // The statements one publish runs on `conn`, whitespace collapsed.
    let mut run = |counter: u64, object: ObjectId| -> Result<(Fenced<()>, Vec<String>)> {
        TRACED.with(|t| t.borrow_mut().clear());
        conn.trace_v2(TraceEventCodes::SQLITE_TRACE_STMT, Some(record));
        let outcome = publish(
            &mut conn,
            &mut guest,
            &strict(JULY, counter),
            object,
            at_ms(1),
        );
        conn.trace_v2(TraceEventCodes::empty(), None);
        Ok((outcome?, TRACED.with(|t| t.take())))
    };

    let (outcome, statements) = run(41, first)?;
    ensure!(outcome.is_applied(), "{outcome:?}");
    let kinds: Vec<&str> = statements
        .iter()
        .map(|s| s.split(' ').next().unwrap_or(""))
        .collect();
    ensure!(
        kinds == ["UPDATE", "BEGIN", "SELECT", "INSERT", "COMMIT"],
        "first publish: {statements:?}"
    );

    for (counter, name) in [(42, "applied"), (42, "stale-fence"), (41, "stale-fence")] {
        let (outcome, statements) = run(counter, second)?;
        ensure!(outcome.name() == name, "{counter}: {outcome:?}");
        ensure!(
            statements.len() == 1
                && statements[0]
                    .starts_with("UPDATE fencecheck_scopes SET fence_state = fencecheck_apply_"),
            "{counter} ({name}): {statements:?}"
        );
    }
    Ok(())
}
