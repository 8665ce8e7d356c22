//! The wasmtime embedding: one shared [`Runtime`] per process (engine,
//! compiled component, pre-instantiation, limits), from which each thread
//! takes its own [`crate::Instance`].

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use wasmtime::component::{Component, Linker};
use wasmtime::{Engine, InstanceAllocationStrategy, Module, PoolingAllocationConfig, Store};
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

use crate::core::{CoreGuest, CoreModule};
use crate::{Error, Instance};

/// The component built from `guest/` by this crate's build script.
pub static COMPONENT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/fencecheck.wasm"));

/// Machine code for a component, made ahead of time by wasmtime
/// (`Engine::precompile_component` and `precompile_module` for its core
/// module), and the SHA-256 that binds both artifacts to the component bytes.
/// Not part of the stable API: public so that tests can hand a runtime a
/// damaged or mismatched artifact.
#[doc(hidden)]
#[derive(Clone, Copy, Debug)]
pub struct Precompiled<'a> {
    /// `precompile_component` of the component.
    pub component: &'a [u8],
    /// `precompile_module` of the component's only core module.
    pub core: &'a [u8],
    /// SHA-256 over (length as u64 LE, bytes) of the component, then of
    /// `component`, then of `core`.
    pub sha256: [u8; 32],
}

/// [`COMPONENT`] precompiled by this crate's build script for the machine
/// kind that built it, under the runtime's engine configuration.
#[doc(hidden)]
pub static PRECOMPILED: Precompiled<'static> = Precompiled {
    component: include_bytes!(concat!(env!("OUT_DIR"), "/fencecheck.cwasm")),
    core: include_bytes!(concat!(env!("OUT_DIR"), "/fencecheck-core.cwasm")),
    sha256: *include_bytes!(concat!(env!("OUT_DIR"), "/fencecheck.cwasm.sha256")),
};

/// Where a runtime's machine code came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loaded {
    /// Deserialized from the artifacts built with this crate: no compile in
    /// this process.
    Precompiled,
    /// Compiled by Cranelift when the runtime was created: another component,
    /// or the embedded artifacts did not match this machine, this wasmtime's
    /// configuration, or their checksum.
    Compiled,
}

/// The documented bound on the embedded guest's cost: every call consumes
/// at most `FUEL_BOUND_BASE + FUEL_BOUND_PER_BYTE × input bytes` fuel (about
/// one unit per wasm instruction), where the input bytes are what the call
/// carries into the guest (states, scopes, op-ids, lease ids, keys and
/// signatures; for a packed batch, the batch). This linear bound, with
/// [`Limits::call_bytes`] on the input, is why the embedded component runs
/// without fuel; the fuzz target `fuel_bound` asserts it for every export,
/// so a change that makes a call superlinear fails CI. Measured
/// (`cargo test -p fencecheck-tests --test integration component::worst_case -- --nocapture`):
/// the costliest bytes are a packed batch of the smallest signed items, one
/// HMAC-SHA256 (~31,000 fuel) per 94-byte item, ~330 per byte; a 1 MiB
/// non-ASCII scope costs ~20 per byte to validate, a full-window check
/// ~14. The largest single call of small input is a signed check
/// (~170,000 with the longest scope, lease id and a full window).
pub const FUEL_BOUND_BASE: u64 = 200_000;
/// See [`FUEL_BOUND_BASE`]: ~330 measured at most, with a margin.
pub const FUEL_BOUND_PER_BYTE: u64 = 400;

/// Bounds on every instance of a [`Runtime`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Fuel granted to each `check` (and to each item of a batch) when the
    /// runtime is metered ([`Runtime::metered`]: any component but the
    /// embedded one). One check costs a few thousand units; the bound stops
    /// a runaway guest, not a normal one. The embedded component runs
    /// without fuel: each of its calls does work linear in its input
    /// (docs/design.md §7, held by the fuzz target `fuel_bound`), and the
    /// input is bounded by `call_bytes`.
    pub fuel_per_check: u64,
    /// Fuel granted per byte of a call's input on top of `fuel_per_check`
    /// (metered runtimes only), so that a long input that stays within the
    /// documented cost bound never runs out: [`FUEL_BOUND_PER_BYTE`] by
    /// default.
    pub fuel_per_input_byte: u64,
    /// Largest linear memory an instance may grow to, in bytes.
    pub memory_bytes: usize,
    /// Largest total input (states, scopes, op-ids) one call may carry; larger
    /// calls are refused with [`Error::TooLarge`] before reaching the guest.
    pub call_bytes: usize,
    /// How instance memory is reserved.
    pub allocation: Allocation,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            fuel_per_check: 10_000_000,
            fuel_per_input_byte: FUEL_BOUND_PER_BYTE,
            memory_bytes: 64 << 20,
            call_bytes: 16 << 20,
            allocation: Allocation::OnDemand,
        }
    }
}

/// How the linear memories of instances are reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Each instance maps its own memory when it is created (the default): a
    /// process reserves address space only for the instances it makes. Costs
    /// a few `mmap`s per instantiation, which happens once per thread or
    /// connection, never per check.
    OnDemand,
    /// A pool for up to `instances` instances at once, reserved when the
    /// runtime is created. Instantiation is cheaper, but every slot reserves
    /// its memory's address space up front (BENCHMARKS.md, "Memory"), so use
    /// it only for a process that really runs that many.
    Pooling {
        /// Instances that may exist at once across the process.
        instances: u32,
    },
}

/// How `check`, `check_batch` and `check_packed_raw` reach the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `check-packed` called on the component's only core module, with the
    /// canonical ABI done by this crate (one copy each way, three core calls):
    /// several times cheaper per call than the component API on wasmtime 48.
    /// Used whenever the component has the shape for it (checked at load).
    Core,
    /// The component API for every call.
    Component,
}

pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) pre: wasmtime::component::InstancePre<Limiter>,
    pub(crate) indices: crate::abi::Indices,
    pub(crate) core: Option<CoreModule>,
    pub(crate) limits: Limits,
    pub(crate) loaded: Loaded,
    /// Fuel metering on (every component but the embedded one).
    pub(crate) metered: bool,
    /// The component's WIT package version (vetted at load).
    pub(crate) version: String,
}

/// The loaded component: one per process, shared by every thread.
///
/// Holds the engine (fuel-metered unless the component is the embedded
/// one), the compiled component, its
/// pre-instantiation and, when the component has the shape for it, its
/// compiled core module for the fast [`Transport::Core`]. Cloning is cheap.
#[derive(Clone)]
pub struct Runtime {
    pub(crate) shared: Arc<Shared>,
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
    /// test, or one shipped separately). Always metered: a file is not the
    /// component this crate was built and tested with, even when its bytes
    /// happen to be.
    pub fn from_file(path: &Path, limits: Limits) -> Result<Self, Error> {
        let bytes = std::fs::read(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes_metered(&bytes, limits)
    }

    /// Load component bytes with the given limits. The embedded component
    /// ([`COMPONENT`]) is loaded from its precompiled artifacts when they fit
    /// this machine, and runs without fuel; any other bytes are compiled and
    /// metered ([`Limits::fuel_per_check`]).
    pub fn from_bytes(bytes: &[u8], limits: Limits) -> Result<Self, Error> {
        if bytes == COMPONENT {
            return Self::load(bytes, Some(&PRECOMPILED), limits, false);
        }
        Self::load(bytes, None, limits, true)
    }

    /// Load component bytes under fuel metering whatever they are, the
    /// embedded component included (compiled, not precompiled: the embedded
    /// artifacts are unmetered machine code). For measuring the guest's
    /// cost ([`Instance::last_fuel`]) and for tests of the fuel bound.
    pub fn from_bytes_metered(bytes: &[u8], limits: Limits) -> Result<Self, Error> {
        Self::load(bytes, None, limits, true)
    }

    /// Load `bytes` using `precompiled` if it is theirs and fits this engine,
    /// else compile them. Not part of the stable API (tests use it).
    #[doc(hidden)]
    pub fn from_precompiled(
        bytes: &[u8],
        precompiled: &Precompiled<'_>,
        limits: Limits,
    ) -> Result<Self, Error> {
        Self::load(bytes, Some(precompiled), limits, bytes != COMPONENT)
    }

    fn load(
        bytes: &[u8],
        precompiled: Option<&Precompiled<'_>>,
        limits: Limits,
        metered: bool,
    ) -> Result<Self, Error> {
        let load = |e: wasmtime::Error| Error::Load(format!("{e:#}"));
        let mut config = crate::engine::config(metered);
        if let Allocation::Pooling { instances } = limits.allocation {
            // An instance may hold a core instantiation and a component one
            // (made on first use of an export the core transport lacks).
            let instances = instances.max(1);
            let mut pool = PoolingAllocationConfig::default();
            pool.total_component_instances(instances)
                .total_core_instances(instances.saturating_mul(2))
                .total_memories(instances.saturating_mul(2))
                .total_tables(instances.saturating_mul(2))
                .max_memory_size(limits.memory_bytes);
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        // Another version is refused before any compile (as the component
        // declares its exports); wasmtime's own view is vetted below.
        if let Some(declared) = crate::version::declared_exports(bytes) {
            crate::version::vet(declared.iter().map(String::as_str))?;
        }
        let engine = Engine::new(&config).map_err(load)?;
        let (component, core, loaded) =
            match precompiled.and_then(|p| deserialize(&engine, bytes, p)) {
                Some((component, core)) => (component, Some(core), Loaded::Precompiled),
                None => (
                    Component::from_binary(&engine, bytes).map_err(load)?,
                    None,
                    Loaded::Compiled,
                ),
            };
        // Refuse a component with another contract before anything else
        // looks inside it, whichever way its machine code came.
        let ty = component.component_type();
        let exports: Vec<String> = ty.exports(&engine).map(|(n, _)| n.to_string()).collect();
        let vetted = crate::version::vet(exports.iter().map(String::as_str))?;
        let core = match core {
            Some(module) => CoreModule::checked(module, &vetted.check_interface),
            None => CoreModule::find(&engine, bytes, &vetted.check_interface)?,
        };
        // The component imports nothing, so the linker stays empty: any import
        // would make this fail rather than be satisfied by accident.
        let linker = Linker::<Limiter>::new(&engine);
        let instance_pre = linker.instantiate_pre(&component).map_err(load)?;
        let indices = crate::abi::Indices::new(&instance_pre).map_err(load)?;
        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                pre: instance_pre,
                indices,
                core,
                limits,
                loaded,
                metered,
                version: vetted.version,
            }),
        })
    }

    /// The WIT package version of the loaded component, e.g. `0.1.0`: the
    /// version in its export names (`fencecheck:fence/check@0.1.0`), which
    /// [`crate::WIT_VERSION`] (what this crate was built against) accepts.
    pub fn component_version(&self) -> &str {
        &self.shared.version
    }

    /// Whether the loaded component has signed tokens (its
    /// `fencecheck:fence/auth` interface, new in 0.1.1). Without it
    /// [`crate::Instance::check_signed`] and [`crate::Instance::sign`] return
    /// [`Error::Unsupported`]; every other call works as before.
    pub fn supports_signing(&self) -> bool {
        self.shared.indices.has_auth()
    }

    /// Whether this runtime's machine code was precompiled or compiled when
    /// it was created.
    pub fn loaded(&self) -> Loaded {
        self.shared.loaded
    }

    /// The same runtime with [`Transport::Component`] for every call (for
    /// comparing the transports; the decisions are the same).
    pub fn with_component_transport(&self) -> Self {
        let shared = &self.shared;
        Self {
            shared: Arc::new(Shared {
                engine: shared.engine.clone(),
                pre: shared.pre.clone(),
                indices: shared.indices.clone(),
                core: None,
                limits: shared.limits,
                loaded: shared.loaded,
                metered: shared.metered,
                version: shared.version.clone(),
            }),
        }
    }

    /// How checks reach the guest in this runtime's instances.
    pub fn transport(&self) -> Transport {
        if self.shared.core.is_some() {
            Transport::Core
        } else {
            Transport::Component
        }
    }

    /// A fresh instance for this thread or connection.
    pub fn instance(&self) -> Result<Instance, Error> {
        Instance::new(self.clone())
    }

    /// Whether calls run under fuel metering: `false` only for the embedded
    /// component ([`Runtime::new`], or [`Runtime::from_bytes`] of
    /// [`COMPONENT`]), whose calls are bounded by their input.
    pub fn metered(&self) -> bool {
        self.shared.metered
    }

    /// The limits every instance runs under.
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    /// A store with this runtime's memory limit (and a fuel budget if metered).
    fn store(&self) -> Result<Store<Limiter>, Error> {
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
        if shared.metered {
            store
                .set_fuel(shared.limits.fuel_per_check)
                .map_err(|e| Error::Instantiate(format!("{e:#}")))?;
        }
        Ok(store)
    }

    /// A component instantiation in a store of its own.
    pub(crate) fn instantiate(&self) -> Result<(Store<Limiter>, crate::abi::Bindings), Error> {
        let mut store = self.store()?;
        let failed = |e: wasmtime::Error| Error::Instantiate(format!("{e:#}"));
        let instance = self.shared.pre.instantiate(&mut store).map_err(failed)?;
        let bindings = self
            .shared
            .indices
            .load(&mut store, &instance)
            .map_err(failed)?;
        Ok((store, bindings))
    }

    /// A core instantiation for [`Transport::Core`], if this runtime uses it.
    pub(crate) fn core_guest(&self) -> Result<Option<CoreGuest>, Error> {
        let Some(module) = &self.shared.core else {
            return Ok(None);
        };
        CoreGuest::new(module, self.store()?, self.shared.metered)
            .map(Some)
            .map_err(|e| Error::Instantiate(format!("{e:#}")))
    }
}

/// The precompiled component and core module, if `precompiled` was made from
/// `bytes` (checksum), is intact, and wasmtime accepts it for `engine`; else
/// `None` and the caller compiles.
fn deserialize(
    engine: &Engine,
    bytes: &[u8],
    precompiled: &Precompiled<'_>,
) -> Option<(Component, Module)> {
    if precompiled.component.is_empty() || precompiled.core.is_empty() {
        return None;
    }
    let mut digest = Sha256::new();
    for part in [bytes, precompiled.component, precompiled.core] {
        digest.update((part.len() as u64).to_le_bytes());
        digest.update(part);
    }
    if digest.finalize().as_slice() != precompiled.sha256.as_slice() {
        return None;
    }
    // SAFETY: deserializing runs the bytes as machine code. These were made
    // by wasmtime's own precompile from exactly `bytes` (the SHA-256 above,
    // written by build.rs next to the artifacts, binds them and detects any
    // damage since), and wasmtime checks that its version, this engine's
    // configuration and the CPU's features match what they were compiled
    // for, refusing them otherwise.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(engine, precompiled.component) }.ok()?;
    // SAFETY: as above, for the core module's artifact.
    #[allow(unsafe_code)]
    let module = unsafe { Module::deserialize(engine, precompiled.core) }.ok()?;
    Some((component, module))
}

/// Store data: only the memory limiter.
pub(crate) struct Limiter(StoreLimits);

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
