//! Many real processes publishing to one WAL database with current and stale
//! tokens; the recorded history must be consistent under any interleaving.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::thread;

use anyhow::{Context, Result, bail, ensure};
use common::{Db, Worker, at_ms};
use fencecheck::{Checker, Native, Token, TokenText};
use fencecheck_sqlite::{collect_garbage, stored_state, visible};

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

/// Per scope: applied tokens strictly increase with the version; nothing
/// but an applied object at its own version is ever seen; every process sees
/// versions only move forward and sees its own applied write after commit; an
/// attempt below what it had already seen is refused; rejected attempts leave
/// no trace in the catalog, the fence state or (after collection) storage.
#[test]
fn racing_processes_keep_a_consistent_fence_history() -> Result<()> {
    let db = Db::new()?;
    let attempts = race(&db)?;
    let per_process = ROUNDS * SCOPES.len() as u64 * 2 + (ROUNDS - 1) * SCOPES.len() as u64;
    ensure!(
        attempts.len() as u64 == PROCESSES * per_process,
        "{} records",
        attempts.len()
    );

    let mut applied_total = 0;
    for scope in SCOPES {
        let mine: Vec<&Attempt> = attempts.iter().filter(|a| a.scope == scope).collect();
        // version -> (token, object) of the applied attempt that produced it.
        let mut history: BTreeMap<u64, (Token, i64)> = BTreeMap::new();
        history.insert(0, (Token::default(), 0));
        for a in &mine {
            match (a.outcome.as_str(), a.version) {
                ("applied", Some(v)) => {
                    let clash = history.insert(v, (a.token, a.object));
                    ensure!(clash.is_none(), "{scope}: version {v} applied twice");
                }
                ("stale-fence", None) => {}
                (other, _) => bail!("{scope}: unexpected outcome {other} in {a:?}"),
            }
        }
        let applied = history.len() as u64 - 1;
        applied_total += applied;
        ensure!(applied > 0, "{scope}: nothing applied");
        ensure!(
            history.keys().copied().eq(0..=applied),
            "{scope}: versions have gaps: {:?}",
            history.keys()
        );
        let tokens: Vec<Token> = history.values().skip(1).map(|(t, _)| *t).collect();
        ensure!(
            tokens.windows(2).all(|w| w[0].grant_order(&w[1]).is_lt()),
            "{scope}: applied tokens do not increase: {tokens:?}"
        );

        let mut last_seen: BTreeMap<u64, u64> = BTreeMap::new();
        let mut tokens_sent: HashSet<(u64, Token)> = HashSet::new();
        for a in &mine {
            for (when, (version, object)) in [("before", a.before), ("after", a.after)] {
                let Some((_, expected)) = history.get(&version) else {
                    bail!("{scope}: saw version {version} that no attempt applied ({when}, {a:?})");
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
            let (seen_token, _) = history[&a.before.0];
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
        let (top_token, top_object) = history[&applied];
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
