-- fencecheck 0.1.2: sql/fencecheck.sql, then sql/protect.sql (scripts/pg-package).

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

-- Fenced tables (0.1.2): the registry, the soundness checks, fence_protect
-- and fence_unprotect, and the event triggers that keep writers (and
-- mistakes) from changing how a fenced table is fenced. docs/postgres.md,
-- "Fenced tables", lists each path and its test. This text is in
-- fencecheck--0.1.1--0.1.2.sql as well (tests/upgrade.rs proves the two
-- installs equal, object for object).

-- The trigger functions run only where fence_protect put them: no role
-- but a superuser may name them in CREATE TRIGGER.
REVOKE ALL ON FUNCTION fencecheck.row_trigger() FROM PUBLIC;
REVOKE ALL ON FUNCTION fencecheck.truncate_trigger() FROM PUBLIC;

-- After a fenced INSERT: the scope's tombstone goes away with the row that
-- replaces it, never before (a skipped INSERT keeps it).
CREATE FUNCTION fencecheck.inserted_trigger() RETURNS trigger
AS 'MODULE_PATHNAME', 'fencecheck_inserted_trigger'
LANGUAGE C;
REVOKE ALL ON FUNCTION fencecheck.inserted_trigger() FROM PUBLIC;

-- Every fenced table, as fence_protect registered it. The row trigger
-- refuses to run on a table not here, or whose triggers, columns or key
-- differ from what was checked when it was registered. Readable by
-- everyone (pg_trigger shows the same), written only by the extension's
-- owner through fence_protect and fence_unprotect. Kept by pg_dump.
CREATE TABLE fencecheck.protected (
    relid        pg_catalog.regclass PRIMARY KEY,
    scope_column pg_catalog.text NOT NULL,
    token_column pg_catalog.text NOT NULL,
    state_column pg_catalog.text NOT NULL,
    policy       pg_catalog.text NOT NULL CHECK (policy IN ('strict', 'allow-equal'))
);
REVOKE ALL ON fencecheck.protected FROM PUBLIC;
GRANT SELECT ON fencecheck.protected TO PUBLIC;
SELECT pg_catalog.pg_extension_config_dump('fencecheck.protected', '');

-- Soundness, one implementation in the library (src/soundness.rs), read
-- through PostgreSQL's C API: the row trigger asks it once per backend and
-- table, fence_protect and the guard below through these functions.
--
-- Why `tbl` cannot be fenced soundly on these columns, or NULL: one row per
-- scope (a non-deferrable unique key on the scope alone, compared byte for
-- byte as the tombstones and key prefixes compare it), no row written
-- through another table (no inheritance, no partitions), marks that
-- survive a crash and the session (not unlogged, not temporary), and
-- columns of the types the trigger reads, none generated.
CREATE FUNCTION fencecheck.unfit(tbl regclass, scope_column text, token_column text, state_column text)
RETURNS text
AS 'MODULE_PATHNAME', 'fencecheck_unfit'
LANGUAGE C STABLE STRICT;

-- What is wrong with a fenced table's triggers, or NULL. With `complete`,
-- also every trigger fence_protect makes must be there (a restore creates
-- them one by one, so the DDL guard checks only what is present); with
-- `just`, only that trigger is compared with what fence_protect makes (the
-- guard, after a trigger's DDL: fence_protect replaces them one at a
-- time). The fence's row trigger must be the last BEFORE row trigger: one
-- that fires after it could change a row the fence approved.
CREATE FUNCTION fencecheck.trigger_trouble(tbl regclass, complete boolean, just name DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'fencecheck_trigger_trouble'
LANGUAGE C STABLE;

-- Why the fenced table `tbl` is not fenced soundly now, or NULL (unfit,
-- unregistered, or its triggers not intact). The row trigger refuses every
-- row while it is not NULL.
CREATE FUNCTION fencecheck.unsound(tbl regclass) RETURNS text
AS 'MODULE_PATHNAME', 'fencecheck_unsound'
LANGUAGE C STABLE STRICT;

-- fence_protect's work, run as the extension's owner for `caller` (the
-- role that called fence_protect, passed by the C entry point): only the
-- table's owner, or a superuser, may change how a table is fenced. Returns
-- NULL, or the refusal as 'SQLSTATE message' for the entry point to raise
-- (an error raised here would lose its SQLSTATE on the way back through
-- SPI), having changed nothing.
CREATE FUNCTION fencecheck.protect(tbl regclass, scope_column text, token_column text,
                                   state_column text, policy text, caller oid)
RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    reason text;
BEGIN
    IF tbl IS NULL OR scope_column IS NULL OR token_column IS NULL
       OR state_column IS NULL OR policy IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '5F012',
            MESSAGE = 'invalid-argument: fence_protect takes no NULL argument';
    END IF;
    IF NOT pg_has_role(caller, (SELECT relowner FROM pg_class WHERE oid = tbl), 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('must be owner of table %s to change how it is fenced', tbl);
    END IF;
    IF policy NOT IN ('strict', 'allow-equal') THEN
        RAISE EXCEPTION USING ERRCODE = '5F012',
            MESSAGE = format('invalid-argument: policy must be ''strict'' or ''allow-equal'', got %L', policy);
    END IF;
    reason := fencecheck.unfit(tbl, scope_column, token_column, state_column);
    IF reason IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '5F012', MESSAGE = 'invalid-argument: ' || reason,
            HINT = 'one row per scope, written only through this table: README, "Fenced tables"';
    END IF;
    INSERT INTO fencecheck.protected AS p VALUES (tbl, scope_column, token_column, state_column, policy)
        ON CONFLICT (relid) DO UPDATE
        SET scope_column = EXCLUDED.scope_column, token_column = EXCLUDED.token_column,
            state_column = EXCLUDED.state_column, policy = EXCLUDED.policy;
    EXECUTE format(
        'CREATE OR REPLACE TRIGGER zz_fencecheck_row BEFORE INSERT OR UPDATE OR DELETE ON %s '
        'FOR EACH ROW EXECUTE FUNCTION fencecheck.row_trigger(%L, %L, %L, %L)',
        tbl, scope_column, token_column, state_column, policy);
    EXECUTE format(
        'CREATE OR REPLACE TRIGGER fencecheck_inserted AFTER INSERT ON %s '
        'FOR EACH ROW EXECUTE FUNCTION fencecheck.inserted_trigger(%L, %L, %L, %L)',
        tbl, scope_column, token_column, state_column, policy);
    EXECUTE format(
        'CREATE OR REPLACE TRIGGER fencecheck_truncate BEFORE TRUNCATE ON %s '
        'FOR EACH STATEMENT EXECUTE FUNCTION fencecheck.truncate_trigger()', tbl);
    -- 0.1.0 and 0.1.1 named the row trigger fencecheck_row, which sorts
    -- before most of an owner's own BEFORE triggers.
    IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = tbl AND tgname = 'fencecheck_row') THEN
        EXECUTE format('DROP TRIGGER fencecheck_row ON %s', tbl);
    END IF;
    reason := fencecheck.unsound(tbl);
    IF reason IS NOT NULL THEN
        RAISE EXCEPTION USING ERRCODE = '5F016', MESSAGE = 'unsound-fence: ' || reason;
    END IF;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
END
$fn$;
REVOKE ALL ON FUNCTION fencecheck.protect(regclass, text, text, text, text, oid) FROM PUBLIC;

-- fence_unprotect's work, as fencecheck.protect. Tombstones stay: a later
-- fence_protect of the same table decides against them again.
CREATE FUNCTION fencecheck.unprotect(tbl regclass, caller oid) RETURNS text
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    name name;
BEGIN
    IF tbl IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = '5F012',
            MESSAGE = 'invalid-argument: fence_unprotect takes no NULL argument';
    END IF;
    IF NOT pg_has_role(caller, (SELECT relowner FROM pg_class WHERE oid = tbl), 'USAGE') THEN
        RAISE EXCEPTION USING ERRCODE = '42501',
            MESSAGE = format('must be owner of table %s to change how it is fenced', tbl);
    END IF;
    DELETE FROM fencecheck.protected WHERE relid = tbl;
    FOR name IN SELECT tgname FROM pg_trigger WHERE tgrelid = tbl
                   AND tgname IN ('zz_fencecheck_row', 'fencecheck_inserted', 'fencecheck_truncate', 'fencecheck_row')
    LOOP
        EXECUTE format('DROP TRIGGER %I ON %s', name, tbl);
    END LOOP;
    RETURN NULL;
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
END
$fn$;
REVOKE ALL ON FUNCTION fencecheck.unprotect(regclass, oid) FROM PUBLIC;

-- Make every INSERT, UPDATE and DELETE of `tbl` present a token the check
-- applies, and keep each row's state in `state_column`. Only the table's
-- owner (or a superuser) may call it with effect.
CREATE OR REPLACE FUNCTION fence_protect(
    tbl regclass, scope_column text, token_column text, state_column text,
    policy text DEFAULT 'strict'
) RETURNS void
AS 'MODULE_PATHNAME', 'fencecheck_fence_protect'
LANGUAGE C;

-- Remove the protection, for a table's owner who means to.
CREATE OR REPLACE FUNCTION fence_unprotect(tbl regclass) RETURNS void
AS 'MODULE_PATHNAME', 'fencecheck_fence_unprotect'
LANGUAGE C;

-- The guard: after DDL that can change how a fenced table is fenced, the
-- table must still be fit (fencecheck.unfit) and its triggers intact
-- (fencecheck.trigger_trouble); only the table's owner may create a trigger
-- on it; fencecheck's trigger functions run only on registered tables.
-- Runs as the role that ran the DDL (it needs no privilege: the registry
-- is readable by everyone).
CREATE FUNCTION fencecheck.guard() RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    cmd record;
    rel regclass;
    trig record;
    reason text;
    ours regprocedure[] := ARRAY['fencecheck.row_trigger()'::regprocedure,
                                 'fencecheck.inserted_trigger()'::regprocedure,
                                 'fencecheck.truncate_trigger()'::regprocedure];
BEGIN
    FOR cmd IN SELECT * FROM pg_event_trigger_ddl_commands() LOOP
        IF cmd.classid = 'pg_trigger'::regclass THEN
            SELECT tgrelid, tgfoid, tgname INTO trig FROM pg_trigger WHERE oid = cmd.objid;
            CONTINUE WHEN NOT FOUND;
            rel := trig.tgrelid;
            IF NOT EXISTS (SELECT 1 FROM fencecheck.protected WHERE relid = rel) THEN
                IF trig.tgfoid = ANY (ours) THEN
                    RAISE EXCEPTION USING ERRCODE = '5F016',
                        MESSAGE = format('unsound-fence: %s is not fenced by fence_protect: fencecheck''s trigger functions run only on the tables it fenced', rel);
                END IF;
                CONTINUE;
            END IF;
            IF cmd.command_tag = 'CREATE TRIGGER'
               AND NOT pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = rel), 'USAGE') THEN
                RAISE EXCEPTION USING ERRCODE = '42501',
                    MESSAGE = format('must be owner of table %s to create a trigger on it: it is fenced', rel);
            END IF;
            reason := fencecheck.trigger_trouble(rel, false, trig.tgname);
        ELSIF cmd.classid = 'pg_class'::regclass THEN
            -- The table itself, and any table it now inherits from or
            -- passes its rows to.
            SELECT string_agg(r, '; ') INTO reason FROM (
                SELECT coalesce(fencecheck.unfit(f.relid, f.scope_column, f.token_column, f.state_column),
                                fencecheck.trigger_trouble(f.relid, false)) AS r
                  FROM fencecheck.protected f
                 WHERE f.relid = cmd.objid
                    OR f.relid IN (SELECT inhparent FROM pg_inherits WHERE inhrelid = cmd.objid)
                    OR f.relid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = cmd.objid)) x;
        ELSE
            CONTINUE;
        END IF;
        IF reason IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = '5F016', MESSAGE = 'unsound-fence: ' || reason,
                HINT = 'to change how a table is fenced: fence_unprotect, change it, fence_protect';
        END IF;
    END LOOP;
END
$fn$;

-- The registration of a table that no longer exists (this only ever
-- removes a dropped table's entry and tombstones, so anyone may call it).
CREATE FUNCTION fencecheck.forget(tbl oid) RETURNS void
LANGUAGE sql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    DELETE FROM fencecheck.protected
     WHERE relid = tbl AND NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = tbl);
    DELETE FROM fencecheck.tombstones
     WHERE relid = tbl AND NOT EXISTS (SELECT 1 FROM pg_class WHERE oid = tbl);
$fn$;

-- On DROP: a dropped fenced table is forgotten; fence_protect's triggers
-- may be dropped only by dropping the table or through fence_unprotect.
CREATE FUNCTION fencecheck.on_drop() RETURNS event_trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    d record;
    rel regclass;
BEGIN
    -- DROP EXTENSION fencecheck CASCADE drops the registry too.
    IF to_regclass('fencecheck.protected') IS NULL THEN
        RETURN;
    END IF;
    FOR d IN SELECT * FROM pg_event_trigger_dropped_objects() LOOP
        IF d.object_type = 'table' THEN
            PERFORM fencecheck.forget(d.objid);
        ELSIF d.object_type = 'trigger'
              AND d.address_names[3] IN ('zz_fencecheck_row', 'fencecheck_inserted', 'fencecheck_truncate') THEN
            rel := to_regclass(quote_ident(d.address_names[1]) || '.' || quote_ident(d.address_names[2]));
            IF rel IS NOT NULL AND EXISTS (SELECT 1 FROM fencecheck.protected WHERE relid = rel) THEN
                RAISE EXCEPTION USING ERRCODE = '5F016',
                    MESSAGE = format('unsound-fence: %s is fenced: drop its trigger %I with fence_unprotect(%L)', rel, d.address_names[3], rel::text);
            END IF;
        END IF;
    END LOOP;
END
$fn$;

-- Key changes: every backend's cached key set is dropped (a relcache
-- invalidation of fencecheck.keys), and the change waits for the fenced
-- writes in flight while new ones wait for it (SHARE ROW EXCLUSIVE on every
-- fenced table), so no write commits after the change decided by the keys
-- before it.
CREATE FUNCTION fencecheck.keys_changed() RETURNS trigger
AS 'MODULE_PATHNAME', 'fencecheck_keys_changed'
LANGUAGE C;
REVOKE ALL ON FUNCTION fencecheck.keys_changed() FROM PUBLIC;
CREATE TRIGGER fencecheck_keys_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE ON fencecheck.keys
    FOR EACH STATEMENT EXECUTE FUNCTION fencecheck.keys_changed();

-- Decisions counted by operation and outcome since the server started
-- (coverage `cluster`: the library is in shared_preload_libraries) or,
-- without that, since this session loaded the library (coverage
-- `session`). No per-scope labels: 5 operations × 7 outcomes.
CREATE FUNCTION fencecheck.decision_counts() RETURNS bigint[]
AS 'MODULE_PATHNAME', 'fencecheck_decision_counts'
LANGUAGE C STRICT;
CREATE FUNCTION fencecheck.decision_coverage() RETURNS text
AS 'MODULE_PATHNAME', 'fencecheck_decision_coverage'
LANGUAGE C STRICT;
-- The same counters by epoch too, as Prometheus text under the cross-host
-- metric table's name (docs/design.md §12), for a scraper's query.
CREATE FUNCTION fencecheck.metrics() RETURNS text
AS 'MODULE_PATHNAME', 'fencecheck_metrics'
LANGUAGE C STRICT;
GRANT EXECUTE ON FUNCTION fencecheck.metrics() TO PUBLIC;

CREATE VIEW fencecheck.decisions AS
SELECT o.operation, d.outcome, c.counts[(o.n - 1) * 7 + d.n] AS decisions,
       fencecheck.decision_coverage() AS coverage
  FROM fencecheck.decision_counts() AS c(counts),
       (VALUES (1, 'insert'), (2, 'update'), (3, 'delete'), (4, 'fence_check'), (5, 'fence_next'))
           AS o(n, operation),
       (VALUES (1, 'applied'), (2, 'duplicate'), (3, 'stale-fence'), (4, 'version-conflict'),
               (5, 'unauthenticated'), (6, 'refused'), (7, 'error')) AS d(n, outcome);
GRANT SELECT ON fencecheck.decisions TO PUBLIC;

-- Event triggers last: the script's own DDL above is not theirs to judge.
CREATE EVENT TRIGGER fencecheck_guard ON ddl_command_end
    WHEN TAG IN ('CREATE TRIGGER', 'ALTER TRIGGER', 'ALTER TABLE', 'CREATE TABLE')
    EXECUTE FUNCTION fencecheck.guard();
CREATE EVENT TRIGGER fencecheck_on_drop ON sql_drop
    EXECUTE FUNCTION fencecheck.on_drop();
