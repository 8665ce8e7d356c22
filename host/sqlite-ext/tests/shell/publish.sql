-- The seed's paused report writer, in the sqlite3 shell. Run by
-- scripts/test.d/30-sqlite-ext.sh with `.load` of the built extension;
-- stdout must equal publish.out and stderr publish.err.
.headers off
.mode list
CREATE TABLE report_catalog (
    report_id      TEXT PRIMARY KEY,
    visible_object TEXT NOT NULL,
    fence_state    BLOB NOT NULL
);
-- First publication of the scope: no state yet (NULL).
INSERT INTO report_catalog
VALUES ('report/july', 'reports/july/first',
        fence_next(NULL, 'report/july', '0.40', 'strict', NULL, NULL));
SELECT 'state', hex(fence_state) FROM report_catalog;

-- B holds token 42 and publishes with the documented one-call statement:
-- one row changes.
UPDATE report_catalog
   SET visible_object = 'reports/july/b9.tmp',
       fence_state = fence_next(fence_state, 'report/july', '0.42', 'strict', NULL, NULL)
 WHERE report_id = 'report/july';
SELECT 'B changed', changes();

-- A resumes with token 41: the same statement raises stale-fence (stderr),
-- no row changes, B stays visible.
UPDATE report_catalog
   SET visible_object = 'reports/july/a7.tmp',
       fence_state = fence_next(fence_state, 'report/july', '0.41', 'strict', NULL, NULL)
 WHERE report_id = 'report/july';
SELECT 'A changed', changes();
SELECT 'visible', visible_object FROM report_catalog;
SELECT 'A would be', fence_check(fence_state, report_id, '0.41', 'strict', NULL, NULL) FROM report_catalog;

-- The earlier two-call form (fence_check in WHERE) still works: no error,
-- no row.
UPDATE report_catalog
   SET visible_object = 'reports/july/a7.tmp',
       fence_state = fence_next(fence_state, 'report/july', '0.41', 'strict', NULL, NULL)
 WHERE report_id = 'report/july'
   AND fence_check(fence_state, 'report/july', '0.41', 'strict', NULL, NULL) = 'applied';
SELECT 'A guarded changed', changes();
SELECT 'inspect', fence_inspect(fence_state) FROM report_catalog;

-- Each of these fails with a named error and changes nothing.
UPDATE report_catalog SET fence_state = fence_next(fence_state, report_id, '0.41', 'strict', NULL, NULL);
UPDATE report_catalog SET fence_state = fence_next(fence_state, report_id, 41, 'strict', NULL, NULL);
UPDATE report_catalog SET fence_state = fence_next(fence_state, report_id, '0x2A.1', 'strict', NULL, NULL);
UPDATE report_catalog SET fence_state = fence_next(fence_state, NULL, '0.43', 'strict', NULL, NULL);
UPDATE report_catalog SET fence_state = fence_next(fence_state, 'report/august', '0.43', 'strict', NULL, NULL);
UPDATE report_catalog SET fence_state = fence_next(fence_state, report_id, '0.43', 'lenient', NULL, NULL);
UPDATE report_catalog SET fence_state = fence_next(substr(fence_state, 1, 20), report_id, '0.43', 'strict', NULL, NULL);
UPDATE report_catalog SET fence_state = fence_next(CAST(fence_state || x'00' AS BLOB), report_id, '0.43', 'strict', NULL, NULL);
SELECT 'after errors', visible_object, hex(fence_state) FROM report_catalog;
