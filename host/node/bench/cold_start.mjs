#!/usr/bin/env node
// Cold start: whole-process wall time of a new `node` process that imports
// fencecheck, makes its Runtime and first instance and decides one check,
// next to the floors it cannot go below (node alone; node importing the
// package's modules without loading the component). Each round starts one
// fresh process per case in a rotating order and waits for it (spawn to
// exit); the table gives medians over RUNS rounds. Then where the full case's
// time goes: RUNS more processes timing each step from inside (the clock
// starts when node starts: performance.now()).
//
//   node bench/cold_start.mjs [RUNS]     # after `npm run build` (gen/)
//
// There is nothing to precompile: jco's output (gen/) is JavaScript plus the
// component's core modules as .wasm files, compiled by V8 in the process
// (`new WebAssembly.Module`), lazily by default: a function is compiled
// (Liftoff, V8's baseline compiler) on its first call, hot ones recompiled
// by TurboFan in the background. A `--no-wasm-lazy-compilation` case shows
// what compiling every function up front would cost; a diagnostic case, what
// the glue's failing JSPI probes cost (below).

import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { cpus, loadavg } from 'node:os';

const RUNS = Number(process.argv[2] ?? 15);
const INDEX = pathToFileURL(join(dirname(fileURLToPath(import.meta.url)), '..', 'src', 'index.js')).href;

const FIRST_CHECK = `
const t0 = performance.now();
const fc = await import(${JSON.stringify(INDEX)});
const t1 = performance.now();
const runtime = new fc.Runtime();
const t2 = performance.now();
const guest = runtime.instance();
const t3 = performance.now();
const d = guest.check(null, { scope: 'report/july', token: fc.token(0, 0, 41) });
const t4 = performance.now();
if (d.outcome !== 'applied') throw new Error('first check: ' + d.outcome);
console.log(JSON.stringify({ start: t0, import: t1 - t0, runtime: t2 - t1, instance: t3 - t2, check: t4 - t3 }));
`;

const node = process.execPath;
const cases = [
  ['node -e ""', [node, '-e', '']],
  ['import fencecheck (no Runtime)', [node, '--input-type=module', '-e', `await import(${JSON.stringify(INDEX)});`]],
  ['first check (import, Runtime, instance, check)', [node, '--input-type=module', '-e', FIRST_CHECK]],
  ['same, --no-wasm-lazy-compilation', [node, '--no-wasm-lazy-compilation', '--input-type=module', '-e', FIRST_CHECK]],
  // Diagnostic, not a fix: jco's glue calls WebAssembly.promising (JSPI) on
  // each of ~13 core exports at every instantiation, in a try/catch; Node 20
  // has no JSPI, so each call throws "... is not a function", which V8 words
  // by re-parsing the glue's ~3,700-line instantiate generator. With an
  // identity stand-in nothing throws (the glue uses those wrappers only for
  // async exports, which a sync transpile has none of).
  ['same, WebAssembly.promising stubbed (diagnostic)', [node, '--input-type=module', '-e', 'WebAssembly.promising ??= (f) => f;' + FIRST_CHECK]],
];

function run(argv) {
  const start = process.hrtime.bigint();
  const done = spawnSync(argv[0], argv.slice(1), { encoding: 'utf8' });
  const wall = Number(process.hrtime.bigint() - start) / 1e6;
  if (done.status !== 0) throw new Error(`${argv.join(' ')} failed: ${done.stderr}`);
  return [wall, done.stdout];
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

for (const [, argv] of cases) run(argv); // warm-up: page cache
const walls = cases.map(() => []);
const before = loadavg()[0];
for (let r = 0; r < RUNS; r++) {
  for (let k = 0; k < cases.length; k++) {
    const i = (r + k) % cases.length;
    walls[i].push(run(cases[i][1])[0]);
  }
}
const after = loadavg()[0];
console.log(`Node ${process.version}, ${RUNS} rounds; load average ${before.toFixed(1)} before, ${after.toFixed(1)} after (${cpus().length} CPUs)`);
console.log('| case | wall, median | wall, min–max |');
console.log('| --- | ---: | ---: |');
cases.forEach(([name], i) => {
  const w = walls[i];
  console.log(`| ${name} | ${median(w).toFixed(0)} ms | ${Math.min(...w).toFixed(0)}–${Math.max(...w).toFixed(0)} ms |`);
});

const steps = { start: [], import: [], runtime: [], instance: [], check: [] };
for (let r = 0; r < RUNS; r++) {
  const t = JSON.parse(run(cases[2][1])[1]);
  for (const k of Object.keys(steps)) steps[k].push(t[k]);
}
console.log();
console.log('| step (first-check case, timed inside the process) | median |');
console.log('| --- | ---: |');
const label = {
  start: 'node start to the first line of user code',
  import: 'import fencecheck (src/, gen/fencecheck.js, lossless-json)',
  runtime: 'new Runtime() (reads and compiles the core modules, instantiates once)',
  instance: 'runtime.instance()',
  check: 'first check',
};
for (const [k, v] of Object.entries(steps)) console.log(`| ${label[k]} | ${median(v).toFixed(1)} ms |`);
