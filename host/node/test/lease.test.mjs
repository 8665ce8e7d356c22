// The lease authority through the same component: grants, busy, renew, the
// delayed release, and errors that are never retryable.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FenceError, LeaseError, Runtime, token } from '../src/index.js';

const g = new Runtime().instance();

// A expires, B gets the next token; A's late renew is lost, its release not-owner.
test('grants are ordered and a delayed release changes nothing', () => {
  const a = g.acquire(null, { lock: 'report/july', leaseId: 'a7', now: 0, ttl: 30000 });
  assert.deepEqual([a.outcome, a.token, a.expiresAt], ['acquired', token(0, 0, 1), 30000n]);
  assert.deepEqual(g.acquire(a.state, { lock: 'report/july', leaseId: 'b9', now: 29999, ttl: 30000 }), { outcome: 'busy', holder: 'a7', expiresAt: 30000n });
  const b = g.acquire(a.state, { lock: 'report/july', leaseId: 'b9', now: 30000, ttl: 30000 });
  assert.deepEqual(b.token, token(0, 0, 2));
  assert.deepEqual(g.renew(b.state, { leaseId: 'a7', token: a.token, now: 30001, ttl: 1 }), { outcome: 'lost' });
  assert.deepEqual(g.release(b.state, { leaseId: 'a7', token: a.token }), { outcome: 'not-owner' });
  assert.equal(g.release(b.state, { leaseId: 'b9', token: b.token }).outcome, 'released');
});

// After restore the next grant is (epoch + 1, 1).
test('restore starts the next epoch', () => {
  const a = g.acquire(null, { lock: 'l', leaseId: 'a', now: 0, ttl: 1 });
  const r = g.restore(a.state);
  assert.equal(r.epoch, 1n);
  assert.deepEqual(g.acquire(r.state, { lock: 'l', leaseId: 'b', now: 5, ttl: 1 }).token, token(0, 1, 1));
});

// Bad lease requests throw LeaseError with the WIT names; never retryable.
test('lease errors are refusals', () => {
  assert.throws(() => g.acquire(null, { lock: '', leaseId: 'a', now: 0, ttl: 1 }), (e) => e instanceof LeaseError && !(e instanceof FenceError) && e.code === 'invalid-request' && e.reason === 'empty-lock' && !e.retryable);
  assert.throws(() => g.restore(null), (e) => e instanceof LeaseError && e.reason === 'no-state');
  assert.throws(() => g.acquire(Uint8Array.of(0x4c, 0x53, 1), { lock: 'l', leaseId: 'a', now: 0, ttl: 1 }), (e) => e.code === 'corrupt-state' && e.reason === 'truncated');
});
