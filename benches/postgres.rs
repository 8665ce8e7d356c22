//! The client-side PostgreSQL adapter (`fencecheck_postgres::fenced_write`)
//! against the seed's plain conditional UPDATE, on one real server with
//! PostgreSQL's default durability (fsync on), 1 and 8 clients.
//! Reproduce: `cargo bench -p fencecheck-benches --bench postgres`
//! (needs PostgreSQL 15: `.ci/install.d/60-postgres.sh`).
//!
//! Every variant performs the same mutation (move `visible_object` of one of
//! 64 reports per client, each write under a newer token) and commits once:
//! - `plain`: `UPDATE … SET visible_object, accepted_fence WHERE report_id
//!   AND accepted_fence <= $fence`, one autocommit statement, prepared once
//!   (one round trip per write);
//! - `adapter`: `fenced_write`: BEGIN, the scope's state `FOR UPDATE`, the
//!   component's check, the state UPDATE, the same catalog UPDATE, COMMIT;
//! - `one-statement`: `fenced_execute` with the writer's `StateCache`: the
//!   check on the cached state, then the state's compare-and-set and the
//!   catalog UPDATE in one autocommit statement (one round trip). Each
//!   writer is its reports' only writer, so its cache stays current (the
//!   bench fails if a write took the locking path after the warm-up).
//!
//! With 8 clients each of 8 threads writes its own reports; a sample's time
//! is the wall time of all threads' writes divided by their count (the mean
//! time per write under that concurrency).

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use fencecheck::{Fenced, Policy, Request, Runtime, Token};
use fencecheck_tests::pgserver::PgServer;

const REPORTS_PER_CLIENT: u64 = 64;

fn setup(server: &PgServer, clients: u64) -> Result<()> {
    let mut db = server.client()?;
    fencecheck_postgres::install(&mut db)?;
    db.batch_execute(
        "DROP TABLE IF EXISTS plain_catalog, report_catalog;
         CREATE TABLE plain_catalog (report_id text PRIMARY KEY, visible_object text NOT NULL,
                                     accepted_fence bigint NOT NULL);
         CREATE TABLE report_catalog (report_id text PRIMARY KEY, visible_object text NOT NULL);
         TRUNCATE fencecheck_scopes;",
    )?;
    for c in 0..clients {
        for r in 0..REPORTS_PER_CLIENT {
            let id = format!("report/{c}/{r}");
            db.execute("INSERT INTO plain_catalog VALUES ($1, 'none', 0)", &[&id])?;
            db.execute("INSERT INTO report_catalog VALUES ($1, 'none')", &[&id])?;
        }
    }
    Ok(())
}

/// One client's writer: its own connection, instance and token counter.
struct Writer {
    db: postgres::Client,
    guest: fencecheck::Instance,
    cache: fencecheck_postgres::StateCache,
    plain: postgres::Statement,
    client: u64,
    next: u64,
}

const PLAIN: &str = "UPDATE plain_catalog SET visible_object = $1, accepted_fence = $2
              WHERE report_id = $3 AND accepted_fence <= $2";

/// Which write a run makes.
#[derive(Clone, Copy)]
enum Variant {
    Plain,
    Adapter,
    OneStatement,
}

impl Writer {
    fn new(server: &PgServer, runtime: &Runtime, client: u64, start: &AtomicU64) -> Result<Self> {
        let mut db = server.client()?;
        let plain = db.prepare(PLAIN)?;
        Ok(Self {
            db,
            guest: runtime.instance()?,
            cache: fencecheck_postgres::StateCache::new(),
            plain,
            client,
            next: start.fetch_add(1 << 32, Ordering::SeqCst),
        })
    }

    fn plain(&mut self) -> Result<()> {
        self.next += 1;
        let id = format!("report/{}/{}", self.client, self.next % REPORTS_PER_CLIENT);
        let fence = self.next as i64;
        let n = self.db.execute(&self.plain, &[&"reports/x", &fence, &id])?;
        if n != 1 {
            bail!("plain write refused");
        }
        Ok(())
    }

    /// The next write's report and token (each write under a newer token).
    fn next_write(&mut self) -> (String, Token) {
        self.next += 1;
        let id = format!("report/{}/{}", self.client, self.next % REPORTS_PER_CLIENT);
        (id, Token::new(0, 1, self.next))
    }

    fn adapter(&mut self) -> Result<()> {
        let (id, token) = self.next_write();
        let request = Request::new(id.as_str(), token, Policy::Strict);
        let outcome =
            fencecheck_postgres::fenced_write(&mut self.db, &mut self.guest, &request, |tx, _| {
                tx.execute(
                    "UPDATE report_catalog SET visible_object = $1 WHERE report_id = $2",
                    &[&"reports/x", &id],
                )
            })?;
        if !matches!(outcome, Fenced::Applied { .. }) {
            bail!("fenced write refused: {outcome:?}");
        }
        Ok(())
    }

    fn one_statement(&mut self) -> Result<()> {
        let (id, token) = self.next_write();
        // Its own scopes: the adapter's writes would make its cache stale.
        let scope = format!("cached/{id}");
        let request = Request::new(scope.as_str(), token, Policy::Strict);
        let outcome = fencecheck_postgres::fenced_execute(
            &mut self.db,
            &mut self.guest,
            &mut self.cache,
            &request,
            "UPDATE report_catalog SET visible_object = $1 WHERE report_id = $2",
            &[&"reports/x", &id],
        )?;
        if !matches!(outcome, Fenced::Applied { .. }) {
            bail!("fenced write refused: {outcome:?}");
        }
        Ok(())
    }

    fn write(&mut self, variant: Variant) -> Result<()> {
        match variant {
            Variant::Plain => self.plain(),
            Variant::Adapter => self.adapter(),
            Variant::OneStatement => self.one_statement(),
        }
    }
}

/// Mean time per write with `writers` each doing `iters / writers` writes.
fn run(writers: &mut [Writer], iters: u64, variant: Variant) -> Result<Duration> {
    let per = iters.div_ceil(writers.len() as u64);
    let start = Instant::now();
    thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = writers
            .iter_mut()
            .map(|w| {
                s.spawn(move || -> Result<()> {
                    for _ in 0..per {
                        w.write(variant)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("writer panicked"))??;
        }
        Ok(())
    })?;
    Ok(start.elapsed() / (per * writers.len() as u64) as u32)
}

fn bench(c: &mut Criterion) -> Result<()> {
    let server = PgServer::start_durable()?;
    let runtime = Runtime::new()?;
    let start = Arc::new(AtomicU64::new(1));
    for clients in [1u64, 8] {
        setup(&server, clients)?;
        let mut writers = (0..clients)
            .map(|i| Writer::new(&server, &runtime, i, &start))
            .collect::<Result<Vec<_>>>()?;
        // Warm connections, caches, instances; every writer's cache learns
        // every report's state it writes.
        for variant in [Variant::Plain, Variant::Adapter, Variant::OneStatement] {
            run(&mut writers, 2 * REPORTS_PER_CLIENT * clients, variant)?;
        }
        let warm: Vec<_> = writers.iter().map(|w| w.cache.stats()).collect();
        let mut group = c.benchmark_group(format!("postgres/update/{clients}-clients"));
        group.sampling_mode(SamplingMode::Flat).sample_size(20);
        let mut failed = None;
        for (name, variant) in [
            ("plain", Variant::Plain),
            ("adapter", Variant::Adapter),
            ("one-statement", Variant::OneStatement),
        ] {
            group.bench_function(name, |b| {
                b.iter_custom(|iters| match run(&mut writers, iters, variant) {
                    Ok(per_write) => per_write * iters as u32,
                    Err(e) => {
                        failed.get_or_insert(e);
                        Duration::ZERO
                    }
                })
            });
        }
        group.finish();
        if let Some(e) = failed {
            return Err(e);
        }
        // After the warm-up, every one-statement write must have been one.
        for (w, before) in writers.iter().zip(warm) {
            let now = w.cache.stats();
            if now.stale != before.stale || now.uncached != before.uncached {
                bail!(
                    "writer {} left the one-statement path: {before:?} -> {now:?}",
                    w.client
                );
            }
        }
    }
    Ok(())
}

fn benches(c: &mut Criterion) {
    if let Err(e) = bench(c) {
        eprintln!("postgres bench failed: {e:#}");
        std::process::exit(1);
    }
}

criterion_group! {
    name = group;
    config = Criterion::default().measurement_time(Duration::from_secs(8)).warm_up_time(Duration::from_secs(2));
    targets = benches
}
criterion_main!(group);
