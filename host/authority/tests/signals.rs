//! The lease client's signals against the metric table of docs/design.md
//! §12: through a recorder installed for the test (as an application
//! installs its exporter), a lease's life (acquired, busy, renewed, lost to
//! a newer holder, released) and a coordinator that loses quorum record
//! exactly the table's names, types and label values, and nothing else.

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Result, bail, ensure};
use common::{TempDir, World};
use fencecheck::Token;
use fencecheck_authority::{
    AcquireOutcome, AcquireResult, AuthorityError, Client, Coordinator, DriftBound, Lease,
    ManualClock, ReleaseOutcome, RenewOutcome,
};
use fencecheck_tests::signals::{check_recorded, expect_seen};
use metrics_util::debugging::DebuggingRecorder;

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

    let recorded = check_recorded(&snapshotter)?;
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
    expect_seen(&recorded.seen, expect)
}
