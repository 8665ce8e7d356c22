import type { Decision, Token } from './index.js';

/** The table's name, as scraped: `fencecheck_decisions_total`. */
export const DECISIONS: 'fencecheck_decisions_total';

/** The `operation` label values (docs/design.md §12); fencedWrite uses `write`. */
export type Operation = 'put' | 'delete' | 'write' | 'publish' | 'execute' | 'check';
export const OPERATIONS: readonly Operation[];

/** The `outcome` label values (docs/design.md §12). */
export type Outcome = 'applied' | 'duplicate' | 'stale-fence' | 'version-conflict' | 'refused' | 'unauthenticated' | 'error';
export const OUTCOMES: readonly Outcome[];

/** The `epoch` label values: the presented token's epoch up to MAX_EPOCH_LABEL, `other` above, `none` without a token. */
export type EpochLabel = '0' | '1' | '2' | '3' | '4' | '5' | '6' | '7' | '8' | '9' | '10' | '11' | '12' | '13' | '14' | '15' | 'other' | 'none';
export const MAX_EPOCH_LABEL: 15;

/**
 * What the adapters call: one `decision` per fenced write, with the table's
 * label values, on the writing thread after the transaction ended.
 */
export interface Signals {
  decision(operation: Operation, outcome: Outcome, epoch: EpochLabel): void;
}

/**
 * Make `signals` receive every decision from now on, process-wide (null or
 * undefined: record nothing). Returns the signals installed before.
 */
export function installSignals(signals: Signals | null | undefined): Signals;

/** The signals receiving decisions now (the default records nothing). */
export function installedSignals(): Signals;

/** The `epoch` label of a presented token (`none` for null, undefined or the zero token). */
export function epochLabel(token: Token | null | undefined): EpochLabel;

/** The `outcome` label of a fenced write's decision, or of what it threw. */
export function outcomeLabel(result: Decision | unknown): Outcome;

/**
 * Report one decision to the installed signals, as fencedWrite does: for a
 * resource of your own, after its transaction ends, with the request's token
 * and the decision or what was thrown. Throws RangeError for an operation
 * outside OPERATIONS.
 */
export function recordDecision(operation: Operation, token: Token | null | undefined, result: Decision | unknown): void;

/** The part of the prom-client module PrometheusSignals uses (structural; `R`: its Registry). */
export interface PromClient<R> {
  Counter: new (config: { name: string; help: string; labelNames: readonly string[]; registers: R[] }) => {
    labels(...values: string[]): { inc(value?: number): void };
  };
  register: R;
}

/**
 * `fencecheck_decisions_total` as a prom-client Counter in `registry`
 * (default: `client.register`). `client`: the prom-client module.
 */
export class PrometheusSignals<R = unknown> implements Signals {
  constructor(client: PromClient<R>, options?: { registry?: R });
  decision(operation: Operation, outcome: Outcome, epoch: EpochLabel): void;
}

/** The part of an OpenTelemetry Meter OpenTelemetrySignals uses (structural). */
export interface OtelMeter {
  createCounter(name: string, options?: { description?: string }): {
    add(value: number, attributes?: Record<string, string>): void;
  };
}

/**
 * `fencecheck_decisions_total` as a counter of an OpenTelemetry Meter
 * (`metrics.getMeter('fencecheck')`), attributes `operation`, `outcome`, `epoch`.
 */
export class OpenTelemetrySignals implements Signals {
  constructor(meter: OtelMeter);
  decision(operation: Operation, outcome: Outcome, epoch: EpochLabel): void;
}
