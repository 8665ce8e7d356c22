//! Signed tokens in a cluster: FENCE.KEYS writes the signing table of every
//! slot its master serves, so the scopes of every shard require
//! signatures, on the replicas too; a table moves with its slot, and
//! mid-move the node that still has a scope's state but no longer its
//! table refuses instead of deciding unsigned; a node-wide key written
//! the standalone way is refused where a command sees it, not silently
//! ignored.
//!
//! Against the module before per-slot tables (node-wide
//! `fencecheck:signing-keys`), unsigned tokens were applied on every
//! master but one on Redis 7.0, and on all of them on Valkey 8.

use anyhow::{Context, Result, ensure};

use crate::cluster::{Cluster, NodeLine, migrate_slot_keys, name_in};
use crate::common::{Conn, Value, applied, first_word, kinds};

const SECRET: &str = "3:8a1f0c5e9d7b3a2c4e6f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5";
/// Scopes tried per master.
const SCOPES: usize = 8;

fn served(m: &NodeLine) -> i64 {
    m.ranges
        .iter()
        .map(|&(a, b)| i64::from(b) - i64::from(a) + 1)
        .sum()
}

/// The signing table of `name`'s slot.
fn table_of(name: &str) -> Vec<u8> {
    fencecheck_redis::slot_signing_key(fencecheck_redis::slot(name.as_bytes()))
}

/// `FENCE.KEYS LIST` on one node, as (prefix count, slots, unlike).
fn listed(port: u16) -> Result<(usize, i64, i64)> {
    let v = Conn::connect(port)?.ok(&["FENCE.KEYS", "LIST"])?;
    let it = v.items();
    ensure!(
        !format!("{v:?}").contains(&SECRET[2..]),
        "LIST shows a secret"
    );
    Ok((
        it.get(3).map(|p| p.items().len()).context("require")?,
        it.get(5).and_then(Value::int).context("slots")?,
        it.get(7).and_then(Value::int).context("unlike")?,
    ))
}

/// A node-wide key is refused where a command sees it (INVALIDKEYS), not
/// ignored; the first applied write of a slot gives it a table; FENCE.KEYS
/// REQUIRE and GRANT on every master make unsigned and forged tokens
/// refused on 8 scopes of every shard while the signed grants apply; the
/// tables reach the replicas; LIST shows every served slot alike; a table
/// moves with its slot, and mid-move the source, which holds the scope's
/// state but not the table, answers TRYAGAIN to an unsigned token.
#[test]
fn signing_keys_in_every_slot() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        signing(&cluster).with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

fn signing(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    let mut client = cluster.client()?;

    // The standalone way, in a cluster: refused in the key's slot.
    let node_wide = "fencecheck:signing-keys";
    client.ok(node_wide.as_bytes(), &["HSET", node_wide, "", SECRET])?;
    let beside = "x{fencecheck:signing-keys}";
    let r = client.cmd(beside.as_bytes(), &["FENCE.SET", beside, "0.1", "v"])?;
    ensure!(first_word(&r) == "INVALIDKEYS", "node-wide key: {r:?}");
    client.ok(node_wide.as_bytes(), &["DEL", node_wide])?;
    ensure!(applied(&client.ok(beside.as_bytes(), &["FENCE.SET", beside, "0.1", "v"])?)? == 1);
    let table = table_of(beside);
    ensure!(
        client.ok(&table, &[b"EXISTS".as_slice(), table.as_slice()])? == Value::Int(1),
        "the slot's first write left it without a table"
    );

    for m in &masters {
        let mut c = Conn::connect(m.port)?;
        let r = c.ok(&["FENCE.KEYS", "REQUIRE", "", SECRET])?;
        ensure!(
            r.items().get(1).and_then(Value::int) == Some(served(m)),
            "{r:?}"
        );
        c.ok(&["FENCE.KEYS", "GRANT", SECRET])?;
        ensure!(
            c.ok(&["WAIT", "1", "5000"])?.int() == Some(1),
            "replica ack"
        );
    }

    let mut signed_scope = None;
    for m in &masters {
        for i in 0..SCOPES {
            let scope = name_in(&format!("signed{}-{i}-", m.port), &m.ranges)?;
            let route = scope.as_bytes();
            let grant = client.ok(route, &["FENCE.ACQUIRE", &scope, "a7", "600000"])?;
            let token = grant
                .items()
                .get(1)
                .and_then(Value::text)
                .context("token")?;
            let parts: Vec<&str> = token.split('~').collect();
            ensure!(parts.len() == 4, "grant not signed: {token}");
            // The grant's own token, unsigned, and one far above it.
            let (head, counter) = parts[0].rsplit_once('.').context("counter")?;
            let higher = format!("{head}.{}", counter.parse::<u64>()? + 1000);
            for bad in [parts[0].to_string(), higher.clone()] {
                let r = client.cmd(route, &["FENCE.SET", &scope, &bad, "unsigned"])?;
                ensure!(first_word(&r) == "UNAUTHENTICATED", "{scope} {bad}: {r:?}");
            }
            ensure!(applied(&client.ok(route, &["FENCE.SET", &scope, &token, "v1"])?)? == 1);
            signed_scope.get_or_insert((scope, m.clone(), higher));
        }
        ensure!(listed(m.port)? == (1, served(m), 0), "LIST on {}", m.port);
        // The replica has its master's tables.
        let replica = cluster.replica_of(m.port)?;
        let mut r = Conn::connect(replica.port)?;
        r.ok(&["READONLY"])?;
        let probe = name_in("probe", &m.ranges)?;
        let t = table_of(&probe);
        let got = r.ok(&[
            b"HGET".as_slice(),
            t.as_slice(),
            b"fencecheck:grant-key".as_slice(),
        ])?;
        ensure!(
            got.text().as_deref() == Some(SECRET),
            "replica {}: {got:?}",
            replica.port
        );
    }

    // Move the first signed scope's slot to the next master: the table
    // first, alone, as MIGRATE may order it.
    let (scope, from, higher) = signed_scope.context("a signed scope")?;
    let to = masters
        .iter()
        .find(|m| m.id != from.id)
        .context("another master")?
        .clone();
    let slot = fencecheck_redis::slot(scope.as_bytes());
    let s = slot.to_string();
    let mut src = Conn::connect(from.port)?;
    let mut dst = Conn::connect(to.port)?;
    dst.ok(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from.id])?;
    src.ok(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to.id])?;
    let keys = src.cmd(&["FENCE.KEYS", "GRANT", SECRET])?;
    ensure!(
        first_word(&keys) == "TRYAGAIN",
        "FENCE.KEYS mid-move: {keys:?}"
    );
    let t = table_of(&scope);
    let port = to.port.to_string();
    let moved = src.ok(&[
        b"MIGRATE".as_slice(),
        b"127.0.0.1",
        port.as_bytes(),
        t.as_slice(),
        b"0",
        b"5000",
    ])?;
    ensure!(moved == Value::Simple("OK".into()), "{moved:?}");
    let r = src.cmd(&["FENCE.SET", &scope, &higher, "unsigned"])?;
    ensure!(
        first_word(&r) == "TRYAGAIN",
        "source without the table: {r:?}"
    );
    let r = dst
        .cmd(&["ASKING"])
        .and_then(|_| dst.cmd(&["FENCE.SET", &scope, &higher, "unsigned"]))?;
    ensure!(first_word(&r) != "<no error>", "target mid-move: {r:?}");
    migrate_slot_keys(from.port, to.port, slot)?;
    for m in &masters {
        Conn::connect(m.port)?.ok(&["CLUSTER", "SETSLOT", &s, "NODE", &to.id])?;
    }
    let r = client.cmd(
        scope.as_bytes(),
        &["FENCE.SET", &scope, &higher, "unsigned"],
    )?;
    ensure!(first_word(&r) == "UNAUTHENTICATED", "after the move: {r:?}");
    ensure!(
        client
            .ok(scope.as_bytes(), &["GET", &scope])?
            .text()
            .as_deref()
            == Some("v1"),
        "the scope's data"
    );
    ensure!(
        listed(to.port)? == (1, served(&to) + 1, 0),
        "LIST on the target"
    );
    ensure!(
        listed(from.port)? == (1, served(&from) - 1, 0),
        "LIST on the source"
    );

    // DROP lifts it in every slot.
    for m in &masters {
        Conn::connect(m.port)?.ok(&["FENCE.KEYS", "DROP", ""])?;
    }
    let r = client.cmd(
        scope.as_bytes(),
        &["FENCE.SET", &scope, &higher, "unsigned"],
    )?;
    ensure!(applied(&r).is_ok(), "after DROP: {r:?}");
    Ok(())
}
