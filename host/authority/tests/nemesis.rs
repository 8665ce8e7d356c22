//! Fault injection in network namespaces: each etcd member and each client
//! process in a namespace of its own (tests/support/netns.rs), and a seeded
//! nemesis that cuts links between them — a minority member isolated, the
//! leader isolated, a client cut off from the majority, a bridge (two
//! halves that share one member) — heals, and changes membership (a member
//! removed and replaced by a new one on a fresh node), while client
//! processes acquire one lock, write through the fence to a shared SQLite
//! resource (some pausing past their lease first), and release it. Afterwards the same checks as the loopback
//! process tests: every grant etcd committed, in commit order, passes the
//! shared history checker and matches what the clients were told, and every
//! token is greater than every token granted before its request started.
//!
//! Each run prints its seed (`FENCECHECK_NEMESIS_SEED=N` replays a
//! schedule), the schedule and the counts. CI runs eight faults;
//! `scripts/nemesis --seed N --minutes M` (`FENCECHECK_NEMESIS_MINUTES`)
//! keeps faulting for longer by hand. The suite needs root and iproute2 and
//! fails loudly without them. With `FENCECHECK_NEMESIS_SVG=PATH` the run
//! also draws itself as an SVG timeline (nemesis/timeline.rs): faults,
//! believed leases, writes and the closest approach of two leases.

use crate::etcd;
use crate::etcd_clients;
mod timeline;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use etcd::Cluster;
use etcd_clients::{
    Clients, Grant, check_fenced_writes, check_history, check_store, next_grant_is_above, summary,
};
use fencecheck_tests::history::Rng;
use fencecheck_tests::netns::Net;

const MEMBERS: usize = 3;
const CLIENTS: usize = 2;
/// Nodes for members that replace others (membership changes).
const SPARES: usize = 4;
/// How long each fault of the schedule lasts (a schedule, not a wait for a
/// condition: progress is required after each heal, with a bound).
const HOLD: Duration = Duration::from_millis(1_500);
/// The clients' lease length (`Clients` starts them with `--ttl-ms 1000`).
const TTL_MS: u64 = 1_000;

/// A TCP connection from node `from` to a listener on node `to`, made
/// from inside `from`'s namespace: `Ok(true)` if it connected and echoed.
fn connects(net: &Net, from: usize, to: usize, port: u16) -> Result<bool> {
    let target = (net.addr(to), port);
    net.run_in(from, || {
        let Ok(mut stream) = TcpStream::connect_timeout(&target.into(), Duration::from_millis(500))
        else {
            return Ok(false);
        };
        stream.set_read_timeout(Some(Duration::from_millis(500)))?;
        stream.write_all(b"x")?;
        let mut byte = [0u8];
        Ok(stream.read_exact(&mut byte).is_ok())
    })
}

/// Namespaces work on this machine, and a cut really cuts: node 1 reaches
/// a listener on node 0, cannot while they are partitioned (while node 2
/// still can), and can again after healing. The other tests rely on this.
#[test]
fn namespaces_cut_and_heal() -> Result<()> {
    let net = Arc::new(Net::new(3)?);
    let listener = net.run_in(0, || Ok(TcpListener::bind((net.addr(0), 0))?))?;
    let port = listener.local_addr()?.port();
    let echo = std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut byte = [0u8];
            if stream.read_exact(&mut byte).is_ok() {
                let _ = stream.write_all(&byte);
            }
            if byte == [b'q'] {
                break;
            }
        }
    });
    ensure!(connects(&net, 1, 0, port)?, "no connection before any cut");
    net.partition(&[&[0], &[1]])?;
    ensure!(!connects(&net, 1, 0, port)?, "connected across a cut");
    ensure!(connects(&net, 2, 0, port)?, "an uncut node lost its link");
    net.heal()?;
    ensure!(connects(&net, 1, 0, port)?, "no connection after healing");
    // Stop the echo thread.
    net.run_in(1, || {
        let mut s = TcpStream::connect((net.addr(0), port))?;
        s.write_all(b"q")?;
        Ok(())
    })?;
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))?;
    Ok(())
}

/// One fault of the schedule.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// One follower cut off from every other node.
    IsolateFollower,
    /// The leader cut off from every other node.
    IsolateLeader,
    /// One client cut off from every member but one (a minority).
    ClientToMinority,
    /// Two halves that share one member: members 0 and 2 cannot reach
    /// each other, member 1 reaches both; client 0 sits with 0, client 1
    /// with 2.
    Bridge,
    /// Membership change under load: a member removed from the cluster and
    /// killed, and a new, empty member added on a fresh node in its place.
    ReplaceMember,
    /// A member SIGKILLed, restarted on its data after the hold.
    KillMember,
    /// A member SIGSTOPped (sockets open, answering nothing), SIGCONT after
    /// the hold.
    PauseMember,
}

/// The seed: `FENCECHECK_NEMESIS_SEED`, else from the clock (printed).
fn seed() -> Result<u64> {
    match std::env::var("FENCECHECK_NEMESIS_SEED") {
        Ok(text) => text.parse().context("FENCECHECK_NEMESIS_SEED"),
        Err(_) => Ok(std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos() as u64
            | 1),
    }
}

/// CLOCK_MONOTONIC in nanoseconds, the clock the client processes stamp
/// their lines with: the timeline's time base.
fn monotonic_ns() -> u128 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u128::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u128::try_from(t.tv_nsec).unwrap_or(0)
}

/// The longest time between two consecutive grants (any client), in ms.
fn longest_gap_ms(grants: &[Grant]) -> u128 {
    let mut ends: Vec<u128> = grants.iter().map(|g| g.end).collect();
    ends.sort_unstable();
    ends.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0) / 1_000_000
}

/// Two client processes (own namespaces) acquire, write through the fence
/// to a shared SQLite resource, and release one lock on a
/// 3-member cluster (own namespaces) through a seeded schedule of eight
/// partitions (more with `FENCECHECK_NEMESIS_MINUTES`), each healed before
/// the next: no token is ever granted twice
/// or below one granted before its request, etcd's committed history passes
/// the checker, no write below an applied token becomes visible, a client
/// told stale-fence stops, no two leases are believed held at once, and the
/// lock makes progress after every heal.
#[test]
fn partitions_never_reorder_grants() -> Result<()> {
    let seed = seed()?;
    eprintln!("nemesis seed {seed} (FENCECHECK_NEMESIS_SEED={seed} replays the schedule)");
    let net = Arc::new(Net::new(MEMBERS + CLIENTS + SPARES)?);
    let mut cluster = Cluster::start_in(net.clone(), MEMBERS)?;
    let authority = cluster.status(0)?.cluster_id;
    let minutes: u64 = match std::env::var("FENCECHECK_NEMESIS_MINUTES") {
        Ok(text) => text.parse().context("FENCECHECK_NEMESIS_MINUTES")?,
        Err(_) => 0,
    };
    let soak = Duration::from_secs(minutes * 60);
    // The clients outlive the schedule (they stop when told), write each
    // grant twice through the fence to one shared SQLite resource, and
    // every tenth lease pause past its end before writing.
    let dir = tempfile::tempdir()?;
    let resource = dir.path().join("resource.db");
    {
        // Made before the clients start (they would race to switch it to WAL).
        let conn = rusqlite::Connection::open(&resource)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        fencecheck_sqlite::install(&conn)?;
        conn.execute_batch(
            "CREATE TABLE visible (seq INTEGER PRIMARY KEY AUTOINCREMENT,
                 lease_id TEXT NOT NULL, n INTEGER NOT NULL,
                 epoch INTEGER NOT NULL, counter INTEGER NOT NULL)",
        )?;
    }
    let extra = [
        "--resource".to_owned(),
        resource.display().to_string(),
        "--writes".to_owned(),
        "2".to_owned(),
        "--pause-every".to_owned(),
        "10".to_owned(),
    ];
    let clients_started = monotonic_ns();
    let mut clients = Clients::spawn_with(
        &cluster,
        CLIENTS,
        u64::MAX,
        120 + 2 * soak.as_secs(),
        &extra,
    )?;
    clients.wait_grants(20, "before faults")?;

    let mut rng = Rng(seed);
    let started = Instant::now();
    let mut schedule = Vec::new();
    let mut free: Vec<usize> = (MEMBERS + CLIENTS..MEMBERS + CLIENTS + SPARES).collect();
    let mut round = 0;
    let mut spans = Vec::new();
    while round < 8 || started.elapsed() < soak {
        round += 1;
        // Round 4 always changes membership, while spare nodes last.
        let fault = match rng.below(7) {
            _ if round == 4 => Fault::ReplaceMember,
            4 => Fault::ReplaceMember,
            0 => Fault::IsolateFollower,
            1 => Fault::IsolateLeader,
            2 => Fault::ClientToMinority,
            3 => Fault::Bridge,
            5 => Fault::KillMember,
            _ => Fault::PauseMember,
        };
        let leader = cluster.wait_healthy()?;
        let client = |c: usize| MEMBERS + c;
        let mut signalled = None;
        let node = |m: usize| cluster.node(m);
        let injected = monotonic_ns();
        let what = match fault {
            Fault::IsolateFollower => {
                let follower = (leader + 1 + rng.below(2) as usize) % MEMBERS;
                net.isolate(node(follower))?;
                format!("member {follower} (follower) isolated")
            }
            Fault::IsolateLeader => {
                net.isolate(node(leader))?;
                format!("member {leader} (leader) isolated")
            }
            Fault::ClientToMinority => {
                let c = rng.below(CLIENTS as u64) as usize;
                let keep = rng.below(MEMBERS as u64) as usize;
                let others: Vec<usize> = (0..net.size())
                    .filter(|&n| n != node(keep) && n != client(c))
                    .collect();
                net.partition(&[&[client(c), node(keep)], &others])?;
                format!("client {c} left with member {keep} only")
            }
            Fault::Bridge => {
                net.partition(&[&[node(0), client(0)], &[node(2), client(1)]])?;
                "bridge: members 0 and 2 apart, 1 reaches both".to_owned()
            }
            Fault::ReplaceMember => {
                let victim = rng.below(MEMBERS as u64) as usize;
                // A node no member runs on: a spare, or one a replaced
                // member left (its namespace, with the old process gone).
                let spare = free.remove(0);
                free.push(node(victim));
                cluster.replace_member(victim, spare)?;
                format!("member {victim} removed and replaced by a new member on node {spare}")
            }
            Fault::KillMember => {
                let victim = rng.below(MEMBERS as u64) as usize;
                cluster.kill(victim)?;
                signalled = Some((victim, "killed"));
                format!(
                    "member {victim} SIGKILLed{}",
                    if victim == leader { " (leader)" } else { "" }
                )
            }
            Fault::PauseMember => {
                let victim = rng.below(MEMBERS as u64) as usize;
                cluster.stop(victim)?;
                signalled = Some((victim, "stopped"));
                format!(
                    "member {victim} SIGSTOPped{}",
                    if victim == leader { " (leader)" } else { "" }
                )
            }
        };
        let at = started.elapsed().as_millis();
        eprintln!("  t+{at} ms round {round}: {what}");
        schedule.push((at, what));
        std::thread::sleep(HOLD);
        net.heal()?;
        if let Some((victim, signal)) = signalled {
            if signal == "killed" {
                cluster.restart(victim)?;
            } else {
                cluster.resume(victim)?;
            }
        }
        spans.push(timeline::FaultSpan {
            kind: match fault {
                Fault::ReplaceMember => timeline::Kind::Membership,
                Fault::KillMember | Fault::PauseMember => timeline::Kind::Process,
                _ => timeline::Kind::Partition,
            },
            label: schedule.last().map(|(_, w)| w.clone()).unwrap_or_default(),
            start: injected,
            end: monotonic_ns(),
        });
        cluster.wait_healthy()?;
        clients.wait_grants(5, &format!("round {round}: after healing ({fault:?})"))?;
    }

    let tally = clients.finish()?;
    // Drawn before the checks, so a failing run leaves its picture too.
    if let Some(path) = std::env::var_os("FENCECHECK_NEMESIS_SVG") {
        let path = std::path::PathBuf::from(path);
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let svg = timeline::svg(&timeline::Run {
            seed,
            clients: CLIENTS,
            start: clients_started,
            faults: &spans,
            tally: &tally,
            ttl_ms: TTL_MS,
        });
        std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("nemesis timeline: {}", path.display());
    }
    let cross = check_history(&tally.grants, authority)?;
    let committed = check_store(&cluster, &tally)?;
    let writes = check_fenced_writes(&tally, &resource, TTL_MS)?;
    summary("nemesis", &tally, cross, committed);
    eprintln!(
        "nemesis seed {seed}: {} faults, {} pauses past the lease, {} renewals lost; writes {} \
         applied, {} stale (each stopped its lease), {} errors; closest two leases came to \
         overlapping: {} µs; longest time without a grant {} ms; verdict: ok",
        schedule.len(),
        tally.pauses,
        tally.renewals_lost,
        writes.applied,
        writes.stale,
        writes.errors,
        writes
            .closest_us
            .map_or("n/a".to_owned(), |c| c.to_string()),
        longest_gap_ms(&tally.grants)
    );
    ensure!(writes.applied > 0, "no write was applied");
    ensure!(
        cross > 0,
        "no grant was ordered after another process's grant"
    );
    if tally.grants.iter().all(|g| g.process == 0) || tally.grants.iter().all(|g| g.process == 1) {
        bail!("only one client ever acquired");
    }
    next_grant_is_above(&cluster, &tally.grants)
}

/// The fenced-write checks can fail: a write after stale-fence, a lower
/// token made visible, an acknowledged write missing, a refused one
/// visible, and two overlapping lease beliefs are each caught.
#[test]
fn fenced_write_checker_catches_violations() -> Result<()> {
    use etcd_clients::{Tally, Write};
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("resource.db");
    let conn = rusqlite::Connection::open(&db)?;
    conn.execute_batch(
        "CREATE TABLE visible (seq INTEGER PRIMARY KEY AUTOINCREMENT,
             lease_id TEXT NOT NULL, n INTEGER NOT NULL, epoch INTEGER NOT NULL, counter INTEGER NOT NULL);
         INSERT INTO visible (lease_id, n, epoch, counter) VALUES ('a', 1, 0, 1), ('b', 1, 0, 2);",
    )?;
    let ms = 1_000_000u128;
    let grant = |process, lease: &str, counter, start: u128, end: u128| Grant {
        process,
        lease_id: lease.to_owned(),
        token: fencecheck::Token::new(7, 0, counter),
        start,
        end,
    };
    let write = |lease: &str, n, outcome: &str| Write {
        process: 0,
        lease_id: lease.to_owned(),
        n,
        outcome: outcome.to_owned(),
        start: 0,
        end: 0,
    };
    let good = || Tally {
        grants: vec![
            grant(0, "a", 1, 0, ms),
            grant(1, "b", 2, 1_500 * ms, 1_600 * ms),
        ],
        writes: vec![write("a", 1, "applied"), write("b", 1, "applied")],
        ..Tally::default()
    };
    ensure!(check_fenced_writes(&good(), &db, TTL_MS)?.applied == 2);

    let mut after_stale = good();
    after_stale.writes = vec![write("a", 1, "stale"), write("a", 2, "applied")];
    ensure!(check_fenced_writes(&after_stale, &db, TTL_MS).is_err());

    let mut lost = good();
    lost.writes.push(write("b", 2, "applied"));
    ensure!(check_fenced_writes(&lost, &db, TTL_MS).is_err());

    let mut refused_visible = good();
    refused_visible.writes[1].outcome = "stale".to_owned();
    ensure!(check_fenced_writes(&refused_visible, &db, TTL_MS).is_err());

    let mut overlap = good();
    overlap.grants[1] = grant(1, "b", 2, 500 * ms, 600 * ms); // a believes until 1000 ms
    ensure!(check_fenced_writes(&overlap, &db, TTL_MS).is_err());
    overlap.released_at.insert("a".to_owned(), 550 * ms); // a released first
    ensure!(check_fenced_writes(&overlap, &db, TTL_MS).is_ok());

    conn.execute(
        "INSERT INTO visible (lease_id, n, epoch, counter) VALUES ('c', 1, 0, 1)",
        [],
    )?;
    ensure!(
        check_fenced_writes(&good(), &db, TTL_MS).is_err(),
        "a lower token after a higher one"
    );
    Ok(())
}
