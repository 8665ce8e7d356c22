//! What asynchronous replication can lose at an automatic failover, and
//! the WAIT-based options that keep the fence safe (docs/redis.md,
//! Cluster, Failover). One scenario, run twice: a lock's grant and a
//! resource's mark (both in the first master's shard) are followed by
//! `WAIT 1 <ms>` on the same connection, the master is SIGKILLed and its
//! replica promoted (`CLUSTER FAILOVER FORCE`). With the replica up, WAIT
//! answers 1 and the promoted master keeps both; with the replica paused
//! (SIGSTOP) and its link cut, WAIT answers 0 and the promoted master has
//! neither. And `min-replicas-to-write` refuses every fenced write while no
//! replica is in reach. Every node loads the module with `TEST-CLOCK`, so
//! a lease expires when the test says (`NOW ms`).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};

use crate::cluster::{Cluster, name_in, wait_master};
use crate::common::{Conn, Server, Value, acquired_token, applied, first_word, kinds};

/// A node stopped with SIGSTOP; SIGCONT when dropped, on every path
/// (errors included), so no test leaves a node frozen.
struct Stopped(u32);

impl Stopped {
    fn new(node: &Server) -> Result<Stopped> {
        let pid = node.pid().context("the node is not running")?;
        node.signal("-STOP")?;
        Ok(Stopped(pid))
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// `AUTHORITY:EPOCH.COUNTER` → (epoch, counter), the order tokens compare in.
fn order(token: &str) -> Result<(u64, u64)> {
    let bare = token.rsplit(':').next().context("token")?;
    let (e, c) = bare.split_once('.').context("EPOCH.COUNTER")?;
    Ok((e.parse()?, c.parse()?))
}

/// `WAIT 1 <ms>` on `conn`: how many replicas have its writes.
fn wait(conn: &mut Conn, ms: u32) -> Result<i64> {
    conn.ok(&["WAIT", "1", &ms.to_string()])?
        .int()
        .context("WAIT answer")
}

fn acquire(conn: &mut Conn, lock: &str, lease: &str, ttl: u64, now: u64) -> Result<Value> {
    conn.ok(&[
        "FENCE.ACQUIRE",
        lock,
        lease,
        &ttl.to_string(),
        "NOW",
        &now.to_string(),
    ])
}

/// What the promoted master shows after the scenario.
struct Seen {
    /// The expired first grant (replicated) and the holder's grant.
    t0: String,
    t1: String,
    /// WAIT's answers after the grant and after the mark.
    wait_grant: i64,
    wait_mark: i64,
    /// `FENCE.ACQUIRE lock b9` before the holder's lease ends (NOW 5000).
    before_expiry: Value,
    /// `FENCE.SET res t0` (the token below the one the resource took).
    lower: Value,
    /// The promoted master's port, the lock and the resource.
    port: u16,
    lock: String,
    res: String,
}

/// The scenario: on the first master, `z0` is granted `lock` (NOW 0, ttl
/// 500) and `WAIT 1` answers 1 (the slot's lineage is on the replica);
/// then, with the replica paused and its link cut if `cut`, `a7` is
/// granted `lock` (t1, NOW 1000, ttl 10000), WAIT; `FENCE.SET res t1`
/// (applied, version 1), WAIT. The master is SIGKILLed, the replica
/// resumed and promoted (CLUSTER FAILOVER FORCE: no handshake with the
/// dead master, the other masters vote); then on it `b9` asks for `lock`
/// at NOW 5000 and `FENCE.SET res t0` is sent.
fn scenario(cluster: &mut Cluster, cut: bool) -> Result<Seen> {
    let masters = cluster.masters()?;
    let a = masters[0].clone();
    let replica = cluster.replica_of(a.port)?;
    let lock = name_in("lock", &a.ranges)?;
    let res = name_in("res", &a.ranges)?;
    // WAIT counts the replicas that have this connection's writes.
    let mut on_a = Conn::connect(a.port)?;
    let t0 = acquired_token(&acquire(&mut on_a, &lock, "z0", 500, 0)?)?;
    ensure!(
        wait(&mut on_a, 5000)? == 1,
        "the first grant did not replicate"
    );
    let stopped = if cut {
        let s = Stopped::new(cluster.node(replica.port)?)?;
        // Cut the link (the paused replica cannot reconnect): what the
        // master writes now reaches no replica, not even a socket buffer.
        let killed = on_a.ok(&["CLIENT", "KILL", "TYPE", "replica"])?;
        ensure!(killed.int() == Some(1), "{killed:?}");
        Some(s)
    } else {
        None
    };
    let patience = if cut { 300 } else { 5000 };
    let t1 = acquired_token(&acquire(&mut on_a, &lock, "a7", 10_000, 1000)?)?;
    ensure!(order(&t0)? < order(&t1)?, "{t0} then {t1}");
    let wait_grant = wait(&mut on_a, patience)?;
    let v = applied(&on_a.ok(&["FENCE.SET", &res, &t1, "a7"])?)?;
    ensure!(v == 1, "the resource's first write has version {v}");
    let wait_mark = wait(&mut on_a, patience)?;
    cluster.node_mut(a.port)?.kill();
    drop(stopped);
    let forced = Conn::connect(replica.port)?.cmd(&["CLUSTER", "FAILOVER", "FORCE"])?;
    // The automatic failover may have won the race: it is a master then.
    ensure!(
        forced == Value::Simple("OK".into())
            || forced.error().is_some_and(|e| e.contains("replica")),
        "CLUSTER FAILOVER FORCE: {forced:?}"
    );
    wait_master(replica.port)?;
    cluster.wait_ok()?;
    let mut on_new = Conn::connect(replica.port)?;
    let before_expiry = acquire(&mut on_new, &lock, "b9", 10_000, 5000)?;
    let lower = on_new.cmd(&["FENCE.SET", &res, &t0, "b9"])?;
    eprintln!(
        "{:?} cut {cut}: WAIT {wait_grant} after {t1}, {wait_mark} after the mark; \
         promoted: {before_expiry:?}, {t0} on the mark: {lower:?}",
        cluster.kind
    );
    Ok(Seen {
        t0,
        t1,
        wait_grant,
        wait_mark,
        before_expiry,
        lower,
        port: replica.port,
        lock,
        res,
    })
}

/// A holder whose `WAIT 1` answered 1 after its grant and after its mark
/// is safe across a SIGKILL of the master: the promoted replica still has
/// the lease (another lease id is told `busy`, holder a7), grants the lock
/// after its expiry with a token above the holder's, and the resource's
/// mark refuses a lower token (STALEFENCE) and takes the new one as version 2.
#[test]
fn wait_one_survives_failover() -> Result<()> {
    for kind in kinds() {
        let mut cluster = Cluster::start_loading(kind, &["TEST-CLOCK"])?;
        let r = wait_one(&mut cluster);
        r.with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

fn wait_one(cluster: &mut Cluster) -> Result<()> {
    let seen = scenario(cluster, false)?;
    let (port, lock, res) = (seen.port, &seen.lock, &seen.res);
    ensure!(
        seen.wait_grant == 1,
        "WAIT after the grant: {}",
        seen.wait_grant
    );
    ensure!(
        seen.wait_mark == 1,
        "WAIT after the mark: {}",
        seen.wait_mark
    );
    let busy = &seen.before_expiry;
    ensure!(
        busy.items().first() == Some(&Value::Simple("busy".into()))
            && busy.items().get(1).and_then(Value::text).as_deref() == Some("a7"),
        "the promoted master lost the grant: {busy:?}"
    );
    ensure!(
        first_word(&seen.lower) == "STALEFENCE",
        "the promoted master lost the mark: {} took {:?}",
        seen.t0,
        seen.lower
    );
    let mut on_new = Conn::connect(port)?;
    let t2 = acquired_token(&acquire(&mut on_new, lock, "b9", 10_000, 20_000)?)?;
    ensure!(
        order(&t2)? > order(&seen.t1)?,
        "after the failover {t2} is not above {}",
        seen.t1
    );
    let v = applied(&on_new.ok(&["FENCE.SET", res, &t2, "b9"])?)?;
    ensure!(v == 2, "the new holder's write has version {v}");
    Ok(())
}

/// The same with the replica paused (SIGSTOP) and its link cut: WAIT
/// answers 0 after the grant and after the mark, so the holder can know
/// neither is durable; after the SIGKILL the promoted replica has neither:
/// another lease id gets the holder's very token before the lease's
/// expiry, and the resource applies a token below the one it took. The
/// runbook: a holder whose WAIT answered 0 does not use the token, or the
/// operator runs FENCE.RESTORE on the promoted master, after which the next
/// grant is above the lost one and the lost token is refused.
#[test]
fn wait_zero_warns_of_loss() -> Result<()> {
    for kind in kinds() {
        let mut cluster = Cluster::start_loading(kind, &["TEST-CLOCK"])?;
        let r = wait_zero(&mut cluster);
        r.with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

fn wait_zero(cluster: &mut Cluster) -> Result<()> {
    let seen = scenario(cluster, true)?;
    let (port, lock, res) = (seen.port, &seen.lock, &seen.res);
    ensure!(
        seen.wait_grant == 0,
        "WAIT after the grant: {}",
        seen.wait_grant
    );
    ensure!(
        seen.wait_mark == 0,
        "WAIT after the mark: {}",
        seen.wait_mark
    );
    let again = acquired_token(&seen.before_expiry)
        .context("the lease was expected lost on the promoted master")?;
    ensure!(
        again == seen.t1,
        "the promoted master was expected to repeat {}, gave {again}",
        seen.t1
    );
    ensure!(
        applied(&seen.lower).ok() == Some(1),
        "the mark was expected lost ({} below {} applied): {:?}",
        seen.t0,
        seen.t1,
        seen.lower
    );
    // The runbook on the promoted master, then a later holder.
    let mut on_new = Conn::connect(port)?;
    on_new.ok(&["FENCE.RESTORE"])?;
    let t3 = acquired_token(&acquire(&mut on_new, lock, "c3", 10_000, 20_000)?)?;
    ensure!(
        order(&t3)?.0 > order(&seen.t1)?.0,
        "after FENCE.RESTORE {t3} is not in an epoch above {}",
        seen.t1
    );
    let v = applied(&on_new.ok(&["FENCE.SET", res, &t3, "c3"])?)?;
    ensure!(v == 2, "the restored holder's write has version {v}");
    let stale = on_new.cmd(&["FENCE.SET", res, &seen.t1, "a7"])?;
    ensure!(first_word(&stale) == "STALEFENCE", "{stale:?}");
    Ok(())
}

/// With `min-replicas-to-write 1` and `min-replicas-max-lag 1` on a master
/// whose replica is paused (SIGSTOP), every fenced write (FENCE.SET, DEL,
/// EXEC, ACQUIRE, RENEW, RELEASE, RESTORE) is refused with NOREPLICAS and
/// changes nothing (every key's DUMP the same), FENCE.CHECK still answers;
/// once the replica is back, the same FENCE.SET applies as the next version
/// and the lock is granted above the last token.
#[test]
fn min_replicas_refuses_fenced_writes() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start_loading(kind, &["TEST-CLOCK"])?;
        let r = min_replicas(&cluster);
        r.with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

/// Poll (bounded) until a plain SET of `probe` on `conn` answers as
/// `refused` says (NOREPLICAS or OK).
fn wait_refusal(conn: &mut Conn, probe: &str, refused: bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = conn.cmd(&["SET", probe, "x"])?;
        let is_refused = first_word(&r) == "NOREPLICAS";
        if is_refused == refused {
            return Ok(());
        }
        ensure!(
            is_refused || r == Value::Simple("OK".into()),
            "SET {probe}: {r:?}"
        );
        ensure!(
            Instant::now() < deadline,
            "SET still answers {r:?} after 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn min_replicas(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    let a = masters[0].clone();
    let replica = cluster.replica_of(a.port)?;
    let lock = name_in("lock", &a.ranges)?;
    let res = name_in("res", &a.ranges)?;
    let probe = format!("{{{res}}}:probe");
    let mut on_a = Conn::connect(a.port)?;
    let t0 = acquired_token(&acquire(&mut on_a, &lock, "z0", 500, 0)?)?;
    ensure!(applied(&on_a.ok(&["FENCE.SET", &res, &t0, "z0"])?)? == 1);
    let t1 = acquired_token(&acquire(&mut on_a, &lock, "a7", 10_000, 1000)?)?;
    ensure!(wait(&mut on_a, 5000)? == 1, "no replica");
    on_a.ok(&["CONFIG", "SET", "min-replicas-to-write", "1"])?;
    on_a.ok(&["CONFIG", "SET", "min-replicas-max-lag", "1"])?;
    // With the replica in reach, writes pass.
    wait_refusal(&mut on_a, &probe, false)?;
    let refused = {
        let _stopped = Stopped::new(cluster.node(replica.port)?)?;
        // The master counts a replica good while its last ACK is at most
        // max-lag seconds old: poll until it counts none.
        wait_refusal(&mut on_a, &probe, true)?;
        let before = on_a.snapshot()?;
        let later = "0.18446744073709551614";
        let new = format!("{{{res}}}:new");
        let writes: [&[&str]; 8] = [
            &["FENCE.SET", &res, &t1, "a7"],
            &["FENCE.DEL", &res, &t1],
            &["FENCE.EXEC", &res, &t1, "--", "SET", &probe, "y"],
            &["FENCE.ACQUIRE", &lock, "b9", "10000", "NOW", "20000"],
            &["FENCE.RENEW", &lock, "a7", &t1, "10000", "NOW", "2000"],
            &["FENCE.RELEASE", &lock, "a7", &t1],
            &["FENCE.RESTORE"],
            &["FENCE.SET", &new, later, "z"],
        ];
        let mut answers = Vec::new();
        for w in &writes {
            let r = on_a.cmd(w)?;
            answers.push((w[0].to_string(), first_word(&r), r));
        }
        let check = on_a.cmd(&["FENCE.CHECK", &res, &t1])?;
        ensure!(
            check.error().is_none(),
            "FENCE.CHECK while stopped: {check:?}"
        );
        let after = on_a.snapshot()?;
        ensure!(before == after, "a refused write changed a key");
        answers
    };
    eprintln!(
        "{:?} without a replica: {:?}",
        cluster.kind,
        refused.iter().map(|r| (&r.0, &r.1)).collect::<Vec<_>>()
    );
    let not_refused: Vec<_> = refused
        .iter()
        .filter(|(_, word, _)| word != "NOREPLICAS")
        .collect();
    ensure!(
        not_refused.is_empty(),
        "with no replica in reach, these were not refused: {not_refused:?}"
    );
    // The replica is back (the guard sent SIGCONT): writes pass again.
    wait_refusal(&mut on_a, &probe, false)?;
    let v = applied(&on_a.ok(&["FENCE.SET", &res, &t1, "a7"])?)?;
    ensure!(v == 2, "after the refusals the write has version {v}");
    let t2 = acquired_token(&acquire(&mut on_a, &lock, "b9", 10_000, 20_000)?)?;
    ensure!(order(&t2)? > order(&t1)?, "{t2} not above {t1}");
    Ok(())
}
