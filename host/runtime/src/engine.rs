//! The engine configuration every fencecheck runtime uses, in one place:
//! `build.rs` includes this file to precompile the embedded component with
//! exactly the settings the runtime loads it under (wasmtime refuses, and the
//! runtime then compiles, an artifact made under any other).

/// Fuel metering on (every call is bounded); everything else at wasmtime's
/// defaults for the host. The instance allocator is chosen by the runtime on
/// top of this; it does not change the compiled code.
pub(crate) fn config() -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.consume_fuel(true);
    config
}
