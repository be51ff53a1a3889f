// The controller at the boundary: a source delivering hostile objects next
// to good ones. Nothing throws, the proxier sees only the good Service, each skip counts in
// kproxy_invalid_objects_total{kind,source}, and a repeated bad object warns once per field.
// No sockets, no kernel: a fake source and a fake mode.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyController } from '../../src/sync/controller.ts';
import { startServers } from '../../src/server/servers.ts';
import type { ModeModule, Proxier } from '../../src/modes/types.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import type { Source, SourceHandler } from '../../src/sources/types.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import { waitFor } from '../support/wait.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
const goodSvc = (name: string, ip: string): any => ({
  metadata: { name, namespace: 'ns1' },
  spec: { clusterIP: ip, ports: [{ name: 'http', port: 80 }] },
});

test('hostile objects from a source: skipped, warned once per field, counted; the good Service syncs', async () => {
  let handler: SourceHandler | null = null;
  const source: Source = {
    start: async (h) => {
      handler = h;
    },
    stop: async () => {},
    health: () => ({ synced: true, connected: true, lastContactMs: Date.now() }),
  };
  const seen: PlanInput[] = [];
  const proxier: Proxier = {
    sync: async (input) => {
      seen.push({ ...input, state: { services: new Map(input.state.services), endpoints: new Map(input.state.endpoints) } });
      return { rulesWritten: 0, rulesTotal: 0 };
    },
    dump: () => '',
    stop: async () => {},
  };
  const mode: ModeModule = { name: 'nftables', render: () => '', createProxier: async () => proxier, cleanup: async () => {} };
  const lines: any[] = [];
  const log = pino({ level: 'warn' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  const runner = { run: async () => ({ code: 0, stdout: '', stderr: '' }) } as unknown as CommandRunner;
  const config = resolveConfig({ mode: 'nftables' });
  const ctrl = new ProxyController({ config, nodeName: 'node-a', mode, allModes: { nftables: mode } as any, source, sourceName: 'test', runner, log, skipCleanup: true, nodeIPs: () => ['192.168.0.2'], healthTimeoutMs: 60_000 });
  const servers = await startServers({ ctrl, source, mode: 'nftables', log }, '', '');
  try {
    await ctrl.start();
    const h = handler!;
    const bad = { metadata: { name: 'bad', namespace: 'ns1' }, spec: { clusterIP: '172.30.0.9', ports: 5 } };
    const loopback = goodSvc('lo', '127.0.0.1');
    assert.doesNotThrow(() => {
      h.onService(null, goodSvc('good', '172.30.0.1'));
      h.onService(null, bad as any);
      h.onService(null, loopback);
      h.onService(null, 7 as any);
      h.onEndpointSlice(null, { metadata: { name: 's', namespace: 'ns1', labels: { 'kubernetes.io/service-name': 'good' } }, addressType: 'IPv4', endpoints: [null] } as any);
      h.onNode?.({ metadata: { name: 'node-a', labels: 'zone-a' as any } });
    });
    h.onSynced();
    await waitFor('first sync', () => seen.length > 0 && ctrl.history.some((r) => r.ok), 20_000);
    // a loopback ClusterIP passes the API server's validation (IsValidIP): the Service is kept,
    // and the node view leaves the address out of what any mode renders
    const last = seen[seen.length - 1];
    assert.deepEqual([...last.state.services.keys()].sort(), ['ns1/good:http', 'ns1/lo:http']);
    assert.equal(last.view?.ports.get('ns1/lo:http')?.sp.clusterIP, null);
    assert.deepEqual(last.view?.ports.get('ns1/lo:http')?.skippedVIPs.map((v) => v.ip), ['127.0.0.1']);
    assert.deepEqual(ctrl.nodeContext().nodeLabels, {}, 'an invalid Node counts as no Node');

    // the same bad object again (a source re-delivering it): counted again, not warned again
    h.onService(bad as any, structuredClone(bad) as any);
    const metrics = await servers.metrics.registry.metrics();
    const count = (kind: string) => Number(new RegExp(`^kproxy_invalid_objects_total\\{kind="${kind}",source="test"\\} (\\d+)$`, 'm').exec(metrics)?.[1] ?? 0);
    assert.equal(count('Service'), 3, metrics);
    assert.equal(count('EndpointSlice'), 1);
    assert.equal(count('Node'), 1);
    assert.deepEqual(ctrl.invalidCounts, { Service: 3, EndpointSlice: 1, Node: 1 });

    const warns = lines.filter((l) => l.kind);
    const about = (obj: string) => warns.filter((w) => w.object === obj).map((w) => w.field);
    assert.deepEqual(about('Service ns1/bad'), ['spec.ports'], 'one warning per object and field');
    assert.deepEqual(about('Service ns1/lo'), [], 'a Service the API server accepts is not invalid');
    assert.deepEqual(about('EndpointSlice ns1/s'), ['endpoints[0]']);
    assert.deepEqual(about('Node node-a'), ['metadata.labels']);
    assert.ok(warns.every((w) => typeof w.value === 'string' && w.value.length <= 101));
  } finally {
    await ctrl.stop();
    await servers.close();
  }
});
