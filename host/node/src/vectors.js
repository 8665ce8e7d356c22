// The conformance-vector runner, same contract as the Rust reference
// (host/runtime/src/vectors.rs; format in tests/vectors/README.md).
//
// Files are parsed losslessly (lossless-json): every integer becomes a BigInt,
// so u64 values up to 2^64-1 survive; non-integers, negatives and values past
// u64 are refused, as are unknown fields. A fence slot is threaded through the
// check steps (only `applied` replaces it) and a lease slot through the lease
// steps (every outcome carrying a state replaces it); `damage` alters either.
// A HostError (trapped guest) ends the file with a failure line: it is never
// taken for an outcome.
//
// Signed tokens (0.1.1): a `check` with `keys` (`[{"id", "secret": HEX}]`,
// possibly empty) is on a scope that requires signed tokens (checkSigned),
// with an optional `signature` (`{"key_id", "lease_id", "tag": HEX}`), which
// a check without `keys` may carry too: check ignores it. A `sign` step
// expects `signed` with its exact `tag` (hex), or an error.
//
// Three transports: `component` (jco's typed check / auth.check-signed:
// `_checkComponent`, `_checkSignedComponent`), `packed` (every check as a
// one-item checkBatch: check-packed) and `one` (check / checkSigned as they
// cross by default: the core module's single-check export).

import { readFileSync } from 'node:fs';
import { isInteger, parse as losslessParse } from 'lossless-json';
import { FenceError, HostError, LeaseError, SignError, U64_MAX } from './index.js';

const isRefusal = (o) => o instanceof FenceError || o instanceof LeaseError || o instanceof SignError;

/** The file (or a line) is not well-formed. */
export class VectorFormatError extends Error {
  get name() { return 'VectorFormatError'; }
}

const FILE_KEYS = ['name', 'description', 'steps'];
const STEP_KEYS = ['check', 'sign', 'damage', 'bit', 'len', 'hex', 'state', 'acquire', 'renew', 'release', 'restore', 'expect'];
const CHECK_KEYS = ['scope', 'token', 'authority', 'policy', 'op_id', 'expected_version', 'keys', 'signature'];
const EXPECT_KEYS = ['outcome', 'version', 'highest', 'presented', 'expected', 'actual', 'error', 'reason', 'token', 'expires_at', 'holder', 'epoch', 'tag'];
const ACTIONS = ['check', 'sign', 'damage', 'acquire', 'renew', 'release', 'restore'];
const SIGN_KEYS = ['scope', 'token', 'authority', 'lease_id', 'key'];
export const TRANSPORTS = Object.freeze(['component', 'packed', 'one']);
const LEASE_KEYS = {
  acquire: ['lock', 'lease_id', 'now', 'ttl', 'authority', 'epoch_floor'],
  renew: ['lease_id', 'token', 'authority', 'now', 'ttl'],
  release: ['lease_id', 'token', 'authority'],
  restore: [],
};

class NotInteger {
  constructor(text) { this.text = text; }
  toString() { return this.text; }
}

/** Parse JSON text with every integer as a BigInt (lossless). */
export function parseJson(text) {
  try {
    return losslessParse(text, null, (s) => (isInteger(s) ? BigInt(s) : new NotInteger(s)));
  } catch (e) {
    throw new VectorFormatError(`cannot parse: ${e.message}`);
  }
}

const isObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v) && !(v instanceof NotInteger);
const present = (o, k) => o[k] !== undefined && o[k] !== null;

export function obj(value, keys, what) {
  if (!isObject(value)) throw new VectorFormatError(`${what} must be an object`);
  const unknown = Object.keys(value).filter((k) => !keys.includes(k)).sort();
  if (unknown.length) throw new VectorFormatError(`unknown field \`${unknown[0]}\` in ${what}`);
  return value;
}

export function u64(value, what) {
  if (typeof value !== 'bigint' || value < 0n || value > U64_MAX) {
    throw new VectorFormatError(`${what} must be an integer in 0..=2^64-1, got ${String(value)}`);
  }
  return value;
}

const optU64 = (o, k) => (present(o, k) ? u64(o[k], k) : undefined);

function str(o, k, what) {
  if (typeof o[k] !== 'string') throw new VectorFormatError(`${what} must be a string`);
  return o[k];
}

const optStr = (o, k) => (present(o, k) ? str(o, k, k) : undefined);

function u32(value, what) {
  if (typeof value !== 'bigint' || value < 0n || value > 0xffffffffn) {
    throw new VectorFormatError(`${what} must be an integer in 0..=2^32-1, got ${String(value)}`);
  }
  return Number(value);
}

function hexBytes(value, what) {
  if (typeof value !== 'string' || value.length % 2 || !/^[0-9a-fA-F]*$/.test(value)) {
    throw new VectorFormatError(`${what}: bad hex ${JSON.stringify(value)}`);
  }
  return Uint8Array.from(Buffer.from(value, 'hex'));
}

function wellFormed(o, k, what) {
  const s = str(o, k, what);
  if (!s.isWellFormed()) throw new VectorFormatError(`${what} is not well-formed Unicode`);
  return s;
}

/** A vector key `{"id", "secret": HEX}` as a GrantKey. */
function parseKey(value, what) {
  const k = obj(value, ['id', 'secret'], what);
  return { keyId: u32(k.id, `${what}.id`), secret: hexBytes(k.secret, `${what}.secret`) };
}

function pair(value, what) {
  if (!Array.isArray(value) || value.length !== 2) throw new VectorFormatError(`${what} must be [epoch, counter]`);
  return [u64(value[0], what), u64(value[1], what)];
}

/**
 * A vector `check` object as a Request for Instance.check (with its
 * `signature`, if any; the keys are stepKeys').
 */
export function parseRequest(check) {
  const c = obj(check, CHECK_KEYS, 'check');
  let signature;
  if (present(c, 'signature')) {
    const s = obj(c.signature, ['key_id', 'lease_id', 'tag'], 'check.signature');
    signature = { keyId: u32(s.key_id, 'signature.key_id'), leaseId: wellFormed(s, 'lease_id', 'signature.lease_id'), tag: hexBytes(s.tag, 'signature.tag') };
  }
  const [epoch, counter] = pair(c.token, 'check.token');
  const policy = c.policy ?? 'strict';
  if (policy !== 'strict' && policy !== 'allow-equal') throw new VectorFormatError(`unknown policy ${String(policy)}`);
  if (typeof c.scope !== 'string' || !c.scope.isWellFormed()) throw new VectorFormatError('check.scope must be a string');
  const opId = optStr(c, 'op_id');
  if (opId !== undefined && !opId.isWellFormed()) throw new VectorFormatError('op_id is not well-formed Unicode');
  return {
    scope: c.scope,
    token: { authority: u64(c.authority ?? 0n, 'check.authority'), epoch, counter },
    policy,
    opId,
    expectedVersion: optU64(c, 'expected_version'),
    signature,
  };
}

/** A `check` step's keys (the scope requires signed tokens), or undefined. */
export function stepKeys(check) {
  if (!present(check, 'keys')) return undefined;
  if (!Array.isArray(check.keys)) throw new VectorFormatError('check.keys must be a list');
  return check.keys.map((k, i) => parseKey(k, `check.keys[${i}]`));
}

/** A `sign` step's arguments: `[scope, token, leaseId, key]`. */
export function signArgs(step) {
  const a = obj(step, SIGN_KEYS, 'sign');
  const [epoch, counter] = pair(a.token, 'sign.token');
  return [wellFormed(a, 'scope', 'sign.scope'), { authority: u64(a.authority ?? 0n, 'sign.authority'), epoch, counter },
    wellFormed(a, 'lease_id', 'sign.lease_id'), parseKey(a.key, 'sign.key')];
}

/** A lease step's arguments, validated, with defaults. */
export function leaseArgs(action, step) {
  const keys = LEASE_KEYS[action];
  const a = obj(step, keys, action);
  const out = {};
  if (keys.includes('lock')) out.lock = str(a, 'lock', `${action}.lock`);
  if (keys.includes('lease_id')) out.leaseId = str(a, 'lease_id', `${action}.lease_id`);
  for (const k of ['now', 'ttl']) {
    if (keys.includes(k)) {
      if (!present(a, k)) throw new VectorFormatError(`${action} needs \`${k}\``);
      out[k] = u64(a[k], `${action}.${k}`);
    }
  }
  const authority = keys.includes('authority') ? u64(a.authority ?? 0n, `${action}.authority`) : 0n;
  if (action === 'acquire') {
    out.authority = authority;
    out.epochFloor = u64(a.epoch_floor ?? 0n, 'acquire.epoch_floor');
  }
  if (keys.includes('token')) {
    const [epoch, counter] = pair(a.token, `${action}.token`);
    out.token = { authority, epoch, counter };
  }
  return out;
}

/** Validate a vector file's text (shape only; steps are checked as they run). */
export function parse(text) {
  const f = obj(parseJson(text), FILE_KEYS, 'the file');
  if (typeof f.name !== 'string' || !Array.isArray(f.steps)) {
    throw new VectorFormatError('a vector file needs `name` (string) and `steps` (list)');
  }
  for (const step of f.steps) {
    const s = obj(step, STEP_KEYS, 'a step');
    if (present(s, 'expect')) obj(s.expect, EXPECT_KEYS, 'expect');
    if (present(s, 'check')) {
      parseRequest(s.check);
      stepKeys(s.check);
    }
    if (present(s, 'sign')) signArgs(s.sign);
    for (const action of Object.keys(LEASE_KEYS)) if (present(s, action)) leaseArgs(action, s[action]);
  }
  return f;
}

/** Read and validate a vector file; throws VectorFormatError or a file-system error. */
export function load(path) {
  return parse(readFileSync(path, 'utf8'));
}

function hexArg(step, kind) {
  const text = step.hex;
  if (typeof text !== 'string') throw new VectorFormatError(`\`${kind}\` needs \`hex\``);
  if (text.length % 2 || !/^[0-9a-fA-F]*$/.test(text)) throw new VectorFormatError(`bad hex: ${JSON.stringify(text)}`);
  return Uint8Array.from(Buffer.from(text, 'hex'));
}

/** Apply a `damage` step to a slot (null: empty). On an empty slot only `replace` creates bytes. */
export function damage(state, step) {
  const kind = step.damage;
  switch (kind) {
    case 'flip-bit': {
      if (!present(step, 'bit')) throw new VectorFormatError('`flip-bit` needs `bit`');
      const bit = u64(step.bit, 'bit');
      if (!state || state.length === 0) return state;
      const at = bit % BigInt(state.length * 8);
      const out = Uint8Array.from(state);
      out[Number(at / 8n)] ^= 1 << Number(at % 8n);
      return out;
    }
    case 'truncate': {
      if (!present(step, 'len')) throw new VectorFormatError('`truncate` needs `len`');
      const len = u64(step.len, 'len');
      return state ? state.slice(0, len > BigInt(state.length) ? state.length : Number(len)) : state;
    }
    case 'append': {
      const extra = hexArg(step, kind);
      if (!state) return state;
      const out = new Uint8Array(state.length + extra.length);
      out.set(state);
      out.set(extra, state.length);
      return out;
    }
    case 'replace':
      return hexArg(step, kind);
    case 'clear':
      return null;
    default:
      throw new VectorFormatError(`unknown damage kind ${JSON.stringify(kind)}`);
  }
}

const tp = (t) => `[${t.epoch}, ${t.counter}]`;
const hex = (b) => Buffer.from(b.buffer, b.byteOffset, b.byteLength).toString('hex');

/** A one-line description of a check outcome (a Decision or a FenceError). */
export function describe(o) {
  switch (o.outcome) {
    case 'applied': return `applied (version ${o.version}, highest ${tp(o.highest)})`;
    case 'duplicate': return `duplicate (version ${o.version})`;
    case 'stale-fence': return `stale-fence (presented ${tp(o.presented)}, highest ${tp(o.highest)})`;
    case 'version-conflict': return `version-conflict (expected ${o.expected}, actual ${o.actual})`;
    case 'acquired': return `acquired (token ${tp(o.token)}, expires_at ${o.expiresAt})`;
    case 'busy': return `busy (holder ${JSON.stringify(o.holder)}, expires_at ${o.expiresAt})`;
    case 'renewed': return `renewed (expires_at ${o.expiresAt})`;
    case 'restored': return `restored (epoch ${o.epoch})`;
    case 'signed': return `signed (tag ${hex(o.tag)})`;
    case undefined: return `error ${o.code}` + (o.reason ? ` (${o.reason})` : '');
    default: return o.outcome;
  }
}

class Mismatch extends Error {}

function field(name, want, got) {
  if (want !== undefined && want !== got) throw new Mismatch(`${name}: expected ${want}, got ${got}`);
}

function fieldPair(expect, key, got) {
  if (present(expect, key)) {
    const want = pair(expect[key], key);
    if (want[0] !== got.epoch || want[1] !== got.counter) throw new Mismatch(`${key}: expected [${want.join(', ')}], got ${tp(got)}`);
  }
}

/** Compare an outcome with the fields `expect` names; throws on a mismatch. */
export function compare(expect, o) {
  const got = isRefusal(o) ? 'error' : o.outcome;
  if (expect.outcome !== got) throw new Mismatch(`expected ${expect.outcome}, got ${describe(o)}`);
  if (isRefusal(o)) {
    field('error', optStr(expect, 'error'), o.code);
    field('reason', optStr(expect, 'reason'), o.reason ?? 'none');
    return;
  }
  switch (o.outcome) {
    case 'applied':
      field('version', optU64(expect, 'version'), o.version);
      fieldPair(expect, 'highest', o.highest);
      break;
    case 'duplicate':
      field('version', optU64(expect, 'version'), o.version);
      break;
    case 'stale-fence':
      fieldPair(expect, 'presented', o.presented);
      fieldPair(expect, 'highest', o.highest);
      break;
    case 'version-conflict':
      field('expected', optU64(expect, 'expected'), o.expected);
      field('actual', optU64(expect, 'actual'), o.actual);
      break;
    case 'acquired':
      fieldPair(expect, 'token', o.token);
      field('expires_at', optU64(expect, 'expires_at'), o.expiresAt);
      break;
    case 'busy':
      field('holder', optStr(expect, 'holder'), o.holder);
      field('expires_at', optU64(expect, 'expires_at'), o.expiresAt);
      break;
    case 'renewed':
      field('expires_at', optU64(expect, 'expires_at'), o.expiresAt);
      break;
    case 'restored':
      field('epoch', optU64(expect, 'epoch'), o.epoch);
      break;
    case 'signed':
      field('tag', optStr(expect, 'tag'), hex(o.tag));
      break;
    default:
  }
}

function runLease(action, args, state, guest) {
  try {
    if (action === 'acquire') return guest.acquire(state, args);
    if (action === 'renew') return guest.renew(state, args);
    if (action === 'release') return guest.release(state, args);
    return guest.restore(state);
  } catch (e) {
    if (e instanceof LeaseError) return e;
    throw e;
  }
}

// One check through the chosen transport: a Decision or the FenceError.
function runCheck(guest, transport, state, request, keys) {
  if (transport === 'packed') return guest.checkBatch([[state, request, keys]])[0];
  try {
    if (transport === 'one') return keys === undefined ? guest.check(state, request) : guest.checkSigned(state, request, keys);
    return keys === undefined ? guest._checkComponent(state, request) : guest._checkSignedComponent(state, request, keys);
  } catch (e) {
    if (e instanceof FenceError) return e;
    throw e;
  }
}

function runSign(guest, args) {
  try {
    return { outcome: 'signed', ...guest.sign(...args) };
  } catch (e) {
    if (e instanceof SignError) return e;
    throw e;
  }
}

/**
 * Run a parsed file; returns one line per failing step (empty: passed).
 * `transport`: `component` (default), `packed` or `one` (see the top of this file).
 */
export function run(file, guest, { transport = 'component' } = {}) {
  if (!TRANSPORTS.includes(transport)) throw new RangeError(`unknown transport ${String(transport)}`);
  const failures = [];
  const slots = { fence: null, lease: null };
  for (const [index, step] of file.steps.entries()) {
    const n = index + 1;
    try {
      const actions = ACTIONS.filter((a) => present(step, a));
      if (actions.length !== 1) throw new Mismatch('a step needs exactly one action');
      const [action] = actions;
      if (action === 'damage') {
        const slot = step.state ?? 'fence';
        if (!(slot in slots)) throw new Mismatch(`unknown state slot ${JSON.stringify(slot)}`);
        slots[slot] = damage(slots[slot], step);
        continue;
      }
      if (!present(step, 'expect')) throw new Mismatch('step without `expect`');
      if (action === 'check') {
        const outcome = runCheck(guest, transport, slots.fence, parseRequest(step.check), stepKeys(step.check));
        if (outcome.outcome === 'applied') slots.fence = outcome.state;
        compare(step.expect, outcome);
      } else if (action === 'sign') {
        compare(step.expect, runSign(guest, signArgs(step.sign)));
      } else {
        const outcome = runLease(action, leaseArgs(action, step[action]), slots.lease, guest);
        if (outcome.state) slots.lease = outcome.state;
        compare(step.expect, outcome);
      }
    } catch (e) {
      if (e instanceof Mismatch || e instanceof VectorFormatError) {
        failures.push(`step ${n}: ${e.message}`);
      } else if (e instanceof HostError) {
        failures.push(`step ${n}: ${e.message}`);
        break;
      } else {
        throw e;
      }
    }
  }
  return failures;
}
