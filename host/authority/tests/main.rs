//! fencecheck-authority's integration tests, one binary: one module per concern.
//! Each was its own test binary, and each linked wasmtime and the
//! crate's dependencies again: one binary builds in a fraction of the
//! time. One concern: `cargo test -p fencecheck-authority --test integration <module>::`.

mod common;
#[path = "support/etcd.rs"]
mod etcd;
#[path = "support/etcd_clients.rs"]
mod etcd_clients;
#[path = "support/lease_history.rs"]
mod lease_history;
#[path = "support/pki.rs"]
mod pki;
#[path = "support/secure_etcd.rs"]
mod secure_etcd;

mod decisive;
mod etcd_cluster;
mod etcd_processes;
mod etcd_secure;
mod failover;
mod nemesis;
mod postgres;
mod restore;
mod signals;
mod signed;
