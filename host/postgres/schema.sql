-- fencecheck's PostgreSQL layout for client-side fenced writes: the SQLite
-- layout (host/sqlite/schema.sql), same tables, same columns, PostgreSQL
-- types, so tooling reads both. Rust `fencecheck_postgres::install` and
-- Python `fencecheck.postgres.install` run exactly this text.
--
-- Each host runs it inside its own transaction holding an advisory lock,
-- after checking `fencecheck_meta`'s layout number, and checks the number
-- again before committing; so no BEGIN/COMMIT here, and every statement is
-- idempotent.
--
-- Changing the layout: bump `layout` (and LAYOUT_VERSION in every host) and
-- make old writers fail on the new layout (new table names), as in SQLite.

CREATE TABLE IF NOT EXISTS fencecheck_meta (
    key   text   NOT NULL PRIMARY KEY,
    value bigint NOT NULL
);

INSERT INTO fencecheck_meta (key, value) VALUES ('layout', 2)
    ON CONFLICT (key) DO NOTHING;

-- Layout 1 (before signed tokens) is upgraded in place, as in SQLite: it
-- has every table below but `fencecheck_keys`, created next; 0.1.0 writers
-- then refuse the database at their install.
UPDATE fencecheck_meta SET value = 2 WHERE key = 'layout' AND value = 1;

-- One row per scope: its fence state (the one high-water mark), the count
-- of applied writes, and the catalog pointer of the publish protocol.
CREATE TABLE IF NOT EXISTS fencecheck_scopes (
    scope           text   NOT NULL PRIMARY KEY,
    fence_state     bytea  NOT NULL,
    version         bigint NOT NULL,
    visible_object  bigint,
    published_at_ms bigint
);

-- Identity ids come from a sequence and are never handed out twice, as
-- SQLite's AUTOINCREMENT: a delayed reference never reaches a newer object.
CREATE TABLE IF NOT EXISTS fencecheck_objects (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope        text   NOT NULL,
    name         text   NOT NULL,
    body         bytea  NOT NULL,
    staged_at_ms bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS fencecheck_objects_staged
    ON fencecheck_objects (staged_at_ms);

CREATE OR REPLACE FUNCTION fencecheck_objects_immutable() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'fencecheck: staged objects are immutable';
END
$$;

CREATE OR REPLACE TRIGGER fencecheck_objects_immutable
    BEFORE UPDATE ON fencecheck_objects
    FOR EACH ROW EXECUTE FUNCTION fencecheck_objects_immutable();

-- Signed tokens (layout 2), as in SQLite: a scope whose name starts with
-- `scope_prefix` requires tokens signed by one of that prefix's keys; the
-- longest prefix decides (`keys.sql`). Key changes take this layout's
-- `fencecheck_scopes` table in EXCLUSIVE mode, so they wait for fenced
-- writes in flight (which hold its row locks) and later writes read the
-- new keys: a write never decides with keys older than a committed change.
CREATE TABLE IF NOT EXISTS fencecheck_keys (
    scope_prefix text   NOT NULL,
    key_id       bigint NOT NULL CHECK (key_id BETWEEN 0 AND 4294967295),
    secret       bytea  NOT NULL,
    PRIMARY KEY (scope_prefix, key_id)
);
