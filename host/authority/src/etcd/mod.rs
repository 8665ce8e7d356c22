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

mod gateway;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use fencecheck::{Instance, Runtime, Token};
use serde_json::json;

use gateway::{
    Delivery, Entry, Gateway, Kv, OpResponse, TxnResponse, etcd_error, excerpt, parse, prefix_end,
    put_op, range_op, unchanged,
};

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
    gateway: Gateway,
    prefix: Vec<u8>,
    floor_key: Vec<u8>,
    max_attempts: u32,
    clock: Arc<dyn Clock>,
    // Held only for the component call, never across a network round trip.
    guest: Mutex<Instance>,
}

impl std::fmt::Debug for EtcdCoordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdCoordinator")
            .field("gateway", &self.gateway)
            .field("prefix", &String::from_utf8_lossy(&self.prefix))
            .finish_non_exhaustive()
    }
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
        if options.prefix.is_empty() {
            // An empty prefix would make restore's lock range cover every
            // key the cluster holds under "lock/".
            return Err(etcd_error("the key prefix must not be empty"));
        }
        if options.max_attempts == 0 {
            return Err(etcd_error("max_attempts must be at least 1"));
        }
        let gateway = Gateway::connect(
            &options.endpoints,
            options.connect_timeout,
            options.request_timeout,
        )?;
        let prefix = options.prefix.into_bytes();
        let mut floor_key = prefix.clone();
        floor_key.extend_from_slice(b"epoch-floor");
        Ok(Self {
            gateway,
            prefix,
            floor_key,
            max_attempts: options.max_attempts,
            clock,
            guest: Mutex::new(runtime.instance()?),
        })
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

    /// A linearizable read of the lock's key and the floor key, at one revision.
    fn read(&self, lock_key: &[u8]) -> Result<Snapshot, AuthorityError> {
        let request = json!({
            "success": [range_op(lock_key), range_op(&self.floor_key)],
        });
        let response = self
            .gateway
            .post("/v3/kv/txn", &request, Delivery::Repeatable)?;
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
        let response = self
            .gateway
            .post("/v3/kv/txn", &request, Delivery::AtMostOnce)?;
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
        let response = self
            .gateway
            .post("/v3/kv/txn", &request, Delivery::Repeatable)?;
        let txn: TxnResponse = parse(response, "read txn")?;
        if !txn.succeeded || txn.header.revision == 0 {
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

        let locks = locks
            .kvs
            .iter()
            .map(|kv| {
                let kv = Kv::decode(kv)?;
                match kv.key.strip_prefix(locks_start.as_slice()) {
                    Some(name) => Ok((name.to_vec(), kv.value)),
                    None => Err(etcd_error("the lock range returned a key outside it")),
                }
            })
            .collect::<Result<Vec<_>, AuthorityError>>()?;
        let new_floor = {
            let mut guest = self.guest.lock().unwrap_or_else(PoisonError::into_inner);
            rules::restored_floor(
                &mut guest,
                floor_value(floor.as_ref())?,
                at_least,
                locks
                    .iter()
                    .map(|(name, state)| (name.as_slice(), state.as_slice())),
            )?
        };
        // Only the floor is written, guarded by its own revision. A lock
        // written since the read got an epoch no higher than the old floor
        // or the epoch read for it, so still below the new floor; an acquire
        // that read the old floor and commits later loses its compare on
        // the floor key and decides again.
        let request = json!({
            "compare": [unchanged(&self.floor_key, floor.as_ref())],
            "success": [put_op(&self.floor_key, new_floor.to_string().as_bytes())],
        });
        let response = self
            .gateway
            .post("/v3/kv/txn", &request, Delivery::AtMostOnce)?;
        let txn: TxnResponse = parse(response, "write txn (its outcome is unknown)")?;
        if !txn.succeeded {
            return Ok(None);
        }
        if !matches!(txn.responses.as_slice(), [OpResponse::Put {}]) {
            return Err(etcd_error(
                "a committed restore returned unexpected responses (its outcome is unknown)",
            ));
        }
        Ok(Some(new_floor))
    }
}

impl Coordinator for EtcdCoordinator {
    fn authority(&self) -> u64 {
        self.gateway.authority()
    }

    fn acquire(
        &self,
        lock: &str,
        lease_id: &str,
        ttl_ms: u64,
    ) -> Result<AcquireOutcome, AuthorityError> {
        self.decide(lock, |guest, read| {
            rules::acquire(
                guest,
                read,
                self.gateway.authority(),
                lock,
                lease_id,
                ttl_ms,
            )
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

    /// Raises the epoch floor above every stored lock's epoch (one write,
    /// however many locks: see `rules::restored_floor`). Every lock state is
    /// read once to validate it (one range read, at most `RESPONSE_LIMIT`
    /// bytes of gateway JSON: some 200,000 locks).
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
}
