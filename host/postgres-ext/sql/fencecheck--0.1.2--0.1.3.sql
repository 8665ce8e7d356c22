-- fencecheck 0.1.2 -> 0.1.3 (ALTER EXTENSION fencecheck UPDATE): the hints
-- point at docs/postgres.md's sections (README's moved there). Only two
-- functions' texts change: fence_protect's work (a HINT no client ever saw,
-- as the library now adds it) and the DDL guard's HINT. Each is defined as
-- sql/protect.sql defines it, CREATE OR REPLACE (tests/ext/upgrade.rs
-- checks the text, and that a fresh and an updated install are equal);
-- owners and privileges stay. The 0.1.3 library serves 0.1.2's objects
-- as they are, so fenced tables keep working until this runs.

CREATE OR REPLACE FUNCTION fencecheck.protect(tbl regclass, scope_column text, token_column text,
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
        -- No HINT: the handler below keeps only the code and message; the
        -- entry point adds the hint (src/protect.rs).
        RAISE EXCEPTION USING ERRCODE = '5F012', MESSAGE = 'invalid-argument: ' || reason;
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

CREATE OR REPLACE FUNCTION fencecheck.guard() RETURNS event_trigger
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
                HINT = 'to change how a table is fenced: fence_unprotect, change it, fence_protect (docs/postgres.md#changing-a-fenced-table)';
        END IF;
    END LOOP;
END
$fn$;
