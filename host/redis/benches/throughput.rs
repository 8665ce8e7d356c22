//! Throughput and latency of FENCE.SET beside a plain SET and beside the
//! Lua compare-and-set script Redis lock users are told to write, on one
//! loopback server started here (Redis 7.0 and Valkey 8): 50 connections,
//! each on its own key with strictly increasing tokens (every write
//! applies), without pipelining and with 16 commands in flight per
//! connection.
//!
//! The connections are driven by a few client threads (2 by default,
//! `FENCECHECK_BENCH_THREADS`), each sending one batch on every connection
//! it owns and then reading their replies, and a batch goes out in one
//! write, as pipelining clients send it. Not one thread per connection:
//! on a 2-core machine 50 client threads take the CPU from the server they
//! measure and get it preempted in the middle of its work, and sending a
//! batch as 16 writes makes the server read, and answer, it piecemeal.
//!
//! `cargo bench -p fencecheck-redis --bench throughput` (BENCHMARKS.md has
//! the numbers). Bounded: a fixed number of writes per connection and run.

#[path = "../tests/common/mod.rs"]
#[allow(missing_docs)]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use common::{Conn, Kind, Options, Server};

const CONNECTIONS: usize = 50;
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

/// Append one command, RESP-encoded, to `out`.
fn encode(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Append the `n`th write of `client` to `out`.
fn command(out: &mut Vec<u8>, w: Workload, client: usize, n: usize, sha: &str, round: usize) {
    let key = format!("bench:{round}:{client}");
    let value = format!("value-{n}-padded-to-a-typical-pointer-size");
    match w {
        Workload::Set => encode(out, &[b"SET", key.as_bytes(), value.as_bytes()]),
        Workload::Lua => encode(
            out,
            &[
                b"EVALSHA",
                sha.as_bytes(),
                b"2",
                key.as_bytes(),
                format!("{key}:fence").as_bytes(),
                (n + 1).to_string().as_bytes(),
                value.as_bytes(),
            ],
        ),
        Workload::Fence => encode(
            out,
            &[
                b"FENCE.SET",
                key.as_bytes(),
                format!("0.{}", n + 1).as_bytes(),
                value.as_bytes(),
            ],
        ),
    }
}

/// One benchmark connection: batches written whole, replies checked (not
/// an error) and skipped without building values.
struct Pipe {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    line: Vec<u8>,
}

impl Pipe {
    fn connect(port: u16) -> Result<Pipe> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        stream.set_nodelay(true)?;
        Ok(Pipe {
            reader: BufReader::with_capacity(64 * 1024, stream.try_clone()?),
            writer: stream,
            line: Vec::with_capacity(128),
        })
    }

    /// Read one reply; an error reply is an error.
    fn skip_reply(&mut self) -> Result<()> {
        let mut pending = 1usize;
        while pending > 0 {
            pending -= 1;
            self.line.clear();
            self.reader.read_until(b'\n', &mut self.line)?;
            ensure!(self.line.ends_with(b"\r\n"), "connection closed");
            let body = &self.line[1..self.line.len() - 2];
            let count = || -> Result<i64> { Ok(std::str::from_utf8(body)?.parse()?) };
            match self.line[0] {
                b'+' | b':' => {}
                b'-' => bail!("error reply: {}", String::from_utf8_lossy(body)),
                b'$' => {
                    let n = count()?;
                    if n >= 0 {
                        let mut skip = (self.reader.by_ref()).take(u64::try_from(n)? + 2);
                        std::io::copy(&mut skip, &mut std::io::sink())?;
                    }
                }
                b'*' => pending += usize::try_from(count()?.max(0))?,
                other => bail!("unknown reply type {other}"),
            }
        }
        Ok(())
    }
}

struct Run {
    ops_per_sec: f64,
    p50_us: f64,
    p99_us: f64,
    /// The server's own time per call (INFO commandstats, usec_per_call):
    /// wall-clock time on the main thread inside the command, so it grows
    /// when the server is preempted mid-command.
    server_us: f64,
    /// CPU time the server process used per request (user + system, from
    /// /proc: parsing, the command, the network syscalls): what a request
    /// costs the server, whatever else the machine runs.
    cpu_us: f64,
    /// The server's read and write syscalls per request (/proc/PID/io):
    /// how well the requests were batched.
    syscalls: f64,
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

/// syscr + syscw of a process (/proc/PID/io; 0 where it cannot be read).
fn syscalls(pid: u32) -> f64 {
    let Ok(io) = std::fs::read_to_string(format!("/proc/{pid}/io")) else {
        return 0.0;
    };
    io.lines()
        .filter_map(|l| {
            l.strip_prefix("syscr: ")
                .or_else(|| l.strip_prefix("syscw: "))
        })
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
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

/// How many client threads drive the connections.
fn client_threads() -> usize {
    std::env::var("FENCECHECK_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(2)
        .clamp(1, CONNECTIONS)
}

#[allow(clippy::too_many_arguments)]
fn run(
    pid: u32,
    port: u16,
    w: Workload,
    per_conn: usize,
    depth: usize,
    sha: &str,
    round: usize,
    threads: usize,
) -> Result<Run> {
    let mut admin = Conn::connect(port)?;
    admin.ok(&["CONFIG", "RESETSTAT"])?;
    let start = Arc::new(Barrier::new(threads + 1));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let start = Arc::clone(&start);
            let sha = sha.to_string();
            // Thread t drives connections t, t + threads, …
            let clients: Vec<usize> = (t..CONNECTIONS).step_by(threads).collect();
            std::thread::spawn(move || -> Result<Vec<Duration>> {
                let mut pipes = clients
                    .iter()
                    .map(|_| Pipe::connect(port))
                    .collect::<Result<Vec<_>>>()?;
                let mut latencies = Vec::with_capacity(per_conn * clients.len());
                let mut sent = vec![Instant::now(); clients.len()];
                let mut buf = Vec::with_capacity(depth * 128);
                start.wait();
                let mut n = 0;
                while n < per_conn {
                    let batch = depth.min(per_conn - n);
                    for (i, (pipe, &client)) in pipes.iter_mut().zip(&clients).enumerate() {
                        buf.clear();
                        for k in 0..batch {
                            command(&mut buf, w, client, n + k, &sha, round);
                        }
                        sent[i] = Instant::now();
                        pipe.writer.write_all(&buf)?;
                    }
                    for (i, pipe) in pipes.iter_mut().enumerate() {
                        for _ in 0..batch {
                            pipe.skip_reply().with_context(|| format!("{w:?}"))?;
                            latencies.push(sent[i].elapsed());
                        }
                    }
                    n += batch;
                }
                Ok(latencies)
            })
        })
        .collect();
    start.wait();
    let cpu_before = cpu_seconds(pid)?;
    let calls_before = syscalls(pid);
    let began = Instant::now();
    let mut all = Vec::with_capacity(CONNECTIONS * per_conn);
    for h in handles {
        all.extend(h.join().map_err(|_| anyhow::anyhow!("client panicked"))??);
    }
    let elapsed = began.elapsed();
    let cpu = cpu_seconds(pid)? - cpu_before;
    let calls = syscalls(pid) - calls_before;
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
        syscalls: calls / all.len() as f64,
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
    let threads = client_threads();
    // FENCECHECK_BENCH_ONLY=fence runs one workload, FENCECHECK_BENCH_KIND=
    // valkey one server (for a profiler).
    let only = std::env::var("FENCECHECK_BENCH_ONLY").unwrap_or_default();
    let only_kind = std::env::var("FENCECHECK_BENCH_KIND").unwrap_or_default();
    for kind in [Kind::Redis, Kind::Valkey] {
        if !only_kind.is_empty() && !format!("{kind:?}").eq_ignore_ascii_case(&only_kind) {
            continue;
        }
        let server = Server::start(kind, Options::module())?;
        let mut c = server.conn()?;
        let sha = c.ok(&["SCRIPT", "LOAD", LUA])?.text().context("sha")?;
        let pid = server.pid().context("server pid")?;
        println!(
            "{kind:?}: {CONNECTIONS} connections from {threads} client threads, loopback, \
             medians of {ROUNDS} runs"
        );
        println!(
            "{:<10} {:>5} {:>12} {:>9} {:>9} {:>10} {:>9} {:>9}",
            "workload", "depth", "ops/s", "p50 us", "p99 us", "command us", "cpu us", "syscalls"
        );
        for depth in [1usize, 16] {
            let per_conn = if quick {
                200
            } else if depth == 1 {
                2_000
            } else {
                10_000
            };
            // Rounds interleave the workloads, so that a change in the
            // machine's load hits all three alike.
            let workloads: Vec<Workload> = [Workload::Set, Workload::Lua, Workload::Fence]
                .into_iter()
                .filter(|w| only.is_empty() || format!("{w:?}").eq_ignore_ascii_case(&only))
                .collect();
            let mut runs: Vec<Vec<Run>> = workloads.iter().map(|_| Vec::new()).collect();
            for round in 0..ROUNDS {
                for (i, w) in workloads.iter().enumerate() {
                    let r = run(pid, server.port, *w, per_conn, depth, &sha, round, threads)?;
                    runs[i].push(r);
                }
                c.ok(&["FLUSHALL"])?;
            }
            let mut results = Vec::new();
            for (w, r) in workloads.iter().zip(&runs) {
                let ops = median(r.iter().map(|x| x.ops_per_sec).collect());
                let p50 = median(r.iter().map(|x| x.p50_us).collect());
                let p99 = median(r.iter().map(|x| x.p99_us).collect());
                let server = median(r.iter().map(|x| x.server_us).collect());
                let cpu = median(r.iter().map(|x| x.cpu_us).collect());
                let calls = median(r.iter().map(|x| x.syscalls).collect());
                println!(
                    "{:<10} {depth:>5} {ops:>12.0} {p50:>9.0} {p99:>9.0} {server:>10.2} {cpu:>9.2} {calls:>9.3}",
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
            // The same ratio round by round (each round's three runs are
            // back to back): its median is steadier than a ratio of medians.
            let per_round = |a: Workload, b: Workload| {
                let (Some(i), Some(j)) = (
                    workloads.iter().position(|x| *x == a),
                    workloads.iter().position(|x| *x == b),
                ) else {
                    return f64::NAN;
                };
                median(
                    runs[i]
                        .iter()
                        .zip(&runs[j])
                        .map(|(x, y)| x.ops_per_sec / y.ops_per_sec)
                        .collect(),
                )
            };
            println!(
                "depth {depth}: throughput FENCE.SET / SET = {:.2}x (per round {:.2}x), \
                 FENCE.SET / Lua CAS = {:.2}x (per round {:.2}x); server CPU per request, \
                 inverted (capacity): vs SET {:.2}x, vs Lua CAS {:.2}x",
                fence.0 / set.0,
                per_round(Workload::Fence, Workload::Set),
                fence.0 / lua.0,
                per_round(Workload::Fence, Workload::Lua),
                set.2 / fence.2,
                lua.2 / fence.2
            );
        }
    }
    Ok(())
}
