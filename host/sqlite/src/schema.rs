use rusqlite::Connection;

use crate::Error;
use crate::error::sql;

/// The adapter's tables. One row per scope holds the fence state *and* the
/// catalog pointer, so a publish writes one row (the seed's `report_catalog`
/// with `accepted_fence` replaced by the component's state).
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fencecheck_scopes (
    scope           TEXT    NOT NULL PRIMARY KEY,
    fence_state     BLOB    NOT NULL,
    version         INTEGER NOT NULL,
    visible_object  INTEGER,
    published_at_ms INTEGER
) WITHOUT ROWID;

-- AUTOINCREMENT: an id is never handed out twice, even after the collector
-- deleted the object, so a delayed reference can never reach a newer object.
CREATE TABLE IF NOT EXISTS fencecheck_objects (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    scope        TEXT    NOT NULL,
    name         TEXT    NOT NULL,
    body         BLOB    NOT NULL,
    staged_at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS fencecheck_objects_staged
    ON fencecheck_objects (staged_at_ms);

CREATE TRIGGER IF NOT EXISTS fencecheck_objects_immutable
    BEFORE UPDATE ON fencecheck_objects
BEGIN
    SELECT RAISE(ABORT, 'fencecheck: staged objects are immutable');
END;
";

/// Create the adapter's tables (`fencecheck_scopes`, `fencecheck_objects`) if
/// they do not exist. Idempotent; run it once per database.
pub fn install(conn: &Connection) -> Result<(), Error> {
    conn.execute_batch(SCHEMA)
        .map_err(sql("creating the fencecheck tables"))
}
