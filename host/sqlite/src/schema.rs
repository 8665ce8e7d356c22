use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::Error;
use crate::error::sql;

/// The layout this crate reads and writes: the `layout` row of
/// `fencecheck_meta`. Every host (Rust, Python, Node) installs and checks the
/// same number from the same `host/sqlite/schema.sql`.
pub const LAYOUT_VERSION: i64 = 1;

/// The one layout every host shares (see the file's header). Idempotent
/// statements, no transaction control: [`install`] wraps them.
const SCHEMA: &str = include_str!("../schema.sql");

const META_EXISTS: &str =
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fencecheck_meta'";

// `quote` renders any stored value as SQL text (`2`, `'two'`, `X'02'`), the
// same in every host, for the error message.
const READ_LAYOUT: &str = "SELECT typeof(value) = 'integer' AND value = ?1, quote(value)
  FROM fencecheck_meta WHERE key = 'layout'";

/// Create fencecheck's tables if they do not exist: `fencecheck_meta` (the
/// layout number), `fencecheck_scopes` (one row per scope: fence state BLOB,
/// version, catalog pointer) and `fencecheck_objects` (immutable staged
/// objects). Idempotent; run it once per process before the first write.
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
        check_layout(&tx)?;
    }
    tx.execute_batch(SCHEMA)
        .map_err(sql("creating the fencecheck tables"))?;
    // Again after the schema: it must have left exactly this crate's layout.
    check_layout(&tx)?;
    tx.commit().map_err(sql("committing the install"))
}

/// `Ok` if `fencecheck_meta` says [`LAYOUT_VERSION`].
fn check_layout(conn: &Connection) -> Result<(), Error> {
    let row: Option<(bool, String)> = conn
        .query_row(READ_LAYOUT, [LAYOUT_VERSION], |r| {
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
