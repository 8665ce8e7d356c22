//! `RedisCoordinator::connect_cluster` and `fencecheck authority … --redis
//! URL --redis URL` against a real Redis Cluster and Valkey cluster (3
//! masters, 3 replicas, every node loading the module; the harness of
//! host/redis/tests/common/cluster.rs): each lock's commands go to the
//! master of its slot, a lock whose slot moves keeps working (ASK, then
//! MOVED) with its tokens increasing, and seeds that are replicas or
//! masters of other slots serve acquires.

#[path = "../../redis/tests/common/cluster.rs"]
#[allow(missing_docs)]
mod cluster;
#[path = "../../redis/tests/common/mod.rs"]
#[allow(missing_docs)]
mod common;

use std::process::{Command, Output};

use anyhow::{Context, Result, bail, ensure};
use cluster::{Cluster, name_in};
use common::{Conn, Kind, Value, kinds};
use fencecheck::{Token, TokenText};
use fencecheck_authority::{
    AcquireOutcome, AuthorityError, Coordinator, Grant, RedisCoordinator, ReleaseOutcome,
    RenewOutcome,
};

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

fn grant(c: &RedisCoordinator, lock: &str, lease: &str) -> Result<Grant> {
    match c.acquire(lock, lease, 600_000)? {
        AcquireOutcome::Acquired(g) => Ok(g),
        other => bail!("{lock}: not acquired: {other:?}"),
    }
}

/// `b` is a later grant than `a` of the same authority (tokens of
/// different authorities are never compared).
fn above(b: Token, a: Token) -> bool {
    b.authority == a.authority && (b.epoch, b.counter) > (a.epoch, a.counter)
}

/// Whether the node on `port` holds `lock`'s lease state. ASKING first,
/// so a node importing the slot answers; a node migrating it answers ASK
/// for a key it no longer has.
fn holds(port: u16, lock: &str) -> Result<bool> {
    let key = fencecheck_redis::lease_key(lock.as_bytes())
        .ok()
        .context("lease key")?;
    let mut conn = Conn::connect(port)?;
    conn.ok(&["ASKING"])?;
    let v = conn.cmd(&[b"EXISTS".as_slice(), &key])?;
    match (v.int(), v.error()) {
        (Some(n), _) => Ok(n == 1),
        (None, Some(e)) if e.starts_with("ASK ") => Ok(false),
        _ => bail!("EXISTS on {port}: {v:?}"),
    }
}

fn fencecheck(args: &[&str]) -> Result<Output> {
    Command::new(env!("CARGO_BIN_EXE_fencecheck"))
        .args(args)
        .env_remove("FENCECHECK_COMPONENT")
        .output()
        .context("running fencecheck")
}

/// Seeded with one replica only, the coordinator acquires, renews and
/// releases a lock on every shard, each lock's state on its slot's master;
/// another lease is busy, the next grant's token is above the first, and
/// the token fences a scope on that shard through a cluster client. The
/// coordinator's authority is the lineage the module grants under in
/// slot("0") (a lock named `0`'s tokens carry it).
#[test]
fn coordinator_on_every_shard() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        every_shard(&cluster).with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

fn every_shard(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    ensure!(masters.len() == 3, "{masters:?}");
    let replica = cluster.replica_of(masters[0].port)?;
    let coordinator = RedisCoordinator::connect_cluster(&[url(replica.port)])?;
    let mut client = cluster.client()?;
    for (i, m) in masters.iter().enumerate() {
        let lock = name_in(&format!("job/{i}/"), &m.ranges)?;
        let a = grant(&coordinator, &lock, "a7")?;
        ensure!(holds(m.port, &lock)?, "{lock} not on its master {}", m.port);
        match coordinator.acquire(&lock, "b9", 600_000)? {
            AcquireOutcome::Busy { holder, .. } => ensure!(holder == "a7"),
            other => bail!("{lock}: expected busy: {other:?}"),
        }
        ensure!(matches!(
            coordinator.renew(&lock, "a7", a.token, 600_000)?,
            RenewOutcome::Renewed { .. }
        ));
        ensure!(coordinator.release(&lock, "b9", a.token)? == ReleaseOutcome::NotOwner);
        ensure!(coordinator.release(&lock, "a7", a.token)? == ReleaseOutcome::Released);
        let b = grant(&coordinator, &lock, "b9")?;
        ensure!(
            above(b.token, a.token),
            "{lock}: {:?} after {:?}",
            b.token,
            a.token
        );

        let scope = name_in(&format!("report/{i}/"), &m.ranges)?;
        let text = TokenText(b.token).to_string();
        let set = client.ok(scope.as_bytes(), &["FENCE.SET", &scope, &text, "b9"])?;
        ensure!(common::applied(&set)? == 1, "{set:?}");
        let old = TokenText(a.token).to_string();
        let stale = client.cmd(scope.as_bytes(), &["FENCE.SET", &scope, &old, "a7"])?;
        ensure!(
            stale.error().is_some_and(|e| e.starts_with("STALEFENCE")),
            "{stale:?}"
        );
    }
    let zero = grant(&coordinator, "0", "a7")?;
    ensure!(
        zero.token.authority == coordinator.authority(),
        "{:?} vs authority {}",
        zero.token,
        coordinator.authority()
    );
    Ok(())
}

/// A lock whose slot moves (MIGRATING/IMPORTING by hand, its state moved
/// with MIGRATE): mid-move the coordinator follows ASK to renew, a lock
/// with no state yet is refused with a clear error once its bounded
/// retries run out (nothing granted), and after the hand-over it follows
/// MOVED; the next grant's token is above every earlier one. Redis 7.0
/// and Valkey 8.
#[test]
fn coordinator_follows_a_moving_lock() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        moving_lock(&cluster).with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

fn moving_lock(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    let (a, b) = (&masters[0], &masters[1]);
    let seeds: Vec<String> = masters.iter().map(|m| url(m.port)).collect();
    let coordinator = RedisCoordinator::connect_cluster(&seeds)?;
    let lock = name_in("move/", &a.ranges)?;
    let slot = fencecheck_redis::slot(lock.as_bytes());
    let first = grant(&coordinator, &lock, "a7")?;

    let (mut on_a, mut on_b) = (Conn::connect(a.port)?, Conn::connect(b.port)?);
    let s = slot.to_string();
    on_b.ok(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &a.id])?;
    on_a.ok(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &b.id])?;
    let key = fencecheck_redis::lease_key(lock.as_bytes())
        .ok()
        .context("lease key")?;
    let moved = on_a.ok(&[
        b"MIGRATE".as_slice(),
        b"127.0.0.1",
        b.port.to_string().as_bytes(),
        &key,
        b"0",
        b"5000",
    ])?;
    ensure!(moved == Value::Simple("OK".into()), "MIGRATE: {moved:?}");
    // The old master now sends the lock's commands on with ASK.
    let direct = on_a.cmd(&["FENCE.RENEW", &lock, "a7", "1.1", "1000"])?;
    ensure!(
        direct.error().is_some_and(|e| e.starts_with("ASK ")),
        "{direct:?}"
    );
    ensure!(matches!(
        coordinator.renew(&lock, "a7", first.token, 600_000)?,
        RenewOutcome::Renewed { .. }
    ));
    // A lock with no state in a slot being moved waits for the move's end.
    let fresh = format!("{{{lock}}}:fresh");
    match coordinator.acquire(&fresh, "c1", 600_000) {
        Err(AuthorityError::Redis(e)) => ensure!(
            e.contains("TRYAGAIN") || e.contains("ASK"),
            "not a clear error: {e}"
        ),
        other => bail!("a new lock granted mid-move: {other:?}"),
    }
    ensure!(!holds(a.port, &fresh)? && !holds(b.port, &fresh)?);

    // The rest of the slot (the module's per-slot lineage and floor), as a
    // reshard moves it before the hand-over.
    cluster::migrate_slot_keys(a.port, b.port, slot)?;
    for m in &masters {
        Conn::connect(m.port)?.ok(&["CLUSTER", "SETSLOT", &s, "NODE", &b.id])?;
    }
    // The coordinator's map still names the old master: MOVED.
    ensure!(
        on_a.cmd(&["FENCE.RELEASE", &lock, "a7", "1.1"])?
            .error()
            .is_some_and(|e| e.starts_with("MOVED ")),
        "the old master still serves the slot"
    );
    ensure!(coordinator.release(&lock, "a7", first.token)? == ReleaseOutcome::Released);
    let second = grant(&coordinator, &lock, "b9")?;
    ensure!(holds(b.port, &lock)?);
    // Nothing of the slot stayed behind on the old master.
    let left = on_a.ok(&["CLUSTER", "COUNTKEYSINSLOT", &s])?;
    ensure!(left.int() == Some(0), "{left:?}");
    ensure!(
        above(second.token, first.token),
        "{:?} after {:?}",
        second.token,
        first.token
    );
    let third = grant(&coordinator, &fresh, "c1")?;
    ensure!(holds(b.port, &fresh)?, "{third:?}");
    Ok(())
}

/// `fencecheck authority … --redis` with a seed list (a replica and a
/// master that does not serve the lock, repeated or comma-separated):
/// acquire, busy, renew, release, restore on every master (the next grant
/// is in the restored epoch); one URL naming a cluster node is refused
/// with an error that says to give seeds.
#[test]
fn cli_authority_with_seeds() -> Result<()> {
    let cluster = Cluster::start(Kind::Redis)?;
    cli_seeds(&cluster).with_context(|| cluster.logs())
}

fn token_of(out: &Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(out.status.success(), "{out:?}");
    stdout
        .split(' ')
        .nth(5)
        .map(str::to_string)
        .with_context(|| format!("no token in {stdout:?}"))
}

fn cli_seeds(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    let lock = name_in("cli/", &masters[2].ranges)?;
    let replica = url(cluster.replica_of(masters[2].port)?.port);
    let other = url(masters[0].port);
    let repeated = ["--redis", replica.as_str(), "--redis", other.as_str()];
    let list = format!("{replica},{other}");
    let commas = ["--redis", list.as_str()];

    let acquire = |seeds: &[&str], lease: &str| -> Result<Output> {
        let mut args = vec!["authority", "acquire"];
        args.extend_from_slice(seeds);
        args.extend_from_slice(&[lock.as_str(), lease, "600000"]);
        fencecheck(&args)
    };
    let a7 = token_of(&acquire(&repeated, "a7")?)?;
    ensure!(holds(masters[2].port, &lock)?);
    let busy = acquire(&commas, "b9")?;
    ensure!(busy.status.code() == Some(3), "{busy:?}");
    let mut renew = vec!["authority", "renew"];
    renew.extend_from_slice(&commas);
    renew.extend_from_slice(&[lock.as_str(), "a7", &a7, "600000"]);
    let renewed = fencecheck(&renew)?;
    ensure!(renewed.status.success(), "{renewed:?}");
    let mut release = vec!["authority", "release"];
    release.extend_from_slice(&repeated);
    release.extend_from_slice(&[lock.as_str(), "a7", &a7]);
    let released = fencecheck(&release)?;
    ensure!(released.status.success(), "{released:?}");
    let mut restore = vec!["authority", "restore"];
    restore.extend_from_slice(&commas);
    restore.extend_from_slice(&["--at-least", "77"]);
    let restored = fencecheck(&restore)?;
    ensure!(
        String::from_utf8_lossy(&restored.stdout).trim() == "restored epoch-floor 77",
        "{restored:?}"
    );
    // Every master's floor was raised: a new lock on each shard is in it.
    let coordinator = RedisCoordinator::connect_cluster(&[&replica])?;
    for (i, m) in masters.iter().enumerate() {
        let g = grant(
            &coordinator,
            &name_in(&format!("new/{i}/"), &m.ranges)?,
            "e5",
        )?;
        ensure!(g.token.epoch == 77, "{}: {g:?}", m.port);
    }
    let c1 = token_of(&acquire(&repeated, "c1")?)?;
    let (before, after) = (a7.parse::<TokenText>()?.0, c1.parse::<TokenText>()?.0);
    ensure!(
        above(after, before) && after.epoch == 77,
        "{after:?} after {before:?}"
    );

    // One URL is one server: a cluster node that does not serve the
    // lineage key's slot says to give seeds.
    let lineage = fencecheck_redis::slot(b"fencecheck:lineage");
    let elsewhere = masters
        .iter()
        .find(|m| !m.ranges.iter().any(|&(x, y)| (x..=y).contains(&lineage)))
        .context("a master without the lineage slot")?;
    let single = fencecheck(&[
        "authority",
        "acquire",
        "--redis",
        &url(elsewhere.port),
        &lock,
        "d4",
        "600000",
    ])?;
    let stderr = String::from_utf8_lossy(&single.stderr);
    ensure!(
        !single.status.success() && stderr.contains("cluster node") && stderr.contains("seed"),
        "{single:?}"
    );
    Ok(())
}

/// Seed lists that cannot be a cluster are refused at connect, with errors
/// that say why: no seed, a server without cluster support, seeds naming
/// different credentials.
#[test]
fn connect_cluster_refuses_bad_seeds() -> Result<()> {
    let none: [&str; 0] = [];
    match RedisCoordinator::connect_cluster(&none) {
        Err(AuthorityError::Redis(e)) => ensure!(e.contains("no seed"), "{e}"),
        other => bail!("no seeds: {:?}", other.err()),
    }
    let single = common::Server::start(Kind::Redis, common::Options::module())?;
    match RedisCoordinator::connect_cluster(&[url(single.port)]) {
        Err(AuthorityError::Redis(e)) => ensure!(
            e.contains("CLUSTER SLOTS") && e.contains("cluster support disabled"),
            "{e}"
        ),
        other => bail!("a single server as a cluster: {:?}", other.err()),
    }
    let mixed = [
        format!("redis://:a@127.0.0.1:{}", single.port),
        format!("redis://:b@127.0.0.1:{}", single.port),
    ];
    match RedisCoordinator::connect_cluster(&mixed) {
        Err(AuthorityError::Redis(e)) => ensure!(e.contains("different users"), "{e}"),
        other => bail!("mixed credentials: {:?}", other.err()),
    }
    Ok(())
}
