// Compiled by `npm run typecheck` (tsc --noEmit): the public .d.ts files
// describe a usable API. Not run; a type error fails the check.
import {
  FenceError, KeySetError, PackedFormatError, Runtime, SignError, TokenTextError, UnsupportedComponent, UnsupportedFeature, WIT_VERSION,
  componentVersion, formatSignedToken, keyProblem, parseKeys, parseSignedToken, signingKey, token,
  type AuthFailure, type Decision, type GrantKey, type GrantSignature, type KeyProblem,
} from '../src/index.js';
import {
  fencedWrite, install, keyPrefixes, LAYOUT_VERSION, removeKeys, scopeKeys, setKeys, TransactionEnded, UnsupportedLayout, type Database,
} from '../src/sqlite.js';
import {
  DECISIONS, OpenTelemetrySignals, PrometheusSignals, epochLabel, installSignals, installedSignals, outcomeLabel, recordDecision,
  type EpochLabel, type Outcome, type Signals,
} from '../src/signals.js';
import client from 'prom-client';
import { metrics } from '@opentelemetry/api';

declare const db: Database;
const guest = new Runtime().instance();
const d: Decision = guest.check(null, { scope: 's', token: token(0, 0, 1), policy: 'strict', expectedVersion: 1n });
if (d.outcome === 'applied') {
  const bytes: Uint8Array = d.state;
  void bytes;
} else if (d.outcome === 'stale-fence') {
  const highest: bigint = d.highest.counter;
  void highest;
}
try {
  for (const r of guest.checkBatch([[null, { scope: 's', token: token(0, 0, 1) }]])) {
    if (r instanceof FenceError) void r.code;
  }
} catch (e) {
  if (e instanceof PackedFormatError) void (e.side === 'input');
}
try {
  install(db);
} catch (e) {
  if (e instanceof UnsupportedLayout) void (e.found ?? `none, this version: ${LAYOUT_VERSION}`);
}
try {
  const w: Decision = fencedWrite(db, guest, { scope: 's', token: token(0, 0, 2) }, (_db, applied) => void applied.version);
  void w;
} catch (e) {
  if (e instanceof TransactionEnded) void e.retryable;
}
const running: string = componentVersion();
const loaded: string = new Runtime().componentVersion;
const built: string = WIT_VERSION;
try {
  new Runtime({ dir: '/elsewhere' });
} catch (e) {
  if (e instanceof UnsupportedComponent) void [e.found, e.supported];
}
void [running, loaded, built];

// Signed tokens: sign, text forms, checkSigned, batches with keys, the SQLite key admin.
try {
  const keys: GrantKey[] = parseKeys('3:00112233445566778899aabbccddeeff');
  const problem: KeyProblem | null = keyProblem(keys);
  const sig: GrantSignature = guest.sign('s', token(0, 1, 1), 'lease-1', signingKey(keys));
  const text: string = formatSignedToken({ token: token(0, 1, 1), signature: sig });
  const parsed = parseSignedToken(text);
  const ok: Decision = guest.checkSigned(null, { scope: 's', token: parsed.token, signature: parsed.signature }, keys);
  const mixed = guest.checkBatch([[null, { scope: 's', token: token(0, 1, 1) }], [null, { scope: 's', token: token(0, 1, 1), signature: sig }, keys]]);
  const message: Uint8Array = guest.grantMessage('s', token(0, 1, 1), sig.keyId, sig.leaseId);
  setKeys(db, 'report/', keys);
  const found: GrantKey[] | null = scopeKeys(db, 'report/july');
  const listed: Array<{ prefix: string; keyIds: number[] }> = keyPrefixes(db);
  const removed: boolean = removeKeys(db, 'report/');
  const signing: boolean = new Runtime().supportsSigning;
  void [problem, ok, mixed, message, found, listed, removed, signing];
} catch (e) {
  if (e instanceof FenceError && e.code === 'unauthenticated') {
    const why = e.reason as AuthFailure;
    void why;
  }
  if (e instanceof SignError) void [e.code, e.reason];
  if (e instanceof UnsupportedFeature) void [e.feature, e.version, e.since];
  if (e instanceof TokenTextError) void e.text;
  if (e instanceof KeySetError) void e.reason;
}
void Runtime.load('/elsewhere').then((r) => r.componentVersion);

// Signals: the adapters take the libraries' own objects, as their types say.
{
  const registry = new client.Registry();
  const previous: Signals = installSignals(new PrometheusSignals(client, { registry }));
  installSignals(new OpenTelemetrySignals(metrics.getMeter('fencecheck')));
  installSignals({ decision: (operation, outcome: Outcome, epoch: EpochLabel) => void [operation, outcome, epoch] });
  const epoch: EpochLabel = epochLabel(token(0, 1, 1));
  const outcome: Outcome = outcomeLabel(guest.check(null, { scope: 's', token: token(0, 0, 1) }));
  recordDecision('check', token(0, 1, 1), new Error('down'));
  const name: 'fencecheck_decisions_total' = DECISIONS;
  void [previous, epoch, outcome, name, installedSignals()];
  installSignals(null);
}
