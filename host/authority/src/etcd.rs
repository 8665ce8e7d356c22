//! The etcd coordinator: lease states in etcd v3 keys, one compare-and-swap
//! transaction per decision, through etcd's v3 JSON gateway (HTTP).
//!
//! Keys, under a prefix (default `fencecheck/`):
//! - `<prefix>lock/<lock>`: the component's lease state bytes for `<lock>`;
//! - `<prefix>epoch-floor`: the epoch floor, a decimal u64 (absent = 0).
//!
//! A decision reads both keys in one linearizable read, asks the component,
//! and writes the new state in a transaction that compares both keys'
//! `mod_revision` (or `create_revision == 0` for an absent key) with what was
//! read. A lost compare re-reads (the transaction's failure branch returns
//! the fresh keys) and decides again, a bounded number of times.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use fencecheck::{Instance, LeaseError, Runtime, Token};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::rules::{self, Decided, Read};
use crate::{AcquireOutcome, AuthorityError, Clock, Coordinator, ReleaseOutcome, RenewOutcome};

/// How an [`EtcdCoordinator`] reaches and uses the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs of the cluster's members, e.g. `http://127.0.0.1:2379`
    /// (plain HTTP; TLS is not supported). A member that cannot be reached
    /// is skipped for the next one.
    pub endpoints: Vec<String>,
    /// Prefix of every key the coordinator uses; coordinators sharing locks
    /// must share it.
    pub prefix: String,
    /// Limit for opening a connection to one member.
    pub connect_timeout: Duration,
    /// Limit for one whole request to one member. A write that exceeds it
    /// has an unknown outcome and is reported as an error, never retried.
    pub request_timeout: Duration,
    /// Compare-and-swap attempts per decision before giving up with
    /// [`AuthorityError::Contention`].
    pub max_attempts: u32,
}

impl EtcdOptions {
    /// Defaults for `endpoints`: prefix `fencecheck/`, 1 s to connect, 5 s
    /// per request, 32 attempts.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        Self {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            prefix: "fencecheck/".to_owned(),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            max_attempts: 32,
        }
    }
}

/// Lease coordinator on an etcd v3 cluster.
///
/// Every state change is a compare-and-swap on the revisions the decision
/// read, so any number of coordinator processes on the same cluster and
/// prefix issue one strictly increasing token sequence per lock. The
/// authority id is the cluster's id (stable across members and restarts,
/// and across a snapshot restore that keeps the member names, peer URLs and
/// cluster token); every response is checked to come from that cluster.
pub struct EtcdCoordinator {
    http: ureq::Agent,
    endpoints: Vec<String>,
    /// The member to try first: the last one that answered.
    preferred: AtomicUsize,
    prefix: Vec<u8>,
    floor_key: Vec<u8>,
    authority: u64,
    max_attempts: u32,
    clock: Arc<dyn Clock>,
    // Held only for the component call, never across a network round trip.
    guest: Mutex<Instance>,
}

impl std::fmt::Debug for EtcdCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordinator")
            .field("endpoints", &self.endpoints)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .field("authority", &self.authority)
            .finish_non_exhaustive()
    }
}

/// Whether a request may be sent again (to this or another member) after a
/// failure that might have happened after the member received it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// A read: resending is harmless.
    Repeatable,
    /// A write: resend only if it certainly never left this process.
    AtMostOnce,
}

/// One key as read: its value and `mod_revision`; `None` if absent.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    value: Vec<u8>,
    mod_revision: u64,
}

/// A lock's state and the epoch floor, read at one revision.
#[derive(Clone, Debug)]
struct Snapshot {
    lock: Option<Entry>,
    floor: Option<Entry>,
}

impl EtcdCoordinator {
    /// Connect to the cluster at `endpoints` with default [`EtcdOptions`].
    pub fn connect<S: Into<String>>(
        endpoints: impl IntoIterator<Item = S>,
        runtime: Runtime,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthorityError> {
        Self::with_options(EtcdOptions::new(endpoints), runtime, clock)
    }

    /// Connect with explicit options. Asks the first reachable member for
    /// the cluster id, which becomes the authority.
    pub fn with_options(
        options: EtcdOptions,
        runtime: Runtime,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthorityError> {
        if options.endpoints.is_empty() {
            return Err(etcd_error("no endpoints given"));
        }
        let mut endpoints = Vec::with_capacity(options.endpoints.len());
        for endpoint in &options.endpoints {
            let trimmed = endpoint.trim_end_matches('/');
            if !trimmed.starts_with("http://") || trimmed.len() <= "http://".len() {
                return Err(etcd_error(format!(
                    "endpoint {endpoint:?} is not an http:// URL (TLS is not supported)"
                )));
            }
            endpoints.push(trimmed.to_owned());
        }
        if options.prefix.is_empty() {
            // An empty prefix would make restore's lock range cover every
            // key the cluster holds under "lock/".
            return Err(etcd_error("the key prefix must not be empty"));
        }
        if options.max_attempts == 0 {
            return Err(etcd_error("max_attempts must be at least 1"));
        }
        let http: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(options.connect_timeout))
            .timeout_global(Some(options.request_timeout))
            .max_redirects(0)
            .build()
            .into();
        let prefix = options.prefix.into_bytes();
        let mut floor_key = prefix.clone();
        floor_key.extend_from_slice(b"epoch-floor");
        let mut coordinator = Self {
            http,
            endpoints,
            preferred: AtomicUsize::new(0),
            prefix,
            floor_key,
            authority: 0,
            max_attempts: options.max_attempts,
            clock,
            guest: Mutex::new(runtime.instance()?),
        };
        let status =
            coordinator.post("/v3/maintenance/status", &json!({}), Delivery::Repeatable)?;
        let authority = cluster_id(&status)?;
        if authority == 0 {
            return Err(etcd_error("the cluster reports id 0"));
        }
        coordinator.authority = authority;
        Ok(coordinator)
    }

    fn lock_key(&self, lock: &str) -> Vec<u8> {
        let mut key = self.lock_prefix();
        key.extend_from_slice(lock.as_bytes());
        key
    }

    fn lock_prefix(&self) -> Vec<u8> {
        let mut key = self.prefix.clone();
        key.extend_from_slice(b"lock/");
        key
    }

    /// POST `body` to `path` on the preferred member, moving on to the next
    /// member when one cannot be used. Returns the parsed 200 response,
    /// checked to come from this coordinator's cluster.
    fn post(&self, path: &str, body: &Value, delivery: Delivery) -> Result<Value, AuthorityError> {
        let body = body.to_string();
        let n = self.endpoints.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let mut failures = Vec::new();
        for i in (0..n).map(|k| (first + k) % n) {
            let endpoint = &self.endpoints[i];
            match self.post_once(endpoint, path, &body) {
                Ok(Reply::Ok(value)) => {
                    self.preferred.store(i, Ordering::Relaxed);
                    if self.authority != 0 {
                        let id = cluster_id(&value)?;
                        if id != self.authority {
                            return Err(etcd_error(format!(
                                "{endpoint} answered for cluster {id}, not {}: \
                                 the endpoints name different clusters",
                                self.authority
                            )));
                        }
                    }
                    return Ok(value);
                }
                Ok(Reply::Refused { status, message }) => {
                    // A 5xx (no leader, not ready, timed out) or an unreadable
                    // 200 is the member's trouble: a read may try another; a
                    // write may have been applied. A 4xx is a refusal.
                    let trouble = status >= 500 || status == 200;
                    if trouble && delivery == Delivery::Repeatable {
                        self.preferred.store(i + 1, Ordering::Relaxed);
                        failures.push(format!("{endpoint}: HTTP {status}: {message}"));
                        continue;
                    }
                    let unknown = if trouble {
                        " (the write's outcome is unknown)"
                    } else {
                        ""
                    };
                    return Err(etcd_error(format!(
                        "{endpoint}{path}: HTTP {status}: {message}{unknown}"
                    )));
                }
                Err(e) => {
                    self.preferred.store(i + 1, Ordering::Relaxed);
                    let unsent = never_sent(&e);
                    failures.push(format!("{endpoint}: {e}"));
                    if !unsent && delivery == Delivery::AtMostOnce {
                        return Err(etcd_error(format!(
                            "{endpoint}{path}: {e} (the write's outcome is unknown)"
                        )));
                    }
                }
            }
        }
        Err(etcd_error(format!(
            "no member could answer {path}: {}",
            failures.join("; ")
        )))
    }

    fn post_once(&self, endpoint: &str, path: &str, body: &str) -> Result<Reply, ureq::Error> {
        let mut response = self
            .http
            .post(format!("{endpoint}{path}"))
            .header("content-type", "application/json")
            .send(body)?;
        let status = response.status().as_u16();
        let bytes = response
            .body_mut()
            .with_config()
            .limit(RESPONSE_LIMIT)
            .read_to_vec()?;
        if status == 200 {
            return Ok(match serde_json::from_slice::<Value>(&bytes) {
                Ok(value) if value.is_object() => Reply::Ok(value),
                // A 200 that is not a JSON object: nothing to trust in it.
                _ => Reply::Refused {
                    status,
                    message: format!("unreadable body: {}", excerpt(&bytes)),
                },
            });
        }
        let message = serde_json::from_slice::<GatewayError>(&bytes)
            .ok()
            .and_then(|e| e.message.or(e.error))
            .unwrap_or_else(|| excerpt(&bytes));
        Ok(Reply::Refused { status, message })
    }

    /// A linearizable read of the lock's key and the floor key, at one revision.
    fn read(&self, lock_key: &[u8]) -> Result<Snapshot, AuthorityError> {
        let request = json!({
            "success": [range_op(lock_key), range_op(&self.floor_key)],
        });
        let response = self.post("/v3/kv/txn", &request, Delivery::Repeatable)?;
        let txn: TxnResponse = parse(response, "read txn")?;
        if !txn.succeeded {
            return Err(etcd_error("a read-only transaction reported failure"));
        }
        self.snapshot(txn, lock_key)
    }

    /// The two range responses of a read (or of a lost compare's failure branch).
    fn snapshot(&self, txn: TxnResponse, lock_key: &[u8]) -> Result<Snapshot, AuthorityError> {
        let [lock, floor] = <[OpResponse; 2]>::try_from(txn.responses)
            .map_err(|r| etcd_error(format!("expected 2 range responses, got {}", r.len())))?;
        Ok(Snapshot {
            lock: single(lock, lock_key)?,
            floor: single(floor, &self.floor_key)?,
        })
    }

    /// Store `next` as the lock's state if neither the lock's key nor the
    /// floor key changed since `read`; otherwise return their current values.
    fn compare_and_swap(
        &self,
        lock_key: &[u8],
        read: &Snapshot,
        next: &[u8],
    ) -> Result<Option<Snapshot>, AuthorityError> {
        let request = json!({
            "compare": [
                unchanged(lock_key, read.lock.as_ref()),
                unchanged(&self.floor_key, read.floor.as_ref()),
            ],
            "success": [put_op(lock_key, next)],
            "failure": [range_op(lock_key), range_op(&self.floor_key)],
        });
        let response = self.post("/v3/kv/txn", &request, Delivery::AtMostOnce)?;
        let txn: TxnResponse = parse(response, "write txn (its outcome is unknown)")?;
        if txn.succeeded {
            match txn.responses.as_slice() {
                [OpResponse::Put {}] => Ok(None),
                other => Err(etcd_error(format!(
                    "a committed transaction returned {other:?} instead of one put \
                     (the write's outcome is unknown)"
                ))),
            }
        } else {
            self.snapshot(txn, lock_key).map(Some)
        }
    }

    /// One decision: read, let `decide` consult the component, write the
    /// state it returns with a compare-and-swap; on a lost compare decide
    /// again on the fresh values. `decide` returning no state writes nothing.
    fn decide<T>(
        &self,
        lock: &str,
        decide: impl Fn(&mut Instance, Read<'_>) -> Decided<T>,
    ) -> Result<T, AuthorityError> {
        let lock_key = self.lock_key(lock);
        let mut read = self.read(&lock_key)?;
        for _ in 0..self.max_attempts {
            let floor = floor_value(read.floor.as_ref())?;
            let state = read.lock.as_ref().map(|e| e.value.as_slice());
            // Read the clock after the read: the decision is ordered by the
            // compare-and-swap, which only succeeds if nothing moved since.
            let now = self.clock.now_ms();
            let (outcome, next) = {
                // A poisoned lock only means another decision panicked inside
                // the component call; the instance replaces itself on traps.
                let mut guest = self.guest.lock().unwrap_or_else(PoisonError::into_inner);
                decide(&mut guest, Read { state, floor, now })?
            };
            let Some(next) = next else {
                return Ok(outcome);
            };
            if state == Some(next.as_slice()) {
                // A retried acquire: the stored state already says so.
                return Ok(outcome);
            }
            match self.compare_and_swap(&lock_key, &read, &next)? {
                None => return Ok(outcome),
                Some(fresh) => read = fresh,
            }
        }
        Err(AuthorityError::Contention {
            lock: lock.to_owned(),
            attempts: self.max_attempts,
        })
    }

    /// One restore attempt: `Ok(None)` if a concurrent change won the compare.
    fn try_restore(&self, at_least: u64) -> Result<Option<u64>, AuthorityError> {
        let locks_start = self.lock_prefix();
        let locks_end = prefix_end(&locks_start)?;
        let request = json!({
            "success": [
                range_op(&self.floor_key),
                {"request_range": {"key": B64.encode(&locks_start), "range_end": B64.encode(&locks_end)}},
            ],
        });
        let response = self.post("/v3/kv/txn", &request, Delivery::Repeatable)?;
        let txn: TxnResponse = parse(response, "read txn")?;
        let revision = txn.header.revision;
        if !txn.succeeded || revision == 0 {
            return Err(etcd_error("a read-only transaction reported failure"));
        }
        let [floor, locks] = <[OpResponse; 2]>::try_from(txn.responses)
            .map_err(|r| etcd_error(format!("expected 2 range responses, got {}", r.len())))?;
        let floor = single(floor, &self.floor_key)?;
        let OpResponse::Range(locks) = locks else {
            return Err(etcd_error("expected a range response for the locks"));
        };
        if locks.more || locks.count != locks.kvs.len() as u64 {
            return Err(etcd_error(format!(
                "the lock range was cut short ({} of {} keys)",
                locks.kvs.len(),
                locks.count
            )));
        }

        let mut new_floor = floor_value(floor.as_ref())?
            .checked_add(1)
            .ok_or(LeaseError::Exhausted)?
            .max(at_least);
        let mut puts = Vec::with_capacity(locks.kvs.len() + 1);
        {
            let mut guest = self.guest.lock().unwrap_or_else(PoisonError::into_inner);
            for kv in &locks.kvs {
                let kv = Kv::decode(kv)?;
                let Some(name) = kv.key.strip_prefix(locks_start.as_slice()) else {
                    return Err(etcd_error("the lock range returned a key outside it"));
                };
                // Any damaged or misplaced lock state aborts the whole restore:
                // better no new epoch than a partial one.
                let info = guest.inspect_lease(&kv.value)??;
                if info.lock.as_bytes() != name {
                    return Err(LeaseError::LockMismatch(info.lock).into());
                }
                let (epoch, next) = guest.restore(Some(&kv.value))??;
                new_floor = new_floor.max(epoch);
                puts.push(put_op(&kv.key, &next));
            }
        }
        puts.push(put_op(&self.floor_key, new_floor.to_string().as_bytes()));
        let next_revision = revision
            .checked_add(1)
            .ok_or_else(|| etcd_error("revision overflow"))?;
        let request = json!({
            "compare": [
                unchanged(&self.floor_key, floor.as_ref()),
                // No lock key was created or changed since the read.
                {
                    "key": B64.encode(&locks_start),
                    "range_end": B64.encode(&locks_end),
                    "target": "MOD",
                    "result": "LESS",
                    "mod_revision": next_revision.to_string(),
                },
            ],
            "success": puts,
        });
        let response = self.post("/v3/kv/txn", &request, Delivery::AtMostOnce)?;
        let txn: TxnResponse = parse(response, "write txn (its outcome is unknown)")?;
        if !txn.succeeded {
            return Ok(None);
        }
        if txn.responses.len() != locks.kvs.len() + 1
            || !txn
                .responses
                .iter()
                .all(|r| matches!(r, OpResponse::Put {}))
        {
            return Err(etcd_error(
                "a committed restore returned unexpected responses (its outcome is unknown)",
            ));
        }
        Ok(Some(new_floor))
    }
}

impl Coordinator for EtcdCoordinator {
    fn authority(&self) -> u64 {
        self.authority
    }

    fn acquire(
        &self,
        lock: &str,
        lease_id: &str,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, AuthorityError> {
        self.decide(lock, |guest, read| {
            rules::acquire(guest, read, self.authority, lock, lease_id, ttl_ms)
        })
    }

    fn renew(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
        ttl_ms: u64,
    ) -> Result<RenewOutcome, AuthorityError> {
        self.decide(lock, |guest, read| {
            rules::renew(guest, read, lease_id, token, ttl_ms)
        })
    }

    fn release(
        &self,
        lock: &str,
        lease_id: &str,
        token: Token,
    ) -> Result<ReleaseOutcome, AuthorityError> {
        self.decide(lock, |guest, read| {
            rules::release(guest, read, lease_id, token)
        })
    }

    /// All lock states get their next epoch and the floor is raised, in one
    /// transaction guarded by the revisions read. etcd caps the operations
    /// in one transaction (`--max-txn-ops`, default 128): with more locks
    /// than that minus one, restore fails with etcd's error and changes
    /// nothing; raise the cap on the cluster.
    fn restore(&self, at_least: u64) -> Result<u64, AuthorityError> {
        for _ in 0..self.max_attempts {
            if let Some(floor) = self.try_restore(at_least)? {
                return Ok(floor);
            }
        }
        Err(AuthorityError::Contention {
            lock: String::from_utf8_lossy(&self.lock_prefix()).into_owned(),
            attempts: self.max_attempts,
        })
    }
}

/// Largest response body read (a restore reads every lock state).
const RESPONSE_LIMIT: u64 = 64 * 1024 * 1024;

enum Reply {
    Ok(Value),
    Refused { status: u16, message: String },
}

/// True if `e` happened before the request could reach the member.
fn never_sent(e: &ureq::Error) -> bool {
    use std::io::ErrorKind;
    match e {
        ureq::Error::Io(io) => matches!(
            io.kind(),
            ErrorKind::ConnectionRefused | ErrorKind::AddrNotAvailable | ErrorKind::NotConnected
        ),
        ureq::Error::Timeout(t) => {
            matches!(t, ureq::Timeout::Connect | ureq::Timeout::Resolve)
        }
        ureq::Error::ConnectionFailed | ureq::Error::HostNotFound | ureq::Error::BadUri(_) => true,
        _ => false,
    }
}

fn etcd_error(message: impl Into<String>) -> AuthorityError {
    AuthorityError::Etcd(message.into())
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_owned()
}

fn parse<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T, AuthorityError> {
    serde_json::from_value(value)
        .map_err(|e| etcd_error(format!("unexpected {what} response: {e}")))
}

fn cluster_id(response: &Value) -> Result<u64, AuthorityError> {
    let id = response
        .pointer("/header/cluster_id")
        .ok_or_else(|| etcd_error("a response carries no cluster id"))?;
    u64_text(id).map_err(|e| etcd_error(format!("unexpected cluster id: {e}")))
}

fn range_op(key: &[u8]) -> Value {
    json!({"request_range": {"key": B64.encode(key)}})
}

fn put_op(key: &[u8], value: &[u8]) -> Value {
    json!({"request_put": {"key": B64.encode(key), "value": B64.encode(value)}})
}

/// The compare that holds only if `key` is still as read.
fn unchanged(key: &[u8], read: Option<&Entry>) -> Value {
    match read {
        Some(e) => json!({
            "key": B64.encode(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": e.mod_revision.to_string(),
        }),
        None => json!({
            "key": B64.encode(key),
            "target": "CREATE",
            "result": "EQUAL",
            "create_revision": "0",
        }),
    }
}

/// The first key after every key starting with `prefix`.
fn prefix_end(prefix: &[u8]) -> Result<Vec<u8>, AuthorityError> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Ok(end);
        }
    }
    Err(etcd_error("the key prefix has no upper bound"))
}

/// The epoch floor as stored: a canonical decimal u64; absent is 0.
fn floor_value(entry: Option<&Entry>) -> Result<u64, AuthorityError> {
    let Some(entry) = entry else {
        return Ok(0);
    };
    let text = std::str::from_utf8(&entry.value).ok();
    text.filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|t| t.parse::<u64>().ok())
        .filter(|v| text == Some(v.to_string().as_str()))
        .ok_or_else(|| {
            etcd_error(format!(
                "the epoch floor is not a decimal u64: {}",
                excerpt(&entry.value)
            ))
        })
}

/// The single key a one-key range returned, checked to be `key`.
fn single(response: OpResponse, key: &[u8]) -> Result<Option<Entry>, AuthorityError> {
    let OpResponse::Range(range) = response else {
        return Err(etcd_error("expected a range response"));
    };
    match range.kvs.as_slice() {
        [] if range.count == 0 => Ok(None),
        [kv] if range.count == 1 => {
            let kv = Kv::decode(kv)?;
            if kv.key != key {
                return Err(etcd_error("a range returned another key than asked"));
            }
            if kv.mod_revision == 0 {
                return Err(etcd_error("a stored key has mod_revision 0"));
            }
            Ok(Some(Entry {
                value: kv.value,
                mod_revision: kv.mod_revision,
            }))
        }
        kvs => Err(etcd_error(format!(
            "a one-key range returned {} keys (count {})",
            kvs.len(),
            range.count
        ))),
    }
}

// ---- The gateway's JSON (proto3 JSON: 64-bit integers are strings, bytes
// are base64, fields at their default value are omitted). ----

#[derive(Deserialize)]
struct GatewayError {
    error: Option<String>,
    message: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Header {
    #[serde(default, deserialize_with = "u64_text")]
    revision: u64,
}

#[derive(Debug, Deserialize)]
struct TxnResponse {
    header: Header,
    #[serde(default)]
    succeeded: bool,
    #[serde(default)]
    responses: Vec<OpResponse>,
}

#[derive(Debug, Deserialize)]
enum OpResponse {
    #[serde(rename = "response_range")]
    Range(RangeResponse),
    #[serde(rename = "response_put")]
    Put {},
}

#[derive(Debug, Deserialize)]
struct RangeResponse {
    #[serde(default)]
    kvs: Vec<RawKv>,
    #[serde(default, deserialize_with = "u64_text")]
    count: u64,
    #[serde(default)]
    more: bool,
}

#[derive(Debug, Deserialize)]
struct RawKv {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
    #[serde(default, deserialize_with = "u64_text")]
    mod_revision: u64,
}

struct Kv {
    key: Vec<u8>,
    value: Vec<u8>,
    mod_revision: u64,
}

impl Kv {
    fn decode(raw: &RawKv) -> Result<Self, AuthorityError> {
        let b64 = |s: &str| {
            B64.decode(s)
                .map_err(|e| etcd_error(format!("invalid base64 in a key-value: {e}")))
        };
        Ok(Self {
            key: b64(&raw.key)?,
            value: b64(&raw.value)?,
            mod_revision: raw.mod_revision,
        })
    }
}

/// A proto3-JSON 64-bit unsigned integer: a decimal string (or a number).
fn u64_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Str(String),
        Num(u64),
    }
    match Text::deserialize(d)? {
        Text::Num(n) => Ok(n),
        Text::Str(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not a u64"))),
        Text::Str(s) => Err(serde::de::Error::custom(format!("{s:?} is not a u64"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(value: &[u8]) -> Entry {
        Entry {
            value: value.to_vec(),
            mod_revision: 7,
        }
    }

    #[test]
    fn floor_must_be_canonical_decimal() {
        assert_eq!(floor_value(None).ok(), Some(0));
        assert_eq!(floor_value(Some(&entry(b"42"))).ok(), Some(42));
        for bad in [
            &b""[..],
            b"+1",
            b"01",
            b"-1",
            b"1 ",
            b"18446744073709551616",
            b"x",
        ] {
            assert!(floor_value(Some(&entry(bad))).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(prefix_end(b"a/lock/").ok(), Some(b"a/lock0".to_vec()));
        assert_eq!(prefix_end(b"a\xff").ok(), Some(b"b".to_vec()));
        assert!(prefix_end(b"\xff\xff").is_err());
    }

    #[test]
    fn gateway_integers_are_strings() -> Result<(), serde_json::Error> {
        let txn: TxnResponse = serde_json::from_str(
            r#"{"header":{"cluster_id":"18446744073709551615","revision":"9"},
                "responses":[{"response_range":{"header":{},"kvs":[
                  {"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"1","value":"YmFy"}],
                  "count":"1"}}]}"#,
        )?;
        assert_eq!(txn.header.revision, 9);
        let value: Value =
            serde_json::from_str(r#"{"header":{"cluster_id":"18446744073709551615"}}"#)?;
        assert_eq!(cluster_id(&value).ok(), Some(u64::MAX));
        assert!(cluster_id(&json!({"header": {}})).is_err());
        assert!(!txn.succeeded, "an omitted `succeeded` is false");
        assert!(serde_json::from_str::<Header>(r#"{"revision":"-1"}"#).is_err());
        assert!(serde_json::from_str::<Header>(r#"{"revision":"1e3"}"#).is_err());
        Ok(())
    }
}
