-- The keys a scope requires signed tokens with (host/sqlite/keys.sql in
-- PostgreSQL): those of the LONGEST `scope_prefix` that starts the scope
-- ($1). No row: the scope takes unsigned tokens. Hosts run this exact text
-- inside their fenced transaction, after locking the scope's state row.
SELECT key_id, secret
  FROM fencecheck_keys
 WHERE scope_prefix = (SELECT scope_prefix
                         FROM fencecheck_keys
                        WHERE starts_with($1, scope_prefix)
                        ORDER BY length(scope_prefix) DESC
                        LIMIT 1)
 ORDER BY key_id
