import type { Applied, Decision, GrantKey, Instance, Request } from './index.js';
import { HostError } from './index.js';

/** The part of a better-sqlite3 `Database` this module uses (structural). */
export interface Database {
  prepare(sql: string): { get(...params: unknown[]): unknown; all(...params: unknown[]): unknown[]; run(...params: unknown[]): { changes: number } };
  exec(sql: string): unknown;
  readonly inTransaction: boolean;
}

/** The layout this module reads and writes (`fencecheck_meta`'s `layout` row), as in every host. */
export const LAYOUT_VERSION: 2;

/**
 * `install` found a database laid out for another version: `found` is the
 * stored `layout` value as SQL text (`'2'`, `"'1'"`), or null when there is no
 * `layout` row. Nothing was created or changed; not retryable.
 */
export class UnsupportedLayout extends HostError {
  readonly found: string | null;
  readonly supported: number;
  readonly retryable: false;
}

/**
 * The mutation ended fencedWrite's transaction itself (COMMIT or ROLLBACK):
 * the fence state was not stored; whatever the mutation committed stays
 * committed. A bug in the mutation; not retryable.
 */
export class TransactionEnded extends HostError {
  readonly retryable: false;
}

/**
 * Create fencecheck's tables (host/sqlite/schema.sql, the layout the Rust and
 * Python hosts install too) if they do not exist, in one BEGIN IMMEDIATE
 * transaction. Idempotent; upgrades layout 1 in place. Throws
 * UnsupportedLayout, creating nothing, if the database records another layout.
 */
export function install(db: Database): void;

/** The stored state of `scope` (from `fencecheck_scopes`), or null if it never accepted a token. */
export function loadState(db: Database, scope: string): Uint8Array | null;

/**
 * The keys of the longest configured prefix that starts `scope` (keys.sql),
 * or null: the scope takes unsigned tokens.
 */
export function scopeKeys(db: Database, scope: string): GrantKey[] | null;

/**
 * Require tokens signed with `keys` on every scope starting with `prefix`
 * (replacing its keys), in one BEGIN IMMEDIATE transaction. Throws
 * KeySetError (an unusable set) or RangeError (a prefix over 1024 bytes),
 * changing nothing.
 */
export function setKeys(db: Database, prefix: string, keys: readonly GrantKey[]): void;

/** Stop requiring signed tokens under `prefix`; whether it had keys. */
export function removeKeys(db: Database, prefix: string): boolean;

/** Every configured prefix with its key ids (never the secrets), by prefix. */
export function keyPrefixes(db: Database): Array<{ prefix: string; keyIds: number[] }>;

/**
 * Check `request` (checkSigned with its signature if the scope requires
 * signed tokens) and, only if it is applied, run `mutate(db, applied)` and
 * store the new state, in one BEGIN IMMEDIATE transaction. Returns the
 * decision; throws FenceError (incl. `unauthenticated`, `invalid-keys`) /
 * HostError (after rolling back), rethrows
 * whatever `mutate` throws (after rolling back), and throws TransactionEnded,
 * storing nothing, if `mutate` ended the transaction itself.
 */
export function fencedWrite(
  db: Database,
  guest: Instance,
  request: Request,
  mutate: (db: Database, applied: Applied) => void,
): Decision;
