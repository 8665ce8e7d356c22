//! The one PostgreSQL layout (`schema.sql`), installed idempotently.

use postgres::Client;

use crate::Error;
use crate::error::pg;

/// The layout this version reads and writes (`fencecheck_meta.layout`).
pub const LAYOUT_VERSION: i64 = 2;

/// The layout [`install`] upgrades in place: 2 only adds `fencecheck_keys`.
const UPGRADES_FROM: i64 = 1;

/// The DDL: `host/postgres/schema.sql`, shared with the Python host.
const SCHEMA: &str = include_str!("../schema.sql");

/// Any 64-bit key: serializes concurrent installs (CREATE … IF NOT EXISTS
/// alone can race on the catalogs). "fencechk" in ASCII.
const INSTALL_LOCK: i64 = 0x6665_6e63_6563_686b;

fn layout(tx: &mut postgres::Transaction<'_>) -> Result<Option<i64>, Error> {
    let exists: bool = tx
        .query_one("SELECT to_regclass('fencecheck_meta') IS NOT NULL", &[])
        .map_err(pg("looking for fencecheck_meta"))?
        .get(0);
    if !exists {
        return Ok(None);
    }
    Ok(tx
        .query_opt(
            "SELECT value FROM fencecheck_meta WHERE key = 'layout'",
            &[],
        )
        .map_err(pg("reading the layout number"))?
        .map(|r| r.get(0)))
}

/// Create the layout if absent, in one transaction; a layout-1 database is
/// upgraded in place (2 adds `fencecheck_keys`). A database that
/// declares another layout number is refused with
/// [`Error::UnsupportedLayout`] and nothing is created or changed.
pub fn install(client: &mut Client) -> Result<(), Error> {
    let mut tx = client.transaction().map_err(pg("beginning install"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&INSTALL_LOCK])
        .map_err(pg("taking the install lock"))?;
    if let Some(found) = layout(&mut tx)?.filter(|v| ![LAYOUT_VERSION, UPGRADES_FROM].contains(v)) {
        return Err(Error::UnsupportedLayout { found });
    }
    tx.batch_execute(SCHEMA)
        .map_err(pg("creating the layout"))?;
    if let Some(found) = layout(&mut tx)?.filter(|v| *v != LAYOUT_VERSION) {
        return Err(Error::UnsupportedLayout { found });
    }
    tx.commit().map_err(pg("committing install"))
}
