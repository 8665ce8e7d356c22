// fencecheck for Node.js: the fencing-token rule, run from the one WebAssembly
// component (wit/fence.wit), transpiled to JavaScript by `jco transpile`
// (`npm run build` writes gen/). Types: index.d.ts.
//
// Decisions are values ({outcome: 'applied' | 'duplicate' | 'stale-fence' |
// 'version-conflict', ...}); a refusal (bad request, damaged state, on a
// scope that requires signed tokens an unauthenticated token or an unusable
// key set) throws a FenceError; a failure of the component itself throws a
// HostError. Only a HostError may be retried: a stale-fence is final for its
// grant.

import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import * as generated from '../gen/fencecheck.js';
import { decode as decodePacked, encode as encodePacked } from './packed.js';
import { OneCheck, hasOneExports } from './core.js';
import { WIT_VERSION, coreInterfaces, supported, vet } from './version.js';

const GEN = join(dirname(fileURLToPath(import.meta.url)), '..', 'gen');
export const U64_MAX = (1n << 64n) - 1n;
const U32_MAX = 0xffffffff;
export { WIT_VERSION };
export {
  parseToken, formatToken, parseSignedToken, formatSignedToken, parseKeys, formatKeys, signingKey, keyProblem,
  MAX_KEYS, MIN_SECRET_BYTES, MAX_SECRET_BYTES,
} from './text.js';

/** Base of every error this package throws on purpose. */
export class FencecheckError extends Error {
  get name() { return this.constructor.name; }
}

/**
 * The check could not decide; nothing may change. Deterministic, so never
 * retryable. `code` is the WIT case (`invalid-request`, `corrupt-state`,
 * `unsupported-state-version`, `scope-mismatch`, `foreign-authority`,
 * `exhausted`; from checkSigned also `unauthenticated`, reason an
 * `auth-failure`: the token is not proven to come from its authority, and
 * `invalid-keys`, reason a `key-problem`: the scope's key set is unusable);
 * `reason` its sub-case (`missing-token`, `bad-signature`, ...) or undefined;
 * `detail` the case's payload, if any.
 */
export class FenceError extends FencecheckError {
  constructor(code, reason, detail) {
    super(code + (reason ? ` (${reason})` : '') + (detail !== undefined ? `: ${describeDetail(detail)}` : ''));
    this.code = code;
    this.reason = reason;
    this.detail = detail;
    this.retryable = false;
  }
}

/**
 * A lease call could not decide; nothing may change; never retryable. Same
 * fields as FenceError (`code`: `invalid-request`, `corrupt-state`,
 * `unsupported-state-version`, `lock-mismatch`, `foreign-authority`,
 * `exhausted`), but a separate class, as in the Python host.
 */
export class LeaseError extends FencecheckError {
  constructor(code, reason, detail) {
    super(code + (reason ? ` (${reason})` : '') + (detail !== undefined ? `: ${describeDetail(detail)}` : ''));
    this.code = code;
    this.reason = reason;
    this.detail = detail;
    this.retryable = false;
  }
}

/**
 * `sign` could not sign the grant (`code`: `empty-scope`, `scope-too-long`,
 * `missing-token`, `empty-lease-id`, `lease-id-too-long`, `invalid-key` with
 * `reason` its `key-problem`). Never retryable.
 */
export class SignError extends FencecheckError {
  constructor(code, reason) {
    super(code + (reason ? ` (${reason})` : ''));
    Object.assign(this, { code, reason, retryable: false });
  }
}

/** Text that is not a token (parseToken, parseSignedToken); `text`: the first 64 characters. */
export class TokenTextError extends FencecheckError {
  constructor(text) {
    super(`invalid token ${JSON.stringify(text)}: expected EPOCH.COUNTER or AUTHORITY:EPOCH.COUNTER (decimal u64), signed: TOKEN~KEY-ID~LEASE~TAG (base64url)`);
    this.text = text;
  }
}

/**
 * A key set that is not usable (parseKeys, setKeys): `reason` is the bad
 * entry's position (`entry 2 is not KEY-ID:SECRET-HEX`) or the set's
 * `key-problem` (`short-secret`, ...). The message never contains a secret.
 */
export class KeySetError extends FencecheckError {
  constructor(reason) {
    super(`invalid key set: ${reason}`);
    this.reason = reason;
  }
}

/** Infrastructure failure: no decision was obtained. May be retried. */
export class HostError extends FencecheckError {
  constructor(message, options) {
    super(message, options);
    this.retryable = true;
  }
}

/** The transpiled component is missing or could not be compiled. */
export class ComponentLoadError extends HostError {
  constructor(message, options) {
    super(message, options);
    this.retryable = false;
  }
}

/**
 * The component's WIT package version is not one this package runs (for 0.x:
 * the same major and minor as WIT_VERSION), or it does not export
 * `fencecheck:fence/check` at all. Thrown at load. `found`: what it exports
 * (`fencecheck:fence/check@0.2.0`); `supported`: `fencecheck:fence@0.1.x`.
 */
export class UnsupportedComponent extends ComponentLoadError {
  constructor(found, supportedVersions = supported()) {
    super(`component exports ${found}; this host supports ${supportedVersions}`);
    Object.assign(this, { found, supported: supportedVersions });
  }
}

/**
 * The loaded component is of a supported version but older than a feature
 * this call needs (signed tokens need 0.1.1). Nothing was sent to the guest;
 * every other call works. Not retryable: load a newer component.
 */
export class UnsupportedFeature extends HostError {
  constructor(feature, version, since) {
    super(`the loaded component (fencecheck:fence@${version}) has no ${feature}: that needs ${since} or later`);
    Object.assign(this, { feature, version, since, retryable: false });
  }
}

/** The guest trapped; the call had no effect and the instance was replaced. */
export class GuestTrapped extends HostError {
  constructor(call, cause) {
    super(`the fencecheck guest trapped in \`${call}\`: ${cause?.message ?? cause}`, { cause });
    this.call = call;
  }
}

/**
 * A `check-packed` batch did not follow its byte format: the guest refused
 * this package's encoding (`side: 'input'`, its `batch-error malformed`) or
 * returned bytes this package cannot read (`'output'`). Either is a bug in a
 * host or the guest, never an outcome: no decision of the batch is returned,
 * and retrying the same batch fails the same way.
 */
export class PackedFormatError extends HostError {
  constructor(side, message) {
    super(`check-packed ${side === 'input' ? 'refused the batch as malformed' : 'returned a malformed batch'}: ${message}`);
    Object.assign(this, { side, retryable: false });
  }
}

/** The call's inputs exceed `limits.callBytes`; it was not sent. */
export class TooLarge extends HostError {
  constructor(call, size, limit) {
    super(`call to \`${call}\` carries ${size} bytes, above the ${limit}-byte bound`);
    Object.assign(this, { call, size, limit, retryable: false });
  }
}

function describeDetail(d) {
  return typeof d === 'object' ? JSON.stringify(d, (_, v) => (typeof v === 'bigint' ? `${v}` : v)) : String(d);
}

// -- validation: jco wraps out-of-range integers and replaces lone
// surrogates silently, so every input is checked before it is lowered.

// `field`: appended to `what` only in the message (no string is built per call).
function u64(value, what, field) {
  if (typeof value === 'number' && Number.isSafeInteger(value)) value = BigInt(value);
  if (typeof value !== 'bigint' || value < 0n || value > U64_MAX) {
    const name = field === undefined ? what : `${what}.${field}`;
    throw new RangeError(`${name} must be an integer in 0..=2^64-1 (bigint or safe number), got ${String(value)}`);
  }
  return value;
}

function utf8(value, what) {
  if (typeof value !== 'string') throw new TypeError(`${what} must be a string`);
  if (!value.isWellFormed()) throw new RangeError(`${what} is not well-formed Unicode (lone surrogate)`);
  return value;
}

function u32(value, what) {
  if (!Number.isInteger(value) || value < 0 || value > U32_MAX) {
    throw new RangeError(`${what} must be an integer in 0..=2^32-1 (number), got ${String(value)}`);
  }
  return value;
}

function bytes(value, what) {
  if (!(value instanceof Uint8Array)) throw new TypeError(`${what} must be a Uint8Array`);
  return value;
}

function bytesOrNull(state) {
  if (state === null || state === undefined) return undefined;
  if (!(state instanceof Uint8Array)) throw new TypeError('state must be a Uint8Array, null or undefined');
  return state;
}

/** A token; numbers must be safe integers, bigints any u64. */
export function token(authority, epoch, counter) {
  return { authority: u64(authority, 'authority'), epoch: u64(epoch, 'epoch'), counter: u64(counter, 'counter') };
}

function lowerToken(t, what = 'token') {
  if (t === null || typeof t !== 'object') throw new TypeError(`${what} must be a token`);
  return { authority: u64(t.authority, what, 'authority'), epoch: u64(t.epoch, what, 'epoch'), counter: u64(t.counter, what, 'counter') };
}

function lowerRequest(r) {
  if (r === null || typeof r !== 'object') throw new TypeError('request must be an object');
  const policy = r.policy ?? 'strict';
  if (policy !== 'strict' && policy !== 'allow-equal') throw new RangeError(`unknown policy ${String(policy)}`);
  return {
    scope: utf8(r.scope, 'scope'),
    token: lowerToken(r.token),
    policy,
    opId: r.opId === undefined || r.opId === null ? undefined : utf8(r.opId, 'opId'),
    expectedVersion: r.expectedVersion === undefined || r.expectedVersion === null ? undefined : u64(r.expectedVersion, 'expectedVersion'),
    // Checked here even where it is ignored (plain `check`): a malformed value is a bug.
    signature: lowerSignature(r.signature),
  };
}

function lowerSignature(s) {
  if (s === undefined || s === null) return undefined;
  if (typeof s !== 'object') throw new TypeError('signature must be {keyId, leaseId, tag}');
  return { keyId: u32(s.keyId, 'signature.keyId'), leaseId: utf8(s.leaseId, 'signature.leaseId'), tag: bytes(s.tag, 'signature.tag') };
}

// Only the shape: whether a key set is usable is the component's decision (`invalid-keys`).
function lowerKey(k, what) {
  if (k === null || typeof k !== 'object') throw new TypeError(`${what} must be {keyId, secret}`);
  return { keyId: u32(k.keyId, `${what}.keyId`), secret: bytes(k.secret, `${what}.secret`) };
}

function lowerKeys(keys) {
  if (!Array.isArray(keys)) throw new TypeError('keys must be an array of {keyId, secret}');
  return keys.map((k, i) => lowerKey(k, `keys[${i}]`));
}

function requestBytes(state, r, keys) {
  // UTF-16 length * 3 bounds the UTF-8 length: cheap and conservative.
  let size = (state?.length ?? 0) + r.scope.length * 3 + (r.opId?.length ?? 0) * 3;
  if (keys) {
    for (const k of keys) size += 5 + k.secret.length;
    if (r.signature) size += r.signature.leaseId.length * 3 + r.signature.tag.length;
  }
  return size;
}

// -- lifting: jco's {tag, val} shapes into this package's values

function decision(d) {
  switch (d.tag) {
    case 'applied': return { outcome: 'applied', version: d.val.version, highest: d.val.highest, state: d.val.state };
    case 'duplicate': return { outcome: 'duplicate', version: d.val };
    case 'stale-fence': return { outcome: 'stale-fence', presented: d.val.presented, highest: d.val.highest };
    case 'version-conflict': return { outcome: 'version-conflict', expected: d.val.expected, actual: d.val.actual };
    default: throw new HostError(`unknown decision case ${d.tag}`);
  }
}

const CHECK_ERRORS = new Set(['invalid-request', 'corrupt-state', 'unsupported-state-version', 'scope-mismatch', 'foreign-authority', 'exhausted']);
const LEASE_ERRORS = new Set(['invalid-request', 'corrupt-state', 'unsupported-state-version', 'lock-mismatch', 'foreign-authority', 'exhausted']);
// Case order of the `auth` enums (packed.js encodes their indexes).
export const AUTH_FAILURES = Object.freeze(['unsigned', 'unknown-key', 'malformed-signature', 'bad-signature']);
export const KEY_PROBLEMS = Object.freeze(['no-keys', 'too-many-keys', 'short-secret', 'long-secret', 'duplicate-key-id']);
const SIGN_ERRORS = new Set(['empty-scope', 'scope-too-long', 'missing-token', 'empty-lease-id', 'lease-id-too-long', 'invalid-key']);

// A case outside the contract is a bug in the guest or the bindings: a
// HostError, never turned into a refusal with a made-up code.
function checkError(e, Kind = FenceError) {
  const [known, what] = Kind === LeaseError ? [LEASE_ERRORS, 'lease-error'] : [CHECK_ERRORS, 'check-error'];
  if (!known.has(e?.tag)) throw new HostError(`unknown ${what} case ${String(e?.tag)}`);
  switch (e.tag) {
    case 'invalid-request':
    case 'corrupt-state':
      return new Kind(e.tag, e.val);
    case 'exhausted':
      return new Kind(e.tag);
    default:
      return new Kind(e.tag, undefined, e.val);
  }
}

// auth.check-signed's error: a check error as `check` reports it, or the
// two refusals of a scope that requires signed tokens.
function signedCheckError(e) {
  switch (e?.tag) {
    case 'check': return checkError(e.val);
    case 'unauthenticated':
      if (AUTH_FAILURES.includes(e.val)) return new FenceError(e.tag, e.val);
      break;
    case 'invalid-keys':
      if (KEY_PROBLEMS.includes(e.val)) return new FenceError(e.tag, e.val);
      break;
    default:
  }
  throw new HostError(`unknown signed-check-error ${String(e?.tag)} ${String(e?.val ?? '')}`.trim());
}

function signError(e) {
  if (!SIGN_ERRORS.has(e?.tag) || (e.tag === 'invalid-key') !== KEY_PROBLEMS.includes(e.val)) {
    throw new HostError(`unknown sign-error ${String(e?.tag)}`);
  }
  return new SignError(e.tag, e.val);
}

// A lease export's ok variant as this package's outcome; an unknown case is a
// HostError, never a guessed `busy` / `lost` / `not-owner`.
function leaseOutcome(call, o) {
  switch (`${call}:${o?.tag}`) {
    case 'acquire:acquired': return { outcome: 'acquired', token: o.val.token, expiresAt: o.val.expiresAt, state: o.val.state };
    case 'acquire:busy': return { outcome: 'busy', holder: o.val.holder, expiresAt: o.val.expiresAt };
    case 'renew:renewed': return { outcome: 'renewed', expiresAt: o.val.expiresAt, state: o.val.state };
    case 'renew:lost': return { outcome: 'lost' };
    case 'release:released': return { outcome: 'released', state: o.val };
    case 'release:not-owner': return { outcome: 'not-owner' };
    default: throw new HostError(`unknown ${call} outcome ${String(o?.tag)}`);
  }
}

/** Internal: the result lifting, exported for tests only. */
export const _lift = Object.freeze({ decision, checkError, leaseOutcome, signedCheckError, signError });

/**
 * Bounds on every instance. No fuel, for any component: V8 cannot meter a
 * synchronous call. The packaged component needs none (its work is linear in
 * its input, which callBytes bounds; docs/design.md §1, held by the fuzz
 * target `fuel_bound`), as in the Rust host; a component loaded from
 * elsewhere (`Runtime.load`) is bounded here by callBytes only, where the
 * Rust and Python hosts also meter it.
 */
export const DEFAULT_LIMITS = Object.freeze({ callBytes: 16 << 20 });

/**
 * The compiled component: one per process. `new Runtime()` loads the
 * transpiled component in gen/ (built by `npm run build`);
 * `await Runtime.load(dir)` another one, transpiled the same way into `dir`
 * (e.g. the previous release during a rolling upgrade).
 */
export class Runtime {
  // `instantiateCore(module, imports)` replaces `new WebAssembly.Instance`
  // (jco's hook): for wrapping or fault injection; most callers leave it out.
  // `glue`: the transpiled JavaScript module (its `instantiate`) that goes
  // with the core modules in `dir`; default the package's gen/fencecheck.js.
  constructor({ dir = GEN, limits = DEFAULT_LIMITS, instantiateCore, glue = generated, glueName = 'gen/fencecheck.js' } = {}) {
    if (typeof glue?.instantiate !== 'function') throw new TypeError('glue must be a transpiled module with an `instantiate` function');
    this.limits = { ...DEFAULT_LIMITS, ...limits };
    this.instantiateCore = instantiateCore;
    this.glue = glue;
    this.glueName = glueName;
    this.modules = new Map();
    // Core modules whose bytes have the single-check exports (core.js).
    this.oneModules = new WeakSet();
    this.dir = dir;
    /** The loaded component's WIT package version (`0.1.1`), set at load. */
    this.componentVersion = undefined;
    /** Whether it has signed tokens (the `auth` interface, new in 0.1.1), set at load. */
    this.supportsSigning = undefined;
    this.coreVersion = undefined;
    // Compile eagerly, so a missing or broken build fails here, not mid-transaction.
    this.instance();
  }

  /** A core module of the transpiled component, compiled once. */
  coreModule(path) {
    let module = this.modules.get(path);
    if (!module) {
      let bytes;
      try {
        bytes = readFileSync(join(this.dir, path));
        module = new WebAssembly.Module(bytes);
      } catch (cause) {
        throw new ComponentLoadError(`loading ${join(this.dir, path)} (run \`npm run build\`): ${cause.message}`, { cause });
      }
      // The interfaces this module implements carry the component's version:
      // refuse another contract before anything is instantiated.
      const ifaces = coreInterfaces(WebAssembly.Module.exports(module).map((e) => e.name));
      if (ifaces.length > 0) {
        const v = vet(ifaces);
        if (!v.version) throw new UnsupportedComponent(v.found);
        if (this.coreVersion !== undefined && this.coreVersion !== v.version) {
          throw new UnsupportedComponent(`core modules of two versions (${this.coreVersion}, ${v.version})`);
        }
        this.coreVersion = v.version;
      }
      if (hasOneExports(bytes)) this.oneModules.add(module);
      this.modules.set(path, module);
    }
    return module;
  }

  /** A fresh instance. Calls are synchronous; one instance per worker is enough. */
  instance() {
    return new Instance(this);
  }

  /**
   * A runtime for the component transpiled into `dir` (`jco transpile
   * COMPONENT.wasm --out-dir DIR --name fencecheck --instantiation sync
   * --no-nodejs-compat`, as `npm run build` does): imports its glue,
   * `DIR/fencecheck.js`, then loads as the constructor does.
   */
  static async load(dir, options = {}) {
    const path = join(dir, 'fencecheck.js');
    let glue;
    try {
      glue = await import(pathToFileURL(path).href);
    } catch (cause) {
      throw new ComponentLoadError(`loading ${path}: ${cause.message}`, { cause });
    }
    return new Runtime({ ...options, dir, glue, glueName: path });
  }
}

let defaultRuntime;

/**
 * The WIT package version of the component this package runs by default (the
 * transpiled one in gen/), e.g. `'0.1.0'`: read from its export names at load.
 * Loads it once per process; throws ComponentLoadError (UnsupportedComponent)
 * as `new Runtime()` would. `runtime.componentVersion` gives the same for any
 * runtime.
 */
export function componentVersion() {
  defaultRuntime ??= new Runtime();
  return defaultRuntime.componentVersion;
}

/** One instance of the component; replaced after a trap. */
export class Instance {
  constructor(runtime) {
    this.runtime = runtime;
    this.#instantiate();
  }

  #exports;

  // The single-check export of the core instance jco made (core.js), or
  // null: every check then crosses through jco's glue.
  #one = null;

  #instantiate() {
    let root;
    const rt = this.runtime;
    // Every core instance jco makes, through the caller's hook if any: the
    // single-check path is taken only when there is exactly one.
    const cores = [];
    const instantiateCore = (module, imports) => {
      const instance = rt.instantiateCore ? rt.instantiateCore(module, imports) : new WebAssembly.Instance(module, imports);
      cores.push({ module, exports: instance?.exports });
      return instance;
    };
    try {
      root = rt.glue.instantiate((path) => rt.coreModule(path), {}, instantiateCore);
      this.#one = cores.length === 1 && rt.oneModules.has(cores[0].module) ? OneCheck.of(cores[0].exports) : null;
    } catch (cause) {
      if (cause instanceof FencecheckError) throw cause;
      throw new ComponentLoadError(`instantiating the fencecheck component: ${cause.message}`, { cause });
    }
    // The glue's interface names are the transpiled component's exports.
    const v = vet(Object.keys(root));
    if (!v.version) throw new UnsupportedComponent(v.found);
    if (rt.coreVersion !== v.version) {
      throw new ComponentLoadError(
        `the core modules in ${rt.dir} implement fencecheck:fence@${rt.coreVersion ?? '(none)'}, `
        + `but the transpiled glue (${rt.glueName}) calls ${v.check}; rebuild gen/ with \`npm run build\``,
      );
    }
    const check = root[v.check];
    if (!check || ['check', 'checkBatch', 'checkPacked'].some((f) => typeof check[f] !== 'function')) {
      throw new ComponentLoadError(`the component does not export ${v.check}`);
    }
    // `auth` is new in 0.1.1: without it only the signed calls are refused.
    const auth = root[v.auth];
    if (auth !== undefined && ['checkSigned', 'sign', 'grantMessage'].some((f) => typeof auth[f] !== 'function')) {
      throw new ComponentLoadError(`the component's ${v.auth} lacks check-signed, sign or grant-message`);
    }
    rt.componentVersion = v.version;
    rt.supportsSigning = auth !== undefined;
    this.#exports = { check, lease: root[v.lease], auth };
  }

  // Signed tokens need the `auth` interface (0.1.1 or later).
  #auth() {
    if (!this.#exports.auth) throw new UnsupportedFeature('signed tokens', this.runtime.componentVersion, '0.1.1');
    return this.#exports.auth;
  }

  #bound(call, size) {
    const limit = this.runtime.limits.callBytes;
    if (size > limit) throw new TooLarge(call, size, limit);
  }

  // Run one export; a JS exception that is not the component's own `err`
  // result is a trap (or a bug in the bindings): replace the instance.
  #call(call, fn) {
    try {
      return fn();
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError' && 'payload' in e) throw e;
      this.#instantiate();
      throw new GuestTrapped(call, e);
    }
  }

  /**
   * How `check` and `checkSigned` cross: `'one'` (the core module's
   * single-check export, one call) or `'component'` (jco's glue). For tests.
   */
  get _transport() {
    return this.#one === null ? 'component' : 'one';
  }

  /**
   * Decide one request against a scope's stored state (`null`: the scope
   * never accepted a token). Returns the decision; throws FenceError when the
   * check cannot decide, HostError when the component cannot run. The scope
   * is taken not to require signed tokens: `request.signature`, if any, is
   * ignored (checkSigned verifies it).
   *
   * Crosses once, as a one-item check-packed batch through the core
   * module's single-check export, when the component has it (core.js); else
   * through jco's typed `check` (`_checkComponent`). Both decide the same.
   */
  check(state, request) {
    const s = bytesOrNull(state);
    const r = lowerRequest(request);
    this.#bound('check', requestBytes(s, r));
    if (this.#one === null) return this.#checkComponent(s, r);
    const outcome = this.#single('check', { state: s, request: r, keys: undefined });
    if (outcome instanceof FenceError) throw outcome;
    return outcome;
  }

  /** check through jco's typed `check` (the component API), for tests and benchmarks. */
  _checkComponent(state, request) {
    const s = bytesOrNull(state);
    const r = lowerRequest(request);
    this.#bound('check', requestBytes(s, r));
    return this.#checkComponent(s, r);
  }

  #checkComponent(s, r) {
    try {
      return decision(this.#call('check', () => this.#exports.check.check(s, r)));
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError') throw checkError(e.payload);
      throw e;
    }
  }

  // One validated item as a one-item batch through the single-check export
  // (through jco's check-packed if it does not fit the guest's buffers): its
  // decision or FenceError (returned). A trap is GuestTrapped and a reply off
  // the ABI or the format PackedFormatError; either replaces the instance.
  #single(call, item) {
    let out;
    let length;
    try {
      length = this.#one.write(item);
      if (length !== undefined) out = this.#one.cross(length);
    } catch (e) {
      this.#instantiate();
      // Only the guest's call can trap; anything else thrown is the host's.
      if (e instanceof PackedFormatError || length === undefined) throw e;
      throw new GuestTrapped(call, e);
    }
    if (out === undefined) out = this.#checkPacked(call, encodePacked([item]));
    if (typeof out === 'string') {
      throw new PackedFormatError('input', `batch-error \`${out}\` for a ${call}`);
    }
    try {
      return decodePacked(out, [item.keys !== undefined])[0];
    } catch (e) {
      if (e instanceof PackedFormatError) this.#instantiate(); // a guest that wrote garbage is not trusted again
      throw e;
    }
  }

  /**
   * check for a scope that requires signed tokens, verified with `keys` (the
   * scope's key set, `[{keyId, secret}]`): the component validates the
   * request, then the key set (FenceError `invalid-keys`), then
   * `request.signature` (FenceError `unauthenticated`: `unsigned`,
   * `unknown-key`, `malformed-signature`, `bad-signature`), and only then
   * reads the state. Crosses as check does (a one-item batch with keys and
   * signature through the single-check export), else as the typed
   * `auth.check-signed` (`_checkSignedComponent`); checkBatch with keys
   * crosses as check-packed. Throws UnsupportedFeature if the loaded
   * component predates signed tokens (0.1.0).
   */
  checkSigned(state, request, keys) {
    this.#auth();
    const s = bytesOrNull(state);
    const r = lowerRequest(request);
    const k = lowerKeys(keys);
    this.#bound('check-signed', requestBytes(s, r, k));
    if (this.#one === null) return this.#checkSignedComponent(s, r, k);
    const outcome = this.#single('check-signed', { state: s, request: r, keys: k });
    if (outcome instanceof FenceError) throw outcome;
    return outcome;
  }

  /** checkSigned through jco's typed `auth.check-signed`, for tests and benchmarks. */
  _checkSignedComponent(state, request, keys) {
    this.#auth();
    const s = bytesOrNull(state);
    const r = lowerRequest(request);
    const k = lowerKeys(keys);
    this.#bound('check-signed', requestBytes(s, r, k));
    return this.#checkSignedComponent(s, r, k);
  }

  #checkSignedComponent(s, r, k) {
    const auth = this.#auth();
    try {
      return decision(this.#call('check-signed', () => auth.checkSigned(s, r, r.signature, k)));
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError') throw signedCheckError(e.payload);
      throw e;
    }
  }

  /**
   * Sign the grant of `token` to `leaseId` for `scope` (the lock's name: a
   * signed token is valid only on that scope) with `key` (`{keyId, secret}`):
   * the signature `{keyId, leaseId, tag}` the authority hands out with the
   * token. Throws SignError when it cannot sign, UnsupportedFeature before 0.1.1.
   */
  sign(scope, token, leaseId, key) {
    const auth = this.#auth();
    const args = [utf8(scope, 'scope'), lowerToken(token), utf8(leaseId, 'leaseId'), lowerKey(key, 'key')];
    this.#bound('sign', (scope.length + leaseId.length) * 3 + args[3].secret.length);
    try {
      const sig = this.#call('sign', () => auth.sign(...args));
      return { keyId: sig.keyId, leaseId: sig.leaseId, tag: sig.tag };
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError') throw signError(e.payload);
      throw e;
    }
  }

  /**
   * The bytes a signature's tag is the HMAC-SHA256 of (wit/fence.wit,
   * `grant-message`), for signers outside the component.
   */
  grantMessage(scope, token, keyId, leaseId) {
    const auth = this.#auth();
    const args = [utf8(scope, 'scope'), lowerToken(token), u32(keyId, 'keyId'), utf8(leaseId, 'leaseId')];
    this.#bound('grant-message', (scope.length + leaseId.length) * 3);
    return this.#call('grant-message', () => auth.grantMessage(...args));
  }

  /**
   * Decide independent [state, request] pairs in one call. Results are in
   * input order; a FenceError is returned in place (not thrown), so one bad
   * item does not hide the others' decisions. An item `[state, request,
   * keys]` is on a scope that requires signed tokens: decided as checkSigned
   * would (keys null or undefined: as check, its signature ignored).
   *
   * The pairs cross as one byte array each way (`check-packed`). If either
   * side of that encoding is malformed (a bug, not an outcome), this throws
   * PackedFormatError and returns no decision at all.
   */
  checkBatch(items) {
    const lowered = this.#lowerBatch(items, 'check-packed');
    if (lowered.some((i) => i.keys)) this.#auth();
    const out = this._checkPacked(encodePacked(lowered));
    if (typeof out === 'string') {
      throw new PackedFormatError('input', `batch-error \`${out}\` for ${lowered.length} items`);
    }
    try {
      return decodePacked(out, lowered.map((i) => i.keys !== undefined));
    } catch (e) {
      if (e instanceof PackedFormatError) this.#instantiate(); // a guest that wrote garbage is not trusted again
      throw e;
    }
  }

  /**
   * Call `check-packed` with raw bytes: the output bytes, or the
   * `batch-error` case name (a string). For tests; checkBatch is the API.
   */
  _checkPacked(batch) {
    return this.#checkPacked('check-packed', batch);
  }

  // check-packed through jco's glue; a trap is GuestTrapped named `call`.
  #checkPacked(call, batch) {
    try {
      return this.#call(call, () => this.#exports.check.checkPacked(batch));
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError') return String(e.payload);
      throw e;
    }
  }

  #lowerBatch(items, call) {
    if (!Array.isArray(items)) throw new TypeError('items must be an array of [state, request, keys?]');
    let size = 0;
    const lowered = items.map((item) => {
      if (!Array.isArray(item)) throw new TypeError('a batch item must be [state, request] or [state, request, keys]');
      const [state, request, keys] = item;
      const s = bytesOrNull(state);
      const r = lowerRequest(request);
      const k = keys === undefined || keys === null ? undefined : lowerKeys(keys);
      size += requestBytes(s, r, k);
      return { state: s, request: r, keys: k };
    });
    this.#bound(call, size);
    return lowered;
  }

  /**
   * checkBatch through the typed `check-batch` export (jco lowers every
   * field): the previous path, kept for tests and benchmarks.
   */
  _checkBatchTyped(items) {
    const lowered = this.#lowerBatch(items, 'check-batch');
    if (lowered.some((i) => i.keys)) throw new TypeError('the typed check-batch has no keys: use checkSigned per item');
    const results = this.#call('check-batch', () => this.#exports.check.checkBatch(lowered));
    if (results.length !== items.length) {
      throw new GuestTrapped('check-batch', new Error(`returned ${results.length} results for ${items.length} items`));
    }
    return results.map((r) => (r.tag === 'ok' ? decision(r.val) : checkError(r.val)));
  }

  /** Decode a stored fence state into a readable record. */
  inspect(state) {
    const s = bytesOrNull(state) ?? new Uint8Array();
    this.#bound('inspect', s.length);
    try {
      return this.#call('inspect', () => this.#exports.check.inspect(s));
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError') throw checkError(e.payload);
      throw e;
    }
  }

  // -- the lease authority (grant side) ------------------------------------

  #lease(call, fn) {
    if (!this.#exports.lease) throw new ComponentLoadError(`the component does not export fencecheck:fence/lease@${this.runtime.componentVersion}`);
    try {
      return this.#call(call, fn);
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError') throw checkError(e.payload, LeaseError);
      throw e;
    }
  }

  /**
   * Grant `lock` to `leaseId` at coordinator time `now` (ms) for `ttl` ms:
   * `{outcome: 'acquired', token, expiresAt, state}` or `{outcome: 'busy', holder, expiresAt}`.
   */
  acquire(state, { lock, leaseId, now, ttl, authority = 0n, epochFloor = 0n }) {
    const s = bytesOrNull(state);
    const req = {
      lock: utf8(lock, 'lock'), leaseId: utf8(leaseId, 'leaseId'), authority: u64(authority, 'authority'),
      epochFloor: u64(epochFloor, 'epochFloor'), now: u64(now, 'now'), ttl: u64(ttl, 'ttl'),
    };
    this.#bound('acquire', (s?.length ?? 0) + (lock.length + leaseId.length) * 3);
    return leaseOutcome('acquire', this.#lease('acquire', () => this.#exports.lease.acquire(s, req)));
  }

  /** Extend the exact current lease: `{outcome: 'renewed', expiresAt, state}` or `{outcome: 'lost'}`. */
  renew(state, { leaseId, token: t, now, ttl }) {
    const s = bytesOrNull(state);
    const req = { leaseId: utf8(leaseId, 'leaseId'), token: lowerToken(t), now: u64(now, 'now'), ttl: u64(ttl, 'ttl') };
    this.#bound('renew', (s?.length ?? 0) + leaseId.length * 3);
    return leaseOutcome('renew', this.#lease('renew', () => this.#exports.lease.renew(s, req)));
  }

  /** Release the exact current lease: `{outcome: 'released', state}` or `{outcome: 'not-owner'}`. */
  release(state, { leaseId, token: t }) {
    const s = bytesOrNull(state);
    const req = { leaseId: utf8(leaseId, 'leaseId'), token: lowerToken(t) };
    this.#bound('release', (s?.length ?? 0) + leaseId.length * 3);
    return leaseOutcome('release', this.#lease('release', () => this.#exports.lease.release(s, req)));
  }

  /** Start the next epoch: `{outcome: 'restored', epoch, state}`. */
  restore(state) {
    const s = bytesOrNull(state);
    this.#bound('restore', s?.length ?? 0);
    const o = this.#lease('restore', () => this.#exports.lease.restore(s));
    return { outcome: 'restored', epoch: o.epoch, state: o.state };
  }
}
