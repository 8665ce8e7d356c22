//! Many real processes publishing to one WAL database with current and stale
//! tokens; the recorded history must be consistent under any interleaving.
//! It is checked per scope by the shared checker (tests/support/history.rs)
//! against an audit log of every committed publish, written by a trigger in
//! the publish's own transaction.

use crate::common;

use std::collections::{BTreeMap, HashSet};
use std::thread;

use anyhow::{Context, Result, anyhow, bail, ensure};
use common::{Db, Worker, at_ms};
use fencecheck::{Checker, Native, Token, TokenText};
use fencecheck_sqlite::{collect_garbage, stored_state, visible};
use fencecheck_tests::history::{self, Audited, Kept, Seen};

const PROCESSES: u64 = 4;
const ROUNDS: u64 = 12;
const SCOPES: [&str; 2] = ["report/july", "report/august"];
const NOW_MS: u64 = 1_000_000;

/// One publish attempt as a worker recorded it.
#[derive(Debug)]
struct Attempt {
    process: u64,
    seq: u64,
    scope: String,
    token: Token,
    object: i64,
    before: (u64, i64),
    outcome: String,
    version: Option<u64>,
    after: (u64, i64),
}

fn parse(line: &str) -> Result<Attempt> {
    let f: Vec<&str> = line.split('\t').collect();
    let [
        "attempt",
        process,
        seq,
        scope,
        token,
        object,
        bv,
        bo,
        outcome,
        version,
        av,
        ao,
    ] = f.as_slice()
    else {
        bail!("not an attempt record: {line:?}");
    };
    Ok(Attempt {
        process: process.parse()?,
        seq: seq.parse()?,
        scope: scope.to_string(),
        token: token.parse::<TokenText>()?.0,
        object: object.parse()?,
        before: (bv.parse()?, bo.parse()?),
        outcome: outcome.to_string(),
        version: (*version != "-").then(|| version.parse()).transpose()?,
        after: (av.parse()?, ao.parse()?),
    })
}

/// Log every state a scope's row takes (version, visible object, fence
/// state), from the statement that writes it: only committed writes remain.
const AUDIT: &str = "
CREATE TABLE audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, scope TEXT NOT NULL,
                    version INTEGER NOT NULL, object INTEGER, state BLOB NOT NULL);
CREATE TRIGGER audit_insert AFTER INSERT ON fencecheck_scopes BEGIN
    INSERT INTO audit (scope, version, object, state)
    VALUES (NEW.scope, NEW.version, NEW.visible_object, NEW.fence_state);
END;
CREATE TRIGGER audit_update AFTER UPDATE ON fencecheck_scopes BEGIN
    INSERT INTO audit (scope, version, object, state)
    VALUES (NEW.scope, NEW.version, NEW.visible_object, NEW.fence_state);
END;";

/// What the database kept: every audited write (its object as the payload,
/// the token its stored state accepted last) and each scope's final row.
fn kept(db: &Db) -> Result<Kept> {
    let conn = db.open()?;
    let mut kept = Kept::default();
    let mut stmt = conn.prepare("SELECT scope, version, object, state FROM audit ORDER BY seq")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, Option<i64>>(2)?,
            r.get::<_, Vec<u8>>(3)?,
        ))
    })?;
    for row in rows {
        let (scope, version, object, state) = row?;
        let info = Native
            .inspect(&state)?
            .map_err(|e| anyhow!("audited state of {scope}: {e:?}"))?;
        let version = version.unsigned_abs();
        ensure!(
            info.version == version,
            "{scope}: row v{version}, state {info:?}"
        );
        let write = Audited {
            payload: object.context("a publish without an object")?.to_string(),
            token: info.highest,
        };
        let clash = kept
            .audit
            .entry(scope.clone())
            .or_default()
            .insert(version, write);
        ensure!(clash.is_none(), "{scope}: version {version} audited twice");
    }
    let mut stmt = conn.prepare("SELECT scope, version, visible_object FROM fencecheck_scopes")?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, Option<i64>>(2)?,
        ))
    })?;
    for row in rows {
        let (scope, version, object) = row?;
        let object = object.context("a scope without a visible object")?;
        kept.finals
            .insert(scope, (version.unsigned_abs(), object.to_string()));
    }
    Ok(kept)
}

/// The attempts as the shared checker takes them: the staged object (unique
/// per attempt) is the payload.
fn to_history(attempts: &[Attempt]) -> Result<Vec<history::Attempt>> {
    attempts
        .iter()
        .map(|a| {
            let seen = match (a.outcome.as_str(), a.version) {
                ("applied", Some(v)) => Seen::Applied(v),
                ("stale-fence", None) => Seen::Refused(a.outcome.clone()),
                (other, _) => bail!("unexpected outcome {other} in {a:?}"),
            };
            Ok(history::Attempt {
                client: usize::try_from(a.process)?,
                scope: a.scope.clone(),
                token: a.token,
                op_id: None,
                expected_version: None,
                payload: a.object.to_string(),
                seen,
            })
        })
        .collect()
}

/// Run the race and return every attempt, in each process's program order.
fn race(db: &Db) -> Result<Vec<Attempt>> {
    let mut workers = Vec::new();
    for p in 0..PROCESSES {
        let mut args = vec![
            "race".to_string(),
            p.to_string(),
            PROCESSES.to_string(),
            ROUNDS.to_string(),
        ];
        args.extend(SCOPES.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        workers.push(Worker::spawn(&db.path, NOW_MS, &refs)?);
    }
    // Start barrier: all loaded, then all released at once.
    for w in &mut workers {
        ensure!(w.line()? == "ready");
    }
    for w in &mut workers {
        w.send("go")?;
    }
    let readers: Vec<_> = workers
        .into_iter()
        .map(|w| thread::spawn(move || w.finish()))
        .collect();
    let mut attempts = Vec::new();
    for reader in readers {
        let (lines, status) = reader
            .join()
            .map_err(|_| anyhow::anyhow!("reader panicked"))??;
        ensure!(status.success(), "worker failed: {status:?}");
        ensure!(
            lines.last().map(String::as_str) == Some("done"),
            "{lines:?}"
        );
        for line in &lines[..lines.len() - 1] {
            attempts.push(parse(line)?);
        }
    }
    Ok(attempts)
}

/// The history passes the shared checker (gapless audited versions, tokens
/// increasing along them, every applied write audited at its version, no
/// trace of a refused one, the final row the last audited write). Per scope
/// besides: nothing but a committed object at its own version is ever seen;
/// every process sees versions only move forward and sees its own applied
/// write after commit; an attempt at or below what it had already seen is
/// refused, and so is a replay; the stored state agrees with the last write;
/// rejected attempts leave no trace in storage after collection.
#[test]
fn racing_processes_keep_a_consistent_fence_history() -> Result<()> {
    let db = Db::new()?;
    db.open()?.execute_batch(AUDIT)?;
    let attempts = race(&db)?;
    let per_process = ROUNDS * SCOPES.len() as u64 * 2 + (ROUNDS - 1) * SCOPES.len() as u64;
    ensure!(
        attempts.len() as u64 == PROCESSES * per_process,
        "{} records",
        attempts.len()
    );
    let kept = kept(&db)?;
    let summary = history::check(&to_history(&attempts)?, &kept)?;
    eprintln!("history: {summary:?}");
    ensure!(
        summary.unknown == 0 && summary.applied > 0 && summary.refused > 0,
        "{summary:?}"
    );

    let mut applied_total = 0;
    for scope in SCOPES {
        let mine: Vec<&Attempt> = attempts.iter().filter(|a| a.scope == scope).collect();
        // version -> (token, object) of the committed write that produced it.
        let mut by_version: BTreeMap<u64, (Token, i64)> = BTreeMap::new();
        by_version.insert(0, (Token::default(), 0));
        for (version, write) in kept.audit.get(scope).context("nothing applied")? {
            by_version.insert(*version, (write.token, write.payload.parse()?));
        }
        let applied = by_version.len() as u64 - 1;
        applied_total += applied;
        ensure!(applied > 0, "{scope}: nothing applied");

        let mut last_seen: BTreeMap<u64, u64> = BTreeMap::new();
        let mut tokens_sent: HashSet<(u64, Token)> = HashSet::new();
        for a in &mine {
            for (when, (version, object)) in [("before", a.before), ("after", a.after)] {
                let Some((_, expected)) = by_version.get(&version) else {
                    bail!(
                        "{scope}: saw version {version} that no committed write produced ({when}, {a:?})"
                    );
                };
                ensure!(
                    object == *expected,
                    "{scope}: version {version} showed object {object}, applied {expected}"
                );
            }
            let seen = last_seen.entry(a.process).or_insert(0);
            ensure!(
                a.before.0 >= *seen && a.after.0 >= a.before.0,
                "{scope}: visible version went back: {a:?}"
            );
            *seen = a.after.0;
            if let Some(v) = a.version {
                ensure!(
                    a.after.0 >= v,
                    "{scope}: own applied write not visible after commit: {a:?}"
                );
            }
            // At or below what was already visible: must have been refused.
            let (seen_token, _) = by_version[&a.before.0];
            if a.before.0 > 0 && !seen_token.grant_order(&a.token).is_lt() {
                ensure!(
                    a.outcome == "stale-fence",
                    "{scope}: stale token accepted: {a:?}"
                );
            }
            // A grant presented a second time (replay or late delivery).
            if !tokens_sent.insert((a.process, a.token)) {
                ensure!(
                    a.outcome == "stale-fence",
                    "{scope}: replay accepted: {a:?}"
                );
            }
        }

        let conn = db.open()?;
        let (top_token, top_object) = by_version[&applied];
        let shown = visible(&conn, scope)?.context("nothing visible")?;
        ensure!(
            shown.version == applied && shown.object.get() == top_object,
            "{scope}: final {shown:?}"
        );
        let state = stored_state(&conn, scope)?.context("no state")?;
        let info = Native
            .inspect(&state)?
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        ensure!(
            info.version == applied && info.highest == top_token,
            "{scope}: {info:?}"
        );
    }
    ensure!(attempts.iter().all(|a| a.seq < per_process));

    // Rejected and superseded objects were never referenced: once collected,
    // only the visible ones remain.
    let mut conn = db.open()?;
    let report = collect_garbage(
        &mut conn,
        at_ms(NOW_MS + 3_600_000),
        std::time::Duration::from_secs(60),
    )?;
    ensure!(
        report.deleted == attempts.len() as u64 - SCOPES.len() as u64,
        "{report:?}"
    );
    ensure!(applied_total >= SCOPES.len() as u64);
    Ok(())
}
