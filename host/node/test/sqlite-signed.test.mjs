// Signed tokens on SQLite (better-sqlite3 12, real files): scopes opted in
// with setKeys (the shared fencecheck_keys table, read with keys.sql inside
// the write transaction) refuse every token their authority did not sign and
// change nothing; mirrors host/sqlite/tests/signed.rs.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import Database from 'better-sqlite3';
import { FenceError, HostError, KeySetError, Runtime, U64_MAX, UnsupportedFeature, token } from '../src/index.js';
import { fencedWrite, install, keyPrefixes, removeKeys, scopeKeys, setKeys } from '../src/sqlite.js';

const HERE = dirname(fileURLToPath(import.meta.url));
const runtime = new Runtime();
const JULY = 'report/july';
const key = (id, fill) => ({ keyId: id, secret: new Uint8Array(32).fill(fill) });

function setup(t) {
  const dir = mkdtempSync(join(tmpdir(), 'fencecheck-node-signed-'));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const db = new Database(join(dir, 'catalog.sqlite'));
  t.after(() => db.close());
  db.pragma('journal_mode = WAL');
  install(db);
  db.exec('CREATE TABLE log (counter INTEGER)');
  return { db, guest: runtime.instance() };
}

// A request for `scope` with token 0.1.counter, signed by `k` through the component.
function signed(guest, scope, counter, k) {
  const t = token(0, 1, counter);
  return { scope, token: t, signature: guest.sign(scope, t, 'lease-1', k) };
}
const unsigned = (scope, epoch, counter) => ({ scope, token: token(0, epoch, counter) });

// A fenced write that logs the counter it was applied under; a refusal is returned, not thrown.
function write(db, guest, request) {
  try {
    return fencedWrite(db, guest, request, (conn, applied) => {
      conn.prepare('INSERT INTO log (counter) VALUES (?)').run(BigInt.asIntN(64, applied.highest.counter));
    });
  } catch (e) {
    if (e instanceof FenceError) return e;
    throw e;
  }
}
const rejected = (code, reason) => (o) => o instanceof FenceError && !(o instanceof HostError) && o.code === code && o.reason === reason && o.retryable === false;
const everything = (db) => JSON.stringify([
  db.prepare('SELECT scope, hex(fence_state) AS s, version FROM fencecheck_scopes ORDER BY scope').all(),
  db.prepare('SELECT counter FROM log').safeIntegers(true).all().map((r) => `${r.counter}`),
]);

// The lock-out attack: without keys, a forged u64::MAX token takes the scope
// for good and the honest signed grant is stale; with the scope opted in the
// forger is refused (unsigned, and with a signature copied from an honest
// grant: bad-signature), nothing changes, and the honest grant applies.
test('a forged maximum token locks out unsigned scopes only', (t) => {
  const { db, guest } = setup(t);
  const k = key(3, 0x33);
  assert.equal(write(db, guest, unsigned(JULY, U64_MAX, U64_MAX)).outcome, 'applied');
  assert.equal(write(db, guest, signed(guest, JULY, 42, k)).outcome, 'stale-fence');

  const scope = 'report/august';
  setKeys(db, 'report/', [k]);
  const forged = unsigned(scope, U64_MAX, U64_MAX);
  const before = everything(db);
  assert.ok(rejected('unauthenticated', 'unsigned')(write(db, guest, forged)));
  const copied = { ...forged, signature: signed(guest, scope, 42, k).signature };
  assert.ok(rejected('unauthenticated', 'bad-signature')(write(db, guest, copied)));
  assert.equal(everything(db), before);
  assert.equal(db.inTransaction, false);
  assert.equal(write(db, guest, signed(guest, scope, 42, k)).outcome, 'applied');
  // The forger's u64::MAX (stored as i64: -1) on July, the honest 42 on August.
  assert.deepEqual(JSON.parse(everything(db))[1], ['-1', '42']);
});

// Tampered, replayed-into-another-scope, unknown-key, unsigned and malformed
// tokens are each refused with their own reason and change nothing; then the
// honest grant applies.
test('every unauthenticated token is refused and changes nothing', (t) => {
  const { db, guest } = setup(t);
  const k3 = key(3, 0x33);
  setKeys(db, 'report/', [k3]);
  assert.equal(write(db, guest, signed(guest, JULY, 1, k3)).outcome, 'applied');
  const good = signed(guest, JULY, 2, k3);
  const cases = [
    [{ ...good, token: token(0, 1, 3) }, 'bad-signature'],
    [{ ...signed(guest, 'report/june', 2, k3), scope: JULY }, 'bad-signature'],
    [signed(guest, JULY, 2, key(9, 0x99)), 'unknown-key'],
    [unsigned(JULY, 1, 2), 'unsigned'],
    [{ ...good, signature: { ...good.signature, tag: good.signature.tag.slice(0, 16) } }, 'malformed-signature'],
  ];
  for (const [request, reason] of cases) {
    const before = everything(db);
    assert.ok(rejected('unauthenticated', reason)(write(db, guest, request)), reason);
    assert.equal(everything(db), before, `${reason} changed the database`);
    assert.equal(db.inTransaction, false);
  }
  assert.equal(write(db, guest, good).version, 2n);
});

// The longest prefix decides; removing it hands its scopes to the next
// shorter one; with no prefix left scopes take unsigned tokens, and a
// signature on a scope that is not opted in is ignored.
test('the longest prefix decides', (t) => {
  const { db, guest } = setup(t);
  const [k1, k2] = [key(1, 0x11), key(2, 0x22)];
  setKeys(db, '', [k1]);
  setKeys(db, 'report/', [k2]);
  assert.deepEqual(scopeKeys(db, JULY), [k2]);
  assert.deepEqual(scopeKeys(db, 'invoice/9'), [k1]);
  assert.deepEqual(scopeKeys(db, 'repor'), [k1]);
  assert.deepEqual(keyPrefixes(db), [{ prefix: '', keyIds: [1] }, { prefix: 'report/', keyIds: [2] }]);

  const byK1 = signed(guest, JULY, 1, k1);
  assert.ok(rejected('unauthenticated', 'unknown-key')(write(db, guest, byK1)));
  assert.equal(removeKeys(db, 'report/'), true);
  assert.equal(removeKeys(db, 'report/'), false);
  assert.equal(write(db, guest, byK1).outcome, 'applied');
  assert.equal(removeKeys(db, ''), true);
  assert.equal(scopeKeys(db, JULY), null);
  assert.equal(write(db, guest, unsigned(JULY, 1, 2)).outcome, 'applied');
  const stray = signed(guest, JULY, 3, k1);
  assert.equal(write(db, guest, { ...stray, signature: { ...stray.signature, tag: new Uint8Array(32) } }).outcome, 'applied');
});

// Rotation: with {3, 4} grants of both keys apply; with {4} a grant still
// signed by 3 is unknown-key, and the holder re-acquires under 4.
test('keys rotate without rewriting states', (t) => {
  const { db, guest } = setup(t);
  const [k3, k4] = [key(3, 0x33), key(4, 0x44)];
  setKeys(db, JULY, [k3]);
  assert.equal(write(db, guest, signed(guest, JULY, 1, k3)).outcome, 'applied');
  setKeys(db, JULY, [k3, k4]);
  assert.equal(write(db, guest, signed(guest, JULY, 2, k3)).outcome, 'applied');
  assert.equal(write(db, guest, signed(guest, JULY, 3, k4)).outcome, 'applied');
  setKeys(db, JULY, [k4]);
  assert.deepEqual(keyPrefixes(db), [{ prefix: JULY, keyIds: [4] }]);
  assert.ok(rejected('unauthenticated', 'unknown-key')(write(db, guest, signed(guest, JULY, 4, k3))));
  assert.equal(write(db, guest, signed(guest, JULY, 4, k4)).version, 4n);
});

// Unusable key sets and prefixes are refused by setKeys and change nothing
// (inside a caller's transaction too); a short secret stored behind the
// adapter's back is the invalid-keys rejection, never an unsigned write; the
// layout's constraints refuse what no key can be.
test('unusable key sets are refused', (t) => {
  const { db, guest } = setup(t);
  setKeys(db, 'kept/', [key(8, 8)]);
  const short = { keyId: 1, secret: new Uint8Array(15).fill(1) };
  for (const [keys, why] of [[[], 'no-keys'], [[short], 'short-secret'], [[key(1, 1), key(1, 2)], 'duplicate-key-id'],
    [[{ keyId: 1, secret: new Uint8Array(65) }], 'long-secret'], [Array.from({ length: 17 }, (_, i) => key(i, 1)), 'too-many-keys']]) {
    assert.throws(() => setKeys(db, 'report/', keys), (e) => e instanceof KeySetError && e.reason === why, why);
  }
  assert.throws(() => setKeys(db, 'x'.repeat(1025), [key(1, 1)]), RangeError);
  assert.throws(() => setKeys(db, 'é'.repeat(513), [key(1, 1)]), RangeError); // 1026 bytes
  assert.throws(() => setKeys(db, '\ud800', [key(1, 1)]), TypeError);
  assert.throws(() => setKeys(db, 'report/', [{ keyId: -1, secret: new Uint8Array(16) }]), RangeError);
  db.exec('BEGIN');
  assert.throws(() => setKeys(db, 'report/', [key(1, 1)]), /own transaction/);
  db.exec('ROLLBACK');
  assert.deepEqual(keyPrefixes(db), [{ prefix: 'kept/', keyIds: [8] }]);

  db.prepare("INSERT INTO fencecheck_keys VALUES ('report/', 1, ?)").run(Buffer.from(short.secret));
  const request = { ...unsigned(JULY, 1, 1), signature: { keyId: 1, leaseId: 'l', tag: new Uint8Array(32) } };
  assert.ok(rejected('invalid-keys', 'short-secret')(write(db, guest, request)));
  assert.equal(db.prepare('SELECT count(*) AS n FROM fencecheck_scopes').get().n, 0);
  for (const bad of ["INSERT INTO fencecheck_keys VALUES ('p', -1, x'00')", "INSERT INTO fencecheck_keys VALUES ('p', 4294967296, x'00')",
    "INSERT INTO fencecheck_keys VALUES ('p', 1, 'text')", "INSERT INTO fencecheck_keys VALUES (x'00', 1, x'00')"]) {
    assert.throws(() => db.exec(bad), /CHECK constraint/, bad);
  }
});

// A keyed scope on a component without signed tokens (0.1.0, whose
// checkSigned throws UnsupportedFeature) fails closed: never a plain check,
// the write rolls back and nothing is stored.
test('a keyed scope needs a component with signed tokens', (t) => {
  const { db } = setup(t);
  setKeys(db, 'report/', [key(3, 3)]);
  const old = {
    check: () => assert.fail('check on a keyed scope'),
    checkSigned: () => { throw new UnsupportedFeature('signed tokens', '0.1.0', '0.1.1'); },
  };
  assert.throws(() => fencedWrite(db, old, unsigned(JULY, 1, 1), () => assert.fail('mutated')), UnsupportedFeature);
  assert.equal(db.inTransaction, false);
  assert.equal(db.prepare('SELECT count(*) AS n FROM fencecheck_scopes').get().n, 0);
});

// The package ships both SQL files scripts/build-component copies, and runs keys.sql's exact text.
test('keys.sql is packaged and is the shared query', () => {
  const pkg = JSON.parse(readFileSync(join(HERE, '..', 'package.json'), 'utf8'));
  assert.ok(pkg.files.includes('component/schema.sql') && pkg.files.includes('component/keys.sql'));
  assert.equal(readFileSync(join(HERE, '..', 'component', 'keys.sql'), 'utf8'),
    readFileSync(join(HERE, '..', '..', 'sqlite', 'keys.sql'), 'utf8'));
});
