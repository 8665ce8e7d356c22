//! The state that is not one scope's or one lock's (the lineage that new
//! grants carry, the epoch floor FENCE.RESTORE raises) in a cluster: a
//! floor raised on a master holds for every lock it serves, whatever the
//! lock's slot; every key the module writes lives in, and is listed under,
//! its own slot on a master that serves it; and a slot holding a lock moves
//! whole (the manual steps of `redis-cli --cluster reshard`), its lineage
//! and floor with it. FENCE.RESTORE reaches the replica, and refuses inside
//! MULTI and while a slot of its node moves; a one-node cluster keeps the
//! per-slot state (signing tables too) across a SIGKILL (AOF) and a
//! restart from an RDB.
//!
//! Against the module before per-slot node state (Valkey 8 filed
//! `fencecheck:lineage` and `fencecheck:epoch-floor` under the writing
//! command's slot, Redis 7.0 under their own slot, which the node may not
//! serve), these checks failed on both servers: see docs/redis.md, Cluster.

use anyhow::{Context, Result, ensure};

use crate::cluster::{Cluster, NodeLine, migrate_slot_keys, name_in, node_options};
use crate::common::{Conn, Kind, Server, Value, kinds};

/// The floor FENCE.RESTORE is given: far above any epoch a lock could
/// have reached in the test.
const FLOOR: u64 = 5_000_000;

const SECRET: &str = "3:8a1f0c5e9d7b3a2c4e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5";

/// Each server's checks run to the end and every failure is reported, so
/// one run shows what holds where.
#[test]
fn node_state_in_every_slot() -> Result<()> {
    let mut failed = Vec::new();
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        for problem in node_state(&cluster)? {
            failed.push(format!("{kind:?}: {problem}"));
        }
        if !failed.is_empty() {
            eprintln!("{}", cluster.logs());
        }
    }
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}

/// `AUTHORITY:EPOCH.COUNTER` of an `acquired` reply, as (authority, epoch).
fn grant(v: &Value) -> Result<(String, u64, String)> {
    ensure!(
        v.items().first() == Some(&Value::Simple("acquired".into())),
        "not acquired: {v:?}"
    );
    let text = v.items().get(1).and_then(Value::text).context("token")?;
    let (authority, rest) = text.split_once(':').context("token authority")?;
    let epoch = rest
        .split('.')
        .next()
        .and_then(|e| e.parse().ok())
        .context("token epoch")?;
    Ok((authority.to_string(), epoch, text))
}

/// A master serving neither slot of the names the module once used for
/// its node-wide keys, so a key filed under its own name's slot shows up
/// as one in a slot the node does not serve.
fn plain_master(masters: &[NodeLine]) -> Result<NodeLine> {
    let old: Vec<u16> = ["fencecheck:lineage", "fencecheck:epoch-floor"]
        .iter()
        .map(|k| fencecheck_redis::slot(k.as_bytes()))
        .collect();
    masters
        .iter()
        .find(|m| {
            !m.ranges
                .iter()
                .any(|&(a, b)| old.iter().any(|s| (a..=b).contains(s)))
        })
        .cloned()
        .context("every master serves one of the old key slots")
}

/// Every key of the module on `port` hashes to a slot the node serves and
/// is listed by GETKEYSINSLOT of that slot.
fn keys_in_their_slots(port: u16, serves: impl Fn(u16) -> bool) -> Result<usize> {
    let mut c = Conn::connect(port)?;
    let mut cursor = "0".to_string();
    let mut seen = 0;
    loop {
        let page = c.ok(&["SCAN", &cursor, "MATCH", "fencecheck:*", "COUNT", "1000"])?;
        cursor = page
            .items()
            .first()
            .and_then(Value::text)
            .context("cursor")?;
        for key in page.items().get(1).map(Value::items).unwrap_or_default() {
            let key = key.bytes().context("key name")?;
            let shown = String::from_utf8_lossy(key);
            let slot = fencecheck_redis::slot(key);
            ensure!(
                serves(slot),
                "{shown} is in slot {slot}, which node {port} does not serve"
            );
            let listed = c.ok(&["CLUSTER", "GETKEYSINSLOT", &slot.to_string(), "100000"])?;
            ensure!(
                listed.items().iter().any(|k| k.bytes() == Some(key)),
                "{shown} is not listed in its slot {slot} on node {port}"
            );
            seen += 1;
        }
        if cursor == "0" {
            return Ok(seen);
        }
    }
}

/// The steps `redis-cli --cluster reshard` takes for one slot; any key
/// that cannot be moved or any refusal to hand the slot over is an error.
/// Mid-move, FENCE.RESTORE on either node waits for the move's end.
fn move_slot(masters: &[NodeLine], slot: u16, from: &NodeLine, to: &NodeLine) -> Result<()> {
    let s = slot.to_string();
    let mut src = Conn::connect(from.port)?;
    let mut dst = Conn::connect(to.port)?;
    dst.ok(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id])?;
    src.ok(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id])?;
    for node in [&mut src, &mut dst] {
        let r = node.cmd(&["FENCE.RESTORE", "1"])?;
        ensure!(
            r.error().is_some_and(|e| e.starts_with("TRYAGAIN")),
            "FENCE.RESTORE mid-move: {r:?}"
        );
    }
    migrate_slot_keys(from.port, to.port, slot)?;
    for m in masters {
        Conn::connect(m.port)?.ok(&["CLUSTER", "SETSLOT", &s, "NODE", &to.id])?;
    }
    ensure!(
        src.ok(&["CLUSTER", "COUNTKEYSINSLOT", &s])?.int() == Some(0),
        "keys left behind in slot {slot}"
    );
    Ok(())
}

/// The three checks, each on its own: the problems found (an empty list:
/// all hold).
fn node_state(cluster: &Cluster) -> Result<Vec<String>> {
    let masters = cluster.masters()?;
    let a = plain_master(&masters)?;
    let b = masters
        .iter()
        .find(|m| m.id != a.id)
        .cloned()
        .context("a second master")?;
    let lock1 = name_in("held", &a.ranges)?;
    let slot1 = fencecheck_redis::slot(lock1.as_bytes());
    let serves = |m: &NodeLine, s: u16| m.ranges.iter().any(|&(x, y)| (x..=y).contains(&s));
    let mut problems = Vec::new();
    let token1 = match floor_in_every_slot(cluster, &a, &lock1) {
        Ok(token) => Some(token),
        Err(e) => {
            problems.push(format!("the restored floor: {e:#}"));
            None
        }
    };
    match keys_in_their_slots(a.port, |s| serves(&a, s)) {
        // Ten leases at least, once the grants above were made.
        Ok(n) if n < 10 && token1.is_some() => {
            problems.push(format!("where the keys live: {n} keys on {}", a.port));
        }
        Ok(_) => {}
        Err(e) => problems.push(format!("where the keys live: {e:#}")),
    }
    if let Some((authority, token)) = token1 {
        let moved = move_slot(&masters, slot1, &a, &b)
            .and_then(|()| after_the_move(cluster, &lock1, &authority, &token))
            .and_then(|()| keys_in_their_slots(b.port, |s| s == slot1 || serves(&b, s)))
            .and_then(|_| keys_in_their_slots(a.port, |s| s != slot1 && serves(&a, s)));
        if let Err(e) = moved {
            problems.push(format!("moving the slot of a lock: {e:#}"));
        }
    }
    Ok(problems)
}

/// FENCE.RESTORE on master `a` after a grant of `lock1`: new locks in
/// eight slots of `a`, `lock1` again and a second lock of its slot grant
/// at or above the floor, the two of one slot under one lineage. Answers
/// `lock1`'s lineage and its holder's token.
fn floor_in_every_slot(cluster: &Cluster, a: &NodeLine, lock1: &str) -> Result<(String, String)> {
    let mut client = cluster.client()?;
    let mut on_a = Conn::connect(a.port)?;
    let (authority1, _, token1) =
        grant(&client.ok(lock1.as_bytes(), &["FENCE.ACQUIRE", lock1, "a7", "600000"])?)?;
    // Not inside MULTI: the server would file every key under one slot.
    on_a.ok(&["MULTI"])?;
    on_a.send(&["FENCE.RESTORE", &FLOOR.to_string()])?;
    on_a.read()?;
    let exec = on_a.ok(&["EXEC"])?;
    ensure!(
        exec.items().first().and_then(Value::error).is_some(),
        "FENCE.RESTORE in MULTI: {exec:?}"
    );
    let restored = on_a.ok(&["FENCE.RESTORE", &FLOOR.to_string()])?;
    ensure!(
        restored.items().get(1).and_then(Value::int) == Some(FLOOR as i64),
        "{restored:?}"
    );
    // The floors reached a's replica, every slot's.
    ensure!(
        on_a.ok(&["WAIT", "1", "5000"])?.int() == Some(1),
        "no replica"
    );
    let mut replica = Conn::connect(cluster.replica_of(a.port)?.port)?;
    replica.ok(&["READONLY"])?;
    let (first, last) = *a.ranges.first().context("a serves no slot")?;
    for slot in [first, last] {
        let key = fencecheck_redis::slot_floor_key(slot);
        let floor = replica.ok(&[b"GET".as_slice(), &key])?;
        ensure!(
            floor.text() == Some(FLOOR.to_string()),
            "the replica's floor of slot {slot}: {floor:?}"
        );
    }
    let mut below = Vec::new();
    for i in 0..8 {
        let lock = name_in(&format!("fresh{i}-"), &a.ranges)?;
        let (_, epoch, token) =
            grant(&client.ok(lock.as_bytes(), &["FENCE.ACQUIRE", &lock, "b9", "600000"])?)?;
        if epoch < FLOOR {
            below.push(format!(
                "{lock} (slot {}) {token}",
                fencecheck_redis::slot(lock.as_bytes())
            ));
        }
    }
    ensure!(
        below.is_empty(),
        "{} of 8 new locks granted below the restored floor {FLOOR}: {}",
        below.len(),
        below.join(", ")
    );
    let released = client.ok(lock1.as_bytes(), &["FENCE.RELEASE", lock1, "a7", &token1])?;
    ensure!(
        released.items().first() == Some(&Value::Simple("released".into())),
        "{released:?}"
    );
    let (again_authority, epoch, token1) =
        grant(&client.ok(lock1.as_bytes(), &["FENCE.ACQUIRE", lock1, "c1", "600000"])?)?;
    ensure!(epoch >= FLOOR, "{lock1} granted {token1} below {FLOOR}");
    ensure!(again_authority == authority1, "{lock1} changed lineage");
    let second = format!("{{{lock1}}}:second");
    let (authority2, epoch, _) = grant(&client.ok(
        second.as_bytes(),
        &["FENCE.ACQUIRE", &second, "d2", "600000"],
    )?)?;
    ensure!(epoch >= FLOOR, "{second} below the floor");
    ensure!(
        authority2 == authority1,
        "two locks of one slot grant under two lineages"
    );
    Ok((authority1, token1))
}

/// After its slot moved, `lock1` is still held by `c1` (`token1`), and
/// its next grants, and those of a new lock of its slot, keep its lineage
/// and the floor.
fn after_the_move(cluster: &Cluster, lock1: &str, authority1: &str, token1: &str) -> Result<()> {
    let mut client = cluster.client()?;
    let busy = client.ok(lock1.as_bytes(), &["FENCE.ACQUIRE", lock1, "e3", "600000"])?;
    ensure!(
        busy.items().first() == Some(&Value::Simple("busy".into())),
        "{busy:?}"
    );
    let released = client.ok(lock1.as_bytes(), &["FENCE.RELEASE", lock1, "c1", token1])?;
    ensure!(
        released.items().first() == Some(&Value::Simple("released".into())),
        "{released:?}"
    );
    let third = format!("{{{lock1}}}:third");
    for lock in [lock1, third.as_str()] {
        let (authority, epoch, token) =
            grant(&client.ok(lock.as_bytes(), &["FENCE.ACQUIRE", lock, "f4", "600000"])?)?;
        ensure!(
            epoch >= FLOOR,
            "{lock} granted {token} below {FLOOR} after the move"
        );
        ensure!(
            authority == authority1,
            "{lock} granted under another lineage after its slot moved"
        );
    }
    Ok(())
}

/// A one-node cluster (every slot on one master) keeps the per-slot
/// lineage and floors across a SIGKILL and restart, from the AOF
/// (`appendfsync always`) and from an RDB: each key back in its own slot,
/// grants of new locks in any slot at or above the floor, under the slot's
/// lineage, and the signing tables FENCE.KEYS wrote still refusing
/// unsigned tokens, alike in every slot.
#[test]
fn node_state_survives_restart() -> Result<()> {
    for kind in kinds() {
        for aof in [true, false] {
            restart(kind, aof).with_context(|| format!("{kind:?}, AOF {aof}"))?;
        }
    }
    Ok(())
}

fn restart(kind: Kind, aof: bool) -> Result<()> {
    let options = node_options()?
        .with("appendonly", if aof { "yes" } else { "no" })
        .with("appendfsync", "always");
    let mut server = Server::start(kind, options.clone())?;
    let mut c = server.conn()?;
    c.ok(&["CLUSTER", "ADDSLOTSRANGE", "0", "16383"])?;
    wait_cluster_ok(server.port)?;
    let lock = "survivor";
    let (authority, _, _) = grant(&c.ok(&["FENCE.ACQUIRE", lock, "a7", "600000"])?)?;
    c.ok(&["FENCE.RESTORE", &FLOOR.to_string()])?;
    c.ok(&["FENCE.KEYS", "REQUIRE", "signed/", SECRET])?;
    if !aof {
        c.ok(&["SAVE"])?;
    }
    server.restart(options)?;
    wait_cluster_ok(server.port)?;
    let mut c = server.conn()?;
    let keys = keys_in_their_slots(server.port, |_| true)?;
    // Every slot's lineage, floor and signing table, and the lease.
    ensure!(keys == 3 * 16384 + 1, "{keys} keys after the restart");
    let unsigned = c.cmd(&["FENCE.SET", "signed/x", "0.1", "v"])?;
    ensure!(
        unsigned
            .error()
            .is_some_and(|e| e.starts_with("UNAUTHENTICATED")),
        "the signing tables were lost: {unsigned:?}"
    );
    let list = c.ok(&["FENCE.KEYS", "LIST"])?;
    ensure!(
        list.items().get(7) == Some(&Value::Int(0)),
        "slots unlike after the restart: {list:?}"
    );
    for name in [format!("{{{lock}}}:next"), "elsewhere".to_string()] {
        let (a, epoch, token) = grant(&c.ok(&["FENCE.ACQUIRE", &name, "b9", "600000"])?)?;
        ensure!(epoch >= FLOOR, "{name} granted {token} below {FLOOR}");
        if name.starts_with('{') {
            ensure!(a == authority, "{name} lost its slot's lineage");
        }
    }
    Ok(())
}

fn wait_cluster_ok(port: u16) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let info = Conn::connect(port)?.ok(&["CLUSTER", "INFO"])?;
        if info.text().is_some_and(|t| t.contains("cluster_state:ok")) {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the one-node cluster is not ok"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
