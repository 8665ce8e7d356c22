-- The seed's paused writer through the mariadb client (scripts/clean-room
-- compares stdout and stderr with paused_writer.out / paused_writer.err).
CREATE DATABASE shop;
USE shop;
SELECT fence_version() IS NOT NULL AS loaded;

-- One statement per write: fence_next decides inside the UPDATE.
CREATE TABLE report_catalog (
    report_id      VARBINARY(200) PRIMARY KEY,
    visible_object VARCHAR(200) NOT NULL,
    fence_state    BLOB NOT NULL) ENGINE=InnoDB;
INSERT INTO report_catalog VALUES ('report/july', 'reports/july/first',
    fence_next(NULL, 'report/july', '0.40', 'strict', NULL, NULL));
-- Owner 2, granted 0.42, publishes B.
UPDATE report_catalog SET visible_object = 'reports/july/b9',
       fence_state = fence_next(fence_state, report_id, '0.42', 'strict', NULL, NULL)
 WHERE report_id = 'report/july';
-- Owner 1, granted 0.41 and paused past its lease, wakes up: refused.
UPDATE report_catalog SET visible_object = 'reports/july/a7',
       fence_state = fence_next(fence_state, report_id, '0.41', 'strict', NULL, NULL)
 WHERE report_id = 'report/july';
SELECT visible_object, HEX(fence_state),
       fence_check(fence_state, report_id, '0.41', 'strict', NULL, NULL) AS late
  FROM report_catalog;

-- The same through a fenced table: the triggers decide.
CREATE TABLE catalog (
    report_id   VARBINARY(200) PRIMARY KEY,
    visible     VARCHAR(200) NOT NULL,
    fence_token VARCHAR(100) NULL,
    fence_state BLOB NULL) ENGINE=InnoDB;
CALL fencecheck.protect('shop.catalog', 'report_id', 'fence_token', 'fence_state');
INSERT INTO catalog (report_id, visible, fence_token) VALUES ('report/july', 'reports/july/first', '0.40');
UPDATE catalog SET visible = 'reports/july/b9', fence_token = '0.42' WHERE report_id = 'report/july';
UPDATE catalog SET visible = 'reports/july/a7', fence_token = '0.41' WHERE report_id = 'report/july';
SELECT visible, fence_token, fence_inspect(fence_state) FROM catalog;
