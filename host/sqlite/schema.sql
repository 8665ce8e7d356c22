-- fencecheck's SQLite layout: THE one layout every host shares (Rust
-- `fencecheck_sqlite::install`, Python `fencecheck.sqlite.install`, Node
-- `install` from `fencecheck/sqlite`). Hosts embed or package this exact
-- text, so a Rust writer and a Python or Node writer of one scope on one
-- database read and advance the same fence state: one high-water mark.
--
-- Each host runs it inside its own BEGIN IMMEDIATE transaction, after
-- checking `fencecheck_meta`'s layout number, and verifies the number again
-- before committing. So: no BEGIN/COMMIT here, and every statement must be
-- idempotent (IF NOT EXISTS, INSERT OR IGNORE).
--
-- Changing the layout: bump the `layout` number below (and LAYOUT_VERSION in
-- every host) AND make old writers fail on the new layout, e.g. by using new
-- table names. Writers check the number only at install, so an old writer
-- already running would otherwise keep writing the old tables: two fences.

CREATE TABLE IF NOT EXISTS fencecheck_meta (
    key   TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;

INSERT OR IGNORE INTO fencecheck_meta (key, value) VALUES ('layout', 2);

-- Layout 1 (before signed tokens) is upgraded in place: it has every table
-- below but `fencecheck_keys`, which is created next. From then on a writer
-- of layout 1 (fencecheck 0.1.0) refuses the database at its install: it
-- cannot verify signatures, so it must not write scopes that require them.
UPDATE fencecheck_meta SET value = 2 WHERE key = 'layout' AND value = 1;

-- One row per scope holds the fence state *and* the catalog pointer, so a
-- publish writes one row (the seed's `report_catalog`, with `accepted_fence`
-- replaced by the component's state). A plain fenced write sets only
-- `fence_state` and `version` (the count of applied writes).
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

-- Signed tokens (layout 2): a scope whose name starts with `scope_prefix`
-- requires tokens signed by one of that prefix's keys; the longest prefix
-- that starts a scope decides (`keys.sql`), and a scope no prefix starts
-- takes unsigned tokens. Kept in the store, beside the fence states, so
-- every host that writes a scope (Rust, Python, Node) enforces the same
-- keys, and a key change takes effect at once for every one of them.
-- Secrets: 16 to 64 bytes; the component refuses other lengths itself.
CREATE TABLE IF NOT EXISTS fencecheck_keys (
    scope_prefix TEXT    NOT NULL CHECK (typeof(scope_prefix) = 'text'),
    key_id       INTEGER NOT NULL
                 CHECK (typeof(key_id) = 'integer' AND key_id BETWEEN 0 AND 4294967295),
    secret       BLOB    NOT NULL CHECK (typeof(secret) = 'blob'),
    PRIMARY KEY (scope_prefix, key_id)
) WITHOUT ROWID;
