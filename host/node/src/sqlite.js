// Fenced writes on better-sqlite3 (version 12), in the SQLite layout every
// fencecheck host shares.
//
// `install` creates fencecheck's tables from host/sqlite/schema.sql, the text
// the Rust (`fencecheck_sqlite::install`) and Python hosts run too, copied to
// component/ by scripts/build-component. So a Node, a Rust and a Python writer
// of one scope on one database advance the same fence state in
// `fencecheck_scopes`: one high-water mark, whatever the language.
//
// `fencedWrite`: read the scope's state (and its signing keys), check, and
// only on `applied` run the mutation and store the new state, all in one
// BEGIN IMMEDIATE transaction. Every other outcome changes nothing; any
// exception (a FenceError, a HostError, or one thrown by the mutation) rolls
// the transaction back and propagates.
//
// Signed tokens (layout 2): `fencecheck_keys` maps scope prefixes to key
// sets; a scope that a prefix starts requires tokens signed by the longest
// such prefix's keys (host/sqlite/keys.sql, the query every host runs, copied
// to component/ too). fencedWrite reads them under the write lock, beside the
// state, so a key change is ordered before or after a write, never inside it.

import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { ComponentLoadError, HostError, KeySetError, keyProblem } from './index.js';
import { recordDecision } from './signals.js';

/** The layout this module reads and writes (`fencecheck_meta`'s `layout` row), as in every host. */
export const LAYOUT_VERSION = 2;
/** The layout install upgrades in place (it lacks only `fencecheck_keys`). */
const UPGRADES_FROM = 1;

const SCHEMA_PATH = fileURLToPath(new URL('../component/schema.sql', import.meta.url));
const KEYS_PATH = fileURLToPath(new URL('../component/keys.sql', import.meta.url));
const I64_MAX = (1n << 63n) - 1n;
const MAX_SCOPE_BYTES = 1024;

const META_EXISTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fencecheck_meta'";
// `quote` renders any stored value as SQL text (`2`, `'two'`), as in every host.
const READ_LAYOUT = `SELECT typeof(value) = 'integer' AND value IN (?, ?) AS ok, quote(value) AS found
  FROM fencecheck_meta WHERE key = 'layout'`;
const DELETE_KEYS = 'DELETE FROM fencecheck_keys WHERE scope_prefix = ?';
const INSERT_KEY = 'INSERT INTO fencecheck_keys (scope_prefix, key_id, secret) VALUES (?, ?, ?)';
const LIST_KEYS = 'SELECT scope_prefix, key_id FROM fencecheck_keys ORDER BY scope_prefix, key_id';
const READ_STATE = 'SELECT fence_state FROM fencecheck_scopes WHERE scope = ?';
// The state and whether any key prefix starts the scope, in one statement
// (always one row), as the Rust host's READ_STATE_KEYED: an unkeyed scope,
// the common case, costs no second statement.
const READ_STATE_KEYED = `SELECT (SELECT fence_state FROM fencecheck_scopes WHERE scope = ?1) AS fence_state,
  EXISTS (SELECT 1 FROM fencecheck_keys WHERE substr(?1, 1, length(scope_prefix)) = scope_prefix) AS keyed`;

// better-sqlite3 parses a statement at every prepare(): each connection
// keeps the statements of the write path, prepared once.
const prepared = new WeakMap();
function cached(db, sql) {
  let statements = prepared.get(db);
  if (statements === undefined) {
    statements = new Map();
    prepared.set(db, statements);
  }
  let statement = statements.get(sql);
  if (statement === undefined) {
    statement = db.prepare(sql);
    statements.set(sql, statement);
  }
  return statement;
}
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

const texts = new Map();

// A packaged SQL file (schema.sql, keys.sql), read once.
function sqlText(path) {
  if (!texts.has(path)) {
    try {
      texts.set(path, readFileSync(path, 'utf8'));
    } catch (cause) {
      throw new ComponentLoadError(`reading ${path} (run scripts/build-component): ${cause.message}`, { cause });
    }
  }
  return texts.get(path);
}

// `ok` if fencecheck_meta says LAYOUT_VERSION (or `also`).
function checkLayout(db, also = LAYOUT_VERSION) {
  const row = db.prepare(READ_LAYOUT).get(LAYOUT_VERSION, also);
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
 * `fencecheck_objects`, `fencecheck_keys`) if they do not exist. Idempotent;
 * run it once per process before the first write. One BEGIN IMMEDIATE
 * transaction, so `db` must not be inside one. A layout-1 database
 * (fencecheck 0.1.0) is upgraded in place: its states stay, the keys table is
 * added. A database whose `fencecheck_meta` names another layout (or has no
 * `layout` row) throws UnsupportedLayout and nothing is created: a writer of
 * another layout would keep a separate fence.
 */
export function install(db) {
  const statements = sqlText(SCHEMA_PATH);
  sqlText(KEYS_PATH); // fencedWrite needs it: fail here, not at the first write
  immediate(db, 'install', () => {
    if (db.prepare(META_EXISTS).get() !== undefined) checkLayout(db, UPGRADES_FROM);
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
 * The keys `scope` requires its tokens to be signed with: those of the
 * longest configured prefix that starts it (keys.sql), or null if no prefix
 * does (the scope takes unsigned tokens). fencedWrite reads them inside its
 * transaction; exported for tools and tests. A stored key this module could
 * never have written throws a HostError rather than being skipped.
 */
export function scopeKeys(db, scope) {
  if (typeof scope !== 'string') throw new TypeError('scope must be a string');
  const rows = db.prepare(sqlText(KEYS_PATH)).all({ 1: scope });
  if (rows.length === 0) return null;
  return rows.map(({ key_id: id, secret }) => {
    const keyId = typeof id === 'bigint' ? Number(id) : id;
    if (!Number.isInteger(keyId) || keyId < 0 || keyId > 0xffffffff || !(secret instanceof Uint8Array)) {
      throw Object.assign(new HostError(`a stored signing key for ${JSON.stringify(scope)} is not a u32 id with a BLOB secret`), { retryable: false });
    }
    return { keyId, secret: new Uint8Array(secret) };
  });
}

function prefixText(prefix) {
  if (typeof prefix !== 'string' || !prefix.isWellFormed()) throw new TypeError('the scope prefix must be a well-formed string');
  const bytes = Buffer.byteLength(prefix, 'utf8');
  if (bytes > MAX_SCOPE_BYTES) throw new RangeError(`the scope prefix has ${bytes} bytes; a scope has at most ${MAX_SCOPE_BYTES}`);
  return prefix;
}

/**
 * Require signed tokens on every scope that starts with `prefix` (`''`:
 * every scope), verified with `keys` (`[{keyId, secret}]`), replacing the
 * prefix's keys if it had any. The longest prefix that starts a scope
 * decides. `keys` must be usable (keyProblem), else KeySetError and nothing
 * changes. One BEGIN IMMEDIATE transaction: writes that begin after it
 * commits require the new keys. To rotate: set {old, new}, move the
 * authority to new, and once no token signed by old can still be held (the
 * longest lease), set {new}.
 */
export function setKeys(db, prefix, keys) {
  prefixText(prefix);
  const problem = keyProblem(keys);
  if (problem) throw new KeySetError(problem);
  immediate(db, 'setKeys', () => {
    db.prepare(DELETE_KEYS).run(prefix);
    const insert = db.prepare(INSERT_KEY);
    for (const k of keys) insert.run(prefix, k.keyId, Buffer.from(k.secret));
    db.exec('COMMIT');
  });
}

/**
 * Stop requiring signed tokens under `prefix` (its scopes fall to the next
 * shorter prefix, or take unsigned tokens). Returns whether it had keys.
 */
export function removeKeys(db, prefix) {
  if (typeof prefix !== 'string') throw new TypeError('the scope prefix must be a string');
  return db.prepare(DELETE_KEYS).run(prefix).changes > 0;
}

/** Every configured prefix with its key ids (never the secrets): `[{prefix, keyIds}]`, by prefix. */
export function keyPrefixes(db) {
  const out = [];
  for (const { scope_prefix: prefix, key_id: id } of db.prepare(LIST_KEYS).all()) {
    const keyId = Number(id);
    if (out.at(-1)?.prefix === prefix) out.at(-1).keyIds.push(keyId);
    else out.push({ prefix, keyIds: [keyId] });
  }
  return out;
}

/**
 * Check `request` with `guest` and, only if it is applied, call
 * `mutate(db, applied)` and store the new state, in one transaction. On a
 * scope that requires signed tokens (scopeKeys) the decision is checkSigned's
 * with `request.signature`: a token its authority did not sign throws
 * FenceError `unauthenticated` (an unusable stored key set: `invalid-keys`),
 * like every refusal, after rolling back. Returns the decision (stale-fence
 * and the others are values; nothing was changed). The connection must not
 * be inside a transaction already, and `install` must have run on the database.
 * Each call is reported once to the installed signals (fencecheck/signals,
 * operation `write`), after the transaction ended.
 */
export function fencedWrite(db, guest, request, mutate) {
  let decision;
  try {
    decision = write(db, guest, request, mutate);
  } catch (e) {
    recordDecision('write', request?.token, e);
    throw e;
  }
  recordDecision('write', request.token, decision);
  return decision;
}

function write(db, guest, request, mutate) {
  // Not better-sqlite3's db.transaction(): if the mutation ran COMMIT, that
  // wrapper would store the state in autocommit mode, apart from the mutation.
  return immediate(db, 'fencedWrite', () => {
    // Both under the write lock: no key change or other write in between.
    const row = cached(db, READ_STATE_KEYED).get({ 1: request.scope });
    const stored = row.fence_state === null ? null : new Uint8Array(row.fence_state);
    const keys = row.keyed ? scopeKeys(db, request.scope) : null;
    const decision = keys === null ? guest.check(stored, request) : guest.checkSigned(stored, request, keys);
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
    cached(db, STORE_STATE).run(request.scope, state, BigInt(decision.version));
    db.exec('COMMIT');
    return decision;
  });
}
