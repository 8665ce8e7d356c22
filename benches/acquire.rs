//! Lease acquire latency: `SqliteCoordinator` on a WAL file against
//! `EtcdCoordinator` on a real 3-member etcd cluster on loopback and
//! `PostgresCoordinator` on a real PostgreSQL server (fsync on).
//! Reproduce: `cargo bench -p fencecheck-benches --bench acquire`
//! (needs `/usr/bin/etcd` and PostgreSQL: `.ci/install.d/20-etcd.sh`,
//! `60-postgres.sh`).
//!
//! Each cycle acquires a free lock with a new lease id and releases it: two
//! stored decisions. Criterion reports the cycle; before it, a histogram of
//! `CYCLES` timed cycles gives acquire and release p50/p99 on their own, and
//! of an acquire that finds the lock held (`busy`, nothing written).

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

#[path = "../host/authority/tests/support/etcd.rs"]
mod etcd;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use fencecheck::Runtime;
use fencecheck_authority::{
    AcquireOutcome, Coordinator, EtcdCoordinator, PostgresCoordinator, ReleaseOutcome,
    SqliteCoordinator, SystemClock,
};

const LOCK: &str = "report/july";
const TTL: u64 = 30_000;
const CYCLES: usize = 2_000;

/// One acquire + release on a free lock; returns the two latencies.
fn cycle(c: &dyn Coordinator, n: &mut u64) -> Result<(Duration, Duration)> {
    *n += 1;
    let lease_id = format!("bench-{n}");
    let t0 = Instant::now();
    let AcquireOutcome::Acquired(grant) = c.acquire(LOCK, &lease_id, TTL)? else {
        bail!("the lock was busy");
    };
    let t1 = Instant::now();
    if c.release(LOCK, &lease_id, grant.token)? != ReleaseOutcome::Released {
        bail!("release was refused");
    }
    Ok((t1 - t0, t1.elapsed()))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Time `CYCLES` cycles and print acquire and release p50/p99/max.
fn histogram(name: &str, c: &dyn Coordinator, n: &mut u64) -> Result<()> {
    let mut acquire = Vec::with_capacity(CYCLES);
    let mut release = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let (a, r) = cycle(c, n)?;
        acquire.push(a);
        release.push(r);
    }
    // An acquire that finds the lock held decides `busy` and writes nothing:
    // for etcd, the read round trip alone.
    let held = "report/held";
    if !matches!(
        c.acquire(held, "holder", 3_600_000)?,
        AcquireOutcome::Acquired(_)
    ) {
        bail!("{held} is not free");
    }
    let mut busy = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let t0 = Instant::now();
        let AcquireOutcome::Busy { .. } = c.acquire(held, "other", TTL)? else {
            bail!("{held} was granted twice");
        };
        busy.push(t0.elapsed());
    }
    for (what, mut samples) in [
        ("acquire", acquire),
        ("release", release),
        ("acquire-busy", busy),
    ] {
        samples.sort();
        println!(
            "histogram {name} {what}: n={} p50={:?} p90={:?} p99={:?} max={:?}",
            samples.len(),
            percentile(&samples, 0.50),
            percentile(&samples, 0.90),
            percentile(&samples, 0.99),
            percentile(&samples, 1.0),
        );
    }
    Ok(())
}

fn bench(c: &mut Criterion) -> Result<()> {
    let runtime = Runtime::new()?;
    let dir = tempfile::Builder::new()
        .prefix("fencecheck-bench-")
        .tempdir()?;
    let sqlite = SqliteCoordinator::open(
        &dir.path().join("leases.db"),
        runtime.clone(),
        Arc::new(SystemClock),
    )?;
    let cluster = etcd::Cluster::start(3)?;
    let etcd =
        EtcdCoordinator::connect(cluster.endpoints(), runtime.clone(), Arc::new(SystemClock))?;
    let pg_server = fencecheck_tests::pgserver::PgServer::start_durable()?;
    let postgres = PostgresCoordinator::open(&pg_server.url(), runtime, Arc::new(SystemClock))?;
    let mut n = 0;

    // Warm both (connections, page cache) before anything is timed.
    for _ in 0..50 {
        cycle(&sqlite, &mut n)?;
        cycle(&etcd, &mut n)?;
        cycle(&postgres, &mut n)?;
    }
    histogram("sqlite-wal", &sqlite, &mut n)?;
    histogram("etcd-3-members", &etcd, &mut n)?;
    histogram("postgres", &postgres, &mut n)?;

    let mut group = c.benchmark_group("lease/acquire+release");
    group.sampling_mode(SamplingMode::Flat).sample_size(30);
    let mut failed = None;
    for (name, coordinator) in [
        ("sqlite-wal", &sqlite as &dyn Coordinator),
        ("etcd-3-members", &etcd as &dyn Coordinator),
        ("postgres", &postgres as &dyn Coordinator),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                if let Err(e) = cycle(coordinator, &mut n) {
                    failed.get_or_insert(e);
                }
            })
        });
    }
    group.finish();
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn benches(c: &mut Criterion) {
    if let Err(e) = bench(c) {
        eprintln!("benchmark setup failed: {e:#}");
        std::process::exit(1);
    }
}

criterion_group! {
    name = acquire;
    config = Criterion::default().measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(acquire);
