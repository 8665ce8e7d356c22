//! 32 concurrent clients over 10 scopes through the adapter: current,
//! stale, duplicated and reordered writers, the server killed with
//! `pg_ctl stop -m immediate` halfway and restarted; the recorded history is
//! checked per scope by the shared checker (tests/support/history.rs).
//! Once through `fenced_write`, once through `fenced_execute` with a cache
//! per client (32 writers on 10 scopes: caches go stale all the time).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;

use anyhow::{Context, Result, ensure};
use fencecheck::{Policy, Request, Token, TokenText};
use fencecheck_postgres::{Error, Fenced, StateCache, fenced_execute, fenced_write, install};
use fencecheck_tests::history::{self, Attempt, Audited, Kept, Rng, Seen};
use fencecheck_tests::pgserver::PgServer;
use fencecheck_tests::pgserver::connect_retrying;

const CLIENTS: usize = 32;
const SCOPES: usize = 10;
const OPS_PER_CLIENT: usize = 100;

fn token(counter: u64) -> Token {
    Token {
        authority: 0,
        epoch: 1,
        counter,
    }
}

/// The version an applied write produced (what the history records).
fn version_only<T>(fenced: Fenced<T>) -> Fenced<()> {
    match fenced {
        Fenced::Applied {
            version, highest, ..
        } => Fenced::Applied {
            version,
            highest,
            value: (),
        },
        Fenced::Rejected(r) => Fenced::Rejected(r),
    }
}

// `fenced_execute`'s one statement: the catalog row and the audit row.
const PUBLISH: &str = "WITH catalog AS (
        INSERT INTO report_catalog VALUES ($1, $2) ON CONFLICT (report_id)
        DO UPDATE SET visible_object = EXCLUDED.visible_object)
    INSERT INTO audit VALUES ($1, (SELECT version FROM fencecheck_accepted), $2, $3)";

/// One attempt: the mutation sets the catalog row and appends the audit
/// row, in the fenced transaction (`fenced_write`), or in one statement
/// when `cache` is given (`fenced_execute`).
fn attempt(
    db: &mut postgres::Client,
    guest: &mut fencecheck::Instance,
    cache: Option<&mut StateCache>,
    a: &Attempt,
) -> Seen {
    let policy = if a.op_id.is_some() || a.expected_version.is_some() {
        Policy::AllowEqual
    } else {
        Policy::Strict
    };
    let mut request = Request::new(a.scope.as_str(), a.token, policy);
    if let Some(op) = &a.op_id {
        request = request.with_op_id(op.as_str());
    }
    if let Some(v) = a.expected_version {
        request = request.with_expected_version(v);
    }
    let token_text = TokenText(a.token).to_string();
    let result = if let Some(cache) = cache {
        fenced_execute(
            db,
            guest,
            cache,
            &request,
            PUBLISH,
            &[&a.scope, &a.payload, &token_text],
        )
        .map(version_only)
    } else {
        fenced_write(db, guest, &request, |tx, accepted| {
            tx.execute(
                "INSERT INTO report_catalog VALUES ($1, $2) ON CONFLICT (report_id)
             DO UPDATE SET visible_object = EXCLUDED.visible_object",
                &[&a.scope, &a.payload],
            )?;
            tx.execute(
                "INSERT INTO audit VALUES ($1, $2, $3, $4)",
                &[
                    &a.scope,
                    &(accepted.version as i64),
                    &a.payload,
                    &token_text,
                ],
            )
        })
        .map(version_only)
    };
    match result {
        Ok(Fenced::Applied { version, .. }) => Seen::Applied(version),
        Ok(Fenced::Rejected(r)) => Seen::Refused(r.name().into()),
        // Rolled back for certain: nothing of it may be visible.
        Err(e @ (Error::Postgres { .. } | Error::Mutation(_))) => {
            Seen::Refused(format!("error: {e}"))
        }
        Err(_) => Seen::Unknown,
    }
}

/// The history of thousands of `fenced_write`s, with a crash in the
/// middle, passes every rule of the shared checker.
#[test]
fn thirty_two_clients_across_a_crash() -> Result<()> {
    history_across_a_crash(false)
}

/// The same through `fenced_execute` (one statement when a client's cache
/// is current, the locking path otherwise): every rule holds.
#[test]
fn thirty_two_cached_clients_across_a_crash() -> Result<()> {
    history_across_a_crash(true)
}

fn history_across_a_crash(cached: bool) -> Result<()> {
    let server = PgServer::start()?;
    let mut db = server.client()?;
    install(&mut db)?;
    db.batch_execute(
        "CREATE TABLE report_catalog (report_id text PRIMARY KEY, visible_object text NOT NULL);
         CREATE TABLE audit (scope text NOT NULL, version bigint NOT NULL,
                             payload text NOT NULL UNIQUE, token text NOT NULL,
                             PRIMARY KEY (scope, version));",
    )?;
    let issued: Arc<Vec<AtomicU64>> = Arc::new((0..SCOPES).map(|_| AtomicU64::new(0)).collect());
    let history = Arc::new(Mutex::new(Vec::<Attempt>::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let (half_tx, half) = mpsc::channel::<()>();
    let mut workers = Vec::new();
    for c in 0..CLIENTS {
        let (issued, history, done, half_tx, url) = (
            issued.clone(),
            history.clone(),
            done.clone(),
            half_tx.clone(),
            server.url(),
        );
        workers.push(thread::spawn(move || -> Result<()> {
            let mut rng = Rng(0xD1B5_4A32_D192_ED03 ^ (c as u64 + 1));
            let mut db = connect_retrying(&url)?;
            let mut cache = StateCache::new();
            let mut guest = fencecheck_tests::runtime()?.instance()?;
            let mut mine: Vec<Attempt> = Vec::new();
            for op in 0..OPS_PER_CLIENT {
                let s = rng.below(SCOPES as u64) as usize;
                let scope = format!("scope-{s}");
                let payload = format!("c{c}-op{op}");
                let fresh = || token(issued[s].fetch_add(1, Ordering::SeqCst) + 1);
                let base = Attempt {
                    client: c,
                    scope: scope.clone(),
                    token: token(1),
                    op_id: None,
                    expected_version: None,
                    payload: payload.clone(),
                    seen: Seen::Unknown,
                };
                let batch = match rng.below(4) {
                    0 => vec![Attempt {
                        token: fresh(),
                        ..base
                    }],
                    1 => {
                        let now = issued[s].load(Ordering::SeqCst);
                        vec![Attempt {
                            token: token(now.saturating_sub(rng.below(3)).max(1)),
                            ..base
                        }]
                    }
                    2 => match mine
                        .iter()
                        .rev()
                        .find(|a| a.scope == scope && a.op_id.is_some())
                    {
                        Some(prev) => vec![Attempt {
                            payload: format!("{payload}-dup"),
                            seen: Seen::Unknown,
                            ..prev.clone()
                        }],
                        None => vec![Attempt {
                            token: fresh(),
                            op_id: Some(payload.clone()),
                            ..base
                        }],
                    },
                    _ => {
                        let t = fresh();
                        let v = db
                            .query_opt(
                                "SELECT version FROM fencecheck_scopes WHERE scope = $1",
                                &[&scope],
                            )
                            .ok()
                            .flatten()
                            .map_or(0, |r| r.get::<_, i64>(0).unsigned_abs());
                        vec![
                            Attempt {
                                token: t,
                                expected_version: Some(v + 1),
                                payload: format!("{payload}-w2"),
                                ..base.clone()
                            },
                            Attempt {
                                token: t,
                                expected_version: Some(v),
                                payload: format!("{payload}-w1"),
                                ..base
                            },
                        ]
                    }
                };
                for mut a in batch {
                    a.seen = attempt(&mut db, &mut guest, cached.then_some(&mut cache), &a);
                    if db.is_closed()
                        || matches!(a.seen, Seen::Unknown)
                        || matches!(&a.seen, Seen::Refused(w) if w.starts_with("error"))
                    {
                        db = connect_retrying(&url)?;
                        // Its prepared statements were the old connection's.
                        cache = StateCache::new();
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
    half.recv().context("no client reached the halfway mark")?;
    server.stop_immediate()?;
    server.pg_ctl_start()?;
    for w in workers {
        w.join()
            .map_err(|_| anyhow::anyhow!("a client panicked"))??;
    }
    let history = history
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let mut db = connect_retrying(&server.url())?;
    let mut kept = Kept::default();
    for r in db.query("SELECT scope, version, payload, token FROM audit", &[])? {
        let text: String = r.get(3);
        let version: i64 = r.get(1);
        kept.audit.entry(r.get(0)).or_default().insert(
            version.unsigned_abs(),
            Audited {
                payload: r.get(2),
                token: text.parse::<TokenText>()?.0,
            },
        );
    }
    for r in db.query(
        "SELECT s.scope, s.version, c.visible_object FROM fencecheck_scopes s
           JOIN report_catalog c ON c.report_id = s.scope",
        &[],
    )? {
        let version: i64 = r.get(1);
        kept.finals
            .insert(r.get(0), (version.unsigned_abs(), r.get(2)));
    }
    let summary = history::check(&history, &kept)?;
    eprintln!("history (cached: {cached}): {summary:?}");
    ensure!(
        summary.applied > 200 && summary.refused > 200,
        "{summary:?}"
    );
    Ok(())
}
