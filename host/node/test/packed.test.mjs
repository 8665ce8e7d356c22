// check-packed: the byte codec against hand-built bytes (wit/fence.wit), and
// random batches that must decide identically through typed check-batch,
// check-packed and single checks; the single-check export (guest/src/one.rs)
// against jco's typed check, and what the single-check path makes of a
// guest that answers off the ABI.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { FenceError, HostError, PackedFormatError, Runtime, TooLarge, GuestTrapped, U64_MAX, WIT_VERSION, token } from '../src/index.js';
import { decode, encode } from '../src/packed.js';
import { ONE, ONE_INPUT, OneCheck, coreExports, hasOneExports } from '../src/core.js';
import { parseJson, parseRequest } from '../src/vectors.js';

const here = dirname(fileURLToPath(import.meta.url));
const VECTORS = join(here, '..', '..', '..', 'tests', 'vectors');
const runtime = new Runtime();
const EXPORT = `fencecheck:fence/check@${WIT_VERSION}#check-packed`;

// Little-endian integers, written independently of the codec under test.
const le = (n, width) => {
  const out = [];
  let v = BigInt(n);
  for (let i = 0; i < width; i++) {
    out.push(Number(v & 0xffn));
    v >>= 8n;
  }
  return out;
};
const tok = (a, e, c) => [...le(a, 8), ...le(e, 8), ...le(c, 8)];
const bytes = (...parts) => Uint8Array.from(parts.flat());
const text = (s) => [...Buffer.from(s, 'utf8')];
// What index.js hands the encoder: validated, BigInt fields, absent = undefined.
const lowered = (state, scope, t, extra = {}) => ({
  state,
  request: { scope, token: t, policy: extra.policy ?? 'strict', opId: extra.opId, expectedVersion: extra.expectedVersion },
});

// -- encoder ------------------------------------------------------------------

// Flags, field order, optional fields and lengths as in the WIT docs.
test('encode matches the spec byte for byte', () => {
  const items = [
    lowered(undefined, 's', token(0, 0, 1)),
    lowered(Uint8Array.of(0xaa, 0xbb), 'ü', { authority: U64_MAX, epoch: 2n, counter: 3n }, { policy: 'allow-equal', opId: 'op', expectedVersion: 7n }),
    lowered(new Uint8Array(), 't', token(1, 0, 5), { expectedVersion: 0n }),
    lowered(undefined, '日本'.repeat(40), token(0, 0, 9)), // past the ASCII fast path
  ];
  const want = bytes(
    le(4, 4),
    0, tok(0, 0, 1), le(1, 4), text('s'),
    0b1111, tok(U64_MAX, 2, 3), le(7, 8), le(2, 4), text('ü'), le(2, 4), text('op'), le(2, 4), 0xaa, 0xbb,
    0b0101, tok(1, 0, 5), le(0, 8), le(1, 4), text('t'), le(0, 4),
    0, tok(0, 0, 9), le(240, 4), text('日本'.repeat(40)),
  );
  assert.deepEqual(encode(items), want);
  assert.deepEqual(encode([]), bytes(le(0, 4)));
});

// -- decoder ------------------------------------------------------------------

// Case order of the WIT enums, spelled out here rather than taken from the codec.
const REASONS = ['missing-token', 'empty-scope', 'scope-too-long', 'empty-op-id', 'op-id-too-long', 'equal-token-unguarded'];
const DAMAGE = ['truncated', 'length-mismatch', 'checksum-mismatch', 'malformed'];

const EVERY_TAG = [
  [bytes(0, le(3, 8), tok(0, 1, 2), le(3, 4), text('xyz')), { outcome: 'applied', version: 3n, highest: token(0, 1, 2), state: Uint8Array.from(text('xyz')) }],
  [bytes(0, le(1, 8), tok(U64_MAX, U64_MAX, U64_MAX), le(0, 4)), { outcome: 'applied', version: 1n, highest: { authority: U64_MAX, epoch: U64_MAX, counter: U64_MAX }, state: new Uint8Array() }],
  [bytes(1, le(U64_MAX, 8)), { outcome: 'duplicate', version: U64_MAX }],
  [bytes(2, tok(1, 2, 3), tok(1, 2, 4)), { outcome: 'stale-fence', presented: token(1, 2, 3), highest: token(1, 2, 4) }],
  [bytes(3, le(5, 8), le(6, 8)), { outcome: 'version-conflict', expected: 5n, actual: 6n }],
  ...REASONS.map((r, i) => [bytes(128, i), new FenceError('invalid-request', r)]),
  ...DAMAGE.map((r, i) => [bytes(129, i), new FenceError('corrupt-state', r)]),
  [bytes(130, 255), new FenceError('unsupported-state-version', undefined, 255)],
  [bytes(131, le(9, 4), text('ledger/ü')), new FenceError('scope-mismatch', undefined, 'ledger/ü')],
  [bytes(131, le(0, 4)), new FenceError('scope-mismatch', undefined, '')],
  [bytes(132, le(0, 8), le(U64_MAX, 8)), new FenceError('foreign-authority', undefined, { stored: 0n, presented: U64_MAX })],
  [bytes(133), new FenceError('exhausted')],
];

// Everything an outcome carries (state bytes included), comparable across paths.
const key = (o) => (o instanceof FenceError ? ['error', o.code, o.reason, o.detail] : ['decision', o]);

// Each output case, alone and all in one batch, decodes to the public shape.
test('decode reads every tag', () => {
  for (const [raw, want] of EVERY_TAG) {
    assert.deepEqual(decode(bytes(le(1, 4), [...raw]), 1).map(key), [key(want)]);
  }
  const all = bytes(le(EVERY_TAG.length, 4), ...EVERY_TAG.map(([raw]) => [...raw]));
  assert.deepEqual(decode(all, EVERY_TAG.length).map(key), EVERY_TAG.map(([, w]) => key(w)));
  // A decoded state is its own copy, not a view of the batch.
  const [applied] = decode(bytes(le(1, 4), [...EVERY_TAG[0][0]]), 1);
  assert.equal(applied.state.buffer.byteLength, 3);
});

// Anything off the format throws PackedFormatError (a HostError), never an outcome.
test('decode refuses malformed output', () => {
  const cases = [
    [bytes(), 0],
    [bytes(le(1, 4)), 1], // count promises an item that is not there
    [bytes(le(2, 4), 133), 1], // count differs from the items sent
    [bytes(le(0, 4), 0), 0], // trailing byte
    [bytes(le(1, 4), 133, 0), 1], // trailing byte after an item
    [bytes(le(1, 4), 4), 1], // unknown decision tag
    [bytes(le(1, 4), 134), 1], // unknown error tag
    [bytes(le(1, 4), 128, REASONS.length), 1],
    [bytes(le(1, 4), 129, DAMAGE.length), 1],
    [bytes(le(1, 4), 131, le(2, 4), 0xc3, 0x28), 1], // scope not UTF-8
    [bytes(le(1, 4), 131, le(5, 4), text('abc')), 1], // scope runs past the end
    [bytes(le(1, 4), 0, le(1, 8), tok(0, 0, 1), le(4, 4), text('abc')), 1], // state runs past the end
    [bytes(le(1, 4), 0, le(1, 8), tok(0, 0, 1), le(0xffffffff, 4)), 1],
  ];
  for (const [raw, expected] of cases) {
    assert.throws(() => decode(raw, expected),
      (e) => e instanceof PackedFormatError && e instanceof HostError && e.side === 'output' && e.retryable === false,
      Buffer.from(raw).toString('hex'));
  }
});

// Every strict prefix of a valid output is refused.
test('decode refuses every truncation', () => {
  const full = bytes(le(EVERY_TAG.length, 4), ...EVERY_TAG.map(([raw]) => [...raw]));
  for (let cut = 0; cut < full.length; cut++) {
    assert.throws(() => decode(full.subarray(0, cut), EVERY_TAG.length), PackedFormatError);
  }
});

// -- against the component ------------------------------------------------------

// The vector files' `replace` states, each with every check that follows it
// in its file: they reach unsupported-state-version, malformed and exhausted.
function craftedStates() {
  const found = [];
  for (const f of readdirSync(VECTORS).filter((n) => n.endsWith('.json')).sort()) {
    const steps = parseJson(readFileSync(join(VECTORS, f), 'utf8')).steps ?? [];
    steps.forEach((step, i) => {
      if (step.damage === 'replace' && (step.state ?? 'fence') === 'fence') {
        const state = Uint8Array.from(Buffer.from(step.hex, 'hex'));
        for (const s of steps.slice(i + 1)) if (s.check) found.push([state, parseRequest(s.check)]);
      }
    });
  }
  return found;
}

// mulberry32: a small deterministic generator (Math.random cannot be seeded).
function rng(seed) {
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return { next, below: (n) => Math.floor(next() * n), pick: (xs) => xs[Math.floor(next() * xs.length)] };
}

const SCOPES = ['report/july', 'ledger/ü', '日本/報告', 'a', 'x'.repeat(1024), 'x'.repeat(1025), '', 'é'.repeat(513)];
const OP_IDS = [undefined, undefined, 'op-1', 'op-2', '', 'o'.repeat(256), 'ö'.repeat(129)];
const clamp = (n) => (n < 0n ? 0n : n > U64_MAX ? U64_MAX : n);

function randomRequest(r, scope, around) {
  if (r.next() < 0.15) scope = r.pick(SCOPES);
  const authority = r.next() < 0.9 ? 0n : r.pick([1n, U64_MAX]);
  const near = [0n, clamp(around + BigInt(r.below(5) - 2))];
  const [epoch, counter] = r.pick([near, near, near, near, [0n, 0n], [U64_MAX, U64_MAX], [BigInt(r.below(4)), BigInt(r.below(10))]]);
  return {
    scope,
    token: { authority, epoch, counter },
    policy: r.pick(['strict', 'allow-equal']),
    opId: r.pick(OP_IDS),
    expectedVersion: r.pick([undefined, undefined, undefined, 0n, 1n, 2n, U64_MAX]),
  };
}

function damaged(r, state) {
  switch (r.below(4)) {
    case 0: {
      const b = Uint8Array.from(state);
      b[r.below(b.length)] ^= 1 << r.below(8);
      return b;
    }
    case 1: return state.slice(0, r.below(state.length));
    case 2: return Uint8Array.from([...state, 0]);
    default: return Uint8Array.from({ length: r.below(80) }, () => r.below(256));
  }
}

function randomItems(r, crafted, pool) {
  const items = [];
  for (let n = r.below(60); n > 0; n--) {
    const roll = r.next();
    let state, scope, around;
    if (roll < 0.12) {
      const [s, request] = r.pick(crafted);
      if (r.next() < 0.5) {
        items.push([s, request]); // as the vector checks it
        continue;
      }
      [state, scope, around] = [s, request.scope, request.token.counter];
    } else {
      [state, scope, around] = r.pick(pool);
      if (state && roll < 0.3) state = damaged(r, state);
    }
    items.push([state, randomRequest(r, scope, around)]);
  }
  return items;
}

function single(g, state, request) {
  try {
    return g.check(state, request);
  } catch (e) {
    if (e instanceof FenceError) return e;
    throw e;
  }
}

// Typed check-batch, check-packed (the public checkBatch) and single checks
// give identical decisions, errors and state bytes; every outcome and error
// kind is reached.
test('random batches agree with typed batch and single checks', () => {
  const g = runtime.instance();
  const r = rng(20261130);
  const crafted = craftedStates();
  const pool = SCOPES.slice(0, 5).map((s) => [null, s, 0n]);
  for (const scope of SCOPES.slice(0, 5)) {
    let state = null;
    for (let c = 1n; c <= 5n; c++) {
      state = g.check(state, { scope, token: token(0, 0, c), policy: 'allow-equal', opId: `op-${c % 3n}` }).state;
      pool.push([state, scope, c]);
    }
  }
  const seen = new Set();
  for (let round = 0; round <= 40; round++) {
    // The last batch: every crafted pair as its vector checks it.
    const items = round < 40 ? randomItems(r, crafted, pool) : crafted;
    const packed = g.checkBatch(items);
    const want = items.map(([s, req]) => key(single(g, s, req)));
    assert.deepEqual(packed.map(key), want);
    assert.deepEqual(g._checkBatchTyped(items).map(key), want);
    for (const o of packed) seen.add(o instanceof FenceError ? `${o.code}/${o.reason ?? ''}` : o.outcome);
    // Applied states feed later batches (deeper windows, later versions).
    packed.forEach((o, i) => {
      if (o.outcome === 'applied' && pool.length < 200) pool.push([o.state, items[i][1].scope, o.highest.counter]);
    });
  }
  const every = ['applied', 'duplicate', 'stale-fence', 'version-conflict', 'unsupported-state-version/',
    'scope-mismatch/', 'foreign-authority/', 'exhausted/',
    ...REASONS.map((x) => `invalid-request/${x}`), ...DAMAGE.map((x) => `corrupt-state/${x}`)];
  assert.deepEqual(every.filter((k) => !seen.has(k)), [], 'every outcome and error kind is reached');
});

function outcomeOf(f) {
  try {
    return key(f());
  } catch (e) {
    if (e instanceof FenceError) return key(e);
    throw e;
  }
}

// check through the core module's single-check export decides exactly as
// jco's typed check and a one-item check-packed batch do (decision, error
// and state bytes), on random pairs (damaged states, every outcome and error
// kind), every crafted vector state, and inputs too large for the guest's
// static buffers (which take check-packed).
test('the single-check export agrees with the component API', () => {
  const g = runtime.instance();
  assert.equal(g._transport, 'one', 'the single-check export must be the one under test');
  const r = rng(20261203);
  const crafted = craftedStates();
  const pool = SCOPES.slice(0, 5).map((s) => [null, s, 0n]);
  for (const scope of SCOPES.slice(0, 5)) {
    let state = null;
    for (let c = 1n; c <= 5n; c++) {
      state = g.check(state, { scope, token: token(0, 0, c), policy: 'allow-equal', opId: `op-${c % 3n}` }).state;
      pool.push([state, scope, c]);
    }
  }
  const items = [...crafted];
  for (let round = 0; round < 30; round++) items.push(...randomItems(r, crafted, pool));
  const big = pool.find(([s]) => s !== null)[0];
  items.push(
    [Uint8Array.from([...big, ...new Uint8Array(20000)]), { scope: 'report/july', token: token(0, 0, 9) }],
    [null, { scope: 'x'.repeat(17000), token: token(0, 0, 1) }],
    [big, { scope: pool[6][1], token: token(0, 0, 9), opId: 'o'.repeat(16400) }],
  );
  const seen = new Set();
  for (const [s, req] of items) {
    const one = outcomeOf(() => g.check(s, req));
    assert.deepEqual(outcomeOf(() => g._checkComponent(s, req)), one);
    assert.deepEqual(outcomeOf(() => g.checkBatch([[s, req]])[0]), one);
    seen.add(one[0] === 'error' ? one[1] : one[1].outcome);
  }
  const every = ['applied', 'duplicate', 'stale-fence', 'version-conflict', 'invalid-request', 'corrupt-state',
    'unsupported-state-version', 'scope-mismatch', 'foreign-authority', 'exhausted'];
  assert.deepEqual(every.filter((k) => !seen.has(k)), []);
});

// A stand-in core module with the single-check exports, assembled here (no
// WAT compiler in the dependencies): `fencecheck-one-input` answers `input`,
// `fencecheck-one` answers `answer` whatever it is given, `data` is at 200.
function sleb(v) {
  const out = [];
  for (let x = BigInt(v); ;) {
    const byte = Number(x & 0x7fn);
    x >>= 7n;
    if ((x === 0n && !(byte & 0x40)) || (x === -1n && byte & 0x40)) return [...out, byte];
    out.push(byte | 0x80);
  }
}
const vec = (items) => [items.length, ...items.flat()];
const name = (s) => vec([...Buffer.from(s)]);
const section = (id, body) => [id, ...leb(body.length), ...body];
function leb(n) {
  const out = [];
  do {
    out.push((n & 0x7f) | (n >= 0x80 ? 0x80 : 0));
    n >>>= 7;
  } while (n > 0);
  return out;
}
function fakeOne(input, answer, { oneType = [[0x7f], [0x7e]], data = 'one' } = {}) {
  const body = (v) => { const code = [0, 0x42, ...sleb(v), 0x0b]; return [code.length, ...code]; };
  return Uint8Array.from([
    0, 0x61, 0x73, 0x6d, 1, 0, 0, 0,
    ...section(1, vec([[0x60, ...vec([]), ...vec([0x7e])], [0x60, ...vec(oneType[0]), ...vec(oneType[1])]])),
    ...section(3, vec([[0], [1]])),
    ...section(5, vec([[0, 1]])),
    ...section(7, vec([[...name('memory'), 2, 0], [...name(ONE_INPUT), 0, 0], [...name(ONE), 0, 1]])),
    ...section(10, vec([body(input), body(answer)])),
    ...section(11, vec([[0, 0x41, ...sleb(200), 0x0b, ...vec([...Buffer.from(data)])]])),
  ]);
}
const region = (at, length) => (BigInt(at) << 32n) | BigInt(length);

// The single-check export's buffer and answer are bounds-checked, never
// trusted: an input buffer outside memory disables the export, an answer
// outside memory is PackedFormatError, -1 is malformed, -2 (or a batch larger
// than the buffer) is left to check-packed (undefined).
test('the single-check path checks what the guest returns', () => {
  const cases = [
    [region(4096, 256), region(200, 3), 1, 'one'], // control: a well-formed answer
    [region(4096, 256), -1n, 1, 'malformed'],
    [region(4096, 256), -2n, 1, undefined], // does not fit the guest's buffers
    [region(4096, 256), region(200, 3), 257, undefined], // larger than the input buffer
    [region(65536 - 8, 256), region(200, 3), 1, null], // input buffer outside memory: never used
    [region(4096, 256), region(65536 - 2, 3), 1, 'error'], // answer runs past the end of memory
    [region(4096, 256), region(2 ** 31 - 1, 2), 1, 'error'], // answer outside memory
    [region(4096, 256), -3n, 1, 'error'], // a negative answer that is no case
    [region(4096, 256), -(2n ** 63n), 1, 'error'], // the sign bit: outside a wasm32 memory
  ];
  for (const [input, answer, n, want] of cases) {
    const bytesIn = fakeOne(input, answer);
    assert.ok(hasOneExports(bytesIn));
    const { exports } = new WebAssembly.Instance(new WebAssembly.Module(bytesIn), {});
    const one = OneCheck.of(exports);
    if (want === null) {
      assert.equal(one, null);
      continue;
    }
    const batch = new Uint8Array(n).fill(7);
    if (want === 'error') {
      assert.throws(() => one.call(batch), (e) => e instanceof PackedFormatError && e.side === 'output', String(answer));
      continue;
    }
    const out = one.call(batch);
    assert.deepEqual(typeof out === 'object' ? Buffer.from(out).toString() : out, want, String(answer));
    if (n <= 256) assert.deepEqual(new Uint8Array(exports.memory.buffer, 4096, n), batch, 'the batch is in the input buffer');
  }
});

// Single-check exports of another core type, a module with imports, or bytes
// that are no core module: the path is not taken (jco's glue serves checks).
test('single-check exports of another shape are not used', () => {
  assert.ok(hasOneExports(fakeOne(region(4096, 256), 0n)));
  for (const oneType of [[[0x7e], [0x7e]], [[0x7f], [0x7f]], [[0x7f, 0x7f], [0x7e]], [[0x7f], []]]) {
    assert.equal(hasOneExports(fakeOne(region(4096, 256), 0n, { oneType })), false, JSON.stringify(oneType));
  }
  const good = fakeOne(region(4096, 256), 0n);
  // An import section with one function import (the module would need it satisfied).
  const imp = Uint8Array.from([...good.subarray(0, 8), ...section(2, vec([[...name('m'), ...name('f'), 0, 0]])), ...good.subarray(8)]);
  assert.equal(coreExports(imp), null);
  assert.equal(coreExports(good.subarray(0, good.length - 3)), null);
  assert.equal(coreExports(Uint8Array.from([0, 0x61, 0x73, 0x6d, 0x0d, 0, 1, 0])), null, 'a component, not a core module');
  // A hook that hides the export: checks cross through jco, and decide the same.
  const hidden = new Runtime({
    instantiateCore: (module, imports) => {
      const { exports } = new WebAssembly.Instance(module, imports);
      const { [ONE]: _, ...rest } = exports;
      return { exports: rest };
    },
  }).instance();
  assert.equal(hidden._transport, 'component');
  const g = runtime.instance();
  const first = g.check(null, { scope: 's', token: token(0, 0, 1) });
  assert.deepEqual(hidden.check(first.state, { scope: 's', token: token(0, 0, 2) }), g.check(first.state, { scope: 's', token: token(0, 0, 2) }));
});

// A guest whose single-check answer the decoder cannot read (cut short) is a
// PackedFormatError, the instance is replaced, and the next check works.
test('malformed single-check output is a host error', () => {
  let cut = false;
  const g = new Runtime({
    instantiateCore: (module, imports) => {
      const { exports } = new WebAssembly.Instance(module, imports);
      return { exports: { ...exports, [ONE]: (n) => { const ret = exports[ONE](n); return cut && ret > 0n ? ret - 1n : ret; } } };
    },
  }).instance();
  assert.equal(g._transport, 'one');
  cut = true;
  assert.throws(() => g.check(null, { scope: 's', token: token(0, 0, 1) }), (e) => e instanceof PackedFormatError && e.side === 'output');
  cut = false;
  assert.equal(g.check(null, { scope: 's', token: token(0, 0, 1) }).outcome, 'applied');
});

// The component's side of the format: each malformation the WIT names is
// `batch-error malformed`.
test('the guest refuses malformed input as batch-error', () => {
  const g = runtime.instance();
  const good = encode([lowered(Uint8Array.of(1), 's', token(0, 0, 1), { opId: 'o' })]);
  assert.deepEqual(g._checkPacked(good).subarray(0, 4), bytes(le(1, 4)));
  assert.deepEqual(g._checkPacked(bytes(le(0, 4))), bytes(le(0, 4)));
  const at = (i, v) => { const b = Uint8Array.from(good); b[i] = v; return b; };
  const scopeAt = 4 + 25 + 4; // count, flags + token, scope-len
  const bad = {
    truncated: good.subarray(0, good.length - 1),
    'truncated count': good.subarray(0, 3),
    'trailing byte': bytes([...good], 0),
    'count above items': at(0, 2),
    'reserved flag bit 6': at(4, good[4] | 0x40),
    'reserved flag bit 7': at(4, good[4] | 0x80),
    'signature without keys': at(4, good[4] | 0x20),
    'keys flag without keys': at(4, good[4] | 0x10),
    'scope not UTF-8': at(scopeAt, 0xff),
    'op-id not UTF-8': at(scopeAt + 1 + 4, 0xc3),
  };
  assert.equal(good[scopeAt], 's'.charCodeAt(0));
  assert.equal(good[scopeAt + 5], 'o'.charCodeAt(0));
  for (const [what, raw] of Object.entries(bad)) assert.equal(g._checkPacked(raw), 'malformed', what);
});

// Faults injected below jco (jco's instantiateCore hook): what checkBatch
// makes of a refused encoding and of unreadable output.
function faultyRuntime(fault) {
  return new Runtime({
    instantiateCore: (module, imports) => {
      const { exports } = new WebAssembly.Instance(module, imports);
      const wrapped = { ...exports };
      wrapped[EXPORT] = (ptr, len) => fault.now(exports, ptr, len);
      return { exports: wrapped };
    },
  });
}

// A refused encoding and unreadable output are PackedFormatErrors (HostErrors),
// never outcomes; after unreadable output the instance is replaced.
test('batch-error and malformed output are host errors', () => {
  const one = [[null, { scope: 's', token: token(0, 0, 1) }]];
  const fault = { now: (x, ptr, len) => x[EXPORT](ptr, len) };
  const g = faultyRuntime(fault).instance();
  assert.equal(g.checkBatch(one)[0].outcome, 'applied');

  // Input: set a reserved flag bit in guest memory before the guest reads it.
  fault.now = (x, ptr, len) => {
    new Uint8Array(x.memory.buffer)[ptr + 4] |= 0x40;
    return x[EXPORT](ptr, len);
  };
  assert.throws(() => g.checkBatch(one), (e) => e instanceof PackedFormatError && e instanceof HostError && e.side === 'input');

  // Output: shorten the returned list by one byte (ret area: tag, ptr, len).
  fault.now = (x, ptr, len) => {
    const ret = x[EXPORT](ptr, len);
    const dv = new DataView(x.memory.buffer);
    dv.setUint32(ret + 8, dv.getUint32(ret + 8, true) - 1, true);
    return ret;
  };
  assert.throws(() => g.checkBatch(one), (e) => e instanceof PackedFormatError && e.side === 'output');

  // A trap inside check-packed is GuestTrapped, and the instance recovers.
  fault.now = () => { throw new WebAssembly.RuntimeError('unreachable'); };
  assert.throws(() => g.checkBatch(one), (e) => e instanceof GuestTrapped && e.call === 'check-packed');
  fault.now = (x, ptr, len) => x[EXPORT](ptr, len);
  assert.equal(g.checkBatch(one)[0].outcome, 'applied');
});

// callBytes bounds check-packed before the call.
test('a packed batch is bounded', () => {
  const g = new Runtime({ limits: { callBytes: 16 } }).instance();
  assert.throws(() => g.checkBatch([[new Uint8Array(17), { scope: 's', token: token(0, 0, 1) }]]), TooLarge);
});
