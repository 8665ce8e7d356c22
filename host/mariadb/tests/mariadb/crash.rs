//! A server killed (SIGKILL) in the middle of fenced writes: after the
//! restart, each write's row and state are there together or not at all.

use std::sync::mpsc;
use std::thread;

use anyhow::{Context, Result, ensure};
use mysql::prelude::Queryable;

use crate::common::Server;

fn catalog(server: &Server) -> Result<(String, u64, u64)> {
    let mut conn = server.conn()?;
    let (visible, json): (String, String) = conn
        .query_first("SELECT visible, fence_inspect(fence_state) FROM catalog")?
        .context("no row")?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    Ok((
        visible,
        v["highest"]["counter"].as_u64().context("no highest")?,
        v["version"].as_u64().context("no version")?,
    ))
}

/// A committed fenced UPDATE survives SIGKILL with its state; one that ran
/// but was not committed is gone with its state; a writer committing in a
/// loop while the server is killed leaves a row whose object and state
/// name the same token, at or after the last acknowledged commit.
#[test]
fn sigkill_keeps_row_and_state_together() -> Result<()> {
    let mut server = Server::start()?;
    let mut conn = server.conn()?;
    conn.query_drop(
        "CREATE TABLE catalog (id VARBINARY(100) PRIMARY KEY, visible VARCHAR(100) NOT NULL,
             fence_state BLOB NOT NULL) ENGINE=InnoDB",
    )?;
    conn.query_drop(
        "INSERT INTO catalog VALUES ('r', 'obj/40', fence_next(NULL, 'r', '0.40', 'strict', NULL, NULL))",
    )?;
    let update = |c: &mut mysql::Conn, counter: u64| {
        c.exec_drop(
            "UPDATE catalog SET visible = ?, fence_state = fence_next(fence_state, id, ?, 'strict', NULL, NULL)
              WHERE id = 'r'",
            (format!("obj/{counter}"), format!("0.{counter}")),
        )
    };
    update(&mut conn, 41)?;
    // Written inside a transaction that never commits.
    let mut open = server.conn()?;
    open.query_drop("START TRANSACTION")?;
    update(&mut open, 42)?;

    server.kill9()?;
    drop(open);
    drop(conn);
    server.restart()?;
    ensure!(catalog(&server)? == ("obj/41".to_string(), 41, 2));

    // A writer commits in a loop; the test kills the server after it has
    // acknowledged 20 commits (a channel, not a timer), while it goes on.
    let (tx, rx) = mpsc::channel::<u64>();
    let mut writer = server.conn()?;
    let handle = thread::spawn(move || -> u64 {
        let mut acknowledged = 41;
        for counter in 43..10_000u64 {
            if update(&mut writer, counter).is_err() {
                break;
            }
            acknowledged = counter;
            if tx.send(counter).is_err() {
                break;
            }
        }
        acknowledged
    });
    for _ in 0..20 {
        rx.recv().context("the writer stopped early")?;
    }
    server.kill9()?;
    let acknowledged = handle
        .join()
        .map_err(|_| anyhow::anyhow!("writer panicked"))?;
    server.restart()?;
    let (visible, highest, version) = catalog(&server)?;
    ensure!(
        visible == format!("obj/{highest}"),
        "row {visible}, state {highest}"
    );
    ensure!(
        highest >= acknowledged,
        "lost acknowledged commit {acknowledged} (have {highest})"
    );
    // Token 40 made version 1, 41 version 2, 42 never committed, 43.. one each.
    ensure!(
        version == highest - 40,
        "version {version} for highest {highest}"
    );
    // And the fence still decides after recovery.
    let mut conn = server.conn()?;
    ensure!(update(&mut conn, highest).is_err());
    update(&mut conn, highest + 1)?;
    Ok(())
}
