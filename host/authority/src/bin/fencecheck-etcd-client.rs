//! A coordinator process for the etcd tests: acquires and releases one lock
//! in a loop through its own [`EtcdCoordinator`], and prints every outcome on
//! stdout, one line each:
//!
//! - `grant LEASE_ID AUTHORITY EPOCH COUNTER START_NS END_NS`: an acquisition,
//!   with `CLOCK_MONOTONIC` (shared by every process on the machine) read
//!   just before the request and just after the answer;
//! - `write LEASE_ID N applied|stale|error START_NS END_NS` (with
//!   `--resource`): the lease's N-th write through the fence to a shared
//!   SQLite resource (policy `allow-equal`, op-id `LEASE_ID-N`); an applied
//!   write also inserts a row into the resource's `visible` log in the same
//!   transaction. After `stale` the client writes no more under that lease;
//! - `renew LEASE_ID renewed|lost|error START_NS` (with `--resource`, between
//!   the writes): after `lost` (or `error`) the client writes no more under
//!   the lease;
//! - `pause LEASE_ID MS` (with `--pause-every`): the client stopped for MS
//!   milliseconds, past its lease, before writing (a GC pause);
//! - `release LEASE_ID released|not-owner|error START_NS`;
//! - `busy`, `error LEASE_ID MESSAGE` for acquisitions that did not grant
//!   (an error's outcome is unknown: it may have granted);
//! - `done CYCLES` at the end.
//!
//! It stops after `--cycles` acquisitions, after `--seconds`, or as soon as
//! the file `--stop-file` exists, whichever comes first.
//!
//! ```text
//! fencecheck-etcd-client --endpoints http://127.0.0.1:2379,... --lock L --name N
//!     [--ttl-ms 1000] [--timeout-ms 1000] [--cycles 100000] [--seconds 120]
//!     [--stop-file PATH] [--resource PATH --writes 2 --pause-every 0]
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fencecheck::{Fenced, Instance, Policy, Rejection, Request, Runtime, Token};
use fencecheck_authority::{
    AcquireOutcome, Coordinator, EtcdCoordinator, EtcdOptions, ReleaseOutcome, RenewOutcome,
    SystemClock,
};

struct Args {
    endpoints: Vec<String>,
    lock: String,
    name: String,
    ttl_ms: u64,
    timeout_ms: u64,
    cycles: u64,
    seconds: u64,
    stop_file: Option<PathBuf>,
    resource: Option<PathBuf>,
    writes: u64,
    pause_every: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        endpoints: Vec::new(),
        lock: String::new(),
        name: String::new(),
        ttl_ms: 1_000,
        timeout_ms: 1_000,
        cycles: 100_000,
        seconds: 120,
        stop_file: None,
        resource: None,
        writes: 2,
        pause_every: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u64>()
                .map_err(|e| format!("{flag} {value:?}: {e}"))
        };
        match flag.as_str() {
            "--endpoints" => args.endpoints = value.split(',').map(str::to_owned).collect(),
            "--lock" => args.lock = value,
            "--name" => args.name = value,
            "--ttl-ms" => args.ttl_ms = number()?,
            "--timeout-ms" => args.timeout_ms = number()?,
            "--cycles" => args.cycles = number()?,
            "--seconds" => args.seconds = number()?,
            "--stop-file" => args.stop_file = Some(value.into()),
            "--resource" => args.resource = Some(value.into()),
            "--writes" => args.writes = number()?,
            "--pause-every" => args.pause_every = number()?,
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if args.endpoints.is_empty() || args.lock.is_empty() || args.name.is_empty() {
        return Err("--endpoints, --lock and --name are required".into());
    }
    Ok(args)
}

/// CLOCK_MONOTONIC in nanoseconds: comparable across processes.
fn monotonic_ns() -> u128 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u128::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u128::try_from(t.tv_nsec).unwrap_or(0)
}

/// The log of applied writes, next to the fence tables.
const VISIBLE: &str = "CREATE TABLE IF NOT EXISTS visible (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    lease_id TEXT NOT NULL, n INTEGER NOT NULL,
    epoch INTEGER NOT NULL, counter INTEGER NOT NULL)";

/// The shared resource: the fence tables, and a log of every applied write.
/// Several clients open it at once: switching it to WAL needs an exclusive
/// lock that SQLite's busy handler does not wait for, so a "locked" setup
/// is retried (bounded); the tests also create it before starting clients.
fn open_resource(path: &std::path::Path) -> Result<rusqlite::Connection, String> {
    let setup = || -> Result<rusqlite::Connection, Box<dyn std::error::Error>> {
        let conn = rusqlite::Connection::open(path)?;
        conn.busy_timeout(Duration::from_secs(30))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        fencecheck_sqlite::install(&conn)?;
        conn.execute_batch(VISIBLE)?;
        Ok(conn)
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        match setup() {
            Ok(conn) => return Ok(conn),
            Err(e) if attempt < 100 && e.to_string().contains("locked") => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(format!("opening the resource {}: {e}", path.display())),
        }
    }
}

/// One write through the fence; "applied", "stale" or "error".
fn write(
    conn: &mut rusqlite::Connection,
    guest: &mut Instance,
    lock: &str,
    lease_id: &str,
    n: u64,
    token: Token,
) -> &'static str {
    let request =
        Request::new(lock, token, Policy::AllowEqual).with_op_id(format!("{lease_id}-{n}"));
    let outcome = fencecheck_sqlite::fenced_write(conn, guest, &request, |tx, _| {
        tx.execute(
            "INSERT INTO visible (lease_id, n, epoch, counter) VALUES (?1, ?2, ?3, ?4)",
            rusqlite::params![lease_id, n as i64, token.epoch as i64, token.counter as i64],
        )
    });
    match outcome {
        Ok(Fenced::Applied { .. }) => "applied",
        Ok(Fenced::Rejected(Rejection::StaleFence { .. })) => "stale",
        Ok(Fenced::Rejected(_)) | Err(_) => "error",
    }
}

fn run(args: &Args) -> Result<u64, String> {
    let options = EtcdOptions {
        request_timeout: Duration::from_millis(args.timeout_ms),
        ..EtcdOptions::new(args.endpoints.clone())
    };
    let runtime = Runtime::new().map_err(|e| format!("loading the component: {e}"))?;
    let mut guest = runtime
        .instance()
        .map_err(|e| format!("instantiating the component: {e}"))?;
    let mut resource = args.resource.as_deref().map(open_resource).transpose()?;
    let coordinator = EtcdCoordinator::with_options(options, runtime, Arc::new(SystemClock))
        .map_err(|e| format!("connecting: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let mut out = std::io::stdout().lock();
    let mut say = |line: String| -> Result<(), String> {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| format!("stdout: {e}"))
    };
    let mut cycle = 0;
    while cycle < args.cycles
        && Instant::now() < deadline
        && !args.stop_file.as_ref().is_some_and(|f| f.exists())
    {
        cycle += 1;
        let lease_id = format!("{}-{cycle}", args.name);
        let start = monotonic_ns();
        let outcome = coordinator.acquire(&args.lock, &lease_id, args.ttl_ms);
        let end = monotonic_ns();
        match outcome {
            Ok(AcquireOutcome::Acquired(grant)) => {
                let t = grant.token;
                say(format!(
                    "grant {lease_id} {} {} {} {start} {end}",
                    t.authority, t.epoch, t.counter
                ))?;
                if let Some(conn) = resource.as_mut() {
                    if args.pause_every > 0 && cycle % args.pause_every == 0 {
                        // Past the lease: another client may take the lock
                        // and write a higher token meanwhile.
                        let ms = args.ttl_ms + 200;
                        say(format!("pause {lease_id} {ms}"))?;
                        std::thread::sleep(Duration::from_millis(ms));
                    }
                    for n in 1..=args.writes {
                        if n > 1 {
                            let start = monotonic_ns();
                            let renewed =
                                match coordinator.renew(&args.lock, &lease_id, t, args.ttl_ms) {
                                    Ok(RenewOutcome::Renewed { .. }) => "renewed",
                                    Ok(RenewOutcome::Lost) => "lost",
                                    Err(_) => "error",
                                };
                            say(format!("renew {lease_id} {renewed} {start}"))?;
                            if renewed != "renewed" {
                                break; // not known to hold it: stop working under it
                            }
                        }
                        let start = monotonic_ns();
                        let outcome = write(conn, &mut guest, &args.lock, &lease_id, n, t);
                        let end = monotonic_ns();
                        say(format!("write {lease_id} {n} {outcome} {start} {end}"))?;
                        if outcome == "stale" {
                            break; // told stale-fence: stop working under this lease
                        }
                    }
                }
                let start = monotonic_ns();
                let released = match coordinator.release(&args.lock, &lease_id, t) {
                    Ok(ReleaseOutcome::Released) => "released",
                    Ok(ReleaseOutcome::NotOwner) => "not-owner",
                    Err(_) => "error",
                };
                say(format!("release {lease_id} {released} {start}"))?;
            }
            Ok(AcquireOutcome::Busy { .. }) => {
                say("busy".into())?;
                // Not for ordering: leaves the cores to the other process and etcd.
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => {
                say(format!(
                    "error {lease_id} {}",
                    e.to_string().replace('\n', " ")
                ))?;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    say(format!("done {cycle}"))?;
    Ok(cycle)
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|args| run(&args));
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencecheck-etcd-client: {e}");
            ExitCode::FAILURE
        }
    }
}
