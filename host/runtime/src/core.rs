//! The fast transport: `check-packed` called on the component's own core
//! module, with the canonical ABI of `func(list<u8>) -> result<list<u8>,
//! batch-error>` done here (as jco's glue does for Node and `_core.py` for
//! Python).
//!
//! Why: on wasmtime 48 a component-model call costs ~330 ns before the guest
//! runs (task bookkeeping, lifting and lowering each value through the
//! component's type information, resource-table scopes), while a typed call
//! into a core instance costs ~35 ns. A check needs three core calls
//! (`cabi_realloc` for the argument, the export, its post-return) and one copy
//! each way, and runs exactly the same guest code: the core module is the
//! component's only one, so every instruction the component would run is in
//! it. The decisions are those of the component API; `tests/properties.rs`
//! and the agreement trace compare both transports.
//!
//! A single check takes one call instead of three when the module also has
//! the guest's single-check exports (`fencecheck-one-input`,
//! `fencecheck-one`: guest/src/one.rs): the one-item batch is written into
//! the guest's static input buffer and the answer read from its static
//! output buffer, with no allocation that outlives the call and no
//! post-return. A module without them (an older component) takes the
//! three-call path for every check.
//!
//! Used only when the component has the shape wit-component gives an
//! import-free guest: exactly one core module anywhere in the binary,
//! importing nothing, and exporting `memory`, `cabi_realloc`
//! `(i32, i32, i32, i32) -> i32`, the check-packed function
//! `(i32, i32) -> i32` and its post-return `(i32) -> ()`. Otherwise
//! [`CoreModule::find`] returns `None` and the component API serves every
//! call. Every pointer and length the guest returns is bounds-checked.

use wasmtime::{Engine, ExternType, FuncType, Memory, Module, Store, TypedFunc, ValType};

use crate::Error;
use crate::runtime::Limiter;
use crate::shape::only_core_module;

/// The core export behind `check-packed`, and its post-return, for the
/// component's check interface (`fencecheck:fence/check@0.1.0`: the version
/// is the component's, vetted at load).
fn export(check_interface: &str) -> String {
    format!("{check_interface}#check-packed")
}
fn post_return(check_interface: &str) -> String {
    format!("cabi_post_{check_interface}#check-packed")
}

/// The guest's single-check exports (guest/src/one.rs).
const ONE_INPUT: &str = "fencecheck-one-input";
const ONE: &str = "fencecheck-one";

/// The component's core module, compiled and checked for the shape above.
#[derive(Clone)]
pub(crate) struct CoreModule {
    module: Module,
    /// The check interface's full name, which prefixes the export names.
    check_interface: String,
    /// Whether it has the single-check exports, with their exact types.
    one: bool,
}

impl CoreModule {
    /// The only core module of `component`, if it has the expected shape.
    /// `Ok(None)` means "use the component API"; an error means the module
    /// could not be compiled (the component would not load either).
    pub(crate) fn find(
        engine: &Engine,
        component: &[u8],
        check_interface: &str,
    ) -> Result<Option<Self>, Error> {
        let Some(bytes) = only_core_module(component) else {
            return Ok(None);
        };
        let module = Module::new(engine, bytes).map_err(|e| Error::Load(format!("{e:#}")))?;
        Ok(Self::checked(module, check_interface))
    }

    /// `module` if it imports nothing and exports what the transport calls.
    pub(crate) fn checked(module: Module, check_interface: &str) -> Option<Self> {
        if module.imports().len() != 0 {
            return None;
        }
        let func = |name: &str, params: &[ValType], results: &[ValType]| matches!(module.get_export(name), Some(ExternType::Func(f)) if signature(&f, params, results));
        const I32: ValType = ValType::I32;
        let shaped = matches!(module.get_export("memory"), Some(ExternType::Memory(_)))
            && func("cabi_realloc", &[I32, I32, I32, I32], &[I32])
            && func(&export(check_interface), &[I32, I32], &[I32])
            && func(&post_return(check_interface), &[I32], &[]);
        const I64: ValType = ValType::I64;
        let one = func(ONE_INPUT, &[], &[I64]) && func(ONE, &[I32], &[I64]);
        shaped.then(|| Self {
            module,
            check_interface: check_interface.to_string(),
            one,
        })
    }
}

fn signature(f: &FuncType, params: &[ValType], results: &[ValType]) -> bool {
    f.params().len() == params.len()
        && f.results().len() == results.len()
        && f.params().zip(params).all(|(a, b)| ValType::eq(&a, b))
        && f.results().zip(results).all(|(a, b)| ValType::eq(&a, b))
}

/// One instance of the core module in its own store.
pub(crate) struct CoreGuest {
    store: Store<Limiter>,
    memory: Memory,
    realloc: TypedFunc<(i32, i32, i32, i32), i32>,
    check: TypedFunc<(i32, i32), i32>,
    post: TypedFunc<i32, ()>,
    one: Option<One>,
    metered: bool,
    /// Fuel the last call consumed (metered stores only).
    last_fuel: Option<u64>,
}

/// The single-check export and where its input buffer is.
struct One {
    call: TypedFunc<i32, i64>,
    input: usize,
    capacity: usize,
}

/// Why a core call produced no answer. Either way the instance must be
/// discarded.
pub(crate) enum CoreError {
    /// The guest trapped (out of fuel, out of memory, a bug).
    Trap(wasmtime::Error),
    /// The guest's reply broke the canonical ABI (a pointer outside its
    /// memory, an unknown discriminant).
    Abi(String),
}

impl From<wasmtime::Error> for CoreError {
    fn from(e: wasmtime::Error) -> Self {
        CoreError::Trap(e)
    }
}

impl CoreGuest {
    pub(crate) fn new(
        module: &CoreModule,
        store: Store<Limiter>,
        metered: bool,
    ) -> wasmtime::Result<Self> {
        let mut store = store;
        let instance = wasmtime::Instance::new(&mut store, &module.module, &[])?;
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| wasmtime::Error::msg("the core module exports no memory"))?;
        let one = if module.one {
            let input = instance.get_typed_func::<(), i64>(&mut store, ONE_INPUT)?;
            let (at, capacity) = split(input.call(&mut store, ())?);
            // A buffer outside memory is a broken guest: no single path.
            let size = memory.data_size(&store);
            let inside = at.checked_add(capacity).is_some_and(|end| end <= size);
            match inside {
                true => Some(One {
                    call: instance.get_typed_func(&mut store, ONE)?,
                    input: at,
                    capacity,
                }),
                false => None,
            }
        } else {
            None
        };
        Ok(Self {
            realloc: instance.get_typed_func(&mut store, "cabi_realloc")?,
            check: instance.get_typed_func(&mut store, &export(&module.check_interface))?,
            post: instance.get_typed_func(&mut store, &post_return(&module.check_interface))?,
            memory,
            store,
            one,
            metered,
            last_fuel: None,
        })
    }

    /// Fuel the last call consumed, if the store is metered.
    pub(crate) fn last_fuel(&self) -> Option<u64> {
        self.last_fuel
    }

    /// Give the next call `fuel` (metered stores; otherwise nothing).
    fn fuel(&mut self, fuel: u64) -> Result<(), CoreError> {
        self.last_fuel = None;
        if self.metered {
            self.store.set_fuel(fuel)?;
        }
        Ok(())
    }

    /// Record what the call that was given `fuel` consumed.
    fn spent(&mut self, fuel: u64) {
        if self.metered {
            self.last_fuel = self
                .store
                .get_fuel()
                .ok()
                .map(|left| fuel.saturating_sub(left));
        }
    }

    /// One check: a one-item batch, through the single-check export when
    /// the guest has it and the batch fits its buffer, else [`Self::call`].
    /// The same bytes come back either way.
    pub(crate) fn call_one<T>(
        &mut self,
        batch: &[u8],
        fuel: u64,
        read: impl FnOnce(Result<&[u8], crate::BatchError>) -> T,
    ) -> Result<T, CoreError> {
        if self
            .one
            .as_ref()
            .is_none_or(|one| batch.len() > one.capacity)
        {
            return self.call(batch, fuel, read);
        }
        self.fuel(fuel)?;
        // Borrowed field by field: cloning the TypedFunc would clone its
        // registered type, a visible share of a call this short.
        let Self {
            store, memory, one, ..
        } = self;
        let Some(one) = one.as_ref() else {
            return Err(CoreError::Abi("no single-check export".into()));
        };
        let input = memory
            .data_mut(&mut *store)
            .get_mut(one.input..one.input.saturating_add(batch.len()))
            .ok_or_else(|| CoreError::Abi("the input buffer is outside guest memory".into()))?;
        input.copy_from_slice(batch);
        let ret = one.call.call(&mut *store, i32_of(batch.len())?)?;
        self.spent(fuel);
        match ret {
            -1 => Ok(read(Err(crate::BatchError::Malformed))),
            // The guest's buffers could not hold it: the general path
            // decides the same batch (and may well refuse it as too large).
            -2 => self.call(batch, fuel, read),
            _ => {
                let (at, len) = split(ret);
                let data = self.memory.data(&self.store);
                let end = at
                    .checked_add(len)
                    .filter(|&end| end <= data.len() && ret >= 0)
                    .ok_or_else(|| {
                        CoreError::Abi(format!(
                            "the single-check answer [{at}, +{len}) is outside guest memory ({} bytes)",
                            data.len()
                        ))
                    })?;
                Ok(read(Ok(&data[at..end])))
            }
        }
    }

    /// Call `check-packed` on `batch` with `fuel`, handing the output bytes
    /// (or the guest's `malformed`) to `read` before the guest frees them.
    pub(crate) fn call<T>(
        &mut self,
        batch: &[u8],
        fuel: u64,
        read: impl FnOnce(Result<&[u8], crate::BatchError>) -> T,
    ) -> Result<T, CoreError> {
        self.fuel(fuel)?;
        let store = &mut self.store;
        let len = i32::try_from(batch.len()).map_err(|_| {
            CoreError::Abi("the batch does not fit the guest's address space".into())
        })?;
        let at = self.realloc.call(&mut *store, (0, 0, 1, len))?;
        let at = address(at, batch.len(), self.memory.data_size(&*store), "argument")?;
        self.memory
            .write(&mut *store, at, batch)
            .map_err(|e| CoreError::Abi(e.to_string()))?;
        let ret = self.check.call(&mut *store, (i32_of(at)?, len))?;
        let value = {
            let data = self.memory.data(&*store);
            let area = address(ret, 12, data.len(), "result area")?;
            if area % 4 != 0 {
                return Err(CoreError::Abi(format!(
                    "result area at {area} is not 4-aligned"
                )));
            }
            let word = |i: usize| -> Result<u32, CoreError> {
                let bytes = data
                    .get(area + i..area + i + 4)
                    .and_then(|b| <[u8; 4]>::try_from(b).ok())
                    .ok_or_else(|| CoreError::Abi("result area out of bounds".into()))?;
                Ok(u32::from_le_bytes(bytes))
            };
            let tag = word(0)? & 0xff;
            match tag {
                0 => {
                    let ptr = word(4)?;
                    let len = word(8)? as usize;
                    let start = address(
                        i32::from_ne_bytes(ptr.to_ne_bytes()),
                        len,
                        data.len(),
                        "output",
                    )?;
                    read(Ok(&data[start..start + len]))
                }
                // The error enum's only case is `malformed` (index 0).
                1 if word(4)? & 0xff == 0 => read(Err(crate::BatchError::Malformed)),
                other => {
                    return Err(CoreError::Abi(format!(
                        "result discriminant {other} is not a result case"
                    )));
                }
            }
        };
        self.post.call(&mut *store, ret)?;
        self.spent(fuel);
        Ok(value)
    }
}

/// An `(address << 32) | length` answer of the single-check exports.
fn split(word: i64) -> (usize, usize) {
    let word = u64::from_ne_bytes(word.to_ne_bytes());
    ((word >> 32) as usize, (word & 0xffff_ffff) as usize)
}

/// `at` as an offset with `[at, at + len)` inside a memory of `size` bytes.
fn address(at: i32, len: usize, size: usize, what: &str) -> Result<usize, CoreError> {
    let start = u32::from_ne_bytes(at.to_ne_bytes()) as usize;
    match start.checked_add(len) {
        Some(end) if end <= size => Ok(start),
        _ => Err(CoreError::Abi(format!(
            "the {what} [{start}, +{len}) is outside guest memory ({size} bytes)"
        ))),
    }
}

fn i32_of(at: usize) -> Result<i32, CoreError> {
    let at =
        u32::try_from(at).map_err(|_| CoreError::Abi(format!("address {at} is not 32-bit")))?;
    Ok(i32::from_ne_bytes(at.to_ne_bytes()))
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    const CHECK: &str = "fencecheck:fence/check@0.1.1";

    /// The embedded component has exactly one core module, of the expected
    /// shape: the fast transport is what every default runtime uses.
    #[test]
    fn the_embedded_component_has_one_core_module() {
        assert_eq!(CHECK.rsplit('@').next(), Some(crate::WIT_VERSION));
        assert!(only_core_module(crate::COMPONENT).is_some());
        let engine = Engine::default();
        assert!(matches!(
            CoreModule::find(&engine, crate::COMPONENT, CHECK),
            Ok(Some(CoreModule { one: true, .. }))
        ));
    }

    /// A module with an import, or without the export, is not used.
    #[test]
    fn other_shapes_fall_back() {
        let engine = Engine::default();
        let bare = wat_module(&engine, b"\0asm\x01\0\0\0");
        assert!(CoreModule::checked(bare, CHECK).is_none());
        assert!(
            only_core_module(b"\0asm\x01\0\0\0").is_none(),
            "a core module is no component"
        );
        assert!(only_core_module(b"not wasm").is_none());
    }

    fn wat_module(engine: &Engine, bytes: &[u8]) -> Module {
        match Module::new(engine, bytes) {
            Ok(m) => m,
            Err(e) => panic!("{e:#}"),
        }
    }
}
