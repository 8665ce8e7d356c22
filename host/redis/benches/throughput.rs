//! Throughput and latency of FENCE.SET beside a plain SET and beside the
//! Lua compare-and-set script Redis lock users are told to write, on one
//! loopback server started here (Redis 7.0 and Valkey 8), 50 clients, each
//! on its own key with strictly increasing tokens (every write applies),
//! without pipelining and with 16 commands in flight per client.
//!
//! `cargo bench -p fencecheck-redis --bench throughput` (BENCHMARKS.md has
//! the numbers). Bounded: a fixed number of writes per client and run.

#[path = "../tests/common/mod.rs"]
#[allow(missing_docs)]
mod common;

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use common::{Conn, Kind, Options, Server, Value};

const CLIENTS: usize = 50;
const ROUNDS: usize = 5;

/// The seed's compare-and-set in EVAL: the fence is an integer key next to
/// the data; a lower or equal token is refused, else both are written.
const LUA: &str = "local highest = tonumber(redis.call('GET', KEYS[2]) or '0') \
local token = tonumber(ARGV[1]) \
if token <= highest then return redis.error_reply('STALEFENCE') end \
redis.call('SET', KEYS[2], ARGV[1]) \
redis.call('SET', KEYS[1], ARGV[2]) \
return 1";

#[derive(Clone, Copy, Debug, PartialEq)]
enum Workload {
    Set,
    Lua,
    Fence,
}

fn command(w: Workload, client: usize, n: usize, sha: &str, round: usize) -> Vec<String> {
    let key = format!("bench:{round}:{client}");
    let value = format!("value-{n}-padded-to-a-typical-pointer-size");
    match w {
        Workload::Set => vec!["SET".into(), key, value],
        Workload::Lua => vec![
            "EVALSHA".into(),
            sha.into(),
            "2".into(),
            key.clone(),
            format!("{key}:fence"),
            (n + 1).to_string(),
            value,
        ],
        Workload::Fence => vec!["FENCE.SET".into(), key, format!("0.{}", n + 1), value],
    }
}

struct Run {
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// The server's own time per call (INFO commandstats, usec_per_call):
    /// what the command costs on the main thread, apart from the network
    /// and the clients, and far less sensitive to the machine's load.
    server_us: f64,
    /// CPU time the server process used per request (user + system, from
    /// /proc: parsing, the command, the network syscalls): what a request
    /// costs the server, whatever else the machine runs.
    cpu_us: f64,
}

/// utime + stime of a process, in seconds (/proc/PID/stat, clock ticks of 1/100 s).
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')').context("stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields.get(11).context("utime")?.parse::<f64>()?
        + fields.get(12).context("stime")?.parse::<f64>()?;
    Ok(ticks / 100.0)
}

/// `usec_per_call` of `name` in INFO commandstats.
fn server_us(c: &mut Conn, name: &str) -> Result<f64> {
    let info = c.ok(&["INFO", "commandstats"])?.text().context("info")?;
    let line = info
        .lines()
        .find(|l| l.starts_with(&format!("cmdstat_{name}:")))
        .with_context(|| format!("no cmdstat_{name}"))?;
    let field = line
        .split([':', ','])
        .find_map(|kv| kv.strip_prefix("usec_per_call="))
        .context("usec_per_call")?;
    Ok(field.parse()?)
}

fn run(
    pid: u32,
    port: u16,
    w: Workload,
    per_client: usize,
    depth: usize,
    sha: &str,
    round: usize,
) -> Result<Run> {
    let mut admin = Conn::connect(port)?;
    admin.ok(&["CONFIG", "RESETSTAT"])?;
    let cpu_before = cpu_seconds(pid)?;
    let start = Arc::new(Barrier::new(CLIENTS + 1));
    let handles: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let start = Arc::clone(&start);
            let sha = sha.to_string();
            std::thread::spawn(move || -> Result<Vec<Duration>> {
                let mut c = Conn::connect(port)?;
                let mut latencies = Vec::with_capacity(per_client);
                start.wait();
                let mut n = 0;
                while n < per_client {
                    let batch = depth.min(per_client - n);
                    let sent = Instant::now();
                    for i in 0..batch {
                        c.send(&command(w, client, n + i, &sha, round))?;
                    }
                    for _ in 0..batch {
                        let reply = c.read()?;
                        ensure!(!matches!(reply, Value::Error(_)), "{w:?}: {reply:?}");
                        latencies.push(sent.elapsed());
                    }
                    n += batch;
                }
                Ok(latencies)
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    let mut all = Vec::with_capacity(CLIENTS * per_client);
    for h in handles {
        all.extend(h.join().map_err(|_| anyhow::anyhow!("client panicked"))??);
    }
    let elapsed = began.elapsed();
    let cpu = cpu_seconds(pid)? - cpu_before;
    all.sort();
    let pct =
        |p: f64| all[((all.len() as f64 * p) as usize).min(all.len() - 1)].as_secs_f64() * 1e6;
    let name = match w {
        Workload::Set => "set",
        Workload::Lua => "evalsha",
        Workload::Fence => "fence.set",
    };
    Ok(Run {
        ops_per_sec: all.len() as f64 / elapsed.as_secs_f64(),
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        server_us: server_us(&mut admin, name)?,
        cpu_us: cpu * 1e6 / all.len() as f64,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<()> {
    // `cargo bench` passes --bench; `cargo test --benches` would pass
    // nothing useful either: this is a measurement, run it on purpose.
    let quick = std::env::args().any(|a| a == "--quick");
    for kind in [Kind::Redis, Kind::Valkey] {
        let server = Server::start(kind, Options::module())?;
        let mut c = server.conn()?;
        let sha = c.ok(&["SCRIPT", "LOAD", LUA])?.text().context("sha")?;
        let pid = server.pid().context("server pid")?;
        println!("{kind:?}: {CLIENTS} clients, loopback, medians of {ROUNDS} runs");
        println!(
            "{:<10} {:>5} {:>12} {:>9} {:>9}",
            "workload", "depth", "ops/s", "p50 us", "p99 us"
        );
        for depth in [1usize, 16] {
            let per_client = if quick {
                200
            } else if depth == 1 {
                2_000
            } else {
                10_000
            };
            // Rounds interleave the workloads, so that a change in the
            // machine's load hits all three alike.
            // FENCECHECK_BENCH_ONLY=fence runs one workload (for a profiler).
            let only = std::env::var("FENCECHECK_BENCH_ONLY").unwrap_or_default();
            let workloads: Vec<Workload> = [Workload::Set, Workload::Lua, Workload::Fence]
                .into_iter()
                .filter(|w| only.is_empty() || format!("{w:?}").eq_ignore_ascii_case(&only))
                .collect();
            let mut runs: Vec<Vec<Run>> = workloads.iter().map(|_| Vec::new()).collect();
            for round in 0..ROUNDS {
                for (i, w) in workloads.iter().enumerate() {
                    runs[i].push(run(pid, server.port, *w, per_client, depth, &sha, round)?);
                }
                c.ok(&["FLUSHALL"])?;
            }
            let mut results = Vec::new();
            for (w, r) in workloads.iter().zip(runs) {
                let ops = median(r.iter().map(|x| x.ops_per_sec).collect());
                let p50 = median(r.iter().map(|x| x.p50_us).collect());
                let p99 = median(r.iter().map(|x| x.p99_us).collect());
                let server = median(r.iter().map(|x| x.server_us).collect());
                let cpu = median(r.iter().map(|x| x.cpu_us).collect());
                println!(
                    "{:<10} {depth:>5} {ops:>12.0} {p50:>9.0} {p99:>9.0} {server:>11.2} {cpu:>9.2}",
                    format!("{w:?}")
                );
                results.push((*w, (ops, server, cpu)));
            }
            let get = |w| {
                results
                    .iter()
                    .find(|(x, _)| *x == w)
                    .map_or((f64::NAN, f64::NAN, f64::NAN), |(_, v)| *v)
            };
            let (fence, set, lua) = (get(Workload::Fence), get(Workload::Set), get(Workload::Lua));
            println!(
                "depth {depth}: throughput FENCE.SET / SET = {:.2}x, FENCE.SET / Lua CAS = {:.2}x; \
                 server CPU per request, inverted (capacity): vs SET {:.2}x, vs Lua CAS {:.2}x",
                fence.0 / set.0,
                fence.0 / lua.0,
                set.2 / fence.2,
                lua.2 / fence.2
            );
        }
    }
    Ok(())
}
