//! The wasmtime embedding: one shared [`Runtime`] per process (engine,
//! compiled component, pre-instantiation, limits), from which each thread
//! takes its own [`crate::Instance`].

use std::path::Path;
use std::sync::Arc;

use wasmtime::component::{Component, Linker};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime::{ResourceLimiter, StoreLimits, StoreLimitsBuilder};

use crate::abi::wit;
use crate::{Error, Instance};

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

pub(crate) struct Shared {
    pub(crate) engine: Engine,
    pub(crate) pre: wit::FencecheckPre<Limiter>,
    pub(crate) limits: Limits,
}

/// The loaded component: one per process, shared by every thread.
///
/// Holds the engine (with a pooling allocator and fuel metering), the compiled
/// component and its pre-instantiation. Cloning is cheap.
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
        Instance::new(self.clone())
    }

    /// The limits every instance runs under.
    pub fn limits(&self) -> Limits {
        self.shared.limits
    }

    pub(crate) fn instantiate(&self) -> Result<(Store<Limiter>, wit::Fencecheck), Error> {
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
