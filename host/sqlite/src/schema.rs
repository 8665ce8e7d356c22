use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::Error;
use crate::error::sql;

/// The layout this crate reads and writes: the `layout` row of
/// `fencecheck_meta`. Every host (Rust, Python, Node) installs and checks the
/// same number from the same `host/sqlite/schema.sql`.
pub const LAYOUT_VERSION: i64 = 2;

/// The layout [`install`] upgrades in place: layout 2 only adds
/// `fencecheck_keys` (signed tokens).
const UPGRADES_FROM: i64 = 1;

/// The one layout every host shares (see the file's header). Idempotent
/// statements, no transaction control: [`install`] wraps them.
const SCHEMA: &str = include_str!("../schema.sql");

const META_EXISTS: &str =
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fencecheck_meta'";

// `quote` renders any stored value as SQL text (`2`, `'two'`, `X'02'`), the
// same in every host, for the error message.
const READ_LAYOUT: &str = "SELECT typeof(value) = 'integer' AND value IN (?1, ?2), quote(value)
  FROM fencecheck_meta WHERE key = 'layout'";

/// Create fencecheck's tables if they do not exist: `fencecheck_meta` (the
/// layout number), `fencecheck_scopes` (one row per scope: fence state BLOB,
/// version, catalog pointer), `fencecheck_objects` (immutable staged
/// objects) and `fencecheck_keys` (signing keys per scope prefix).
/// Idempotent; run it once per process before the first write. A layout-1
/// database (fencecheck 0.1.0) is upgraded in place to layout 2: its states
/// stay, `fencecheck_keys` is added, and 0.1.0 writers then refuse it.
///
/// Runs in one `BEGIN IMMEDIATE` transaction, so `conn` must not be inside a
/// transaction. A database whose `fencecheck_meta` names another layout (or
/// has no `layout` row) is refused with [`Error::UnsupportedLayout`] and
/// nothing is created: a writer of another layout would keep a separate fence.
pub fn install(conn: &Connection) -> Result<(), Error> {
    // Dropping `tx` on any error rolls back.
    let tx = Transaction::new_unchecked(conn, TransactionBehavior::Immediate)
        .map_err(sql("beginning the install transaction"))?;
    let meta = tx
        .query_row(META_EXISTS, [], |_| Ok(()))
        .optional()
        .map_err(sql("looking for fencecheck_meta"))?;
    if meta.is_some() {
        check_layout(&tx, UPGRADES_FROM)?;
    }
    tx.execute_batch(SCHEMA)
        .map_err(sql("creating the fencecheck tables"))?;
    // Again after the schema: it must have left exactly this crate's layout.
    check_layout(&tx, LAYOUT_VERSION)?;
    tx.commit().map_err(sql("committing the install"))
}

/// `Ok` if `fencecheck_meta` says [`LAYOUT_VERSION`] (or `also`).
fn check_layout(conn: &Connection, also: i64) -> Result<(), Error> {
    let row: Option<(bool, String)> = conn
        .query_row(READ_LAYOUT, [LAYOUT_VERSION, also], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(sql("reading the layout number"))?;
    match row {
        Some((true, _)) => Ok(()),
        Some((false, found)) => Err(Error::UnsupportedLayout { found: Some(found) }),
        None => Err(Error::UnsupportedLayout { found: None }),
    }
}
