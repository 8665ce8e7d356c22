//! Fenced tables: `fencecheck.protect(...)` installs the triggers, and a
//! writer holding only SELECT, INSERT, UPDATE and DELETE on the table finds
//! no statement that writes past the fence.

use anyhow::{Context, Result, ensure};
use mysql::Conn;
use mysql::prelude::Queryable;

use crate::common::{Server, error_of};

/// A fenced catalog, a role `writer` with only SELECT/INSERT/UPDATE/DELETE
/// on it, and the first row at token 0.40 (inserted by the writer).
fn fenced(server: &Server) -> Result<Conn> {
    let mut root = server.conn()?;
    root.query_drop(
        "CREATE TABLE app.catalog (
             report_id   VARBINARY(200) PRIMARY KEY,
             visible     VARCHAR(200) NOT NULL,
             fence_token VARCHAR(100) NULL,
             fence_state BLOB NULL) ENGINE=InnoDB",
    )?;
    root.query_drop(
        "CALL fencecheck.protect('app.catalog', 'report_id', 'fence_token', 'fence_state')",
    )?;
    root.query_drop("CREATE ROLE writer_role")?;
    root.query_drop("GRANT SELECT, INSERT, UPDATE, DELETE ON app.catalog TO writer_role")?;
    root.query_drop(
        "CREATE TABLE app.other (report_id VARBINARY(200) PRIMARY KEY, note VARCHAR(20))",
    )?;
    root.query_drop("INSERT INTO app.other VALUES ('report/july', 'x')")?;
    root.query_drop("GRANT SELECT ON app.other TO writer_role")?;
    root.query_drop("CREATE USER writer IDENTIFIED BY 'pw'")?;
    root.query_drop("GRANT writer_role TO writer")?;
    root.query_drop("SET DEFAULT ROLE writer_role FOR writer")?;
    let mut writer = server.conn_as("writer")?;
    writer.query_drop(
        "INSERT INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'first', '0.40')",
    )?;
    Ok(writer)
}

fn row(conn: &mut Conn) -> Result<(String, String, u64)> {
    let (visible, state): (String, Vec<u8>) = conn
        .query_first(
            "SELECT visible, fence_state FROM app.catalog WHERE report_id = 'report/july'",
        )?
        .context("no row")?;
    let json: String = conn
        .exec_first("SELECT fence_inspect(?)", (state,))?
        .context("no state")?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    let highest = v["highest"]["counter"].as_u64().context("no highest")?;
    Ok((visible, json, highest))
}

/// Expect a refusal with this SQLSTATE and message start.
fn refused<T: std::fmt::Debug>(
    result: mysql::Result<T>,
    sqlstate: &str,
    start: &str,
) -> Result<()> {
    let (code, state, message) = error_of(result)?;
    ensure!(
        code == 1644 && state == sqlstate && message.starts_with(start),
        "expected {sqlstate} {start}…, got {code} ({state}) {message}"
    );
    Ok(())
}

/// Through the triggers: a newer token in the token column applies, the
/// paused writer's older token is `5F001 stale-fence`, an UPDATE that does
/// not present a token replays the row's own token (stale), a write of the
/// state column is overwritten by the fence's own, and moving a row to
/// another scope is `5F008 scope-mismatch`.
#[test]
fn protected_table_fences_updates() -> Result<()> {
    let server = Server::start()?;
    let mut w = fenced(&server)?;
    w.query_drop(
        "UPDATE catalog SET visible = 'b', fence_token = '0.42' WHERE report_id = 'report/july'",
    )?;
    refused(
        w.query_drop("UPDATE catalog SET visible = 'a', fence_token = '0.41' WHERE report_id = 'report/july'"),
        "5F001",
        "stale-fence: token 0.41 is not above the highest accepted 0.42",
    )?;
    refused(
        w.query_drop("UPDATE catalog SET visible = 'a' WHERE report_id = 'report/july'"),
        "5F001",
        "stale-fence: token 0.42",
    )?;
    refused(
        w.query_drop("UPDATE catalog SET report_id = 'report/june', fence_token = '0.50' WHERE report_id = 'report/july'"),
        "5F008",
        "scope-mismatch: ",
    )?;
    refused(
        w.query_drop("UPDATE catalog SET fence_token = 'garbage' WHERE report_id = 'report/july'"),
        "5F004",
        "invalid-token: ",
    )?;
    // A forged state is replaced by the fence's decision on the stored one.
    w.query_drop(
        "UPDATE catalog SET visible = 'c', fence_token = '0.43', fence_state = x'00' WHERE report_id = 'report/july'",
    )?;
    let (visible, json, highest) = row(&mut w)?;
    ensure!(
        visible == "c" && highest == 43 && json.contains("\"version\":3"),
        "{visible} {json}"
    );
    Ok(())
}

/// DELETE needs `@fencecheck_token` (`5F011 fence-required`) and a token
/// above the mark; the deleted row's state becomes a tombstone, so the
/// scope inserted again continues from it: the paused writer's INSERT is
/// stale. A token left set in the session is stale after its write, and a
/// reset connection (as pools do) has none.
#[test]
fn delete_leaves_a_tombstone_and_the_session_variable_is_fenced() -> Result<()> {
    let server = Server::start()?;
    let mut w = fenced(&server)?;
    refused(
        w.query_drop("DELETE FROM catalog"),
        "5F011",
        "fence-required: ",
    )?;
    w.query_drop("SET @fencecheck_token = '0.39'")?;
    refused(
        w.query_drop("DELETE FROM catalog"),
        "5F001",
        "stale-fence: ",
    )?;
    w.query_drop("SET @fencecheck_token = '0.45'")?;
    w.query_drop("DELETE FROM catalog")?;
    let rows: Option<i64> = w.query_first("SELECT COUNT(*) FROM catalog")?;
    ensure!(rows == Some(0));
    // The variable left set: the same token again is stale.
    refused(
        w.query_drop("INSERT INTO catalog (report_id, visible) VALUES ('report/july', 'late')"),
        "5F001",
        "stale-fence: token 0.45 is not above the highest accepted 0.45",
    )?;
    refused(
        w.query_drop("INSERT INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'late', '0.44')"),
        "5F001",
        "stale-fence: ",
    )?;
    w.reset()?;
    refused(
        w.query_drop("INSERT INTO catalog (report_id, visible) VALUES ('report/july', 'late')"),
        "5F011",
        "fence-required: ",
    )?;
    w.query_drop("INSERT INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'again', '0.46')")?;
    let (visible, json, highest) = row(&mut w)?;
    ensure!(
        visible == "again" && highest == 46 && json.contains("\"version\":3"),
        "{json}"
    );
    Ok(())
}

/// REPLACE, INSERT IGNORE, INSERT … ON DUPLICATE KEY UPDATE, multi-table
/// UPDATE and DELETE, and LOAD DATA … REPLACE are all decided by the
/// fence: stale tokens change nothing, newer ones apply.
#[test]
fn every_write_statement_is_fenced() -> Result<()> {
    let server = Server::start()?;
    let mut w = fenced(&server)?;
    w.query_drop(
        "UPDATE catalog SET visible = 'b', fence_token = '0.42' WHERE report_id = 'report/july'",
    )?;
    // REPLACE deletes and inserts: a stale token in the row or the variable is refused.
    refused(
        w.query_drop("REPLACE INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'r', '0.41')"),
        "5F001",
        "stale-fence: ",
    )?;
    w.query_drop("SET @fencecheck_token = '0.41'")?;
    refused(
        w.query_drop("REPLACE INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'r', '0.43')"),
        "5F001",
        "stale-fence: token 0.41",
    )?;
    // INSERT IGNORE does not turn the refusal into a warning.
    refused(
        w.query_drop("INSERT IGNORE INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'i', '0.41')"),
        "5F001",
        "stale-fence: ",
    )?;
    // ON DUPLICATE KEY UPDATE without a new token replays the stored one.
    w.query_drop("SET @fencecheck_token = NULL")?;
    refused(
        w.query_drop("INSERT INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'o', '0.41')
                      ON DUPLICATE KEY UPDATE visible = VALUES(visible)"),
        "5F001",
        "stale-fence: ",
    )?;
    refused(
        w.query_drop("INSERT INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'o', '0.43')
                      ON DUPLICATE KEY UPDATE visible = VALUES(visible)"),
        "5F001",
        "stale-fence: token 0.42",
    )?;
    // Multi-table UPDATE and DELETE.
    refused(
        w.query_drop("UPDATE catalog c JOIN other o USING (report_id) SET c.visible = o.note, c.fence_token = '0.41'"),
        "5F001",
        "stale-fence: ",
    )?;
    w.query_drop("SET @fencecheck_token = '0.40'")?;
    refused(
        w.query_drop("DELETE c FROM catalog c JOIN other o USING (report_id)"),
        "5F001",
        "stale-fence: ",
    )?;
    let (visible, _, highest) = row(&mut w)?;
    ensure!(visible == "b" && highest == 42, "{visible} {highest}");
    // The same statements with newer tokens apply.
    w.query_drop("INSERT INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'o', '0.43')
                  ON DUPLICATE KEY UPDATE visible = VALUES(visible), fence_token = VALUES(fence_token)")?;
    w.query_drop("SET @fencecheck_token = '0.44'")?;
    w.query_drop("REPLACE INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'r', '0.44')")?;
    w.query_drop("UPDATE catalog c JOIN other o USING (report_id) SET c.visible = o.note, c.fence_token = '0.45'")?;
    let (visible, json, highest) = row(&mut w)?;
    ensure!(visible == "x" && highest == 45, "{visible} {json}");
    // LOAD DATA (the server reads a file; root here: any role fires the same triggers).
    let mut root = server.conn()?;
    let datadir: String = root
        .query_first("SELECT @@datadir")?
        .context("no datadir")?;
    let file = format!("{datadir}/load.tsv");
    root.query_drop(format!(
        "SELECT 'report/july', 'loaded', '0.41' INTO OUTFILE '{file}'"
    ))?;
    root.query_drop("SET @fencecheck_token = '0.41'")?;
    refused(
        root.query_drop(format!(
            "LOAD DATA INFILE '{file}' REPLACE INTO TABLE app.catalog (report_id, visible, fence_token)"
        )),
        "5F001",
        "stale-fence: ",
    )?;
    let (visible, _, highest) = row(&mut w)?;
    ensure!(visible == "x" && highest == 45, "{visible} {highest}");
    Ok(())
}

/// `protect` refuses what it cannot fence (`5F016 unsound-fence`): a
/// case-insensitive or PAD SPACE scope collation, a scope without its own
/// unique key, a non-InnoDB table, a table with other triggers, an
/// unqualified name (`5F012`).
#[test]
fn protect_refuses_unsound_tables() -> Result<()> {
    let server = Server::start()?;
    let mut root = server.conn()?;
    let cases = [
        (
            "ci",
            "report_id VARCHAR(200) PRIMARY KEY",
            "ENGINE=InnoDB",
            "5F016",
            "unsound-fence: scope column",
        ),
        (
            "padbin",
            "report_id VARCHAR(200) COLLATE utf8mb4_bin PRIMARY KEY",
            "ENGINE=InnoDB",
            "5F016",
            "unsound-fence: scope column",
        ),
        (
            "nokey",
            "id INT PRIMARY KEY, report_id VARBINARY(200)",
            "ENGINE=InnoDB",
            "5F016",
            "unsound-fence: scope column report_id must be alone",
        ),
        (
            "pair",
            "report_id VARBINARY(200), b INT, PRIMARY KEY (report_id, b)",
            "ENGINE=InnoDB",
            "5F016",
            "unsound-fence: scope column report_id must be alone",
        ),
        (
            "myisam",
            "report_id VARBINARY(200) PRIMARY KEY",
            "ENGINE=MyISAM",
            "5F016",
            "unsound-fence: app.myisam is not an InnoDB",
        ),
    ];
    for (name, key, engine, state, start) in cases {
        root.query_drop(format!(
            "CREATE TABLE app.{name} ({key}, fence_token VARCHAR(100), fence_state BLOB) {engine}"
        ))?;
        refused(
            root.query_drop(format!(
                "CALL fencecheck.protect('app.{name}', 'report_id', 'fence_token', 'fence_state')"
            )),
            state,
            start,
        )
        .with_context(|| name)?;
    }
    root.query_drop("CREATE TABLE app.trig (report_id VARBINARY(200) PRIMARY KEY, fence_token VARCHAR(100), fence_state BLOB) ENGINE=InnoDB")?;
    root.query_drop("CREATE TRIGGER app.mine BEFORE UPDATE ON app.trig FOR EACH ROW SET NEW.fence_state = x'00'")?;
    refused(
        root.query_drop(
            "CALL fencecheck.protect('app.trig', 'report_id', 'fence_token', 'fence_state')",
        ),
        "5F016",
        "unsound-fence: app.trig has other triggers",
    )?;
    refused(
        root.query_drop(
            "CALL fencecheck.protect('trig', 'report_id', 'fence_token', 'fence_state')",
        ),
        "5F012",
        "invalid-argument: ",
    )?;
    let count: Option<i64> = root.query_first("SELECT COUNT(*) FROM fencecheck.protected")?;
    ensure!(count == Some(0));
    Ok(())
}

/// A case-variant of a scope is another scope (the column compares bytes):
/// it never reaches the stored row's state, and REPLACE or ON DUPLICATE
/// KEY UPDATE with it inserts its own row instead of taking over.
#[test]
fn scope_variants_are_other_scopes() -> Result<()> {
    let server = Server::start()?;
    let mut w = fenced(&server)?;
    w.query_drop(
        "UPDATE catalog SET visible = 'b', fence_token = '0.42' WHERE report_id = 'report/july'",
    )?;
    w.query_drop("SET @fencecheck_token = '0.1'")?;
    w.query_drop(
        "REPLACE INTO catalog (report_id, visible, fence_token) VALUES ('REPORT/JULY', 'v', '0.1')",
    )?;
    w.query_drop(
        "INSERT INTO catalog (report_id, visible, fence_token) VALUES ('report/july ', 'v', '0.1')
                  ON DUPLICATE KEY UPDATE visible = 'taken'",
    )?;
    let (visible, _, highest) = row(&mut w)?;
    ensure!(visible == "b" && highest == 42);
    let rows: Option<i64> = w.query_first("SELECT COUNT(*) FROM catalog")?;
    ensure!(rows == Some(3));
    Ok(())
}

/// The writer's role (SELECT, INSERT, UPDATE, DELETE) cannot walk around
/// the triggers: TRUNCATE, ALTER, RENAME, DROP/CREATE TRIGGER, DROP TABLE
/// and writes to the tombstones are denied; the row is unchanged.
#[test]
fn ddl_needs_privileges_the_writer_lacks() -> Result<()> {
    let server = Server::start()?;
    let mut w = fenced(&server)?;
    for sql in [
        "TRUNCATE TABLE catalog",
        "ALTER TABLE catalog DROP COLUMN fence_state",
        "RENAME TABLE catalog TO catalog2",
        "DROP TRIGGER fencecheck_bu",
        "CREATE TRIGGER mine BEFORE UPDATE ON catalog FOR EACH ROW SET NEW.fence_state = x''",
        "DROP TABLE catalog",
        "DELETE FROM fencecheck.tombstones",
        "CALL fencecheck.protect('app.catalog', 'report_id', 'fence_token', 'fence_state')",
    ] {
        let (code, state, message) = error_of(w.query_drop(sql))?;
        ensure!(
            state == "42000" && [1142, 1044, 1370].contains(&code),
            "{sql}: {code} ({state}) {message}"
        );
    }
    let (visible, _, highest) = row(&mut w)?;
    ensure!(visible == "first" && highest == 40);
    Ok(())
}
