// The agreement trace: canonical lines, batches equal single checks, and
// malformed sequences stop with an error.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Runtime } from '../src/index.js';
import { run } from '../src/trace.js';
import { VectorFormatError } from '../src/vectors.js';

const guest = new Runtime().instance();
const trace = (lines) => {
  const out = [];
  run(lines, guest, (l) => out.push(l));
  return out;
};
const SEQ = [
  '{"slot":0,"check":{"scope":"s","token":[0,5]}}',
  '{"slot":0,"check":{"scope":"s","token":[0,4]}}',
  '{"slot":1,"check":{"scope":"é","token":[0,1]}}',
  '{"slot":1,"check":{"scope":"e","token":[0,2]}}',
  '{"slot":0,"damage":"flip-bit","bit":3}',
];

// Outcome fields appear in the documented order; scopes print as UTF-8 hex.
test('lines are canonical', () => {
  const lines = trace(SEQ);
  assert.ok(lines[0].startsWith('{"line":1,"outcome":"applied","version":1,"highest":[0,0,5],"state":"'));
  assert.ok(lines[1].startsWith('{"line":2,"outcome":"stale-fence","presented":[0,0,4],"highest":[0,0,5],"state":"'));
  assert.ok(lines[3].startsWith('{"line":4,"outcome":"error","error":"scope-mismatch","scope":"c3a9","state":"'));
  assert.ok(lines[4].startsWith('{"line":5,"damage":"flip-bit","state":"'));
});

// A batch line prints the same outcomes and states as the same checks one by one.
test('a batch traces like single checks', () => {
  const a = '{"slot":0,"check":{"scope":"s","token":[0,6]}}';
  const b = '{"slot":2,"check":{"scope":"t","token":[0,0]}}';
  const single = trace([SEQ[0], a, b]).slice(1).map((l) => l.replace(/^\{"line":\d+,/, ''));
  const batch = trace([SEQ[0], `{"batch":[${a},${b}]}`]).slice(1).map((l) => l.replace(/^\{"line":\d+,"item":\d+,/, ''));
  assert.deepEqual(batch, single);
});

// checkBatch (check-packed) and the typed check-batch print the same lines.
test('batches trace the same through packed and typed exports', () => {
  const seq = [...SEQ, '{"batch":[{"slot":0,"check":{"scope":"s","token":[0,9]}},{"slot":1,"check":{"scope":"é","token":[0,1]}},{"slot":3,"check":{"scope":"","token":[0,1]}}]}'];
  const typed = [];
  run(seq, guest, (l) => typed.push(l), { typedBatches: true });
  const packed = trace(seq);
  assert.deepEqual(packed, typed);
  assert.ok(packed.at(-1).includes('"item":2'));
});

// Every malformed line throws instead of being skipped; so does a check with
// `keys` (a trace has no signed scopes: they would be checked unsigned).
test('malformed lines stop the trace', () => {
  for (const bad of ['{"slot":0}', '{"slot":0,"check":{"scope":"s","token":[0,1]},"damage":"clear"}',
    '{"slot":0,"check":{"scope":"s","token":[0,1],"keys":[]}}',
    '{"batch":[{"slot":0,"check":{"scope":"s","token":[0,1],"keys":[{"id":1,"secret":"00"}]}}]}',
    '{"slot":-1,"check":{"scope":"s","token":[0,1]}}',
    '{"batch":[{"slot":0,"check":{"scope":"s","token":[0,1]}},{"slot":0,"check":{"scope":"s","token":[0,2]}}]}',
    '{"slot":0,"damage":"melt"}', 'not json']) {
    assert.throws(() => trace([bad]), VectorFormatError, bad);
  }
});
