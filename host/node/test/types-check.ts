// Compiled by `npm run typecheck` (tsc --noEmit): the public .d.ts files
// describe a usable API. Not run; a type error fails the check.
import { FenceError, PackedFormatError, Runtime, UnsupportedComponent, WIT_VERSION, componentVersion, token, type Decision } from '../src/index.js';
import { fencedWrite, install, LAYOUT_VERSION, TransactionEnded, UnsupportedLayout, type Database } from '../src/sqlite.js';

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
