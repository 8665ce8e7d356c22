-- The keys a scope requires signed tokens with, in every host that shares
-- the SQLite layout (schema.sql): those of the LONGEST `scope_prefix` that
-- starts the scope (?1). No row: the scope takes unsigned tokens. Hosts run
-- this exact text inside their write transaction, after taking the write
-- lock, so a key change and a write are ordered one way or the other.
-- (length and substr count characters; for UTF-8 text, a prefix in
-- characters is a prefix in bytes.)
SELECT key_id, secret
  FROM fencecheck_keys
 WHERE scope_prefix = (SELECT scope_prefix
                         FROM fencecheck_keys
                        WHERE substr(?1, 1, length(scope_prefix)) = scope_prefix
                        ORDER BY length(scope_prefix) DESC
                        LIMIT 1)
 ORDER BY key_id
