// A fenced write on better-sqlite3 (version 12): read the scope's state,
// check, and only on `applied` run the mutation and store the new state, all
// in one BEGIN IMMEDIATE transaction. Every other outcome changes nothing;
// any exception (a FenceError, a HostError, or one thrown by the mutation)
// rolls the transaction back and propagates.
//
// The state lives in its own table (default `fence_state`: scope TEXT primary
// key, state BLOB), so an existing schema can be fenced without changing it.

const IDENT = /^[A-Za-z_][A-Za-z0-9_]*$/;

function table(name) {
  // Interpolated into SQL, so only a plain identifier is accepted.
  if (typeof name !== 'string' || !IDENT.test(name)) throw new TypeError(`not a plain SQL identifier: ${String(name)}`);
  return name;
}

/** Create the state table if it does not exist. */
export function createTable(db, name = 'fence_state') {
  db.exec(`CREATE TABLE IF NOT EXISTS ${table(name)} (scope TEXT PRIMARY KEY, state BLOB NOT NULL)`);
}

/** The stored state of `scope` as a Uint8Array, or null if it never accepted a token. */
export function loadState(db, scope, name = 'fence_state') {
  const row = db.prepare(`SELECT state FROM ${table(name)} WHERE scope = ?`).get(scope);
  return row ? new Uint8Array(row.state) : null;
}

/**
 * Check `request` with `guest` and, only if it is applied, call
 * `mutate(db, applied)` and store the new state, in one transaction.
 * Returns the decision (stale-fence and the others are values; nothing was
 * changed). The connection must not be inside a transaction already.
 */
export function fencedWrite(db, guest, request, mutate, { table: name = 'fence_state' } = {}) {
  const t = table(name);
  if (db.inTransaction) throw new Error('fencedWrite needs its own transaction; commit first');
  const run = db.transaction(() => {
    const decision = guest.check(loadState(db, request.scope, t), request);
    if (decision.outcome === 'applied') {
      mutate(db, decision);
      db.prepare(`INSERT INTO ${t} (scope, state) VALUES (?, ?) ON CONFLICT (scope) DO UPDATE SET state = excluded.state`)
        .run(request.scope, Buffer.from(decision.state.buffer, decision.state.byteOffset, decision.state.byteLength));
    }
    // Not applied: nothing was written, so the commit changes nothing.
    return decision;
  });
  return run.immediate();
}
