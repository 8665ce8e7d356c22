-- fencecheck 0.1.0 -> 0.1.1 (ALTER EXTENSION fencecheck UPDATE): signed
-- tokens. Adds fencecheck.keys (read by the fenced-table trigger) and the
-- 7-argument fence_check/fence_next; the 0.1.1 library serves every 0.1.0
-- object unchanged (a 6-argument call, an existing fenced table).

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
