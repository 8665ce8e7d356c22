//! The module in a real Redis Cluster and Valkey cluster on loopback (3
//! masters, 3 replicas, every node loading the module): commands through
//! cluster-aware clients (MOVED, ASK, CROSSSLOT), resharding with writers
//! running, and failover. One test binary, apart from `module`, so the
//! cluster tests can run on their own (`--test cluster`).

#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;

mod commands;
mod failover;
mod migration;
mod node_state;
mod redis_py;
mod redis_rs;
mod reshard;
mod signing;
mod wait_failover;
