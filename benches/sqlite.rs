//! Fenced publish on SQLite against the seed's plain conditional UPDATE, on
//! one table. Reproduce: `cargo bench -p fencecheck-benches --bench sqlite`
//! (`-- none` skips criterion's groups and runs only the interleaved pass).
//!
//! Every variant moves the catalog pointer of its own row of
//! `fencecheck_scopes` (the adapter's table, with the seed's integer
//! `accepted_fence` column added for the plain UPDATE), and every iteration
//! presents a new, higher token, so every publish is applied and commits.
//! Each variant is one write transaction, in one of two shapes:
//!
//! - `plain-update`: the seed's `UPDATE … WHERE scope = ? AND accepted_fence
//!   < ?` inside `BEGIN IMMEDIATE` … `COMMIT` (three statements);
//! - `plain-autocommit`: the same UPDATE alone, its own transaction (one
//!   statement);
//! - `fenced-wasm`: `fencecheck_sqlite::publish` through the component (one
//!   autocommit statement that checks inside the UPDATE);
//! - `fenced-native`: the same with the guest compiled natively (isolates
//!   the cost of running wasm);
//! - `fenced-write-wasm`: `fencecheck_sqlite::fenced_write` with a closure
//!   that moves the pointer (`BEGIN IMMEDIATE`, read, check, the closure's
//!   UPDATE, store the state, `COMMIT`);
//! - `extension-one-call`: the loadable extension's documented statement,
//!   `fence_next` in SET only (one component call), autocommit;
//! - `extension-two-call`: the earlier documented form, `fence_check(...) =
//!   'applied'` in WHERE as well (two component calls), inside `BEGIN
//!   IMMEDIATE` … `COMMIT` as this bench ran it before.
//!
//! Compare like with like: one-statement variants with `plain-autocommit`,
//! transaction-wrapped ones with `plain-update`. The interleaved pass prints
//! both ratios for every variant.
//!
//! Media: a WAL file with `synchronous=NORMAL`, and `:memory:`.
//!
//! After criterion's groups, an interleaved pass per medium prints each
//! variant's time relative to the plain UPDATEs measured in the same rounds
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
use fencecheck_sqlite::{Fenced, ObjectId, fenced_write, install, publish, stage};
use rusqlite::{Connection, TransactionBehavior, params};

const NOW: Duration = Duration::from_secs(1_800_000_000);

const PLAIN: &str = "
UPDATE fencecheck_scopes
   SET visible_object = ?2, accepted_fence = ?3, published_at_ms = ?4
 WHERE scope = ?1 AND accepted_fence < ?3";

/// The extension's documented one-statement publish: one component call,
/// and any outcome but applied raises.
const EXTENSION_ONE_CALL: &str = "
UPDATE fencecheck_scopes
   SET visible_object = ?2,
       fence_state = fence_next(fence_state, ?1, ?3, 'strict', NULL, NULL),
       published_at_ms = ?4
 WHERE scope = ?1";

/// The earlier form: `fence_check` in WHERE as well, two component calls.
const EXTENSION_TWO_CALL: &str = "
UPDATE fencecheck_scopes
   SET visible_object = ?2,
       fence_state = fence_next(fence_state, ?1, ?3, 'strict', NULL, NULL),
       published_at_ms = ?4
 WHERE scope = ?1
   AND fence_check(fence_state, ?1, ?3, 'strict', NULL, NULL) = 'applied'";

/// `fenced-write-wasm`'s mutation: what publish's one statement does, as a
/// caller's closure would (the adapter stores the state after it).
const MOVE_POINTER: &str =
    "UPDATE fencecheck_scopes SET visible_object = ?2, published_at_ms = ?3 WHERE scope = ?1";

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

const SCOPES: [&str; VARIANT_COUNT] = [
    "bench/plain",
    "bench/plain-autocommit",
    "bench/fenced-wasm",
    "bench/fenced-native",
    "bench/fenced-write-wasm",
    "bench/extension-one-call",
    "bench/extension-two-call",
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

/// The ways to publish, each on its own row with its own token counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Plain,
    PlainAutocommit,
    FencedWasm,
    FencedNative,
    FencedWriteWasm,
    ExtensionOneCall,
    ExtensionTwoCall,
}

const VARIANT_COUNT: usize = 7;

const VARIANTS: [Variant; VARIANT_COUNT] = [
    Variant::Plain,
    Variant::PlainAutocommit,
    Variant::FencedWasm,
    Variant::FencedNative,
    Variant::FencedWriteWasm,
    Variant::ExtensionOneCall,
    Variant::ExtensionTwoCall,
];

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Variant::Plain => "plain-update",
            Variant::PlainAutocommit => "plain-autocommit",
            Variant::FencedWasm => "fenced-wasm",
            Variant::FencedNative => "fenced-native",
            Variant::FencedWriteWasm => "fenced-write-wasm",
            Variant::ExtensionOneCall => "extension-one-call",
            Variant::ExtensionTwoCall => "extension-two-call",
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
    counters: [u64; VARIANT_COUNT],
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
            Variant::PlainAutocommit => autocommit(
                conn,
                PLAIN,
                params![scope, object.get(), counter as i64, AT_MS],
            ),
            Variant::ExtensionOneCall => {
                let token = format!("0.{counter}");
                autocommit(
                    conn,
                    EXTENSION_ONE_CALL,
                    params![scope, object.get(), token, AT_MS],
                )
            }
            Variant::ExtensionTwoCall => {
                let token = format!("0.{counter}");
                statement(
                    conn,
                    EXTENSION_TWO_CALL,
                    params![scope, object.get(), token, AT_MS],
                )
            }
            Variant::FencedWriteWasm => {
                let request = Request::new(scope, Token::new(0, 0, counter), Policy::Strict);
                let moved = fenced_write(conn, &mut self.guest, &request, |tx, _| {
                    tx.prepare_cached(MOVE_POINTER)?
                        .execute(params![scope, object.get(), AT_MS])
                });
                matches!(moved, Ok(Fenced::Applied { value: 1, .. }))
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

/// One statement on its own (autocommit: its own write transaction); true
/// if it changed exactly one row (and so committed).
fn autocommit(conn: &mut Connection, sql: &str, params: &[&dyn rusqlite::ToSql]) -> bool {
    matches!(
        conn.prepare_cached(sql).and_then(|mut s| s.execute(params)),
        Ok(1)
    )
}

/// One variant's interleaved result: its median per-publish time, and the
/// medians over rounds of its block's time divided by each plain block's in
/// the same round.
#[derive(Clone, Copy, Debug, Default)]
struct Paired {
    median: Duration,
    vs_plain_update: f64,
    vs_plain_autocommit: f64,
}

/// Interleaved measurement, for the ratios: rounds of one block per variant
/// (rotating which goes first), so drift in the machine's load hits every
/// variant alike. Before each block the WAL is checkpointed, untimed, so no
/// block pays for a checkpoint (the same cost for every variant, one page
/// per publish, but its fsync lands in one block at random and swamps the
/// difference).
fn paired(publisher: &mut Publisher, rounds: usize, block: u32) -> Result<[Paired; VARIANT_COUNT]> {
    let mut times: [Vec<Duration>; VARIANT_COUNT] = Default::default();
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
    let median_ratio = |t: &[Duration], base: &[Duration]| {
        let mut ratios: Vec<f64> = t
            .iter()
            .zip(base)
            .map(|(v, b)| v.as_secs_f64() / b.as_secs_f64())
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios[ratios.len() / 2]
    };
    let update = times[Variant::Plain.index()].clone();
    let auto = times[Variant::PlainAutocommit.index()].clone();
    Ok(times.map(|t| {
        let mut sorted = t.clone();
        sorted.sort();
        Paired {
            median: sorted[sorted.len() / 2],
            vs_plain_update: median_ratio(&t, &update),
            vs_plain_autocommit: median_ratio(&t, &auto),
        }
    }))
}

fn bench_medium(c: &mut Criterion, runtime: &Runtime, file: bool) -> Result<()> {
    let medium = if file { "wal-file" } else { "memory" };
    let mut publisher = Publisher {
        bench: open(file)?,
        guest: runtime.instance()?,
        counters: [1; VARIANT_COUNT],
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
    println!(
        "  {:<18} {:>9}  {:>15}  {:>19}",
        "variant", "median", "x plain-update", "x plain-autocommit"
    );
    for variant in VARIANTS {
        let p = medians[variant.index()];
        println!(
            "  {:<18} {:>6.2} µs  {:>15.3}  {:>19.3}",
            variant.name(),
            p.median.as_secs_f64() * 1e6,
            p.vs_plain_update,
            p.vs_plain_autocommit
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
