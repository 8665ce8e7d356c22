//! A real Redis Cluster (or Valkey cluster) on loopback: 3 masters and 3
//! replicas, each a [`Server`] loading the module in its own temporary
//! directory, joined by `redis-cli --cluster create` (`valkey-cli` for
//! Valkey), and a small cluster-aware client that follows MOVED, ASK and
//! TRYAGAIN the way cluster clients do, counting each.
#![allow(dead_code)] // each test binary uses part of it

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

use crate::common::{Conn, Kind, Options, Server, Value};

/// How long a cluster may take to agree (creation, failover); a poll
/// bound, never an assertion about speed.
const AGREE: Duration = Duration::from_secs(60);

/// A running cluster; every node is killed on drop.
pub struct Cluster {
    pub kind: Kind,
    pub nodes: Vec<Server>,
}

/// One line of `CLUSTER NODES`.
#[derive(Clone, Debug)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub master: bool,
    pub failed: bool,
    /// Slot ranges it serves (masters).
    pub ranges: Vec<(u16, u16)>,
}

impl Cluster {
    /// Start six nodes and make them a cluster with one replica per master;
    /// returns once every node answers `cluster_state:ok`, agrees on the
    /// slots, every replica's link to its master is up and every master
    /// lists its replica.
    pub fn start(kind: Kind) -> Result<Cluster> {
        Cluster::start_loading(kind, &[])
    }

    /// As [`Cluster::start`], every node loading the module with `args`
    /// (`TEST-CLOCK`: lease commands take `NOW ms`).
    pub fn start_loading(kind: Kind, args: &[&str]) -> Result<Cluster> {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            nodes.push(start_node(kind, args)?);
        }
        let cluster = Cluster { kind, nodes };
        let mut cli = Command::new(kind.cli()?);
        cli.arg("--cluster").arg("create");
        for n in &cluster.nodes {
            cli.arg(format!("127.0.0.1:{}", n.port));
        }
        cli.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = cluster.create(cli)?;
        ensure!(
            out.status.success(),
            "cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_ok()?;
        cluster.wait_replicas_known()?;
        Ok(cluster)
    }

    /// Wait (bounded by [`AGREE`]) until every master's own view lists its
    /// replica: a replica's link is up before gossip tells its master whose
    /// replica it is, and until then `CLUSTER REPLICAS` answers nothing.
    fn wait_replicas_known(&self) -> Result<()> {
        let deadline = Instant::now() + AGREE;
        for master in self.masters()? {
            while self.replica_of(master.port).is_err() {
                ensure!(
                    Instant::now() < deadline,
                    "master {} never listed its replica",
                    master.port
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Run `--cluster create`, re-sending CLUSTER MEET while it waits for
    /// the nodes to join: on a starved machine a node can drop the
    /// handshake of the one MEET redis-cli sends (it times out after
    /// cluster-node-timeout) and then knows nobody, so nobody can introduce
    /// the others to it and redis-cli waits forever. Bounded by [`AGREE`].
    fn create(&self, mut cli: Command) -> Result<std::process::Output> {
        use std::process::Stdio;
        let mut child = cli
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("redis-cli --cluster create")?;
        let start = Instant::now();
        let mut nudged = start;
        while child.try_wait()?.is_none() {
            if start.elapsed() > AGREE {
                let _ = child.kill();
                let out = child.wait_with_output()?;
                bail!(
                    "cluster create did not finish in {AGREE:?}: {}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
            if nudged.elapsed() > Duration::from_secs(3) {
                nudged = Instant::now();
                let _ = self.meet_all();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(child.wait_with_output()?)
    }

    /// Once redis-cli has begun introducing the nodes (one knows another),
    /// every node meets the first again (idempotent).
    fn meet_all(&self) -> Result<()> {
        let first = self.nodes.first().context("no node")?;
        let begun = self
            .nodes
            .iter()
            .any(|n| Cluster::view(n.port).is_ok_and(|v| v.len() > 1));
        if !begun {
            return Ok(());
        }
        let bus = first
            .conn()?
            .ok(&["CONFIG", "GET", "cluster-port"])?
            .items()
            .get(1)
            .and_then(Value::text)
            .context("cluster-port")?;
        for n in &self.nodes[1..] {
            n.conn()?.ok(&[
                "CLUSTER",
                "MEET",
                "127.0.0.1",
                &first.port.to_string(),
                &bus,
            ])?;
        }
        Ok(())
    }

    /// The node serving on `port`.
    pub fn node(&self, port: u16) -> Result<&Server> {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .with_context(|| format!("no node on port {port}"))
    }

    /// The node serving on `port`, mutable (to kill it).
    pub fn node_mut(&mut self, port: u16) -> Result<&mut Server> {
        self.nodes
            .iter_mut()
            .find(|n| n.port == port)
            .with_context(|| format!("no node on port {port}"))
    }

    /// The ports of the nodes still running.
    pub fn live_ports(&mut self) -> Vec<u16> {
        self.nodes
            .iter_mut()
            .filter_map(|n| n.alive().then_some(n.port))
            .collect()
    }

    /// `CLUSTER NODES` as seen by the node on `port`.
    pub fn view(port: u16) -> Result<Vec<NodeLine>> {
        let text = Conn::connect(port)?
            .ok(&["CLUSTER", "NODES"])?
            .text()
            .context("CLUSTER NODES text")?;
        text.lines().map(parse_node_line).collect()
    }

    /// Poll (bounded) until every live node reports `cluster_state:ok`,
    /// sees the same masters serving all 16384 slots, and every live
    /// replica's master link is up.
    pub fn wait_ok(&self) -> Result<()> {
        let deadline = Instant::now() + AGREE;
        loop {
            let last = match self.agreed() {
                Ok(()) => return Ok(()),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() > deadline {
                bail!("the cluster did not agree in {AGREE:?}: {last}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn agreed(&self) -> Result<()> {
        let mut maps = Vec::new();
        for n in &self.nodes {
            let Some(pid) = n.pid() else { continue };
            ensure!(std::path::Path::new(&format!("/proc/{pid}")).exists());
            let mut c = n.conn()?;
            let info = c.ok(&["CLUSTER", "INFO"])?.text().unwrap_or_default();
            ensure!(info.contains("cluster_state:ok"), "node {} not ok", n.port);
            let view = Cluster::view(n.port)?;
            let me = view.iter().find(|l| l.port == n.port).context("myself")?;
            if !me.master {
                let repl = c.ok(&["INFO", "replication"])?.text().unwrap_or_default();
                ensure!(
                    repl.contains("master_link_status:up"),
                    "replica {} not synced",
                    n.port
                );
            }
            let mut map: Vec<(u16, u16, u16)> = view
                .iter()
                .filter(|l| l.master && !l.failed)
                .flat_map(|l| l.ranges.iter().map(|&(a, b)| (a, b, l.port)))
                .collect();
            map.sort_unstable();
            let covered: u32 = map.iter().map(|&(a, b, _)| u32::from(b - a) + 1).sum();
            ensure!(covered == 16384, "node {} sees {covered} slots", n.port);
            maps.push(map);
        }
        ensure!(
            maps.windows(2).all(|w| w[0] == w[1]),
            "nodes disagree on the slot map"
        );
        Ok(())
    }

    /// The master serving `slot`, from the node on `port`'s view.
    pub fn master_of(&self, slot: u16) -> Result<NodeLine> {
        let port = self
            .nodes
            .iter()
            .find(|n| n.pid().is_some())
            .context("no live node")?
            .port;
        Cluster::view(port)?
            .into_iter()
            .find(|l| {
                l.master && !l.failed && l.ranges.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .with_context(|| format!("no master serves slot {slot}"))
    }

    /// The replica of the master with `master_id`.
    pub fn replica_of(&self, master_port: u16) -> Result<NodeLine> {
        let view = Cluster::view(master_port)?;
        let master = view
            .iter()
            .find(|l| l.port == master_port)
            .context("master")?;
        let text = Conn::connect(master_port)?.ok(&["CLUSTER", "REPLICAS", &master.id])?;
        let line = text
            .items()
            .first()
            .and_then(Value::text)
            .context("the master has no replica")?;
        parse_node_line(&line)
    }

    /// The masters, one per shard, sorted by their first slot.
    pub fn masters(&self) -> Result<Vec<NodeLine>> {
        let port = self.nodes.first().context("no node")?.port;
        let mut masters: Vec<NodeLine> = Cluster::view(port)?
            .into_iter()
            .filter(|l| l.master && !l.failed && !l.ranges.is_empty())
            .collect();
        masters.sort_by_key(|l| l.ranges.first().map(|r| r.0));
        Ok(masters)
    }

    /// Run `redis-cli --cluster <args…>` against the node on `port`.
    pub fn cli(&self, port: u16, args: &[&str]) -> Result<String> {
        let mut cmd = Command::new(self.kind.cli()?);
        cmd.arg("--cluster")
            .arg(args.first().context("a subcommand")?)
            .arg(format!("127.0.0.1:{port}"))
            .args(&args[1..]);
        let out = cmd.output().context("redis-cli --cluster")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(out.status.success(), "redis-cli --cluster {args:?}: {text}");
        Ok(text)
    }

    /// A cluster client seeded with every node.
    pub fn client(&self) -> Result<ClusterClient> {
        ClusterClient::new(self.nodes.iter().map(|n| n.port).collect())
    }

    /// The logs' tails, for a failing test's context.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("--- {}:\n{}", n.port, n.log_tail()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A cluster node's options: the module, cluster mode, and a free port for
/// the cluster bus (`cluster-port`, Redis 7.0+).
pub fn node_options() -> Result<Options> {
    let bus = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    Ok(Options::module()
        .with("cluster-enabled", "yes")
        .with("cluster-config-file", "nodes.conf")
        .with("cluster-port", &bus.to_string()))
}

fn start_node(kind: Kind, args: &[&str]) -> Result<Server> {
    let mut last = None;
    // The bus port is a second free port (`cluster-port`, Redis 7.0+): a
    // clash fails the start, so try again with another.
    for _ in 0..5 {
        let mut options = node_options()?;
        options.module = Some(args.iter().map(|a| (*a).to_string()).collect());
        let options = options
            // Failure detection in about a second (the tests kill masters).
            .with("cluster-node-timeout", "1000")
            .with("repl-diskless-sync-delay", "0")
            .with("appendonly", "no");
        match Server::start(kind, options) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("no node started")))
}

/// `<id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot>…`
pub fn parse_node_line(line: &str) -> Result<NodeLine> {
    let f: Vec<&str> = line.split_whitespace().collect();
    ensure!(f.len() >= 8, "bad CLUSTER NODES line {line:?}");
    let addr = f[1].split('@').next().unwrap_or_default();
    let port = addr
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("port in {line:?}"))?;
    let flags = f[2];
    let mut ranges = Vec::new();
    for s in &f[8..] {
        if s.starts_with('[') {
            continue; // a migrating/importing marker
        }
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        ranges.push((a.parse()?, b.parse()?));
    }
    Ok(NodeLine {
        id: f[0].to_string(),
        port,
        master: flags.contains("master"),
        failed: flags.contains("fail") && !flags.contains("fail?"),
        ranges,
    })
}

/// How many redirections and retries a [`ClusterClient`] followed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Redirects {
    pub moved: u64,
    pub ask: u64,
    pub tryagain: u64,
    pub down: u64,
}

/// A cluster-aware client: routes each command by its routing key's slot,
/// refreshes the slot map on MOVED, sends ASKING before the command on ASK,
/// retries TRYAGAIN and CLUSTERDOWN (bounded), as redis-py and the `redis`
/// crate do.
pub struct ClusterClient {
    seeds: Vec<u16>,
    slots: BTreeMap<u16, (u16, u16)>,
    conns: BTreeMap<u16, Conn>,
    pub redirects: Redirects,
    /// Attempts per command; when they run out on TRYAGAIN or CLUSTERDOWN,
    /// that reply is returned (as a client surfaces it).
    pub attempts: u32,
}

/// Attempts per command before giving up (each failed attempt waits a
/// little: a slot being migrated, an election).
const ATTEMPTS: u32 = 400;

impl ClusterClient {
    pub fn new(seeds: Vec<u16>) -> Result<ClusterClient> {
        let mut c = ClusterClient {
            seeds,
            slots: BTreeMap::new(),
            conns: BTreeMap::new(),
            redirects: Redirects::default(),
            attempts: ATTEMPTS,
        };
        c.refresh()?;
        Ok(c)
    }

    /// Reload the slot map from the first seed that answers.
    pub fn refresh(&mut self) -> Result<()> {
        for &seed in &self.seeds.clone() {
            let Ok(mut conn) = Conn::connect(seed) else {
                continue;
            };
            let Ok(reply) = conn.cmd(&["CLUSTER", "SLOTS"]) else {
                continue;
            };
            let mut slots = BTreeMap::new();
            for r in reply.items() {
                let it = r.items();
                let (Some(a), Some(b)) = (
                    it.first().and_then(Value::int),
                    it.get(1).and_then(Value::int),
                ) else {
                    continue;
                };
                let port = it
                    .get(2)
                    .and_then(|m| m.items().get(1))
                    .and_then(Value::int)
                    .context("master port")?;
                slots.insert(u16::try_from(a)?, (u16::try_from(b)?, u16::try_from(port)?));
            }
            if !slots.is_empty() {
                self.slots = slots;
                return Ok(());
            }
        }
        bail!("no seed answered CLUSTER SLOTS")
    }

    /// The port of the master this client believes serves `slot`.
    pub fn port_of(&self, slot: u16) -> Option<u16> {
        self.slots
            .range(..=slot)
            .next_back()
            .filter(|(_, (end, _))| slot <= *end)
            .map(|(_, (_, port))| *port)
    }

    fn conn(&mut self, port: u16) -> Result<&mut Conn> {
        match self.conns.entry(port) {
            std::collections::btree_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::btree_map::Entry::Vacant(e) => Ok(e.insert(Conn::connect(port)?)),
        }
    }

    /// Send `args` to the master of `route`'s slot; follow redirections.
    /// Returns the final reply (a refusal is a reply, not an error).
    pub fn cmd<A: AsRef<[u8]>>(&mut self, route: &[u8], args: &[A]) -> Result<Value> {
        let slot = fencecheck_redis::slot(route);
        let mut ask: Option<u16> = None;
        let mut last = None;
        for _ in 0..self.attempts {
            let port = match ask.take() {
                Some(p) => {
                    let conn = self.conn(p)?;
                    conn.ok(&["ASKING"])?;
                    p
                }
                None => match self.port_of(slot) {
                    Some(p) => p,
                    None => {
                        self.pause_and_refresh();
                        continue;
                    }
                },
            };
            let reply = match self.conn(port).and_then(|c| c.cmd(args)) {
                Ok(r) => r,
                Err(_) => {
                    // A dead or restarting node: forget it and ask again.
                    self.conns.remove(&port);
                    self.redirects.down += 1;
                    self.pause_and_refresh();
                    continue;
                }
            };
            let Some(e) = reply.error() else {
                return Ok(reply);
            };
            let word = e.split_whitespace().next().unwrap_or_default();
            match word {
                "MOVED" => {
                    self.redirects.moved += 1;
                    self.refresh()?;
                }
                "ASK" => {
                    self.redirects.ask += 1;
                    let to = e
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.parse().ok())
                        .with_context(|| format!("bad ASK {e:?}"))?;
                    ask = Some(to);
                }
                "TRYAGAIN" => {
                    self.redirects.tryagain += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                "CLUSTERDOWN" => {
                    self.redirects.down += 1;
                    self.pause_and_refresh();
                }
                _ => return Ok(reply),
            }
            last = Some(reply);
        }
        if let Some(reply) = last {
            return Ok(reply);
        }
        bail!(
            "no answer after {ATTEMPTS} attempts (redirects {:?})",
            self.redirects
        )
    }

    /// A command that must not fail.
    pub fn ok<A: AsRef<[u8]>>(&mut self, route: &[u8], args: &[A]) -> Result<Value> {
        let v = self.cmd(route, args)?;
        if let Some(e) = v.error() {
            let shown: Vec<String> = args
                .iter()
                .map(|a| String::from_utf8_lossy(a.as_ref()).into_owned())
                .collect();
            bail!("{shown:?}: -{e}");
        }
        Ok(v)
    }

    /// Point every slot range at the next master's port: a stale map, as
    /// after a reshard or failover the client has not seen.
    pub fn scramble(&mut self) {
        let ports: Vec<u16> = self.slots.values().map(|(_, p)| *p).collect();
        for (i, v) in self.slots.values_mut().enumerate() {
            v.1 = ports[(i + 1) % ports.len()];
        }
    }

    fn pause_and_refresh(&mut self) {
        std::thread::sleep(Duration::from_millis(20));
        let _ = self.refresh();
    }
}

/// MIGRATE every key left in `slot` on the node on `from` to the node on
/// `to`, as `redis-cli --cluster reshard` does before it hands the slot
/// over (the module's per-slot lineage and floor among them); any key that
/// does not move is an error.
pub fn migrate_slot_keys(from: u16, to: u16, slot: u16) -> Result<()> {
    let mut src = Conn::connect(from)?;
    let (s, port) = (slot.to_string(), to.to_string());
    for _ in 0..1000 {
        let keys = src.ok(&["CLUSTER", "GETKEYSINSLOT", &s, "100"])?;
        if keys.items().is_empty() {
            return Ok(());
        }
        let mut args: Vec<&[u8]> = vec![
            b"MIGRATE",
            b"127.0.0.1",
            port.as_bytes(),
            b"",
            b"0",
            b"5000",
            b"KEYS",
        ];
        args.extend(keys.items().iter().filter_map(Value::bytes));
        let r = src.cmd(&args)?;
        ensure!(
            r == Value::Simple("OK".into()),
            "MIGRATE {:?}: {r:?}",
            keys.items()
                .iter()
                .filter_map(Value::text)
                .collect::<Vec<_>>()
        );
    }
    bail!("slot {slot} did not empty")
}

/// Names `prefix0`, `prefix1`, … until one lands in each slot range, in
/// order: one name per shard.
pub fn name_in(prefix: &str, ranges: &[(u16, u16)]) -> Result<String> {
    for i in 0..100_000 {
        let name = format!("{prefix}{i}");
        let s = fencecheck_redis::slot(name.as_bytes());
        if ranges.iter().any(|&(a, b)| (a..=b).contains(&s)) {
            return Ok(name);
        }
    }
    bail!("no name with prefix {prefix} in {ranges:?}")
}

/// Poll (bounded) until the node on `port` says it is a master.
pub fn wait_master(port: u16) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(mut c) = Conn::connect(port)
            && let Ok(v) = c.cmd(&["ROLE"])
            && v.items().first().and_then(Value::text).as_deref() == Some("master")
        {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{port} was not promoted")
}
