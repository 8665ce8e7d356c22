//! fencecheck-sqlite's integration tests, one binary: one module per concern.
//! Each was its own test binary, and each linked wasmtime and the
//! crate's dependencies again: one binary builds in a fraction of the
//! time. One concern: `cargo test -p fencecheck-sqlite --test integration <module>::`.

mod common;

mod concurrency;
mod crash;
mod fenced;
mod layout;
mod one_statement;
mod publish;
mod signals;
mod signed;
