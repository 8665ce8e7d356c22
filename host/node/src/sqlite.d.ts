import type { Applied, Decision, Instance, Request } from './index.js';

/** The part of a better-sqlite3 `Database` this module uses (structural). */
export interface Database {
  prepare(sql: string): { get(...params: unknown[]): unknown; run(...params: unknown[]): unknown };
  exec(sql: string): unknown;
  transaction<F extends (...args: any[]) => any>(fn: F): F & { immediate: F };
  readonly inTransaction: boolean;
}

/** Create the state table (`scope TEXT PRIMARY KEY, state BLOB`) if it does not exist. */
export function createTable(db: Database, table?: string): void;

/** The stored state of `scope`, or null if it never accepted a token. */
export function loadState(db: Database, scope: string, table?: string): Uint8Array | null;

/**
 * Check `request` and, only if it is applied, run `mutate(db, applied)` and
 * store the new state, in one BEGIN IMMEDIATE transaction. Returns the
 * decision; throws FenceError / HostError (after rolling back), and rethrows
 * whatever `mutate` throws (after rolling back).
 */
export function fencedWrite(
  db: Database,
  guest: Instance,
  request: Request,
  mutate: (db: Database, applied: Applied) => void,
  options?: { table?: string },
): Decision;
