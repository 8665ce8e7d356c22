// The typed API over the real transpiled component: decisions are values,
// refusals (FenceError) and infrastructure failures (HostError) are separate.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FenceError, HostError, GuestTrapped, ComponentLoadError, LeaseError, TooLarge, Runtime, U64_MAX, token, _lift } from '../src/index.js';

const runtime = new Runtime();
const req = (counter, extra = {}) => ({ scope: 'report/july', token: token(0, 0, counter), ...extra });

// A fresh scope accepts its first token at version 1 and returns a state.
test('first check applies at version 1', () => {
  const d = runtime.instance().check(null, req(41));
  assert.equal(d.outcome, 'applied');
  assert.equal(d.version, 1n);
  assert.deepEqual(d.highest, token(0, 0, 41));
  assert.ok(d.state instanceof Uint8Array && d.state.length > 0);
});

// An older token returns a stale-fence value; it does not throw.
test('stale fence is a value, not an exception', () => {
  const g = runtime.instance();
  const { state } = g.check(null, req(42));
  assert.deepEqual(g.check(state, req(41)), { outcome: 'stale-fence', presented: token(0, 0, 41), highest: token(0, 0, 42) });
});

// FenceError and HostError are disjoint; only HostError is retryable.
test('refusals are never retryable and are not infrastructure errors', () => {
  const g = runtime.instance();
  assert.throws(() => g.check(null, { scope: '', token: token(0, 0, 1) }),
    (err) => err instanceof FenceError && !(err instanceof HostError) && err.retryable === false);
  assert.equal(new GuestTrapped('check', new Error('x')).retryable, true);
});

// Each malformed request throws invalid-request with the WIT reason.
test('invalid requests carry their reason', () => {
  const g = runtime.instance();
  const cases = [
    [{ scope: 's', token: token(0, 0, 0) }, 'missing-token'],
    [{ scope: '', token: token(0, 0, 1) }, 'empty-scope'],
    [{ scope: 'x'.repeat(1025), token: token(0, 0, 1) }, 'scope-too-long'],
    [{ scope: 's', token: token(0, 0, 1), opId: '' }, 'empty-op-id'],
    [{ scope: 's', token: token(0, 0, 1), opId: 'ö'.repeat(129) }, 'op-id-too-long'],
  ];
  for (const [r, reason] of cases) {
    assert.throws(() => g.check(null, r), (e) => e instanceof FenceError && e.code === 'invalid-request' && e.reason === reason);
  }
});

// A flipped bit is corrupt-state; scope and authority errors carry their payloads.
test('state errors carry their details', () => {
  const g = runtime.instance();
  const { state } = g.check(null, { scope: 'ledger/ü', token: token(0, 0, 1) });
  const damaged = Uint8Array.from(state);
  damaged[20] ^= 1;
  assert.throws(() => g.check(damaged, { scope: 'ledger/ü', token: token(0, 0, 2) }), (e) => e.code === 'corrupt-state' && e.reason === 'checksum-mismatch');
  assert.throws(() => g.check(state, { scope: 'ledger/u', token: token(0, 0, 2) }), (e) => e.code === 'scope-mismatch' && e.detail === 'ledger/ü');
  assert.throws(() => g.check(state, { scope: 'ledger/ü', token: { authority: U64_MAX, epoch: 0n, counter: 2n } }),
    (e) => e.code === 'foreign-authority' && e.detail.stored === 0n && e.detail.presented === U64_MAX);
});

// Op-ids make a repeat a duplicate; a stale expected version a version-conflict.
test('allow-equal duplicate and version conflict', () => {
  const g = runtime.instance();
  const s1 = g.check(null, req(5, { policy: 'allow-equal', opId: 'a' })).state;
  const s2 = g.check(s1, req(5, { policy: 'allow-equal', opId: 'b' })).state;
  assert.deepEqual(g.check(s2, req(5, { policy: 'allow-equal', opId: 'a' })), { outcome: 'duplicate', version: 1n });
  assert.deepEqual(g.check(s2, req(6, { expectedVersion: 1n })), { outcome: 'version-conflict', expected: 1n, actual: 2n });
});

// u64 max survives lowering and lifting; inspect reads it back.
test('u64 extremes round-trip', () => {
  const g = runtime.instance();
  const max = { authority: U64_MAX, epoch: U64_MAX, counter: U64_MAX };
  const d = g.check(null, { scope: 'm', token: max, expectedVersion: 0 });
  assert.deepEqual(d.highest, max);
  const info = g.inspect(d.state);
  assert.equal(info.scope, 'm');
  assert.equal(info.authority, U64_MAX);
  assert.equal(info.version, 1n);
});

// checkBatch returns, per item and in order, what check returns (refusals in place).
test('batch matches single checks', () => {
  const g = runtime.instance();
  const { state } = g.check(null, req(10));
  const items = [[null, req(1)], [state, req(9)], [state, req(11, { opId: 'x' })], [new Uint8Array(), req(1)],
    [state, { scope: '', token: token(0, 0, 1) }], [state, req(12, { expectedVersion: 7n })]];
  const batch = g.checkBatch(items);
  assert.equal(batch.length, items.length);
  items.forEach(([s, r], i) => {
    let single;
    try { single = g.check(s, r); } catch (e) { single = e; }
    if (single instanceof FenceError) assert.ok(batch[i] instanceof FenceError && batch[i].code === single.code && batch[i].reason === single.reason);
    else assert.deepEqual(batch[i], single);
  });
  assert.deepEqual(g.checkBatch([]), []);
});

// Values that jco would silently wrap or replace are refused first.
test('bad JavaScript values never reach the component', () => {
  const g = runtime.instance();
  for (const bad of [-1, 2 ** 53, 1.5, '1', U64_MAX + 1n]) assert.throws(() => token(0, 0, bad), RangeError);
  assert.throws(() => g.check(null, { scope: '\ud800', token: token(0, 0, 1) }), RangeError);
  assert.throws(() => g.check(null, { scope: 's', token: { authority: 0n, epoch: 0n, counter: -1n } }), RangeError);
  assert.throws(() => g.check(null, req(1, { policy: 'loose' })), RangeError);
  assert.throws(() => g.check([1, 2], req(1)), TypeError);
});

// Oversized inputs are refused before the call.
test('too large is refused before the guest', () => {
  const g = new Runtime({ limits: { callBytes: 16 } }).instance();
  assert.throws(() => g.check(new Uint8Array(17), req(1)), TooLarge);
});

// A missing build fails at load time with a clear error.
test('missing component fails to load', () => {
  assert.throws(() => new Runtime({ dir: '/nonexistent' }), ComponentLoadError);
});

// A trap inside the guest is GuestTrapped and the instance is replaced. V8
// has no fuel, so the trap is injected where a real one surfaces: the core
// export throws WebAssembly.RuntimeError, once; through each way a check
// crosses (the single-check export, jco's typed check).
test('a trap is GuestTrapped and the instance recovers', () => {
  let armed = false;
  let instantiations = 0;
  const instantiateCore = (module, imports) => {
    instantiations += 1;
    const { exports } = new WebAssembly.Instance(module, imports);
    const wrapped = { ...exports };
    for (const [name, f] of Object.entries(exports)) {
      if ((name.endsWith('#check') || name === 'fencecheck-one') && typeof f === 'function') {
        wrapped[name] = (...args) => {
          if (armed) { armed = false; throw new WebAssembly.RuntimeError('unreachable'); }
          return f(...args);
        };
      }
    }
    return { exports: wrapped };
  };
  const g = new Runtime({ instantiateCore }).instance();
  assert.equal(g._transport, 'one', 'the single-check export is reached through a wrapping hook too');
  for (const check of [(s, r) => g.check(s, r), (s, r) => g._checkComponent(s, r)]) {
    const before = instantiations;
    armed = true;
    assert.throws(() => check(null, req(1)), (e) => e instanceof GuestTrapped && e.call === 'check' && e.retryable);
    assert.equal(instantiations, before + 1, 'the instance was replaced');
    assert.equal(check(null, req(1)).outcome, 'applied');
  }
});

// A decision, check-error or lease case outside the contract is a HostError, never a refusal or a guessed outcome.
test('unknown cases are host errors', () => {
  const unknown = (e) => e instanceof HostError && /unknown/.test(e.message);
  assert.throws(() => _lift.checkError({ tag: 'out-of-range' }), unknown);
  assert.throws(() => _lift.checkError({ tag: 'lock-mismatch', val: 'x' }), unknown); // a lease case, not a check case
  assert.throws(() => _lift.checkError({ tag: 'scope-mismatch', val: 'x' }, LeaseError), unknown);
  assert.throws(() => _lift.decision({ tag: 'out-of-range' }), unknown);
  for (const [call, tag] of [['acquire', 'granted'], ['renew', 'expired'], ['release', 'lost'], ['renew', undefined]]) {
    assert.throws(() => _lift.leaseOutcome(call, { tag, val: {} }), unknown, `${call} ${tag}`);
  }
  assert.equal(_lift.checkError({ tag: 'exhausted' }).code, 'exhausted');
  assert.deepEqual(_lift.leaseOutcome('renew', { tag: 'lost' }), { outcome: 'lost' });
});
