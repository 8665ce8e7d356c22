//! A real etcd cluster on loopback, for the etcd tests and the benchmark.
//!
//! Every member is a child process of `/usr/bin/etcd` (Debian's
//! `etcd-server`) with its own free ports and a data directory under a
//! private temp dir. Members can be killed (SIGKILL), restarted on their data,
//! stopped (SIGSTOP) and continued (SIGCONT). Dropping the cluster kills and
//! reaps every member and removes the directory. Waits poll with a bounded
//! deadline and never assume an ordering.
#![allow(dead_code)] // each test binary uses a different subset

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use fencecheck_tests::netns::Net;

/// Where the tests expect etcd (Debian's `etcd-server`, 3.4).
pub const ETCD: &str = "/usr/bin/etcd";

/// How to install it (what `.ci/install.d/20-etcd.sh` runs).
pub const INSTALL: &str =
    "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y etcd-server";

/// How long a cluster may take to elect a leader, or to recover from a fault.
pub const HEALTHY_WITHIN: Duration = Duration::from_secs(30);

/// The etcd binary, or an error naming the install command (never a skip).
pub fn etcd_binary() -> Result<PathBuf> {
    let path = PathBuf::from(ETCD);
    ensure!(
        path.is_file(),
        "{ETCD} is missing: the etcd tests need a real etcd. Install it with `{INSTALL}` \
         (.ci/install.d/20-etcd.sh does this on CI)"
    );
    Ok(path)
}

/// What one member says about itself and the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Status {
    /// The cluster id (the etcd coordinator's authority).
    pub cluster_id: u64,
    /// This member's id.
    pub member_id: u64,
    /// The leader's member id as this member knows it (0: none).
    pub leader: u64,
}

struct Member {
    name: String,
    /// The net node it runs on (with a net).
    node: usize,
    /// `--initial-cluster` and `--initial-cluster-state` it was started with.
    initial_cluster: String,
    state: &'static str,
    client_url: String,
    peer_url: String,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    stopped: bool,
}

/// Members that serve clients over TLS ([`Cluster::start_secure`]).
#[derive(Clone)]
pub struct Secure {
    /// Extra etcd flags: `--cert-file`, `--key-file`, `--trusted-ca-file`,
    /// `--client-cert-auth`, …
    pub args: Vec<String>,
    /// The agent the harness polls members' status with (trusting their CA,
    /// presenting a client certificate).
    pub agent: ureq::Agent,
}

/// A running etcd cluster of child processes on 127.0.0.1, or each member
/// in a network namespace of its own ([`Cluster::start_in`]).
pub struct Cluster {
    members: Vec<Member>,
    net: Option<Arc<Net>>,
    initial_cluster: String,
    token: String,
    http: ureq::Agent,
    /// Extra flags every member gets (TLS, auth token TTL).
    extra_args: Vec<String>,
    // Last: removed after the members are dead.
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Start `size` members and wait until they agree on a leader. Retries
    /// with new ports if one was taken between choosing and binding it.
    pub fn start(size: usize) -> Result<Self> {
        Self::start_with(size, None, None)
    }

    /// [`Cluster::start`] with `https://` client URLs and `secure`'s flags
    /// (peers still talk plain HTTP on loopback).
    pub fn start_secure(size: usize, secure: Secure) -> Result<Self> {
        Self::start_with(size, None, Some(secure))
    }

    /// Start `size` members, member `i` in `net`'s node `i` (its own
    /// namespace), listening on that node's address; the test reaches them
    /// only from threads inside their namespaces.
    pub fn start_in(net: Arc<Net>, size: usize) -> Result<Self> {
        ensure!(size <= net.size(), "{size} members on {} nodes", net.size());
        Self::start_with(size, Some(net), None)
    }

    fn start_with(size: usize, net: Option<Arc<Net>>, secure: Option<Secure>) -> Result<Self> {
        let binary = etcd_binary()?;
        let mut last = None;
        for _ in 0..3 {
            match Self::try_start(&binary, size, net.clone(), secure.clone()) {
                Ok(cluster) => return Ok(cluster),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow!("no attempt made")))
            .context(format!("starting a {size}-member etcd cluster"))
    }

    fn try_start(
        binary: &Path,
        size: usize,
        net: Option<Arc<Net>>,
        secure: Option<Secure>,
    ) -> Result<Self> {
        ensure!(size > 0, "a cluster needs members");
        let dir = tempfile::Builder::new()
            .prefix("fencecheck-etcd-")
            .tempdir()?;
        let ports = free_ports(size * 2)?;
        let mut members = Vec::with_capacity(size);
        let scheme = if secure.is_some() { "https" } else { "http" };
        for i in 0..size {
            let name = format!("m{i}");
            // In a namespace of its own a member has its address to itself.
            let (host, client, peer) = match &net {
                Some(net) => (net.addr(i).to_string(), 2379, 2380),
                None => ("127.0.0.1".to_owned(), ports[2 * i], ports[2 * i + 1]),
            };
            members.push(Member {
                node: i,
                initial_cluster: String::new(),
                state: "new",
                client_url: format!("{scheme}://{host}:{client}"),
                peer_url: format!("http://{host}:{peer}"),
                data_dir: dir.path().join(&name),
                log: dir.path().join(format!("{name}.log")),
                name,
                child: None,
                stopped: false,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}={}", m.name, m.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "fencecheck-{}-{}",
            std::process::id(),
            dir.path()
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        );
        let (http, extra_args) = match secure {
            Some(secure) => (secure.agent, secure.args),
            None => (
                ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_connect(Some(Duration::from_millis(500)))
                    .timeout_global(Some(Duration::from_secs(2)))
                    .build()
                    .into(),
                Vec::new(),
            ),
        };
        for m in &mut members {
            m.initial_cluster = initial_cluster.clone();
        }
        let mut cluster = Self {
            members,
            net,
            initial_cluster,
            token,
            http,
            extra_args,
            dir,
        };
        for i in 0..size {
            cluster.spawn(binary, i)?;
        }
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    fn spawn(&mut self, binary: &Path, i: usize) -> Result<()> {
        let m = &self.members[i];
        let log = File::options()
            .create(true)
            .append(true)
            .open(&m.log)
            .with_context(|| format!("opening {}", m.log.display()))?;
        let mut command = match &self.net {
            Some(net) => net.command(m.node, binary),
            None => Command::new(binary),
        };
        // The environment must not reconfigure the members (ETCD_* variables).
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD") {
                command.env_remove(key);
            }
        }
        command
            .arg("--name")
            .arg(&m.name)
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &m.client_url])
            .args(["--advertise-client-urls", &m.client_url])
            .args(["--listen-peer-urls", &m.peer_url])
            .args(["--initial-advertise-peer-urls", &m.peer_url])
            .args(["--initial-cluster", &m.initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", m.state])
            // Faster elections than the defaults (100/1000 ms): faults recover
            // within a second on loopback.
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = command
            .spawn()
            .with_context(|| format!("spawning {} for member {}", binary.display(), m.name))?;
        self.members[i].child = Some(child);
        self.members[i].stopped = false;
        Ok(())
    }

    /// The members' client URLs, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> String {
        self.members[i].client_url.clone()
    }

    /// How many members the cluster was started with.
    pub fn size(&self) -> usize {
        self.members.len()
    }

    /// True if member `i` runs and is not stopped.
    pub fn is_serving(&self, i: usize) -> bool {
        self.members[i].child.is_some() && !self.members[i].stopped
    }

    /// Member `i`'s status (`/v3/maintenance/status`), asked from inside its
    /// namespace if it has one.
    pub fn status(&self, i: usize) -> Result<Status> {
        match &self.net {
            Some(net) => net.run_in(self.members[i].node, || self.status_here(i)),
            None => self.status_here(i),
        }
    }

    /// The net node member `i` runs on (its index, without a net).
    pub fn node(&self, i: usize) -> usize {
        self.members[i].node
    }

    /// POST `body` to `path` on member `via` (from inside its namespace).
    fn post(&self, via: usize, path: &str, body: serde_json::Value) -> Result<serde_json::Value> {
        let url = format!("{}{path}", self.members[via].client_url);
        // Membership changes may take a few seconds while the cluster
        // reconfigures: a longer limit than the status agent's.
        let http: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_millis(500)))
            .timeout_global(Some(Duration::from_secs(10)))
            .build()
            .into();
        let call = || -> Result<serde_json::Value> {
            let mut response = http
                .post(&url)
                .header("content-type", "application/json")
                .send(body.to_string())
                .with_context(|| format!("POST {url}"))?;
            let status = response.status().as_u16();
            let value: serde_json::Value =
                serde_json::from_slice(&response.body_mut().read_to_vec()?)?;
            ensure!(status == 200, "{url}: HTTP {status}: {value}");
            Ok(value)
        };
        match &self.net {
            Some(net) => net.run_in(self.members[via].node, call),
            None => call(),
        }
    }

    /// [`Cluster::post`] a membership change, repeated (bounded) while etcd
    /// refuses it as an "unhealthy cluster" (it accepts one only once a
    /// quorum of the remaining members has been connected for 5 seconds) or
    /// gives no answer in time (a change proposed while a member is cut
    /// off can wait on the quorum; its retry may find it already applied,
    /// which the caller recognises).
    fn post_when_healthy(
        &self,
        via: usize,
        path: &str,
        body: serde_json::Value,
    ) -> Result<serde_json::Value> {
        let deadline = Instant::now() + HEALTHY_WITHIN;
        loop {
            match self.post(via, path, body.clone()) {
                Err(e)
                    if ["unhealthy cluster", "timeout"]
                        .iter()
                        .any(|m| format!("{e:#}").contains(m)) =>
                {
                    if Instant::now() >= deadline {
                        return Err(e.context(format!("still refused after {HEALTHY_WITHIN:?}")));
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                other => return other,
            }
        }
    }

    /// Membership change under load: remove member `i` from the cluster
    /// (`member/remove` through the leader), kill it, and add a new member
    /// with an empty data directory on net node `node` in its place
    /// (`member/add`, then started with `--initial-cluster-state existing`).
    /// Waits until the cluster agrees on a leader again.
    pub fn replace_member(&mut self, i: usize, node: usize) -> Result<()> {
        let net = self
            .net
            .clone()
            .ok_or_else(|| anyhow!("replacing a member needs a net"))?;
        ensure!(
            (0..self.size()).all(|m| self.members[m].node != node),
            "node {node} already runs a member"
        );
        let leader = self.wait_healthy()?;
        let via = if leader == i {
            (i + 1) % self.size()
        } else {
            leader
        };
        let id = self.status(i)?.member_id;
        match self.post_when_healthy(
            via,
            "/v3/cluster/member/remove",
            serde_json::json!({"ID": id.to_string()}),
        ) {
            // A retry after an attempt that timed out yet applied.
            Err(e) if format!("{e:#}").contains("member not found") => {}
            other => {
                other?;
            }
        }
        if let Some(mut child) = self.members[i].child.take() {
            child.kill()?;
            child.wait()?;
        }
        let leader = self.wait_healthy()?;
        let via = leader;
        let peer_url = format!("http://{}:2380", net.addr(node));
        match self.post_when_healthy(
            via,
            "/v3/cluster/member/add",
            serde_json::json!({"peerURLs": [peer_url]}),
        ) {
            // A retry after an attempt that timed out yet applied.
            Err(e) if format!("{e:#}").contains("Peer URLs already exists") => {}
            other => {
                other?;
            }
        }
        // A name (and data directory) never used before in this cluster.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let generation = NEXT.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("m{i}n{node}g{generation}");
        let mut initial: Vec<String> = (0..self.size())
            .filter(|&m| m != i)
            .map(|m| format!("{}={}", self.members[m].name, self.members[m].peer_url))
            .collect();
        initial.push(format!("{name}={peer_url}"));
        let dir = self.dir.path();
        self.members[i] = Member {
            node,
            initial_cluster: initial.join(","),
            state: "existing",
            client_url: format!("http://{}:2379", net.addr(node)),
            peer_url,
            data_dir: dir.join(&name),
            log: dir.join(format!("{name}.log")),
            name,
            child: None,
            stopped: false,
        };
        self.spawn(&etcd_binary()?, i)?;
        self.wait_healthy()?;
        Ok(())
    }

    /// The network the members are in, if any.
    pub fn net(&self) -> Option<&Arc<Net>> {
        self.net.as_ref()
    }

    fn status_here(&self, i: usize) -> Result<Status> {
        let url = format!("{}/v3/maintenance/status", self.members[i].client_url);
        let mut response = self
            .http
            .post(&url)
            .header("content-type", "application/json")
            .send("{}")
            .with_context(|| format!("POST {url}"))?;
        let status = response.status().as_u16();
        let body: serde_json::Value = serde_json::from_slice(&response.body_mut().read_to_vec()?)
            .with_context(|| format!("status body of {url}"))?;
        ensure!(status == 200, "{url}: HTTP {status}: {body}");
        let number = |pointer: &str| -> Result<u64> {
            match body.pointer(pointer) {
                None => Ok(0), // proto3 JSON omits zero values
                Some(v) => v
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| anyhow!("{url}: {pointer} is not a u64 string: {body}")),
            }
        };
        Ok(Status {
            cluster_id: number("/header/cluster_id")?,
            member_id: number("/header/member_id")?,
            leader: number("/leader")?,
        })
    }

    /// Wait (bounded) until every serving member reports the same leader,
    /// which is itself serving; returns its index.
    pub fn wait_healthy(&mut self) -> Result<usize> {
        let deadline = Instant::now() + HEALTHY_WITHIN;
        loop {
            self.check_alive()?;
            let last = match self.agreed_leader() {
                Ok(leader) => return Ok(leader),
                Err(e) => format!("{e:#}"),
            };
            if Instant::now() >= deadline {
                bail!(
                    "the cluster did not agree on a serving leader within {HEALTHY_WITHIN:?}: {last}\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The leader's index, if every serving member names the same serving member.
    fn agreed_leader(&self) -> Result<usize> {
        let serving: Vec<usize> = (0..self.size()).filter(|&i| self.is_serving(i)).collect();
        let mut statuses = Vec::with_capacity(serving.len());
        for &i in &serving {
            statuses.push((i, self.status(i)?));
        }
        let Some((_, first)) = statuses.first() else {
            bail!("no member is serving");
        };
        ensure!(first.leader != 0, "member has no leader yet");
        ensure!(
            statuses
                .iter()
                .all(|(_, s)| s.leader == first.leader && s.cluster_id == first.cluster_id),
            "members disagree: {statuses:?}"
        );
        statuses
            .iter()
            .find(|(_, s)| s.member_id == first.leader)
            .map(|(i, _)| *i)
            .ok_or_else(|| anyhow!("the leader {} is not a serving member", first.leader))
    }

    /// Fail with the members' logs if a member we did not kill has exited.
    fn check_alive(&mut self) -> Result<()> {
        let mut exited = Vec::new();
        for m in &mut self.members {
            if let Some(child) = m.child.as_mut()
                && let Some(code) = child.try_wait()?
            {
                exited.push(format!("{} exited ({code})", m.name));
                m.child = None;
            }
        }
        if !exited.is_empty() {
            bail!("{}\n{}", exited.join(", "), self.logs());
        }
        Ok(())
    }

    /// Send SIGKILL to member `i` and reap it.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        let mut child = self.members[i]
            .child
            .take()
            .ok_or_else(|| anyhow!("member {i} is not running"))?;
        child.kill()?; // SIGKILL
        child.wait()?;
        self.members[i].stopped = false;
        Ok(())
    }

    /// Start member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        ensure!(self.members[i].child.is_none(), "member {i} is running");
        self.spawn(&etcd_binary()?, i)
    }

    /// Send SIGSTOP to member `i`: it keeps its sockets but answers nothing.
    pub fn stop(&mut self, i: usize) -> Result<()> {
        self.signal(i, rustix::process::Signal::STOP)?;
        self.members[i].stopped = true;
        Ok(())
    }

    /// Send SIGCONT to a stopped member `i`.
    pub fn resume(&mut self, i: usize) -> Result<()> {
        self.signal(i, rustix::process::Signal::CONT)?;
        self.members[i].stopped = false;
        Ok(())
    }

    fn signal(&self, i: usize, signal: rustix::process::Signal) -> Result<()> {
        let child = self.members[i]
            .child
            .as_ref()
            .ok_or_else(|| anyhow!("member {i} is not running"))?;
        rustix::process::kill_process(rustix::process::Pid::from_child(child), signal)
            .with_context(|| format!("sending {signal:?} to member {i}"))
    }

    /// The last lines of every member's log (for failure messages).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for m in &self.members {
            let text = std::fs::read_to_string(&m.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            out.push_str(&format!(
                "--- {} ({})\n{}\n",
                m.name,
                m.log.display(),
                tail.join("\n")
            ));
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                // SIGKILL ends stopped processes too.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `n` distinct ports that were free a moment ago (all bound at once, then
/// released for etcd to bind).
fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}
