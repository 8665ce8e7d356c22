//! Coordinator client processes (`fencecheck-etcd-client`) on one lock of a
//! test etcd cluster, what they report, and the checks over it: shared by
//! the process tests (loopback) and the nemesis tests (network namespaces:
//! each client in a namespace of its own, after the members' nodes).
#![allow(dead_code)] // each test binary uses a different subset

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use fencecheck::{Runtime, Token};
use fencecheck_authority::{
    AcquireOutcome, Clock, Coordinator, EtcdCoordinator, ManualClock, SystemClock,
};
use fencecheck_tests::history::check_issued;

use crate::etcd::Cluster;
use crate::lease_history;

pub const LOCK: &str = "jobs/nightly";
/// How long one step of a test may take to show progress (generous: a bound,
/// not a performance claim).
pub const PROGRESS_WITHIN: Duration = Duration::from_secs(60);

/// One successful acquisition, as a client process reported it.
#[derive(Clone, Debug)]
pub struct Grant {
    pub process: usize,
    pub lease_id: String,
    pub token: Token,
    /// CLOCK_MONOTONIC just before the acquire request was sent.
    pub start: u128,
    /// CLOCK_MONOTONIC just after the grant was received.
    pub end: u128,
}

/// What the client processes said, line by line.
#[derive(Default)]
pub struct Tally {
    pub grants: Vec<Grant>,
    pub busy: usize,
    pub errors: Vec<String>,
    /// Lease ids of acquisitions that failed: their outcome is unknown.
    pub unknown: Vec<String>,
    pub release_errors: usize,
    pub done: Vec<usize>,
    /// When each lease's release request was sent (CLOCK_MONOTONIC).
    pub released_at: HashMap<String, u128>,
    /// Writes through the fence (`--resource`), in the order reported.
    pub writes: Vec<Write>,
    /// How many leases were paused past their end before writing.
    pub pauses: usize,
    /// When each successful renewal was sent, by lease.
    pub renewed_at: HashMap<String, u128>,
    /// Renewals answered `lost` (or failed).
    pub renewals_lost: usize,
}

/// One write through the fence, as a client reported it.
#[derive(Clone, Debug)]
pub struct Write {
    pub process: usize,
    pub lease_id: String,
    /// 1 for the lease's first write, 2 for its second, ….
    pub n: u64,
    /// `applied`, `stale` or `error`.
    pub outcome: String,
    pub start: u128,
    pub end: u128,
}

/// The running client processes and the lines they printed so far.
pub struct Clients {
    children: Vec<Child>,
    lines: Receiver<(usize, String)>,
    tally: Tally,
    stop_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl Clients {
    /// Start `n` client processes on `cluster`, each for at most `cycles`
    /// acquisitions (and 120 s), all on the same lock.
    pub fn spawn(cluster: &Cluster, n: usize, cycles: u64) -> Result<Self> {
        Self::spawn_with(cluster, n, cycles, 120, &[])
    }

    /// [`Clients::spawn`], each client stopping after `seconds` at most and
    /// given `extra` arguments (e.g. `--resource PATH`).
    pub fn spawn_with(
        cluster: &Cluster,
        n: usize,
        cycles: u64,
        seconds: u64,
        extra: &[String],
    ) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("fencecheck-clients-")
            .tempdir()?;
        let stop_file = dir.path().join("stop");
        let (tx, lines) = channel();
        let mut clients = Self {
            children: Vec::new(),
            lines,
            tally: Tally::default(),
            stop_file,
            _dir: dir,
        };
        let binary = env!("CARGO_BIN_EXE_fencecheck-etcd-client");
        for process in 0..n {
            let mut command = match cluster.net() {
                Some(net) => {
                    ensure!(
                        cluster.size() + process < net.size(),
                        "no node for client {process}"
                    );
                    net.command(cluster.size() + process, binary)
                }
                None => Command::new(binary),
            };
            let mut child = command
                .args(["--endpoints", &cluster.endpoints().join(",")])
                .args(["--lock", LOCK, "--name", &format!("p{process}")])
                .args(["--ttl-ms", "1000", "--timeout-ms", "1000"])
                .args([
                    "--cycles",
                    &cycles.to_string(),
                    "--seconds",
                    &seconds.to_string(),
                ])
                .arg("--stop-file")
                .arg(&clients.stop_file)
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .context("spawning fencecheck-etcd-client")?;
            let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
            clients.children.push(child);
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((process, line)).is_err() {
                        break;
                    }
                }
            });
        }
        Ok(clients)
    }

    fn record(&mut self, process: usize, line: &str) -> Result<()> {
        let words: Vec<&str> = line.split(' ').collect();
        match words.as_slice() {
            ["grant", lease_id, authority, epoch, counter, start, end] => {
                self.tally.grants.push(Grant {
                    process,
                    lease_id: (*lease_id).to_owned(),
                    token: Token::new(authority.parse()?, epoch.parse()?, counter.parse()?),
                    start: start.parse()?,
                    end: end.parse()?,
                });
            }
            ["release", lease_id, outcome, start] => {
                if *outcome == "error" {
                    self.tally.release_errors += 1;
                }
                self.tally
                    .released_at
                    .insert((*lease_id).to_owned(), start.parse()?);
            }
            ["write", lease_id, n, outcome, start, end] => self.tally.writes.push(Write {
                process,
                lease_id: (*lease_id).to_owned(),
                n: n.parse()?,
                outcome: (*outcome).to_owned(),
                start: start.parse()?,
                end: end.parse()?,
            }),
            ["pause", _, _] => self.tally.pauses += 1,
            ["renew", lease_id, "renewed", start] => {
                self.tally
                    .renewed_at
                    .insert((*lease_id).to_owned(), start.parse()?);
            }
            ["renew", _, "lost" | "error", _] => self.tally.renewals_lost += 1,
            ["busy"] => self.tally.busy += 1,
            ["error", lease_id, ..] => {
                self.tally.unknown.push((*lease_id).to_owned());
                self.tally.errors.push(line.to_owned());
            }
            ["done", cycles] => self.tally.done.push(cycles.parse()?),
            _ => bail!("process {process} printed an unexpected line: {line:?}"),
        }
        Ok(())
    }

    /// Wait (bounded) until `more` grants beyond those seen so far arrive.
    pub fn wait_grants(&mut self, more: usize, what: &str) -> Result<()> {
        let target = self.tally.grants.len() + more;
        let deadline = Instant::now() + PROGRESS_WITHIN;
        while self.tally.grants.len() < target {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((process, line)) => self.record(process, &line)?,
                Err(RecvTimeoutError::Timeout) => bail!(
                    "{what}: only {} of {target} grants within {PROGRESS_WITHIN:?} (errors: {:?})",
                    self.tally.grants.len(),
                    self.tally.errors.iter().rev().take(5).collect::<Vec<_>>()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    bail!("{what}: the clients exited early: {:?}", self.tally.done)
                }
            }
        }
        Ok(())
    }

    /// Ask the clients to stop, wait (bounded) for them, and return everything
    /// they reported. Every client must exit cleanly and say `done`.
    pub fn finish(mut self) -> Result<Tally> {
        std::fs::write(&self.stop_file, b"stop")?;
        let deadline = Instant::now() + PROGRESS_WITHIN;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok((process, line)) => self.record(process, &line)?,
                // Every reader thread ended: every client closed stdout.
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => bail!("the clients did not stop"),
            }
        }
        for (i, child) in self.children.iter_mut().enumerate() {
            let status = child.wait()?;
            ensure!(status.success(), "client {i} failed: {status}");
        }
        ensure!(
            self.tally.done.len() == self.children.len(),
            "not every client finished: {:?}",
            self.tally.done
        );
        Ok(std::mem::take(&mut self.tally))
    }
}

impl Drop for Clients {
    fn drop(&mut self) {
        for child in &mut self.children {
            if let Ok(None) = child.try_wait() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// The token-history invariants over every process's grants: one
/// authority, distinct tokens, and a grant whose request started after
/// another grant was received carries a greater token. Returns how many
/// ordered pairs across different processes were checked (so a caller can
/// require real interleaving).
pub fn check_history(grants: &[Grant], authority: u64) -> Result<usize> {
    let mut seen = HashSet::new();
    for g in grants {
        ensure!(g.token.authority == authority, "foreign authority: {g:?}");
        ensure!(g.start <= g.end, "clock went backwards: {g:?}");
        ensure!(
            seen.insert((g.token.epoch, g.token.counter)),
            "token {}.{} granted twice (second time to {}: {g:?})",
            g.token.epoch,
            g.token.counter,
            g.lease_id
        );
    }
    // Sweep: grants by request start; received grants by end. For each grant,
    // the greatest token received before its request started must be smaller.
    let mut by_start: Vec<&Grant> = grants.iter().collect();
    by_start.sort_by_key(|g| g.start);
    let mut by_end: Vec<&Grant> = grants.iter().collect();
    by_end.sort_by_key(|g| g.end);
    let mut before: Option<&Grant> = None; // the greatest token received so far
    let mut received = 0;
    let mut cross = 0;
    let mut last_process_seen = HashSet::new();
    for b in by_start {
        while received < by_end.len() && by_end[received].end < b.start {
            let a = by_end[received];
            last_process_seen.insert(a.process);
            if before.is_none_or(|m| a.token.grant_order(&m.token).is_gt()) {
                before = Some(a);
            }
            received += 1;
        }
        if let Some(a) = before {
            ensure!(
                b.token.grant_order(&a.token).is_gt(),
                "token went backwards: {b:?} was requested after {a:?} was granted"
            );
            if last_process_seen.iter().any(|&p| p != b.process) {
                cross += 1;
            }
        }
    }
    Ok(cross)
}

/// The grants etcd committed, in revision order, pass `check_issued`; each
/// acknowledged grant is committed with the token its client was told, and
/// each committed grant was acknowledged or its acquire failed (unknown).
/// Returns how many grants were committed.
pub fn check_store(cluster: &Cluster, tally: &Tally) -> Result<usize> {
    let states = || lease_history::etcd_states(&cluster.endpoint(0), LOCK);
    let states = match cluster.net() {
        Some(net) => net.run_in(cluster.node(0), states)?,
        None => states()?,
    };
    let stored = lease_history::grants(&states)?;
    check_issued(&lease_history::issued(&stored))?;
    let acked: Vec<(String, String, Token)> = tally
        .grants
        .iter()
        .map(|g| (LOCK.to_owned(), g.lease_id.clone(), g.token))
        .collect();
    lease_history::account(&acked, &tally.unknown, &stored)?;
    Ok(stored.len())
}

/// After the clients: a new acquisition (on a clock past every client lease)
/// must still be above every recorded token.
pub fn next_grant_is_above(cluster: &Cluster, grants: &[Grant]) -> Result<()> {
    let far = Arc::new(ManualClock::new(SystemClock.now_ms() + 3_600_000));
    let acquire = || {
        let c = EtcdCoordinator::connect(cluster.endpoints(), Runtime::new()?, far)?;
        Ok(c.acquire(LOCK, "after-all", 1_000)?)
    };
    let outcome = match cluster.net() {
        Some(net) => net.run_in(cluster.node(0), acquire)?,
        None => acquire()?,
    };
    let AcquireOutcome::Acquired(next) = outcome else {
        bail!("the lock is still held an hour later");
    };
    for g in grants {
        ensure!(
            next.token.grant_order(&g.token).is_gt(),
            "{next:?} not above {g:?}"
        );
    }
    Ok(())
}

pub fn summary(what: &str, t: &Tally, cross: usize, committed: usize) {
    eprintln!(
        "{what}: {} grants ({} committed, {} cross-process ordered), {} busy, {} acquire errors, {} release errors, cycles {:?}",
        t.grants.len(),
        committed,
        cross,
        t.busy,
        t.errors.len(),
        t.release_errors,
        t.done
    );
}

/// What the fenced writes showed (see [`check_fenced_writes`]).
#[derive(Debug)]
pub struct WriteSummary {
    pub applied: usize,
    pub stale: usize,
    pub errors: usize,
    /// The closest two different leases came to being believed held at
    /// once, in microseconds (negative would be an overlap, which fails).
    pub closest_us: Option<i128>,
}

/// The resource side of a run with `--resource`:
/// - every client told `stale-fence` stopped: no later write under that lease;
/// - the resource's log of applied writes, in commit order, never goes
///   below a token it already applied (no write below an applied token
///   became visible), holds every write a client was told was applied, and
///   none it was told was stale;
/// - no two leases were believed held at once: a client believes from the
///   grant's answer until `ttl` after its request was sent or until it sent
///   the release, whichever is first (the conservative deadline).
pub fn check_fenced_writes(
    tally: &Tally,
    resource: &std::path::Path,
    ttl_ms: u64,
) -> Result<WriteSummary> {
    let mut stopped = HashSet::new();
    for w in &tally.writes {
        ensure!(
            !stopped.contains(&w.lease_id),
            "{} wrote after it was told stale-fence: {w:?}",
            w.lease_id
        );
        if w.outcome == "stale" {
            stopped.insert(w.lease_id.clone());
        }
    }

    let conn = rusqlite::Connection::open(resource)?;
    let mut stmt = conn.prepare("SELECT lease_id, n, epoch, counter FROM visible ORDER BY seq")?;
    let visible: Vec<(String, i64, i64, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
        .collect::<Result<_, _>>()?;
    let mut highest = (0, 0);
    for (lease_id, n, epoch, counter) in &visible {
        ensure!(
            (*epoch, *counter) >= highest,
            "write {lease_id}/{n} with {epoch}.{counter} became visible after {}.{}",
            highest.0,
            highest.1
        );
        highest = (*epoch, *counter);
    }
    let seen: HashSet<(String, u64)> = visible
        .iter()
        .map(|(l, n, _, _)| (l.clone(), *n as u64))
        .collect();
    for w in &tally.writes {
        let key = (w.lease_id.clone(), w.n);
        match w.outcome.as_str() {
            "applied" => ensure!(seen.contains(&key), "acknowledged write lost: {w:?}"),
            "stale" => ensure!(!seen.contains(&key), "refused write visible: {w:?}"),
            _ => {}
        }
    }

    let ttl_ns = u128::from(ttl_ms) * 1_000_000;
    let mut beliefs: Vec<(u128, u128, &str)> = tally
        .grants
        .iter()
        .map(|g| {
            let sent = tally
                .renewed_at
                .get(&g.lease_id)
                .map_or(g.start, |r| (*r).max(g.start));
            let deadline = sent + ttl_ns;
            let until = tally
                .released_at
                .get(&g.lease_id)
                .map_or(deadline, |r| (*r).min(deadline));
            (g.end, until, g.lease_id.as_str())
        })
        .filter(|(from, until, _)| from < until)
        .collect();
    beliefs.sort_unstable();
    let mut closest: Option<i128> = None;
    let mut latest: Option<(u128, &str)> = None; // the latest-ending belief so far
    for (from, until, lease) in beliefs {
        if let Some((end, other)) = latest {
            let gap = (from as i128 - end as i128) / 1_000;
            ensure!(
                gap >= 0,
                "{lease} believed it held the lock {} µs before {other}'s belief ended",
                -gap
            );
            closest = Some(closest.map_or(gap, |c| c.min(gap)));
        }
        if latest.is_none_or(|(end, _)| until > end) {
            latest = Some((until, lease));
        }
    }
    let count = |o: &str| tally.writes.iter().filter(|w| w.outcome == o).count();
    Ok(WriteSummary {
        applied: count("applied"),
        stale: count("stale"),
        errors: count("error"),
        closest_us: closest,
    })
}
