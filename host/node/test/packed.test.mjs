// check-packed: the byte codec against hand-built bytes (wit/fence.wit), and
// random batches that must decide identically through typed check-batch,
// check-packed and single checks.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { FenceError, HostError, PackedFormatError, Runtime, TooLarge, GuestTrapped, U64_MAX, WIT_VERSION, token } from '../src/index.js';
import { decode, encode } from '../src/packed.js';
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
