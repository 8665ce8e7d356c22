#!/usr/bin/env node
// Run conformance vector files: prints a line per failing step and ends with
// `N passed, N failed` (N counts files); exits non-zero on any failure or
// unreadable file. Same contract as `fencecheck vectors` (Rust).

import { Runtime } from '../src/index.js';
import { load, run } from '../src/vectors.js';

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: vectors.mjs FILE...');
  process.exit(2);
}
const guest = new Runtime().instance();
let passed = 0;
let failed = 0;
for (const path of files) {
  let failures;
  try {
    failures = run(load(path), guest);
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
