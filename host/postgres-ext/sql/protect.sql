-- Fenced tables (0.1.2): the registry, the soundness checks, fence_protect
-- and fence_unprotect, and the event triggers that keep writers (and
-- mistakes) from changing how a fenced table is fenced. README, "Fenced
-- tables", lists each path and its test. This text is in
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

-- pg_trigger.tgargs of a trigger made with these arguments.
CREATE FUNCTION fencecheck.trigger_args(VARIADIC args text[]) RETURNS bytea
LANGUAGE sql STABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT coalesce(string_agg(convert_to(a, getdatabaseencoding()) || '\x00'::bytea, ''::bytea ORDER BY n), ''::bytea)
      FROM unnest(args) WITH ORDINALITY AS x(a, n)
$fn$;

-- Why `tbl` cannot be fenced soundly on these columns, or NULL: one row per
-- scope (a non-deferrable unique key on the scope alone, compared byte for
-- byte as the tombstones and key prefixes compare it), no row written
-- through another table (no inheritance, no partitions), marks that
-- survive a crash (not unlogged), and columns of the types the trigger
-- reads.
CREATE FUNCTION fencecheck.unfit(tbl regclass, scope_column text, token_column text, state_column text)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    rel record;
    col record;
    att record;
    scope_att smallint;
BEGIN
    SELECT relkind, relispartition, relpersistence INTO rel FROM pg_class WHERE oid = tbl;
    IF NOT FOUND THEN
        RETURN format('relation %s does not exist', tbl::oid);
    END IF;
    IF rel.relkind = 'p' OR rel.relispartition THEN
        RETURN format('%s is partitioned or a partition: a fenced table is one plain table', tbl);
    END IF;
    IF rel.relkind <> 'r' THEN
        RETURN format('%s is not a table', tbl);
    END IF;
    IF rel.relpersistence = 'u' THEN
        RETURN format('%s is unlogged: its marks would not survive a crash', tbl);
    END IF;
    IF EXISTS (SELECT 1 FROM pg_inherits WHERE inhrelid = tbl OR inhparent = tbl) THEN
        RETURN format('%s inherits from or is inherited by another table: rows of a child are written through its parent without a token', tbl);
    END IF;
    IF scope_column = token_column OR scope_column = state_column OR token_column = state_column THEN
        RETURN 'the scope, token and state columns must be three different columns';
    END IF;
    FOR col IN SELECT * FROM (VALUES
            ('scope', scope_column, ARRAY['text'::regtype, 'varchar'::regtype], 'text or varchar'),
            ('token', token_column, ARRAY['text'::regtype, 'varchar'::regtype], 'text or varchar'),
            ('state', state_column, ARRAY['bytea'::regtype], 'bytea')) AS c(role, name, types, wanted)
    LOOP
        SELECT attnum, atttypid, attgenerated, attcollation INTO att FROM pg_attribute
         WHERE attrelid = tbl AND attname = col.name AND attnum > 0 AND NOT attisdropped;
        IF NOT FOUND THEN
            RETURN format('%s has no column %I', tbl, col.name);
        END IF;
        IF NOT att.atttypid = ANY (col.types) THEN
            RETURN format('the %s column %I must be %s, it is %s', col.role, col.name, col.wanted, att.atttypid::regtype);
        END IF;
        IF att.attgenerated <> '' THEN
            RETURN format('the %s column %I is generated', col.role, col.name);
        END IF;
        IF col.role = 'scope' THEN
            IF NOT coalesce((SELECT collisdeterministic FROM pg_collation WHERE oid = att.attcollation), false) THEN
                RETURN format('the scope column %I has a nondeterministic collation: two spellings of one scope would be two high-water marks', col.name);
            END IF;
            scope_att := att.attnum;
        END IF;
    END LOOP;
    -- One row per scope: two rows of one scope would be two high-water marks.
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i
         WHERE i.indrelid = tbl AND i.indisunique AND i.indimmediate
           AND i.indisvalid AND i.indisready AND i.indislive
           AND i.indnkeyatts = 1 AND i.indkey[0] = scope_att
           AND i.indpred IS NULL AND i.indexprs IS NULL
           AND coalesce((SELECT collisdeterministic FROM pg_collation WHERE oid = i.indcollation[0]), false)
    ) THEN
        RETURN format('%s needs a primary key or unique index on %I alone, not deferrable, with a deterministic collation', tbl, scope_column);
    END IF;
    RETURN NULL;
END
$fn$;

-- What is wrong with a fenced table's triggers, or NULL. With `complete`,
-- also every trigger fence_protect makes must be there (a restore creates
-- them one by one, so the DDL guard checks only what is present); with
-- `just`, only that trigger is compared with what fence_protect makes (the
-- guard, after a trigger's DDL: fence_protect replaces them one at a time).
-- The fence's row trigger must be the last BEFORE row trigger: one that
-- fires after it could change a row the fence approved.
CREATE FUNCTION fencecheck.trigger_trouble(p fencecheck.protected, complete boolean, just name DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    args bytea := fencecheck.trigger_args(p.scope_column, p.token_column, p.state_column, p.policy);
    want record;
    t record;
BEGIN
    -- tgtype bits: ROW 1, BEFORE 2, INSERT 4, DELETE 8, UPDATE 16, TRUNCATE 32.
    FOR want IN SELECT * FROM (VALUES
            ('zz_fencecheck_row', 'fencecheck.row_trigger()'::regprocedure, 31, args),
            ('fencecheck_inserted', 'fencecheck.inserted_trigger()'::regprocedure, 5, args),
            ('fencecheck_truncate', 'fencecheck.truncate_trigger()'::regprocedure, 34, ''::bytea))
            AS w(name, fn, type, args)
    LOOP
        CONTINUE WHEN just IS NOT NULL AND just <> want.name;
        SELECT tgfoid, tgtype, tgenabled, tgqual, tgattr, tgargs INTO t FROM pg_trigger
         WHERE tgrelid = p.relid AND tgname = want.name;
        IF NOT FOUND THEN
            IF complete THEN
                RETURN format('%s: its trigger %I is missing', p.relid, want.name);
            END IF;
            CONTINUE;
        END IF;
        IF t.tgfoid <> want.fn OR t.tgtype <> want.type OR t.tgenabled NOT IN ('O', 'A')
           OR t.tgqual IS NOT NULL OR t.tgattr::text <> '' OR t.tgargs <> want.args THEN
            RETURN format('%s: its trigger %I is not the one fence_protect made (disabled, conditional, or another function, event or argument list)', p.relid, want.name);
        END IF;
    END LOOP;
    SELECT tgname INTO t FROM pg_trigger
     WHERE tgrelid = p.relid AND (just IS NULL OR tgname = just)
       AND tgfoid IN ('fencecheck.row_trigger()'::regprocedure, 'fencecheck.inserted_trigger()'::regprocedure,
                      'fencecheck.truncate_trigger()'::regprocedure)
       AND tgname NOT IN ('zz_fencecheck_row', 'fencecheck_inserted', 'fencecheck_truncate')
     LIMIT 1;
    IF FOUND THEN
        RETURN format('%s: trigger %I runs a fencecheck trigger function but is not one fence_protect made', p.relid, t.tgname);
    END IF;
    SELECT tgname INTO t FROM pg_trigger
     WHERE tgrelid = p.relid AND tgenabled <> 'D'
       AND (tgtype::int & 3) = 3 AND (tgtype::int & 28) <> 0
       AND tgname::text COLLATE "C" > 'zz_fencecheck_row'
     ORDER BY tgname LIMIT 1;
    IF FOUND THEN
        RETURN format('%s: BEFORE trigger %I fires after zz_fencecheck_row and could change a row the fence approved: give it a name that sorts before zz_fencecheck_row', p.relid, t.tgname);
    END IF;
    RETURN NULL;
END
$fn$;

-- Why the fenced table `tbl` is not fenced soundly now, or NULL. The row
-- trigger asks this once per backend and table (again after any change to
-- the table's definition) and refuses every row while it is not NULL.
CREATE FUNCTION fencecheck.unsound(tbl regclass) RETURNS text
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $fn$
DECLARE
    p fencecheck.protected;
BEGIN
    SELECT * INTO p FROM fencecheck.protected WHERE relid = tbl;
    IF NOT FOUND THEN
        RETURN format('%s is not fenced by fence_protect', tbl);
    END IF;
    RETURN coalesce(fencecheck.unfit(tbl, p.scope_column, p.token_column, p.state_column),
                    fencecheck.trigger_trouble(p, true));
END
$fn$;

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
    p fencecheck.protected;
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
            SELECT * INTO p FROM fencecheck.protected WHERE relid = rel;
            IF NOT FOUND THEN
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
            reason := fencecheck.trigger_trouble(p, false, trig.tgname);
        ELSIF cmd.classid = 'pg_class'::regclass THEN
            -- The table itself, and any table it now inherits from or
            -- passes its rows to.
            SELECT string_agg(r, '; ') INTO reason FROM (
                SELECT coalesce(fencecheck.unfit(f.relid, f.scope_column, f.token_column, f.state_column),
                                fencecheck.trigger_trouble(f, false)) AS r
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
