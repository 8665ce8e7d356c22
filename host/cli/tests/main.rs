//! fencecheck-cli's integration tests, one binary: one module per concern.
//! Each was its own test binary, and each linked wasmtime and the
//! crate's dependencies again: one binary builds in a fraction of the
//! time. One concern: `cargo test -p fencecheck-cli --test integration <module>::`.

mod common;
#[path = "../../authority/tests/support/etcd.rs"]
mod etcd;
#[path = "common/exporter.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../../authority/tests/support/pki.rs"]
mod pki;
#[path = "../../authority/tests/support/secure_etcd.rs"]
mod secure_etcd;
#[path = "../../redis/tests/common/mod.rs"]
#[allow(missing_docs)]
mod server;

mod cli;
mod component_version;
mod etcd_secure;
mod exporter;
mod migrate;
mod redis;
mod signed;
mod trace;
mod version;
