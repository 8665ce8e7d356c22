//! Leases in the same server: tokens minted atomically with the acquire
//! are the ones the fence checks; the failover hazard of asynchronous
//! replication (a promoted replica repeats a token a resource already
//! accepted) and the runbook that fixes it (FENCE.RESTORE before the first
//! grant; WAIT to learn whether a grant reached a replica).

use crate::common::{Conn, Options, Server, Value, applied, each_server, kinds};
use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use anyhow::{Context, Result, bail, ensure};

fn grant(c: &mut Conn, lock: &str, lease: &str, ttl: &str, now: &str) -> Result<Value> {
    c.ok(&["FENCE.ACQUIRE", lock, lease, ttl, "NOW", now])
}

fn token_of(v: &Value) -> Result<String> {
    match v.items() {
        [Value::Simple(s), t, ..] if s == "acquired" => t.text().context("token text"),
        _ => anyhow::bail!("not acquired: {v:?}"),
    }
}

/// Acquire, busy, retry, renew, release, re-acquire on the module's clock
/// (TEST-CLOCK): every new grant's token is above the last, the same lease
/// id retried gets the same grant, and the fence accepts exactly the
/// newest token.
#[test]
fn grants_follow_the_lease_rules_and_feed_the_fence() -> Result<()> {
    each_server(Options::test_clock(), |server| {
        let mut c = server.conn()?;
        let a = grant(&mut c, "report/july", "a7", "30000", "1000")?;
        let ta = token_of(&a)?;
        ensure!(
            a.items()[2] == Value::Int(31000) && a.items()[3] == Value::Int(1000),
            "{a:?}"
        );
        let busy = grant(&mut c, "report/july", "b9", "30000", "2000")?;
        ensure!(
            busy == Value::Array(vec![
                Value::Simple("busy".into()),
                Value::Bulk(b"a7".to_vec()),
                Value::Int(31000)
            ]),
            "{busy:?}"
        );
        let retry = grant(&mut c, "report/july", "a7", "30000", "5000")?;
        ensure!(
            token_of(&retry)? == ta && retry.items()[2] == Value::Int(31000),
            "{retry:?}"
        );
        let renewed = c.ok(&[
            "FENCE.RENEW",
            "report/july",
            "a7",
            &ta,
            "30000",
            "NOW",
            "20000",
        ])?;
        ensure!(
            renewed.items().get(1) == Some(&Value::Int(50000)),
            "{renewed:?}"
        );
        ensure!(applied(&c.ok(&["FENCE.SET", "report/july", &ta, "a"])?)? == 1);
        // Expired: B takes over with a greater token; A's late calls change nothing.
        let b = grant(&mut c, "report/july", "b9", "30000", "50000")?;
        let tb = token_of(&b)?;
        ensure!(tb != ta, "{tb} repeats {ta}");
        ensure!(applied(&c.ok(&["FENCE.SET", "report/july", &tb, "b"])?)? == 2);
        let before = c.snapshot()?;
        let lost = c.ok(&[
            "FENCE.RENEW",
            "report/july",
            "a7",
            &ta,
            "30000",
            "NOW",
            "50001",
        ])?;
        ensure!(
            lost == Value::Array(vec![Value::Simple("lost".into())]),
            "{lost:?}"
        );
        let not_owner = c.ok(&["FENCE.RELEASE", "report/july", "a7", &ta])?;
        ensure!(
            not_owner == Value::Array(vec![Value::Simple("not-owner".into())]),
            "{not_owner:?}"
        );
        let stale = c.cmd(&["FENCE.SET", "report/july", &ta, "late"])?;
        ensure!(
            stale.error().is_some_and(|e| e.starts_with("STALEFENCE")),
            "{stale:?}"
        );
        ensure!(
            c.snapshot()? == before,
            "a refused lease call changed a key"
        );
        let released = c.ok(&["FENCE.RELEASE", "report/july", "b9", &tb])?;
        ensure!(
            released == Value::Array(vec![Value::Simple("released".into())]),
            "{released:?}"
        );
        let c2 = grant(&mut c, "report/july", "c1", "30000", "50002")?;
        ensure!(token_of(&c2)? != tb);
        // Without TEST-CLOCK there is no NOW (checked in the next test);
        // refusals of the lease rules are errors named like the fence's.
        let zero = c.cmd(&["FENCE.ACQUIRE", "other", "x", "0", "NOW", "1"])?;
        ensure!(zero.error() == Some("INVALIDREQUEST zero-ttl"), "{zero:?}");
        Ok(())
    })
}

/// Without TEST-CLOCK the server's clock decides: NOW is refused, and a
/// grant's expiry is the server's Unix time plus the ttl.
#[test]
fn production_servers_use_their_own_clock() -> Result<()> {
    each_server(Options::module(), |server| {
        let mut c = server.conn()?;
        let refused = c.cmd(&["FENCE.ACQUIRE", "l", "a", "1000", "NOW", "5"])?;
        ensure!(
            refused.error().is_some_and(|e| e.contains("TEST-CLOCK")),
            "{refused:?}"
        );
        let time = c.ok(&["TIME"])?;
        let secs: i64 = time.items()[0].text().context("secs")?.parse()?;
        let g = c.ok(&["FENCE.ACQUIRE", "l", "a", "1000"])?;
        let (expires, decided) = (
            g.items()[2].int().context("expiry")?,
            g.items()[3].int().context("now")?,
        );
        ensure!(expires - decided == 1000, "{g:?}");
        ensure!((decided / 1000 - secs).abs() <= 5, "{g:?} vs TIME {secs}");
        // The lineage was made at the first acquire and is in the token.
        let lineage = c
            .ok(&["GET", "fencecheck:lineage"])?
            .text()
            .context("lineage")?;
        ensure!(token_of(&g)?.starts_with(&format!("{lineage}:")), "{g:?}");
        Ok(())
    })
}

/// One failover: a grant made on the primary after its replica's link was
/// cut reaches a resource; the primary dies; the replica is
/// promoted and grants again. Returns the lost grant's token and the
/// promoted replica's first token, and whether the resource accepted it.
fn failover(kind: crate::common::Kind, restore_first: bool) -> Result<(String, String, bool)> {
    let primary = Server::start(kind, Options::module())?;
    let replica = Server::start(kind, Options::module())?;
    let resource = Server::start(kind, Options::module())?;
    let mut r = replica.conn()?;
    r.ok(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()])?;
    let mut p = primary.conn()?;
    let mut res = resource.conn()?;
    let first = p.ok(&["FENCE.ACQUIRE", "job", "a1", "600000"])?;
    let t1 = token_of(&first)?;
    ensure!(
        p.ok(&["WAIT", "1", "10000"])? == Value::Int(1),
        "replica never acknowledged"
    );
    ensure!(applied(&res.ok(&["FENCE.SET", "job", &t1, "by a1"])?)? == 1);
    p.ok(&["FENCE.RELEASE", "job", "a1", &t1])?;
    ensure!(p.ok(&["WAIT", "1", "10000"])? == Value::Int(1));

    // The replica's link to the primary is cut (it is pointed at a port
    // where nothing listens; it keeps its data); the primary grants a2,
    // which no replica has: WAIT says so (0 replicas) after its timeout.
    let nowhere = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    r.ok(&["REPLICAOF", "127.0.0.1", &nowhere.to_string()])?;
    let second = p.ok(&["FENCE.ACQUIRE", "job", "a2", "600000"])?;
    let t2 = token_of(&second)?;
    ensure!(
        p.ok(&["WAIT", "1", "200"])? == Value::Int(0),
        "WAIT must report the grant unreplicated"
    );
    ensure!(applied(&res.ok(&["FENCE.SET", "job", &t2, "by a2"])?)? == 2);

    // The primary dies; the replica is promoted.
    drop(p);
    drop(primary);
    r.ok(&["REPLICAOF", "NO", "ONE"])?;
    if restore_first {
        let restored = r.ok(&["FENCE.RESTORE"])?;
        ensure!(
            restored.items().first() == Some(&Value::Simple("restored".into())),
            "{restored:?}"
        );
    }
    // a1's lease was released on the replica too; a3 is granted.
    let third = r.ok(&["FENCE.ACQUIRE", "job", "a3", "600000"])?;
    let t3 = token_of(&third)?;
    let accepted = res
        .cmd(&["FENCE.SET", "job", &t3, "by a3"])?
        .error()
        .is_none();
    Ok((t2, t3, accepted))
}

/// The hazard: the promoted replica, which never saw a2's grant, gives a3
/// the same token a2 had, and the resource refuses the new owner (under
/// allow-equal it would have taken both as one owner). The runbook's
/// FENCE.RESTORE before the first grant on the promoted replica puts a3
/// above every token the old primary issued, and the resource accepts it.
#[test]
fn failover_repeats_a_token_unless_restored() -> Result<()> {
    for kind in kinds() {
        let (lost, repeated, accepted) = failover(kind, false)?;
        ensure!(
            repeated == lost,
            "{kind:?}: expected the hazard, got {repeated} after {lost}"
        );
        ensure!(
            !accepted,
            "{kind:?}: the resource accepted a repeated token"
        );
        let (lost, fresh, accepted) = failover(kind, true)?;
        ensure!(
            fresh != lost && accepted,
            "{kind:?}: after FENCE.RESTORE {fresh} vs {lost}: accepted {accepted}"
        );
    }
    Ok(())
}

/// FENCE.RESTORE raises the floor to max(floor + 1, at-least), refuses
/// garbage, and a lock's next grant starts the new epoch at counter 1.
#[test]
fn restore_raises_the_epoch_floor() -> Result<()> {
    each_server(Options::test_clock(), |server| {
        let mut c = server.conn()?;
        let g1 = grant(&mut c, "l", "a", "10", "1")?;
        ensure!(token_of(&g1)?.ends_with(":0.1"), "{g1:?}");
        ensure!(c.ok(&["FENCE.RESTORE", "5"])?.items().get(1) == Some(&Value::Int(5)));
        ensure!(c.ok(&["FENCE.RESTORE", "3"])?.items().get(1) == Some(&Value::Int(6)));
        let g2 = grant(&mut c, "l", "b", "10", "100")?;
        ensure!(token_of(&g2)?.ends_with(":6.1"), "{g2:?}");
        for bad in [
            &["FENCE.RESTORE", "-1"][..],
            &["FENCE.RESTORE", "x"],
            &["FENCE.RESTORE", "1", "2"],
        ] {
            ensure!(c.cmd(bad)?.error().is_some(), "{bad:?}");
        }
        c.ok(&["SET", "fencecheck:epoch-floor", "07"])?;
        let corrupt = c.cmd(&["FENCE.ACQUIRE", "l", "c", "10", "NOW", "200"])?;
        ensure!(
            corrupt
                .error()
                .is_some_and(|e| e.starts_with("CORRUPTSTATE")),
            "{corrupt:?}"
        );
        Ok(())
    })
}

/// What one racing client saw: its grants' tokens, and its applied
/// writes (audit entry, version).
type Seen = (Vec<String>, Vec<(String, i64)>);

/// 8 clients race for one lock on the server's clock (acquire, a fenced
/// write with the grant's token, release), 60 rounds each: every grant's
/// counter is used exactly once (1..=n, no repeats, no gaps), and the
/// audit list written through FENCE.EXEC holds exactly the writes
/// acknowledged as applied, in token order.
#[test]
fn racing_clients_get_one_grant_per_counter() -> Result<()> {
    each_server(Options::module(), |server| {
        let start = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|id| {
                let start = Arc::clone(&start);
                let port = server.port;
                std::thread::spawn(move || -> Result<Seen> {
                    let mut c = Conn::connect(port)?;
                    let (mut grants, mut applied_writes) = (Vec::new(), Vec::new());
                    start.wait();
                    for n in 0..60 {
                        let lease = format!("c{id}-{n}");
                        let reply = c.ok(&["FENCE.ACQUIRE", "{job}", &lease, "5000"])?;
                        let Ok(token) = token_of(&reply) else {
                            continue;
                        };
                        grants.push(token.clone());
                        let entry = format!("{lease} {token}");
                        let w = c.cmd(&[
                            "FENCE.EXEC",
                            "{job}",
                            &token,
                            "--",
                            "RPUSH",
                            "{job}:audit",
                            &entry,
                        ])?;
                        match w.items() {
                            [Value::Simple(s), Value::Int(v), Value::Int(len)]
                                if s == "applied" =>
                            {
                                ensure!(v == len, "version {v}, audit length {len}");
                                applied_writes.push((entry, *v));
                            }
                            _ => bail!("the holder's write was refused: {w:?}"),
                        }
                        let released = c.ok(&["FENCE.RELEASE", "{job}", &lease, &token])?;
                        ensure!(
                            released.items().first() == Some(&Value::Simple("released".into())),
                            "{released:?}"
                        );
                    }
                    Ok((grants, applied_writes))
                })
            })
            .collect();
        let (mut grants, mut writes) = (Vec::new(), Vec::new());
        for h in handles {
            let (g, w) = h.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
            grants.extend(g);
            writes.extend(w);
        }
        let counters: BTreeSet<u64> = grants
            .iter()
            .map(|t| {
                t.rsplit_once('.')
                    .and_then(|(_, c)| c.parse().ok())
                    .context("counter")
            })
            .collect::<Result<_>>()?;
        ensure!(
            counters.len() == grants.len(),
            "a counter was granted twice: {grants:?}"
        );
        ensure!(
            counters.iter().copied().eq(1..=grants.len() as u64),
            "counters {counters:?} are not 1..=n"
        );
        let mut c = server.conn()?;
        let audit = c.ok(&["LRANGE", "{job}:audit", "0", "-1"])?;
        writes.sort_by_key(|(_, v)| *v);
        let logged: Vec<String> = audit.items().iter().filter_map(Value::text).collect();
        let acked: Vec<String> = writes.into_iter().map(|(e, _)| e).collect();
        ensure!(
            logged == acked,
            "the audit list is not the acknowledged writes in version order"
        );
        ensure!(
            grants.len() >= 16,
            "only {} grants: the race did not happen",
            grants.len()
        );
        Ok(())
    })
}
