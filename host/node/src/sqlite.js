// Fenced writes on better-sqlite3 (version 12), in the SQLite layout every
// fencecheck host shares.
//
// `install` creates fencecheck's tables from host/sqlite/schema.sql, the text
// the Rust (`fencecheck_sqlite::install`) and Python hosts run too, copied to
// component/ by scripts/build-component. So a Node, a Rust and a Python writer
// of one scope on one database advance the same fence state in
// `fencecheck_scopes`: one high-water mark, whatever the language.
//
// `fencedWrite`: read the scope's state, check, and only on `applied` run the
// mutation and store the new state, all in one BEGIN IMMEDIATE transaction.
// Every other outcome changes nothing; any exception (a FenceError, a
// HostError, or one thrown by the mutation) rolls the transaction back and
// propagates.

import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { ComponentLoadError, HostError } from './index.js';

/** The layout this module reads and writes (`fencecheck_meta`'s `layout` row), as in every host. */
export const LAYOUT_VERSION = 1;

const SCHEMA_PATH = fileURLToPath(new URL('../component/schema.sql', import.meta.url));
const I64_MAX = (1n << 63n) - 1n;

const META_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fencecheck_meta'";
// `quote` renders any stored value as SQL text (`2`, `'two'`), as in every host.
const READ_LAYOUT = `SELECT typeof(value) = 'integer' AND value = ? AS ok, quote(value) AS found
  FROM fencecheck_meta WHERE key = 'layout'`;
const READ_STATE = 'SELECT fence_state FROM fencecheck_scopes WHERE scope = ?';
// Only the fence columns: a scope's catalog pointer (visible_object,
// published_at_ms), written by the Rust host's publish, is left as it is.
const STORE_STATE = `INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES (?, ?, ?)
  ON CONFLICT (scope) DO UPDATE SET fence_state = excluded.fence_state, version = excluded.version`;

/**
 * `install` found a database laid out for another version: `fencecheck_meta`'s
 * `layout` row is not LAYOUT_VERSION (`found`: the stored value as SQL text,
 * e.g. `'2'` or `"'1'"`) or is missing (`found === null`). Nothing was created
 * or changed. Not retryable: use a fencecheck version that supports that layout.
 */
export class UnsupportedLayout extends HostError {
  constructor(found) {
    const has = found === null ? 'no layout row in fencecheck_meta' : `layout ${found}`;
    super(`unsupported fencecheck layout: the database has ${has}, this version supports only layout ${LAYOUT_VERSION}; nothing was installed`);
    Object.assign(this, { found, supported: LAYOUT_VERSION, retryable: false });
  }
}

/**
 * The mutation ended fencedWrite's transaction itself (ran COMMIT or
 * ROLLBACK), so the new fence state could no longer be stored with it, and was
 * not stored. Whatever the mutation committed stays committed, unfenced: a bug
 * in the mutation, never an outcome, and not retryable.
 */
export class TransactionEnded extends HostError {
  constructor() {
    super('the fenced mutation ended the transaction itself; the fence state was not stored');
    this.retryable = false;
  }
}

let schema;

function schemaText() {
  if (schema === undefined) {
    try {
      schema = readFileSync(SCHEMA_PATH, 'utf8');
    } catch (cause) {
      throw new ComponentLoadError(`reading the SQLite layout ${SCHEMA_PATH} (run scripts/build-component): ${cause.message}`, { cause });
    }
  }
  return schema;
}

function checkLayout(db) {
  const row = db.prepare(READ_LAYOUT).get(LAYOUT_VERSION);
  if (row === undefined) throw new UnsupportedLayout(null);
  if (!row.ok) throw new UnsupportedLayout(row.found);
}

// Run `body` in a BEGIN IMMEDIATE transaction (the write lock before the first
// read) that `body` commits or rolls back itself; roll back on any exception.
function immediate(db, what, body) {
  if (db.inTransaction) throw new Error(`${what} needs its own transaction; commit first`);
  db.exec('BEGIN IMMEDIATE');
  try {
    return body();
  } catch (e) {
    if (db.inTransaction) db.exec('ROLLBACK');
    throw e;
  }
}

/**
 * Create fencecheck's tables (`fencecheck_meta`, `fencecheck_scopes`,
 * `fencecheck_objects`) if they do not exist. Idempotent; run it once per
 * process before the first write. One BEGIN IMMEDIATE transaction, so `db`
 * must not be inside one. A database whose `fencecheck_meta` names another
 * layout (or has no `layout` row) throws UnsupportedLayout and nothing is
 * created: a writer of another layout would keep a separate fence.
 */
export function install(db) {
  const statements = schemaText();
  immediate(db, 'install', () => {
    if (db.prepare(META_EXISTS).get() !== undefined) checkLayout(db);
    db.exec(statements);
    checkLayout(db); // again: the copied schema must be this version's layout
    db.exec('COMMIT');
  });
}

/** The stored state of `scope` as a Uint8Array, or null if it never accepted a token. */
export function loadState(db, scope) {
  const row = db.prepare(READ_STATE).get(scope);
  return row ? new Uint8Array(row.fence_state) : null;
}

/**
 * Check `request` with `guest` and, only if it is applied, call
 * `mutate(db, applied)` and store the new state, in one transaction.
 * Returns the decision (stale-fence and the others are values; nothing was
 * changed). The connection must not be inside a transaction already, and
 * `install` must have run on the database.
 */
export function fencedWrite(db, guest, request, mutate) {
  // Not better-sqlite3's db.transaction(): if the mutation ran COMMIT, that
  // wrapper would store the state in autocommit mode, apart from the mutation.
  return immediate(db, 'fencedWrite', () => {
    const decision = guest.check(loadState(db, request.scope), request);
    if (decision.outcome !== 'applied') {
      db.exec('ROLLBACK');
      return decision;
    }
    // Refused before the mutation runs, as in the Rust host.
    if (decision.version > I64_MAX) {
      throw new RangeError(`version ${decision.version} does not fit a SQLite INTEGER; nothing was stored`);
    }
    const result = mutate(db, decision);
    if (typeof result?.then === 'function') {
      throw new TypeError('the fenced mutation returned a promise; it must run synchronously, inside the transaction');
    }
    if (!db.inTransaction) throw new TransactionEnded();
    const state = Buffer.from(decision.state.buffer, decision.state.byteOffset, decision.state.byteLength);
    db.prepare(STORE_STATE).run(request.scope, state, BigInt(decision.version));
    db.exec('COMMIT');
    return decision;
  });
}
