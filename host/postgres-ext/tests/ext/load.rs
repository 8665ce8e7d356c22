//! 16 concurrent clients on 4 scopes of a fenced table: current, stale,
//! duplicated and reordered writers, with `pg_ctl stop -m immediate` in the
//! middle of the load. Every attempt is recorded and the history is checked
//! per scope against what the database kept.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;

use crate::common::{protected_catalog, server};
use anyhow::{Context, Result, ensure};
use fencecheck::Token;
use fencecheck_tests::history::{self, Attempt, Audited, Kept, Rng, Seen};
use fencecheck_tests::pgserver::connect_retrying;

const CLIENTS: usize = 16;
const SCOPES: usize = 4;
const OPS_PER_CLIENT: usize = 120;

fn scope_name(i: usize) -> String {
    format!("scope-{i}")
}

fn token(counter: u64) -> Token {
    Token {
        authority: 0,
        epoch: 1,
        counter,
    }
}

fn token_text(t: &Token) -> String {
    format!("{}.{}", t.epoch, t.counter)
}

/// One fenced write and its audit row, in one transaction; the guards in
/// the transaction-local settings.
fn attempt(db: &mut postgres::Client, a: &Attempt) -> Seen {
    let result = (|| -> Result<i64, postgres::Error> {
        let mut tx = db.transaction()?;
        tx.execute(
            "SELECT set_config('fencecheck.op_id', $1, true),
                    set_config('fencecheck.expected_version', $2, true)",
            &[
                &a.op_id.clone().unwrap_or_default(),
                &a.expected_version
                    .map(|v| v.to_string())
                    .unwrap_or_default(),
            ],
        )?;
        let version: i64 = tx
            .query_one(
                "WITH u AS (
                   UPDATE report_catalog SET visible_object = $1, fence_token = $2
                    WHERE report_id = $3
                   RETURNING report_id, visible_object, fence_token,
                             (fence_inspect(fence_state)->>'version')::bigint AS version)
                 INSERT INTO audit (scope, payload, token, version)
                 SELECT report_id, visible_object, fence_token, version FROM u
                 RETURNING version",
                &[&a.payload, &token_text(&a.token), &a.scope],
            )?
            .get(0);
        tx.commit()?;
        Ok(version)
    })();
    match result {
        Ok(v) => Seen::Applied(v.unsigned_abs()),
        Err(e) => match e.code().map(|c| c.code().to_string()) {
            Some(code) if code.starts_with("5F") => Seen::Refused(code),
            _ => Seen::Unknown,
        },
    }
}

/// Writers of all four kinds under load, the server killed mid-run and
/// restarted: per scope, applied tokens never decrease, versions are
/// contiguous, every acknowledged write is in the audit log at its version,
/// no refused write left a trace, and the row is the last audited write.
#[test]
fn concurrent_writers_across_a_crash_keep_the_fence() -> Result<()> {
    let (server, mut db) = server()?;
    protected_catalog(&mut db, "allow-equal")?;
    db.batch_execute(
        "CREATE TABLE audit (scope text NOT NULL, payload text NOT NULL UNIQUE,
                             token text NOT NULL, version bigint NOT NULL,
                             UNIQUE (scope, version));",
    )?;
    // Each scope starts at version 1 under token 1.1, audited like any write.
    let issued: Arc<Vec<AtomicU64>> = Arc::new((0..SCOPES).map(|_| AtomicU64::new(1)).collect());
    for s in 0..SCOPES {
        db.execute(
            "INSERT INTO report_catalog (report_id, visible_object, fence_token) VALUES ($1, $2, '1.1')",
            &[&scope_name(s), &format!("init-{s}")],
        )?;
        db.execute(
            "INSERT INTO audit VALUES ($1, $2, '1.1', 1)",
            &[&scope_name(s), &format!("init-{s}")],
        )?;
    }

    let history = Arc::new(Mutex::new(Vec::<Attempt>::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let (half_tx, half) = mpsc::channel::<()>();
    let url = server.url();
    let mut workers = Vec::new();
    for c in 0..CLIENTS {
        let (issued, history, done, half_tx, url) = (
            issued.clone(),
            history.clone(),
            done.clone(),
            half_tx.clone(),
            url.clone(),
        );
        workers.push(thread::spawn(move || -> Result<()> {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (c as u64 + 1));
            let mut db = connect_retrying(&url)?;
            let mut mine: Vec<Attempt> = Vec::new();
            for op in 0..OPS_PER_CLIENT {
                let s = rng.below(SCOPES as u64) as usize;
                let scope = scope_name(s);
                let payload = format!("c{c}-op{op}");
                let fresh = || token(issued[s].fetch_add(1, Ordering::SeqCst) + 1);
                let mut batch = Vec::new();
                match rng.below(4) {
                    // Current: a newly issued token, above every earlier one.
                    0 => batch.push(Attempt {
                        client: c,
                        scope,
                        token: fresh(),
                        op_id: Some(payload.clone()),
                        expected_version: None,
                        payload,
                        seen: Seen::Unknown,
                    }),
                    // Stale: an older token (delayed or paused writer).
                    1 => {
                        let now = issued[s].load(Ordering::SeqCst);
                        batch.push(Attempt {
                            client: c,
                            scope,
                            token: token(now.saturating_sub(1 + rng.below(3)).max(1)),
                            op_id: Some(payload.clone()),
                            expected_version: None,
                            payload,
                            seen: Seen::Unknown,
                        });
                    }
                    // Duplicate: resend an earlier write of this client.
                    2 => match mine.iter().rev().find(|a| a.scope == scope) {
                        Some(prev) => batch.push(Attempt {
                            payload: format!("{payload}-dup"),
                            seen: Seen::Unknown,
                            ..prev.clone()
                        }),
                        None => continue,
                    },
                    // Reordered: two writes under one token, guarded by the
                    // version they expect, delivered in the wrong order.
                    _ => {
                        let token = fresh();
                        let v: u64 = db
                            .query_one(
                                "SELECT (fence_inspect(fence_state)->>'version')::bigint
                                   FROM report_catalog WHERE report_id = $1",
                                &[&scope],
                            )
                            .map(|r| r.get::<_, i64>(0).unsigned_abs())
                            .unwrap_or(0);
                        for (k, expected) in [(2, v + 1), (1, v)] {
                            batch.push(Attempt {
                                client: c,
                                scope: scope.clone(),
                                token,
                                op_id: None,
                                expected_version: Some(expected),
                                payload: format!("{payload}-w{k}"),
                                seen: Seen::Unknown,
                            });
                        }
                    }
                }
                for mut a in batch {
                    a.seen = attempt(&mut db, &a);
                    if a.seen == Seen::Unknown {
                        db = connect_retrying(&url)?;
                    }
                    mine.push(a);
                }
                if done.fetch_add(1, Ordering::SeqCst) + 1 == CLIENTS * OPS_PER_CLIENT / 2 {
                    let _ = half_tx.send(());
                }
            }
            history
                .lock()
                .map_err(|_| anyhow::anyhow!("poisoned"))?
                .extend(mine);
            Ok(())
        }));
    }
    drop(half_tx);
    // Halfway through: kill every backend without a checkpoint, restart.
    half.recv().context("no client reached the halfway mark")?;
    server.stop_immediate()?;
    server.pg_ctl_start()?;
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
    }

    let mut db = connect_retrying(&server.url())?;
    let history = history
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let kept = kept(&mut db)?;
    let summary = history::check(&history, &kept).map_err(|e| e.context(server.log()))?;
    eprintln!("history: {summary:?}");
    ensure!(
        summary.applied > 100 && summary.refused > 100,
        "a load with both outcomes: {summary:?}"
    );
    for a in &history {
        if let Seen::Refused(code) = &a.seen {
            ensure!(
                ["5F001", "5F002", "5F003"].contains(&code.as_str()),
                "unexpected refusal {a:?}"
            );
        }
    }
    Ok(())
}

/// The audit log and each row's current value, as the checker wants them.
fn kept(db: &mut postgres::Client) -> Result<Kept> {
    let mut kept = Kept::default();
    for r in db.query("SELECT scope, version, payload, token FROM audit", &[])? {
        let text: String = r.get(3);
        let counter = text
            .strip_prefix("1.")
            .and_then(|c| c.parse().ok())
            .context("audited token")?;
        let version: i64 = r.get(1);
        kept.audit.entry(r.get(0)).or_default().insert(
            version.unsigned_abs(),
            Audited {
                payload: r.get(2),
                token: token(counter),
            },
        );
    }
    for r in db.query(
        "SELECT report_id, (fence_inspect(fence_state)->>'version')::bigint, visible_object
           FROM report_catalog",
        &[],
    )? {
        let version: i64 = r.get(1);
        kept.finals
            .insert(r.get(0), (version.unsigned_abs(), r.get(2)));
    }
    Ok(kept)
}
