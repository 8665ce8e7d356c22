//! Two coordinator *processes* (`fencecheck-etcd-client`) acquire and
//! release one lock in a loop on a real 3-member etcd cluster, with and
//! without faults (SIGKILL of the leader, SIGSTOP of a member). Every
//! successful acquisition is recorded with CLOCK_MONOTONIC stamps taken
//! before the request and after the answer. Afterwards every lease state
//! the lock's key held is read back from etcd, revision by revision: the
//! grants in that (commit) order must pass the shared checker's
//! `check_issued` (tests/support/history.rs) and match what the clients were
//! told; and every token must be greater than every token granted before its
//! request started.

use crate::etcd;
use crate::etcd_clients;

use anyhow::{Result, ensure};
use etcd::Cluster;
use etcd_clients::{Clients, Grant, check_history, check_store, next_grant_is_above, summary};
use fencecheck::Token;

/// Two coordinator processes on one lock: etcd's committed grants pass the
/// shared checker and match the acknowledged ones, and every token is
/// greater than all granted before its request started.
#[test]
fn two_processes_issue_increasing_tokens() -> Result<()> {
    let cluster = Cluster::start(3)?;
    let authority = cluster.status(0)?.cluster_id;
    let mut clients = Clients::spawn(&cluster, 2, 400)?;
    clients.wait_grants(50, "steady state")?;
    let tally = clients.finish()?;
    let cross = check_history(&tally.grants, authority)?;
    let committed = check_store(&cluster, &tally)?;
    summary("no faults", &tally, cross, committed);
    for p in 0..2 {
        ensure!(
            tally.grants.iter().any(|g| g.process == p),
            "process {p} never acquired"
        );
    }
    ensure!(
        cross > 0,
        "no grant was ordered after another process's grant"
    );
    next_grant_is_above(&cluster, &tally.grants)
}

/// The same invariants through three rounds of faults: the etcd leader is
/// SIGKILLed (then restarted on its data), then a member is SIGSTOPped (the
/// leader in rounds 0 and 2, a follower in round 1; then SIGCONT). Errors
/// during the faults are allowed; a duplicate or decreasing token never is.
/// Progress after each fault is required, so every phase contributes grants.
#[test]
fn tokens_stay_increasing_through_leader_kill_and_member_stop() -> Result<()> {
    let mut cluster = Cluster::start(3)?;
    let authority = cluster.status(0)?.cluster_id;
    let mut clients = Clients::spawn(&cluster, 2, 1_000_000)?;
    clients.wait_grants(20, "before faults")?;

    for round in 0..3 {
        let leader = cluster.wait_healthy()?;
        cluster.kill(leader)?;
        clients.wait_grants(10, &format!("round {round}: leader killed"))?;
        cluster.restart(leader)?;
        cluster.wait_healthy()?;
        clients.wait_grants(10, &format!("round {round}: killed member restarted"))?;

        let leader = cluster.wait_healthy()?;
        let victim = if round == 1 {
            (leader + 1) % cluster.size()
        } else {
            leader
        };
        cluster.stop(victim)?;
        clients.wait_grants(10, &format!("round {round}: member {victim} stopped"))?;
        cluster.resume(victim)?;
        cluster.wait_healthy()?;
        clients.wait_grants(10, &format!("round {round}: member {victim} continued"))?;
    }

    let tally = clients.finish()?;
    let cross = check_history(&tally.grants, authority)?;
    let committed = check_store(&cluster, &tally)?;
    summary("faults", &tally, cross, committed);
    ensure!(
        cross > 0,
        "no grant was ordered after another process's grant"
    );
    next_grant_is_above(&cluster, &tally.grants)
}

/// The checker itself: a duplicate token, a token that goes backwards, and
/// a foreign authority are each caught (so the process tests can fail).
#[test]
fn history_checker_catches_violations() -> Result<()> {
    let g = |process, counter, start, end| Grant {
        process,
        lease_id: format!("p{process}-{counter}"),
        token: Token::new(7, 0, counter),
        start,
        end,
    };
    ensure!(check_history(&[g(0, 1, 0, 10), g(1, 2, 20, 30)], 7)? == 1);
    // Overlapping requests may be granted in either order.
    ensure!(check_history(&[g(0, 2, 0, 10), g(1, 1, 5, 30)], 7).is_ok());
    ensure!(check_history(&[g(0, 1, 0, 10), g(1, 1, 20, 30)], 7).is_err());
    ensure!(check_history(&[g(0, 2, 0, 10), g(1, 1, 20, 30)], 7).is_err());
    ensure!(check_history(&[g(0, 3, 0, 10), g(0, 4, 11, 12), g(1, 2, 20, 30)], 7).is_err());
    ensure!(check_history(&[g(0, 1, 0, 10)], 8).is_err());
    Ok(())
}
