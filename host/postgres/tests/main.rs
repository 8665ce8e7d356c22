//! fencecheck-postgres's integration tests, one binary: one module per concern.
//! Each was its own test binary, and each linked wasmtime and the
//! crate's dependencies again: one binary builds in a fraction of the
//! time. One concern: `cargo test -p fencecheck-postgres --test integration <module>::`.

mod fenced;
mod load;
mod one_round_trip;
mod publish;
mod signals;
mod signed;
