// fencecheck for Node.js: the fencing-token rule, run from the one WebAssembly
// component (wit/fence.wit), transpiled to JavaScript by `jco transpile`
// (`npm run build` writes gen/). Types: index.d.ts.
//
// Decisions are values ({outcome: 'applied' | 'duplicate' | 'stale-fence' |
// 'version-conflict', ...}); a refusal (bad request, damaged state) throws a
// FenceError; a failure of the component itself throws a HostError. Only a
// HostError may be retried: a stale-fence is final for its grant.

import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { instantiate } from '../gen/fencecheck.js';
import { decode as decodePacked, encode as encodePacked } from './packed.js';
import { WIT_VERSION, coreInterfaces, supported, vet } from './version.js';

const GEN = join(dirname(fileURLToPath(import.meta.url)), '..', 'gen');
export const U64_MAX = (1n << 64n) - 1n;
export { WIT_VERSION };

/** Base of every error this package throws on purpose. */
export class FencecheckError extends Error {
  get name() { return this.constructor.name; }
}

/**
 * The check could not decide; nothing may change. Deterministic, so never
 * retryable. `code` is the WIT case (`invalid-request`, `corrupt-state`,
 * `unsupported-state-version`, `scope-mismatch`, `foreign-authority`,
 * `exhausted`); `reason` its sub-case (`missing-token`, ...) or undefined;
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

function u64(value, what) {
  if (typeof value === 'number' && Number.isSafeInteger(value)) value = BigInt(value);
  if (typeof value !== 'bigint' || value < 0n || value > U64_MAX) {
    throw new RangeError(`${what} must be an integer in 0..=2^64-1 (bigint or safe number), got ${String(value)}`);
  }
  return value;
}

function utf8(value, what) {
  if (typeof value !== 'string') throw new TypeError(`${what} must be a string`);
  if (!value.isWellFormed()) throw new RangeError(`${what} is not well-formed Unicode (lone surrogate)`);
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
  return { authority: u64(t.authority, `${what}.authority`), epoch: u64(t.epoch, `${what}.epoch`), counter: u64(t.counter, `${what}.counter`) };
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
  };
}

function requestBytes(state, r) {
  // UTF-16 length * 3 bounds the UTF-8 length: cheap and conservative.
  return (state?.length ?? 0) + r.scope.length * 3 + (r.opId?.length ?? 0) * 3;
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
export const _lift = Object.freeze({ decision, checkError, leaseOutcome });

/** Bounds on every instance (no fuel: V8 cannot meter a synchronous call). */
export const DEFAULT_LIMITS = Object.freeze({ callBytes: 16 << 20 });

/**
 * The compiled component: one per process. `new Runtime()` loads the
 * transpiled component in gen/ (built by `npm run build`).
 */
export class Runtime {
  // `instantiateCore(module, imports)` replaces `new WebAssembly.Instance`
  // (jco's hook): for wrapping or fault injection; most callers leave it out.
  constructor({ dir = GEN, limits = DEFAULT_LIMITS, instantiateCore } = {}) {
    this.limits = { ...DEFAULT_LIMITS, ...limits };
    this.instantiateCore = instantiateCore;
    this.modules = new Map();
    this.dir = dir;
    /** The loaded component's WIT package version (`0.1.0`), set at load. */
    this.componentVersion = undefined;
    this.coreVersion = undefined;
    // Compile eagerly, so a missing or broken build fails here, not mid-transaction.
    this.instance();
  }

  /** A core module of the transpiled component, compiled once. */
  coreModule(path) {
    let module = this.modules.get(path);
    if (!module) {
      try {
        module = new WebAssembly.Module(readFileSync(join(this.dir, path)));
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
      this.modules.set(path, module);
    }
    return module;
  }

  /** A fresh instance. Calls are synchronous; one instance per worker is enough. */
  instance() {
    return new Instance(this);
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

  #instantiate() {
    let root;
    try {
      root = instantiate((path) => this.runtime.coreModule(path), {}, this.runtime.instantiateCore);
    } catch (cause) {
      if (cause instanceof FencecheckError) throw cause;
      throw new ComponentLoadError(`instantiating the fencecheck component: ${cause.message}`, { cause });
    }
    // The glue's interface names are the transpiled component's exports.
    const v = vet(Object.keys(root));
    if (!v.version) throw new UnsupportedComponent(v.found);
    const rt = this.runtime;
    if (rt.coreVersion !== v.version) {
      throw new ComponentLoadError(
        `the core modules in ${rt.dir} implement fencecheck:fence@${rt.coreVersion ?? '(none)'}, `
        + `but the transpiled glue (gen/fencecheck.js) calls ${v.check}; rebuild gen/ with \`npm run build\``,
      );
    }
    const check = root[v.check];
    if (!check || ['check', 'checkBatch', 'checkPacked'].some((f) => typeof check[f] !== 'function')) {
      throw new ComponentLoadError(`the component does not export ${v.check}`);
    }
    rt.componentVersion = v.version;
    this.#exports = { check, lease: root[v.lease] };
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
   * Decide one request against a scope's stored state (`null`: the scope
   * never accepted a token). Returns the decision; throws FenceError when the
   * check cannot decide, HostError when the component cannot run.
   */
  check(state, request) {
    const s = bytesOrNull(state);
    const r = lowerRequest(request);
    this.#bound('check', requestBytes(s, r));
    try {
      return decision(this.#call('check', () => this.#exports.check.check(s, r)));
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError') throw checkError(e.payload);
      throw e;
    }
  }

  /**
   * Decide independent [state, request] pairs in one call. Results are in
   * input order; a FenceError is returned in place (not thrown), so one bad
   * item does not hide the others' decisions.
   *
   * The pairs cross as one byte array each way (`check-packed`). If either
   * side of that encoding is malformed (a bug, not an outcome), this throws
   * PackedFormatError and returns no decision at all.
   */
  checkBatch(items) {
    const lowered = this.#lowerBatch(items, 'check-packed');
    const out = this._checkPacked(encodePacked(lowered));
    if (typeof out === 'string') {
      throw new PackedFormatError('input', `batch-error \`${out}\` for ${lowered.length} items`);
    }
    try {
      return decodePacked(out, lowered.length);
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
    try {
      return this.#call('check-packed', () => this.#exports.check.checkPacked(batch));
    } catch (e) {
      if (e?.constructor?.name === 'ComponentError') return String(e.payload);
      throw e;
    }
  }

  #lowerBatch(items, call) {
    let size = 0;
    const lowered = items.map(([state, request]) => {
      const s = bytesOrNull(state);
      const r = lowerRequest(request);
      size += requestBytes(s, r);
      return { state: s, request: r };
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
