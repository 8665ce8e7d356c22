-- The extension's documented one-call statement against every refusal:
-- each raises an error named by its outcome (stderr must equal
-- one_call.err), changes no row (changes() is 0 and the row's bytes are
-- the same before and after), and the token is not consumed. Run by
-- scripts/test.d/30-sqlite-ext.sh; stdout must equal one_call.out.
.headers off
.mode list
CREATE TABLE catalog (
    scope          TEXT PRIMARY KEY,
    visible_object TEXT NOT NULL,
    fence_state    BLOB NOT NULL
);
-- Token 0.42 under allow-equal with op-id op-1: the window holds op-1.
INSERT INTO catalog
VALUES ('report/july', 'first',
        fence_next(NULL, 'report/july', '0.42', 'allow-equal', 'op-1', NULL));
CREATE TABLE pristine AS SELECT fence_state FROM catalog;
CREATE TABLE before AS SELECT * FROM catalog;
CREATE VIEW unchanged AS
    SELECT count(*) FROM catalog JOIN before USING (scope)
     WHERE catalog.visible_object = before.visible_object
       AND catalog.fence_state = before.fence_state;

-- stale-fence: an older token, and strict with the equal token.
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.41', 'strict', NULL, NULL)
 WHERE scope = 'report/july';
SELECT 'stale', changes(), (SELECT * FROM unchanged);
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.42', 'strict', NULL, NULL)
 WHERE scope = 'report/july';
SELECT 'strict equal', changes(), (SELECT * FROM unchanged);
-- duplicate: the same op-id under the same token.
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.42', 'allow-equal', 'op-1', NULL)
 WHERE scope = 'report/july';
SELECT 'duplicate', changes(), (SELECT * FROM unchanged);
-- version-conflict: the wrong expected version.
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.42', 'allow-equal', NULL, 7)
 WHERE scope = 'report/july';
SELECT 'conflict', changes(), (SELECT * FROM unchanged);
-- invalid-request: equal token with no guard, an empty op-id, token 0.0.
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.42', 'allow-equal', NULL, NULL)
 WHERE scope = 'report/july';
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.43', 'strict', '', NULL)
 WHERE scope = 'report/july';
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.0', 'strict', NULL, NULL)
 WHERE scope = 'report/july';
SELECT 'invalid request', changes(), (SELECT * FROM unchanged);
-- invalid-token and invalid-argument: bad text, a wrong type, bad policy.
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.43 ', 'strict', NULL, NULL)
 WHERE scope = 'report/july';
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, 43, 'strict', NULL, NULL)
 WHERE scope = 'report/july';
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.43', 'STRICT', NULL, NULL)
 WHERE scope = 'report/july';
SELECT 'invalid input', changes(), (SELECT * FROM unchanged);
-- foreign-authority and scope-mismatch.
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '7:0.43', 'strict', NULL, NULL)
 WHERE scope = 'report/july';
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, 'report/june', '0.43', 'strict', NULL, NULL)
 WHERE scope = 'report/july';
SELECT 'foreign', changes(), (SELECT * FROM unchanged);

-- corrupt-state: one flipped bit in the stored state blocks the scope.
UPDATE catalog SET fence_state = CAST(
    substr(fence_state, 1, 12) || x'FF' || substr(fence_state, 14) AS BLOB);
DELETE FROM before;
INSERT INTO before SELECT * FROM catalog;
UPDATE catalog SET visible_object = 'x',
       fence_state = fence_next(fence_state, scope, '0.43', 'strict', NULL, NULL)
 WHERE scope = 'report/july';
SELECT 'corrupt', changes(), (SELECT * FROM unchanged);
UPDATE catalog SET fence_state = (SELECT fence_state FROM pristine);

-- Nothing above consumed the token: 0.43 applies, one row.
UPDATE catalog SET visible_object = 'b',
       fence_state = fence_next(fence_state, scope, '0.43', 'strict', NULL, NULL)
 WHERE scope = 'report/july';
SELECT 'applied', changes(), visible_object, hex(fence_state) FROM catalog;

-- Several rows in one statement inside a transaction: the second row is
-- stale, so the whole statement is undone (also the first row's change);
-- the transaction itself stays open and commits the rest.
CREATE TABLE many (scope TEXT PRIMARY KEY, fence_state BLOB NOT NULL);
INSERT INTO many VALUES
    ('a', fence_next(NULL, 'a', '0.5', 'strict', NULL, NULL)),
    ('b', fence_next(NULL, 'b', '0.9', 'strict', NULL, NULL)),
    ('c', fence_next(NULL, 'c', '0.5', 'strict', NULL, NULL));
BEGIN IMMEDIATE;
INSERT INTO many VALUES ('d', fence_next(NULL, 'd', '0.1', 'strict', NULL, NULL));
UPDATE many SET fence_state = fence_next(fence_state, scope, '0.7', 'strict', NULL, NULL);
SELECT 'many', changes();
COMMIT;
SELECT 'many', scope, json_extract(fence_inspect(fence_state), '$.highest.counter') FROM many ORDER BY scope;
