// Fence decisions as metrics: the cross-host table's
// `fencecheck_decisions_total{operation, outcome, epoch}` (docs/design.md
// §12), through prom-client or the OpenTelemetry metrics API. Types:
// signals.d.ts.
//
// `fencedWrite` (fencecheck/sqlite) reports every call, exactly once, to the
// installed signals, with the table's labels:
//   operation  `write`; recordDecision takes any of OPERATIONS for a resource
//              of your own that calls Instance.check itself
//   outcome    the decision (`applied`, `duplicate`, `stale-fence`,
//              `version-conflict`), `unauthenticated` (a keyed scope refused
//              the token), `refused` (any other FenceError: no token, a bad
//              request, a damaged state, unusable keys), or `error` (anything
//              else thrown: the guest or the database failed, or the
//              mutation threw; `applied` counts only a committed write)
//   epoch      the presented token's epoch, `0`–`15`, `other` above, `none`
//              for the zero token (epoch = counter = 0: "no token")
// No scope is ever a label. Nothing is recorded until signals are installed
// (the default does nothing), and this package depends on neither library:
// the adapters take the library's own objects (the prom-client module, an
// OpenTelemetry Meter).
//
// installSignals is process-wide, like the libraries' own defaults
// (prom-client's global registry, OpenTelemetry's global meter provider).
// An exception thrown by the installed signals never reaches the writer (a
// metric must not turn a committed write into a failure its caller might
// retry): the first one is reported as a process warning
// (FENCECHECK_SIGNALS), the rest are dropped until signals are installed again.
//
// The lease rows of the table (acquisition, renewals, lease age, holder
// loss, epoch, headroom, coordinator errors) belong to a lease client that
// talks to a coordinator; this package has none (Instance.acquire and the
// others are the lease rule on state bytes, for a coordinator to run), so it
// records decisions only.

import { FenceError } from './index.js';

/** The table's name, as scraped. */
export const DECISIONS = 'fencecheck_decisions_total';
/** The `operation` values recordDecision takes (this package's adapter uses `write`). */
export const OPERATIONS = Object.freeze(['put', 'delete', 'write', 'publish', 'execute', 'check']);
/** The table's `outcome` values. */
export const OUTCOMES = Object.freeze(['applied', 'duplicate', 'stale-fence', 'version-conflict', 'refused', 'unauthenticated', 'error']);
/** Epochs above this share the label `other`. */
export const MAX_EPOCH_LABEL = 15;

const LABELS = Object.freeze(['operation', 'outcome', 'epoch']);
const DECIDED = new Set(['applied', 'duplicate', 'stale-fence', 'version-conflict']);
const HELP = 'Fence decisions by operation, outcome and the presented token\'s epoch (0-15, other, none): the name every fencecheck host exports (docs/design.md §12)';

const NONE = Object.freeze({ decision() {} });
let installed = NONE;
let warned = false;

/**
 * Make `signals` (an object with `decision(operation, outcome, epoch)`)
 * receive every decision from now on, process-wide; null or undefined:
 * record nothing. Returns the signals installed before.
 */
export function installSignals(signals) {
  if (signals !== null && signals !== undefined && typeof signals.decision !== 'function') {
    throw new TypeError('signals must have a decision(operation, outcome, epoch) method');
  }
  const previous = installed;
  installed = signals ?? NONE;
  warned = false;
  return previous;
}

/** The signals receiving decisions now (the default records nothing). */
export function installedSignals() {
  return installed;
}

function integer(v) {
  if (typeof v === 'bigint') return v;
  return Number.isSafeInteger(v) ? BigInt(v) : null;
}

/**
 * The `epoch` label of a presented token: `'0'`–`'15'`, `'other'` above (or
 * not an integer), `'none'` without one (null, undefined, the zero token).
 */
export function epochLabel(token) {
  if (token === null || typeof token !== 'object') return 'none';
  const epoch = integer(token.epoch);
  const counter = integer(token.counter);
  if (epoch === 0n && counter === 0n) return 'none';
  return epoch !== null && epoch >= 0n && epoch <= BigInt(MAX_EPOCH_LABEL) ? String(epoch) : 'other';
}

/**
 * The `outcome` label of a fenced write's result: its decision's outcome,
 * or what it threw (`unauthenticated`, `refused` for another FenceError,
 * `error` for anything else).
 */
export function outcomeLabel(result) {
  if (result instanceof FenceError) return result.code === 'unauthenticated' ? 'unauthenticated' : 'refused';
  if (!(result instanceof Error) && DECIDED.has(result?.outcome)) return result.outcome;
  return 'error';
}

/**
 * Report one decision to the installed signals: what fencedWrite calls;
 * call it from a resource of your own after its transaction ends, with the
 * request's token and the decision (or what was thrown). An `operation`
 * outside OPERATIONS throws RangeError.
 */
export function recordDecision(operation, token, result) {
  if (!OPERATIONS.includes(operation)) throw new RangeError(`operation ${String(operation)} is not one of ${OPERATIONS.join(', ')}`);
  const signals = installed;
  if (signals === NONE) return;
  try {
    signals.decision(operation, outcomeLabel(result), epochLabel(token));
  } catch (e) {
    if (!warned) {
      warned = true;
      process.emitWarning(`the installed signals failed to record a ${operation} decision (further failures are not reported): ${e?.message ?? e}`,
        { type: 'FencecheckWarning', code: 'FENCECHECK_SIGNALS' });
    }
  }
}

/**
 * `fencecheck_decisions_total` as a prom-client Counter (prom-client keeps
 * the name as given: it is the table's). `client`: the prom-client module;
 * `registry`: where to register it (default: `client.register`). One per
 * registry (a second throws prom-client's duplicate error).
 */
export class PrometheusSignals {
  constructor(client, { registry } = {}) {
    if (typeof client?.Counter !== 'function') throw new TypeError('pass the prom-client module: new PrometheusSignals(client)');
    this.counter = new client.Counter({ name: DECISIONS, help: HELP, labelNames: LABELS, registers: [registry ?? client.register] });
  }

  decision(operation, outcome, epoch) {
    this.counter.labels(operation, outcome, epoch).inc();
  }
}

/**
 * `fencecheck_decisions_total` as a counter of an OpenTelemetry Meter
 * (`metrics.getMeter('fencecheck')` from @opentelemetry/api), attributes
 * `operation`, `outcome` and `epoch`. Named with its `_total`, no unit: the
 * OpenTelemetry Prometheus exporters and the Collector add `_total` to a
 * monotonic sum only when it is missing, and an OTLP receiver that keeps
 * names keeps this one, so every path to Prometheus gives the table's name.
 * With @opentelemetry/exporter-prometheus pass `withoutScopeInfo: true` (and
 * `withoutTargetInfo: true`) for exactly the table's labels and names.
 */
export class OpenTelemetrySignals {
  #attributes = new Map();

  constructor(meter) {
    if (typeof meter?.createCounter !== 'function') throw new TypeError("pass an OpenTelemetry Meter: new OpenTelemetrySignals(metrics.getMeter('fencecheck'))");
    this.counter = meter.createCounter(DECISIONS, { description: HELP });
  }

  decision(operation, outcome, epoch) {
    const key = `${operation}\0${outcome}\0${epoch}`;
    let attributes = this.#attributes.get(key);
    if (attributes === undefined) { // a bounded set: operations x outcomes x 18 epochs
      attributes = Object.freeze({ operation, outcome, epoch });
      this.#attributes.set(key, attributes);
    }
    this.counter.add(1, attributes);
  }
}
