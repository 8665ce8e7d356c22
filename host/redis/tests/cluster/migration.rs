//! A slot in the middle of a migration (the steps `redis-cli --cluster
//! reshard` takes, done one at a time): whichever keys of a scope have
//! moved, no node decides on half of them.

use anyhow::{Context, Result, ensure};

use crate::cluster::{Cluster, migrate_slot_keys, name_in};
use crate::common::{Conn, Value, applied, first_word, kinds};

/// With the slot MIGRATING on its master and IMPORTING on another, a stale
/// token is never applied, whether no key moved yet, only the data key,
/// only the state key, or a lease's state: the node that lacks a key the
/// decision needs answers TRYAGAIN (or redirects with ASK), the node that
/// has them all decides; once the slot is moved, the marks refuse the
/// stale tokens there and accept a newer one.
#[test]
fn half_migrated_scopes_refuse() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        half_migrated(&cluster).with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

fn migrate(from: &mut Conn, to_port: u16, key: &[u8]) -> Result<()> {
    let r = from.ok(&[
        b"MIGRATE".as_slice(),
        b"127.0.0.1",
        to_port.to_string().as_bytes(),
        key,
        b"0",
        b"5000",
    ])?;
    ensure!(
        r == Value::Simple("OK".into()),
        "MIGRATE {}: {r:?}",
        String::from_utf8_lossy(key)
    );
    Ok(())
}

fn half_migrated(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    let (a, b) = (&masters[0], &masters[1]);
    let mut client = cluster.client()?;
    // Four scopes of one slot (a hash tag) and a lock in it: one scope per case.
    let tag = name_in("mig", &a.ranges)?;
    let slot = fencecheck_redis::slot(tag.as_bytes());
    let scopes: Vec<String> = ["none", "data", "state", "exec"]
        .iter()
        .map(|c| format!("{{{tag}}}:{c}"))
        .collect();
    for s in &scopes {
        ensure!(applied(&client.ok(s.as_bytes(), &["FENCE.SET", s, "0.5", "v5"])?)? == 1);
    }
    let lock = format!("{{{tag}}}:lock");
    let grant = client.ok(lock.as_bytes(), &["FENCE.ACQUIRE", &lock, "a7", "600000"])?;
    let token = grant
        .items()
        .get(1)
        .and_then(Value::text)
        .context("token")?;

    let mut on_a = Conn::connect(a.port)?;
    let mut on_b = Conn::connect(b.port)?;
    on_b.ok(&["CLUSTER", "SETSLOT", &slot.to_string(), "IMPORTING", &a.id])?;
    on_a.ok(&["CLUSTER", "SETSLOT", &slot.to_string(), "MIGRATING", &b.id])?;
    let key = |s: &str| {
        fencecheck_redis::fence_key(s.as_bytes())
            .ok()
            .context("state key")
    };
    // "data": only the data key moved; "state": only the state key;
    // the lock: only its lease state.
    migrate(&mut on_a, b.port, scopes[1].as_bytes())?;
    migrate(&mut on_a, b.port, &key(&scopes[2])?)?;
    let lease_key = fencecheck_redis::lease_key(lock.as_bytes())
        .ok()
        .context("lease key")?;
    migrate(&mut on_a, b.port, &lease_key)?;

    // Mid-migration a split scope answers TRYAGAIN until the move ends:
    // a few attempts, then the client surfaces it.
    client.attempts = 6;
    let mut refused = 0;
    for s in &scopes {
        let r = if s.ends_with(":exec") {
            let h = format!("{{{tag}}}:h");
            client.cmd(
                s.as_bytes(),
                &["FENCE.EXEC", s, "0.4", "--", "HSET", &h, "f", "stale"],
            )?
        } else {
            client.cmd(s.as_bytes(), &["FENCE.SET", s, "0.4", "stale"])?
        };
        // TRYAGAIN is retried by the client until its attempts run out;
        // what matters is that nothing stale was applied.
        ensure!(
            first_word(&r) != "<no error>",
            "{s}: a stale token applied mid-migration: {r:?}"
        );
        refused += 1;
        for direct in [&mut on_a, &mut on_b] {
            let v = direct
                .cmd(&["ASKING"])
                .and_then(|_| direct.cmd(&["FENCE.SET", s, "0.4", "stale"]))?;
            ensure!(
                first_word(&v) != "<no error>",
                "{s}: applied on a node: {v:?}"
            );
        }
    }
    ensure!(refused == scopes.len());
    // A second owner of the lock mid-migration: never a second grant.
    for direct in [&mut on_a, &mut on_b] {
        let v = direct
            .cmd(&["ASKING"])
            .and_then(|_| direct.cmd(&["FENCE.ACQUIRE", &lock, "b9", "600000"]))?;
        ensure!(
            v.items().first() != Some(&Value::Simple("acquired".into())),
            "a second grant mid-migration: {v:?}"
        );
    }

    ensure!(client.redirects.tryagain > 0, "{:?}", client.redirects);
    client.attempts = 400;
    // Finish the move: the rest of the slot's keys (the slot's lineage and
    // floor among them), then the slot.
    migrate_slot_keys(a.port, b.port, slot)?;
    for m in &masters {
        Conn::connect(m.port)?.ok(&["CLUSTER", "SETSLOT", &slot.to_string(), "NODE", &b.id])?;
    }
    for s in &scopes {
        let r = client.cmd(s.as_bytes(), &["FENCE.SET", s, "0.4", "stale"])?;
        ensure!(first_word(&r) == "STALEFENCE", "{s} after the move: {r:?}");
        ensure!(applied(&client.ok(s.as_bytes(), &["FENCE.SET", s, "0.6", "v6"])?)? == 2);
    }
    let busy = client.ok(lock.as_bytes(), &["FENCE.ACQUIRE", &lock, "b9", "600000"])?;
    ensure!(
        busy.items().first() == Some(&Value::Simple("busy".into())),
        "{busy:?}"
    );
    let renewed = client.ok(
        lock.as_bytes(),
        &["FENCE.RENEW", &lock, "a7", &token, "600000"],
    )?;
    ensure!(
        renewed.items().first() == Some(&Value::Simple("renewed".into())),
        "{renewed:?}"
    );
    Ok(())
}
