// Unit tests for src/sync/loop.ts driven by an injected fake clock: coalescing, the first sync
// full, periodic partial syncs with an hourly full one, back-off after failures (and a full sync after one), no overlap.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FULL_SYNC_PERIOD_MS, SyncLoop, type Clock, type SyncLoopOptions } from '../../src/sync/loop.ts';

/** Lets promise continuations and the loop's async steps run. */
async function flush(): Promise<void> {
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
}

/** A clock whose time moves only when the test says so; timers fire in time order. */
class FakeClock implements Clock {
  // Not zero: a real clock is far from the epoch, and "since the last full sync" must not
  // be small by accident at start.
  t = 1_700_000_000_000;
  private nextId = 0;
  private readonly timers = new Map<number, { at: number; fn: () => void; seq: number }>();

  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this.nextId;
    this.timers.set(id, { at: this.t + Math.max(0, ms), fn, seq: id });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers.delete(h as number);
  }
  pending(): number {
    return this.timers.size;
  }

  /** Moves time forward by ms, firing due timers in order. Bounded: a tight loop fails the test. */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    await flush();
    for (let fired = 0; ; fired++) {
      if (fired > 5000) throw new Error(`more than 5000 timers fired within ${ms} ms: a tight loop`);
      let next: [number, { at: number; fn: () => void; seq: number }] | undefined;
      for (const e of this.timers) {
        if (e[1].at > end) continue;
        if (!next || e[1].at < next[1].at || (e[1].at === next[1].at && e[1].seq < next[1].seq)) next = e;
      }
      if (!next) break;
      this.timers.delete(next[0]);
      this.t = next[1].at;
      next[1].fn();
      await flush();
    }
    this.t = end;
    await flush();
  }
}

interface SyncRecord {
  full: boolean;
  start: number;
  end: number;
  ok: boolean;
}

/** A sync that takes `durationMs` of fake time and fails while `failing` says so. */
function harness(opts: Partial<SyncLoopOptions> & { durationMs?: number } = {}) {
  const clock = new FakeClock();
  const records: SyncRecord[] = [];
  let active = 0;
  let maxActive = 0;
  const ctl = { failing: false, durationMs: opts.durationMs ?? 0 };
  const sync = async (full: boolean): Promise<void> => {
    active++;
    maxActive = Math.max(maxActive, active);
    const rec: SyncRecord = { full, start: clock.now(), end: -1, ok: false };
    records.push(rec);
    try {
      if (ctl.durationMs > 0) await new Promise<void>((r) => clock.setTimeout(r, ctl.durationMs));
      if (ctl.failing) throw new Error('KPROXY_TEST_FAIL: injected failure');
      rec.ok = true;
    } finally {
      rec.end = clock.now();
      active--;
    }
  };
  const errors: Array<{ attempt: number; retryInMs: number }> = [];
  const loop = new SyncLoop({
    minSyncPeriodMs: 1000,
    syncPeriodMs: 30_000,
    backoffInitialMs: 1000,
    backoffMaxMs: 8000,
    sync,
    clock,
    onError: (_e, attempt, retryInMs) => errors.push({ attempt, retryInMs }),
    ...opts,
  });
  return { clock, records, loop, ctl, errors, maxActive: () => maxActive };
}

test('the first sync runs at once and is full', async () => {
  const h = harness();
  h.loop.start();
  await h.clock.advance(0);
  assert.equal(h.records.length, 1);
  assert.equal(h.records[0].full, true);
  assert.equal(h.loop.status.syncs, 1);
  assert.equal(h.loop.status.lastFullSyncAt, h.clock.t);
  await h.loop.stop();
});

test('a burst of 10 requests is coalesced into 1-2 partial syncs, none closer than minSyncPeriod', async () => {
  const h = harness();
  h.loop.start();
  await h.clock.advance(0);
  await h.clock.advance(5000);
  const before = h.records.length;
  for (let i = 0; i < 10; i++) {
    h.loop.request();
    await h.clock.advance(50);
  }
  await h.clock.advance(2000);
  const burst = h.records.slice(before);
  assert.ok(burst.length >= 1 && burst.length <= 2, `10 requests gave ${burst.length} syncs`);
  assert.ok(burst.every((r) => !r.full), 'syncs for changes are partial');
  for (let i = 1; i < h.records.length; i++) {
    assert.ok(h.records[i].start - h.records[i - 1].start >= 1000, 'no two syncs closer than minSyncPeriod');
  }
  assert.equal(h.loop.status.pendingSince, 0, 'nothing left pending');
  await h.loop.stop();
});

test('a request right after a sync waits for minSyncPeriod', async () => {
  const h = harness();
  h.loop.start();
  await h.clock.advance(0);
  const t0 = h.records[0].start;
  h.loop.request();
  await h.clock.advance(999);
  assert.equal(h.records.length, 1, 'not before minSyncPeriod');
  await h.clock.advance(1);
  assert.equal(h.records.length, 2);
  assert.equal(h.records[1].start - t0, 1000);
  assert.equal(h.records[1].full, false);
  await h.loop.stop();
});

test('with no changes a partial sync runs every syncPeriod; a full one only hourly (upstream FullSyncPeriod)', async () => {
  const h = harness();
  h.loop.start();
  await h.clock.advance(0);
  const t0 = h.clock.t;
  await h.clock.advance(95_000);
  assert.deepEqual(
    h.records.map((r) => [r.start - t0, r.full]),
    [
      [0, true],
      [30_000, false],
      [60_000, false],
      [90_000, false],
    ],
  );
  // an hour after the first full sync, the periodic sync is a full one, and only that one
  await h.clock.advance(FULL_SYNC_PERIOD_MS - 95_000 + 30_000);
  const full = h.records.filter((r) => r.full).map((r) => r.start - t0);
  assert.deepEqual(full, [0, FULL_SYNC_PERIOD_MS]);
  assert.equal(h.records.length, 1 + FULL_SYNC_PERIOD_MS / 30_000 + 1);
  assert.equal(h.loop.status.lastFullSyncAt - t0, FULL_SYNC_PERIOD_MS);
  await h.loop.stop();
});

test('the periodic sync comes syncPeriod after the last sync of any kind (changes postpone it)', async () => {
  const h = harness();
  h.loop.start();
  await h.clock.advance(0);
  const t0 = h.clock.t;
  await h.clock.advance(5000);
  h.loop.request();
  await h.clock.advance(2000);
  h.loop.request();
  await h.clock.advance(40_000);
  assert.deepEqual(
    h.records.map((r) => [r.start - t0, r.full]),
    [
      [0, true],
      [5000, false],
      [7000, false],
      [37_000, false],
    ],
  );
  await h.loop.stop();
});

test('a sync slower than syncPeriod is not followed by a periodic one at once (upstream resets the timer after each run)', async () => {
  const h = harness({ durationMs: 40_000 });
  h.loop.start();
  await h.clock.advance(0);
  const t0 = h.clock.t;
  await h.clock.advance(185_000);
  assert.deepEqual(
    h.records.map((r) => [r.start - t0, r.end - t0]),
    [
      [0, 40_000],
      [70_000, 110_000],
      [140_000, 180_000],
    ],
  );
  await h.loop.stop();
});

test('fullSyncPeriodMs sets how often the forced full sync comes', async () => {
  const h = harness({ fullSyncPeriodMs: 90_000 });
  h.loop.start();
  await h.clock.advance(0);
  const t0 = h.clock.t;
  await h.clock.advance(185_000);
  assert.deepEqual(
    h.records.filter((r) => r.full).map((r) => r.start - t0),
    [0, 90_000, 180_000],
  );
  await h.loop.stop();
});

test('requestFull makes the next sync full', async () => {
  const h = harness();
  h.loop.start();
  await h.clock.advance(0);
  h.loop.requestFull();
  await h.clock.advance(1000);
  assert.deepEqual(h.records.map((r) => r.full), [true, true]);
  h.loop.request();
  await h.clock.advance(1000);
  assert.deepEqual(h.records.map((r) => r.full), [true, true, false]);
  await h.loop.stop();
});

test('failures retry with exponential back-off capped at backoffMaxMs; the sync after a failure is full', async () => {
  const h = harness();
  h.loop.start();
  await h.clock.advance(0);
  await h.clock.advance(5000);
  h.ctl.failing = true;
  h.loop.request(); // a partial sync that fails
  await h.clock.advance(40_000);
  const failed = h.records.filter((r) => !r.ok);
  assert.ok(failed.length >= 6, `expected several retries, got ${failed.length}`);
  assert.equal(failed[0].full, false, 'the first failing sync was a partial one');
  assert.ok(failed.slice(1).every((r) => r.full), 'every retry after a failure is full');
  const gaps = failed.slice(1).map((r, i) => r.start - failed[i].start);
  assert.deepEqual(gaps.slice(0, 5), [1000, 2000, 4000, 8000, 8000]);
  assert.ok(gaps.every((g) => g <= 8000 && g >= 1000), `gaps ${gaps.join(',')}`);
  assert.deepEqual(
    h.errors.slice(0, 5).map((e) => [e.attempt, e.retryInMs]),
    [
      [1, 1000],
      [2, 2000],
      [3, 4000],
      [4, 8000],
      [5, 8000],
    ],
  );
  assert.equal(h.loop.status.consecutiveFailures, failed.length);
  assert.match(h.loop.status.lastError ?? '', /injected failure/);

  // recovery: the next attempt succeeds, is full, and resets the back-off
  h.ctl.failing = false;
  await h.clock.advance(8000);
  const last = h.records[h.records.length - 1];
  assert.equal(last.ok, true);
  assert.equal(last.full, true);
  assert.equal(h.loop.status.consecutiveFailures, 0);
  assert.equal(h.loop.status.lastError, undefined);
  const n = h.records.length;
  h.loop.request();
  await h.clock.advance(1000);
  assert.equal(h.records.length, n + 1, 'after recovery a change syncs after minSyncPeriod again');
  assert.equal(h.records[n].full, false);
  await h.loop.stop();
});

test('a failing first sync backs off too (no tight retry loop when no full sync ever succeeded)', async () => {
  const h = harness({ syncPeriodMs: 5000, backoffInitialMs: 1000, backoffMaxMs: 4000 });
  h.ctl.failing = true;
  h.loop.start();
  await h.clock.advance(20_000);
  const starts = h.records.map((r) => r.start - h.records[0].start);
  assert.deepEqual(starts.slice(0, 5), [0, 1000, 3000, 7000, 11_000]);
  assert.ok(h.records.length <= 7, `${h.records.length} attempts in 20 s`);
  await h.loop.stop();
});

test('requests during back-off do not cut the back-off short', async () => {
  const h = harness();
  h.loop.start();
  await h.clock.advance(0);
  h.ctl.failing = true;
  await h.clock.advance(30_000); // periodic sync fails at +30 s
  const failedAt = h.records[h.records.length - 1].start;
  for (let i = 0; i < 5; i++) {
    h.loop.request();
    await h.clock.advance(100);
  }
  await h.clock.advance(499);
  assert.equal(h.records[h.records.length - 1].start, failedAt, 'no sync inside the 1 s back-off');
  await h.clock.advance(1);
  assert.equal(h.records[h.records.length - 1].start, failedAt + 1000);
  await h.loop.stop();
});

test('a sync that throws synchronously counts as a failure and is retried', async () => {
  const clock = new FakeClock();
  const calls: boolean[] = [];
  let throwNow = true;
  const loop = new SyncLoop({
    minSyncPeriodMs: 100,
    syncPeriodMs: 60_000,
    backoffInitialMs: 500,
    clock,
    sync: ((full: boolean) => {
      calls.push(full);
      if (throwNow) throw new Error('sync exploded before returning a promise');
      return Promise.resolve();
    }) as (full: boolean) => Promise<void>,
  });
  loop.start();
  await clock.advance(0);
  assert.equal(loop.status.failures, 1);
  throwNow = false;
  await clock.advance(500);
  assert.deepEqual(calls, [true, true]);
  assert.equal(loop.status.consecutiveFailures, 0);
  await loop.stop();
});

test('no two syncs overlap; a change during a sync gets its own sync after it', async () => {
  const h = harness({ durationMs: 3000 });
  h.loop.start();
  await h.clock.advance(0);
  for (let i = 0; i < 20; i++) {
    h.loop.request();
    await h.clock.advance(250);
  }
  await h.clock.advance(10_000);
  assert.equal(h.maxActive(), 1);
  for (let i = 1; i < h.records.length; i++) {
    assert.ok(h.records[i].start >= h.records[i - 1].end, `sync ${i} started before sync ${i - 1} ended`);
  }
  // the last request (at ~4.75 s) came during the second sync: a sync after it covered it
  const lastRequestAt = h.records[0].start + 20 * 250 - 250;
  assert.ok(h.records.some((r) => r.start >= lastRequestAt), 'the last change was synced');
  assert.equal(h.loop.status.pendingSince, 0);
  await h.loop.stop();
});

test('stop() waits for the running sync and nothing runs afterwards', async () => {
  const h = harness({ durationMs: 1000 });
  h.loop.start();
  await h.clock.advance(0);
  const stopped = h.loop.stop();
  await h.clock.advance(1000);
  await stopped;
  assert.equal(h.records[0].end, h.records[0].start + 1000);
  const n = h.records.length;
  h.loop.request();
  await h.clock.advance(120_000);
  assert.equal(h.records.length, n);
  assert.equal(h.loop.status.running, false);
});
