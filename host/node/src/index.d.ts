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

/** A key of a scope's key set (or an authority's signing key). */
export interface GrantKey {
  /** u32; every signature names its key. */
  keyId: number;
  /** The shared secret: 16 to 64 bytes (32 random bytes recommended). */
  secret: Uint8Array;
}

/** The proof that a grant came from its authority (from `sign`). */
export interface GrantSignature {
  /** The key that made it (u32). */
  keyId: number;
  /** The lease the grant was made to (1 to 256 bytes). */
  leaseId: string;
  /** HMAC-SHA256 of `grantMessage`: 32 bytes. */
  tag: Uint8Array;
}

/** One protected mutation, as presented to the resource. */
export interface Request {
  scope: string;
  token: Token;
  /** Default `strict`. */
  policy?: Policy;
  opId?: string;
  expectedVersion?: bigint | number;
  /** The token's signature: verified by checkSigned, ignored by check. */
  signature?: GrantSignature | null;
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
  | 'exhausted'
  /** checkSigned: the token is not proven to come from its authority (reason: AuthFailure). */
  | 'unauthenticated'
  /** checkSigned: the scope's key set is unusable (reason: KeyProblem); the configuration is at fault. */
  | 'invalid-keys';

/** Why a token on a scope that requires signed tokens is `unauthenticated`. */
export type AuthFailure = 'unsigned' | 'unknown-key' | 'malformed-signature' | 'bad-signature';
/** Why a key set (or a signing key) is unusable. */
export type KeyProblem = 'no-keys' | 'too-many-keys' | 'short-secret' | 'long-secret' | 'duplicate-key-id';
export const AUTH_FAILURES: readonly AuthFailure[];
export const KEY_PROBLEMS: readonly KeyProblem[];
export const MAX_KEYS: 16;
export const MIN_SECRET_BYTES: 16;
export const MAX_SECRET_BYTES: 64;

/** Base of every error this package throws on purpose. */
export class FencecheckError extends Error {}

/** The check could not decide; nothing may change; never retryable. */
export class FenceError extends FencecheckError {
  /** The WIT error case. */
  readonly code: FenceErrorCode;
  /** The sub-case (`missing-token`, `checksum-mismatch`, `bad-signature`, `short-secret`, ...), if any. */
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

/** `sign` could not sign the grant; never retryable. */
export class SignError extends FencecheckError {
  readonly code: 'empty-scope' | 'scope-too-long' | 'missing-token' | 'empty-lease-id' | 'lease-id-too-long' | 'invalid-key';
  /** For `invalid-key`: the key's problem. */
  readonly reason: KeyProblem | undefined;
  readonly retryable: false;
}

/** Text that is not a token in canonical form. */
export class TokenTextError extends FencecheckError {
  /** The rejected text (its first 64 characters). */
  readonly text: string;
}

/** A key set that is unusable or not `KEY-ID:SECRET-HEX` text; never names a secret. */
export class KeySetError extends FencecheckError {
  /** `entry N is not KEY-ID:SECRET-HEX`, or a KeyProblem. */
  readonly reason: string;
}

/** Infrastructure failure: no decision was obtained. May be retried. */
export class HostError extends FencecheckError {
  readonly retryable: boolean;
}
/**
 * The loaded component predates a feature the call needs (signed tokens:
 * 0.1.1). Nothing was sent; every other call works. Not retryable.
 */
export class UnsupportedFeature extends HostError {
  /** E.g. `signed tokens`. */
  readonly feature: string;
  /** The loaded component's version. */
  readonly version: string;
  /** The first version with the feature. */
  readonly since: string;
  readonly retryable: false;
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

/**
 * Bounds on every instance. No fuel: V8 cannot meter a synchronous call (the
 * packaged component needs none: its work is linear in its input).
 */
export interface Limits {
  /** Largest total input of one call, in bytes (UTF-16 length * 3 for strings). */
  callBytes: number;
}
export const DEFAULT_LIMITS: Readonly<Limits>;

export interface RuntimeOptions {
  /** Folder of the transpiled component's core modules (default: the package's gen/). */
  dir?: string;
  limits?: Partial<Limits>;
  /** Replaces `new WebAssembly.Instance` (jco's hook), e.g. for fault injection. */
  instantiateCore?: (module: WebAssembly.Module, imports: Record<string, any>) => WebAssembly.Instance;
  /** The transpiled glue module for `dir` (default: gen/fencecheck.js); Runtime.load imports it. */
  glue?: { instantiate: (...args: any[]) => any };
  /** How messages name the glue. */
  glueName?: string;
}

/** The compiled component: one per process. */
export class Runtime {
  constructor(options?: RuntimeOptions);
  /**
   * A runtime for a component transpiled (as `npm run build` does) into
   * `dir`: imports `dir/fencecheck.js`, e.g. the previous release.
   */
  static load(dir: string, options?: Omit<RuntimeOptions, 'dir' | 'glue' | 'glueName'>): Promise<Runtime>;
  readonly limits: Limits;
  /** The loaded component's WIT package version, e.g. `'0.1.1'` (from its export names). */
  readonly componentVersion: string;
  /** Whether the loaded component has signed tokens (0.1.1 or later). */
  readonly supportsSigning: boolean;
  instance(): Instance;
}

/** The WIT package version this package was written against (`'0.1.1'`). */
export const WIT_VERSION: string;
/**
 * The WIT package version of the component this package runs by default (the
 * transpiled one in gen/), e.g. `'0.1.1'`, read from its export names; loads
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
  /**
   * Decide one request (the scope takes unsigned tokens; a signature is
   * ignored); throws FenceError / HostError. Crosses once, through the core
   * module's single-check export, when the component has it; else through
   * jco's typed `check`. Both decide the same.
   */
  check(state: Uint8Array | null | undefined, request: Request): Decision;
  /**
   * Decide one request on a scope that requires signed tokens, verifying
   * `request.signature` with `keys` before the state is read. Throws
   * FenceError (`unauthenticated`, `invalid-keys` or a check error),
   * UnsupportedFeature (component 0.1.0), HostError.
   */
  checkSigned(state: Uint8Array | null | undefined, request: Request, keys: readonly GrantKey[]): Decision;
  /** Sign the grant of `token` to `leaseId` for `scope`; throws SignError, UnsupportedFeature. */
  sign(scope: string, token: Token, leaseId: string, key: GrantKey): GrantSignature;
  /** The bytes a tag is the HMAC-SHA256 of (for signers outside the component). */
  grantMessage(scope: string, token: Token, keyId: number, leaseId: string): Uint8Array;
  /**
   * Decide independent pairs in one call; refusals are returned in place.
   * An item with `keys` is decided as checkSigned. Crosses as `check-packed`;
   * throws PackedFormatError on a format bug.
   */
  checkBatch(
    items: ReadonlyArray<
      readonly [Uint8Array | null | undefined, Request] | readonly [Uint8Array | null | undefined, Request, readonly GrantKey[] | null | undefined]
    >,
  ): Array<Decision | FenceError>;
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

/** A token and its signature (undefined for a plain token). */
export interface SignedToken {
  token: Token;
  signature: GrantSignature | undefined;
}
/** Parse `EPOCH.COUNTER` or `AUTHORITY:EPOCH.COUNTER` (decimal u64); throws TokenTextError. */
export function parseToken(text: string): Token;
/** A token's canonical text (`AUTHORITY:` only when not 0). */
export function formatToken(token: Token): string;
/**
 * Parse `TOKEN` or `TOKEN~KEY-ID~LEASE~TAG` (lease id and tag canonical
 * base64url without padding); checks the form only. Throws TokenTextError.
 */
export function parseSignedToken(text: string): SignedToken;
/** `TOKEN`, or `TOKEN~KEY-ID~LEASE~TAG` with a signature. */
export function formatSignedToken(signed: { token: Token; signature?: GrantSignature | null }): string;
/** Parse `KEY-ID:SECRET-HEX` entries (commas or lines, `#` comments) into a usable key set; throws KeySetError. */
export function parseKeys(text: string): GrantKey[];
/** A usable key set as text (it contains the secrets); throws KeySetError. */
export function formatKeys(keys: readonly GrantKey[]): string;
/** The one key of a signing key set; throws KeySetError for any other count. */
export function signingKey(keys: readonly GrantKey[]): GrantKey;
/** What makes `keys` unusable, as the component judges it, or null. */
export function keyProblem(keys: readonly GrantKey[]): KeyProblem | null;
