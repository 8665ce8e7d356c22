//! Marks and leases survive restarts (AOF, RDB) and replicate as plain
//! effects: a server or a replica without the module serves the fenced data
//! and the state bytes exactly, and the module, loaded again, keeps
//! refusing the old tokens.

use crate::common::{Options, Server, Value, applied, kinds};
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
    for kind in kinds() {
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
    for kind in kinds() {
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
    for kind in kinds() {
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

/// The RESP commands in the AOF files under `dir` (`appendonlydir/*.aof`).
fn aof_commands(dir: &std::path::Path) -> Result<Vec<Vec<Vec<u8>>>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir.join("appendonlydir"))? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "aof") {
            continue;
        }
        let bytes = std::fs::read(&path)?;
        let mut rest = bytes.as_slice();
        let line = |r: &mut &[u8]| -> Result<Vec<u8>> {
            let end = r.windows(2).position(|w| w == b"\r\n").context("a line")?;
            let l = r[..end].to_vec();
            *r = &r[end + 2..];
            Ok(l)
        };
        while rest.first() == Some(&b'*') {
            let n: usize = std::str::from_utf8(&line(&mut rest)?[1..])?.parse()?;
            let mut args = Vec::new();
            for _ in 0..n {
                let len: usize = std::str::from_utf8(&line(&mut rest)?[1..])?.parse()?;
                args.push(rest.get(..len).context("an argument")?.to_vec());
                rest = rest.get(len + 2..).context("an argument's end")?;
            }
            out.push(args);
        }
    }
    Ok(out)
}

/// Fenced writes that rewrite the same keys in place, one after another,
/// inside MULTI and inside a script, reach the AOF and a replica without
/// the module as one MSET each carrying that write's own value and state
/// (never bytes of a later write), and both end byte for byte equal.
#[test]
fn in_place_rewrites_replicate_each_write() -> Result<()> {
    for kind in kinds() {
        let aof = |o: Options| o.with("appendonly", "yes").with("appendfsync", "always");
        let primary = Server::start(kind, aof(Options::module()))?;
        let replica = Server::start(kind, Options::plain())?;
        let mut r = replica.conn()?;
        r.ok(&["REPLICAOF", "127.0.0.1", &primary.port.to_string()])?;
        let mut p = primary.conn()?;
        let values = ["aaaa", "bbbb", "cccc", "dddd", "ee", "ffff", "gggg"];
        applied(&p.ok(&["FENCE.SET", "doc", "0.1", values[0]])?)?;
        applied(&p.ok(&["FENCE.SET", "doc", "0.2", values[1]])?)?;
        p.ok(&["MULTI"])?;
        for (i, v) in values.iter().enumerate().skip(2).take(3) {
            p.ok(&["FENCE.SET", "doc", &format!("0.{}", i + 1), v])?;
        }
        ensure!(p.ok(&["EXEC"])?.items().len() == 3);
        let script = "redis.call('FENCE.SET', KEYS[1], '0.6', ARGV[1]) \
                      return redis.call('FENCE.SET', KEYS[1], '0.7', ARGV[2])";
        p.ok(&["EVAL", script, "1", "doc", values[5], values[6]])?;
        ensure!(
            p.ok(&["WAIT", "1", "10000"])? == Value::Int(1),
            "{kind:?}: no ack"
        );
        for key in ["doc", "fencecheck:{doc}"] {
            ensure!(
                p.ok(&["DUMP", key])? == r.ok(&["DUMP", key])?,
                "{kind:?}: the replica's {key} differs"
            );
        }
        let msets: Vec<Vec<Vec<u8>>> = aof_commands(&primary.dir)?
            .into_iter()
            .filter(|c| c.first().is_some_and(|n| n.eq_ignore_ascii_case(b"MSET")))
            .collect();
        ensure!(
            msets.len() == values.len(),
            "{kind:?}: {} MSETs",
            msets.len()
        );
        let mut states = std::collections::HashSet::new();
        for (mset, value) in msets.iter().zip(values) {
            ensure!(
                mset.len() == 5 && mset[1] == b"doc" && mset[2] == value.as_bytes(),
                "{kind:?}: {mset:?}"
            );
            ensure!(
                states.insert(mset[4].clone()),
                "{kind:?}: a state was sent twice"
            );
        }
    }
    Ok(())
}
