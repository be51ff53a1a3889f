// Giving memory back after a big full sync (src/sync/memory.ts): the collection really runs
// without --expose-gc, and only after the syncs that qualify.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { collectGarbage, collectGarbagePlain, GarbageAfterSync } from '../../src/sync/memory.ts';

test('collectGarbage runs a full collection without --expose-gc: unreachable garbage is gone after it', () => {
  assert.equal(typeof (globalThis as { gc?: unknown }).gc, 'undefined', 'this test runs without --expose-gc');
  let garbage: number[][] | null = Array.from({ length: 200 }, () => new Array<number>(50_000).fill(1.5));
  const withGarbage = process.memoryUsage().heapUsed;
  garbage = null;
  assert.equal(garbage, null);
  assert.equal(collectGarbage(), true);
  const after = process.memoryUsage().heapUsed;
  // 200 × 50,000 doubles = 80 MB; the collection must free most of it
  assert.ok(withGarbage - after > 40 * 2 ** 20, `freed ${((withGarbage - after) / 2 ** 20).toFixed(1)} MiB`);
});

test('GarbageAfterSync: only successful full syncs of a big ruleset, at most once per interval', () => {
  let now = 0;
  let collections = 0;
  const g = new GarbageAfterSync({ minRules: 1000, minIntervalMs: 60_000, now: () => now, collect: () => (collections++, true) });
  assert.equal(g.afterSync({ ok: true, full: false, rulesTotal: 5000 }), false, 'a partial sync');
  assert.equal(g.afterSync({ ok: false, full: true, rulesTotal: 5000 }), false, 'a failed sync');
  assert.equal(g.afterSync({ ok: true, full: true, rulesTotal: 999 }), false, 'a small ruleset');
  assert.equal(g.afterSync({ ok: true, full: true }), false, 'no stats');
  assert.equal(collections, 0);
  assert.equal(g.afterSync({ ok: true, full: true, rulesTotal: 5000 }), true);
  now += 59_999;
  assert.equal(g.afterSync({ ok: true, full: true, rulesTotal: 5000 }), false, 'within the interval');
  now += 1;
  assert.equal(g.afterSync({ ok: true, full: true, rulesTotal: 5000 }), true);
  assert.equal(collections, 2);
});

test('GarbageAfterSync.afterLoad: a plain collection once a big state has been loaded, none for a small one', () => {
  let plain = 0;
  let compacting = 0;
  const g = new GarbageAfterSync({ minObjects: 100, collect: () => (compacting++, true), collectPlain: () => (plain++, true) });
  assert.equal(g.afterLoad(99), false, 'a small state');
  assert.equal(plain, 0);
  assert.equal(g.afterLoad(100), true);
  assert.equal(plain, 1);
  assert.equal(compacting, 0, 'the load is followed by a plain collection, not a compacting one');
});

test('collectGarbagePlain frees unreachable garbage without --expose-gc', () => {
  let garbage: number[][] | null = Array.from({ length: 200 }, () => new Array<number>(50_000).fill(2.5));
  const withGarbage = process.memoryUsage().heapUsed;
  garbage = null;
  assert.equal(garbage, null);
  assert.equal(collectGarbagePlain(), true);
  const after = process.memoryUsage().heapUsed;
  assert.ok(withGarbage - after > 40 * 2 ** 20, `freed ${((withGarbage - after) / 2 ** 20).toFixed(1)} MiB`);
});
