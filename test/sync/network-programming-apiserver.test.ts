// The last-change-trigger-time annotation comes through the Kubernetes source (the test API
// server speaking list/watch) into kubeproxy_network_programming_duration_seconds: what the
// event-to-kernel benchmarks read. Fake proxier, no kernel.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyController } from '../../src/sync/controller.ts';
import { Metrics } from '../../src/server/servers.ts';
import { createKubernetesSource } from '../../src/sources/kubernetes.ts';
import { silentLogger } from '../../src/log.ts';
import type { ModeModule, Proxier } from '../../src/modes/types.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import { TestApiServer, tempDir } from '../support/apiserver.ts';
import { slice, svc } from '../sources/k8s-fixtures.ts';
import { waitFor } from '../support/wait.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
test('a slice update from the API server with a trigger time is observed once its sync succeeds', async () => {
  const tmp = tempDir('kpt-npl-');
  const server = await TestApiServer.start();
  const log = silentLogger();
  const source = createKubernetesSource({ kubeconfig: server.writeKubeconfig(join(tmp.dir, 'kubeconfig')), nodeName: 'node-a', log, backoff: { initialMs: 50, maxMs: 400, jitter: 0 } });
  const proxier = { sync: async () => ({ rulesWritten: 1, rulesTotal: 1 }), dump: () => '', stop: async () => {} } as unknown as Proxier;
  const mode = { name: 'iptables', render: () => '', cleanup: async () => {}, createProxier: async () => proxier } as unknown as ModeModule;
  const runner = { run: async () => ({ code: 0, stdout: '0\n', stderr: '' }) } as unknown as CommandRunner;
  server.create('services', svc('web'));
  server.create('endpointslices', slice('web-1', 'web', ['10.180.0.1']));
  const ctrl = new ProxyController({
    config: { ...resolveConfig({ mode: 'iptables' }), minSyncPeriodMs: 5 }, nodeName: 'node-a', mode, allModes: { iptables: mode } as any, source,
    sourceName: 'kubernetes', runner, log, skipCleanup: true, nodeIPs: () => ['192.168.0.2'], families: [4], healthTimeoutMs: 60_000,
  });
  const metrics = new Metrics({ mode: 'iptables', processMetrics: false });
  metrics.attach(ctrl);
  const startedAt = Date.now();
  try {
    await ctrl.start();
    await waitFor('first sync', () => ctrl.history.some((r) => r.ok), 20_000);
    // a trigger time after kproxy started, 0.8 s before the update reaches it
    await new Promise((r) => setTimeout(r, Math.max(0, startedAt + 1000 - Date.now())));
    const triggered = new Date(Date.now() - 800).toISOString();
    const updated = slice('web-1', 'web', ['10.180.0.2']);
    updated.metadata!.annotations = { 'endpoints.kubernetes.io/last-change-trigger-time': triggered };
    server.update('endpointslices', updated);
    await waitFor('the programming sync', () => ctrl.history.some((r) => r.families?.[0]?.networkProgrammingSeconds), 20_000);
    const text = await metrics.registry.metrics();
    assert.match(text, /^kubeproxy_network_programming_duration_seconds_count\{ip_family="IPv4"\} 1$/m);
    const sum = Number(/^kubeproxy_network_programming_duration_seconds_sum\{ip_family="IPv4"\} (\S+)$/m.exec(text)?.[1]);
    assert.ok(sum >= 0.8 && sum < 60, `latency ${sum}s`);
    // the listed slice and its update (a relist after a cut watch may deliver more)
    assert.ok(Number(/^kubeproxy_sync_proxy_rules_endpoint_changes_total (\S+)$/m.exec(text)?.[1]) >= 2);
  } finally {
    await ctrl.stop();
    await server.close();
    tmp.cleanup();
  }
});
