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
CREATE FUNCTION IF NOT EXISTS fence_lease_acquire RETURNS STRING SONAME 'libfencecheck_mariadb.so';
CREATE FUNCTION IF NOT EXISTS fence_lease_renew RETURNS STRING SONAME 'libfencecheck_mariadb.so';
CREATE FUNCTION IF NOT EXISTS fence_lease_release RETURNS STRING SONAME 'libfencecheck_mariadb.so';

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

-- The lease coordinator (fencecheck.acquire/renew/release): the grant
-- authority's one row, as the SQLite and PostgreSQL coordinators keep it
-- (a random non-zero lineage made once, the epoch floor), and each lock's
-- lease state, the component's bytes.
CREATE TABLE IF NOT EXISTS fencecheck.authority (
    id          TINYINT UNSIGNED NOT NULL PRIMARY KEY CHECK (id = 1),
    authority   BIGINT UNSIGNED NOT NULL CHECK (authority <> 0),
    epoch_floor BIGINT UNSIGNED NOT NULL DEFAULT 0
) ENGINE=InnoDB;

-- A user variable, so statement-based replication carries the value.
SET @fencecheck_lineage = GREATEST(1, CAST(CONV(HEX(RANDOM_BYTES(8)), 16, 10) AS UNSIGNED));
INSERT IGNORE INTO fencecheck.authority (id, authority, epoch_floor)
VALUES (1, @fencecheck_lineage, 0);
SET @fencecheck_lineage = NULL;

CREATE TABLE IF NOT EXISTS fencecheck.leases (
    name  VARBINARY(1024) NOT NULL PRIMARY KEY,
    -- NULL only inside the transaction that first locks a new name.
    state BLOB NULL
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
        WHEN 'lost' THEN SIGNAL SQLSTATE '5F017' SET MESSAGE_TEXT = m;
        WHEN 'not-owner' THEN SIGNAL SQLSTATE '5F018' SET MESSAGE_TEXT = m;
        WHEN 'lock-mismatch' THEN SIGNAL SQLSTATE '5F019' SET MESSAGE_TEXT = m;
        WHEN 'in-transaction' THEN SIGNAL SQLSTATE '5F020' SET MESSAGE_TEXT = m;
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

-- The lease coordinator: fencecheck.acquire(lock, lease_id, ttl_ms),
-- renew(lock, lease_id, token, ttl_ms), release(lock, lease_id, token),
-- the arguments and answers of FENCE.ACQUIRE/RENEW/RELEASE. Each is one
-- transaction of its own, committed before the answer is returned (a token
-- is never seen before its grant is durable): the lock's row FOR UPDATE
-- (inserted first if new, so two first acquires queue on it instead of
-- deadlocking), the authority row LOCK IN SHARE MODE, the component's
-- decision with the clock read inside it, the write. Called inside an
-- open transaction they refuse (5F020) and change nothing. Arguments are
-- LONGBLOB so nothing is truncated or coerced before the component and
-- the plugin judge it, whatever the sql_mode. SQL SECURITY DEFINER:
-- callers need EXECUTE on the procedures only, never write access to the
-- tables. @fencecheck_now_ms is the test clock (refused unless the server
-- runs with FENCECHECK_MARIADB_TEST_CLOCK=1).

-- Refuse a call inside the caller's open transaction (its own COMMIT
-- would commit the caller's work) and a lock name the table cannot hold.
CREATE OR REPLACE PROCEDURE fencecheck.lease_guard(lock_arg LONGBLOB)
    NOT DETERMINISTIC READS SQL DATA
BEGIN
    IF @@in_transaction THEN
        CALL fencecheck.raise('in-transaction: the lease procedures commit their own transaction; call them outside one');
    END IF;
    IF lock_arg IS NULL THEN
        CALL fencecheck.raise('invalid-argument: lock must be a string, got NULL');
    END IF;
    IF LENGTH(lock_arg) = 0 THEN
        CALL fencecheck.raise('invalid-request: empty-lock');
    END IF;
    IF LENGTH(lock_arg) > 1024 THEN
        CALL fencecheck.raise('invalid-request: lock-too-long');
    END IF;
END$$

-- Read a decision's JSON: `state` is the new state when the outcome is
-- `granted` (NULL for the other answer: busy, lost, not-owner). No answer at all, an
-- unknown outcome or a state that is not hex fail closed: nothing is
-- written (a server that cannot raise from a UDF returns NULL, never a
-- state to store).
CREATE OR REPLACE PROCEDURE fencecheck.lease_answer(answer LONGTEXT CHARACTER SET utf8mb4,
                                                    granted VARCHAR(16), OUT state BLOB)
    DETERMINISTIC NO SQL
BEGIN
    DECLARE outcome VARCHAR(16) DEFAULT JSON_VALUE(answer, '$.outcome');
    SET state = NULL;
    IF outcome IS NULL OR outcome NOT IN ('acquired', 'busy', 'renewed', 'lost', 'released', 'not-owner') THEN
        CALL fencecheck.raise('runtime-error: the lease function gave no answer');
    END IF;
    IF outcome = granted THEN
        SET state = UNHEX(JSON_VALUE(answer, '$.state'));
        IF state IS NULL OR LENGTH(state) = 0 THEN
            CALL fencecheck.raise('runtime-error: the lease function gave no state');
        END IF;
    END IF;
END$$

CREATE OR REPLACE PROCEDURE fencecheck.acquire(lock_arg LONGBLOB, lease_id_arg LONGBLOB, ttl_ms_arg LONGBLOB)
    NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER
BEGIN
    DECLARE answer LONGTEXT CHARACTER SET utf8mb4;
    CALL fencecheck.lease_guard(lock_arg);
    BEGIN
        DECLARE st BLOB DEFAULT NULL;
        DECLARE nst BLOB DEFAULT NULL;
        DECLARE auth VARCHAR(20) DEFAULT NULL;
        DECLARE flr VARCHAR(20) DEFAULT NULL;
        DECLARE code INT;
        DECLARE msg TEXT;
        DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
            GET DIAGNOSTICS CONDITION 1 code = MYSQL_ERRNO, msg = MESSAGE_TEXT;
            ROLLBACK;
            IF code = 1644 THEN CALL fencecheck.raise(msg); ELSE RESIGNAL; END IF;
        END;
        START TRANSACTION;
        INSERT INTO fencecheck.leases (name, state) VALUES (lock_arg, NULL)
            ON DUPLICATE KEY UPDATE name = name;
        SELECT state INTO st FROM fencecheck.leases WHERE name = lock_arg FOR UPDATE;
        SELECT CAST(authority AS CHAR), CAST(epoch_floor AS CHAR) INTO auth, flr
          FROM fencecheck.authority WHERE id = 1 LOCK IN SHARE MODE;
        IF auth IS NULL THEN
            CALL fencecheck.raise('runtime-error: fencecheck.authority has no row (run fencecheck.sql)');
        END IF;
        SET answer = CONVERT(fence_lease_acquire(st, lock_arg, lease_id_arg, ttl_ms_arg, auth, flr,
                                                 @fencecheck_now_ms) USING utf8mb4);
        CALL fencecheck.lease_answer(answer, 'acquired', nst);
        IF nst IS NOT NULL THEN
            UPDATE fencecheck.leases SET state = nst WHERE name = lock_arg;
        END IF;
        COMMIT;
    END;
    SELECT JSON_VALUE(answer, '$.outcome') AS outcome,
           JSON_VALUE(answer, '$.token') AS token,
           CAST(JSON_VALUE(answer, '$.expires_at') AS UNSIGNED) AS expires_at,
           CAST(JSON_VALUE(answer, '$.now') AS UNSIGNED) AS decided_at,
           JSON_VALUE(answer, '$.holder') AS holder;
END$$

CREATE OR REPLACE PROCEDURE fencecheck.renew(lock_arg LONGBLOB, lease_id_arg LONGBLOB, token_arg LONGBLOB,
                                             ttl_ms_arg LONGBLOB)
    NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER
BEGIN
    DECLARE answer LONGTEXT CHARACTER SET utf8mb4;
    CALL fencecheck.lease_guard(lock_arg);
    BEGIN
        DECLARE st BLOB DEFAULT NULL;
        DECLARE nst BLOB DEFAULT NULL;
        DECLARE auth VARCHAR(20) DEFAULT NULL;
        DECLARE code INT;
        DECLARE msg TEXT;
        DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
            GET DIAGNOSTICS CONDITION 1 code = MYSQL_ERRNO, msg = MESSAGE_TEXT;
            ROLLBACK;
            IF code = 1644 THEN CALL fencecheck.raise(msg); ELSE RESIGNAL; END IF;
        END;
        START TRANSACTION;
        SELECT state INTO st FROM fencecheck.leases WHERE name = lock_arg FOR UPDATE;
        SELECT CAST(authority AS CHAR) INTO auth
          FROM fencecheck.authority WHERE id = 1 LOCK IN SHARE MODE;
        SET answer = CONVERT(fence_lease_renew(st, lease_id_arg, token_arg, ttl_ms_arg, auth,
                                               @fencecheck_now_ms) USING utf8mb4);
        CALL fencecheck.lease_answer(answer, 'renewed', nst);
        IF nst IS NULL THEN
            CALL fencecheck.raise('lost: this lease does not hold the lock (expired, released or another grant): stop, never write with its token again');
        END IF;
        UPDATE fencecheck.leases SET state = nst WHERE name = lock_arg;
        COMMIT;
    END;
    SELECT JSON_VALUE(answer, '$.outcome') AS outcome,
           CAST(JSON_VALUE(answer, '$.expires_at') AS UNSIGNED) AS expires_at;
END$$

CREATE OR REPLACE PROCEDURE fencecheck.release(lock_arg LONGBLOB, lease_id_arg LONGBLOB, token_arg LONGBLOB)
    NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY DEFINER
BEGIN
    DECLARE answer LONGTEXT CHARACTER SET utf8mb4;
    CALL fencecheck.lease_guard(lock_arg);
    BEGIN
        DECLARE st BLOB DEFAULT NULL;
        DECLARE nst BLOB DEFAULT NULL;
        DECLARE auth VARCHAR(20) DEFAULT NULL;
        DECLARE code INT;
        DECLARE msg TEXT;
        DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN
            GET DIAGNOSTICS CONDITION 1 code = MYSQL_ERRNO, msg = MESSAGE_TEXT;
            ROLLBACK;
            IF code = 1644 THEN CALL fencecheck.raise(msg); ELSE RESIGNAL; END IF;
        END;
        START TRANSACTION;
        SELECT state INTO st FROM fencecheck.leases WHERE name = lock_arg FOR UPDATE;
        SELECT CAST(authority AS CHAR) INTO auth
          FROM fencecheck.authority WHERE id = 1 LOCK IN SHARE MODE;
        SET answer = CONVERT(fence_lease_release(st, lease_id_arg, token_arg, auth) USING utf8mb4);
        CALL fencecheck.lease_answer(answer, 'released', nst);
        IF nst IS NULL THEN
            CALL fencecheck.raise('not-owner: this lease does not hold the lock (a later grant, or already released)');
        END IF;
        UPDATE fencecheck.leases SET state = nst WHERE name = lock_arg;
        COMMIT;
    END;
    SELECT JSON_VALUE(answer, '$.outcome') AS outcome;
END$$

-- fencecheck.restore(at_least): after restoring this server from a backup
-- or promoting a replica that may have missed grants, raise the epoch
-- floor to max(floor + 1, at_least) (NULL: the server's Unix time in ms),
-- as FENCE.RESTORE does: lock epochs come only from the floor, so every
-- later grant of every lock is above every token issued before. The
-- floor's row lock waits for decisions in flight (they hold it shared).
-- SQL SECURITY INVOKER: for administrators who may update
-- fencecheck.authority.
CREATE OR REPLACE PROCEDURE fencecheck.restore(at_least BIGINT UNSIGNED)
    NOT DETERMINISTIC MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    CALL fencecheck.lease_guard('restore');
    BEGIN
        DECLARE floor_now BIGINT UNSIGNED DEFAULT NULL;
        DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;
        START TRANSACTION;
        SELECT epoch_floor INTO floor_now FROM fencecheck.authority WHERE id = 1 FOR UPDATE;
        IF floor_now IS NULL THEN
            CALL fencecheck.raise('runtime-error: fencecheck.authority has no row (run fencecheck.sql)');
        END IF;
        IF floor_now = 18446744073709551615 THEN
            CALL fencecheck.raise('exhausted: the epoch floor would overflow');
        END IF;
        -- SYSDATE, not NOW: a session's SET timestamp does not move it.
        UPDATE fencecheck.authority
           SET epoch_floor = GREATEST(floor_now + 1,
                 COALESCE(at_least, CAST(UNIX_TIMESTAMP(SYSDATE(3)) * 1000 AS UNSIGNED)))
         WHERE id = 1;
        COMMIT;
    END;
    SELECT 'restored' AS outcome, epoch_floor FROM fencecheck.authority WHERE id = 1;
END$$

DELIMITER ;
