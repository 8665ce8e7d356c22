// The agreement trace (tests/agreement/README.md): run a sequence of checks
// and damage over numbered state slots and print one canonical line per step.
// Every runtime prints the same bytes for the same sequence, or they disagree.

import { FenceError } from './index.js';
import { VectorFormatError, damage, obj, parseJson, parseRequest, u64 } from './vectors.js';

const tok = (t) => `[${t.authority},${t.epoch},${t.counter}]`;
const hex = (s) => (s === null || s === undefined ? 'null' : `"${Buffer.from(s.buffer, s.byteOffset, s.byteLength).toString('hex')}"`);

/** The canonical fields of one outcome (without line number and state). */
export function fields(o) {
  if (o instanceof FenceError) {
    const head = `"outcome":"error","error":"${o.code}"`;
    switch (o.code) {
      case 'invalid-request':
      case 'corrupt-state':
        return `${head},"reason":"${o.reason}"`;
      case 'unsupported-state-version':
        return `${head},"format":${o.detail}`;
      case 'scope-mismatch':
        return `${head},"scope":"${Buffer.from(o.detail, 'utf8').toString('hex')}"`;
      case 'foreign-authority':
        return `${head},"stored":${o.detail.stored},"presented":${o.detail.presented}`;
      default:
        return head;
    }
  }
  switch (o.outcome) {
    case 'applied': return `"outcome":"applied","version":${o.version},"highest":${tok(o.highest)}`;
    case 'duplicate': return `"outcome":"duplicate","version":${o.version}`;
    case 'stale-fence': return `"outcome":"stale-fence","presented":${tok(o.presented)},"highest":${tok(o.highest)}`;
    default: return `"outcome":"version-conflict","expected":${o.expected},"actual":${o.actual}`;
  }
}

// A trace has no signed scopes: `keys` would be silently dropped by check, so
// it is refused (a `signature` is ignored by check, as on any unsigned scope).
function traceRequest(check) {
  const r = parseRequest(check);
  if (check.keys !== undefined) throw new VectorFormatError('a trace check has no `keys` (signed scopes are not traced)');
  return r;
}

function checkOne(guest, state, request) {
  try {
    return guest.check(state, request);
  } catch (e) {
    if (e instanceof FenceError) return e;
    throw e;
  }
}

/**
 * Run a sequence (an iterable of text lines), calling `write` with each
 * output line. Throws VectorFormatError on a malformed line and HostError
 * when the guest cannot run.
 */
export function run(lines, guest, write, { typedBatches = false } = {}) {
  // Batch lines go through checkBatch (check-packed), or the typed check-batch export.
  const checkBatch = typedBatches ? (items) => guest._checkBatchTyped(items) : (items) => guest.checkBatch(items);
  const slots = new Map(); // slot (bigint) -> Uint8Array
  let n = 0;
  for (const text of lines) {
    n += 1;
    let step;
    try {
      step = parseJson(text);
    } catch (e) {
      throw new VectorFormatError(`line ${n}: ${e.message}`);
    }
    if (step !== null && typeof step === 'object' && 'batch' in step) {
      obj(step, ['batch'], `line ${n}`);
      if (!Array.isArray(step.batch)) throw new VectorFormatError(`line ${n}: batch must be a list`);
      const items = step.batch.map((i) => obj(i, ['slot', 'check'], `line ${n} item`));
      const keys = items.map((i) => u64(i.slot, 'slot'));
      if (new Set(keys).size !== keys.length) throw new VectorFormatError(`line ${n}: a batch's slots must be distinct`);
      const requests = items.map((i) => traceRequest(i.check));
      const outcomes = checkBatch(keys.map((k, i) => [slots.get(k) ?? null, requests[i]]));
      outcomes.forEach((o, i) => {
        if (o.outcome === 'applied') slots.set(keys[i], o.state);
        write(`{"line":${n},"item":${i},${fields(o)},"state":${hex(slots.get(keys[i]))}}`);
      });
      continue;
    }
    const s = obj(step, ['slot', 'check', 'damage', 'bit', 'len', 'hex'], `line ${n}`);
    const k = u64(s.slot, 'slot');
    const isSet = (key) => s[key] !== undefined && s[key] !== null;
    if (isSet('damage') && !isSet('check')) {
      const after = damage(slots.get(k) ?? null, s);
      if (after === null) slots.delete(k);
      else slots.set(k, after);
      write(`{"line":${n},"damage":"${s.damage}","state":${hex(after)}}`);
      continue;
    }
    if (!isSet('check') || ['damage', 'bit', 'len', 'hex'].some((key) => key in s)) {
      throw new VectorFormatError(`line ${n}: needs exactly one of \`check\`, \`damage\`, \`batch\``);
    }
    const o = checkOne(guest, slots.get(k) ?? null, traceRequest(s.check));
    if (o.outcome === 'applied') slots.set(k, o.state);
    write(`{"line":${n},${fields(o)},"state":${hex(slots.get(k))}}`);
  }
}
