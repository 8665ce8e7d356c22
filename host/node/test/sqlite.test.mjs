// fencedWrite on real SQLite files (better-sqlite3 12): the paused writer is
// fenced, and every non-applied outcome or failure leaves the database as it was.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import { FenceError, Runtime, token } from '../src/index.js';
import { createTable, fencedWrite, loadState } from '../src/sqlite.js';

const runtime = new Runtime();

function freshDb(t) {
  const dir = mkdtempSync(join(tmpdir(), 'fencecheck-node-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'catalog.sqlite');
  const db = new Database(path);
  db.pragma('journal_mode = WAL');
  db.exec('CREATE TABLE report_catalog (report_id TEXT PRIMARY KEY, visible_object TEXT NOT NULL)');
  createTable(db);
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
  db.prepare('UPDATE fence_state SET state = ?').run(damaged);
  assert.throws(() => fencedWrite(db, guest, at(2), publish('v2')), (e) => e instanceof FenceError && e.code === 'corrupt-state');
  assert.deepEqual(Buffer.from(loadState(db, 'report/july')), damaged);
  assert.equal(visible(db), 'v1');
});

// fencedWrite refuses to run inside a transaction it does not own, and bad table names.
test('refuses an open transaction and non-identifier tables', (t) => {
  const db = freshDb(t)();
  db.exec('BEGIN');
  assert.throws(() => fencedWrite(db, runtime.instance(), at(1), publish('v')), /own transaction/);
  db.exec('ROLLBACK');
  assert.throws(() => fencedWrite(db, runtime.instance(), at(1), publish('v'), { table: 'x; DROP' }), TypeError);
});
