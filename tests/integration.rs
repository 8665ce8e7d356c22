//! fencecheck-tests' integration tests, one binary: one module per concern.
//! Each was its own test binary, and each linked wasmtime and the
//! crate's dependencies again: one binary builds in a fraction of the
//! time. One concern: `cargo test -p fencecheck-tests --test integration <module>::`.

mod component;
mod conformance;
mod faults;
mod history;
mod properties;
mod upgrade;
