-- fencecheck for PostgreSQL: the SQL face of host/postgres-ext.
-- Installed by CREATE EXTENSION fencecheck (the extension's own schema,
-- normally public, holds the fence_* functions; schema `fencecheck` holds
-- what only the extension touches).

CREATE SCHEMA fencecheck;
GRANT USAGE ON SCHEMA fencecheck TO PUBLIC;

-- The fence of every deleted row of a fenced table: a scope's state lives
-- in its row while the row exists and here after a fenced DELETE, so a
-- deleted scope can never be re-created below its mark. An INSERT locks
-- the scope's slot here (creating it, with a NULL state, if the scope was
-- never deleted) and the row that replaces it takes it away; a NULL state
-- is no mark. Owned by the
-- extension's owner, no privileges for anyone else: the trigger switches to
-- that role for its statements on it. `relid` is a regclass, which pg_dump
-- writes as the table's name, so tombstones survive dump and restore.
CREATE TABLE fencecheck.tombstones (
    relid       pg_catalog.regclass NOT NULL,
    scope       pg_catalog.text     NOT NULL,
    fence_state pg_catalog.bytea,
    PRIMARY KEY (relid, scope)
);
REVOKE ALL ON fencecheck.tombstones FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fencecheck.tombstones', '');

-- Signed tokens: a fenced table's scope that starts with `scope_prefix`
-- requires tokens signed by one of that prefix's keys (the longest prefix
-- decides, as in fencecheck's SQLite and PostgreSQL client layouts). Owned
-- by the extension's owner, no privileges for anyone else: the trigger
-- reads it as that role, so writers never see a secret. A superuser (or the
-- owner) manages it: INSERT INTO fencecheck.keys VALUES ('report/', 3, '\x…').
-- Kept by pg_dump, like the tombstones: a dump holds the secrets.
CREATE TABLE fencecheck.keys (
    scope_prefix pg_catalog.text   NOT NULL,
    key_id       pg_catalog.int8   NOT NULL CHECK (key_id BETWEEN 0 AND 4294967295),
    secret       pg_catalog.bytea  NOT NULL,
    PRIMARY KEY (scope_prefix, key_id)
);
REVOKE ALL ON fencecheck.keys FROM PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fencecheck.keys', '');

-- The check, with the same names, arguments and meaning as the SQLite
-- extension. Not STRICT: a NULL state means "no state yet", NULL op_id and
-- expected_version mean "no guard". IMMUTABLE: the answer is a function of
-- the arguments alone.
CREATE FUNCTION fence_check(
    state bytea, scope text, token text, policy text DEFAULT 'strict',
    op_id text DEFAULT NULL, expected_version bigint DEFAULT NULL
) RETURNS text
AS 'MODULE_PATHNAME', 'fencecheck_fence_check'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION fence_check(bytea, text, text, text, text, bigint) IS
'The decision''s name (applied, duplicate, stale-fence, version-conflict); changes nothing. Bad input raises (SQLSTATE class 5F).';

CREATE FUNCTION fence_next(
    state bytea, scope text, token text, policy text DEFAULT 'strict',
    op_id text DEFAULT NULL, expected_version bigint DEFAULT NULL
) RETURNS bytea
AS 'MODULE_PATHNAME', 'fencecheck_fence_next'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION fence_next(bytea, text, text, text, text, bigint) IS
'The new state when the decision is applied; raises for every other outcome (stale-fence 5F001, version-conflict 5F002, duplicate 5F003, …).';

-- The same with the scope's keys last (`ID:HEX,…`, or NULL for none): the
-- scope requires signed tokens (`TOKEN~KEY-ID~LEASE~TAG`), refused with
-- 5F014 unauthenticated otherwise. The 6-argument forms ignore a signature.
CREATE FUNCTION fence_check(
    state bytea, scope text, token text, policy text,
    op_id text, expected_version bigint, keys text
) RETURNS text
AS 'MODULE_PATHNAME', 'fencecheck_fence_check'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION fence_check(bytea, text, text, text, text, bigint, text) IS
'fence_check for a scope that requires signed tokens, verified with keys (ID:HEX,…); unauthenticated raises 5F014.';

CREATE FUNCTION fence_next(
    state bytea, scope text, token text, policy text,
    op_id text, expected_version bigint, keys text
) RETURNS bytea
AS 'MODULE_PATHNAME', 'fencecheck_fence_next'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION fence_next(bytea, text, text, text, text, bigint, text) IS
'fence_next for a scope that requires signed tokens, verified with keys (ID:HEX,…); unauthenticated raises 5F014.';

CREATE FUNCTION fence_inspect(state bytea) RETURNS jsonb
AS 'MODULE_PATHNAME', 'fencecheck_fence_inspect'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION fence_inspect(bytea) IS
'The decoded state as JSON (scope, authority, highest, version, window); corrupt bytes raise 5F006.';

CREATE FUNCTION fence_version() RETURNS text
AS 'MODULE_PATHNAME', 'fencecheck_fence_version'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION fence_version() IS
'The WIT package version of the component this extension runs (the one built into it), e.g. 0.1.0.';

CREATE FUNCTION fencecheck.row_trigger() RETURNS trigger
AS 'MODULE_PATHNAME', 'fencecheck_row_trigger'
LANGUAGE C;

CREATE FUNCTION fencecheck.truncate_trigger() RETURNS trigger
AS 'MODULE_PATHNAME', 'fencecheck_truncate_trigger'
LANGUAGE C;

-- Fenced tables: sql/protect.sql follows this file in the install script
-- (src/lib.rs).
