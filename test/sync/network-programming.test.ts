// network_programming_duration_seconds as upstream's EndpointsChangeTracker
// measures it: the EndpointSlice's endpoints.kubernetes.io/last-change-trigger-time survives
// validation, is kept per pending change, dropped when the change turns out a no-op or the
// slice is deleted, ignored when older than the tracker, and observed when the sync that
// programs the change succeeds (a failed sync keeps it for the retry).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { lastChangeTriggerTime } from '../../src/core/convert.ts';
import { validateEndpointSlice } from '../../src/core/validate.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyController } from '../../src/sync/controller.ts';
import type { ModeModule, Proxier } from '../../src/modes/types.ts';
import type { Source, SourceHandler } from '../../src/sources/types.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import { waitFor } from '../support/wait.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
const ANN = 'endpoints.kubernetes.io/last-change-trigger-time';
const slice = (ip: string, trigger?: unknown, name = 'web-1'): any => ({
  metadata: { name, namespace: 't', labels: { 'kubernetes.io/service-name': 'web' }, ...(trigger !== undefined ? { annotations: { [ANN]: trigger, 'x.example/other': 'y' } } : {}) },
  addressType: 'IPv4',
  ports: [{ name: 'http', port: 8080 }],
  endpoints: [{ addresses: [ip] }],
});

test('the trigger-time annotation survives validation; other annotations and bad values do not', () => {
  const r = validateEndpointSlice(slice('10.180.0.1', '2026-12-03T10:00:00.123456789Z'));
  assert.ok(r.ok);
  assert.deepEqual(r.value.metadata?.annotations, { [ANN]: '2026-12-03T10:00:00.123456789Z' });
  const bad = validateEndpointSlice(slice('10.180.0.1', 42));
  assert.ok(bad.ok, 'a bad annotation never makes a slice invalid');
  assert.equal(bad.value.metadata?.annotations, undefined);
  const notObject = validateEndpointSlice({ ...slice('10.180.0.1'), metadata: { ...slice('10.180.0.1').metadata, annotations: 'x' } });
  assert.ok(notObject.ok);
});

test('lastChangeTriggerTime reads RFC 3339 with nanoseconds and offsets, and nothing else', () => {
  const t = (v: unknown) => lastChangeTriggerTime({ metadata: { annotations: { [ANN]: v as string } } });
  assert.equal(t('2026-12-03T10:00:00Z'), Date.UTC(2026, 11, 3, 10, 0, 0));
  assert.equal(t('2026-12-03T10:00:00.123456789Z'), Date.UTC(2026, 11, 3, 10, 0, 0, 123));
  assert.equal(t('2026-12-03T11:00:00.5+01:00'), Date.UTC(2026, 11, 3, 10, 0, 0, 500));
  for (const bad of ['', 'yesterday', '2026-12-03', '2026-12-03 10:00:00Z', '2026-13-03T10:00:00Z', 17]) assert.equal(t(bad), null, String(bad));
  assert.equal(lastChangeTriggerTime({}), null);
});

test('tracker: a pending change keeps its trigger times until applied; no-ops and deletions drop them', () => {
  const tr = new ProxyStateTracker(4, 'node-a');
  const at = (s: number) => new Date(Date.UTC(2026, 11, 3, 10, 0, s)).toISOString();
  assert.ok(tr.endpoints.update(null, slice('10.180.0.1', at(1))));
  assert.ok(tr.endpoints.update(slice('10.180.0.1'), slice('10.180.0.2', at(2))));
  assert.deepEqual(tr.endpoints.takeTriggerTimes(), [], 'nothing applied yet');
  tr.apply();
  assert.deepEqual(tr.endpoints.takeTriggerTimes(), [Date.UTC(2026, 11, 3, 10, 0, 1), Date.UTC(2026, 11, 3, 10, 0, 2)]);
  assert.deepEqual(tr.endpoints.takeTriggerTimes(), [], 'each time is returned once');

  // a change that ends where it started programs nothing: its times go
  tr.endpoints.update(slice('10.180.0.2'), slice('10.180.0.3', at(3)));
  tr.endpoints.update(slice('10.180.0.3'), slice('10.180.0.2', at(4)));
  tr.apply();
  assert.deepEqual(tr.endpoints.takeTriggerTimes(), []);
  // an annotation-only update is no change at all
  assert.equal(tr.endpoints.update(slice('10.180.0.2'), slice('10.180.0.2', at(5))), false);
  tr.apply();
  assert.deepEqual(tr.endpoints.takeTriggerTimes(), []);

  // a deletion's annotation is that of the slice's last update, not the deletion's: dropped (upstream)
  tr.endpoints.update(slice('10.180.0.2'), slice('10.180.0.4', at(6)));
  tr.endpoints.update(slice('10.180.0.4', at(6)), null);
  tr.apply();
  assert.deepEqual(tr.endpoints.takeTriggerTimes(), []);
});

test('controller: latencies are observed when the programming sync succeeds, kept over a failure, older triggers ignored', async () => {
  let handler: SourceHandler | null = null;
  const source: Source = { start: async (h) => void (handler = h), stop: async () => {}, health: () => ({ synced: true, connected: true, lastContactMs: Date.now() }) };
  let fail = false;
  const proxier = {
    async sync() {
      if (fail) {
        fail = false;
        throw Object.assign(new Error('restore refused'), { code: 'KPROXY_IPTABLES_RESTORE_FAILED' });
      }
      return { rulesWritten: 1, rulesTotal: 1 };
    },
    dump: () => '',
    stop: async () => {},
  } as unknown as Proxier;
  const mode = { name: 'iptables', render: () => '', cleanup: async () => {}, createProxier: async () => proxier } as unknown as ModeModule;
  const runner = { run: async () => ({ code: 0, stdout: '0\n', stderr: '' }) } as unknown as CommandRunner;
  // a wall clock the test moves: kproxy "started" at T
  const T = Date.UTC(2026, 11, 3, 10, 0, 0);
  let now = T;
  const ctrl = new ProxyController({
    config: { ...resolveConfig({ mode: 'iptables' }), minSyncPeriodMs: 5 }, nodeName: 'node-a', mode, allModes: { iptables: mode } as any, source,
    runner, log: pino({ level: 'silent' }), skipCleanup: true, nodeIPs: () => ['192.168.0.2'], families: [4],
    healthTimeoutMs: 60_000, backoffInitialMs: 20, backoffMaxMs: 50, now: () => now,
  });
  await ctrl.start();
  try {
    const h = handler!;
    h.onService(null, { metadata: { name: 'web', namespace: 't' }, spec: { clusterIP: '172.30.0.10', ports: [{ name: 'http', port: 80 }] } });
    // listed at start: a change from before kproxy started is not a programming delay
    h.onEndpointSlice(null, slice('10.180.0.1', new Date(T - 60_000).toISOString()));
    h.onSynced();
    const okSyncs = () => ctrl.history.filter((r) => r.ok);
    await waitFor('the first sync', () => okSyncs().length >= 1, 20_000);
    assert.equal(okSyncs()[0].families![0].networkProgrammingSeconds, undefined);

    fail = true;
    now = T + 10_000;
    h.onEndpointSlice(slice('10.180.0.1'), slice('10.180.0.2', new Date(T + 7_000).toISOString(), 'web-1'));
    await waitFor('the retry', () => okSyncs().length >= 2, 20_000);
    const failed = ctrl.history.find((r) => !r.ok)!;
    assert.equal(failed.families![0].networkProgrammingSeconds, undefined, 'nothing programmed by the failed sync');
    assert.equal(failed.families![0].errorCode, 'KPROXY_IPTABLES_RESTORE_FAILED');
    assert.deepEqual(okSyncs()[1].families![0].networkProgrammingSeconds, [3], 'measured at the retry that programmed it');
  } finally {
    await ctrl.stop();
  }
});
