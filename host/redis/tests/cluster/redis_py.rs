//! redis-py's RedisCluster (the client Python applications use) drives the
//! module in a real cluster: host/redis/tests/clients/cluster.py.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, ensure};

use crate::cluster::Cluster;
use crate::common::kinds;

/// Through redis-py's RedisCluster, seeded with one replica: FENCE.SET,
/// FENCE.CHECK, FENCE.DEL, FENCE.ACQUIRE and FENCE.EXEC on every primary,
/// routed by key and by `target_nodes`; MOVED from a stale slot cache is
/// followed and the cache corrected; a cross-slot FENCE.EXEC raises
/// ClusterCrossSlotError and writes nothing (assertions in the script).
#[test]
fn redis_py_cluster_client() -> Result<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/cluster.py");
    for kind in kinds() {
        let cluster = Cluster::start(kind)?;
        let masters = cluster.masters()?;
        let seed = cluster.replica_of(masters[0].port)?.port;
        let out = Command::new("python3")
            .arg(&script)
            .arg(seed.to_string())
            .output()
            .context("python3 (redis-py: .ci/install.d/75-redis.sh)")?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success(),
            "{kind:?}: {stdout}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            cluster.logs()
        );
        let lines: Vec<&str> = stdout.lines().collect();
        ensure!(
            lines.len() == 3
                && lines.iter().all(|l| l.contains(
                    "refused: CROSSSLOT the command's keys must hash to the scope's slot"
                )),
            "{kind:?}: {stdout}"
        );
    }
    Ok(())
}
