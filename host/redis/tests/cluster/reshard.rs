//! Resharding with writers running: `redis-cli --cluster reshard` and
//! `redis-cli --cluster rebalance` move slots (MIGRATE) while 8 writers
//! write through the fence; the history they record is checked afterwards.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use anyhow::{Context, Result, bail, ensure};

use crate::cluster::Cluster;
use crate::common::{Value, kinds};

const WRITERS: usize = 8;
const SCOPES: usize = 16;
/// Slots moved: the first ones of the first master, where the scopes are
/// (the rebalance moves them first).
const MOVED_SLOTS: u16 = 300;
/// Writes each writer makes after the move ended (its stale map then
/// meets MOVED), and at most in all.
const AFTER: u64 = 20;
const CAP: u64 = 20_000;

/// One answered write: scope, token counter, `Some(version)` if applied.
type Event = (usize, u64, Option<i64>);

/// While 300 slots holding 16 scopes move from one master to another, 8
/// writers send FENCE.SET with tokens drawn from one counter: per scope the
/// applied writes have versions 1..n without gap or repeat and tokens
/// increasing with the version (no stale write applied), every refusal is
/// STALEFENCE, and afterwards each scope's data is the value of its last
/// applied write and its mark's version is n (mark and data moved together,
/// no applied write lost). The writers met MOVED after the move.
#[test]
fn reshard_under_writers() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        reshard(&cluster).with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

/// While `redis-cli --cluster rebalance --cluster-weight <a>=0` drains one
/// master (all its 5461 slots to the two other masters, first the 300
/// holding 16 scopes), 8 writers send FENCE.SET: the same history checks
/// as the reshard (versions 1..n without gap, tokens increasing, refusals
/// only STALEFENCE, data = last applied value, mark version n, MOVED met),
/// and afterwards the drained master serves no slot.
#[test]
fn rebalance_under_writers() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        rebalance(&cluster).with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

/// `SCOPES` names whose slots `within` accepts.
fn scopes_in(within: impl Fn(u16) -> bool) -> Result<Vec<String>> {
    let scopes: Vec<String> = (0..100_000)
        .map(|i| format!("w{i}"))
        .filter(|n| within(fencecheck_redis::slot(n.as_bytes())))
        .take(SCOPES)
        .collect();
    ensure!(scopes.len() == SCOPES);
    Ok(scopes)
}

fn reshard(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    let (a, b) = (&masters[0], &masters[1]);
    ensure!(a.ranges.first().map(|r| r.0) == Some(0), "{a:?}");
    let scopes = scopes_in(|slot| slot < MOVED_SLOTS)?;
    under_writers(cluster, &scopes, || {
        cluster.cli(
            a.port,
            &[
                "reshard",
                "--cluster-from",
                &a.id,
                "--cluster-to",
                &b.id,
                "--cluster-slots",
                &MOVED_SLOTS.to_string(),
                "--cluster-yes",
                // One key per MIGRATE: a scope's data and state key move
                // apart (with the default 10, a slot's few keys move at once).
                "--cluster-pipeline",
                "1",
            ],
        )
    })?;
    for scope in &scopes {
        ensure!(
            cluster
                .master_of(fencecheck_redis::slot(scope.as_bytes()))?
                .port
                == b.port
        );
    }
    Ok(())
}

fn rebalance(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    let a = &masters[0];
    ensure!(
        a.ranges
            .first()
            .is_some_and(|r| r.0 == 0 && r.1 >= MOVED_SLOTS),
        "{a:?}"
    );
    // The rebalance hands a master's slots over in order: these move
    // first, while the writers run (on Valkey 8 a whole drain under 8
    // writers starves the replicas, and a SETSLOT that waits for them
    // answers NOREPLICAS).
    let scopes = scopes_in(|slot| slot < MOVED_SLOTS)?;
    let weight = format!("{}=0", a.id);
    under_writers(cluster, &scopes, || {
        cluster.cli(
            a.port,
            &[
                "rebalance",
                "--cluster-weight",
                &weight,
                "--cluster-yes",
                "--cluster-pipeline",
                "1",
            ],
        )
    })?;
    let now = cluster.masters()?;
    ensure!(
        now.iter().all(|m| m.id != a.id),
        "the drained master still serves slots: {now:?}"
    );
    for scope in &scopes {
        let owner = cluster.master_of(fencecheck_redis::slot(scope.as_bytes()))?;
        ensure!(owner.id != a.id, "{scope} still on the drained master");
    }
    Ok(())
}

/// Run `mover` (a `redis-cli --cluster` command moving the slots of
/// `scopes`) while 8 writers write them; then check the history they
/// recorded and each scope's data and mark.
fn under_writers(
    cluster: &Cluster,
    scopes: &[String],
    mover: impl FnOnce() -> Result<String>,
) -> Result<()> {
    let scopes = Arc::new(scopes.to_vec());
    let counter = Arc::new(AtomicU64::new(1));
    let done = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(WRITERS + 1));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let mut client = cluster.client()?;
        let (scopes, counter, done, start) =
            (scopes.clone(), counter.clone(), done.clone(), start.clone());
        writers.push(std::thread::spawn(move || -> Result<(Vec<Event>, u64)> {
            let mut events = Vec::new();
            let mut after = 0;
            start.wait();
            for i in 0..CAP {
                if done.load(Ordering::SeqCst) {
                    after += 1;
                    if after > AFTER {
                        break;
                    }
                }
                let s = (w + i as usize * 7) % SCOPES;
                let n = counter.fetch_add(1, Ordering::SeqCst);
                let token = format!("0.{n}");
                let r = client.cmd(
                    scopes[s].as_bytes(),
                    &["FENCE.SET", &scopes[s], &token, &token],
                )?;
                match (r.error(), r.items()) {
                    (None, [Value::Simple(k), Value::Int(v)]) if k == "applied" => {
                        events.push((s, n, Some(*v)));
                    }
                    (Some(e), _) if e.starts_with("STALEFENCE") => events.push((s, n, None)),
                    // Retries ran out mid-move: unanswered, neither applied nor refused.
                    (Some(e), _) if e.starts_with("TRYAGAIN") => {}
                    _ => bail!("writer {w}: {r:?}"),
                }
            }
            Ok((events, client.redirects.moved))
        }));
    }
    start.wait();
    let began = std::time::Instant::now();
    let moved = mover();
    let took = began.elapsed();
    done.store(true, Ordering::SeqCst);
    let mut events = Vec::new();
    let mut redirected = 0;
    for w in writers {
        let (e, m) = w
            .join()
            .map_err(|_| anyhow::anyhow!("a writer panicked"))??;
        events.extend(e);
        redirected += m;
    }
    moved?;
    eprintln!(
        "{:?}: slots moved in {took:.1?}; {} writes answered, {} applied; {redirected} MOVED",
        cluster.kind,
        events.len(),
        events.iter().filter(|e| e.2.is_some()).count()
    );
    cluster.wait_ok()?;
    ensure!(redirected > 0, "no writer met MOVED after the move");
    let mut client = cluster.client()?;
    for (s, scope) in scopes.iter().enumerate() {
        let mut applied: Vec<(i64, u64)> = events
            .iter()
            .filter(|e| e.0 == s)
            .filter_map(|e| e.2.map(|v| (v, e.1)))
            .collect();
        applied.sort_unstable();
        ensure!(!applied.is_empty(), "{scope}: nothing applied");
        for (i, w) in applied.iter().enumerate() {
            ensure!(w.0 == i as i64 + 1, "{scope}: versions {applied:?}");
        }
        ensure!(
            applied.windows(2).all(|w| w[0].1 < w[1].1),
            "{scope}: a stale token applied: {applied:?}"
        );
        let (last_version, last) = *applied.last().context("last")?;
        let data = client.ok(scope.as_bytes(), &["GET", scope])?.text();
        ensure!(
            data == Some(format!("0.{last}")),
            "{scope}: data {data:?}, last applied 0.{last}"
        );
        // The mark moved with the data: the next token gets version n+1.
        let next = client.ok(
            scope.as_bytes(),
            &["FENCE.CHECK", scope, &format!("0.{}", u64::MAX / 2)],
        )?;
        ensure!(
            next.items().get(1) == Some(&Value::Int(last_version + 1)),
            "{scope}: mark {next:?}, {last_version} applied"
        );
    }
    Ok(())
}
