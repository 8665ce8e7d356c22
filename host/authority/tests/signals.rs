//! The lease client's signals against the metric table of docs/design.md
//! §12: through a recorder installed for the test (as an application
//! installs its exporter), a lease's life (acquired, busy, renewed, lost to
//! a newer holder, released) and a coordinator that loses quorum record
//! exactly the table's names, types and label values, and nothing else.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail, ensure};
use common::{TempDir, World};
use fencecheck::Token;
use fencecheck_authority::{
    AcquireOutcome, AcquireResult, AuthorityError, Client, Coordinator, DriftBound, Lease,
    ManualClock, ReleaseOutcome, RenewOutcome,
};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

const TTL: u64 = 30_000;

/// The SQLite coordinator, or, while `failing`, a coordinator whose etcd
/// has no leader (what etcd answers when its cluster lost quorum).
struct Failable {
    inner: Arc<dyn Coordinator>,
    failing: AtomicBool,
}

impl Failable {
    fn check(&self) -> Result<(), AuthorityError> {
        match self.failing.load(Ordering::SeqCst) {
            true => Err(AuthorityError::Etcd("etcdserver: no leader".into())),
            false => Ok(()),
        }
    }
}

impl Coordinator for Failable {
    fn authority(&self) -> u64 {
        self.inner.authority()
    }
    fn acquire(
        &self,
        lock: &str,
        lease_id: &str,
        ttl: u64,
    ) -> Result<AcquireOutcome, AuthorityError> {
        self.check()?;
        self.inner.acquire(lock, lease_id, ttl)
    }
    fn renew(
        &self,
        lock: &str,
        id: &str,
        token: Token,
        ttl: u64,
    ) -> Result<RenewOutcome, AuthorityError> {
        self.check()?;
        self.inner.renew(lock, id, token, ttl)
    }
    fn release(
        &self,
        lock: &str,
        id: &str,
        token: Token,
    ) -> Result<ReleaseOutcome, AuthorityError> {
        self.check()?;
        self.inner.release(lock, id, token)
    }
    fn restore(&self, at_least: u64) -> Result<u64, AuthorityError> {
        self.check()?;
        self.inner.restore(at_least)
    }
}

/// The table: name → (type, label → allowed values).
type Table = BTreeMap<String, (String, BTreeMap<String, BTreeSet<String>>)>;

fn table() -> Result<Table> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/design.md");
    let text = std::fs::read_to_string(path)?;
    let section = text
        .split("## 12. Signals")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .context("docs/design.md §12")?;
    let mut table = Table::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(name) = cells
            .first()
            .and_then(|c| c.strip_prefix("| `"))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        let (Some(kind), Some(labels)) = (cells.get(1), cells.get(2)) else {
            bail!("a short row: {line}");
        };
        // "`result` (`acquired`, `busy`, `error`)" → result: {acquired, busy, error}
        let mut parsed = BTreeMap::new();
        for part in labels.split("), ") {
            let Some((label, values)) = part.split_once(" (") else {
                continue;
            };
            let values = values
                .split(", ")
                .filter_map(|v| v.trim_end_matches(')').strip_prefix('`')?.strip_suffix('`'))
                .map(str::to_owned)
                .collect();
            parsed.insert(label.trim_matches('`').to_owned(), values);
        }
        table.insert(name.to_owned(), (kind.to_string(), parsed));
    }
    ensure!(table.len() >= 8, "{table:?}");
    Ok(table)
}

fn acquired(result: AcquireResult) -> Result<Lease> {
    match result {
        AcquireResult::Acquired(lease) => Ok(lease),
        other => bail!("not acquired: {other:?}"),
    }
}

/// A lease's life and a quorum loss record the table's lease signals, with
/// the table's labels and values only.
#[test]
fn the_lease_client_records_the_tables_signals() -> Result<()> {
    let dir = TempDir::new("signals")?;
    let world = World::on_file(&dir.join("locks.db"))?;
    let coordinator = Arc::new(Failable {
        inner: world.coordinator.clone(),
        failing: AtomicBool::new(false),
    });
    let client = |clock: Arc<ManualClock>| {
        Client::new(
            coordinator.clone(),
            clock,
            DriftBound {
                ppm: 0,
                margin_ms: 0,
            },
        )
    };
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || -> Result<()> {
        let a = client(Arc::new(ManualClock::new(0)));
        let b = client(Arc::new(ManualClock::new(0)));
        let mut lease_a = acquired(a.acquire("report/july", "a", TTL))?;
        ensure!(matches!(
            b.acquire("report/july", "b", TTL),
            AcquireResult::Busy { .. }
        ));
        ensure!(lease_a.renew()?);
        // A's lease expires at the coordinator (A's own clock stands still):
        // B acquires, and A's next renewal comes back lost.
        world.coordinator_clock.advance(2 * TTL);
        let lease_b = acquired(b.acquire("report/july", "b", TTL))?;
        ensure!(!lease_a.renew()?);
        ensure!(matches!(lease_b.release()?, ReleaseOutcome::Released));
        coordinator.failing.store(true, Ordering::SeqCst);
        ensure!(matches!(
            a.acquire("report/july", "c", TTL),
            AcquireResult::Unavailable(_)
        ));
        Ok(())
    })?;

    let table = table()?;
    let mut seen: BTreeMap<String, BTreeSet<(String, String)>> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        let (kind, labels) = table
            .get(&name)
            .with_context(|| format!("{name} is not in docs/design.md §12"))?;
        let recorded = match value {
            DebugValue::Counter(_) => "counter",
            DebugValue::Gauge(_) => "gauge",
            DebugValue::Histogram(_) => "histogram",
        };
        ensure!(
            recorded == kind,
            "{name}: recorded as a {recorded}, the table says {kind}"
        );
        for label in key.key().labels() {
            let allowed = labels
                .get(label.key())
                .with_context(|| format!("{name}: label {} is not in the table", label.key()))?;
            ensure!(
                allowed.contains(label.value()),
                "{name}: {}={} is not among the table's values {allowed:?}",
                label.key(),
                label.value()
            );
            seen.entry(name.clone())
                .or_default()
                .insert((label.key().to_owned(), label.value().to_owned()));
        }
        seen.entry(name).or_default();
    }
    // Everything the scenario exercised was recorded.
    let expect: &[(&str, &[(&str, &str)])] = &[
        (
            "fencecheck_lease_acquire_duration_seconds",
            &[
                ("result", "acquired"),
                ("result", "busy"),
                ("result", "error"),
            ],
        ),
        (
            "fencecheck_lease_renewals_total",
            &[("result", "renewed"), ("result", "lost")],
        ),
        (
            "fencecheck_lease_age_seconds",
            &[("end", "lost"), ("end", "released")],
        ),
        ("fencecheck_lease_holder_lost_total", &[]),
        ("fencecheck_lease_epoch", &[]),
        ("fencecheck_token_headroom", &[]),
        (
            "fencecheck_coordinator_errors_total",
            &[("kind", "quorum-lost")],
        ),
    ];
    for (name, labels) in expect {
        let got = seen
            .get(*name)
            .with_context(|| format!("{name} was not recorded"))?;
        for (k, v) in *labels {
            ensure!(
                got.contains(&((*k).to_owned(), (*v).to_owned())),
                "{name}: no {k}={v} in {got:?}"
            );
        }
    }
    Ok(())
}
