//! A fenced table replicated to a replica, with the row and the statement
//! binlog formats: the replica ends with the primary's rows and state
//! bytes, refused writes never reach it, and its own copy of the functions
//! decides on the replicated state.

use anyhow::{Context, Result, ensure};
use mysql::Conn;
use mysql::prelude::Queryable;

use crate::common::{Server, error_of};

type Rows = Vec<(Vec<u8>, String, Option<String>, Vec<u8>)>;

fn rows(conn: &mut Conn) -> Result<Rows> {
    Ok(conn.query(
        "SELECT report_id, visible, fence_token, fence_state FROM app.catalog ORDER BY report_id",
    )?)
}

fn replicate(format: &str) -> Result<()> {
    let primary = Server::start_with(&[
        "--server-id=1",
        "--log-bin=primary-bin",
        &format!("--binlog-format={format}"),
    ])?;
    let replica = Server::start_with(&["--server-id=2", "--read-only=1"])?;
    let mut p = primary.conn()?;
    p.query_drop("CREATE USER repl@'%' IDENTIFIED BY 'pw'")?;
    p.query_drop("GRANT REPLICATION SLAVE ON *.* TO repl@'%'")?;
    // Both servers were set up alike: replicate from here on.
    let start: String = p
        .query_first("SELECT @@gtid_binlog_pos")?
        .context("no gtid")?;
    let mut r = replica.conn()?;
    r.exec_drop("SET GLOBAL gtid_slave_pos = ?", (start,))?;
    r.query_drop(format!(
        "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'repl',
             MASTER_PASSWORD = 'pw', MASTER_USE_GTID = slave_pos",
        primary.port()
    ))?;
    r.query_drop("START SLAVE")?;

    p.query_drop(
        "CREATE TABLE app.catalog (report_id VARBINARY(200) PRIMARY KEY, visible VARCHAR(200) NOT NULL,
             fence_token VARCHAR(100) NULL, fence_state BLOB NULL) ENGINE=InnoDB",
    )?;
    p.query_drop(
        "CALL fencecheck.protect('app.catalog', 'report_id', 'fence_token', 'fence_state')",
    )?;
    p.query_drop("INSERT INTO app.catalog (report_id, visible, fence_token) VALUES ('report/july', 'a', '0.40'), ('report/june', 'j', '0.7')")?;
    p.query_drop("UPDATE app.catalog SET visible = 'b', fence_token = '0.42' WHERE report_id = 'report/july'")?;
    let (_, state, _) = error_of(p.query_drop(
        "UPDATE app.catalog SET visible = 'stale', fence_token = '0.41' WHERE report_id = 'report/july'",
    ))?;
    ensure!(state == "5F001");
    p.query_drop("SET @fencecheck_token = '0.8'")?;
    p.query_drop("DELETE FROM app.catalog WHERE report_id = 'report/june'")?;
    p.query_drop("SET @fencecheck_token = '0.43'")?;
    p.query_drop("UPDATE app.catalog SET visible = 'c' WHERE report_id = 'report/july'")?;

    let pos: String = p
        .query_first("SELECT @@gtid_binlog_pos")?
        .context("no gtid")?;
    let waited: Option<i64> = r.exec_first("SELECT MASTER_GTID_WAIT(?, 60)", (pos,))?;
    ensure!(
        waited == Some(0),
        "the replica did not catch up: {waited:?}"
    );
    let on_primary = rows(&mut p)?;
    let on_replica = rows(&mut r)?;
    ensure!(
        on_primary.len() == 1 && on_primary[0].1 == "c",
        "{on_primary:?}"
    );
    ensure!(
        on_primary == on_replica,
        "{format}: primary {on_primary:?}, replica {on_replica:?}"
    );
    let tomb_p: Vec<(Vec<u8>, Vec<u8>)> =
        p.query("SELECT scope, state FROM fencecheck.tombstones")?;
    let tomb_r: Vec<(Vec<u8>, Vec<u8>)> =
        r.query("SELECT scope, state FROM fencecheck.tombstones")?;
    ensure!(
        tomb_p.len() == 1 && tomb_p == tomb_r,
        "tombstones {tomb_p:?} vs {tomb_r:?}"
    );
    let check: Option<String> = r.query_first(
        "SELECT fence_check(fence_state, report_id, '0.43', 'strict', NULL, NULL) FROM app.catalog",
    )?;
    ensure!(check.as_deref() == Some("stale-fence"));
    Ok(())
}

/// Row-based replication: the replica applies the rows the primary's
/// triggers wrote (the state bytes included).
#[test]
fn replica_with_row_binlog_has_the_same_state() -> Result<()> {
    replicate("ROW")
}

/// Statement-based replication: the replica re-runs each statement (and
/// `@fencecheck_token`) through its own triggers and functions, which
/// decide exactly as the primary's did.
#[test]
fn replica_with_statement_binlog_has_the_same_state() -> Result<()> {
    replicate("STATEMENT")
}
