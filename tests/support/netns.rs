//! Private networks for fault-injection tests: every node (an etcd member,
//! a client process) in a network namespace of its own, all joined by one
//! bridge in a hub namespace, on a private /24 that exists only inside these
//! namespaces. Faults are routes: a partition between two nodes is a
//! `blackhole` route to the other's address on each side (packets vanish, as
//! on a real cut link: no error comes back, connections time out), so any
//! grouping can be cut and healed without touching the processes.
//!
//! Needs root (CI runs as root) and `ip` (iproute2). [`Net::new`] checks
//! that namespaces work first and fails loudly if the machine forbids them;
//! nothing is ever skipped. Dropping the [`Net`] deletes every namespace it
//! made (with them the veth pairs and the bridge); the processes started in
//! them must be gone first (their owners kill them on drop).
//!
//! No address outside these namespaces is ever used: the test process
//! itself stays in its own namespace and reaches a node only from a thread
//! that joined the node's namespace ([`Net::run_in`]).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, anyhow, bail, ensure};

/// One private network of `size` nodes.
#[derive(Debug)]
pub struct Net {
    hub: String,
    nodes: Vec<String>,
    subnet: [u8; 3],
    /// The node pairs currently cut, `(low, high)`.
    cut: Mutex<BTreeSet<(usize, usize)>>,
}

fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running ip (iproute2)")?;
    ensure!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

impl Net {
    /// Make the hub and `size` node namespaces, each node with one veth on
    /// the hub's bridge and the address `10.X.Y.(node + 1)/24`.
    pub fn new(size: usize) -> Result<Self> {
        ensure!((1..=200).contains(&size), "1 to 200 nodes");
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        let tag = format!("fc{}x{n}", pid % 1_000_000);
        // 10.200-249.*.*: one /24 per (process, net), unlikely to meet a
        // real route, and only ever configured inside these namespaces.
        let subnet = [10, 200 + (n % 50) as u8, (pid % 250) as u8];
        let net = Self {
            hub: format!("{tag}-hub"),
            nodes: (0..size).map(|i| format!("{tag}-n{i}")).collect(),
            subnet,
            cut: Mutex::new(BTreeSet::new()),
        };
        net.build().with_context(|| {
            "setting up network namespaces (the fault-injection tests need root and iproute2; \
             they never skip)"
        })?;
        Ok(net)
    }

    fn build(&self) -> Result<()> {
        ip(&["netns", "add", &self.hub])?;
        ip(&["-n", &self.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &self.hub, "link", "set", "br0", "up"])?;
        for (i, ns) in self.nodes.iter().enumerate() {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
            let port = format!("v{i}");
            ip(&[
                "-n", &self.hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", ns,
            ])?;
            ip(&["-n", &self.hub, "link", "set", &port, "master", "br0", "up"])?;
            let addr = format!("{}/24", self.addr(i));
            ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
            ip(&["-n", ns, "link", "set", "eth0", "up"])?;
        }
        Ok(())
    }

    /// How many nodes.
    pub fn size(&self) -> usize {
        self.nodes.len()
    }

    /// Node `i`'s address.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        let [a, b, c] = self.subnet;
        Ipv4Addr::new(a, b, c, (i + 1) as u8)
    }

    /// Node `i`'s namespace name.
    pub fn ns(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// A command that runs `program` inside node `i`'s namespace (`ip netns
    /// exec` execs it: the child's pid is the program's).
    pub fn command(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.nodes[i]]).arg(program);
        command
    }

    /// Run `f` on a thread inside node `i`'s namespace (sockets it opens
    /// belong to that namespace).
    pub fn run_in<T: Send>(&self, i: usize, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        let path = format!("/var/run/netns/{}", self.nodes[i]);
        let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        std::thread::scope(|s| {
            s.spawn(|| {
                rustix::thread::move_into_link_name_space(
                    file.as_fd(),
                    Some(rustix::thread::LinkNameSpaceType::Network),
                )
                .with_context(|| format!("joining {path}"))?;
                f()
            })
            .join()
            .map_err(|_| anyhow!("a thread in {path} panicked"))?
        })
    }

    fn route(&self, from: usize, to: usize, verb: &str) -> Result<()> {
        let target = format!("{}/32", self.addr(to));
        ip(&["-n", &self.nodes[from], "route", verb, "blackhole", &target])
    }

    /// Cut every link between a node of one group and a node of another;
    /// links already cut stay cut.
    pub fn partition(&self, groups: &[&[usize]]) -> Result<()> {
        let mut cut = self.cut.lock().map_err(|_| anyhow!("poisoned"))?;
        for (g, group) in groups.iter().enumerate() {
            for other in &groups[g + 1..] {
                for &a in *group {
                    for &b in *other {
                        ensure!(a != b, "node {a} is in two groups");
                        let pair = (a.min(b), a.max(b));
                        if cut.insert(pair) {
                            self.route(a, b, "add")?;
                            self.route(b, a, "add")?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Cut `node` off from every other node.
    pub fn isolate(&self, node: usize) -> Result<()> {
        let rest: Vec<usize> = (0..self.size()).filter(|&i| i != node).collect();
        self.partition(&[&[node], &rest])
    }

    /// Restore every cut link.
    pub fn heal(&self) -> Result<()> {
        let mut cut = self.cut.lock().map_err(|_| anyhow!("poisoned"))?;
        while let Some((a, b)) = cut.pop_first() {
            self.route(a, b, "del")?;
            self.route(b, a, "del")?;
        }
        Ok(())
    }

    /// The links cut now, as `(low, high)` node pairs.
    pub fn cut_links(&self) -> Result<Vec<(usize, usize)>> {
        let cut = self.cut.lock().map_err(|_| anyhow!("poisoned"))?;
        Ok(cut.iter().copied().collect())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting a namespace removes its end of every veth pair, and with
        // it the other end; the bridge goes with the hub.
        for ns in self.nodes.iter().chain(std::iter::once(&self.hub)) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Fail unless this machine lets the tests make namespaces (root, iproute2).
pub fn require() -> Result<()> {
    let net = Net::new(2)?;
    let reached = net.run_in(0, || {
        let listener = std::net::TcpListener::bind((net.addr(0), 0))?;
        Ok(listener.local_addr()?)
    })?;
    if reached.ip() != net.addr(0) {
        bail!("bound {reached}, expected {}", net.addr(0));
    }
    Ok(())
}
