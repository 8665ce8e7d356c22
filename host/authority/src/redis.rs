//! A lease coordinator on Redis or Valkey running the fencecheck module
//! (host/redis): every decision is one module command (`FENCE.ACQUIRE`,
//! `FENCE.RENEW`, `FENCE.RELEASE`, `FENCE.RESTORE`), which runs the
//! component's lease rules on the server's main thread, so the token is
//! minted atomically with the acquire and is the one `FENCE.SET` checks.
//! The server's clock is the lease clock. Spoken over plain RESP2 on TCP.
//!
//! In a Redis Cluster or Valkey cluster ([`RedisCoordinator::connect_cluster`])
//! each lock's command goes to the master serving the lock's slot (the
//! module keeps a lock's state in the lock's own slot), following MOVED, ASK
//! and TRYAGAIN a bounded number of times.

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use fencecheck::{Corruption, LeaseError, LeaseInvalidReason, Token, TokenText};

use crate::{AcquireOutcome, AuthorityError, Coordinator, Grant, ReleaseOutcome, RenewOutcome};

/// A RESP2 reply.
#[derive(Debug)]
enum Reply {
    Status(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

impl Reply {
    fn text(&self) -> Option<String> {
        match self {
            Reply::Status(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => String::from_utf8(b.clone()).ok(),
            _ => None,
        }
    }
}

struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

fn redis_err(what: impl std::fmt::Display) -> AuthorityError {
    AuthorityError::Redis(what.to_string())
}

impl Conn {
    fn open(address: &str, auth: Option<(&str, &str)>) -> Result<Conn, AuthorityError> {
        let stream =
            TcpStream::connect(address).map_err(|e| redis_err(format!("{address}: {e}")))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(10))))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(redis_err)?;
        let reader = BufReader::new(stream.try_clone().map_err(redis_err)?);
        let mut conn = Conn {
            reader,
            writer: stream,
        };
        if let Some((user, password)) = auth
            && let Reply::Error(e) = conn.call(&["AUTH", user, password])?
        {
            return Err(AuthorityError::AuthenticationFailed(e));
        }
        Ok(conn)
    }

    fn call(&mut self, args: &[&str]) -> Result<Reply, AuthorityError> {
        let mut buf = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a.as_bytes());
            buf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&buf).map_err(redis_err)?;
        self.read(0)
    }

    fn read(&mut self, depth: u32) -> Result<Reply, AuthorityError> {
        if depth > 8 {
            return Err(redis_err("reply nested too deeply"));
        }
        let mut line = Vec::new();
        self.reader
            .read_until(b'\n', &mut line)
            .map_err(redis_err)?;
        if !line.ends_with(b"\r\n") {
            return Err(redis_err("connection closed"));
        }
        line.truncate(line.len() - 2);
        let (kind, rest) = line.split_first().ok_or_else(|| redis_err("empty reply"))?;
        let rest = String::from_utf8_lossy(rest).into_owned();
        let number = |s: &str| s.parse::<i64>().map_err(|_| redis_err("bad length"));
        Ok(match kind {
            b'+' => Reply::Status(rest),
            b'-' => Reply::Error(rest),
            b':' => Reply::Int(number(&rest)?),
            b'$' => match usize::try_from(number(&rest)?) {
                Err(_) => Reply::Bulk(None),
                Ok(n) if n > 1 << 20 => return Err(redis_err("reply too large")),
                Ok(n) => {
                    let mut data = vec![0; n + 2];
                    self.reader.read_exact(&mut data).map_err(redis_err)?;
                    data.truncate(n);
                    Reply::Bulk(Some(data))
                }
            },
            b'*' => match usize::try_from(number(&rest)?) {
                Err(_) => Reply::Bulk(None),
                // CLUSTER SLOTS has one entry per slot range.
                Ok(n) if n > 16_384 => return Err(redis_err("reply too large")),
                Ok(n) => {
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.read(depth + 1)?);
                    }
                    Reply::Array(items)
                }
            },
            _ => return Err(redis_err("not RESP2")),
        })
    }
}

/// Where and as whom to connect: `redis://[[user]:password@]host:port`.
struct Target {
    address: String,
    user: String,
    password: Option<String>,
}

fn parse_url(url: &str) -> Result<Target, AuthorityError> {
    let rest = url
        .strip_prefix("redis://")
        .ok_or_else(|| redis_err(format!("{url:?} is not redis://HOST:PORT")))?;
    let rest = rest.trim_end_matches('/');
    let (auth, address) = match rest.rsplit_once('@') {
        Some((auth, address)) => (Some(auth), address),
        None => (None, rest),
    };
    if address.is_empty() || address.contains('/') {
        return Err(redis_err(format!(
            "{url:?} is not redis://HOST:PORT (no database number)"
        )));
    }
    let address = if address.contains(':') {
        address.to_string()
    } else {
        format!("{address}:6379")
    };
    let (user, password) = match auth.map(|a| a.split_once(':').unwrap_or(("", a))) {
        None => ("default".to_string(), None),
        Some(("", p)) => ("default".to_string(), Some(p.to_string())),
        Some((u, p)) => (u.to_string(), Some(p.to_string())),
    };
    Ok(Target {
        address,
        user,
        password,
    })
}

/// A coordinator whose store is a Redis or Valkey server loading the
/// fencecheck module, or a cluster of them. One connection per node, used
/// by one call at a time; a broken connection is reopened at the next call
/// (the call that broke is an error: its outcome is unknown).
pub struct RedisCoordinator {
    target: Target,
    authority: u64,
    conn: Mutex<Option<Conn>>,
    cluster: Option<Mutex<Routes>>,
    /// Cluster only: the authority each lock was granted under, by this
    /// coordinator. Every master mints its own lineage and a lock keeps
    /// the one of its first grant, so a lock whose authority changes lost
    /// its state (a shard wiped or failed over without FENCE.RESTORE).
    pinned: Mutex<HashMap<String, u64>>,
}

/// Redirections (MOVED, ASK, an unreachable node) one command may follow.
const REDIRECTS: u32 = 16;
/// TRYAGAIN and CLUSTERDOWN answers one command may retry, each after
/// [`RETRY_PAUSE`]: a slot whose keys are being moved, an election.
const RETRIES: u32 = 200;
const RETRY_PAUSE: Duration = Duration::from_millis(10);

/// The cluster slot of a key name: CRC16/XMODEM of its hash tag (or of the
/// whole name), mod 16384. The module derives a lock's state key in the
/// lock's own slot (host/redis/src/keys.rs), so a lock routes by its name.
fn slot(name: &[u8]) -> u16 {
    let tag = name.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &name[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        Some(&rest[..close]).filter(|t| !t.is_empty())
    });
    let mut crc: u16 = 0;
    for &b in tag.unwrap_or(name) {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16_384
}

/// A cluster's slot map and one connection per node.
struct Routes {
    seeds: Vec<String>,
    auth: Option<(String, String)>,
    /// First slot of a range -> (last slot, master address).
    slots: BTreeMap<u16, (u16, String)>,
    conns: HashMap<String, Conn>,
}

impl Routes {
    fn conn(&mut self, address: &str) -> Result<&mut Conn, AuthorityError> {
        if !self.conns.contains_key(address) {
            let auth = self.auth.as_ref().map(|(u, p)| (u.as_str(), p.as_str()));
            let conn = Conn::open(address, auth)?;
            self.conns.insert(address.to_string(), conn);
        }
        self.conns
            .get_mut(address)
            .ok_or_else(|| redis_err("connection vanished"))
    }

    /// One command on one node; a connection that broke is dropped.
    fn call_on(&mut self, address: &str, args: &[&str]) -> Result<Reply, AuthorityError> {
        let result = self.conn(address)?.call(args);
        if result.is_err() {
            self.conns.remove(address);
        }
        result
    }

    /// Reload the slot map from the first seed or known node that answers
    /// CLUSTER SLOTS.
    fn refresh(&mut self) -> Result<(), AuthorityError> {
        let mut known: Vec<String> = self.seeds.clone();
        for (_, address) in self.slots.values() {
            if !known.contains(address) {
                known.push(address.clone());
            }
        }
        let mut last = String::from("no seed");
        for address in known {
            match self.call_on(&address, &["CLUSTER", "SLOTS"]) {
                Ok(Reply::Array(ranges)) => match parse_slots(&ranges, &address) {
                    Ok(slots) if !slots.is_empty() => {
                        self.slots = slots;
                        return Ok(());
                    }
                    Ok(_) => last = format!("{address}: no slot is served"),
                    Err(e) => last = format!("{address}: {e}"),
                },
                Ok(Reply::Error(e)) => last = format!("{address}: {e}"),
                Ok(other) => last = format!("{address}: CLUSTER SLOTS answered {other:?}"),
                Err(e) => last = format!("{address}: {e}"),
            }
        }
        Err(redis_err(format!(
            "no cluster node answered CLUSTER SLOTS (last: {last})"
        )))
    }

    fn master_of(&self, slot: u16) -> Option<String> {
        self.slots
            .range(..=slot)
            .next_back()
            .filter(|(_, (last, _))| slot <= *last)
            .map(|(_, (_, address))| address.clone())
    }

    /// Every master's address, once each.
    fn masters(&self) -> Vec<String> {
        let mut masters: Vec<String> = self.slots.values().map(|(_, a)| a.clone()).collect();
        masters.sort();
        masters.dedup();
        masters
    }

    /// `args` on the master of `slot`, following MOVED (the map reloaded)
    /// and ASK (ASKING first), retrying TRYAGAIN and CLUSTERDOWN, all
    /// bounded; each of these answers means the command was not run. Any
    /// other answer, refusals included, is returned.
    fn call(&mut self, slot: u16, args: &[&str]) -> Result<Reply, AuthorityError> {
        let what = args.first().copied().unwrap_or_default();
        let (mut redirects, mut retries) = (0, 0);
        let mut next: Option<(String, bool)> = None;
        loop {
            let (address, asking) = match next.take() {
                Some(n) => n,
                None => match self.master_of(slot) {
                    Some(a) => (a, false),
                    None => {
                        return Err(redis_err(format!(
                            "{what}: no master serves slot {slot} (cluster down?)"
                        )));
                    }
                },
            };
            if let Err(e) = self.conn(&address) {
                // Nothing was sent: the node may have failed over.
                redirects += 1;
                if redirects > REDIRECTS {
                    return Err(e);
                }
                std::thread::sleep(RETRY_PAUSE);
                self.refresh()?;
                continue;
            }
            if asking {
                match self.call_on(&address, &["ASKING"])? {
                    Reply::Status(_) => {}
                    other => return Err(redis_err(format!("ASKING answered {other:?}"))),
                }
            }
            let reply = self.call_on(&address, args)?;
            let Reply::Error(line) = &reply else {
                return Ok(reply);
            };
            let mut words = line.split(' ');
            match words.next().unwrap_or_default() {
                code @ ("MOVED" | "ASK") => {
                    redirects += 1;
                    if redirects > REDIRECTS {
                        return Err(redis_err(format!(
                            "{what} on slot {slot}: still redirected after {REDIRECTS} \
                             redirections (last: {line})"
                        )));
                    }
                    let to = words
                        .nth(1)
                        .map(|to| endpoint(to, &address))
                        .ok_or_else(|| redis_err(format!("bad redirection {line:?}")))?;
                    if code == "MOVED" {
                        self.refresh()?;
                    }
                    next = Some((to, code == "ASK"));
                }
                "TRYAGAIN" | "CLUSTERDOWN" => {
                    retries += 1;
                    if retries > RETRIES {
                        return Err(redis_err(format!(
                            "{what} on slot {slot}: no answer after {RETRIES} retries \
                             (last: {line})"
                        )));
                    }
                    std::thread::sleep(RETRY_PAUSE);
                    if line.starts_with("CLUSTERDOWN") {
                        self.refresh()?;
                    }
                }
                _ => return Ok(reply),
            }
        }
    }
}

/// `host:port` of a redirection or a CLUSTER SLOTS entry; an empty host
/// (a node that does not know its address) is the host we asked.
fn endpoint(to: &str, asked: &str) -> String {
    match to.strip_prefix(':') {
        Some(port) => {
            let host = asked.rsplit_once(':').map_or(asked, |(h, _)| h);
            format!("{host}:{port}")
        }
        None => to.to_string(),
    }
}

/// CLUSTER SLOTS: `[first, last, [ip, port, id, …], replicas…]` per range.
fn parse_slots(
    ranges: &[Reply],
    asked: &str,
) -> Result<BTreeMap<u16, (u16, String)>, AuthorityError> {
    let mut slots = BTreeMap::new();
    for range in ranges {
        let Reply::Array(items) = range else {
            return Err(redis_err("a CLUSTER SLOTS entry is not an array"));
        };
        let (first, last, master) = match items.as_slice() {
            [Reply::Int(a), Reply::Int(b), Reply::Array(master), ..] => (a, b, master),
            _ => return Err(redis_err("a CLUSTER SLOTS entry has no master")),
        };
        let ip = master.first().and_then(Reply::text).unwrap_or_default();
        let port = match master.get(1) {
            Some(Reply::Int(p)) => u16::try_from(*p).map_err(redis_err)?,
            _ => return Err(redis_err("a CLUSTER SLOTS master has no port")),
        };
        let address = if ip.contains(':') {
            format!("[{ip}]:{port}")
        } else {
            endpoint(&format!("{ip}:{port}"), asked)
        };
        let first = u16::try_from(*first).map_err(redis_err)?;
        let last = u16::try_from(*last).map_err(redis_err)?;
        if first > last || last >= 16_384 {
            return Err(redis_err("a CLUSTER SLOTS range is out of bounds"));
        }
        slots.insert(first, (last, address));
    }
    Ok(slots)
}

const LINEAGE_KEY: &str = "fencecheck:lineage";
/// In a cluster the module keeps a lineage per slot, `fencecheck:lineage:{T}`
/// (T: the smallest number hashing to the slot). "0" is the smallest of
/// all, so this is the lineage of slot("0")'s locks, read and made as the
/// module does; there is no node-wide lineage to report.
const CLUSTER_LINEAGE_KEY: &str = "fencecheck:lineage:{0}";

impl RedisCoordinator {
    /// Connect to `redis://[[user]:password@]host:port`, check that the
    /// server loads the module, and read its lineage (made now if the
    /// server never granted).
    pub fn connect(url: &str) -> Result<RedisCoordinator, AuthorityError> {
        let target = parse_url(url)?;
        let mut conn = Self::open(&target)?;
        check_module(conn.call(&["COMMAND", "INFO", "fence.acquire"])?)?;
        let fresh = crate::sqlite::fresh_authority().to_string();
        if let Reply::Error(e) = conn.call(&["SET", LINEAGE_KEY, &fresh, "NX"])? {
            return Err(not_cluster(&e));
        }
        let authority = lineage(LINEAGE_KEY, conn.call(&["GET", LINEAGE_KEY])?)?;
        Ok(RedisCoordinator {
            target,
            authority,
            conn: Mutex::new(Some(conn)),
            cluster: None,
            pinned: Mutex::new(HashMap::new()),
        })
    }

    /// Connect to a Redis Cluster or Valkey cluster through `seeds` (any
    /// of its nodes, masters or replicas, as `redis://…` URLs sharing one
    /// user and password): read the slot map from the first seed that
    /// answers, check that every master loads the module, and read (or
    /// make) the lineage of one slot, `fencecheck:lineage:{0}`
    /// ([`authority`]).
    ///
    /// The module keeps a lineage per slot (docs/redis.md), so a grant
    /// carries the lineage of its lock's slot, and a lock keeps it when
    /// its slot moves; [`authority`] is the lineage of slot("0")'s locks.
    /// [`restore`] raises every master's epoch floor.
    ///
    /// [`authority`]: Coordinator::authority
    /// [`restore`]: Coordinator::restore
    pub fn connect_cluster<S: AsRef<str>>(seeds: &[S]) -> Result<RedisCoordinator, AuthorityError> {
        let targets = seeds
            .iter()
            .map(|s| parse_url(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let target = targets
            .first()
            .ok_or_else(|| redis_err("no seed node given"))?;
        if targets
            .iter()
            .any(|t| (&t.user, &t.password) != (&target.user, &target.password))
        {
            return Err(redis_err(
                "the seed URLs name different users or passwords; a cluster's nodes share one",
            ));
        }
        let mut routes = Routes {
            seeds: targets.iter().map(|t| t.address.clone()).collect(),
            auth: target.password.clone().map(|p| (target.user.clone(), p)),
            slots: BTreeMap::new(),
            conns: HashMap::new(),
        };
        routes.refresh()?;
        for master in routes.masters() {
            check_module(routes.call_on(&master, &["COMMAND", "INFO", "fence.acquire"])?)
                .map_err(|e| redis_err(format!("master {master}: {e}")))?;
        }
        let at = slot(CLUSTER_LINEAGE_KEY.as_bytes());
        let fresh = crate::sqlite::fresh_authority().to_string();
        if let Reply::Error(e) = routes.call(at, &["SET", CLUSTER_LINEAGE_KEY, &fresh, "NX"])? {
            return Err(redis_err(e));
        }
        let authority = lineage(
            CLUSTER_LINEAGE_KEY,
            routes.call(at, &["GET", CLUSTER_LINEAGE_KEY])?,
        )?;
        Ok(RedisCoordinator {
            target: Target {
                address: target.address.clone(),
                user: target.user.clone(),
                password: target.password.clone(),
            },
            authority,
            conn: Mutex::new(None),
            cluster: Some(Mutex::new(routes)),
            pinned: Mutex::new(HashMap::new()),
        })
    }

    fn open(target: &Target) -> Result<Conn, AuthorityError> {
        let auth = target
            .password
            .as_deref()
            .map(|p| (target.user.as_str(), p));
        Conn::open(&target.address, auth)
    }

    /// One command about `lock` (routed by its slot in a cluster); the
    /// connection is dropped when it broke mid-call.
    fn call(&self, lock: &str, args: &[&str]) -> Result<Reply, AuthorityError> {
        if let Some(routes) = &self.cluster {
            let mut routes = routes.lock().unwrap_or_else(PoisonError::into_inner);
            return routes.call(slot(lock.as_bytes()), args);
        }
        let mut slot = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        let conn = match slot.as_mut() {
            Some(conn) => conn,
            None => slot.insert(Self::open(&self.target)?),
        };
        match conn.call(args) {
            Ok(reply) => Ok(reply),
            Err(e) => {
                *slot = None;
                Err(e)
            }
        }
    }

    fn token(&self, lock: &str, text: &str) -> Result<Token, AuthorityError> {
        // A signed grant's text carries its signature after the token; the
        // coordinator reports the token (SigningCoordinator signs on its own).
        let plain = text.split('~').next().unwrap_or_default();
        let token = plain
            .parse::<TokenText>()
            .map_err(|e| redis_err(format!("the module answered a bad token: {e}")))?
            .0;
        if self.cluster.is_some() {
            let mut pinned = self.pinned.lock().unwrap_or_else(PoisonError::into_inner);
            let first = *pinned.entry(lock.to_string()).or_insert(token.authority);
            if first != token.authority {
                return Err(redis_err(format!(
                    "lock {lock:?} changed lineage: granted under {}, earlier under {first} \
                     (its shard lost the lock's state; run FENCE.RESTORE on its master)",
                    token.authority
                )));
            }
            return Ok(token);
        }
        if token.authority != self.authority {
            return Err(redis_err(format!(
                "the server's lineage changed: granted under {}, connected under {}",
                token.authority, self.authority
            )));
        }
        Ok(token)
    }
}

fn check_module(reply: Reply) -> Result<(), AuthorityError> {
    match reply {
        Reply::Array(items) if matches!(items.first(), Some(Reply::Array(_))) => Ok(()),
        _ => Err(redis_err(
            "the server does not load the fencecheck module (FENCE.ACQUIRE is unknown)",
        )),
    }
}

fn lineage(key: &str, reply: Reply) -> Result<u64, AuthorityError> {
    match reply {
        Reply::Bulk(Some(b)) => std::str::from_utf8(&b)
            .ok()
            .filter(|s| !s.starts_with('0') || *s == "0")
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| redis_err(format!("{key} is not a canonical u64"))),
        other => Err(redis_err(format!("reading {key}: {other:?}"))),
    }
}

/// A single server's error line; a cluster node's redirection says how to
/// reach a cluster instead.
fn not_cluster(line: &str) -> AuthorityError {
    if line.starts_with("MOVED ") || line.starts_with("CLUSTERDOWN") || line.starts_with("ASK ") {
        redis_err(format!(
            "{line}: the server is a cluster node; connect to the cluster \
             (two or more seed URLs: --redis URL --redis URL)"
        ))
    } else {
        redis_err(line)
    }
}

fn int(r: &Reply) -> Result<u64, AuthorityError> {
    match r {
        Reply::Int(i) => u64::try_from(*i).map_err(redis_err),
        Reply::Bulk(Some(b)) => std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| redis_err("not a number")),
        other => Err(redis_err(format!("not a number: {other:?}"))),
    }
}

/// The module's error line for a refusal of the lease rules, as the
/// component's [`LeaseError`]; any other error line is infrastructure.
fn refusal(line: &str) -> AuthorityError {
    let (code, detail) = line.split_once(' ').unwrap_or((line, ""));
    let words: Vec<&str> = detail.split(' ').collect();
    let number = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
    let reason = |name: &str| {
        use LeaseInvalidReason::*;
        [
            EmptyLock,
            LockTooLong,
            EmptyLeaseId,
            LeaseIdTooLong,
            ZeroTtl,
            ExpiryOverflow,
            MissingToken,
            NoState,
        ]
        .into_iter()
        .find(|r| r.name() == name)
    };
    let corruption = |name: &str| {
        use Corruption::*;
        [Truncated, LengthMismatch, ChecksumMismatch, Malformed]
            .into_iter()
            .find(|c| c.name() == name)
    };
    let error = match code {
        "INVALIDREQUEST" => reason(detail).map(LeaseError::InvalidRequest),
        "CORRUPTSTATE" => corruption(detail).map(LeaseError::CorruptState),
        "UNSUPPORTEDSTATEVERSION" => number(1)
            .and_then(|v| u8::try_from(v).ok())
            .map(LeaseError::UnsupportedStateVersion),
        "LOCKMISMATCH" => Some(LeaseError::LockMismatch(detail.to_string())),
        "FOREIGNAUTHORITY" => number(1)
            .zip(number(3))
            .map(|(stored, presented)| LeaseError::ForeignAuthority { stored, presented }),
        "EXHAUSTED" => Some(LeaseError::Exhausted),
        _ => None,
    };
    match error {
        Some(error) => AuthorityError::Refused { error },
        None => not_cluster(line),
    }
}

fn unexpected(reply: &Reply) -> AuthorityError {
    match reply {
        Reply::Error(line) => refusal(line),
        other => redis_err(format!("unexpected reply {other:?}")),
    }
}

impl Coordinator for RedisCoordinator {
    fn authority(&self) -> u64 {
        self.authority
    }

    fn acquire(
        &self,
        lock: &str,
        lease_id: &str,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, AuthorityError> {
        let reply = self.call(
            lock,
            &["FENCE.ACQUIRE", lock, lease_id, &ttl_ms.to_string()],
        )?;
        match &reply {
            Reply::Array(items) => match (
                items.first().and_then(Reply::text).as_deref(),
                items.as_slice(),
            ) {
                (Some("acquired"), [_, token, expires, decided]) => {
                    let text = token.text().ok_or_else(|| redis_err("no token text"))?;
                    Ok(AcquireOutcome::Acquired(Grant {
                        lock: lock.to_string(),
                        lease_id: lease_id.to_string(),
                        token: self.token(lock, &text)?,
                        expires_at: int(expires)?,
                        decided_at: int(decided)?,
                        signature: None,
                    }))
                }
                (Some("busy"), [_, holder, expires]) => Ok(AcquireOutcome::Busy {
                    holder: holder.text().unwrap_or_default(),
                    expires_at: int(expires)?,
                }),
                _ => Err(unexpected(&reply)),
            },
            _ => Err(unexpected(&reply)),
        }
    }

    fn renew(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
        ttl_ms: u64,
    ) -> Result<RenewOutcome, AuthorityError> {
        let text = TokenText(token).to_string();
        let reply = self.call(
            lock,
            &["FENCE.RENEW", lock, lease_id, &text, &ttl_ms.to_string()],
        )?;
        match &reply {
            Reply::Array(items) => match (
                items.first().and_then(Reply::text).as_deref(),
                items.as_slice(),
            ) {
                (Some("renewed"), [_, expires]) => Ok(RenewOutcome::Renewed {
                    expires_at: int(expires)?,
                }),
                (Some("lost"), [_]) => Ok(RenewOutcome::Lost),
                _ => Err(unexpected(&reply)),
            },
            _ => Err(unexpected(&reply)),
        }
    }

    fn release(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
    ) -> Result<ReleaseOutcome, AuthorityError> {
        let text = TokenText(token).to_string();
        let reply = self.call(lock, &["FENCE.RELEASE", lock, lease_id, &text])?;
        match &reply {
            Reply::Array(items) => match items.first().and_then(Reply::text).as_deref() {
                Some("released") => Ok(ReleaseOutcome::Released),
                Some("not-owner") => Ok(ReleaseOutcome::NotOwner),
                _ => Err(unexpected(&reply)),
            },
            _ => Err(unexpected(&reply)),
        }
    }

    /// In a cluster: on every master (each keeps its own floor); the
    /// highest floor. A master that fails leaves the others raised: an
    /// error, to be retried.
    fn restore(&self, at_least: u64) -> Result<u64, AuthorityError> {
        let Some(routes) = &self.cluster else {
            return restored(&self.call("", &["FENCE.RESTORE", &at_least.to_string()])?);
        };
        let mut routes = routes.lock().unwrap_or_else(PoisonError::into_inner);
        routes.refresh()?;
        let mut highest = 0;
        for master in routes.masters() {
            let reply = routes.call_on(&master, &["FENCE.RESTORE", &at_least.to_string()])?;
            highest = highest
                .max(restored(&reply).map_err(|e| redis_err(format!("master {master}: {e}")))?);
        }
        Ok(highest)
    }
}

fn restored(reply: &Reply) -> Result<u64, AuthorityError> {
    match reply {
        Reply::Array(items) => match (
            items.first().and_then(Reply::text).as_deref(),
            items.as_slice(),
        ) {
            (Some("restored"), [_, floor]) => int(floor),
            _ => Err(unexpected(reply)),
        },
        _ => Err(unexpected(reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// URLs name a host and port, optionally a user and password; nothing else.
    #[test]
    fn urls() {
        let t = parse_url("redis://u:p@127.0.0.1:7000").ok();
        assert_eq!(
            t.map(|t| (t.address, t.user, t.password)),
            Some(("127.0.0.1:7000".into(), "u".into(), Some("p".into())))
        );
        let t = parse_url("redis://:secret@h").ok();
        assert_eq!(
            t.map(|t| (t.address, t.user, t.password)),
            Some(("h:6379".into(), "default".into(), Some("secret".into())))
        );
        assert!(parse_url("http://h:1").is_err());
        assert!(parse_url("redis://h:1/2").is_err());
    }

    /// Slots as Redis computes them (its documented reference values), so a
    /// lock routes to the master holding its state.
    #[test]
    fn slots_match_redis() {
        assert_eq!(slot(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(endpoint(":7001", "10.0.0.1:7000"), "10.0.0.1:7001");
    }

    /// The module's lease error lines come back as the component's errors;
    /// anything else is an infrastructure error.
    #[test]
    fn refusals() {
        assert!(matches!(
            refusal("INVALIDREQUEST zero-ttl"),
            AuthorityError::Refused {
                error: LeaseError::InvalidRequest(LeaseInvalidReason::ZeroTtl)
            }
        ));
        assert!(matches!(
            refusal("FOREIGNAUTHORITY stored 1 presented 2"),
            AuthorityError::Refused {
                error: LeaseError::ForeignAuthority {
                    stored: 1,
                    presented: 2
                }
            }
        ));
        assert!(matches!(
            refusal("LOADING Redis is loading"),
            AuthorityError::Redis(_)
        ));
    }
}
