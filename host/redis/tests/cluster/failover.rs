//! Failover in a cluster: a manual CLUSTER FAILOVER keeps grants and marks;
//! a SIGKILLed master whose replica had not received a grant hands the
//! same token out again, and FENCE.RESTORE on the promoted master (the
//! runbook, docs/redis.md) puts every later grant above it.

use anyhow::{Context, Result, ensure};

use crate::cluster::{Cluster, name_in, wait_master};
use crate::common::{Conn, Value, acquired_token, applied, first_word, kinds};

/// Manual failover loses nothing (the lease stays held, the mark refuses
/// the old token); after a SIGKILL the promoted replica repeats a grant it
/// never received (WAIT told the holder: 0 replicas), and after
/// FENCE.RESTORE the next grant's token is above it and the resource takes it.
#[test]
fn failover_and_restore() -> Result<()> {
    for kind in kinds() {
        let mut cluster = Cluster::start(kind)?;
        let r = failover(&mut cluster);
        r.with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

fn failover(cluster: &mut Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    let a = masters[0].clone();
    let other = masters[1].clone();
    let replica = cluster.replica_of(a.port)?;
    let mut client = cluster.client()?;
    let lock = name_in("lock", &a.ranges)?;
    let res = name_in("res", &other.ranges)?;
    // WAIT counts replicas that have this connection's writes: the
    // acquire and the WAIT share one connection to the master.
    let mut on_a = Conn::connect(a.port)?;
    let t1 = acquired_token(&on_a.ok(&["FENCE.ACQUIRE", &lock, "a7", "600000"])?)?;
    ensure!(
        on_a.ok(&["WAIT", "1", "5000"])?.int() == Some(1),
        "the grant did not replicate"
    );
    ensure!(applied(&client.ok(res.as_bytes(), &["FENCE.SET", &res, &t1, "a7"])?)? == 1);

    // Manual failover: the replica takes over with everything.
    Conn::connect(replica.port)?.ok(&["CLUSTER", "FAILOVER"])?;
    wait_master(replica.port)?;
    cluster.wait_ok()?;
    let busy = client.ok(lock.as_bytes(), &["FENCE.ACQUIRE", &lock, "b9", "600000"])?;
    ensure!(
        busy.items().first() == Some(&Value::Simple("busy".into())),
        "{busy:?}"
    );

    // A grant the replica (now the old master) never sees, of a lock in
    // the first lock's slot: the slot's lineage reached the replica with
    // the first grant, so the lost grant and the repeat carry one lineage.
    let lock2 = format!("{{{lock}}}:2");
    let res2 = name_in("res2-", &other.ranges)?;
    cluster.node(a.port)?.signal("-STOP")?;
    let mut on_new = Conn::connect(replica.port)?;
    // Its link is cut while it is paused (it cannot reconnect): what the
    // master writes now reaches no replica.
    let killed = on_new.ok(&["CLIENT", "KILL", "TYPE", "replica"])?;
    ensure!(killed.int() == Some(1), "{killed:?}");
    let lost = acquired_token(&on_new.ok(&["FENCE.ACQUIRE", &lock2, "c1", "600000"])?)?;
    ensure!(
        on_new.ok(&["WAIT", "1", "200"])?.int() == Some(0),
        "WAIT must say 0 replicas"
    );
    ensure!(applied(&client.ok(res2.as_bytes(), &["FENCE.SET", &res2, &lost, "c1"])?)? == 1);
    cluster.node_mut(replica.port)?.kill();
    cluster.node(a.port)?.signal("-CONT")?;
    wait_master(a.port)?;
    cluster.wait_ok()?;
    let again =
        acquired_token(&client.ok(lock2.as_bytes(), &["FENCE.ACQUIRE", &lock2, "d2", "1"])?)?;
    ensure!(
        again == lost,
        "the promoted replica was expected to repeat {lost}, gave {again}"
    );
    let r = client.cmd(res2.as_bytes(), &["FENCE.SET", &res2, &again, "d2"])?;
    ensure!(first_word(&r) == "STALEFENCE", "{r:?}");

    // The runbook: FENCE.RESTORE on the promoted master, then grants.
    Conn::connect(a.port)?.ok(&["FENCE.RESTORE"])?;
    let released = client.ok(lock2.as_bytes(), &["FENCE.RELEASE", &lock2, "d2", &again])?;
    ensure!(
        released.items().first() == Some(&Value::Simple("released".into())),
        "{released:?}"
    );
    let fresh =
        acquired_token(&client.ok(lock2.as_bytes(), &["FENCE.ACQUIRE", &lock2, "e3", "600000"])?)?;
    ensure!(
        applied(&client.ok(res2.as_bytes(), &["FENCE.SET", &res2, &fresh, "e3"])?)? == 2,
        "after FENCE.RESTORE {fresh} was refused"
    );
    Ok(())
}
