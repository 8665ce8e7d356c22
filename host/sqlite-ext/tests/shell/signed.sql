-- Signed tokens through the extension: fence_check and fence_next with a
-- 7th argument, the scope's keys (here read from fencecheck's own
-- fencecheck_keys layout, as the Rust, Python and Node hosts store them).
-- A forged maximum token, a tampered counter, a flipped tag and an unsigned
-- token each raise `unauthenticated: …` and change nothing; the authority's
-- signed grant applies; without keys the same signed text is a plain token.
-- Run by scripts/test.d/30-sqlite-ext.sh; stdout/stderr must equal
-- signed.out and signed.err.
.headers off
.mode list
CREATE TABLE fencecheck_keys (scope_prefix TEXT, key_id INTEGER, secret BLOB);
INSERT INTO fencecheck_keys VALUES ('report/', 3, x'303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f');
CREATE VIEW july_keys AS
    SELECT group_concat(key_id || ':' || hex(secret)) AS keys
      FROM fencecheck_keys WHERE substr('report/july', 1, length(scope_prefix)) = scope_prefix;
CREATE TABLE catalog (scope TEXT PRIMARY KEY, visible_object TEXT, fence_state BLOB);
INSERT INTO catalog VALUES ('report/july', 'none', NULL);

-- The lock-out attack: unsigned u64::MAX, then with the honest signature pasted on.
UPDATE catalog SET visible_object = 'forged',
       fence_state = fence_next(fence_state, scope, '18446744073709551615.18446744073709551615',
                                'strict', NULL, NULL, (SELECT keys FROM july_keys))
 WHERE scope = 'report/july';
UPDATE catalog SET visible_object = 'forged',
       fence_state = fence_next(fence_state, scope, '18446744073709551615.18446744073709551615~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HU3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps',
                                'strict', NULL, NULL, (SELECT keys FROM july_keys))
 WHERE scope = 'report/july';
UPDATE catalog SET visible_object = 'tampered',
       fence_state = fence_next(fence_state, scope, '1.43~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HU3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps', 'strict', NULL, NULL, (SELECT keys FROM july_keys))
 WHERE scope = 'report/july';
SELECT fence_check(fence_state, scope, '1.42~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HE3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps', 'strict', NULL, NULL, (SELECT keys FROM july_keys)) FROM catalog;
SELECT 'untouched', visible_object, fence_state IS NULL FROM catalog;

-- The authority's grant.
UPDATE catalog SET visible_object = 'honest',
       fence_state = fence_next(fence_state, scope, '1.42~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HU3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps', 'strict', NULL, NULL, (SELECT keys FROM july_keys))
 WHERE scope = 'report/july';
SELECT 'applied', changes(), visible_object FROM catalog;
SELECT fence_check(fence_state, scope, '1.42~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HU3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps', 'strict', NULL, NULL, (SELECT keys FROM july_keys)) FROM catalog;

-- Without keys the signature is ignored: a plain check.
SELECT fence_check(NULL, 'notes/a', '1.42~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HE3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps', 'strict', NULL, NULL);
SELECT fence_check(NULL, 'notes/a', '1.42~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HE3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps', 'strict', NULL, NULL, NULL);
-- Bad key sets and bad signature text are refused; no secret is shown.
SELECT fence_check(NULL, 'report/july', '1.42~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HU3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps', 'strict', NULL, NULL, '3:0011');
SELECT fence_check(NULL, 'report/july', '1.42~3~bGVhc2UtN2YzYTljMmUtMDAwMQ~HU3HIuznZbL1pM9iafrnhaLX3ImyJ161TIZTilS8Vps', 'strict', NULL, NULL, 'nonsense-303132333435363738393a3b3c3d3e3f404142434445464748494a4b4c4d4e4f');
SELECT fence_check(NULL, 'report/july', '1.42~3~bGVhc2U=~AA', 'strict', NULL, NULL, (SELECT keys FROM july_keys));
