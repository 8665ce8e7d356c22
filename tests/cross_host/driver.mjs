// The Node side of the cross-host test (test_cross_host.py), with the
// commands of the Rust worker (host/sqlite/src/bin/worker.rs):
//
//   node driver.mjs DB install
//       install the layout; print `installed`, or `unsupported-layout` and
//       exit 1 (the message on stderr).
//   node driver.mjs DB write SCOPE TOKEN [strict|allow-equal]
//       a fenced write whose mutation inserts into `worker_audit (scope,
//       token, version)`; print the outcome name (`applied`, `stale-fence`...).
//
// TOKEN is canonical text: EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER, signed or
// not (`…~KEY-ID~LEASE~TAG`): a scope with keys requires the signature. Uses the
// package in host/node (built by `npm run build`) and its better-sqlite3.

import { createRequire } from 'node:module';
import { FenceError, Runtime, parseSignedToken } from '../../host/node/src/index.js';
import { UnsupportedLayout, fencedWrite, install } from '../../host/node/src/sqlite.js';

const Database = createRequire(new URL('../../host/node/package.json', import.meta.url))('better-sqlite3');

function open(path) {
  const db = new Database(path, { timeout: 60000 });
  db.pragma('journal_mode = WAL'); // as the Rust worker
  return db;
}

function write(db, scope, text, policy) {
  const { token, signature } = parseSignedToken(text);
  const request = { scope, token, policy, ...(signature ? { signature } : {}) };
  const audit = (conn, applied) => conn.prepare('INSERT INTO worker_audit (scope, token, version) VALUES (?, ?, ?)')
    .run(scope, text, applied.version);
  try {
    return fencedWrite(db, new Runtime().instance(), request, audit).outcome;
  } catch (e) {
    if (e instanceof FenceError) return e.code; // a definitive refusal, printed like the worker's
    throw e;
  }
}

const [db, command, ...rest] = process.argv.slice(2);
if (db !== undefined && command === 'install' && rest.length === 0) {
  const conn = open(db);
  try {
    install(conn);
    console.log('installed');
  } catch (e) {
    if (!(e instanceof UnsupportedLayout)) throw e;
    console.log('unsupported-layout');
    console.error(`driver.mjs: ${e.message}`);
    process.exitCode = 1;
  } finally {
    conn.close();
  }
} else if (db !== undefined && command === 'write' && (rest.length === 2 || rest.length === 3)) {
  const [scope, text, policy = 'strict'] = rest;
  const conn = open(db);
  try {
    console.log(write(conn, scope, text, policy));
  } finally {
    conn.close();
  }
} else {
  console.error('usage: node driver.mjs DB install | DB write SCOPE TOKEN [POLICY]');
  process.exitCode = 2;
}
