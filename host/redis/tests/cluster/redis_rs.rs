//! The `redis` crate's cluster client (`redis::cluster::ClusterClient`, the
//! one Rust applications use, sync API) drives the module in a real
//! cluster, seeded with one replica: what redis_py.rs shows for redis-py.
//! Each check reads what happened on the nodes themselves (plain
//! connections): where the state keys are, `FENCE.METRICS` decisions and
//! `INFO commandstats` calls, so a retry the crate made shows up.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo, SingleNodeRoutingInfo};
use redis::{ErrorKind, RedisResult, ServerErrorKind};

use crate::cluster::{Cluster, NodeLine, migrate_slot_keys, name_in};
use crate::common::{Conn, kinds};

/// The floor FENCE.RESTORE is given: above any epoch a token reached here.
const FLOOR: u64 = 5_000_000;

/// Through the `redis` crate's ClusterClient, seeded with one replica:
/// FENCE.SET/CHECK/DEL/EXEC and ACQUIRE/RENEW/RELEASE on every primary,
/// routed by key, each state key on the master serving its slot; a
/// STALEFENCE refusal is an error with code STALEFENCE, decided once (not
/// retried); a cross-slot FENCE.EXEC is refused with CROSSSLOT and writes
/// nothing; FENCE.RESTORE routed to every primary answers `restored` from
/// each; TRYAGAIN while a slot moves is retried (bounded) without a
/// decision; after the move the same client follows MOVED and the write
/// applies on the new master. And a late reply (response timeout set):
/// the crate sends the write again, so an applied write reads STALEFENCE
/// unless it carries an OPID.
#[test]
fn redis_rs_cluster_client() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        let started = Instant::now();
        checks(&cluster).with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
        eprintln!("{kind:?}: checks took {:?}", started.elapsed());
    }
    Ok(())
}

fn checks(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    ensure!(masters.len() == 3, "{masters:?}");
    let seed = cluster.replica_of(masters[0].port)?.port;
    let client = ClusterClient::new(vec![format!("redis://127.0.0.1:{seed}/")])?;
    let mut conn = client.get_connection()?;
    every_primary(&mut conn, &masters).context("every primary")?;
    stale_once(&mut conn, &masters).context("STALEFENCE")?;
    cross_slot(&mut conn, &masters).context("CROSSSLOT")?;
    restore_everywhere(&mut conn, &masters).context("FENCE.RESTORE")?;
    late_reply(seed, &masters).context("a late reply")?;
    moved(&mut conn, seed, &masters).context("a moved slot")?;
    Ok(())
}

/// `args` as one command through the crate's routing (by the first key).
fn send(conn: &mut ClusterConnection, args: &[&str]) -> RedisResult<redis::Value> {
    command(args).query(conn)
}

fn command(args: &[&str]) -> redis::Cmd {
    let mut c = redis::Cmd::new();
    for a in args {
        c.arg(*a);
    }
    c
}

/// The first word of a reply such as `applied 2` or `acquired <token> …`.
fn word(v: &redis::Value) -> Option<&str> {
    match v {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::SimpleString(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

fn item(v: &redis::Value, i: usize) -> Option<&redis::Value> {
    match v {
        redis::Value::Array(items) => items.get(i),
        _ => None,
    }
}

/// `applied <version>` → version.
fn applied(r: RedisResult<redis::Value>) -> Result<i64> {
    let v = r?;
    match (word(&v), item(&v, 1)) {
        (Some("applied"), Some(redis::Value::Int(n))) => Ok(*n),
        _ => bail!("not applied: {v:?}"),
    }
}

/// The token of an `acquired <token> <expires-at> <now>` reply.
fn acquired(r: RedisResult<redis::Value>) -> Result<String> {
    let v = r?;
    match (word(&v), item(&v, 1)) {
        (Some("acquired"), Some(redis::Value::BulkString(t))) => Ok(String::from_utf8(t.clone())?),
        (Some("acquired"), Some(redis::Value::SimpleString(t))) => Ok(t.clone()),
        _ => bail!("not acquired: {v:?}"),
    }
}

/// A refusal: the server error's code and detail (a reply is an error here).
fn refused(r: RedisResult<redis::Value>) -> Result<(String, redis::RedisError)> {
    match r {
        Ok(v) => bail!("expected a refusal, got the reply {v:?}"),
        Err(e) => {
            let code = e
                .code()
                .with_context(|| format!("not a server error: {e:?}"))?;
            Ok((code.to_string(), e))
        }
    }
}

/// `FENCE.METRICS` of the node on `port`: each series and its count.
fn decisions(port: u16) -> Result<BTreeMap<String, u64>> {
    let text = Conn::connect(port)?
        .ok(&["FENCE.METRICS"])?
        .text()
        .context("FENCE.METRICS text")?;
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, n) = line.rsplit_once(' ').context("a series line")?;
        out.insert(series.to_string(), n.parse()?);
    }
    Ok(out)
}

/// The series whose count changed from `before` to `after`, and by how much.
fn changed(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Vec<(String, u64)> {
    after
        .iter()
        .filter_map(|(k, n)| {
            let was = before.get(k).copied().unwrap_or(0);
            (*n != was).then(|| (k.clone(), n.saturating_sub(was)))
        })
        .collect()
}

fn series(operation: &str, outcome: &str, epoch: &str) -> String {
    format!(
        "fencecheck_decisions_total{{operation=\"{operation}\",outcome=\"{outcome}\",epoch=\"{epoch}\"}}"
    )
}

/// `INFO commandstats` of the node on `port` for `command` (lower case):
/// (calls, rejected_calls). Every attempt the server received counts, a
/// redirected one (MOVED, ASK) as rejected.
fn calls(port: u16, command: &str) -> Result<(u64, u64)> {
    let text = Conn::connect(port)?
        .ok(&["INFO", "commandstats"])?
        .text()
        .context("INFO text")?;
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = text.lines().find_map(|l| l.strip_prefix(&prefix)) else {
        return Ok((0, 0));
    };
    let field = |name: &str| -> Result<u64> {
        Ok(line
            .split(',')
            .find_map(|f| f.strip_prefix(&format!("{name}=")))
            .map(str::parse)
            .transpose()?
            .unwrap_or(0))
    };
    Ok((field("calls")?, field("rejected_calls")?))
}

fn exists(port: u16, key: &[u8]) -> Result<bool> {
    Ok(Conn::connect(port)?.ok(&[b"EXISTS".as_slice(), key])?.int() == Some(1))
}

fn state_key(scope: &str) -> Result<Vec<u8>> {
    fencecheck_redis::fence_key(scope.as_bytes())
        .ok()
        .context("state key")
}

fn lease_key(lock: &str) -> Result<Vec<u8>> {
    fencecheck_redis::lease_key(lock.as_bytes())
        .ok()
        .context("lease key")
}

/// Every command on a scope, a tagged scope and a lock in each primary's
/// slots, routed by key; the node's own keyspace shows where each landed.
fn every_primary(conn: &mut ClusterConnection, masters: &[NodeLine]) -> Result<()> {
    for (i, m) in masters.iter().enumerate() {
        let scope = name_in(&format!("rs/{i}/"), &m.ranges)?;
        ensure!(applied(send(conn, &["FENCE.SET", &scope, "0.5", "v5"]))? == 1);
        ensure!(applied(send(conn, &["FENCE.CHECK", &scope, "0.6"]))? == 2);
        let value: Option<String> = redis::cmd("GET").arg(&scope).query(conn)?;
        ensure!(value.as_deref() == Some("v5"), "{value:?}");
        ensure!(
            exists(m.port, &state_key(&scope)?)? && exists(m.port, scope.as_bytes())?,
            "{scope}: the state or the data is not on {}",
            m.port
        );
        ensure!(applied(send(conn, &["FENCE.DEL", &scope, "0.6"]))? == 2);
        ensure!(!exists(m.port, scope.as_bytes())?, "FENCE.DEL left {scope}");
        ensure!(
            exists(m.port, &state_key(&scope)?)?,
            "FENCE.DEL dropped the mark"
        );

        // A lease on this shard: its token fences a tagged scope here.
        let lock = name_in(&format!("rslock/{i}/"), &m.ranges)?;
        let token = acquired(send(conn, &["FENCE.ACQUIRE", &lock, "a7", "60000"]))?;
        ensure!(
            exists(m.port, &lease_key(&lock)?)?,
            "{lock}: no lease on {}",
            m.port
        );
        let busy = send(conn, &["FENCE.ACQUIRE", &lock, "b9", "60000"])?;
        ensure!(word(&busy) == Some("busy"), "{busy:?}");
        let renewed = send(conn, &["FENCE.RENEW", &lock, "a7", &token, "60000"])?;
        ensure!(word(&renewed) == Some("renewed"), "{renewed:?}");
        let tag = name_in(&format!("rsacct/{i}/"), &m.ranges)?;
        let tagged = format!("{{{tag}}}");
        let owner = format!("{tagged}:owner");
        let r = send(
            conn,
            &[
                "FENCE.EXEC",
                &tagged,
                &token,
                "--",
                "HSET",
                &owner,
                "name",
                "a7",
            ],
        )?;
        ensure!(
            word(&r) == Some("applied") && item(&r, 2) == Some(&redis::Value::Int(1)),
            "{r:?}"
        );
        let name: Option<String> = redis::cmd("HGET").arg(&owner).arg("name").query(conn)?;
        ensure!(name.as_deref() == Some("a7"), "{name:?}");
        ensure!(
            exists(m.port, &state_key(&tagged)?)? && exists(m.port, owner.as_bytes())?,
            "{tagged}: not on {}",
            m.port
        );
        let released = send(conn, &["FENCE.RELEASE", &lock, "a7", &token])?;
        ensure!(word(&released) == Some("released"), "{released:?}");
        let next = acquired(send(conn, &["FENCE.ACQUIRE", &lock, "b9", "60000"]))?;
        ensure!(next != token, "the same token twice: {token}");
    }
    Ok(())
}

/// On every primary, a stale FENCE.SET comes back as a server error whose
/// code is STALEFENCE, and the master received it once and decided it once.
fn stale_once(conn: &mut ClusterConnection, masters: &[NodeLine]) -> Result<()> {
    for (i, m) in masters.iter().enumerate() {
        let scope = name_in(&format!("rsstale/{i}/"), &m.ranges)?;
        ensure!(applied(send(conn, &["FENCE.SET", &scope, "0.5", "v5"]))? == 1);
        let (metrics, stats) = (decisions(m.port)?, calls(m.port, "fence.set")?);
        let (code, e) = refused(send(conn, &["FENCE.SET", &scope, "0.4", "v4"]))?;
        ensure!(code == "STALEFENCE", "{e:?}");
        ensure!(e.kind() == ErrorKind::Extension, "{e:?}");
        ensure!(
            e.detail() == Some("presented 0.4 highest 0.5"),
            "{:?}",
            e.detail()
        );
        let delta = changed(&metrics, &decisions(m.port)?);
        ensure!(
            delta == [(series("put", "stale-fence", "0"), 1)],
            "decisions on {} after one stale FENCE.SET: {delta:?}",
            m.port
        );
        let (n, _) = calls(m.port, "fence.set")?;
        ensure!(n == stats.0 + 1, "{} FENCE.SET calls for one", n - stats.0);
        let value: Option<String> = redis::cmd("GET").arg(&scope).query(conn)?;
        ensure!(value.as_deref() == Some("v5"), "{value:?}");
    }
    Ok(())
}

/// `FENCE.EXEC scope token -- SET otherkey v` with `otherkey` in another
/// slot (on another shard, and on this one): CROSSSLOT, sent once, nothing
/// written on either master; the same token then applies in the slot.
fn cross_slot(conn: &mut ClusterConnection, masters: &[NodeLine]) -> Result<()> {
    for (i, m) in masters.iter().enumerate() {
        let other = &masters[(i + 1) % masters.len()];
        let tag = name_in(&format!("rsx/{i}/"), &m.ranges)?;
        let tagged = format!("{{{tag}}}");
        let owner = format!("{tagged}:owner");
        let r = send(
            conn,
            &["FENCE.EXEC", &tagged, "0.7", "--", "SET", &owner, "a"],
        );
        ensure!(applied(r)? == 1);
        let far = name_in(&format!("rsfar/{i}/"), &other.ranges)?;
        let near = (0..10_000)
            .map(|j| format!("rsnear/{i}/{j}"))
            .find(|k| {
                let s = fencecheck_redis::slot(k.as_bytes());
                s != fencecheck_redis::slot(tag.as_bytes())
                    && m.ranges.iter().any(|&(a, b)| (a..=b).contains(&s))
            })
            .context("a key of another slot on this shard")?;
        let mut here = Conn::connect(m.port)?;
        let mut there = Conn::connect(other.port)?;
        for key in [&far, &near] {
            let before = (here.snapshot()?, there.snapshot()?);
            let stats = calls(m.port, "fence.exec")?;
            let (code, e) = refused(send(
                conn,
                &["FENCE.EXEC", &tagged, "0.8", "--", "SET", key, "x"],
            ))?;
            ensure!(code == "CROSSSLOT", "{key}: {e:?}");
            ensure!(
                e.kind() == ErrorKind::Server(ServerErrorKind::CrossSlot)
                    && e.detail() == Some("the command's keys must hash to the scope's slot"),
                "{e:?}"
            );
            ensure!(
                (here.snapshot()?, there.snapshot()?) == before,
                "{key}: a CROSSSLOT refusal wrote"
            );
            let (n, _) = calls(m.port, "fence.exec")?;
            ensure!(n == stats.0 + 1, "{} FENCE.EXEC calls for one", n - stats.0);
        }
        let r = send(
            conn,
            &["FENCE.EXEC", &tagged, "0.8", "--", "SET", &owner, "b"],
        );
        ensure!(applied(r)? == 2);
    }
    Ok(())
}

/// The floor of `slot` as the node on `port` holds it (none: 0).
fn floor(port: u16, slot: u16) -> Result<u64> {
    let key = fencecheck_redis::slot_floor_key(slot);
    match Conn::connect(port)?.ok(&[b"GET".as_slice(), &key])?.text() {
        Some(t) => Ok(t.parse()?),
        None => Ok(0),
    }
}

fn addr(port: u16) -> String {
    format!("127.0.0.1:{port}")
}

/// Keyless FENCE.RESTORE routed explicitly: to all primaries at once (one
/// `restored` per address) and to each by address; each master's slots
/// then hold the floor and its next grant is above it. Without explicit
/// routing the crate takes the argument for a key: one master only.
fn restore_everywhere(conn: &mut ClusterConnection, masters: &[NodeLine]) -> Result<()> {
    let all = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
    let r = conn.route_command(redis::cmd("FENCE.RESTORE").arg(FLOOR), all)?;
    let redis::Value::Map(replies) = &r else {
        bail!("not one reply per primary: {r:?}");
    };
    let mut answered = BTreeMap::new();
    for (node, reply) in replies {
        let redis::Value::BulkString(node) = node else {
            bail!("{node:?}");
        };
        answered.insert(String::from_utf8(node.clone())?, reply.clone());
    }
    let mut expected: Vec<String> = masters.iter().map(|m| addr(m.port)).collect();
    expected.sort();
    ensure!(
        answered.keys().cloned().collect::<Vec<_>>() == expected,
        "answered by {:?}, primaries {expected:?}",
        answered.keys()
    );
    for reply in answered.values() {
        ensure!(
            word(reply) == Some("restored")
                && item(reply, 1) == Some(&redis::Value::Int(FLOOR as i64)),
            "{reply:?}"
        );
    }
    for (i, m) in masters.iter().enumerate() {
        let to = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
            host: "127.0.0.1".into(),
            port: m.port,
        });
        let at_least = FLOOR + 1000 + i as u64;
        let r = conn.route_command(redis::cmd("FENCE.RESTORE").arg(at_least), to)?;
        ensure!(
            word(&r) == Some("restored")
                && item(&r, 1) == Some(&redis::Value::Int(at_least as i64)),
            "{}: {r:?}",
            m.port
        );
        let (first, last) = (m.ranges[0].0, m.ranges[m.ranges.len() - 1].1);
        for slot in [first, last] {
            ensure!(
                floor(m.port, slot)? == at_least,
                "slot {slot} on {}",
                m.port
            );
        }
        let lock = name_in(&format!("rsfloor/{i}/"), &m.ranges)?;
        let token = acquired(send(conn, &["FENCE.ACQUIRE", &lock, "a7", "60000"]))?;
        let epoch: u64 = token
            .rsplit_once(':')
            .map_or(token.as_str(), |(_, t)| t)
            .split('.')
            .next()
            .context("epoch")?
            .parse()?;
        ensure!(epoch >= at_least, "{lock} granted {token} below {at_least}");
    }
    // Routed by the crate alone, the argument is taken for a key: the
    // command reaches the master of that text's slot and no other.
    let at_least = FLOOR + 2000;
    let text = at_least.to_string();
    let r = send(conn, &["FENCE.RESTORE", &text])?;
    ensure!(word(&r) == Some("restored"), "{r:?}");
    let reached: Vec<u16> = masters
        .iter()
        .filter(|m| floor(m.port, m.ranges[0].0).is_ok_and(|f| f == at_least))
        .map(|m| m.port)
        .collect();
    let owner = masters
        .iter()
        .find(|m| {
            let s = fencecheck_redis::slot(text.as_bytes());
            m.ranges.iter().any(|&(a, b)| (a..=b).contains(&s))
        })
        .context("the master of the argument's slot")?;
    ensure!(
        reached == [owner.port],
        "FENCE.RESTORE {text} reached {reached:?}"
    );
    Ok(())
}

/// A slot holding a scope moves from master `a` to `b` (the steps of
/// `redis-cli --cluster reshard`). Mid-move, a new scope of the slot
/// answers TRYAGAIN on `b` (after ASK from `a`): the crate retries it with
/// waits, as many times as it is configured to, then returns TRYAGAIN,
/// with no decision made; FENCE.RESTORE on `a` likewise. After the move
/// the client that wrote the scope on `a` follows MOVED and the write
/// applies on `b`, the state having moved with the slot.
fn moved(conn: &mut ClusterConnection, seed: u16, masters: &[NodeLine]) -> Result<()> {
    let (a, b) = (&masters[0], &masters[1]);
    let scope = name_in("rsmove/", &a.ranges)?;
    let slot = fencecheck_redis::slot(scope.as_bytes());
    let fresh = format!("{{{scope}}}:fresh");
    ensure!(fencecheck_redis::slot(fresh.as_bytes()) == slot);
    ensure!(applied(send(conn, &["FENCE.SET", &scope, "0.1", "v1"]))? == 1);
    // Few retries, short waits: the crate's defaults are 16 retries of
    // 1.28 s and more each.
    const RETRIES: u32 = 3;
    let mut quick = ClusterClient::builder(vec![format!("redis://127.0.0.1:{seed}/")])
        .retries(RETRIES)
        .min_retry_wait(1)
        .max_retry_wait(10)
        .build()?
        .get_connection()?;

    let s = slot.to_string();
    let mut src = Conn::connect(a.port)?;
    let mut dst = Conn::connect(b.port)?;
    dst.ok(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &a.id])?;
    src.ok(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &b.id])?;

    let (metrics_b, set_b) = (decisions(b.port)?, calls(b.port, "fence.set")?);
    let (code, e) = refused(send(&mut quick, &["FENCE.SET", &fresh, "0.1", "x"]))?;
    ensure!(
        code == "TRYAGAIN" && e.kind() == ErrorKind::Server(ServerErrorKind::TryAgain),
        "{e:?}"
    );
    // Attempts alternate: ASK from `a`, then TRYAGAIN from `b` (ASKING).
    let tried = calls(b.port, "fence.set")?.0 - set_b.0;
    ensure!(
        u64::from(RETRIES + 1) / 2 == tried,
        "{tried} attempts reached {} for {} sends",
        b.port,
        RETRIES + 1
    );
    let delta = changed(&metrics_b, &decisions(b.port)?);
    // The module counts each TRYAGAIN answer under `refused` (today); no
    // attempt was applied or judged stale.
    ensure!(
        delta
            .iter()
            .all(|(k, n)| k.contains("outcome=\"refused\"") && *n <= tried),
        "TRYAGAIN made decisions: {delta:?}"
    );
    // Nothing of the slot on `b` yet (EXISTS there would answer MOVED).
    ensure!(
        dst.ok(&["CLUSTER", "COUNTKEYSINSLOT", &s])?.int() == Some(0),
        "TRYAGAIN wrote"
    );

    let restores = calls(a.port, "fence.restore")?.0;
    let to_a = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: "127.0.0.1".into(),
        port: a.port,
    });
    let (code, e) = refused(quick.route_command(redis::cmd("FENCE.RESTORE").arg(FLOOR), to_a))?;
    ensure!(code == "TRYAGAIN", "{e:?}");
    let tried = calls(a.port, "fence.restore")?.0 - restores;
    ensure!(
        tried == u64::from(RETRIES + 1),
        "FENCE.RESTORE sent {tried} times, retries {RETRIES}"
    );

    // The move ends.
    migrate_slot_keys(a.port, b.port, slot)?;
    for m in masters {
        Conn::connect(m.port)?.ok(&["CLUSTER", "SETSLOT", &s, "NODE", &b.id])?;
    }
    ensure!(
        src.ok(&["CLUSTER", "COUNTKEYSINSLOT", &s])?.int() == Some(0),
        "keys left behind in slot {slot}"
    );

    // The client that last wrote the scope on `a`: MOVED, followed to `b`.
    let (metrics_a, metrics_b) = (decisions(a.port)?, decisions(b.port)?);
    let (set_a, set_b) = (calls(a.port, "fence.set")?, calls(b.port, "fence.set")?);
    ensure!(applied(send(conn, &["FENCE.SET", &scope, "0.3", "v3"]))? == 2);
    let (now_a, now_b) = (calls(a.port, "fence.set")?, calls(b.port, "fence.set")?);
    ensure!(
        now_a.1 == set_a.1 + 1 && now_b.0 == set_b.0 + 1,
        "rejected on {}: {}, calls on {}: {}",
        a.port,
        now_a.1 - set_a.1,
        b.port,
        now_b.0 - set_b.0
    );
    ensure!(
        changed(&metrics_a, &decisions(a.port)?).is_empty(),
        "{} decided",
        a.port
    );
    let delta = changed(&metrics_b, &decisions(b.port)?);
    ensure!(delta == [(series("put", "applied", "0"), 1)], "{delta:?}");
    ensure!(
        exists(b.port, &state_key(&scope)?)?,
        "the state is not on {}",
        b.port
    );
    let value = Conn::connect(b.port)?.ok(&["GET", &scope])?.text();
    ensure!(value.as_deref() == Some("v3"), "{value:?}");
    // The mark moved too: an older token is still refused, on `b`.
    let (code, e) = refused(send(conn, &["FENCE.SET", &scope, "0.2", "v2"]))?;
    ensure!(code == "STALEFENCE", "{e:?}");
    // The new scope of the slot, refused with TRYAGAIN mid-move, applies.
    ensure!(applied(send(&mut quick, &["FENCE.SET", &fresh, "0.1", "x"]))? == 1);
    ensure!(exists(b.port, &state_key(&fresh)?)?);
    Ok(())
}

/// With a response timeout set, the crate sends a fenced write whose reply
/// is late again, at once, on the same connection (an I/O timeout is
/// `RetryImmediately`), and returns the last attempt's reply: the first
/// attempt applied, and the caller is told STALEFENCE (strict: the token's
/// second write). With OPID the repeats answer `duplicate`, the truth.
/// The master is paused for writes (CLIENT PAUSE WRITE) until a second
/// attempt waits behind the first.
fn late_reply(seed: u16, masters: &[NodeLine]) -> Result<()> {
    let m = &masters[2];
    let mut timed = ClusterClient::builder(vec![format!("redis://127.0.0.1:{seed}/")])
        .response_timeout(Duration::from_millis(200))
        .build()?
        .get_connection()?;
    for opid in [None, Some("op-1")] {
        let scope = name_in(&format!("rslate/{}/", opid.is_some()), &m.ranges)?;
        let (metrics, stats) = (decisions(m.port)?, calls(m.port, "fence.set")?);
        Conn::connect(m.port)?.ok(&["CLIENT", "PAUSE", "20000", "WRITE"])?;
        let port = m.port;
        let unpause = std::thread::spawn(move || -> Result<()> {
            let mut c = Conn::connect(port)?;
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let list = c.ok(&["CLIENT", "LIST"])?.text().unwrap_or_default();
                // The paused FENCE.SET's connection holds a second attempt.
                let second = list.lines().any(|l| {
                    l.contains(" cmd=fence.set ")
                        && l.split(' ')
                            .any(|f| f.starts_with("qbuf=") && f != "qbuf=0")
                });
                if second || Instant::now() > deadline {
                    c.ok(&["CLIENT", "UNPAUSE"])?;
                    ensure!(second, "no second attempt arrived: {list}");
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let mut args = vec!["FENCE.SET", scope.as_str(), "0.5", "v5"];
        args.extend(opid.map(|id| ["OPID", id]).into_iter().flatten());
        let reply = send(&mut timed, &args);
        unpause
            .join()
            .map_err(|_| anyhow::anyhow!("the unpausing thread panicked"))??;
        let sent = calls(m.port, "fence.set")?.0 - stats.0;
        ensure!(sent >= 2, "{sent} attempts");
        let delta = changed(&metrics, &decisions(m.port)?);
        let repeat = if opid.is_some() {
            "duplicate"
        } else {
            "stale-fence"
        };
        ensure!(
            delta
                == [
                    (series("put", "applied", "0"), 1),
                    (series("put", repeat, "0"), sent - 1)
                ],
            "{sent} attempts, decisions {delta:?}"
        );
        let value = Conn::connect(m.port)?.ok(&["GET", &scope])?.text();
        ensure!(value.as_deref() == Some("v5"), "{value:?}");
        match opid {
            None => {
                let (code, e) = refused(reply)?;
                ensure!(code == "STALEFENCE", "{e:?}");
            }
            Some(_) => {
                let v = reply?;
                ensure!(word(&v) == Some("duplicate"), "{v:?}");
            }
        }
        eprintln!("late reply, OPID {opid:?}: {sent} attempts sent");
    }
    Ok(())
}
