#!/usr/bin/env node
// Run an agreement sequence (tests/agreement/README.md) and print one
// canonical line per step; exits non-zero with a message on a malformed line
// or a failure of the component.

import { readFileSync } from 'node:fs';
import { Runtime } from '../src/index.js';
import { run } from '../src/trace.js';

// --batch typed: batch lines through the typed check-batch export instead of
// check-packed (scripts/test.d/60-agreement.sh compares both).
const args = process.argv.slice(2);
let typedBatches = false;
if (args[0] === '--batch' && (args[1] === 'typed' || args[1] === 'packed')) {
  typedBatches = args[1] === 'typed';
  args.splice(0, 2);
}
const [path] = args;
if (!path || args.length !== 1) {
  console.error('usage: trace.mjs [--batch packed|typed] FILE');
  process.exit(2);
}
try {
  const lines = readFileSync(path, 'utf8').split('\n');
  if (lines.at(-1) === '') lines.pop();
  const out = [];
  run(lines, new Runtime().instance(), (line) => out.push(line), { typedBatches });
  process.stdout.write(out.length ? `${out.join('\n')}\n` : '');
} catch (e) {
  console.error(`trace.mjs: ${path}: ${e.message}`);
  process.exitCode = 1;
}
