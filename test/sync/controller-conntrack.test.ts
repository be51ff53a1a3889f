// The controller clears stale UDP/SCTP conntrack flows through an injected cleaner
// after each family's successful sync: the node view's staleFlows, relative to the family's
// last view; a failed sync clears nothing; a cleaner that fails does not fail the sync; the
// counts reach the reconciler metrics. No kernel: fake source, proxier and cleaner.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyController } from '../../src/sync/controller.ts';
import { Metrics } from '../../src/server/servers.ts';
import type { ModeModule, Proxier } from '../../src/modes/types.ts';
import type { PlanInput, StaleFlow } from '../../src/core/nodeview.ts';
import type { Source, SourceHandler } from '../../src/sources/types.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import type { StaleFlowCleaner } from '../../src/kernel/conntrack.ts';
import { waitFor } from '../support/wait.ts';
import { makeService, makeSlice } from '../support/builders.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
const svc = makeService('t', 'dns', { clusterIP: '172.30.0.53', ports: [{ name: 'dns', port: 53, protocol: 'UDP' }] });
const slice = (ip: string) => makeSlice('t', 'dns', { endpoints: [{ ip }], ports: [{ name: 'dns', port: 5353, protocol: 'UDP' }] });

test('controller: stale flows of each successful sync go to the cleaner; failures change nothing', async () => {
  let handler: SourceHandler | null = null;
  const source: Source = { start: async (h) => void (handler = h), stop: async () => {}, health: () => ({ synced: true, connected: true, lastContactMs: Date.now() }) };
  let failNext = false;
  const proxier: Proxier = {
    async sync(input: PlanInput) {
      if (failNext) {
        failNext = false;
        throw new Error('restore refused');
      }
      return { rulesWritten: 1, rulesTotal: 1 };
    },
    dump: () => '',
    stop: async () => {},
  } as unknown as Proxier;
  const mode: ModeModule = { name: 'iptables', render: () => '', cleanup: async () => {}, createProxier: async () => proxier } as unknown as ModeModule;
  const cleaned: Array<{ family: 4 | 6; flows: StaleFlow[] }> = [];
  let cleanerFails = false;
  const cleaner: StaleFlowCleaner = {
    async clean(family, flows) {
      cleaned.push({ family, flows });
      if (cleanerFails) throw new Error('boom');
      return { deleted: flows.length, failed: 0, durationMs: 1 };
    },
  };
  const runner = { run: async () => ({ code: 0, stdout: '0\n', stderr: '' }) } as unknown as CommandRunner;
  const log = pino({ level: 'silent' });
  const ctrl = new ProxyController({
    config: { ...resolveConfig({ mode: 'iptables' }), minSyncPeriodMs: 5 }, nodeName: 'node-a', mode, allModes: { iptables: mode } as any, source, sourceName: 'test',
    runner, log, skipCleanup: true, nodeIPs: () => ['192.168.0.2'], families: [4], healthTimeoutMs: 60_000, backoffInitialMs: 20, backoffMaxMs: 50, conntrack: cleaner,
  });
  const metrics = new Metrics();
  ctrl.onSync((r) => metrics.record(r, 1));
  await ctrl.start();
  try {
    const h = handler!;
    h.onService(null, svc);
    h.onSynced();
    await waitFor('first sync', () => ctrl.history.some((x) => x.ok), 20_000);
    // no previous view: a UDP service without endpoints has every flow to it cleared, as
    // upstream's CleanStaleEntries reconciles it with an empty endpoint set (kubernetes#139629)
    await waitFor('cleaned after the first sync', () => cleaned.length === 1, 20_000);
    assert.deepEqual(cleaned[0], { family: 4, flows: [{ kind: 'service', protocol: 'UDP', ip: '172.30.0.53', port: 53 }] });

    // first endpoint: flows to the ClusterIP are stale (they were rejected while it had none)
    h.onEndpointSlice(null, slice('10.180.0.1'));
    await waitFor('cleaned after the first endpoint', () => cleaned.length === 2, 20_000);
    assert.deepEqual(cleaned[1], { family: 4, flows: [{ kind: 'service', protocol: 'UDP', ip: '172.30.0.53', port: 53 }] });

    // a failed sync clears nothing; its retry (relative to the last successful view) does
    failNext = true;
    h.onEndpointSlice(slice('10.180.0.1'), slice('10.180.0.2'));
    await waitFor('the retry synced', () => ctrl.history.filter((x) => x.ok).length >= 3, 20_000);
    assert.equal(cleaned.length, 3);
    assert.ok(ctrl.history.some((x) => !x.ok));
    assert.deepEqual(cleaned[2].flows, [{ kind: 'endpoint', protocol: 'UDP', serviceIP: '172.30.0.53', port: 53, endpointIP: '10.180.0.1', endpointPort: 5353 }]);
    const last = ctrl.history.filter((x) => x.ok).at(-1)!;
    assert.deepEqual(last.families![0].conntrack, { deleted: 1, failed: 0, durationMs: 1 });

    // a cleaner that throws does not fail the sync
    cleanerFails = true;
    h.onEndpointSlice(slice('10.180.0.2'), slice('10.180.0.3'));
    await waitFor('cleaned again', () => cleaned.length === 4, 20_000);
    await waitFor('synced ok', () => ctrl.history.at(-1)!.ok, 20_000);
    const text = await metrics.registry.metrics();
    assert.match(text, /kubeproxy_conntrack_reconciler_deleted_entries_total\{ip_family="IPv4"\} 3/);
    assert.match(text, /kubeproxy_conntrack_reconciler_sync_duration_seconds_count\{ip_family="IPv4"\} 3/);
  } finally {
    await ctrl.stop();
  }
});
