// install and fencedWrite on real SQLite files (better-sqlite3 12): the shared
// layout, the paused writer is fenced, and every non-applied outcome or
// failure leaves the database as it was.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { FenceError, HostError, Runtime, token } from '../src/index.js';
import { LAYOUT_VERSION, TransactionEnded, UnsupportedLayout, fencedWrite, install, loadState } from '../src/sqlite.js';

const runtime = new Runtime();

function freshDb(t) {
  const dir = mkdtempSync(join(tmpdir(), 'fencecheck-node-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'catalog.sqlite');
  const db = new Database(path);
  db.pragma('journal_mode = WAL');
  db.exec('CREATE TABLE report_catalog (report_id TEXT PRIMARY KEY, visible_object TEXT NOT NULL)');
  install(db);
  db.close();
  return () => {
    const conn = new Database(path, { timeout: 5000 });
    t.after(() => conn.close());
    return conn;
  };
}

const publish = (key) => (db) => db.prepare(
  `INSERT INTO report_catalog VALUES ('report/july', ?)
   ON CONFLICT (report_id) DO UPDATE SET visible_object = excluded.visible_object`).run(key);
const visible = (db) => db.prepare('SELECT visible_object AS v FROM report_catalog').get()?.v;
const at = (counter) => ({ scope: 'report/july', token: token(0, 0, counter) });

// A (token 41) pauses; B (token 42) publishes on its own connection; A resumes and is fenced.
test('paused writer is fenced', (t) => {
  const open = freshDb(t);
  const [connA, connB] = [open(), open()];
  const [guestA, guestB] = [runtime.instance(), runtime.instance()];
  // A has staged its object and is paused here (no transaction open); B runs.
  const b = fencedWrite(connB, guestB, at(42), publish('B'));
  assert.equal(b.outcome, 'applied');
  const a = fencedWrite(connA, guestA, at(41), publish('A'));
  assert.deepEqual(a, { outcome: 'stale-fence', presented: token(0, 0, 41), highest: token(0, 0, 42) });
  assert.equal(visible(open()), 'B');
});

// On applied, the mutation and the new state commit together.
test('applied stores the state with the mutation', (t) => {
  const db = freshDb(t)();
  const d = fencedWrite(db, runtime.instance(), at(1), publish('v1'));
  assert.deepEqual(loadState(db, 'report/july'), d.state);
  assert.equal(visible(db), 'v1');
});

// A throwing mutation leaves neither the mutation nor the state.
test('failing mutation rolls back everything', (t) => {
  const db = freshDb(t)();
  assert.throws(() => fencedWrite(db, runtime.instance(), at(1), (conn, applied) => {
    publish('half')(conn, applied);
    throw new Error('disk full');
  }), /disk full/);
  assert.equal(loadState(db, 'report/july'), null);
  assert.equal(visible(db), undefined);
  assert.equal(db.inTransaction, false);
});

// A damaged stored state throws corrupt-state; the row keeps its bytes.
test('corrupt state throws and changes nothing', (t) => {
  const db = freshDb(t)();
  const guest = runtime.instance();
  fencedWrite(db, guest, at(1), publish('v1'));
  const damaged = Buffer.from(loadState(db, 'report/july'));
  damaged[damaged.length - 1] ^= 0x80;
  db.prepare('UPDATE fencecheck_scopes SET fence_state = ?').run(damaged);
  assert.throws(() => fencedWrite(db, guest, at(2), publish('v2')), (e) => e instanceof FenceError && e.code === 'corrupt-state');
  assert.deepEqual(Buffer.from(loadState(db, 'report/july')), damaged);
  assert.equal(visible(db), 'v1');
});

// fencedWrite and install refuse to run inside a transaction they do not own.
test('refuses an open transaction', (t) => {
  const db = freshDb(t)();
  db.exec('BEGIN');
  assert.throws(() => fencedWrite(db, runtime.instance(), at(1), publish('v')), /own transaction/);
  assert.throws(() => install(db), /own transaction/);
  assert.equal(db.inTransaction, true);
  db.exec('ROLLBACK');
});

const schema = (db) => db.prepare('SELECT type, name, sql FROM sqlite_master ORDER BY name').all();

// A second install changes nothing; the file records LAYOUT_VERSION.
test('install is idempotent and records the layout', (t) => {
  const db = freshDb(t)();
  const before = schema(db);
  install(db);
  assert.deepEqual(schema(db), before);
  assert.equal(db.prepare("SELECT value FROM fencecheck_meta WHERE key = 'layout'").get().value, LAYOUT_VERSION);
  for (const name of ['fencecheck_meta', 'fencecheck_scopes', 'fencecheck_objects', 'fencecheck_keys']) {
    assert.ok(before.some((r) => r.name === name), name);
  }
});

// Another layout number (3, 0), a non-integer or no layout row: UnsupportedLayout, nothing created.
test('other layouts are refused and nothing is created', (t) => {
  for (const [value, found] of [['3', '3'], ['0', '0'], ["'2'", "'2'"], ["'1'", "'1'"], ['1.5', '1.5'], [null, null]]) {
    const dir = mkdtempSync(join(tmpdir(), 'fencecheck-node-'));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const db = new Database(join(dir, 'other.sqlite'));
    t.after(() => db.close());
    // No column affinity, so the text and real values stay what they are.
    db.exec('CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value) WITHOUT ROWID');
    if (value !== null) db.exec(`INSERT INTO fencecheck_meta VALUES ('layout', ${value})`);
    const before = schema(db);
    assert.throws(() => install(db), (e) => e instanceof UnsupportedLayout && e instanceof HostError
      && e.found === found && e.supported === LAYOUT_VERSION && e.retryable === false
      && e.message.includes(found === null ? 'no layout row' : `layout ${found}`)
      && e.message.includes(`layout ${LAYOUT_VERSION}`));
    assert.deepEqual(schema(db), before, String(value));
    assert.equal(db.inTransaction, false);
  }
});

// A layout-1 database (fencecheck 0.1.0: no fencecheck_keys) is upgraded in
// place: its states stay, the keys table is added, the number becomes 2.
test('layout 1 is upgraded in place', (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'fencecheck-node-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = new Database(join(dir, 'old.sqlite'));
  t.after(() => db.close());
  db.exec(`CREATE TABLE fencecheck_meta (key TEXT NOT NULL PRIMARY KEY, value INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO fencecheck_meta VALUES ('layout', 1);
    CREATE TABLE fencecheck_scopes (scope TEXT NOT NULL PRIMARY KEY, fence_state BLOB NOT NULL,
      version INTEGER NOT NULL, visible_object INTEGER, published_at_ms INTEGER) WITHOUT ROWID;
    INSERT INTO fencecheck_scopes (scope, fence_state, version) VALUES ('s', x'01', 7);`);
  install(db);
  assert.deepEqual(db.prepare('SELECT scope, hex(fence_state) AS s, version FROM fencecheck_scopes').all(), [{ scope: 's', s: '01', version: 7 }]);
  assert.equal(db.prepare("SELECT value FROM fencecheck_meta WHERE key = 'layout'").get().value, 2);
  assert.equal(db.prepare('SELECT count(*) AS n FROM fencecheck_keys').get().n, 0);
  install(db);
});

// The row's version is the applied version; a publish's pointer columns are left alone.
test('version is stored and the catalog pointer kept', (t) => {
  const db = freshDb(t)();
  const guest = runtime.instance();
  fencedWrite(db, guest, at(1), publish('v1'));
  db.exec('UPDATE fencecheck_scopes SET visible_object = 7, published_at_ms = 1000');
  const d = fencedWrite(db, guest, at(2), publish('v2'));
  assert.equal(d.version, 2n);
  assert.deepEqual(db.prepare('SELECT version, visible_object, published_at_ms FROM fencecheck_scopes').all(),
    [{ version: 2, visible_object: 7, published_at_ms: 1000 }]);
});

// A mutation that runs COMMIT throws TransactionEnded and the fence state is not stored.
test('a mutation ending the transaction stores no state', (t) => {
  const db = freshDb(t)();
  const guest = runtime.instance();
  assert.throws(() => fencedWrite(db, guest, at(1), (conn, applied) => {
    publish('early')(conn, applied);
    conn.exec('COMMIT');
  }), (e) => e instanceof TransactionEnded && e instanceof HostError && e.retryable === false);
  assert.equal(loadState(db, 'report/july'), null);
  assert.equal(db.inTransaction, false);
  // The mark did not move: the same token is still applied, not stale.
  assert.equal(fencedWrite(db, guest, at(1), publish('v1')).outcome, 'applied');
});

// Version 2^63 is refused before the mutation runs; nothing is stored.
test('a version beyond SQLite INTEGER fails before the mutation', (t) => {
  const db = freshDb(t)();
  const far = { check: (state, request) => ({ outcome: 'applied', version: 1n << 63n, highest: request.token, state: new Uint8Array([1]) }) };
  let ran = false;
  assert.throws(() => fencedWrite(db, far, at(1), () => { ran = true; }), (e) => e instanceof RangeError && /SQLite INTEGER/.test(e.message));
  assert.equal(ran, false);
  assert.equal(loadState(db, 'report/july'), null);
  assert.equal(db.inTransaction, false);
});

// A mutation that returns a promise would write after the commit: refused, rolled back.
test('an async mutation is refused', (t) => {
  const db = freshDb(t)();
  assert.throws(() => fencedWrite(db, runtime.instance(), at(1), async () => {}), /promise/);
  assert.equal(loadState(db, 'report/july'), null);
  assert.equal(db.inTransaction, false);
});
