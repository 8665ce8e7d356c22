//! Marks and leases survive restarts (AOF, RDB) and replicate as plain
//! effects: a server or a replica without the module serves the fenced data
//! and the state bytes exactly, and the module, loaded again, keeps
//! refusing the old tokens.

use crate::common::{KINDS, Options, Server, Value, applied};
use anyhow::{Context, Result, ensure};

/// What a restart must keep: data, state and lease bytes.
fn kept(c: &mut crate::common::Conn) -> Result<Vec<Value>> {
    let mut out = Vec::new();
    for key in [
        "report/july",
        "fencecheck:{report/july}",
        "fencecheck:lease:{report/july}",
        "fencecheck:lineage",
        "{acct}:h",
    ] {
        out.push(c.ok(&["DUMP", key])?);
    }
    Ok(out)
}

fn write_some(c: &mut crate::common::Conn) -> Result<String> {
    let grant = c.ok(&["FENCE.ACQUIRE", "report/july", "b9", "600000"])?;
    let token = grant
        .items()
        .get(1)
        .and_then(|v| v.text())
        .context("a token")?;
    ensure!(applied(&c.ok(&["FENCE.SET", "report/july", &token, "b9.tmp"])?)? == 1);
    c.ok(&[
        "FENCE.EXEC",
        "{acct}",
        "0.2",
        "--",
        "HSET",
        "{acct}:h",
        "owner",
        "b9",
    ])?;
    Ok(token)
}

fn after_restart(c: &mut crate::common::Conn, token: &str, before: &[Value]) -> Result<()> {
    ensure!(kept(c)? == before, "the restart lost or changed a key");
    let stale = c.cmd(&["FENCE.SET", "report/july", token, "again"])?;
    ensure!(
        stale.error().is_some_and(|e| e.starts_with("STALEFENCE")),
        "{stale:?}"
    );
    // The lease survived: the same lease id retried gets the same token.
    let retry = c.ok(&["FENCE.ACQUIRE", "report/july", "b9", "600000"])?;
    ensure!(
        retry.items().get(1).and_then(|v| v.text()).as_deref() == Some(token),
        "{retry:?}"
    );
    let busy = c.ok(&["FENCE.ACQUIRE", "report/july", "c1", "600000"])?;
    ensure!(
        busy.items().first() == Some(&Value::Simple("busy".into())),
        "{busy:?}"
    );
    Ok(())
}

/// With appendonly (fsync always), a SIGKILLed server replays the AOF:
/// without the module the data and states are there byte for byte; with
/// it, old tokens stay refused and the lease is still held.
#[test]
fn aof_replay_keeps_marks_and_leases() -> Result<()> {
    for kind in KINDS {
        let aof = |o: Options| o.with("appendonly", "yes").with("appendfsync", "always");
        let mut server = Server::start(kind, aof(Options::module()))?;
        let mut c = server.conn()?;
        let token = write_some(&mut c)?;
        let before = kept(&mut c)?;
        server.kill();
        server.restart(aof(Options::plain()))?;
        let mut plain = server.conn()?;
        ensure!(
            kept(&mut plain)? == before,
            "{kind:?}: AOF replay without the module differs"
        );
        ensure!(plain.ok(&["GET", "report/july"])?.text().as_deref() == Some("b9.tmp"));
        server.restart(aof(Options::module()))?;
        after_restart(&mut server.conn()?, &token, &before).with_context(|| format!("{kind:?}"))?;
    }
    Ok(())
}

/// SAVE, then restart from the RDB file: the same.
#[test]
fn rdb_restart_keeps_marks_and_leases() -> Result<()> {
    for kind in KINDS {
        let mut server = Server::start(kind, Options::module())?;
        let mut c = server.conn()?;
        let token = write_some(&mut c)?;
        let before = kept(&mut c)?;
        c.ok(&["SAVE"])?;
        server.restart(Options::plain())?;
        ensure!(
            kept(&mut server.conn()?)? == before,
            "{kind:?}: RDB without the module differs"
        );
        server.restart(Options::module())?;
        after_restart(&mut server.conn()?, &token, &before).with_context(|| format!("{kind:?}"))?;
    }
    Ok(())
}

/// A replica that does not load the module receives the effects (state
/// key SETs and the commands' own writes) and serves the fenced data; a
/// refused write sends nothing.
#[test]
fn replica_without_the_module_serves_fenced_data() -> Result<()> {
    for kind in KINDS {
        let primary = Server::start(kind, Options::module())?;
        let replica = Server::start(kind, Options::plain())?;
        let mut r = replica.conn()?;
        r.ok(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()])?;
        let mut p = primary.conn()?;
        let token = write_some(&mut p)?;
        let stale = p.cmd(&["FENCE.SET", "report/july", &token, "late"])?;
        ensure!(stale.error().is_some());
        p.ok(&[
            "FENCE.EXEC",
            "{acct}",
            "0.3",
            "--",
            "XADD",
            "{acct}:log",
            "*",
            "e",
            "1",
        ])?;
        let offset_sync = p.ok(&["WAIT", "1", "10000"])?;
        ensure!(
            offset_sync == Value::Int(1),
            "{kind:?}: replica did not acknowledge: {offset_sync:?}"
        );
        let before = kept(&mut p)?;
        ensure!(kept(&mut r)? == before, "{kind:?}: replica differs");
        ensure!(r.ok(&["GET", "report/july"])?.text().as_deref() == Some("b9.tmp"));
        ensure!(
            p.ok(&["XRANGE", "{acct}:log", "-", "+"])?
                == r.ok(&["XRANGE", "{acct}:log", "-", "+"])?,
            "{kind:?}: XADD's id differs on the replica"
        );
        // The replica refuses fenced writes (no module) and plain ones (read-only).
        ensure!(r.cmd(&["SET", "report/july", "x"])?.error().is_some());
    }
    Ok(())
}
