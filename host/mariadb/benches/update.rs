//! Fenced UPDATE vs the seed's plain conditional UPDATE on a real server,
//! at 1 and 8 clients (each client its own row: the cost of the fence, not
//! of row-lock waits). Prints one Markdown table row per case.
//!
//!   cargo bench -p fencecheck-mariadb --bench update [-- SECONDS]
//!
//! The server runs with `innodb_flush_log_at_trx_commit=2` so that a commit
//! is not an fsync: with 1, every case measures the disk, and the fence's
//! own cost disappears in the noise.

#[path = "../tests/mariadb/common.rs"]
#[allow(dead_code)]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use mysql::prelude::Queryable;

/// The seed's conditional update: the token rule written by hand.
const PLAIN: &str = "UPDATE plain SET visible = ?, token = ? WHERE id = ? AND token < ?";
/// The one-call fenced update.
const FENCED: &str = "UPDATE fenced SET visible = ?,
    fence_state = fence_next(fence_state, id, ?, 'strict', NULL, NULL) WHERE id = ?";
/// A protected table: the triggers decide.
const PROTECTED: &str = "UPDATE protected SET visible = ?, fence_token = ? WHERE id = ?";

/// Tokens for every case and client: always above every row's mark.
static NEXT: AtomicU64 = AtomicU64::new(1_000_001);

fn run(server: &common::Server, case: &str, clients: usize, seconds: f64) -> Result<f64> {
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut handles = Vec::new();
    for client in 0..clients {
        let mut conn = server.conn()?;
        let barrier = Arc::clone(&barrier);
        let case = case.to_string();
        handles.push(thread::spawn(move || -> Result<u64> {
            let id = format!("scope/{client}");
            barrier.wait();
            let end = Instant::now() + Duration::from_secs_f64(seconds);
            let mut done = 0;
            while Instant::now() < end {
                let counter = NEXT.fetch_add(1, Ordering::Relaxed);
                let token = format!("0.{counter}");
                let changed = match case.as_str() {
                    "plain" => {
                        conn.exec_drop(PLAIN, ("x", counter, &id, counter))?;
                        conn.affected_rows()
                    }
                    "fenced" => {
                        conn.exec_drop(FENCED, ("x", &token, &id))?;
                        conn.affected_rows()
                    }
                    _ => {
                        conn.exec_drop(PROTECTED, ("x", &token, &id))?;
                        conn.affected_rows()
                    }
                };
                ensure!(changed == 1, "{case}: {changed} rows");
                done += 1;
            }
            Ok(done)
        }));
    }
    barrier.wait();
    let start = Instant::now();
    let mut total = 0;
    for h in handles {
        total += h.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

fn main() -> Result<()> {
    let seconds: f64 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(5.0);
    let server = common::Server::start_with(&["--innodb-flush-log-at-trx-commit=2"])?;
    let mut conn = server.conn()?;
    conn.query_drop(
        "CREATE TABLE plain (id VARBINARY(100) PRIMARY KEY, visible VARCHAR(100), token BIGINT UNSIGNED)",
    )?;
    conn.query_drop(
        "CREATE TABLE fenced (id VARBINARY(100) PRIMARY KEY, visible VARCHAR(100), fence_state BLOB)",
    )?;
    conn.query_drop(
        "CREATE TABLE protected (id VARBINARY(100) PRIMARY KEY, visible VARCHAR(100),
             fence_token VARCHAR(100), fence_state BLOB)",
    )?;
    conn.query_drop(
        "CALL fencecheck.protect('app.protected', 'id', 'fence_token', 'fence_state')",
    )?;
    for client in 0..8 {
        let id = format!("scope/{client}");
        conn.exec_drop("INSERT INTO plain VALUES (?, 'x', 1000000)", (&id,))?;
        conn.exec_drop(
            "INSERT INTO fenced VALUES (?, 'x', fence_next(NULL, ?, '0.1000000', 'strict', NULL, NULL))",
            (&id, &id),
        )?;
        conn.exec_drop(
            "INSERT INTO protected (id, visible, fence_token) VALUES (?, 'x', '0.1000000')",
            (&id,),
        )?;
    }
    println!(
        "| clients | plain UPDATE/s | fence_next UPDATE/s | ratio | protected table UPDATE/s | ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- |");
    for clients in [1, 8] {
        // Warm up every path (plugin load, instance pool, buffer pool).
        for case in ["plain", "fenced", "protected"] {
            run(&server, case, clients, 0.5)?;
        }
        let plain = run(&server, "plain", clients, seconds)?;
        let fenced = run(&server, "fenced", clients, seconds)?;
        let protected = run(&server, "protected", clients, seconds)?;
        println!(
            "| {clients} | {plain:.0} | {fenced:.0} | {:.2}× | {protected:.0} | {:.2}× |",
            plain / fenced,
            plain / protected
        );
    }
    Ok(())
}
