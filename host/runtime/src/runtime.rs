//! The wasmtime embedding: one shared [`Runtime`] per process, one [`Instance`]
//! per thread, and the [`Native`] reference behind the same [`Checker`] trait.

use std::path::Path;
use std::sync::Arc;

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

use crate::{
    Acquire, AcquireRequest, Holder, LeaseError, LeaseInfo, LeaseInvalidReason, Release,
    ReleaseRequest, Renew, RenewRequest,
};
use crate::{CheckError, Decision, Policy};
use crate::{Error, Outcome, Request, StateInfo, Token};

mod wit {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "fencecheck",
        // Export parameters borrow the caller's strings and bytes: no copy
        // on the host before they are lowered into the guest.
        ownership: Borrowing { duplicate_if_necessary: true },
    });
}

use wit::exports::fencecheck::fence::check as abi;
use wit::exports::fencecheck::fence::lease as lease_abi;
use wit::exports::fencecheck::fence::types::Token as AbiToken;

/// The component built from `guest/` by this crate's build script.
pub static COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fencecheck.wasm"));

/// Bounds on every instance of a [`Runtime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Fuel granted to each `check` (and to each item of a batch). One check
    /// costs a few thousand units; the bound stops a runaway guest, not a
    /// normal one.
    pub fuel_per_check: u64,
    /// Largest linear memory an instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Largest total input (states, scopes, op-ids) one call may carry; larger
    /// calls are refused with [`Error::TooLarge`] before reaching the guest.
    pub call_bytes: usize,
    /// Instances that may exist at once across the process (the pool size).
    pub instances: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            fuel_per_check: 10_000_000,
            memory_bytes: 64 << 20,
            call_bytes: 16 << 20,
            instances: 256,
        }
    }
}

struct Shared {
    engine: Engine,
    pre: wit::FencecheckPre<Limiter>,
    limits: Limits,
}

/// The loaded component: one per process, shared by every thread.
///
/// Holds the engine (with a pooling allocator and fuel metering), the compiled
/// component and its pre-instantiation. Cloning is cheap.
#[derive(Clone)]
pub struct Runtime {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("limits", &self.shared.limits)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Load the component embedded in this crate, with default [`Limits`].
    pub fn new() -> Result<Self, Error> {
        Self::from_bytes(COMPONENT, Limits::default())
    }

    /// The process-wide runtime over the embedded component with default
    /// [`Limits`], created on first use: the component is compiled once per
    /// process however many callers ask. A failed load is not cached.
    pub fn shared() -> Result<Self, Error> {
        static SHARED: std::sync::OnceLock<Runtime> = std::sync::OnceLock::new();
        if let Some(rt) = SHARED.get() {
            return Ok(rt.clone());
        }
        let rt = Self::new()?;
        Ok(SHARED.get_or_init(|| rt).clone())
    }

    /// Load a component file instead of the embedded one (e.g. a build under
    /// test, or one shipped separately).
    pub fn from_file(path: &Path, limits: Limits) -> Result<Self, Error> {
        let bytes = std::fs::read(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes, limits)
    }

    /// Load component bytes with the given limits.
    pub fn from_bytes(bytes: &[u8], limits: Limits) -> Result<Self, Error> {
        let load = |e: wasmtime::Error| Error::Load(format!("{e:#}"));
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(limits.instances)
            .total_core_instances(limits.instances)
            .total_memories(limits.instances)
            .total_tables(limits.instances)
            .max_memory_size(limits.memory_bytes);
        let mut config = Config::new();
        config
            .consume_fuel(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(load)?;
        let component = Component::from_binary(&engine, bytes).map_err(load)?;
        // The component imports nothing, so the linker stays empty: any import
        // would make this fail rather than be satisfied by accident.
        let linker = Linker::<Limiter>::new(&engine);
        let instance_pre = linker.instantiate_pre(&component).map_err(load)?;
        let pre = wit::FencecheckPre::new(instance_pre).map_err(load)?;
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                pre,
                limits,
            }),
        })
    }

    /// A fresh instance for this thread or connection.
    pub fn instance(&self) -> Result<Instance, Error> {
        let (store, bindings) = self.instantiate()?;
        Ok(Instance {
            runtime: self.clone(),
            store,
            bindings,
        })
    }

    /// The limits every instance runs under.
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    fn instantiate(&self) -> Result<(Store<Limiter>, wit::Fencecheck), Error> {
        let shared = &self.shared;
        let limiter = Limiter(
            StoreLimitsBuilder::new()
                .memory_size(shared.limits.memory_bytes)
                .instances(1)
                .trap_on_grow_failure(true)
                .build(),
        );
        let mut store = Store::new(&shared.engine, limiter);
        store.limiter(|l| l);
        store
            .set_fuel(shared.limits.fuel_per_check)
            .map_err(|e| Error::Instantiate(format!("{e:#}")))?;
        let bindings = shared
            .pre
            .instantiate(&mut store)
            .map_err(|e| Error::Instantiate(format!("{e:#}")))?;
        Ok((store, bindings))
    }
}

/// Store data: only the memory limiter.
struct Limiter(StoreLimits);

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.0.memory_growing(current, desired, maximum)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.0.table_growing(current, desired, maximum)
    }

    fn instances(&self) -> usize {
        self.0.instances()
    }
}

/// Anything that can make the fence decision: the wasm [`Instance`] or the
/// [`Native`] reference. The conformance runner and the tests drive both
/// through this trait.
pub trait Checker {
    /// Decide one request against a scope's state (`None`: never accepted a token).
    fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error>;

    /// Decide independent state/request pairs; results in input order, each
    /// exactly what [`Checker::check`] would return for that pair.
    fn check_batch(&mut self, items: &[(Option<&[u8]>, &Request)]) -> Result<Vec<Outcome>, Error>;

    /// Decode a stored state.
    fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error>;

    /// Lease authority: acquire a lock (see `wit/fence.wit`, interface `lease`).
    fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error>;

    /// Lease authority: renew the exact current lease.
    fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error>;

    /// Lease authority: release the exact current lease.
    fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error>;

    /// Lease authority: start the lock's next epoch; returns it and the new state.
    fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error>;

    /// Decode a stored lease state.
    fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error>;

    /// A short name for reports (`wasm`, `native`).
    fn runtime_name(&self) -> &'static str;
}

/// The native reference: the guest's source compiled into this process.
///
/// It never returns an infrastructure [`Error`]; it exists so that every wasm
/// decision can be compared against it, and as a baseline for benchmarks.
#[derive(Clone, Copy, Debug, Default)]
pub struct Native;

impl Checker for Native {
    fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error> {
        Ok(fencecheck_guest::check(state, request))
    }

    fn check_batch(&mut self, items: &[(Option<&[u8]>, &Request)]) -> Result<Vec<Outcome>, Error> {
        Ok(items
            .iter()
            .map(|(state, request)| fencecheck_guest::check(*state, request))
            .collect())
    }

    fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error> {
        Ok(fencecheck_guest::inspect(state))
    }

    fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error> {
        Ok(fencecheck_guest::acquire(state, request))
    }

    fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error> {
        Ok(fencecheck_guest::renew(state, request))
    }

    fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error> {
        Ok(fencecheck_guest::release(state, request))
    }

    fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error> {
        Ok(fencecheck_guest::restore(state))
    }

    fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error> {
        Ok(fencecheck_guest::inspect_lease(state))
    }

    fn runtime_name(&self) -> &'static str {
        "native"
    }
}

/// One instance of the component, for one thread or connection at a time.
///
/// Every call is bounded by fuel and by the instance's memory limit. If the
/// guest traps, the call returns [`Error::Trapped`], nothing was decided, and
/// the instance is replaced before the next call.
pub struct Instance {
    runtime: Runtime,
    store: Store<Limiter>,
    bindings: wit::Fencecheck,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance").finish_non_exhaustive()
    }
}

impl Instance {
    /// Decide one request; see [`Checker::check`].
    pub fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error> {
        const CALL: &str = "check";
        self.bound(CALL, request_bytes(state, request))?;
        let abi_request = request_out(request);
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check()
                .call_check(store, state, abi_request)
        })?;
        Ok(outcome_in(result))
    }

    /// Decide many independent pairs in one crossing; see [`Checker::check_batch`].
    ///
    /// Uses the component's `check-packed` export: the batch crosses as one
    /// byte buffer each way, which costs far less per item than the typed
    /// `check-batch` (see BENCHMARKS.md). The outcomes are identical.
    pub fn check_batch(
        &mut self,
        items: &[(Option<&[u8]>, &Request)],
    ) -> Result<Vec<Outcome>, Error> {
        const CALL: &str = "check-packed";
        let packed = crate::packed::encode(items).ok_or(Error::TooLarge {
            call: CALL,
            bytes: usize::MAX,
            limit: self.runtime.shared.limits.call_bytes,
        })?;
        self.bound(CALL, packed.len())?;
        let fuel = self.batch_fuel(items.len());
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check().call_check_packed(store, &packed)
        })?;
        let output = result.map_err(|abi::BatchError::Malformed| Error::Protocol {
            call: CALL,
            message: "the guest refused the host's encoding as malformed".into(),
        })?;
        crate::packed::decode(&output, items.len()).map_err(|message| Error::Protocol {
            call: CALL,
            message,
        })
    }

    /// Send an already-packed batch to `check-packed` and return the guest's
    /// packed outcomes as they are (format: `wit/fence.wit`). For hosts and
    /// tests that do their own encoding; most callers want [`Instance::check_batch`].
    pub fn check_packed_raw(
        &mut self,
        batch: &[u8],
    ) -> Result<Result<Vec<u8>, crate::BatchError>, Error> {
        const CALL: &str = "check-packed";
        self.bound(CALL, batch.len())?;
        // A raw batch may hold up to len / 29 items; fuel for that many.
        let fuel = self.batch_fuel(batch.len() / 29);
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check().call_check_packed(store, batch)
        })?;
        Ok(result.map_err(|abi::BatchError::Malformed| crate::BatchError::Malformed))
    }

    /// [`Instance::check_batch`] through the typed `check-batch` export (a
    /// `list<batch-item>` each way), kept for comparison in tests and benches.
    pub fn check_batch_typed(
        &mut self,
        items: &[(Option<&[u8]>, &Request)],
    ) -> Result<Vec<Outcome>, Error> {
        const CALL: &str = "check-batch";
        let bytes = items
            .iter()
            .map(|(s, r)| request_bytes(*s, r))
            .fold(0usize, usize::saturating_add);
        self.bound(CALL, bytes)?;
        let abi_items: Vec<abi::BatchItem> = items
            .iter()
            .map(|(state, request)| abi::BatchItem {
                state: *state,
                request: request_out(request),
            })
            .collect();
        let fuel = self.batch_fuel(items.len());
        let results = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check()
                .call_check_batch(store, &abi_items)
        })?;
        if results.len() != items.len() {
            // A guest bug, not a decision: refuse to guess which result is whose.
            return Err(Error::Protocol {
                call: CALL,
                message: format!(
                    "returned {} results for {} items",
                    results.len(),
                    items.len()
                ),
            });
        }
        Ok(results.into_iter().map(outcome_in).collect())
    }

    fn batch_fuel(&self, items: usize) -> u64 {
        let count = u64::try_from(items.max(1)).unwrap_or(u64::MAX);
        self.runtime
            .shared
            .limits
            .fuel_per_check
            .saturating_mul(count)
    }

    /// Decode a stored state; see [`Checker::inspect`].
    pub fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error> {
        const CALL: &str = "inspect";
        self.bound(CALL, state.len())?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_check().call_inspect(store, state)
        })?;
        Ok(result.map(info_in).map_err(error_in))
    }

    /// Acquire a lock; see [`Checker::acquire`].
    pub fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error> {
        const CALL: &str = "acquire";
        let bytes = state
            .map_or(0, <[u8]>::len)
            .saturating_add(request.lock.len())
            .saturating_add(request.lease_id.len());
        self.bound(CALL, bytes)?;
        let abi_request = lease_abi::AcquireRequest {
            lock: &request.lock,
            lease_id: &request.lease_id,
            authority: request.authority,
            epoch_floor: request.epoch_floor,
            now: request.now,
            ttl: request.ttl,
        };
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease()
                .call_acquire(store, state, abi_request)
        })?;
        Ok(match result {
            Ok(lease_abi::AcquireOutcome::Acquired(a)) => Ok(Acquire::Acquired {
                token: token_in(a.token),
                expires_at: a.expires_at,
                state: a.state,
            }),
            Ok(lease_abi::AcquireOutcome::Busy(b)) => Ok(Acquire::Busy {
                holder: b.holder,
                expires_at: b.expires_at,
            }),
            Err(e) => Err(lease_error_in(e)),
        })
    }

    /// Renew the exact current lease; see [`Checker::renew`].
    pub fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error> {
        const CALL: &str = "renew";
        let bytes = state
            .map_or(0, <[u8]>::len)
            .saturating_add(request.lease_id.len());
        self.bound(CALL, bytes)?;
        let abi_request = lease_abi::RenewRequest {
            lease_id: &request.lease_id,
            token: token_out(request.token),
            now: request.now,
            ttl: request.ttl,
        };
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease()
                .call_renew(store, state, abi_request)
        })?;
        Ok(match result {
            Ok(lease_abi::RenewOutcome::Renewed(r)) => Ok(Renew::Renewed {
                expires_at: r.expires_at,
                state: r.state,
            }),
            Ok(lease_abi::RenewOutcome::Lost) => Ok(Renew::Lost),
            Err(e) => Err(lease_error_in(e)),
        })
    }

    /// Release the exact current lease; see [`Checker::release`].
    pub fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error> {
        const CALL: &str = "release";
        let bytes = state
            .map_or(0, <[u8]>::len)
            .saturating_add(request.lease_id.len());
        self.bound(CALL, bytes)?;
        let abi_request = lease_abi::ReleaseRequest {
            lease_id: &request.lease_id,
            token: token_out(request.token),
        };
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease()
                .call_release(store, state, abi_request)
        })?;
        Ok(match result {
            Ok(lease_abi::ReleaseOutcome::Released(state)) => Ok(Release::Released { state }),
            Ok(lease_abi::ReleaseOutcome::NotOwner) => Ok(Release::NotOwner),
            Err(e) => Err(lease_error_in(e)),
        })
    }

    /// Start the lock's next epoch; see [`Checker::restore`].
    pub fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error> {
        const CALL: &str = "restore";
        self.bound(CALL, state.map_or(0, <[u8]>::len))?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease().call_restore(store, state)
        })?;
        Ok(result.map(|r| (r.epoch, r.state)).map_err(lease_error_in))
    }

    /// Decode a stored lease state; see [`Checker::inspect_lease`].
    pub fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error> {
        const CALL: &str = "lease.inspect";
        self.bound(CALL, state.len())?;
        let fuel = self.runtime.shared.limits.fuel_per_check;
        let result = self.call(CALL, fuel, |b, store| {
            b.fencecheck_fence_lease().call_inspect(store, state)
        })?;
        Ok(result
            .map(|i| LeaseInfo {
                format_version: i.format_version,
                lock: i.lock,
                authority: i.authority,
                epoch: i.epoch,
                counter: i.counter,
                holder: i.holder.map(|h| Holder {
                    lease_id: h.lease_id,
                    token: token_in(h.token),
                    expires_at: h.expires_at,
                }),
            })
            .map_err(lease_error_in))
    }

    fn bound(&self, call: &'static str, bytes: usize) -> Result<(), Error> {
        let limit = self.runtime.shared.limits.call_bytes;
        if bytes > limit {
            return Err(Error::TooLarge { call, bytes, limit });
        }
        Ok(())
    }

    /// Run one export with a fresh fuel budget; on a trap, replace the
    /// instance (its memory may be inconsistent) and report the trap.
    fn call<T>(
        &mut self,
        call: &'static str,
        fuel: u64,
        f: impl FnOnce(&wit::Fencecheck, &mut Store<Limiter>) -> wasmtime::Result<T>,
    ) -> Result<T, Error> {
        let trapped = |e: wasmtime::Error| Error::Trapped {
            call,
            message: format!("{e:#}"),
        };
        self.store.set_fuel(fuel).map_err(trapped)?;
        match f(&self.bindings, &mut self.store) {
            Ok(value) => Ok(value),
            Err(e) => {
                let error = trapped(e);
                let (store, bindings) = self.runtime.instantiate()?;
                self.store = store;
                self.bindings = bindings;
                Err(error)
            }
        }
    }
}

impl Checker for Instance {
    fn check(&mut self, state: Option<&[u8]>, request: &Request) -> Result<Outcome, Error> {
        Instance::check(self, state, request)
    }

    fn check_batch(&mut self, items: &[(Option<&[u8]>, &Request)]) -> Result<Vec<Outcome>, Error> {
        Instance::check_batch(self, items)
    }

    fn inspect(&mut self, state: &[u8]) -> Result<Result<StateInfo, CheckError>, Error> {
        Instance::inspect(self, state)
    }

    fn acquire(
        &mut self,
        state: Option<&[u8]>,
        request: &AcquireRequest,
    ) -> Result<Result<Acquire, LeaseError>, Error> {
        Instance::acquire(self, state, request)
    }

    fn renew(
        &mut self,
        state: Option<&[u8]>,
        request: &RenewRequest,
    ) -> Result<Result<Renew, LeaseError>, Error> {
        Instance::renew(self, state, request)
    }

    fn release(
        &mut self,
        state: Option<&[u8]>,
        request: &ReleaseRequest,
    ) -> Result<Result<Release, LeaseError>, Error> {
        Instance::release(self, state, request)
    }

    fn restore(
        &mut self,
        state: Option<&[u8]>,
    ) -> Result<Result<(u64, Vec<u8>), LeaseError>, Error> {
        Instance::restore(self, state)
    }

    fn inspect_lease(&mut self, state: &[u8]) -> Result<Result<LeaseInfo, LeaseError>, Error> {
        Instance::inspect_lease(self, state)
    }

    fn runtime_name(&self) -> &'static str {
        "wasm"
    }
}

fn request_bytes(state: Option<&[u8]>, request: &Request) -> usize {
    state
        .map_or(0, <[u8]>::len)
        .saturating_add(request.scope.len())
        .saturating_add(request.op_id.as_ref().map_or(0, String::len))
}

fn token_out(t: Token) -> AbiToken {
    AbiToken {
        authority: t.authority,
        epoch: t.epoch,
        counter: t.counter,
    }
}

fn token_in(t: AbiToken) -> Token {
    Token::new(t.authority, t.epoch, t.counter)
}

fn request_out(r: &Request) -> abi::Request<'_> {
    abi::Request {
        scope: &r.scope,
        token: token_out(r.token),
        policy: match r.policy {
            Policy::Strict => abi::Policy::Strict,
            Policy::AllowEqual => abi::Policy::AllowEqual,
        },
        op_id: r.op_id.as_deref(),
        expected_version: r.expected_version,
    }
}

fn outcome_in(r: Result<abi::Decision, abi::CheckError>) -> Outcome {
    match r {
        Ok(abi::Decision::Applied(a)) => Ok(Decision::Applied {
            version: a.version,
            highest: token_in(a.highest),
            state: a.state,
        }),
        Ok(abi::Decision::Duplicate(version)) => Ok(Decision::Duplicate { version }),
        Ok(abi::Decision::StaleFence(s)) => Ok(Decision::StaleFence {
            presented: token_in(s.presented),
            highest: token_in(s.highest),
        }),
        Ok(abi::Decision::VersionConflict(v)) => Ok(Decision::VersionConflict {
            expected: v.expected,
            actual: v.actual,
        }),
        Err(e) => Err(error_in(e)),
    }
}

fn error_in(e: abi::CheckError) -> CheckError {
    use crate::InvalidReason;
    match e {
        abi::CheckError::InvalidRequest(reason) => CheckError::InvalidRequest(match reason {
            abi::InvalidReason::MissingToken => InvalidReason::MissingToken,
            abi::InvalidReason::EmptyScope => InvalidReason::EmptyScope,
            abi::InvalidReason::ScopeTooLong => InvalidReason::ScopeTooLong,
            abi::InvalidReason::EmptyOpId => InvalidReason::EmptyOpId,
            abi::InvalidReason::OpIdTooLong => InvalidReason::OpIdTooLong,
            abi::InvalidReason::EqualTokenUnguarded => InvalidReason::EqualTokenUnguarded,
        }),
        abi::CheckError::CorruptState(c) => CheckError::CorruptState(corruption_in(c)),
        abi::CheckError::UnsupportedStateVersion(v) => CheckError::UnsupportedStateVersion(v),
        abi::CheckError::ScopeMismatch(s) => CheckError::ScopeMismatch(s),
        abi::CheckError::ForeignAuthority(f) => CheckError::ForeignAuthority {
            stored: f.stored,
            presented: f.presented,
        },
        abi::CheckError::Exhausted => CheckError::Exhausted,
    }
}

fn corruption_in(c: abi::Corruption) -> crate::Corruption {
    use crate::Corruption;
    match c {
        abi::Corruption::Truncated => Corruption::Truncated,
        abi::Corruption::LengthMismatch => Corruption::LengthMismatch,
        abi::Corruption::ChecksumMismatch => Corruption::ChecksumMismatch,
        abi::Corruption::Malformed => Corruption::Malformed,
    }
}

fn lease_error_in(e: lease_abi::LeaseError) -> LeaseError {
    use lease_abi::LeaseInvalidReason as R;
    match e {
        lease_abi::LeaseError::InvalidRequest(reason) => LeaseError::InvalidRequest(match reason {
            R::EmptyLock => LeaseInvalidReason::EmptyLock,
            R::LockTooLong => LeaseInvalidReason::LockTooLong,
            R::EmptyLeaseId => LeaseInvalidReason::EmptyLeaseId,
            R::LeaseIdTooLong => LeaseInvalidReason::LeaseIdTooLong,
            R::ZeroTtl => LeaseInvalidReason::ZeroTtl,
            R::ExpiryOverflow => LeaseInvalidReason::ExpiryOverflow,
            R::MissingToken => LeaseInvalidReason::MissingToken,
            R::NoState => LeaseInvalidReason::NoState,
        }),
        lease_abi::LeaseError::CorruptState(c) => LeaseError::CorruptState(corruption_in(c)),
        lease_abi::LeaseError::UnsupportedStateVersion(v) => LeaseError::UnsupportedStateVersion(v),
        lease_abi::LeaseError::LockMismatch(lock) => LeaseError::LockMismatch(lock),
        lease_abi::LeaseError::ForeignAuthority(f) => LeaseError::ForeignAuthority {
            stored: f.stored,
            presented: f.presented,
        },
        lease_abi::LeaseError::Exhausted => LeaseError::Exhausted,
    }
}

fn info_in(i: abi::StateInfo) -> StateInfo {
    StateInfo {
        format_version: i.format_version,
        scope: i.scope,
        authority: i.authority,
        highest: token_in(i.highest),
        version: i.version,
        window: i
            .window
            .into_iter()
            .map(|e| crate::WindowEntry {
                op_id: e.op_id,
                version: e.version,
            })
            .collect(),
    }
}
