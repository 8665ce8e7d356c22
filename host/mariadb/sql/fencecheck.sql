-- fencecheck for MariaDB: the functions and fenced tables.
--
-- Run as an administrator after copying libfencecheck_mariadb.so into the
-- server's plugin_dir (scripts/install-mariadb.sh does both):
--   mariadb -u root < fencecheck.sql
-- docs/mariadb.md is the reference.

CREATE FUNCTION IF NOT EXISTS fence_check RETURNS STRING SONAME 'libfencecheck_mariadb.so';
CREATE FUNCTION IF NOT EXISTS fence_next RETURNS STRING SONAME 'libfencecheck_mariadb.so';
CREATE FUNCTION IF NOT EXISTS fence_inspect RETURNS STRING SONAME 'libfencecheck_mariadb.so';
CREATE FUNCTION IF NOT EXISTS fence_version RETURNS STRING SONAME 'libfencecheck_mariadb.so';

CREATE DATABASE IF NOT EXISTS fencecheck;

-- The last state of every deleted row of a fenced table: a scope deleted
-- and inserted again continues from it, so a delete never resets the mark.
CREATE TABLE IF NOT EXISTS fencecheck.tombstones (
    db    VARCHAR(64) COLLATE utf8mb4_bin NOT NULL,
    tbl   VARCHAR(64) COLLATE utf8mb4_bin NOT NULL,
    scope VARBINARY(1024) NOT NULL,
    state BLOB NOT NULL,
    PRIMARY KEY (db, tbl, scope)
) ENGINE=InnoDB;

-- The fenced tables and their columns.
CREATE TABLE IF NOT EXISTS fencecheck.protected (
    db        VARCHAR(64) COLLATE utf8mb4_bin NOT NULL,
    tbl       VARCHAR(64) COLLATE utf8mb4_bin NOT NULL,
    scope_col VARCHAR(64) NOT NULL,
    token_col VARCHAR(64) NOT NULL,
    state_col VARCHAR(64) NOT NULL,
    PRIMARY KEY (db, tbl)
) ENGINE=InnoDB;

DELIMITER $$

-- Re-raise a refusal or error message (`name: detail`) with its SQLSTATE
-- (class 5F, the same codes as the PostgreSQL extension).
CREATE OR REPLACE PROCEDURE fencecheck.raise(msg TEXT)
    DETERMINISTIC NO SQL
BEGIN
    DECLARE m VARCHAR(512) DEFAULT LEFT(COALESCE(msg, 'runtime-error: no message'), 512);
    CASE SUBSTRING_INDEX(m, ':', 1)
        WHEN 'stale-fence' THEN SIGNAL SQLSTATE '5F001' SET MESSAGE_TEXT = m;
        WHEN 'version-conflict' THEN SIGNAL SQLSTATE '5F002' SET MESSAGE_TEXT = m;
        WHEN 'duplicate' THEN SIGNAL SQLSTATE '5F003' SET MESSAGE_TEXT = m;
        WHEN 'invalid-token' THEN SIGNAL SQLSTATE '5F004' SET MESSAGE_TEXT = m;
        WHEN 'invalid-request' THEN SIGNAL SQLSTATE '5F005' SET MESSAGE_TEXT = m;
        WHEN 'corrupt-state' THEN SIGNAL SQLSTATE '5F006' SET MESSAGE_TEXT = m;
        WHEN 'unsupported-state-version' THEN SIGNAL SQLSTATE '5F007' SET MESSAGE_TEXT = m;
        WHEN 'scope-mismatch' THEN SIGNAL SQLSTATE '5F008' SET MESSAGE_TEXT = m;
        WHEN 'foreign-authority' THEN SIGNAL SQLSTATE '5F009' SET MESSAGE_TEXT = m;
        WHEN 'exhausted' THEN SIGNAL SQLSTATE '5F010' SET MESSAGE_TEXT = m;
        WHEN 'fence-required' THEN SIGNAL SQLSTATE '5F011' SET MESSAGE_TEXT = m;
        WHEN 'invalid-argument' THEN SIGNAL SQLSTATE '5F012' SET MESSAGE_TEXT = m;
        WHEN 'too-large' THEN SIGNAL SQLSTATE '5F013' SET MESSAGE_TEXT = m;
        WHEN 'unauthenticated' THEN SIGNAL SQLSTATE '5F014' SET MESSAGE_TEXT = m;
        WHEN 'invalid-keys' THEN SIGNAL SQLSTATE '5F015' SET MESSAGE_TEXT = m;
        WHEN 'unsound-fence' THEN SIGNAL SQLSTATE '5F016' SET MESSAGE_TEXT = m;
        ELSE SIGNAL SQLSTATE '5F900' SET MESSAGE_TEXT = m;
    END CASE;
END$$

-- fencecheck.protect('db.table', scope_col, token_col, state_col): fence
-- every INSERT, UPDATE, DELETE, REPLACE, INSERT ... ON DUPLICATE KEY UPDATE
-- and LOAD DATA on the table with triggers that run fence_next. Refuses
-- (5F016 unsound-fence) what it cannot fence: a non-InnoDB table, a scope
-- column that is not alone in a unique key or compares other than byte for
-- byte (case-/accent-insensitive or PAD SPACE collations), a state column
-- that is not binary, other triggers on the table.
CREATE OR REPLACE PROCEDURE fencecheck.protect(
    target VARCHAR(200), scope_col VARCHAR(64), token_col VARCHAR(64), state_col VARCHAR(64))
    SQL SECURITY INVOKER
BEGIN
    DECLARE db VARCHAR(64);
    DECLARE tbl VARCHAR(64);
    DECLARE n INT;
    DECLARE t TEXT;
    IF target IS NULL OR scope_col IS NULL OR token_col IS NULL OR state_col IS NULL
       OR LOCATE('.', target) = 0 OR CONCAT(target, scope_col, token_col, state_col) LIKE '%{%' THEN
        CALL fencecheck.raise('invalid-argument: protect(''db.table'', scope_col, token_col, state_col), all four given');
    END IF;
    SET db = SUBSTRING_INDEX(target, '.', 1);
    SET tbl = SUBSTRING(target, LENGTH(db) + 2);
    SELECT COUNT(*) INTO n FROM information_schema.TABLES
     WHERE TABLE_SCHEMA = db AND TABLE_NAME = tbl AND ENGINE = 'InnoDB';
    IF n <> 1 THEN
        CALL fencecheck.raise(CONCAT('unsound-fence: ', target, ' is not an InnoDB table'));
    END IF;
    SELECT COUNT(*) INTO n FROM information_schema.COLUMNS
     WHERE TABLE_SCHEMA = db AND TABLE_NAME = tbl AND COLUMN_NAME = scope_col
       AND (DATA_TYPE = 'varbinary' OR COLLATION_NAME LIKE '%\_nopad\_bin');
    IF n <> 1 THEN
        CALL fencecheck.raise(CONCAT('unsound-fence: scope column ', scope_col,
            ' must be VARBINARY or use a _nopad_bin collation (others compare scopes that differ)'));
    END IF;
    SELECT COUNT(*) INTO n FROM information_schema.STATISTICS s
     WHERE s.TABLE_SCHEMA = db AND s.TABLE_NAME = tbl AND s.NON_UNIQUE = 0
       AND s.COLUMN_NAME = scope_col AND s.SUB_PART IS NULL
       AND (SELECT COUNT(*) FROM information_schema.STATISTICS o
             WHERE o.TABLE_SCHEMA = db AND o.TABLE_NAME = tbl AND o.INDEX_NAME = s.INDEX_NAME) = 1;
    IF n < 1 THEN
        CALL fencecheck.raise(CONCAT('unsound-fence: scope column ', scope_col,
            ' must be alone in a PRIMARY or UNIQUE key (one row, one state per scope)'));
    END IF;
    SELECT COUNT(*) INTO n FROM information_schema.COLUMNS
     WHERE TABLE_SCHEMA = db AND TABLE_NAME = tbl AND COLUMN_NAME = state_col
       AND DATA_TYPE IN ('varbinary', 'blob', 'mediumblob', 'longblob');
    IF n <> 1 THEN
        CALL fencecheck.raise(CONCAT('unsound-fence: state column ', state_col, ' must be VARBINARY or BLOB'));
    END IF;
    SELECT COUNT(*) INTO n FROM information_schema.COLUMNS
     WHERE TABLE_SCHEMA = db AND TABLE_NAME = tbl AND COLUMN_NAME = token_col
       AND DATA_TYPE IN ('varchar', 'char', 'varbinary', 'text');
    IF n <> 1 THEN
        CALL fencecheck.raise(CONCAT('unsound-fence: token column ', token_col, ' must be a string column'));
    END IF;
    SELECT COUNT(*) INTO n FROM information_schema.TRIGGERS
     WHERE EVENT_OBJECT_SCHEMA = db AND EVENT_OBJECT_TABLE = tbl
       AND TRIGGER_NAME NOT IN ('fencecheck_bi', 'fencecheck_bu', 'fencecheck_bd');
    IF n <> 0 THEN
        CALL fencecheck.raise(CONCAT('unsound-fence: ', target,
            ' has other triggers, which could change a row after the fence decided'));
    END IF;

    SET t = 'CREATE OR REPLACE TRIGGER {DBQ}.`fencecheck_bi` BEFORE INSERT ON {T} FOR EACH ROW
BEGIN
    DECLARE prior BLOB DEFAULT NULL;
    DECLARE tok VARCHAR(1024) DEFAULT COALESCE(NEW.{K}, @fencecheck_token);
    DECLARE msg TEXT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
    DECLARE EXIT HANDLER FOR 1644 BEGIN
        GET DIAGNOSTICS CONDITION 1 msg = MESSAGE_TEXT;
        CALL fencecheck.raise(msg);
    END;
    IF tok IS NULL THEN
        CALL fencecheck.raise(''fence-required: set the token column or @fencecheck_token'');
    END IF;
    SELECT {V} INTO prior FROM {T} WHERE {S} = NEW.{S};
    IF prior IS NULL THEN
        SELECT state INTO prior FROM fencecheck.tombstones
         WHERE db = {DB} AND tbl = {TBL} AND scope = CAST(NEW.{S} AS BINARY) FOR UPDATE;
    END IF;
    SET NEW.{V} = fence_next(prior, NEW.{S}, tok, ''strict'', NULL, NULL);
    SET NEW.{K} = tok;
END';
    CALL fencecheck.run_ddl(t, db, tbl, scope_col, token_col, state_col);

    SET t = 'CREATE OR REPLACE TRIGGER {DBQ}.`fencecheck_bu` BEFORE UPDATE ON {T} FOR EACH ROW
BEGIN
    DECLARE tok VARCHAR(1024) DEFAULT CASE
        WHEN NEW.{K} IS NOT NULL AND NOT (NEW.{K} <=> OLD.{K}) THEN NEW.{K}
        ELSE COALESCE(@fencecheck_token, NEW.{K}) END;
    DECLARE msg TEXT;
    DECLARE EXIT HANDLER FOR 1644 BEGIN
        GET DIAGNOSTICS CONDITION 1 msg = MESSAGE_TEXT;
        CALL fencecheck.raise(msg);
    END;
    IF tok IS NULL THEN
        CALL fencecheck.raise(''fence-required: set the token column or @fencecheck_token'');
    END IF;
    SET NEW.{V} = fence_next(OLD.{V}, NEW.{S}, tok, ''strict'', NULL, NULL);
    SET NEW.{K} = tok;
END';
    CALL fencecheck.run_ddl(t, db, tbl, scope_col, token_col, state_col);

    SET t = 'CREATE OR REPLACE TRIGGER {DBQ}.`fencecheck_bd` BEFORE DELETE ON {T} FOR EACH ROW
BEGIN
    DECLARE tok VARCHAR(1024) DEFAULT @fencecheck_token;
    DECLARE st BLOB;
    DECLARE msg TEXT;
    DECLARE EXIT HANDLER FOR 1644 BEGIN
        GET DIAGNOSTICS CONDITION 1 msg = MESSAGE_TEXT;
        CALL fencecheck.raise(msg);
    END;
    IF tok IS NULL THEN
        CALL fencecheck.raise(''fence-required: a DELETE (and a REPLACE) needs @fencecheck_token'');
    END IF;
    SET st = fence_next(OLD.{V}, OLD.{S}, tok, ''strict'', NULL, NULL);
    INSERT INTO fencecheck.tombstones (db, tbl, scope, state)
    VALUES ({DB}, {TBL}, CAST(OLD.{S} AS BINARY), st)
    ON DUPLICATE KEY UPDATE state = VALUES(state);
END';
    CALL fencecheck.run_ddl(t, db, tbl, scope_col, token_col, state_col);

    REPLACE INTO fencecheck.protected VALUES (db, tbl, scope_col, token_col, state_col);
END$$

-- Expand a trigger template and run it.
CREATE OR REPLACE PROCEDURE fencecheck.run_ddl(
    t TEXT, db VARCHAR(64), tbl VARCHAR(64), scope_col VARCHAR(64), token_col VARCHAR(64),
    state_col VARCHAR(64))
    SQL SECURITY INVOKER
BEGIN
    SET t = REPLACE(t, '{DBQ}', CONCAT('`', REPLACE(db, '`', '``'), '`'));
    SET t = REPLACE(t, '{T}', CONCAT('`', REPLACE(db, '`', '``'), '`.`', REPLACE(tbl, '`', '``'), '`'));
    SET t = REPLACE(t, '{S}', CONCAT('`', REPLACE(scope_col, '`', '``'), '`'));
    SET t = REPLACE(t, '{K}', CONCAT('`', REPLACE(token_col, '`', '``'), '`'));
    SET t = REPLACE(t, '{V}', CONCAT('`', REPLACE(state_col, '`', '``'), '`'));
    SET t = REPLACE(t, '{DB}', QUOTE(db));
    SET t = REPLACE(t, '{TBL}', QUOTE(tbl));
    SET @fencecheck_ddl = t;
    PREPARE fencecheck_stmt FROM @fencecheck_ddl;
    EXECUTE fencecheck_stmt;
    DEALLOCATE PREPARE fencecheck_stmt;
    SET @fencecheck_ddl = NULL;
END$$

DELIMITER ;
