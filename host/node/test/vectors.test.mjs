// The Node vector runner: every shared vector passes through every transport
// (typed exports, check-packed, the single-check export), and the runner
// really fails on a wrong expectation or a malformed file (same contract as
// Rust's).

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { execFileSync, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Runtime } from '../src/index.js';
import { TRANSPORTS, VectorFormatError, load, parse, run } from '../src/vectors.js';

const here = dirname(fileURLToPath(import.meta.url));
const VECTORS = join(here, '..', '..', '..', 'tests', 'vectors');
const FILES = readdirSync(VECTORS).filter((f) => f.endsWith('.json')).sort().map((f) => join(VECTORS, f));
const guest = new Runtime().instance();

// The shared vector directory is found and not empty, signed files included.
test('there are vectors', () => {
  assert.ok(FILES.length >= 40);
  assert.ok(FILES.filter((f) => /\/signed-[^/]*\.json$/.test(f)).length >= 9);
});

// Each file in tests/vectors passes under the Node host, through each transport.
for (const path of FILES) {
  for (const transport of TRANSPORTS) {
    test(`vector ${path.split('/').pop()} (${transport})`, () => assert.deepEqual(run(load(path), guest, { transport }), []));
  }
}

// The signed steps are really compared: a wrong tag on a sign step, a wrong
// reason on a signed check, and keys dropped from a check (so the forged
// token would be applied) each fail, through every transport.
test('wrong signed expectations fail', () => {
  const text = readFileSync(join(VECTORS, 'signed-grant-is-applied.json'), 'utf8');
  const forged = readFileSync(join(VECTORS, 'signed-forged-maximum-token-is-refused.json'), 'utf8');
  const cases = [
    [text, text.replace('"tag": "1d4dc722', '"tag": "0d4dc722'), /tag: expected 0d4dc722/],
    [forged, forged.replace('"reason": "bad-signature"', '"reason": "unknown-key"'), /reason: expected unknown-key, got bad-signature/],
    [forged, forged.replace(/"keys": \[[^\]]*\], "signature"/, '"signature"'), /expected error, got applied/],
  ];
  for (const [original, changed, why] of cases) {
    assert.notEqual(changed, original);
    for (const transport of TRANSPORTS) {
      const failures = run(parse(changed), guest, { transport });
      assert.ok(failures.length >= 1 && why.test(failures[0]), `${transport}: ${failures}`);
    }
  }
  assert.throws(() => run(parse(text), guest, { transport: 'typed' }), RangeError);
});

// Changing one expected field makes the runner report that step.
test('a wrong expectation fails', () => {
  const text = readFileSync(join(VECTORS, 'paused-writer-is-fenced.json'), 'utf8')
    .replace('"outcome": "stale-fence", "presented": [0, 41], "highest": [0, 42]', '"outcome": "stale-fence", "presented": [0, 41], "highest": [0, 99]');
  const failures = run(parse(text), guest);
  assert.equal(failures.length, 1);
  assert.match(failures[0], /highest: expected \[0, 99\]/);
});

// u64 max in a file is read exactly (JSON.parse would round it to 2^64).
test('u64 max is parsed losslessly', () => {
  const f = parse('{"name":"n","steps":[{"check":{"scope":"s","token":[18446744073709551615,18446744073709551615]},"expect":{"outcome":"applied","highest":[18446744073709551615,18446744073709551615]}}]}');
  assert.equal(f.steps[0].check.token[1], 18446744073709551615n);
  assert.deepEqual(run(f, guest), []);
  const off = parse('{"name":"n","steps":[{"check":{"scope":"s","token":[0,18446744073709551615]},"expect":{"outcome":"applied","highest":[0,18446744073709551614]}}]}');
  assert.equal(run(off, guest).length, 1);
});

// Unknown fields, non-integers, negatives and values past u64 are refused.
test('malformed files are unreadable', () => {
  const good = '{"name":"n","steps":[{"check":{"scope":"s","token":[0,1]},"expect":{"outcome":"applied"}}]}';
  parse(good);
  for (const bad of [good.replace('"scope"', '"scop"'), good.replace('[0,1]', '[0,1.0]'),
    good.replace('[0,1]', '[0,-1]'), good.replace('[0,1]', '[0,18446744073709551616]'),
    good.replace('"name":"n"', '"name":"n","name":"m"'),
    good.replace('"token":[0,1]', '"token":[0,1],"keys":[{"id":4294967296,"secret":"00"}]'),
    good.replace('"token":[0,1]', '"token":[0,1],"keys":[{"id":1,"secret":"0"}]'),
    good.replace('"token":[0,1]', '"token":[0,1],"keys":[{"id":1,"secret":"00","x":1}]'),
    good.replace('"token":[0,1]', '"token":[0,1],"keys":{"id":1,"secret":"00"}'),
    good.replace('"token":[0,1]', '"token":[0,1],"signature":{"key_id":1,"lease_id":"l","tag":"zz"}'),
    good.replace('"token":[0,1]', '"token":[0,1],"signature":{"key_id":1,"tag":"00"}'),
    good.replace('"check":{"scope":"s","token":[0,1]}', '"sign":{"scope":"s","token":[0,1],"lease_id":"l"}'),
    good.replace('"outcome":"applied"', '"outcome":"applied","tags":"00"')]) {
    assert.throws(() => parse(bad), VectorFormatError, bad);
  }
});

// bin/vectors.mjs counts files and exits non-zero on a failure or an unreadable file.
test('cli contract', () => {
  const bin = join(here, '..', 'bin', 'vectors.mjs');
  const ok = execFileSync(process.execPath, [bin, ...FILES.slice(0, 3)], { encoding: 'utf8' });
  assert.match(ok, /^3 passed, 0 failed$/m);
  const one = execFileSync(process.execPath, [bin, '--transport', 'packed', FILES[0]], { encoding: 'utf8' });
  assert.match(one, /^1 passed, 0 failed$/m);
  assert.equal(spawnSync(process.execPath, [bin, '--transport', 'typed', FILES[0]]).status, 2);
  const bad = spawnSync(process.execPath, [bin, FILES[0], '/nonexistent.json'], { encoding: 'utf8' });
  assert.notEqual(bad.status, 0);
  assert.match(bad.stdout, /FAIL \/nonexistent\.json: cannot read/);
  assert.match(bad.stdout, /^1 passed, 1 failed$/m);
});
