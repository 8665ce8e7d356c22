//! Fenced publish on SQLite against the seed's plain conditional UPDATE, on
//! one table, each publish in its own `BEGIN IMMEDIATE` transaction.
//! Reproduce: `cargo bench -p fencecheck-benches --bench sqlite`.
//!
//! Every variant moves the catalog pointer of its own row of
//! `fencecheck_scopes` (the adapter's table, with the seed's integer
//! `accepted_fence` column added for the plain UPDATE), and every iteration
//! presents a new, higher token, so every publish is applied and commits:
//!
//! - `plain-update`: `UPDATE … WHERE scope = ? AND accepted_fence < ?`;
//! - `fenced-wasm`: `fencecheck_sqlite::publish` through the component;
//! - `fenced-native`: the same with the guest compiled natively (isolates
//!   the cost of running wasm);
//! - `extension`: the one-statement UPDATE with `fence_check` / `fence_next`
//!   from the loadable extension, loaded into the same connection.
//!
//! Media: a WAL file with `synchronous=NORMAL`, and `:memory:`.
//!
//! After criterion's groups, an interleaved pass per medium prints each
//! variant's time relative to the plain UPDATE measured in the same rounds
//! (see `paired`): on a shared machine the file numbers drift by more than
//! the difference being measured, and interleaving cancels that drift.

// criterion_group! generates an undocumented pub fn.
#![allow(missing_docs)]
#![allow(unsafe_code)] // rusqlite's load_extension is `unsafe`

use std::path::PathBuf;
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{Context, Result, ensure};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use fencecheck::{Checker, Native, Policy, Request, Runtime, Token};
use fencecheck_sqlite::{ObjectId, install, publish, stage};
use rusqlite::{Connection, TransactionBehavior, params};

const NOW: Duration = Duration::from_secs(1_800_000_000);

const PLAIN: &str = "
UPDATE fencecheck_scopes
   SET visible_object = ?2, accepted_fence = ?3, published_at_ms = ?4
 WHERE scope = ?1 AND accepted_fence < ?3";

const EXTENSION: &str = "
UPDATE fencecheck_scopes
   SET visible_object = ?2,
       fence_state = fence_next(fence_state, ?1, ?3, 'strict', NULL, NULL),
       published_at_ms = ?4
 WHERE scope = ?1
   AND fence_check(fence_state, ?1, ?3, 'strict', NULL, NULL) = 'applied'";

/// The extension cargo built beside this bench (a dependency of this
/// package), or `FENCECHECK_SQLITE_EXT`.
fn extension() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("FENCECHECK_SQLITE_EXT") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .context("bench binary has no directory")?
        .join(format!(
            "{}fencecheck_sqlite_ext{}",
            std::env::consts::DLL_PREFIX,
            std::env::consts::DLL_SUFFIX
        ));
    ensure!(path.exists(), "{} not built", path.display());
    Ok(path)
}

/// One database: the adapter's tables, the seed's `accepted_fence` column,
/// one staged object and a first publication for each variant's row.
struct Bench {
    conn: Connection,
    /// One staged object per scope, in `SCOPES` order (a publish checks the
    /// object belongs to the request's scope).
    objects: Vec<ObjectId>,
    _dir: Option<tempfile::TempDir>,
}

const SCOPES: [&str; 4] = [
    "bench/plain",
    "bench/fenced-wasm",
    "bench/fenced-native",
    "bench/extension",
];

fn open(file: bool) -> Result<Bench> {
    let (conn, dir) = if file {
        let dir = tempfile::tempdir()?;
        let conn = Connection::open(dir.path().join("bench.sqlite"))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        (conn, Some(dir))
    } else {
        (Connection::open_in_memory()?, None)
    };
    install(&conn)?;
    conn.execute_batch(
        "ALTER TABLE fencecheck_scopes ADD COLUMN accepted_fence INTEGER NOT NULL DEFAULT 0",
    )?;
    let mut conn = conn;
    let now = UNIX_EPOCH + NOW;
    let mut objects = Vec::new();
    for scope in SCOPES {
        let object = stage(&conn, scope, "first.tmp", &[0u8; 1024], now)?;
        let first = Request::new(scope, Token::new(0, 0, 1), Policy::Strict);
        ensure!(publish(&mut conn, &mut Native, &first, object, now)?.is_applied());
        objects.push(stage(&conn, scope, "bench.tmp", &[0u8; 1024], now)?);
    }
    let path = extension()?;
    // SAFETY: our own extension; it registers three pure functions.
    unsafe {
        let _guard = rusqlite::LoadExtensionGuard::new(&conn)?;
        conn.load_extension(&path, None::<&str>)?;
    }
    Ok(Bench {
        conn,
        objects,
        _dir: dir,
    })
}

/// The four ways to publish, each on its own row with its own token counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    FencedWasm,
    FencedNative,
    Extension,
}

const VARIANTS: [Variant; 4] = [
    Variant::Plain,
    Variant::FencedWasm,
    Variant::FencedNative,
    Variant::Extension,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain-update",
            Variant::FencedWasm => "fenced-wasm",
            Variant::FencedNative => "fenced-native",
            Variant::Extension => "extension",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Everything a publish needs; `misses` counts publishes that did not apply
/// (every one must: each presents a higher token).
struct Publisher {
    bench: Bench,
    guest: fencecheck::Instance,
    counters: [u64; 4],
    misses: u64,
}

impl Publisher {
    fn publish(&mut self, variant: Variant) {
        let i = variant.index();
        self.counters[i] += 1;
        let counter = self.counters[i];
        let scope = SCOPES[i];
        let object = self.bench.objects[i];
        let conn = &mut self.bench.conn;
        let applied = match variant {
            Variant::Plain => statement(
                conn,
                PLAIN,
                params![scope, object.get(), counter as i64, AT_MS],
            ),
            Variant::Extension => {
                let token = format!("0.{counter}");
                statement(conn, EXTENSION, params![scope, object.get(), token, AT_MS])
            }
            Variant::FencedWasm | Variant::FencedNative => {
                let request = Request::new(scope, Token::new(0, 0, counter), Policy::Strict);
                let checker: &mut dyn Checker = if variant == Variant::FencedWasm {
                    &mut self.guest
                } else {
                    &mut Native
                };
                matches!(publish(conn, checker, &request, object, UNIX_EPOCH + NOW), Ok(o) if o.is_applied())
            }
        };
        if !applied {
            self.misses += 1;
        }
    }
}

const AT_MS: i64 = NOW.as_millis() as i64;

/// One statement in its own `BEGIN IMMEDIATE` transaction; true if it
/// changed exactly one row and committed.
fn statement(conn: &mut Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> bool {
    let mut run = || -> rusqlite::Result<usize> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = tx.prepare_cached(sql)?.execute(params)?;
        tx.commit()?;
        Ok(n)
    };
    matches!(run(), Ok(1))
}

/// Interleaved measurement, for the ratios: rounds of one block per variant
/// (rotating which goes first), so drift in the machine's load hits every
/// variant alike. Before each block the WAL is checkpointed, untimed, so no
/// block pays for a checkpoint (the same cost for every variant, one page
/// per publish, but its fsync lands in one block at random and swamps the
/// difference). Returns, per variant, the median over rounds of its block's
/// per-publish time divided by the plain block's in the same round, and the
/// median per-publish time.
fn paired(publisher: &mut Publisher, rounds: usize, block: u32) -> Result<[(f64, Duration); 4]> {
    let mut times: [Vec<Duration>; 4] = Default::default();
    for round in 0..rounds {
        for k in 0..VARIANTS.len() {
            let variant = VARIANTS[(round + k) % VARIANTS.len()];
            publisher
                .bench
                .conn
                .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
            let start = Instant::now();
            for _ in 0..block {
                publisher.publish(variant);
            }
            times[variant.index()].push(start.elapsed() / block);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let plain = times[Variant::Plain.index()].clone();
    Ok(times.map(|t| {
        let ratios = t
            .iter()
            .zip(&plain)
            .map(|(v, p)| v.as_secs_f64() / p.as_secs_f64())
            .collect();
        let mut sorted = t;
        sorted.sort();
        (median(ratios), sorted[sorted.len() / 2])
    }))
}

fn bench_medium(c: &mut Criterion, runtime: &Runtime, file: bool) -> Result<()> {
    let medium = if file { "wal-file" } else { "memory" };
    let mut publisher = Publisher {
        bench: open(file)?,
        guest: runtime.instance()?,
        counters: [1; 4],
        misses: 0,
    };
    let mut group = c.benchmark_group(format!("sqlite/{medium}"));
    group.throughput(Throughput::Elements(1));
    for variant in VARIANTS {
        group.bench_function(variant.name(), |b| b.iter(|| publisher.publish(variant)));
    }
    group.finish();

    let (rounds, block) = (60, 200);
    let medians = paired(&mut publisher, rounds, block)?;
    println!("sqlite/{medium}: interleaved, {rounds} rounds x {block} publishes per variant");
    for variant in VARIANTS {
        let (ratio, t) = medians[variant.index()];
        println!(
            "  {:<14} {:>8.2} µs  {ratio:.3}x plain",
            variant.name(),
            t.as_secs_f64() * 1e6
        );
    }
    ensure!(
        publisher.misses == 0,
        "{} publishes did not apply",
        publisher.misses
    );
    Ok(())
}

fn bench(c: &mut Criterion) -> Result<()> {
    let runtime = Runtime::new()?;
    for file in [true, false] {
        bench_medium(c, &runtime, file)?;
    }
    Ok(())
}

fn benches(c: &mut Criterion) {
    if let Err(e) = bench(c) {
        eprintln!("benchmark failed: {e:#}");
        std::process::exit(1);
    }
}

criterion_group! {
    name = sqlite;
    config = Criterion::default().measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(sqlite);
