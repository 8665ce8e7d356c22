//! `install`: the one layout every host shares, and its layout number.

use crate::common;

use anyhow::{Result, bail, ensure};
use common::rows;
use fencecheck_sqlite::{Error, LAYOUT_VERSION, install};
use rusqlite::Connection;

/// Every object in the database, with its SQL (for "nothing changed" checks).
fn schema(conn: &Connection) -> Result<Vec<String>> {
    rows(
        conn,
        "SELECT type || ' ' || name || ' ' || coalesce(sql, '') FROM sqlite_master ORDER BY name",
    )
}

/// A second install changes nothing, and the database records LAYOUT_VERSION.
#[test]
fn install_is_idempotent_and_records_the_layout() -> Result<()> {
    let conn = Connection::open_in_memory()?;
    install(&conn)?;
    let first = schema(&conn)?;
    install(&conn)?;
    ensure!(schema(&conn)? == first);
    let layout: i64 = conn.query_row(
        "SELECT value FROM fencecheck_meta WHERE key = 'layout'",
        [],
        |r| r.get(0),
    )?;
    ensure!(layout == LAYOUT_VERSION && conn.is_autocommit());
    Ok(())
}

/// Another number, a text or real value, or no `layout` row: refused with
/// UnsupportedLayout naming what was found, and nothing is created.
#[test]
fn other_layouts_are_refused_and_nothing_is_created() -> Result<()> {
    for (row, found) in [
        (Some("3"), Some("3")),
        (Some("0"), Some("0")),
        (Some("'2'"), Some("'2'")),
        (Some("'1'"), Some("'1'")),
        (Some("1.5"), Some("1.5")),
        (None, None),
    ] {
        let conn = Connection::open_in_memory()?;
        // No column affinity, so the text and real values stay what they are.
        conn.execute_batch(
            "CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value) WITHOUT ROWID",
        )?;
        if let Some(value) = row {
            conn.execute_batch(&format!(
                "INSERT INTO fencecheck_meta VALUES ('layout', {value})"
            ))?;
        }
        let before = schema(&conn)?;
        let Err(err) = install(&conn) else {
            bail!("{row:?}: installed over another layout");
        };
        let Error::UnsupportedLayout { found: f } = &err else {
            bail!("{row:?}: expected UnsupportedLayout, got {err:?}");
        };
        ensure!(f.as_deref() == found, "{row:?}: found {f:?}");
        let text = err.to_string();
        let named = found.map_or("no layout row".into(), |v| format!("layout {v}"));
        ensure!(
            text.contains(&named) && text.contains(&format!("layout {LAYOUT_VERSION}")),
            "{text}"
        );
        ensure!(schema(&conn)? == before, "{row:?}: the schema changed");
        ensure!(conn.is_autocommit(), "{row:?}: left a transaction open");
    }
    Ok(())
}

/// A database from before the layout number (the same tables, no
/// `fencecheck_meta`) is adopted: its fence states stay, the number is added.
#[test]
fn a_database_without_a_layout_number_is_adopted() -> Result<()> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch(
        "CREATE TABLE fencecheck_scopes (scope TEXT NOT NULL PRIMARY KEY, fence_state BLOB NOT NULL,
             version INTEGER NOT NULL, visible_object INTEGER, published_at_ms INTEGER) WITHOUT ROWID;
         INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES ('s', x'01', 7);",
    )?;
    install(&conn)?;
    ensure!(rows(&conn, "SELECT version FROM fencecheck_scopes")? == ["Integer(7)"]);
    ensure!(rows(&conn, "SELECT value FROM fencecheck_meta")? == ["Integer(2)"]);
    Ok(())
}

/// A layout-1 database (fencecheck 0.1.0's `schema.sql`, no
/// `fencecheck_keys`) is upgraded in place: its states stay, the keys table
/// is added, and the number becomes 2, so a 0.1.0 writer (which cannot
/// verify signatures) refuses it from then on.
#[test]
fn layout_1_is_upgraded_in_place() -> Result<()> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch(
        "CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO fencecheck_meta VALUES ('layout', 1);
         CREATE TABLE fencecheck_scopes (scope TEXT NOT NULL PRIMARY KEY, fence_state BLOB NOT NULL,
             version INTEGER NOT NULL, visible_object INTEGER, published_at_ms INTEGER) WITHOUT ROWID;
         INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES ('s', x'01', 7);",
    )?;
    install(&conn)?;
    ensure!(rows(&conn, "SELECT version FROM fencecheck_scopes")? == ["Integer(7)"]);
    ensure!(rows(&conn, "SELECT value FROM fencecheck_meta")? == ["Integer(2)"]);
    ensure!(rows(&conn, "SELECT count(*) FROM fencecheck_keys")? == ["Integer(0)"]);
    Ok(())
}

/// install needs its own transaction: inside the caller's it fails, and the
/// caller's transaction is left as it was.
#[test]
fn install_refuses_an_open_transaction() -> Result<()> {
    let conn = Connection::open_in_memory()?;
    conn.execute_batch("BEGIN; CREATE TABLE mine (x);")?;
    ensure!(matches!(install(&conn), Err(Error::Sqlite { .. })));
    ensure!(!conn.is_autocommit());
    conn.execute_batch("COMMIT")?;
    ensure!(rows(&conn, "SELECT name FROM sqlite_master")? == ["Text(\"mine\")"]);
    Ok(())
}
