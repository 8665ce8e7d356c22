#!/usr/bin/env node
// Run an agreement sequence (tests/agreement/README.md) and print one
// canonical line per step; exits non-zero with a message on a malformed line
// or a failure of the component.

import { readFileSync } from 'node:fs';
import { Runtime } from '../src/index.js';
import { run } from '../src/trace.js';

const [path] = process.argv.slice(2);
if (!path) {
  console.error('usage: trace.mjs FILE');
  process.exit(2);
}
try {
  const lines = readFileSync(path, 'utf8').split('\n');
  if (lines.at(-1) === '') lines.pop();
  const out = [];
  run(lines, new Runtime().instance(), (line) => out.push(line));
  process.stdout.write(out.length ? `${out.join('\n')}\n` : '');
} catch (e) {
  console.error(`trace.mjs: ${path}: ${e.message}`);
  process.exitCode = 1;
}
