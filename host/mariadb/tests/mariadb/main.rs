//! The plugin inside a real MariaDB server (Debian's `mariadb-server`
//! 10.11), started by the tests: see `common.rs`.

mod common;
mod crash;
mod functions;
mod leases;
mod protect;
mod replication;
mod vectors;
