-- The three variants' tables, the same :rows scopes 'report/1' … in each,
-- every scope at token 0.1 (plain: accepted_fence 1). Run by `run`.
CREATE EXTENSION fencecheck;
CREATE TABLE plain_catalog (report_id text PRIMARY KEY, visible_object text, accepted_fence bigint);
CREATE TABLE ext_catalog (report_id text PRIMARY KEY, visible_object text, fence_state bytea);
CREATE TABLE prot_catalog (report_id text PRIMARY KEY, visible_object text, fence_token text, fence_state bytea);
SELECT fence_protect('prot_catalog', 'report_id', 'fence_token', 'fence_state');
INSERT INTO plain_catalog SELECT 'report/' || g, 'objects/1', 1 FROM generate_series(1, :rows) g;
INSERT INTO ext_catalog SELECT 'report/' || g, 'objects/1', fence_next(NULL, 'report/' || g, '0.1', 'strict', NULL, NULL) FROM generate_series(1, :rows) g;
INSERT INTO prot_catalog (report_id, visible_object, fence_token) SELECT 'report/' || g, 'objects/1', '0.1' FROM generate_series(1, :rows) g;
VACUUM ANALYZE plain_catalog, ext_catalog, prot_catalog;
