// The shared text forms (host/runtime/src/text.rs): tokens, signed tokens and
// key sets parse and print back, and every departure from the form is
// refused, mirroring the Rust tests case for case.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  FencecheckError, KeySetError, Runtime, TokenTextError, U64_MAX, formatKeys, formatSignedToken, formatToken,
  keyProblem, parseKeys, parseSignedToken, parseToken, signingKey, token,
} from '../src/index.js';

// The full u64 range round-trips; authority 0 is not written.
test('token text round-trips the full range', () => {
  const text = `${U64_MAX}:${U64_MAX}.${U64_MAX}`;
  assert.deepEqual(parseToken(text), { authority: U64_MAX, epoch: U64_MAX, counter: U64_MAX });
  assert.equal(formatToken(parseToken(text)), text);
  assert.deepEqual(parseToken('7:2.41'), token(7, 2, 41));
  assert.equal(formatToken(token(0, 0, 42)), '0.42');
  assert.deepEqual(parseToken('007.041'), token(0, 7, 41)); // digits only, as Rust's
});

// Everything outside the grammar is refused (Rust's rejects_non_canonical_text).
test('non-canonical token text is refused', () => {
  for (const bad of ['', '41', '.41', '0.', '+0.41', '0.-1', '0 .41', '0.41 ', '1:2:0.3', '0.1.2',
    '18446744073709551616.0', 'a.b', '0x1.2', ':0.1', '０.1', '0.41\n']) {
    assert.throws(() => parseToken(bad), (e) => e instanceof TokenTextError && e instanceof FencecheckError && e.text === bad, JSON.stringify(bad));
  }
  assert.equal(new TokenTextError('x'.repeat(64)).text.length, 64);
  assert.throws(() => parseToken('x'.repeat(100)), (e) => e.text === 'x'.repeat(64));
  assert.throws(() => formatToken({ authority: -1n, epoch: 0n, counter: 1n }), RangeError);
});

// A signed token round-trips (the Rust doc example's spelling too); plain
// text has no signature (Rust's signed_text).
test('signed token text round-trips', () => {
  const signed = { token: token(7, 2, 41), signature: { keyId: 0xffffffff, leaseId: 'lease-7f3a9c2e-0001', tag: Uint8Array.from({ length: 32 }, (_, i) => i) } };
  const text = formatSignedToken(signed);
  assert.deepEqual(parseSignedToken(text), signed);
  assert.deepEqual(parseSignedToken('7:2.41'), { token: token(7, 2, 41), signature: undefined });
  assert.equal(formatSignedToken({ token: token(7, 2, 41) }), '7:2.41');
  const doc = formatSignedToken({ token: token(0, 2, 41), signature: { keyId: 3, leaseId: 'L1', tag: new Uint8Array(32).fill(0xff) } });
  assert.ok(doc.startsWith('2.41~3~TDE~__'), doc);
  // Form only: lengths are the component's decision (malformed-signature).
  assert.deepEqual(parseSignedToken('2.41~3~~').signature, { keyId: 3, leaseId: '', tag: new Uint8Array() });
});

// Each departure from the form is refused: part count, key id range and
// sign, padding, other alphabets, non-zero trailing bits, a lease id that is
// not UTF-8, a bad token part.
test('malformed signed token text is refused', () => {
  for (const bad of ['2.41~', '2.41~3~TDE', '2.41~3~TDE~AA~x', '2.41~4294967296~TDE~AA', '2.41~+3~TDE~AA',
    '2.41~3~TDE=~AA', '2.41~3~TD+~AA', '2.41~3~TDF~AA', '2.41~3~_w~AA', 'x~3~TDE~AA', '~3~TDE~AA',
    '2.41~3~TDE~A', '2.41~3~TD/~AA', '2.41~ 3~TDE~AA', '2.41~3~TDE~AA=', '2.41~3~TDE~AB']) {
    assert.throws(() => parseSignedToken(bad), (e) => e instanceof TokenTextError && e.text === bad, JSON.stringify(bad));
  }
  assert.throws(() => formatSignedToken({ token: token(0, 1, 1), signature: { keyId: -1, leaseId: 'l', tag: new Uint8Array() } }), RangeError);
});

// A signature from the component survives its text form and still verifies.
test('a signed token from sign verifies after a text round trip', () => {
  const g = new Runtime().instance();
  const key = { keyId: 9, secret: new Uint8Array(32).fill(7) };
  const signature = g.sign('report/july', token(0, 3, 5), 'lease-ü', key);
  const { token: t, signature: s } = parseSignedToken(formatSignedToken({ token: token(0, 3, 5), signature }));
  assert.equal(g.checkSigned(null, { scope: 'report/july', token: t, signature: s }, [key]).outcome, 'applied');
});

// Key sets parse from commas or lines with comments and print back; every
// malformed or unusable set is refused naming the entry or the problem,
// never a secret (Rust's keys_text).
test('key set text', () => {
  const text = '# rotation\n3:00112233445566778899aabbccddeeff\r\n\n  4:FFEEDDCCBBAA99887766554433221100ffee ,5:000102030405060708090a0b0c0d0e0f\n';
  const keys = parseKeys(text);
  assert.deepEqual(keys.map((k) => k.keyId), [3, 4, 5]);
  assert.equal(keys[1].secret.length, 18);
  assert.deepEqual(parseKeys(formatKeys(keys)), keys);
  assert.equal(keyProblem(keys), null);
  const sixteen = '00112233445566778899aabbccddeeff';
  const secret = 'a5'.repeat(16);
  for (const [bad, reason] of [
    ['', 'no-keys'],
    ['# only a comment', 'no-keys'],
    ['  # indented comment\n , ,', 'no-keys'],
    ['3:0011', 'short-secret'],
    [`3:${'00'.repeat(65)}`, 'long-secret'],
    [`3:${sixteen},3:${sixteen}`, 'duplicate-key-id'],
    [Array.from({ length: 17 }, (_, i) => `${i}:${sixteen}`).join(','), 'too-many-keys'],
    [`x:${sixteen}`, 'entry 1 is not KEY-ID:SECRET-HEX'],
    [`4294967296:${sixteen}`, 'entry 1 is not KEY-ID:SECRET-HEX'],
    [`3:${sixteen},4:${sixteen}0`, 'entry 2 is not KEY-ID:SECRET-HEX'],
    [`3:${sixteen},4-${sixteen}`, 'entry 2 is not KEY-ID:SECRET-HEX'],
    [`3:${sixteen.slice(2)}zz`, 'entry 1 is not KEY-ID:SECRET-HEX'],
    [`+3:${secret}`, 'entry 1 is not KEY-ID:SECRET-HEX'],
    [`3:${secret}:${secret}`, 'entry 1 is not KEY-ID:SECRET-HEX'],
  ]) {
    assert.throws(() => parseKeys(bad), (e) => e instanceof KeySetError && e.reason === reason
      && e.message === `invalid key set: ${reason}` && !e.message.includes('a5a5'), JSON.stringify(bad));
  }
  assert.deepEqual(signingKey(parseKeys(`3:${secret}`)), { keyId: 3, secret: new Uint8Array(16).fill(0xa5) });
  assert.throws(() => signingKey(keys), (e) => e instanceof KeySetError && e.reason === '3 keys; an authority signs with one');
  assert.throws(() => keyProblem([{ keyId: 1, secret: 'text' }]), TypeError);
});
