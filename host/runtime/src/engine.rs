//! The engine configuration every fencecheck runtime uses, in one place:
//! `build.rs` includes this file to precompile the embedded component with
//! exactly the settings the runtime loads it under (wasmtime refuses, and the
//! runtime then compiles, an artifact made under any other).

/// Everything at wasmtime's defaults for the host, with fuel metering on
/// when `metered`. The embedded component runs unmetered (its loops are
/// bounded by its input, and the input by `Limits::call_bytes`; the fuzz
/// target `fuel_bound` holds it to that); a component loaded from anywhere
/// else runs metered, since nothing vouches for its loops. The instance
/// allocator is chosen by the runtime on top of this; it does not change the
/// compiled code.
pub(crate) fn config(metered: bool) -> wasmtime::Config {
    let mut config = wasmtime::Config::new();
    config.consume_fuel(metered);
    config
}
