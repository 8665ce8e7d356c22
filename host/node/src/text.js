// The text forms every fencecheck host shares (Rust: host/runtime/src/text.rs).
//
// A token: `EPOCH.COUNTER` (authority 0) or `AUTHORITY:EPOCH.COUNTER`, each a
// decimal u64 of digits only (no sign, no spaces). A
// signed token appends `~KEY-ID~LEASE~TAG`: the key id a decimal u32, the
// lease id (UTF-8) and the tag in canonical base64url without padding.
// Parsing checks the form only: whether the signature is valid, and whether
// its lease id and tag have usable lengths, is the component's decision
// (`checkSigned`: `unauthenticated`, `malformed-signature`).
//
// A key set: `KEY-ID:SECRET-HEX` entries separated by commas or newlines;
// blank entries and lines starting with `#` are skipped; the set must then be
// usable (keyProblem). Errors never contain a secret.
//
// (index.js re-exports this module, and this one imports index.js's error
// classes; they are used only inside functions, so the cycle is harmless.)

import { KeySetError, TokenTextError } from './index.js';

const U64_MAX = (1n << 64n) - 1n;
const U32_MAX = 0xffffffff;

/** Most keys in one set, and the secret lengths a key may have (guest/src/auth.rs). */
export const MAX_KEYS = 16;
export const MIN_SECRET_BYTES = 16;
export const MAX_SECRET_BYTES = 64;

const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

// A decimal of digits only (no sign, no space), at most `max`; else undefined.
function decimal(s, max) {
  if (!/^[0-9]+$/.test(s)) return undefined;
  const v = BigInt(s);
  return v <= max ? v : undefined;
}

function refused(text) {
  // As in Rust: the rejected text, cut to 64 characters (code points).
  return new TokenTextError([...String(text)].slice(0, 64).join(''));
}

/** Parse `EPOCH.COUNTER` or `AUTHORITY:EPOCH.COUNTER`; throws TokenTextError. */
export function parseToken(text) {
  if (typeof text !== 'string') throw new TypeError('token text must be a string');
  const colon = text.indexOf(':');
  const authority = colon < 0 ? 0n : decimal(text.slice(0, colon), U64_MAX);
  const rest = colon < 0 ? text : text.slice(colon + 1);
  const dot = rest.indexOf('.');
  const epoch = dot < 0 ? undefined : decimal(rest.slice(0, dot), U64_MAX);
  const counter = dot < 0 ? undefined : decimal(rest.slice(dot + 1), U64_MAX);
  if (authority === undefined || epoch === undefined || counter === undefined) throw refused(text);
  return { authority, epoch, counter };
}

/** A token's canonical text (`AUTHORITY:` is written only when it is not 0). */
export function formatToken(t) {
  const part = (v, what) => {
    if (typeof v === 'number' && Number.isSafeInteger(v)) v = BigInt(v);
    if (typeof v !== 'bigint' || v < 0n || v > U64_MAX) throw new RangeError(`${what} must be an integer in 0..=2^64-1`);
    return v;
  };
  if (t === null || typeof t !== 'object') throw new TypeError('token must be a token');
  const authority = part(t.authority, 'token.authority');
  return `${authority === 0n ? '' : `${authority}:`}${part(t.epoch, 'token.epoch')}.${part(t.counter, 'token.counter')}`;
}

// Canonical base64url without padding: one spelling per value (no '=', no
// '+' or '/', zero trailing bits), as Rust's URL_SAFE_NO_PAD decoder.
function base64url(s) {
  if (!/^[A-Za-z0-9_-]*$/.test(s)) return undefined;
  const bytes = Buffer.from(s, 'base64url');
  return bytes.toString('base64url') === s ? new Uint8Array(bytes) : undefined;
}

/**
 * Parse `TOKEN` or `TOKEN~KEY-ID~LEASE~TAG` into `{token, signature}`
 * (`signature` undefined for plain token text); throws TokenTextError.
 */
export function parseSignedToken(text) {
  if (typeof text !== 'string') throw new TypeError('token text must be a string');
  const [head, ...parts] = text.split('~');
  if (parts.length === 0) return { token: parseToken(text), signature: undefined };
  if (parts.length !== 3) throw refused(text);
  let token;
  try {
    token = parseToken(head);
  } catch {
    throw refused(text);
  }
  const keyId = decimal(parts[0], BigInt(U32_MAX));
  const lease = base64url(parts[1]);
  const tag = base64url(parts[2]);
  let leaseId;
  try {
    leaseId = lease === undefined ? undefined : strictUtf8.decode(lease);
  } catch {
    leaseId = undefined;
  }
  if (keyId === undefined || leaseId === undefined || tag === undefined) throw refused(text);
  return { token, signature: { keyId: Number(keyId), leaseId, tag } };
}

/** A token with its signature (if any) as text: `TOKEN` or `TOKEN~KEY-ID~LEASE~TAG`. */
export function formatSignedToken({ token, signature }) {
  const text = formatToken(token);
  if (signature === undefined || signature === null) return text;
  const { keyId, leaseId, tag } = signature;
  if (!Number.isInteger(keyId) || keyId < 0 || keyId > U32_MAX) throw new RangeError('signature.keyId must be an integer in 0..=2^32-1');
  if (typeof leaseId !== 'string' || !leaseId.isWellFormed()) throw new TypeError('signature.leaseId must be a well-formed string');
  if (!(tag instanceof Uint8Array)) throw new TypeError('signature.tag must be a Uint8Array');
  const b64 = (bytes) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64url');
  return `${text}~${keyId}~${b64(Buffer.from(leaseId, 'utf8'))}~${b64(tag)}`;
}

/**
 * What makes `keys` unusable for a scope that requires signed tokens, as the
 * component judges it (`no-keys`, `too-many-keys`, `short-secret`,
 * `long-secret`, `duplicate-key-id`), or null if it is usable. Keys must be
 * `{keyId, secret: Uint8Array}`; other shapes throw TypeError.
 */
export function keyProblem(keys) {
  if (!Array.isArray(keys)) throw new TypeError('keys must be an array of {keyId, secret}');
  for (const k of keys) {
    if (k === null || typeof k !== 'object' || !(k.secret instanceof Uint8Array)) throw new TypeError('a key must be {keyId, secret: Uint8Array}');
    if (!Number.isInteger(k.keyId) || k.keyId < 0 || k.keyId > U32_MAX) throw new RangeError('keyId must be an integer in 0..=2^32-1');
  }
  if (keys.length === 0) return 'no-keys';
  if (keys.length > MAX_KEYS) return 'too-many-keys';
  for (const [i, k] of keys.entries()) {
    if (k.secret.length < MIN_SECRET_BYTES) return 'short-secret';
    if (k.secret.length > MAX_SECRET_BYTES) return 'long-secret';
    if (keys.slice(i + 1).some((o) => o.keyId === k.keyId)) return 'duplicate-key-id';
  }
  return null;
}

// Rust's `str::trim` (Unicode White_Space), not JS's (which also trims U+FEFF
// and keeps U+0085).
const WS = '[\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const TRIM = new RegExp(`^${WS}+|${WS}+$`, 'g');
const TRIM_START = new RegExp(`^${WS}+`);

/**
 * Parse a key set (`3:00112233…, 4:…` or one per line, `#` comments) into
 * `[{keyId, secret}]`. Throws KeySetError naming the bad entry's position or
 * the set's problem (never a secret).
 */
export function parseKeys(text) {
  if (typeof text !== 'string') throw new TypeError('key text must be a string');
  const entries = text.split('\n')
    .filter((line) => !line.replace(TRIM_START, '').startsWith('#'))
    .flatMap((line) => line.split(','))
    .map((entry) => entry.replace(TRIM, ''))
    .filter((entry) => entry !== '');
  const keys = entries.map((entry, n) => {
    const colon = entry.indexOf(':');
    const id = colon < 0 ? undefined : decimal(entry.slice(0, colon), BigInt(U32_MAX));
    const hex = colon < 0 ? '' : entry.slice(colon + 1);
    if (id === undefined || hex.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(hex)) {
      throw new KeySetError(`entry ${n + 1} is not KEY-ID:SECRET-HEX`);
    }
    return { keyId: Number(id), secret: new Uint8Array(Buffer.from(hex, 'hex')) };
  });
  const problem = keyProblem(keys);
  if (problem) throw new KeySetError(problem);
  return keys;
}

/** A key set as text (`3:hex,4:hex`): it contains the secrets (for key files). */
export function formatKeys(keys) {
  const problem = keyProblem(keys);
  if (problem) throw new KeySetError(problem);
  return keys.map((k) => `${k.keyId}:${Buffer.from(k.secret).toString('hex')}`).join(',');
}

/** The one key of a signing key file (an authority signs with one key). */
export function signingKey(keys) {
  if (!Array.isArray(keys) || keys.length !== 1) {
    throw new KeySetError(`${Array.isArray(keys) ? keys.length : 0} keys; an authority signs with one`);
  }
  return keys[0];
}
