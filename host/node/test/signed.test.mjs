// Signed tokens over the real component: sign, checkSigned (typed
// auth.check-signed) and checkBatch with keys (check-packed, flags 4 and 5)
// decide alike; refusals are FenceErrors with their reasons, never host
// errors; bad JavaScript values never reach the guest.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import {
  AUTH_FAILURES, FenceError, HostError, KEY_PROBLEMS, PackedFormatError, Runtime, SignError, TooLarge, U64_MAX, _lift, token,
} from '../src/index.js';
import { decode, encode } from '../src/packed.js';

const runtime = new Runtime();
const K3 = { keyId: 3, secret: new Uint8Array(32).fill(0x33) };
const K4 = { keyId: 4, secret: new Uint8Array(32).fill(0x44) };
const JULY = 'report/july';

function signed(g, counter, key = K3, scope = JULY, lease = 'lease-1') {
  const t = token(0, 1, counter);
  return { scope, token: t, signature: g.sign(scope, t, lease, key) };
}

const refusal = (code, reason) => (e) => e instanceof FenceError && !(e instanceof HostError)
  && e.code === code && e.reason === reason && e.retryable === false;

// The signer's tag is HMAC-SHA256 of grantMessage under the key, and
// grantMessage is laid out as the WIT documents it.
test('sign is HMAC-SHA256 of grant-message', () => {
  const g = runtime.instance();
  const t = { authority: 7n, epoch: 2n, counter: U64_MAX };
  const s = g.sign('ledger/ü', t, 'lease-9', K3);
  assert.equal(s.keyId, 3);
  assert.equal(s.leaseId, 'lease-9');
  const msg = g.grantMessage('ledger/ü', t, 3, 'lease-9');
  const le = (v, n) => { const b = Buffer.alloc(n); if (n === 4) b.writeUInt32LE(Number(v)); else b.writeBigUInt64LE(v); return b; };
  const scope = Buffer.from('ledger/ü');
  assert.deepEqual(Buffer.from(msg), Buffer.concat([Buffer.from('fencecheck-grant-v1\0'), le(scope.length, 4), scope,
    le(7n, 8), le(2n, 8), le(U64_MAX, 8), le(3, 4), le(7, 4), Buffer.from('lease-9')]));
  assert.deepEqual(Buffer.from(s.tag), createHmac('sha256', K3.secret).update(msg).digest());
});

// Each sign-error case is a SignError with its code (and key problem).
test('sign refusals', () => {
  const g = runtime.instance();
  const cases = [
    [['', token(0, 1, 1), 'l', K3], 'empty-scope'],
    [['x'.repeat(1025), token(0, 1, 1), 'l', K3], 'scope-too-long'],
    [['s', token(0, 0, 0), 'l', K3], 'missing-token'],
    [['s', token(0, 1, 1), '', K3], 'empty-lease-id'],
    [['s', token(0, 1, 1), 'l'.repeat(257), K3], 'lease-id-too-long'],
    [['s', token(0, 1, 1), 'l', { keyId: 1, secret: new Uint8Array(15) }], 'invalid-key', 'short-secret'],
    [['s', token(0, 1, 1), 'l', { keyId: 1, secret: new Uint8Array(65) }], 'invalid-key', 'long-secret'],
  ];
  for (const [args, code, reason] of cases) {
    assert.throws(() => g.sign(...args), (e) => e instanceof SignError && !(e instanceof HostError)
      && e.code === code && e.reason === reason && e.retryable === false, code);
  }
});

// A signed grant applies; unsigned, unknown-key, malformed, tampered,
// replayed and relabelled ones are unauthenticated with their reason; an
// unusable key set is invalid-keys; each is thrown by checkSigned and
// returned in place by checkBatch, and neither changes the state.
test('checkSigned and packed batches decide alike', () => {
  const g = runtime.instance();
  const { state } = g.checkSigned(null, signed(g, 1), [K3]);
  const good = signed(g, 2);
  const sig = good.signature;
  const cases = [
    [{ ...good, signature: undefined }, [K3], 'unauthenticated', 'unsigned'],
    [{ ...good, signature: null }, [K3], 'unauthenticated', 'unsigned'],
    [good, [K4], 'unauthenticated', 'unknown-key'],
    [{ ...good, signature: { ...sig, tag: sig.tag.subarray(0, 31) } }, [K3], 'unauthenticated', 'malformed-signature'],
    [{ ...good, signature: { ...sig, tag: new Uint8Array(300) } }, [K3], 'unauthenticated', 'malformed-signature'],
    [{ ...good, signature: { ...sig, leaseId: '' } }, [K3], 'unauthenticated', 'malformed-signature'],
    [{ ...good, signature: { ...sig, leaseId: 'l'.repeat(257) } }, [K3], 'unauthenticated', 'malformed-signature'],
    [{ ...good, token: token(0, 1, 3) }, [K3], 'unauthenticated', 'bad-signature'],
    [{ ...good, token: token(9, 1, 2) }, [K3], 'unauthenticated', 'bad-signature'],
    [{ ...good, scope: 'report/june' }, [K3], 'unauthenticated', 'bad-signature'],
    [{ ...good, signature: { ...sig, leaseId: 'lease-2' } }, [K3], 'unauthenticated', 'bad-signature'],
    [{ ...good, signature: { ...sig, keyId: 5 } }, [K3, { keyId: 5, secret: K3.secret }], 'unauthenticated', 'bad-signature'],
    [{ ...good, token: { authority: U64_MAX, epoch: U64_MAX, counter: U64_MAX } }, [K3], 'unauthenticated', 'bad-signature'],
    [good, [], 'invalid-keys', 'no-keys'],
    [good, Array.from({ length: 17 }, (_, i) => ({ keyId: i, secret: K3.secret })), 'invalid-keys', 'too-many-keys'],
    [good, Array.from({ length: 300 }, (_, i) => ({ keyId: i, secret: K3.secret })), 'invalid-keys', 'too-many-keys'],
    [good, [{ keyId: 3, secret: new Uint8Array(15) }], 'invalid-keys', 'short-secret'],
    [good, [{ keyId: 3, secret: new Uint8Array(65) }], 'invalid-keys', 'long-secret'],
    [good, [{ keyId: 3, secret: new Uint8Array(400) }], 'invalid-keys', 'long-secret'],
    [good, [K3, { keyId: 3, secret: K4.secret }], 'invalid-keys', 'duplicate-key-id'],
    [{ ...good, scope: '' }, [K3], 'invalid-request', 'empty-scope'],
  ];
  for (const [request, keys, code, reason] of cases) {
    const what = `${code}/${reason}`;
    assert.throws(() => g.checkSigned(state, request, keys), refusal(code, reason), what);
    const [packed] = g.checkBatch([[state, request, keys]]);
    assert.ok(refusal(code, reason)(packed), `${what}: packed gave ${packed.code}/${packed.reason}`);
  }
  // Every auth-failure and key-problem case was reached.
  const reached = new Set(cases.map(([, , , reason]) => reason));
  assert.deepEqual([...AUTH_FAILURES, ...KEY_PROBLEMS].filter((r) => !reached.has(r)), []);
  // Nothing changed: the good grant applies on the same state, identically on both paths.
  const typed = g.checkSigned(state, good, [K4, K3]);
  assert.equal(typed.outcome, 'applied');
  assert.deepEqual(g.checkBatch([[state, good, [K4, K3]]]), [typed]);
  // After the state: a stale signed grant is stale-fence, as unsigned.
  assert.equal(g.checkSigned(typed.state, good, [K3]).outcome, 'stale-fence');
});

// Authentication comes before the state is read: on a corrupt state a bad
// signature is unauthenticated, a good one corrupt-state.
test('authentication before the state', () => {
  const g = runtime.instance();
  const { state } = g.checkSigned(null, signed(g, 1), [K3]);
  const damaged = Uint8Array.from(state);
  damaged[20] ^= 1;
  const good = signed(g, 2);
  assert.throws(() => g.checkSigned(damaged, { ...good, token: token(0, 1, 3) }, [K3]), refusal('unauthenticated', 'bad-signature'));
  assert.throws(() => g.checkSigned(damaged, good, [K3]), refusal('corrupt-state', 'checksum-mismatch'));
});

// Without keys the scope is not opted in: check and a batch item without
// keys ignore any signature, even a forged one; a mixed batch decides each
// item its own way.
test('check ignores signatures', () => {
  const g = runtime.instance();
  const forged = { scope: JULY, token: token(0, 1, 1), signature: { keyId: 1, leaseId: 'x', tag: new Uint8Array(3) } };
  assert.equal(g.check(null, forged).outcome, 'applied');
  const out = g.checkBatch([[null, forged], [null, forged, null], [null, forged, [K3]], [null, signed(g, 1), [K3]]]);
  assert.deepEqual(out.map((o) => o.outcome ?? `${o.code}/${o.reason}`),
    ['applied', 'applied', 'unauthenticated/malformed-signature', 'applied']);
});

// Values jco would wrap, truncate or replace are refused before the guest.
test('bad key and signature values never reach the component', () => {
  const g = runtime.instance();
  const r = signed(g, 1);
  for (const keys of [undefined, K3, [null], [{ keyId: -1, secret: K3.secret }], [{ keyId: 2 ** 32, secret: K3.secret }],
    [{ keyId: 1.5, secret: K3.secret }], [{ keyId: 3n, secret: K3.secret }], [{ keyId: 3, secret: [1, 2] }], [{ keyId: 3 }]]) {
    assert.throws(() => g.checkSigned(null, r, keys), (e) => e instanceof TypeError || e instanceof RangeError, String(keys));
    assert.throws(() => g.checkBatch([[null, r, keys ?? 5]]), (e) => e instanceof TypeError || e instanceof RangeError);
  }
  for (const signature of [5, { ...r.signature, keyId: -1 }, { ...r.signature, leaseId: '\ud800' }, { ...r.signature, tag: 'x' }]) {
    assert.throws(() => g.checkSigned(null, { ...r, signature }, [K3]), (e) => e instanceof TypeError || e instanceof RangeError);
    assert.throws(() => g.check(null, { ...r, signature }), (e) => e instanceof TypeError || e instanceof RangeError);
  }
  assert.throws(() => g.sign('s', token(0, 1, 1), 'l', { keyId: 2 ** 32, secret: K3.secret }), RangeError);
  assert.throws(() => g.grantMessage('s', token(0, 1, 1), -1, 'l'), RangeError);
  assert.throws(() => g._checkBatchTyped([[null, r, [K3]]]), TypeError);
  const small = new Runtime({ limits: { callBytes: 64 } }).instance();
  const big = [{ keyId: 1, secret: new Uint8Array(64) }];
  assert.throws(() => small.checkSigned(null, r, big), TooLarge);
  assert.throws(() => small.checkBatch([[null, r, big]]), TooLarge);
});

// -- the packed codec, byte for byte ----------------------------------------

const le = (n, width) => [...Array(width)].map((_, i) => Number((BigInt(n) >> BigInt(8 * i)) & 0xffn));
const bytes = (...parts) => Uint8Array.from(parts.flat(Infinity));

// Flags 4 and 5, keys after the state, the signature last; cut counts and
// lengths as Rust's put_auth cuts them.
test('encode carries keys and signature', () => {
  const req = (signature) => ({ scope: 's', token: token(0, 0, 1), policy: 'strict', opId: undefined, expectedVersion: undefined, signature });
  const sig = { keyId: 7, leaseId: 'lé', tag: Uint8Array.of(9, 8) };
  const head = (flags) => [flags, le(0, 8), le(0, 8), le(1, 8), le(1, 4), 0x73];
  assert.deepEqual(encode([
    { state: Uint8Array.of(0xaa), request: req(sig), keys: [{ keyId: 3, secret: Uint8Array.of(1, 2) }] },
    { state: undefined, request: req(undefined), keys: [] },
    { state: undefined, request: req(sig), keys: undefined }, // not opted in: the signature is not sent
  ]), bytes(le(3, 4),
    head(0b110001), le(1, 4), 0xaa, 1, le(3, 4), 2, 1, 2, le(7, 4), le(3, 4), 0x6c, 0xc3, 0xa9, 2, 9, 8,
    head(0b010000), 0,
    head(0)));
  const many = encode([{ state: undefined, request: req(undefined), keys: Array.from({ length: 256 }, (_, i) => ({ keyId: i, secret: new Uint8Array(300) })) }]);
  assert.equal(many[4 + 30], 17); // 17 keys (too many, as 256 are), each secret cut to 255 bytes
  assert.equal(many.length, 4 + 30 + 1 + 17 * (4 + 1 + 255));
});

// 134 and 135 decode to their reasons for items sent with keys, and are
// refused for items sent without, as are unknown cases.
test('decode reads unauthenticated and invalid-keys', () => {
  const out = bytes(le(AUTH_FAILURES.length + KEY_PROBLEMS.length, 4), AUTH_FAILURES.map((_, i) => [134, i]), KEY_PROBLEMS.map((_, i) => [135, i]));
  const all = Array(AUTH_FAILURES.length + KEY_PROBLEMS.length).fill(true);
  assert.deepEqual(decode(out, all).map((e) => `${e.code}/${e.reason}`),
    [...AUTH_FAILURES.map((r) => `unauthenticated/${r}`), ...KEY_PROBLEMS.map((r) => `invalid-keys/${r}`)]);
  for (const [raw, sent] of [[[134, 0], [false]], [[135, 0], 1], [[134, AUTH_FAILURES.length], [true]], [[135, KEY_PROBLEMS.length], [true]], [[134], [true]], [[136, 0], [true]]]) {
    assert.throws(() => decode(bytes(le(1, 4), raw), sent), (e) => e instanceof PackedFormatError && e.side === 'output', String(raw));
  }
});

// Cases outside the contract are host errors, never refusals.
test('unknown signed cases are host errors', () => {
  const unknown = (e) => e instanceof HostError && /unknown/.test(e.message);
  for (const e of [{ tag: 'unauthenticated', val: 'expired' }, { tag: 'invalid-keys', val: 'bad-signature' }, { tag: 'forged' }]) {
    assert.throws(() => _lift.signedCheckError(e), unknown);
  }
  for (const e of [{ tag: 'invalid-key' }, { tag: 'empty-scope', val: 'no-keys' }, { tag: 'weak-key' }]) assert.throws(() => _lift.signError(e), unknown);
  assert.equal(_lift.signedCheckError({ tag: 'check', val: { tag: 'exhausted' } }).code, 'exhausted');
  assert.throws(() => _lift.signedCheckError({ tag: 'check', val: { tag: 'lock-mismatch', val: 'x' } }), unknown);
});
