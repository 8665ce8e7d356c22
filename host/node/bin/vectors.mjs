#!/usr/bin/env node
// Run conformance vector files: prints a line per failing step and ends with
// `N passed, N failed` (N counts files); exits non-zero on any failure or
// unreadable file. Same contract as `fencecheck vectors` (Rust). Every file
// runs through every transport (the typed exports, check-packed, and the
// single-check export) and passes only if it passes through each;
// `--transport component|packed|one` runs one.

import { Runtime } from '../src/index.js';
import { TRANSPORTS, load, run } from '../src/vectors.js';

const args = process.argv.slice(2);
let transports = TRANSPORTS;
if (args[0] === '--transport' && TRANSPORTS.includes(args[1])) {
  transports = [args[1]];
  args.splice(0, 2);
}
if (args.length === 0 || args[0].startsWith('--')) {
  console.error(`usage: vectors.mjs [--transport ${TRANSPORTS.join('|')}] FILE...`);
  process.exit(2);
}
const guest = new Runtime().instance();
let passed = 0;
let failed = 0;
for (const path of args) {
  let failures;
  try {
    const file = load(path);
    failures = transports.flatMap((transport) => run(file, guest, { transport }).map((line) => `${transport}: ${line}`));
  } catch (e) {
    failures = [e.code === 'ENOENT' || e.code === 'EISDIR' || e.code === 'EACCES' ? `cannot read: ${e.message}` : e.message];
    console.log(`FAIL ${path}: ${failures[0]}`);
    failed += 1;
    continue;
  }
  for (const line of failures) console.log(`FAIL ${path}: ${line}`);
  if (failures.length) failed += 1;
  else passed += 1;
}
console.log(`${passed} passed, ${failed} failed`);
process.exitCode = failed === 0 && passed > 0 ? 0 : 1;
