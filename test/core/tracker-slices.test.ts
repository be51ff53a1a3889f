// The endpoints tracker keeps each slice's own endpoints, not the slice (memory), and merges
// a Service's slices itself: after any sequence of slice changes (several slices per Service,
// the same address in two slices, local and remote copies, ports only some slices have, a
// change of the node's name) the state must be exactly endpointsOfSlices of the slices the
// Service has now, as it was computed before.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { endpointsOfSlices } from '../../src/core/convert.ts';
import { type K8sEndpointSlice } from '../../src/core/api.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { rng } from '../support/rng.ts';


test('400 seeded random slice changes: the state is endpointsOfSlices of the current slices', () => {
  const r = rng(4242);
  let node = 'node-a';
  const t = new ProxyStateTracker(4, node);
  /** slice "ns/name" → the slice as last given */
  const live = new Map<string, K8sEndpointSlice>();
  const pick = <T>(xs: T[]) => xs[Math.floor(r() * xs.length)];
  for (let step = 0; step < 400; step++) {
    const svc = `svc${Math.floor(r() * 4)}`;
    const name = `${svc}-${pick(['a', 'b', 'c', 'a-1'])}`;
    const id = `ns1/${name}`;
    if (r() < 0.2 && live.has(id)) {
      t.endpoints.update(live.get(id)!, null);
      live.delete(id);
    } else if (r() < 0.05) {
      node = pick(['node-a', 'node-b', 'node-c']);
      t.endpoints.setNodeName(node);
    } else {
      // distinct addresses within a slice; the same addresses recur across slices
      const ips = [...new Set(Array.from({ length: Math.floor(r() * 4) }, () => `10.180.0.${1 + Math.floor(r() * 6)}`))];
      const s: K8sEndpointSlice = {
        apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', addressType: 'IPv4',
        metadata: { name, namespace: 'ns1', labels: { 'kubernetes.io/service-name': svc } },
        ports: r() < 0.7 ? [{ name: 'p80', port: 80, protocol: 'TCP' }] : [{ name: 'p80', port: 80, protocol: 'TCP' }, { name: 'dns', port: 53, protocol: 'UDP' }],
        endpoints: ips.map((ip) => ({ addresses: [ip], nodeName: pick(['node-a', 'node-b', 'node-c', undefined]), conditions: { ready: r() < 0.8 } })),
      };
      t.endpoints.update(live.get(id) ?? null, s);
      live.set(id, s);
    }
    t.apply();
    const want = new Map<string, unknown>();
    for (const svcName of ['svc0', 'svc1', 'svc2', 'svc3']) {
      const slices = [...live.values()].filter((s) => s.metadata!.labels!['kubernetes.io/service-name'] === svcName);
      for (const [k, eps] of endpointsOfSlices(slices, 4, node)) want.set(k, eps);
    }
    const got = new Map([...t.state.endpoints].filter(([, eps]) => eps !== undefined));
    assert.deepEqual(new Map([...got].sort()), new Map([...want].sort()), `step ${step}`);
  }
});
