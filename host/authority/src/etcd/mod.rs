//! The etcd coordinator: lease states in etcd v3 keys, one compare-and-swap
//! transaction per decision, through etcd's v3 JSON gateway (HTTP, or
//! HTTPS with the operator's CA and a client certificate, as an etcd user
//! when authentication is on: `access`).
//!
//! Keys, under a prefix (default `fencecheck/`):
//! - `<prefix>lock/<lock>`: the component's lease state bytes for `<lock>`;
//! - `<prefix>epoch-floor`: the epoch floor, a decimal u64 (absent = 0);
//! - `<prefix>lineage`: the authority id every token carries, a decimal
//!   u64, written at first use (the cluster id, which is what coordinators
//!   before lineages used) and copied by `migrate`; followed by
//!   ` moved-to <store>` once `migrate` sealed this store, or ` importing`
//!   while a migration into it runs.
//!
//! A decision reads the three keys in one linearizable read, asks the
//! component, and writes the new state in a transaction that compares all
//! three keys' `mod_revision` (or `create_revision == 0` for an absent key)
//! with what was read: a seal between the read and the write fails the
//! compare. A lost compare re-reads (the transaction's failure branch
//! returns the fresh keys) and decides again, a bounded number of times.

mod access;
mod gateway;

pub use access::{EtcdCredentials, EtcdTls};

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fencecheck::{Instance, Runtime, Token};
use serde_json::json;

use gateway::{
    Access, Delivery, Entry, Gateway, Kv, OpResponse, TxnResponse, delete_range_op, etcd_error,
    excerpt, parse, prefix_end, put_op, range_all_op, range_op, range_unchanged_since, unchanged,
};

use crate::lineage::{
    Export, Imported, Lineage, LineageStore, MigrationStep, Peek, target_verdict,
};
use crate::rules::{self, Decided, Read};
use crate::{AcquireOutcome, AuthorityError, Clock, Coordinator, ReleaseOutcome, RenewOutcome};

/// How an [`EtcdCoordinator`] reaches and uses the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Client URLs of the cluster's members, e.g. `http://127.0.0.1:2379`,
    /// or all `https://…` with [`EtcdOptions::tls`]. A member that cannot be
    /// reached is skipped for the next one.
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
    /// TLS settings for `https://` endpoints (required for them, refused
    /// with `http://` ones).
    pub tls: Option<EtcdTls>,
    /// The etcd user to authenticate as, for a cluster with authentication
    /// enabled; its role must grant read-write on the whole `prefix`.
    pub credentials: Option<EtcdCredentials>,
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
            tls: None,
            credentials: None,
        }
    }

    fn access(&self) -> Access<'_> {
        Access {
            endpoints: &self.endpoints,
            connect_timeout: self.connect_timeout,
            request_timeout: self.request_timeout,
            tls: self.tls.as_ref(),
            credentials: self.credentials.as_ref(),
            prefix: &self.prefix,
        }
    }
}

/// Lease coordinator on an etcd v3 cluster.
///
/// Every state change is a compare-and-swap on the revisions the decision
/// read, so any number of coordinator processes on the same cluster and
/// prefix issue one strictly increasing token sequence per lock. The
/// authority id is the lineage stored under the prefix (at first use, the
/// cluster's id); every response is checked to come from the cluster the
/// coordinator connected to.
pub struct EtcdCoordinator {
    gateway: Gateway,
    prefix: Vec<u8>,
    floor_key: Vec<u8>,
    lineage_key: Vec<u8>,
    authority: u64,
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
    lineage: Option<Entry>,
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

    /// Connect with explicit options. Reads the lineage (the authority),
    /// making it the cluster's id if no coordinator used the prefix yet.
    pub fn with_options(
        options: EtcdOptions,
        runtime: Runtime,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, AuthorityError> {
        let mut coordinator = Self::unbound(options, runtime, clock)?;
        coordinator.authority = coordinator.first_use()?;
        Ok(coordinator)
    }

    /// Connected, but with no lineage read or made (authority 0).
    fn unbound(
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
        let gateway = Gateway::connect(options.access())?;
        let prefix = options.prefix.into_bytes();
        let mut floor_key = prefix.clone();
        floor_key.extend_from_slice(b"epoch-floor");
        let mut lineage_key = prefix.clone();
        lineage_key.extend_from_slice(b"lineage");
        Ok(Self {
            gateway,
            prefix,
            floor_key,
            lineage_key,
            authority: 0,
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
            "success": [
                range_op(lock_key),
                range_op(&self.floor_key),
                range_op(&self.lineage_key),
            ],
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

    /// The three range responses of a read (or of a lost compare's failure branch).
    fn snapshot(&self, txn: TxnResponse, lock_key: &[u8]) -> Result<Snapshot, AuthorityError> {
        let [lock, floor, lineage] = <[OpResponse; 3]>::try_from(txn.responses)
            .map_err(|r| etcd_error(format!("expected 3 range responses, got {}", r.len())))?;
        Ok(Snapshot {
            lock: single(lock, lock_key)?,
            floor: single(floor, &self.floor_key)?,
            lineage: single(lineage, &self.lineage_key)?,
        })
    }

    /// Refuses unless `entry` is this coordinator's lineage, live.
    fn check_live(&self, entry: Option<&Entry>) -> Result<(), AuthorityError> {
        match entry.map(|e| parse_lineage(&e.value)).transpose()? {
            Some(Lineage::Live(l)) if l == self.authority => Ok(()),
            Some(Lineage::Moved(_, to)) => Err(AuthorityError::Moved { to }),
            Some(Lineage::Importing(_)) => Err(AuthorityError::MigrationIncomplete),
            Some(Lineage::Live(l)) => Err(etcd_error(format!(
                "the stored lineage is {l}, not {} as when this coordinator connected",
                self.authority
            ))),
            None => Err(etcd_error(
                "the lineage key is gone: the prefix was wiped under a running coordinator",
            )),
        }
    }

    /// The lineage, written as the cluster id if absent (first use).
    fn first_use(&self) -> Result<u64, AuthorityError> {
        for _ in 0..self.max_attempts {
            let request = json!({"success": [range_op(&self.lineage_key)]});
            let response = self
                .gateway
                .post("/v3/kv/txn", &request, Delivery::Repeatable)?;
            let txn: TxnResponse = parse(response, "read txn")?;
            let [lineage] = <[OpResponse; 1]>::try_from(txn.responses)
                .map_err(|r| etcd_error(format!("expected 1 range response, got {}", r.len())))?;
            if let Some(entry) = single(lineage, &self.lineage_key)? {
                let (Lineage::Live(l) | Lineage::Moved(l, _) | Lineage::Importing(l)) =
                    parse_lineage(&entry.value)?;
                return Ok(l);
            }
            let cluster = self.gateway.cluster();
            let request = json!({
                "compare": [unchanged(&self.lineage_key, None)],
                "success": [put_op(&self.lineage_key, cluster.to_string().as_bytes())],
            });
            let response = self
                .gateway
                .post("/v3/kv/txn", &request, Delivery::AtMostOnce)?;
            let txn: TxnResponse = parse(response, "write txn (its outcome is unknown)")?;
            if txn.succeeded {
                return Ok(cluster);
            }
        }
        Err(AuthorityError::Contention {
            lock: String::from_utf8_lossy(&self.lineage_key).into_owned(),
            attempts: self.max_attempts,
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
                unchanged(&self.lineage_key, read.lineage.as_ref()),
            ],
            "success": [put_op(lock_key, next)],
            "failure": [range_op(lock_key), range_op(&self.floor_key), range_op(&self.lineage_key)],
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
            self.check_live(read.lineage.as_ref())?;
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
                range_all_op(&locks_start, &locks_end),
                range_op(&self.lineage_key),
            ],
        });
        let response = self
            .gateway
            .post("/v3/kv/txn", &request, Delivery::Repeatable)?;
        let txn: TxnResponse = parse(response, "read txn")?;
        if !txn.succeeded || txn.header.revision == 0 {
            return Err(etcd_error("a read-only transaction reported failure"));
        }
        let [floor, locks, lineage] = <[OpResponse; 3]>::try_from(txn.responses)
            .map_err(|r| etcd_error(format!("expected 3 range responses, got {}", r.len())))?;
        let floor = single(floor, &self.floor_key)?;
        let lineage = single(lineage, &self.lineage_key)?;
        self.check_live(lineage.as_ref())?;
        let locks = lock_range(locks, &locks_start)?;
        let new_floor = {
            let mut guest = self.guest.lock().unwrap_or_else(PoisonError::into_inner);
            rules::restored_floor(
                &mut guest,
                floor_value(floor.as_ref())?,
                at_least,
                locks
                    .iter()
                    .map(|(name, state)| (name.as_bytes(), state.as_slice())),
            )?
        };
        // Only the floor is written, guarded by its own revision. A lock
        // written since the read got an epoch no higher than the old floor
        // or the epoch read for it, so still below the new floor; an acquire
        // that read the old floor and commits later loses its compare on
        // the floor key and decides again.
        let request = json!({
            "compare": [
                unchanged(&self.floor_key, floor.as_ref()),
                unchanged(&self.lineage_key, lineage.as_ref()),
            ],
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

/// What `read_all` returns: the revision read at, the lineage key, the
/// floor key, and every lock by name.
type Everything = (u64, Option<Entry>, Option<Entry>, Vec<(String, Vec<u8>)>);

/// How many lock states one import transaction writes: etcd refuses a
/// transaction of more than `--max-txn-ops` operations (default 128).
const IMPORT_BATCH: usize = 100;

impl EtcdCoordinator {
    /// One read of everything `migrate` needs, at one revision: the lineage,
    /// the floor and every lock.
    fn read_all(&self) -> Result<Everything, AuthorityError> {
        let locks_start = self.lock_prefix();
        let locks_end = prefix_end(&locks_start)?;
        let request = json!({
            "success": [
                range_op(&self.lineage_key),
                range_op(&self.floor_key),
                range_all_op(&locks_start, &locks_end),
            ],
        });
        let response = self
            .gateway
            .post("/v3/kv/txn", &request, Delivery::Repeatable)?;
        let txn: TxnResponse = parse(response, "read txn")?;
        if !txn.succeeded || txn.header.revision == 0 {
            return Err(etcd_error("a read-only transaction reported failure"));
        }
        let revision = txn.header.revision;
        let [lineage, floor, locks] = <[OpResponse; 3]>::try_from(txn.responses)
            .map_err(|r| etcd_error(format!("expected 3 range responses, got {}", r.len())))?;
        Ok((
            revision,
            single(lineage, &self.lineage_key)?,
            single(floor, &self.floor_key)?,
            lock_range(locks, &locks_start)?,
        ))
    }

    /// Post a write transaction: the revision it committed at, `None` if
    /// its compare failed.
    fn write(&self, request: &serde_json::Value) -> Result<Option<u64>, AuthorityError> {
        let response = self
            .gateway
            .post("/v3/kv/txn", request, Delivery::AtMostOnce)?;
        let txn: TxnResponse = parse(response, "write txn (its outcome is unknown)")?;
        Ok(txn.succeeded.then_some(txn.header.revision))
    }
}

/// An etcd prefix as a migration reaches it: connected for each step,
/// without a lineage bound, so a look changes nothing.
pub(crate) struct EtcdStore {
    options: EtcdOptions,
    runtime: Runtime,
}

impl EtcdStore {
    pub(crate) fn new(options: EtcdOptions, runtime: Runtime) -> Self {
        Self { options, runtime }
    }
}

impl LineageStore for EtcdStore {
    /// The cluster id and key prefix, not the members listed.
    fn identity(&self) -> Result<String, AuthorityError> {
        identity(self.options.clone())
    }

    fn peek(&self) -> Result<Peek, AuthorityError> {
        peek(self.options.clone(), &self.runtime)
    }

    fn seal(&self, target: &str, at_least: u64) -> Result<Export, AuthorityError> {
        seal(self.options.clone(), target, &self.runtime, at_least)
    }

    fn import(
        &self,
        export: &Export,
        step: &mut dyn FnMut(MigrationStep),
    ) -> Result<Imported, AuthorityError> {
        import(self.options.clone(), export, &self.runtime, step)
    }
}

/// The cluster and key prefix `options` reach, as a seal records them.
fn identity(options: EtcdOptions) -> Result<String, AuthorityError> {
    let prefix = options.prefix.clone();
    let gateway = Gateway::connect(options.access())?;
    Ok(format!(
        "etcd:cluster={:x}/prefix={prefix}",
        gateway.cluster()
    ))
}

/// The lineage and whether there is state, changing nothing.
fn peek(options: EtcdOptions, runtime: &Runtime) -> Result<Peek, AuthorityError> {
    let store = EtcdCoordinator::unbound(options, runtime.clone(), Arc::new(crate::SystemClock))?;
    let (_, lineage, floor, locks) = store.read_all()?;
    Ok(Peek {
        held: lineage.map(|e| parse_lineage(&e.value)).transpose()?,
        has_state: floor.is_some() || !locks.is_empty(),
        legacy: Some(store.gateway.cluster()),
    })
}

/// Seal the prefix `options` name for `target` and export it (see
/// `migrate`): one read at one revision, then one transaction that marks
/// the lineage key moved only if the lineage, the floor and every lock key
/// are as read, so no decision can slip between the read and the seal.
fn seal(
    options: EtcdOptions,
    target: &str,
    runtime: &Runtime,
    at_least: u64,
) -> Result<Export, AuthorityError> {
    let attempts = options.max_attempts;
    let store = EtcdCoordinator::unbound(options, runtime.clone(), Arc::new(crate::SystemClock))?;
    for _ in 0..attempts {
        let (revision, lineage, floor, locks) = store.read_all()?;
        let held = lineage
            .as_ref()
            .map(|e| parse_lineage(&e.value))
            .transpose()?;
        let id = match held {
            // Coordinators from before lineages used the cluster id.
            None if !locks.is_empty() || floor.is_some() => store.gateway.cluster(),
            None => {
                return Err(AuthorityError::MigrationRefused(
                    "the source has no lineage: no coordinator ever used it".into(),
                ));
            }
            Some(Lineage::Live(l)) => l,
            Some(Lineage::Moved(l, to)) if to == target => l,
            Some(Lineage::Moved(_, to)) => {
                return Err(AuthorityError::MigrationRefused(format!(
                    "the source was already moved to {to}"
                )));
            }
            Some(Lineage::Importing(_)) => {
                return Err(AuthorityError::MigrationRefused(
                    "a migration into the source has not finished".into(),
                ));
            }
        };
        // Checked before the seal: a damaged state refuses the migration
        // and leaves the source granting.
        let export = {
            let mut guest = store.guest.lock().unwrap_or_else(PoisonError::into_inner);
            Export::checked(
                &mut guest,
                id,
                floor_value(floor.as_ref())?,
                at_least,
                locks,
            )?
        };
        let sealed = format!("{id} moved-to {target}");
        if lineage
            .as_ref()
            .is_some_and(|e| e.value == sealed.as_bytes())
        {
            return Ok(export);
        }
        let locks_start = store.lock_prefix();
        let request = json!({
            "compare": [
                unchanged(&store.lineage_key, lineage.as_ref()),
                unchanged(&store.floor_key, floor.as_ref()),
                range_unchanged_since(&locks_start, &prefix_end(&locks_start)?, revision),
            ],
            "success": [put_op(&store.lineage_key, sealed.as_bytes())],
        });
        if store.write(&request)?.is_some() {
            return Ok(export);
        }
    }
    Err(AuthorityError::Contention {
        lock: String::from_utf8_lossy(&store.lineage_key).into_owned(),
        attempts,
    })
}

/// Import `export` under the prefix `options` name. One etcd transaction
/// holds at most `IMPORT_BATCH` locks, so the import is a marked sequence:
/// mark the lineage key `importing` (and clear any locks), write the locks
/// in batches, then write the floor and mark the lineage live. Until the
/// last step every decision refuses ([`AuthorityError::MigrationIncomplete`]);
/// a re-run after a crash finds the mark and starts the sequence over.
fn import(
    options: EtcdOptions,
    export: &Export,
    runtime: &Runtime,
    step: &mut dyn FnMut(MigrationStep),
) -> Result<Imported, AuthorityError> {
    let store = EtcdCoordinator::unbound(options, runtime.clone(), Arc::new(crate::SystemClock))?;
    let (_, lineage, floor, locks) = store.read_all()?;
    let held = lineage
        .as_ref()
        .map(|e| parse_lineage(&e.value))
        .transpose()?;
    let has_state = floor.is_some() || !locks.is_empty();
    let own_floor = floor_value(floor.as_ref())?;
    if target_verdict(held.as_ref(), has_state, export.lineage)?.is_some() {
        return Ok(Imported::Already { floor: own_floor });
    }
    // A sealed store moved back to: above its own floor as well.
    let new_floor = match held {
        Some(Lineage::Moved(..)) => export.floor.max(
            own_floor
                .checked_add(1)
                .ok_or(fencecheck::LeaseError::Exhausted)?,
        ),
        _ => export.floor,
    };
    let importing = format!("{} importing", export.lineage);
    let locks_start = store.lock_prefix();
    let locks_end = prefix_end(&locks_start)?;
    let request = json!({
        "compare": [unchanged(&store.lineage_key, lineage.as_ref())],
        "success": [
            put_op(&store.lineage_key, importing.as_bytes()),
            delete_range_op(&locks_start, &locks_end),
        ],
    });
    let Some(revision) = store.write(&request)? else {
        return Err(AuthorityError::MigrationRefused(
            "the target changed while the migration read it; re-run the migration".into(),
        ));
    };
    // Every later step holds only while the mark is the one just written:
    // another run starting over rewrites it and this one stops.
    let marked = Some(Entry {
        value: importing.into_bytes(),
        mod_revision: revision,
    });
    for (n, batch) in export.locks.chunks(IMPORT_BATCH).enumerate() {
        let puts: Vec<_> = batch
            .iter()
            .map(|(lock, state)| put_op(&store.lock_key(lock), state))
            .collect();
        let request = json!({
            "compare": [unchanged(&store.lineage_key, marked.as_ref())],
            "success": puts,
        });
        if store.write(&request)?.is_none() {
            return Err(AuthorityError::MigrationRefused(
                "another migration into the target started; let it finish".into(),
            ));
        }
        if n == 0 {
            step(MigrationStep::Importing);
        }
    }
    if export.locks.is_empty() {
        step(MigrationStep::Importing);
    }
    let request = json!({
        "compare": [unchanged(&store.lineage_key, marked.as_ref())],
        "success": [
            put_op(&store.floor_key, new_floor.to_string().as_bytes()),
            put_op(&store.lineage_key, export.lineage.to_string().as_bytes()),
        ],
    });
    if store.write(&request)?.is_none() {
        return Err(AuthorityError::MigrationRefused(
            "another migration into the target started; let it finish".into(),
        ));
    }
    Ok(Imported::Done { floor: new_floor })
}

/// A lineage value: `L`, `L importing` or `L moved-to STORE`, with `L` a
/// canonical decimal u64.
fn parse_lineage(value: &[u8]) -> Result<Lineage, AuthorityError> {
    let corrupt = || {
        etcd_error(format!(
            "the lineage key holds {:?}, not `ID`, `ID importing` or `ID moved-to STORE`",
            excerpt(value)
        ))
    };
    let text = std::str::from_utf8(value).map_err(|_| corrupt())?;
    let (id, rest) = match text.split_once(' ') {
        Some((_, "")) => return Err(corrupt()),
        Some(parts) => parts,
        None => (text, ""),
    };
    let id = id
        .parse::<u64>()
        .ok()
        .filter(|v| v.to_string() == id && *v != 0)
        .ok_or_else(corrupt)?;
    match rest {
        "" => Ok(Lineage::Live(id)),
        "importing" => Ok(Lineage::Importing(id)),
        _ => match rest.strip_prefix("moved-to ") {
            Some(to) if !to.is_empty() => Ok(Lineage::Moved(id, to.to_owned())),
            _ => Err(corrupt()),
        },
    }
}

/// Every lock in a range response over `<prefix>lock/`, by name.
fn lock_range(
    response: OpResponse,
    locks_start: &[u8],
) -> Result<Vec<(String, Vec<u8>)>, AuthorityError> {
    let OpResponse::Range(locks) = response else {
        return Err(etcd_error("expected a range response for the locks"));
    };
    if locks.more || locks.count != locks.kvs.len() as u64 {
        return Err(etcd_error(format!(
            "the lock range was cut short ({} of {} keys)",
            locks.kvs.len(),
            locks.count
        )));
    }
    locks
        .kvs
        .iter()
        .map(|kv| {
            let kv = Kv::decode(kv)?;
            let name = kv
                .key
                .strip_prefix(locks_start)
                .ok_or_else(|| etcd_error("the lock range returned a key outside it"))?;
            let name = String::from_utf8(name.to_vec())
                .map_err(|_| etcd_error("a lock key is not UTF-8"))?;
            Ok((name, kv.value))
        })
        .collect()
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
    fn lineage_values_parse_strictly() {
        assert_eq!(parse_lineage(b"42").ok(), Some(Lineage::Live(42)));
        assert_eq!(
            parse_lineage(b"42 importing").ok(),
            Some(Lineage::Importing(42))
        );
        assert_eq!(
            parse_lineage(b"42 moved-to sqlite:/x").ok(),
            Some(Lineage::Moved(42, "sqlite:/x".into()))
        );
        for bad in [
            &b""[..],
            b"0",
            b"042",
            b"42 ",
            b"42 moved-to ",
            b"42 gone",
            b"x",
        ] {
            assert!(parse_lineage(bad).is_err(), "{bad:?}");
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
