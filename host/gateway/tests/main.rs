//! fencecheck-gateway's integration tests, one binary: one module per concern.
//! Each was its own test binary, and each linked wasmtime and the
//! crate's dependencies again: one binary builds in a fraction of the
//! time. One concern: `cargo test -p fencecheck-gateway --test integration <module>::`.

mod common;

mod auth;
mod component_version;
mod durable;
mod errors;
mod http;
mod load;
mod locks;
mod objects;
mod postgres;
mod prometheus;
mod reload;
mod s3;
mod shutdown;
mod signed;
mod slow;
mod tls;
mod upstream;
mod version;
