// Peak memory (src/sync/memory.ts): the heap's growth is bounded, the collection really runs
// without --expose-gc, and only after the loads and syncs that qualify.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { boundHeapGrowth, collectGarbage, GarbageAfterSync, HEAP_GROWING_PERCENT } from '../../src/sync/memory.ts';

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

test('GarbageAfterSync.afterLoad: a collection once a big state has been loaded, none for a small one', () => {
  let collections = 0;
  const g = new GarbageAfterSync({ minObjects: 100, collect: () => (collections++, true) });
  assert.equal(g.afterLoad(99), false, 'a small state');
  assert.equal(collections, 0);
  assert.equal(g.afterLoad(100), true);
  assert.equal(collections, 1);
});

test('boundHeapGrowth keeps the heap near what survives: a burst of garbage over a kept set peaks lower', () => {
  // In a child each, bounded and unbounded, side by side: the flag is process-wide.
  // a kept set, then batches that live long enough to be promoted and are dropped (a load)
  const burst = `
    const v8 = require('node:v8');
    if (process.argv[1] === 'bound') v8.setFlagsFromString('--heap-growing-percent=${HEAP_GROWING_PERCENT}');
    const make = (n, tag) => { const a = []; for (let i = 0; i < n; i++) a.push({ a: tag + i, b: [i, i + 1, i + 2] }); return a; };
    const kept = make(400000, 'kept-');
    let peak = 0;
    for (let r = 0; r < 12; r++) {
      const batch = make(200000, 'garbage-' + r + '-');
      peak = Math.max(peak, process.memoryUsage().heapTotal);
      if (batch.length !== 200000) throw new Error('lost a batch');
    }
    process.stdout.write(String(kept.length && peak));`;
  const peak = (arg: string) => Number(spawnSync(process.execPath, ['-e', burst, arg], { encoding: 'utf8', timeout: 60_000 }).stdout);
  const bound = peak('bound');
  const free = peak('free');
  assert.ok(bound > 0 && free > 0, `peaks ${bound} / ${free}`);
  assert.ok(bound < free * 0.75, `bounded heap peak ${(bound / 2 ** 20).toFixed(0)} MiB, unbounded ${(free / 2 ** 20).toFixed(0)} MiB`);
  assert.equal(boundHeapGrowth(), true, 'this runtime takes the flag');
});
