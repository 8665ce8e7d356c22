#!/usr/bin/env node
// Calls per second and cost per check through the jco-transpiled component,
// single and batched (256 per call: the public checkBatch over check-packed,
// and the typed check-batch export it replaced), on the workload of
// benches/check.rs: scope report/july has accepted 0.41, the request presents
// 0.42 under strict, so each check verifies the stored state and encodes a new
// one. Prints medians over RUNS timed runs (after a warm-up). `check` crosses
// through the core module's single-check export; for comparison, the single
// check through jco's typed `check` (the path it took before).
//
//   npm run bench            # or: node bench/bench.mjs [RUNS]

import { Runtime, token } from '../src/index.js';

const RUNS = Number(process.argv[2] ?? 15);
const BATCH = 256;
const guest = new Runtime().instance();
if (guest._transport !== 'one') throw new Error('the single-check export must be the one measured');
const first = guest.check(null, { scope: 'report/july', token: token(0, 0, 41) });
const request = { scope: 'report/july', token: token(0, 0, 42) };
if (guest.check(first.state, request).outcome !== 'applied') throw new Error('the workload must be applied');
const items = Array.from({ length: BATCH }, () => [first.state, request]);

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

// One timed run: `calls` iterations of `fn`, returns ns per check.
function timed(fn, calls, checksPerCall) {
  const start = process.hrtime.bigint();
  for (let i = 0; i < calls; i++) fn();
  return Number(process.hrtime.bigint() - start) / (calls * checksPerCall);
}

const cases = [
  ['single check', () => guest.check(first.state, request), 20000, 1],
  ["single check via jco's typed check", () => guest._checkComponent(first.state, request), 20000, 1],
  [`checkBatch of ${BATCH} (check-packed), per check`, () => guest.checkBatch(items), 100, BATCH],
  // The typed export, for comparison: jco lowers and lifts every field.
  [`typed check-batch of ${BATCH}, per check`, () => guest._checkBatchTyped(items), 100, BATCH],
];
console.log(`fencecheck Node.js ${process.version}, jco-transpiled component, median of ${RUNS} runs`);
console.log('| benchmark | ns per check | checks per second |');
console.log('| --- | ---: | ---: |');
for (const [name, fn, calls, per] of cases) {
  timed(fn, calls, per); // warm-up: JIT tiers, memory growth
  const ns = median(Array.from({ length: RUNS }, () => timed(fn, calls, per)));
  console.log(`| ${name} | ${ns.toFixed(0)} | ${Math.round(1e9 / ns).toLocaleString('en-US')} |`);
}
