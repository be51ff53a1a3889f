// Coalescing with real timers, through the whole controller (source → trackers → sync loop →
// proxier): every change that arrives while a sync runs goes into the NEXT single sync, not a
// queue of one-change syncs. The proxier's sync is held open until the test has sent all its
// changes (and for at least 300 ms), so "during the sync" does not depend on the machine's
// speed; the assertions count syncs and the services each one took, never durations.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyController } from '../../src/sync/controller.ts';
import type { ModeModule, Proxier } from '../../src/modes/types.ts';
import type { Source, SourceHandler } from '../../src/sources/types.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import { sleep, waitFor } from '../support/wait.ts';
import { makeService, makeSlice } from '../support/builders.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
const service = (i: number) => makeService('t', `web${i}`, { clusterIP: `172.30.0.${10 + i}`, ports: [{ name: 'http', port: 80 }] });
const slice = (i: number, ips: string[]) => makeSlice('t', `web${i}`, { endpoints: ips.map((ip) => ({ ip })), ports: [{ name: 'http', port: 8080 }] });

/**
 * A controller over a fake proxier (its sync given), with a source the test drives through
 * the returned handler (set once the controller started).
 */
function controllerWith(sync: (input: unknown, changed: Set<string>, full: boolean) => Promise<unknown>, minSyncPeriodMs: number) {
  let handler: SourceHandler | null = null;
  const source: Source = { start: async (h) => void (handler = h), stop: async () => {}, health: () => ({ synced: true, connected: true, lastContactMs: Date.now() }) };
  const proxier = { sync, dump: () => '', stop: async () => {} } as unknown as Proxier;
  const mode = { name: 'iptables', render: () => '', cleanup: async () => {}, createProxier: async () => proxier } as unknown as ModeModule;
  const runner = { run: async () => ({ code: 0, stdout: '0\n', stderr: '' }) } as unknown as CommandRunner;
  const ctrl = new ProxyController({
    config: { ...resolveConfig({ mode: 'iptables' }), minSyncPeriodMs, syncPeriodMs: 60_000 }, nodeName: 'node-a', mode, allModes: { iptables: mode } as any, source,
    runner, log: pino({ level: 'silent' }), skipCleanup: true, nodeIPs: () => ['192.168.0.2'], families: [4], healthTimeoutMs: 60_000,
  });
  return { ctrl, handler: () => handler! };
}


test('20 endpoint changes that arrive during a 300 ms sync all go into the next single sync', async () => {
  const N = 20;
  /** what each proxier sync was given: full or not, and the changed services */
  const calls: Array<{ full: boolean; changed: string[] }> = [];
  let hold: Promise<void> | null = null;
  let entered = 0;
  // upstream's default minSyncPeriod (1 s) is what the changes would wait for on a node; a
  // short one here so that, if the loop did run one sync per change, it would have the time to
  const { ctrl, handler } = controllerWith(async (_input, changed, full) => {
    calls.push({ full, changed: [...changed].sort() });
    entered++;
    if (hold) await hold;
    return { rulesWritten: changed.size, rulesTotal: N };
  }, 20);
  let release: (() => void) | undefined;
  await ctrl.start();
  try {
    const h = handler();
    for (let i = 0; i < N; i++) {
      h.onService(null, service(i));
      h.onEndpointSlice(null, slice(i, [`10.180.${i}.1`]));
    }
    h.onSynced();
    await waitFor('the first sync', () => ctrl.history.length === 1, 20_000, 5);
    assert.equal(calls[0].full, true);

    // One change starts a sync that is held open...
    hold = new Promise<void>((r) => (release = r));
    const heldSince = Date.now();
    h.onEndpointSlice(slice(0, ['10.180.0.1']), slice(0, ['10.180.0.1', '10.180.0.2']));
    await waitFor('the held sync', () => entered === 2, 20_000, 5);
    assert.deepEqual(calls[1].changed, ['t/web0']);
    // ...while 20 changes arrive, one every few ms (each one a request to the loop).
    for (let i = 0; i < N; i++) {
      h.onEndpointSlice(slice(i, i === 0 ? ['10.180.0.1', '10.180.0.2'] : [`10.180.${i}.1`]), slice(i, [`10.180.${i}.1`, `10.180.${i}.3`]));
      await sleep(3);
    }
    await sleep(Math.max(0, 300 - (Date.now() - heldSince)));
    assert.equal(entered, 2, 'no sync started while one was running');
    hold = null;
    release!();
    await waitFor('the next sync', () => ctrl.history.length === 3, 20_000, 5);
    await ctrl.loop.idle();
    // several minSyncPeriods later: nothing more comes (no queue of one-change syncs)
    await sleep(200);
    assert.equal(calls.length, 3, `syncs: ${JSON.stringify(calls.map((c) => c.changed.length))}`);
    assert.equal(calls[2].full, false);
    assert.deepEqual(calls[2].changed, Array.from({ length: N }, (_, i) => `t/web${i}`).sort(), 'the next sync took all 20 changes at once');
    assert.equal(ctrl.loop.status.pendingSince, 0);
    assert.deepEqual(ctrl.pendingChanges(), { services: 0, endpoints: 0 });
  } finally {
    release?.();
    await ctrl.stop();
  }
});

test('a change during a sync waits for minSyncPeriod after that sync started, then gets one sync', async () => {
  const starts: number[] = [];
  const { ctrl, handler } = controllerWith(async () => {
    starts.push(Date.now());
    await sleep(50);
    return { rulesWritten: 1, rulesTotal: 1 };
  }, 400);
  await ctrl.start();
  try {
    const h = handler();
    h.onService(null, service(0));
    h.onSynced();
    await waitFor('the first sync', () => ctrl.history.length === 1, 20_000, 5);
    // 10 changes in quick succession right after the first sync: one sync for all of them,
    // not before minSyncPeriod after the first one started (timers only fire late, never early)
    for (let i = 0; i < 10; i++) h.onEndpointSlice(i ? slice(0, [`10.180.0.${i}`]) : null, slice(0, [`10.180.0.${i + 1}`]));
    await waitFor('the second sync', () => ctrl.history.length === 2, 20_000, 5);
    await ctrl.loop.idle();
    await sleep(100);
    assert.equal(starts.length, 2);
    assert.ok(starts[1] - starts[0] >= 390, `the second sync started ${starts[1] - starts[0]} ms after the first`);
  } finally {
    await ctrl.stop();
  }
});
