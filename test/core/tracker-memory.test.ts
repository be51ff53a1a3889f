// What the trackers and the state keep per endpoint: at 10,000 Services × 5 endpoints the node
// view is one of the big parts of a node's memory (bench/memory.ts). The bound pins the compact
// forms (ServicePorts with their fields inside one hidden class, shared empty lists, no Map per
// Service or slice, arrays at their exact length): losing one of them costs 25–60 bytes per
// endpoint at this size (~420 with all of them, 578 with none), above the margin.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { collectGarbage } from '../../src/sync/memory.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';

const SERVICES = 4000;
const ENDPOINTS = 5;

function service(i: number): K8sService {
  const ip = `172.30.${i >> 8}.${i & 255}`;
  return {
    apiVersion: 'v1', kind: 'Service',
    metadata: { name: `svc-${i}`, namespace: 'bench' },
    spec: { type: 'NodePort', clusterIP: ip, clusterIPs: [ip], ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30000 + (i % 2000) }] },
  };
}

function slice(i: number): K8sEndpointSlice {
  return {
    apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', addressType: 'IPv4',
    metadata: { name: `svc-${i}-abcde`, namespace: 'bench', labels: { 'kubernetes.io/service-name': `svc-${i}` } },
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: Array.from({ length: ENDPOINTS }, (_, k) => ({
      addresses: [`10.${180 + (k >> 1)}.${i >> 8}.${(i & 255) ^ (k & 1 ? 255 : 0)}`],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: `node-${i % 50}`,
    })),
  };
}

function heap(): number {
  assert.ok(collectGarbage(), 'a collection is available');
  collectGarbage();
  return process.memoryUsage().heapUsed;
}

test(`the trackers and the state keep under 445 bytes per endpoint at ${SERVICES} Services × ${ENDPOINTS} endpoints`, (ctx) => {
  const before = heap();
  const t = new ProxyStateTracker(4, 'node-1');
  for (let i = 0; i < SERVICES; i++) {
    // each object as a source delivers it: fresh strings, dropped after the call
    t.services.update(null, JSON.parse(JSON.stringify(service(i))));
    t.endpoints.update(null, JSON.parse(JSON.stringify(slice(i))));
  }
  t.apply();
  const perEndpoint = (heap() - before) / (SERVICES * ENDPOINTS);
  assert.equal(t.state.services.size, SERVICES);
  assert.equal([...t.state.endpoints.values()].reduce((n, l) => n + l.length, 0), SERVICES * ENDPOINTS);
  assert.ok(perEndpoint < 445, `${perEndpoint.toFixed(0)} bytes per endpoint`);
  ctx.diagnostic(`${perEndpoint.toFixed(0)} bytes per endpoint`);
});
