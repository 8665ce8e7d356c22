// Public API of the fencecheck Node.js host (src/index.js).

/** 2^64 - 1. */
export const U64_MAX: bigint;

/** A fencing token. `(epoch, counter)` compare lexicographically; 0/0 is "no token". */
export interface Token {
  authority: bigint;
  epoch: bigint;
  counter: bigint;
}

/** Build a token from safe integers or bigints (range-checked). */
export function token(authority: number | bigint, epoch: number | bigint, counter: number | bigint): Token;

export type Policy = 'strict' | 'allow-equal';

/** One protected mutation, as presented to the resource. */
export interface Request {
  scope: string;
  token: Token;
  /** Default `strict`. */
  policy?: Policy;
  opId?: string;
  expectedVersion?: bigint | number;
}

/** Apply the mutation and store `state` in the same transaction. */
export interface Applied {
  outcome: 'applied';
  version: bigint;
  highest: Token;
  state: Uint8Array;
}
/** This op-id was already applied under the highest token. Change nothing. */
export interface Duplicate {
  outcome: 'duplicate';
  version: bigint;
}
/** A newer grant has written: definitive, never retry under this grant. */
export interface StaleFence {
  outcome: 'stale-fence';
  presented: Token;
  highest: Token;
}
/** `expectedVersion` does not match. Change nothing. */
export interface VersionConflict {
  outcome: 'version-conflict';
  expected: bigint;
  actual: bigint;
}
export type Decision = Applied | Duplicate | StaleFence | VersionConflict;

/** A decoded fence state. */
export interface StateInfo {
  formatVersion: number;
  scope: string;
  authority: bigint;
  highest: Token;
  version: bigint;
  window: Array<{ opId: string; version: bigint }>;
}

export type FenceErrorCode =
  | 'invalid-request'
  | 'corrupt-state'
  | 'unsupported-state-version'
  | 'scope-mismatch'
  | 'foreign-authority'
  | 'exhausted';

/** Base of every error this package throws on purpose. */
export class FencecheckError extends Error {}

/** The check could not decide; nothing may change; never retryable. */
export class FenceError extends FencecheckError {
  /** The WIT error case. */
  readonly code: FenceErrorCode;
  /** The sub-case (`missing-token`, `checksum-mismatch`, ...), if any. */
  readonly reason: string | undefined;
  /** The case's payload: the format version, the stored scope, {stored, presented}. */
  readonly detail: unknown;
  readonly retryable: false;
}

/** A lease call could not decide; nothing may change; never retryable. */
export class LeaseError extends FencecheckError {
  readonly code: 'invalid-request' | 'corrupt-state' | 'unsupported-state-version' | 'lock-mismatch' | 'foreign-authority' | 'exhausted';
  readonly reason: string | undefined;
  readonly detail: unknown;
  readonly retryable: false;
}

/** Infrastructure failure: no decision was obtained. May be retried. */
export class HostError extends FencecheckError {
  readonly retryable: boolean;
}
/** The transpiled component is missing or could not be compiled. */
export class ComponentLoadError extends HostError {}
/**
 * The component's WIT package version is not one this package runs (for 0.x:
 * the same major and minor as WIT_VERSION), or it does not export
 * `fencecheck:fence/check`. Thrown at load.
 */
export class UnsupportedComponent extends ComponentLoadError {
  /** What the component exports, e.g. `fencecheck:fence/check@0.2.0`. */
  readonly found: string;
  /** What this package runs, e.g. `fencecheck:fence@0.1.x`. */
  readonly supported: string;
  readonly retryable: false;
}
/** The guest trapped; the call had no effect and the instance was replaced. */
export class GuestTrapped extends HostError {
  readonly call: string;
}
/**
 * A `check-packed` batch did not follow its byte format: the guest refused
 * the encoding (`side: 'input'`) or returned bytes that cannot be read
 * (`'output'`). A bug, never an outcome: no decision of the batch is returned.
 */
export class PackedFormatError extends HostError {
  readonly side: 'input' | 'output';
  readonly retryable: false;
}
/** The call's inputs exceed `limits.callBytes`; it was not sent. */
export class TooLarge extends HostError {
  readonly call: string;
  readonly size: number;
  readonly limit: number;
}

export interface Limits {
  /** Largest total input of one call, in bytes (UTF-16 length * 3 for strings). */
  callBytes: number;
}
export const DEFAULT_LIMITS: Readonly<Limits>;

/** The compiled component: one per process. */
export class Runtime {
  constructor(options?: {
    /** Folder of the transpiled component (default: the package's gen/). */
    dir?: string;
    limits?: Partial<Limits>;
    /** Replaces `new WebAssembly.Instance` (jco's hook), e.g. for fault injection. */
    instantiateCore?: (module: WebAssembly.Module, imports: Record<string, any>) => WebAssembly.Instance;
  });
  readonly limits: Limits;
  /** The loaded component's WIT package version, e.g. `'0.1.0'` (from its export names). */
  readonly componentVersion: string;
  instance(): Instance;
}

/** The WIT package version this package was written against (`'0.1.0'`). */
export const WIT_VERSION: string;
/**
 * The WIT package version of the component this package runs by default (the
 * transpiled one in gen/), e.g. `'0.1.0'`, read from its export names; loads
 * it once per process. Throws ComponentLoadError (UnsupportedComponent).
 */
export function componentVersion(): string;

export type Acquired = { outcome: 'acquired'; token: Token; expiresAt: bigint; state: Uint8Array };
export type Busy = { outcome: 'busy'; holder: string; expiresAt: bigint };
export type Renewed = { outcome: 'renewed'; expiresAt: bigint; state: Uint8Array };
export type Lost = { outcome: 'lost' };
export type Released = { outcome: 'released'; state: Uint8Array };
export type NotOwner = { outcome: 'not-owner' };
export type Restored = { outcome: 'restored'; epoch: bigint; state: Uint8Array };

type U64 = bigint | number;

/** One instance of the component; replaced after a trap. */
export class Instance {
  constructor(runtime: Runtime);
  /** Decide one request; throws FenceError / HostError. */
  check(state: Uint8Array | null | undefined, request: Request): Decision;
  /**
   * Decide independent pairs in one call; refusals are returned in place.
   * Crosses as `check-packed`; throws PackedFormatError on a format bug.
   */
  checkBatch(items: ReadonlyArray<readonly [Uint8Array | null | undefined, Request]>): Array<Decision | FenceError>;
  /** Decode a stored fence state. */
  inspect(state: Uint8Array): StateInfo;
  acquire(
    state: Uint8Array | null | undefined,
    request: { lock: string; leaseId: string; now: U64; ttl: U64; authority?: U64; epochFloor?: U64 },
  ): Acquired | Busy;
  renew(state: Uint8Array | null | undefined, request: { leaseId: string; token: Token; now: U64; ttl: U64 }): Renewed | Lost;
  release(state: Uint8Array | null | undefined, request: { leaseId: string; token: Token }): Released | NotOwner;
  restore(state: Uint8Array | null | undefined): Restored;
}
