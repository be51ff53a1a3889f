// `render`/`trace` build their state through the same boundary as `run`: hostile objects in a
// manifests directory are skipped, the good Service renders, and a loopback ClusterIP (which the
// API server accepts: IsValidIP only) keeps its Service but never reaches an nftables rule (it
// would reject localhost on every port).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { planFromManifests } from '../../src/cli/state.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { modes } from '../../src/modes/registry.ts';

const MANIFESTS = `
apiVersion: v1
kind: Service
metadata: {name: good, namespace: ns1}
spec: {clusterIP: 172.30.0.1, ports: [{name: http, port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: lo, namespace: ns1}
spec: {clusterIP: 127.0.0.1, ports: [{name: http, port: 81}]}
---
apiVersion: v1
kind: Service
metadata: {name: any, namespace: ns1}
spec: {clusterIP: 0.0.0.0, ports: [{name: http, port: 82}]}
---
apiVersion: v1
kind: Service
metadata: {name: typed, namespace: ns1, labels: s}
spec: {clusterIP: 172.30.0.3, clusterIPs: x, ports: 5}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: good-1, namespace: ns1, labels: {kubernetes.io/service-name: good}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.180.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: good-2, namespace: ns1, labels: {kubernetes.io/service-name: good}}
addressType: IPv4
endpoints: [null]
---
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: zone-a}
`;

test('render skips hostile objects; a loopback or unspecified ClusterIP keeps its Service and reaches no nftables rule', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpa-render-'));
  try {
    writeFileSync(join(dir, 'all.yaml'), MANIFESTS);
    const cfg = resolveConfig({ mode: 'nftables' });
    const input = await planFromManifests(dir, cfg, 'node-a', '192.168.0.2', () => {});
    assert.deepEqual([...input.state.services.keys()].sort(), ['ns1/any:http', 'ns1/good:http', 'ns1/lo:http']);
    assert.deepEqual(input.state.endpoints.get('ns1/good:http')?.map((e) => e.key), ['10.180.0.1:8080']);
    assert.deepEqual(input.node.nodeLabels, {});
    const text = modes.nftables.render(input);
    assert.match(text, /172\.30\.0\.1/);
    assert.doesNotMatch(text, /127\.0\.0\.1|0\.0\.0\.0/);
    // the userspace mode listens on loopback VIPs itself (the standalone demo): accepted there
    const us = await planFromManifests(dir, resolveConfig({ mode: 'userspace' }), 'node-a', '192.168.0.2', () => {});
    assert.deepEqual([...us.state.services.keys()].sort(), ['ns1/any:http', 'ns1/good:http', 'ns1/lo:http']);
    assert.match(modes.userspace.render(us), /127\.0\.0\.1/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the examples stay valid: examples/cluster in every kernel mode, the loopback demo in userspace', async () => {
  const root = join(import.meta.dirname, '../..');
  const captured: string[] = [];
  const capture = (s: string) => void captured.push(s);
  for (const m of ['iptables', 'nftables', 'ipvs'] as const) {
    const input = await planFromManifests(join(root, 'examples/cluster'), resolveConfig({ mode: m }), 'node-a', '192.168.0.2', capture);
    assert.deepEqual([...input.state.services.keys()].sort(), ['demo/dns:dns', 'demo/web:http'], m);
  }
  const demo = await planFromManifests(join(root, 'examples/manifests'), resolveConfig({ mode: 'userspace' }), 'node-a', '192.168.0.2', capture);
  assert.deepEqual([...demo.state.services.keys()].sort(), ['demo/echo:dns', 'demo/web:http']);
  assert.deepEqual(captured, [], 'no warnings');
});
