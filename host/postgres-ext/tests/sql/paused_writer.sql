-- The seed's paused report writer, in plain SQL against a fenced table.
-- Owner A was granted 0.41 and paused; the lease expired; owner B was
-- granted 0.42 and published; A wakes up and publishes.
\set VERBOSITY sqlstate
\pset footer off
CREATE TABLE report_catalog (
    report_id      text PRIMARY KEY,
    visible_object text,
    fence_token    text,
    fence_state    bytea
);
SELECT fence_protect('report_catalog', 'report_id', 'fence_token', 'fence_state');
\echo '-- A (token 0.41) creates the report, then pauses'
INSERT INTO report_catalog (report_id, visible_object, fence_token)
VALUES ('report/july', 'reports/july/a7-draft', '0.41');
\echo '-- B (token 0.42) publishes'
UPDATE report_catalog SET visible_object = 'reports/july/b9', fence_token = '0.42'
 WHERE report_id = 'report/july';
\echo '-- A resumes and publishes with 0.41: stale-fence (5F001)'
UPDATE report_catalog SET visible_object = 'reports/july/a7', fence_token = '0.41'
 WHERE report_id = 'report/july';
\echo '-- A tries without a token: fence-required (5F011)'
UPDATE report_catalog SET visible_object = 'reports/july/a7'
 WHERE report_id = 'report/july';
\echo '-- A tries to delete: fence-required, then stale-fence'
DELETE FROM report_catalog WHERE report_id = 'report/july';
BEGIN;
SET LOCAL fencecheck.token = '0.41';
DELETE FROM report_catalog WHERE report_id = 'report/july';
ROLLBACK;
\echo '-- B stays visible'
SELECT report_id, visible_object, fence_token,
       fence_inspect(fence_state)->>'version' AS version
  FROM report_catalog;
