// The byte format of `check-packed` (its `///` docs in wit/fence.wit): a
// batch crosses the component boundary as one Uint8Array each way, which jco
// copies with one `set` / `slice`, instead of lowering and lifting every field
// of every item through DataView and BigInt.asUintN.
//
// Decoding is strict: anything off the format (unknown tag or sub-case,
// truncation, trailing bytes, a count other than the number of items sent, a
// scope that is not UTF-8, an `unauthenticated` or `invalid-keys` for an item
// sent without keys) throws PackedFormatError and no decision of the batch is
// returned. Guessing an outcome from bytes that do not parse would be worse
// than no outcome.
//
// (index.js imports this module and this one imports index.js's error classes;
// they are used only inside functions, so the cycle is harmless.)

import { AUTH_FAILURES, FenceError, KEY_PROBLEMS, MAX_KEYS, PackedFormatError } from './index.js';

// Input flags (bits 6-7 must be zero; 4 and 5 are new in 0.1.1).
export const STATE = 1;
export const OP_ID = 2;
export const EXPECTED = 4;
export const ALLOW_EQUAL = 8;
export const KEYS = 16;
export const SIGNATURE = 32;

// Case indexes of the WIT enums, in declaration order.
export const INVALID_REASONS = Object.freeze(['missing-token', 'empty-scope', 'scope-too-long', 'empty-op-id', 'op-id-too-long', 'equal-token-unguarded']);
export const CORRUPTIONS = Object.freeze(['truncated', 'length-mismatch', 'checksum-mismatch', 'malformed']);

const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

// A string's UTF-8 bytes with their u32 length before them; returns the new
// offset. Short ASCII strings (the usual scope and op-id) are copied by a
// loop, cheaper than encodeInto's call and view for a dozen bytes.
function writeText(buf, dv, o, s) {
  const n = s.length;
  let i = 0;
  if (n <= 64) {
    for (; i < n; i++) {
      const c = s.charCodeAt(i);
      if (c >= 0x80) break;
      buf[o + 4 + i] = c;
    }
  }
  if (i === n) {
    dv.setUint32(o, n, true);
    return o + 4 + n;
  }
  const { written } = utf8.encodeInto(s, buf.subarray(o + 4));
  dv.setUint32(o, written, true);
  return o + 4 + written;
}

// A u8-length field: the format cannot carry more than 255 bytes, so a longer
// secret or tag is cut to its first 255, which the guest judges the same way
// (`long-secret`; a tag that is not 32 bytes is `malformed-signature`).
function writeShort(buf, o, bytes) {
  const b = bytes.length > 255 ? bytes.subarray(0, 255) : bytes;
  buf[o] = b.length;
  buf.set(b, o + 1);
  return o + 1 + b.length;
}

/**
 * Encode validated items (`{state: Uint8Array | undefined, request, keys}`
 * with the request as index.js lowers it: BigInt token fields, `opId`,
 * `expectedVersion` and `signature` undefined when absent; `keys` an array of
 * `{keyId, secret}` for a scope that requires signed tokens, else undefined,
 * and then the signature is not sent) into one batch.
 */
export function encode(items) {
  const buf = new Uint8Array(encodedBound(items));
  return buf.subarray(0, encodeInto(buf, new DataView(buf.buffer), 0, items));
}

/**
 * An upper bound on the size of `encode(items)`: a UTF-16 length * 3
 * bounds its UTF-8 length.
 */
export function encodedBound(items) {
  let capacity = 4;
  for (const { state, request: r, keys } of items) {
    capacity += 45 + r.scope.length * 3 + (r.opId === undefined ? 0 : 4 + r.opId.length * 3) + (state === undefined ? 0 : 4 + state.length);
    if (keys !== undefined) {
      capacity += 1 + keys.reduce((n, k) => n + 5 + k.secret.length, 0);
      if (r.signature !== undefined) capacity += 9 + r.signature.leaseId.length * 3 + r.signature.tag.length;
    }
  }
  return capacity;
}

/**
 * `encode(items)` written into `buf` (with `dv` a DataView of the same
 * buffer) from offset `start`, where at least `encodedBound(items)` bytes
 * are free (the single-check path writes straight into the guest's input
 * buffer: core.js). Returns the offset after the batch.
 */
export function encodeInto(buf, dv, start, items) {
  dv.setUint32(start, items.length, true);
  let o = start + 4;
  for (const { state, request: r, keys } of items) {
    const t = r.token;
    let flags = r.policy === 'allow-equal' ? ALLOW_EQUAL : 0;
    if (state !== undefined) flags |= STATE;
    if (r.opId !== undefined) flags |= OP_ID;
    if (r.expectedVersion !== undefined) flags |= EXPECTED;
    if (keys !== undefined) flags |= r.signature === undefined ? KEYS : KEYS | SIGNATURE;
    buf[o] = flags;
    dv.setBigUint64(o + 1, t.authority, true);
    dv.setBigUint64(o + 9, t.epoch, true);
    dv.setBigUint64(o + 17, t.counter, true);
    o += 25;
    if (r.expectedVersion !== undefined) {
      dv.setBigUint64(o, r.expectedVersion, true);
      o += 8;
    }
    o = writeText(buf, dv, o, r.scope);
    if (r.opId !== undefined) o = writeText(buf, dv, o, r.opId);
    if (state !== undefined) {
      dv.setUint32(o, state.length, true);
      buf.set(state, o + 4);
      o += 4 + state.length;
    }
    if (keys !== undefined) {
      // More than 255 keys cannot be counted in a u8: the first MAX_KEYS + 1
      // are refused as `too-many-keys` all the same (checked before any key).
      const sent = keys.length > 255 ? keys.slice(0, MAX_KEYS + 1) : keys;
      buf[o] = sent.length;
      o += 1;
      for (const k of sent) {
        dv.setUint32(o, k.keyId, true);
        o = writeShort(buf, o + 4, k.secret);
      }
      const sig = r.signature;
      if (sig !== undefined) {
        dv.setUint32(o, sig.keyId, true);
        o = writeText(buf, dv, o + 4, sig.leaseId);
        o = writeShort(buf, o, sig.tag);
      }
    }
  }
  return o;
}

/**
 * Decode the guest's output for a batch of `expected` items (a count, or per
 * item whether it was sent with keys): decisions and FenceErrors in order,
 * exactly as `check` (`checkSigned` for items with keys) would return or
 * throw them. Throws PackedFormatError (never a guessed outcome) if `out` is
 * off the format.
 */
export function decode(out, items) {
  const expected = typeof items === 'number' ? items : items.length;
  const signed = (i) => typeof items !== 'number' && items[i];
  const end = out.byteLength;
  const dv = new DataView(out.buffer, out.byteOffset, end);
  let o = 0;
  const need = (n, what) => {
    if (o + n > end) throw new PackedFormatError('output', `${what} runs past the end (byte ${o})`);
  };
  const u64 = () => {
    const v = dv.getBigUint64(o, true);
    o += 8;
    return v;
  };
  const token = () => ({ authority: u64(), epoch: u64(), counter: u64() });
  const caseOf = (names, what) => {
    const i = out[o];
    o += 1;
    if (i >= names.length) throw new PackedFormatError('output', `unknown ${what} case ${i}`);
    return names[i];
  };

  need(4, 'the count');
  const n = dv.getUint32(0, true);
  o = 4;
  if (n !== expected) throw new PackedFormatError('output', `${n} results for ${expected} items`);
  const results = new Array(n);
  for (let i = 0; i < n; i++) {
    need(1, 'a tag');
    const tag = out[o];
    o += 1;
    switch (tag) {
      case 0: {
        need(36, 'an applied decision');
        const version = u64();
        const highest = token();
        const length = dv.getUint32(o, true);
        o += 4;
        need(length, 'a state');
        // A copy: each state outlives the batch on its own, as jco's lists do.
        results[i] = { outcome: 'applied', version, highest, state: out.slice(o, o + length) };
        o += length;
        break;
      }
      case 1:
        need(8, 'a duplicate');
        results[i] = { outcome: 'duplicate', version: u64() };
        break;
      case 2:
        need(48, 'a stale-fence');
        results[i] = { outcome: 'stale-fence', presented: token(), highest: token() };
        break;
      case 3:
        need(16, 'a version-conflict');
        results[i] = { outcome: 'version-conflict', expected: u64(), actual: u64() };
        break;
      case 128:
        need(1, 'an invalid-request');
        results[i] = new FenceError('invalid-request', caseOf(INVALID_REASONS, 'invalid-reason'));
        break;
      case 129:
        need(1, 'a corrupt-state');
        results[i] = new FenceError('corrupt-state', caseOf(CORRUPTIONS, 'corruption'));
        break;
      case 130:
        need(1, 'an unsupported-state-version');
        results[i] = new FenceError('unsupported-state-version', undefined, out[o]);
        o += 1;
        break;
      case 131: {
        need(4, 'a scope-mismatch');
        const length = dv.getUint32(o, true);
        o += 4;
        need(length, 'a scope');
        let scope;
        try {
          scope = strictUtf8.decode(out.subarray(o, o + length));
        } catch {
          throw new PackedFormatError('output', 'a scope is not UTF-8');
        }
        results[i] = new FenceError('scope-mismatch', undefined, scope);
        o += length;
        break;
      }
      case 132:
        need(16, 'a foreign-authority');
        results[i] = new FenceError('foreign-authority', undefined, { stored: u64(), presented: u64() });
        break;
      case 133:
        results[i] = new FenceError('exhausted');
        break;
      case 134:
      case 135:
        if (!signed(i)) throw new PackedFormatError('output', `tag ${tag} for an item sent without keys`);
        need(1, tag === 134 ? 'an unauthenticated' : 'an invalid-keys');
        results[i] = tag === 134
          ? new FenceError('unauthenticated', caseOf(AUTH_FAILURES, 'auth-failure'))
          : new FenceError('invalid-keys', caseOf(KEY_PROBLEMS, 'key-problem'));
        break;
      default:
        throw new PackedFormatError('output', `unknown tag ${tag} at byte ${o - 1}`);
    }
  }
  if (o !== end) throw new PackedFormatError('output', `${end - o} trailing bytes`);
  return results;
}
