//! Every command on scopes and locks in every shard, through a client that
//! follows redirections; MOVED from a wrong node; CROSSSLOT refusals.

use anyhow::{Context, Result, ensure};

use crate::cluster::{Cluster, name_in};
use crate::common::{Value, applied, err, first_word, kinds};

/// FENCE.SET/DEL/CHECK/EXEC and ACQUIRE/RENEW/RELEASE decide on every
/// shard's master, each scope's state next to its data; a wrong node
/// answers MOVED and the client follows it; FENCE.EXEC with a key of
/// another slot is refused with CROSSSLOT and writes nothing.
#[test]
fn commands_in_every_shard() -> Result<()> {
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        every_shard(&cluster).with_context(|| format!("{kind:?}\n{}", cluster.logs()))?;
    }
    Ok(())
}

fn every_shard(cluster: &Cluster) -> Result<()> {
    let masters = cluster.masters()?;
    ensure!(masters.len() == 3, "{masters:?}");
    let mut client = cluster.client()?;
    for (i, m) in masters.iter().enumerate() {
        let scope = name_in(&format!("report/{i}/"), &m.ranges)?;
        let s = scope.as_bytes();
        ensure!(applied(&client.ok(s, &["FENCE.SET", &scope, "0.5", "v5"])?)? == 1);
        let stale = client.cmd(s, &["FENCE.SET", &scope, "0.4", "v4"])?;
        ensure!(first_word(&stale) == "STALEFENCE", "{stale:?}");
        ensure!(applied(&client.ok(s, &["FENCE.CHECK", &scope, "0.6"])?)? == 2);
        ensure!(first_word(&client.cmd(s, &["FENCE.CHECK", &scope, "0.4"])?) == "STALEFENCE");
        ensure!(client.ok(s, &["GET", &scope])?.text().as_deref() == Some("v5"));
        // The state lives on the same master as the data.
        let mut direct = cluster.node(m.port)?.conn()?;
        let state_key = fencecheck_redis::fence_key(s).ok().context("state key")?;
        ensure!(direct.ok(&[b"EXISTS".as_slice(), &state_key])?.int() == Some(1));
        ensure!(applied(&client.ok(s, &["FENCE.DEL", &scope, "0.6"])?)? == 2);
        ensure!(client.ok(s, &["EXISTS", &scope])?.int() == Some(0));
        ensure!(
            first_word(&client.cmd(s, &["FENCE.SET", &scope, "0.5", "again"])?) == "STALEFENCE"
        );

        // FENCE.EXEC on a tagged scope and a key with the same tag.
        let tag = name_in(&format!("acct{i}-"), &m.ranges)?;
        let tscope = format!("{{{tag}}}");
        let hkey = format!("{{{tag}}}:owner");
        let r = client.ok(
            tscope.as_bytes(),
            &[
                "FENCE.EXEC",
                &tscope,
                "0.7",
                "--",
                "HSET",
                &hkey,
                "name",
                "b9",
            ],
        )?;
        ensure!(
            applied(&r)? == 1 && r.items().get(2) == Some(&Value::Int(1)),
            "{r:?}"
        );
        // CROSSSLOT: a key of another slot, here and on another shard.
        let other = &masters[(i + 1) % 3];
        let far = name_in(&format!("far{i}-"), &other.ranges)?;
        let near_other_slot = (0..1000)
            .map(|j| format!("near{i}-{j}"))
            .find(|k| {
                let sl = fencecheck_redis::slot(k.as_bytes());
                sl != fencecheck_redis::slot(tag.as_bytes())
                    && m.ranges.iter().any(|&(a, b)| (a..=b).contains(&sl))
            })
            .context("a key of another slot on this shard")?;
        let before = direct.snapshot()?;
        for key in [&far, &near_other_slot] {
            let r = client.cmd(
                tscope.as_bytes(),
                &["FENCE.EXEC", &tscope, "0.8", "--", "SET", key, "x"],
            )?;
            ensure!(
                err(&r) == "CROSSSLOT the command's keys must hash to the scope's slot",
                "{key}: {r:?}"
            );
            let r = client.cmd(
                tscope.as_bytes(),
                &[
                    "FENCE.EXEC",
                    &tscope,
                    "0.8",
                    "--",
                    "MSET",
                    &hkey,
                    "x",
                    key,
                    "y",
                ],
            )?;
            ensure!(first_word(&r) == "CROSSSLOT", "{r:?}");
        }
        ensure!(direct.snapshot()? == before, "a CROSSSLOT refusal wrote");

        // A lease on this shard; its token fences a scope on the next shard.
        let lock = name_in(&format!("lock{i}-"), &m.ranges)?;
        let l = lock.as_bytes();
        let grant = client.ok(l, &["FENCE.ACQUIRE", &lock, "a7", "600000"])?;
        ensure!(
            grant.items().first() == Some(&Value::Simple("acquired".into())),
            "{grant:?}"
        );
        let token = grant
            .items()
            .get(1)
            .and_then(Value::text)
            .context("token")?;
        let busy = client.ok(l, &["FENCE.ACQUIRE", &lock, "b9", "600000"])?;
        ensure!(
            busy.items().first() == Some(&Value::Simple("busy".into())),
            "{busy:?}"
        );
        let renewed = client.ok(l, &["FENCE.RENEW", &lock, "a7", &token, "600000"])?;
        ensure!(
            renewed.items().first() == Some(&Value::Simple("renewed".into())),
            "{renewed:?}"
        );
        let res = name_in(&format!("res{i}-"), &other.ranges)?;
        ensure!(applied(&client.ok(res.as_bytes(), &["FENCE.SET", &res, &token, "by-a7"])?)? == 1);
        let released = client.ok(l, &["FENCE.RELEASE", &lock, "a7", &token])?;
        ensure!(
            released.items().first() == Some(&Value::Simple("released".into())),
            "{released:?}"
        );
        let next = client.ok(l, &["FENCE.ACQUIRE", &lock, "b9", "600000"])?;
        let next_token = next.items().get(1).and_then(Value::text).context("token")?;
        ensure!(
            applied(&client.ok(res.as_bytes(), &["FENCE.SET", &res, &next_token, "by-b9"])?)? == 2
        );
        ensure!(
            first_word(&client.cmd(res.as_bytes(), &["FENCE.SET", &res, &token, "late-a7"])?)
                == "STALEFENCE"
        );

        // A wrong node answers MOVED for the scope's slot, and changes nothing.
        let mut wrong = cluster.node(other.port)?.conn()?;
        let moved = wrong.cmd(&["FENCE.SET", &scope, "0.9", "x"])?;
        ensure!(first_word(&moved) == "MOVED", "{moved:?}");
        let moved = wrong.cmd(&["FENCE.ACQUIRE", &lock, "c1", "1000"])?;
        ensure!(first_word(&moved) == "MOVED", "{moved:?}");
    }
    // A client whose map is wrong follows MOVED: a client seeded with one
    // node, its map rotated so every slot points at the wrong master.
    let mut lost = crate::cluster::ClusterClient::new(vec![masters[0].port])?;
    lost.scramble();
    for (i, m) in masters.iter().enumerate() {
        let scope = name_in(&format!("moved/{i}/"), &m.ranges)?;
        ensure!(applied(&lost.ok(scope.as_bytes(), &["FENCE.SET", &scope, "0.1", "v"])?)? == 1);
    }
    // The first MOVED reloads the whole map: the next two go straight.
    ensure!(lost.redirects.moved == 1, "{:?}", lost.redirects);
    Ok(())
}
