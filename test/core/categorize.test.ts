// Unit tests for src/core/categorize.ts: upstream's TestCategorizeEndpoints table
// (kubernetes/kubernetes pkg/proxy/topology_test.go), translated to our types, plus node-hint
// (PreferSameNode) cases derived from upstream's topologyModeFromHints.
//
// Upstream distinguishes nil ("the service does not use this kind of endpoints") from an
// empty set; our Categorized always holds arrays, so `null` below means "expect an empty
// array". Cases for feature gates that are always on (ProxyTerminatingEndpoints,
// TopologyAwareHints) keep only their enabled variant.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { categorizeEndpoints } from '../../src/core/categorize.ts';
import type { Endpoint, ServicePort } from '../../src/core/model.ts';

const ZONE = 'topology.kubernetes.io/zone';
const NODE = 'node-1';

interface EpSpec {
  ep: string;
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
  isLocal?: boolean;
  zoneHints?: string[];
  nodeHints?: string[];
}

interface SvcSpec {
  internalPolicyLocal?: boolean;
  externalPolicyLocal?: boolean;
  nodePort?: number;
}

interface Case {
  name: string;
  nodeLabels?: Record<string, string>;
  svc: SvcSpec;
  endpoints: EpSpec[];
  clusterEndpoints: string[] | null;
  localEndpoints: string[] | null;
  allEndpoints?: string[];
  onlyRemoteEndpoints?: boolean;
}

function endpoint(s: EpSpec): Endpoint {
  const [ip, port] = s.ep.split(':');
  return {
    ip,
    port: Number(port),
    key: s.ep,
    isLocal: s.isLocal ?? false,
    // upstream's BaseEndpointInfo literals leave unset booleans false
    ready: s.ready ?? false,
    serving: s.serving ?? false,
    terminating: s.terminating ?? false,
    zoneHints: s.zoneHints ?? [],
    nodeHints: s.nodeHints ?? [],
  };
}

function servicePort(s: SvcSpec): ServicePort {
  return {
    key: 'ns/svc:p80',
    serviceKey: 'ns/svc',
    portName: { namespace: 'ns', name: 'svc', port: 'p80', protocol: 'TCP' },
    protocol: 'TCP',
    clusterIP: '172.30.0.41',
    port: 80,
    nodePort: s.nodePort ?? 0,
    externalIPs: [],
    loadBalancerVIPs: [],
    loadBalancerSourceRanges: [],
    stickyMaxAgeSeconds: 0,
    externalPolicyLocal: s.externalPolicyLocal ?? false,
    internalPolicyLocal: s.internalPolicyLocal ?? false,
    healthCheckNodePort: 0,
    family: 4,
  };
}

const A = ['zone-a'];
const B = ['zone-b'];
const C = ['zone-c'];

const upstreamCases: Case[] = [
  {
    name: "should use topology since all endpoints have hints, node has a zone label and and there are endpoints for the node's zone",
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', zoneHints: A, ready: true },
      { ep: '10.1.2.4:80', zoneHints: B, ready: true },
      { ep: '10.1.2.5:80', zoneHints: C, ready: true },
      { ep: '10.1.2.6:80', zoneHints: A, ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80', '10.1.2.6:80'],
    localEndpoints: null,
  },
  {
    name: 'externalTrafficPolicy: Local, topology ignored for Local endpoints',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: { externalPolicyLocal: true, nodePort: 8080 },
    endpoints: [
      { ep: '10.1.2.3:80', zoneHints: A, ready: true, isLocal: true },
      { ep: '10.1.2.4:80', zoneHints: B, ready: true, isLocal: true },
      { ep: '10.1.2.5:80', zoneHints: C, ready: true },
      { ep: '10.1.2.6:80', zoneHints: A, ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80', '10.1.2.6:80'],
    localEndpoints: ['10.1.2.3:80', '10.1.2.4:80'],
    allEndpoints: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.6:80'],
  },
  {
    name: 'internalTrafficPolicy: Local, topology ignored for Local endpoints',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: { internalPolicyLocal: true, externalPolicyLocal: false, nodePort: 8080 },
    endpoints: [
      { ep: '10.1.2.3:80', zoneHints: A, ready: true, isLocal: true },
      { ep: '10.1.2.4:80', zoneHints: B, ready: true, isLocal: true },
      { ep: '10.1.2.5:80', zoneHints: C, ready: true },
      { ep: '10.1.2.6:80', zoneHints: A, ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80', '10.1.2.6:80'],
    localEndpoints: ['10.1.2.3:80', '10.1.2.4:80'],
    allEndpoints: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.6:80'],
  },
  {
    name: 'empty node labels',
    nodeLabels: {},
    svc: {},
    endpoints: [{ ep: '10.1.2.3:80', zoneHints: A, ready: true }],
    clusterEndpoints: ['10.1.2.3:80'],
    localEndpoints: null,
  },
  {
    name: 'empty zone label',
    nodeLabels: { [ZONE]: '' },
    svc: {},
    endpoints: [{ ep: '10.1.2.3:80', zoneHints: A, ready: true }],
    clusterEndpoints: ['10.1.2.3:80'],
    localEndpoints: null,
  },
  {
    name: 'node in different zone, no endpoint filtering',
    nodeLabels: { [ZONE]: 'zone-b' },
    svc: {},
    endpoints: [{ ep: '10.1.2.3:80', zoneHints: A, ready: true }],
    clusterEndpoints: ['10.1.2.3:80'],
    localEndpoints: null,
  },
  {
    name: 'unready endpoint',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', zoneHints: A, ready: true },
      { ep: '10.1.2.4:80', zoneHints: B, ready: true },
      { ep: '10.1.2.5:80', zoneHints: C, ready: true },
      { ep: '10.1.2.6:80', zoneHints: A, ready: false },
    ],
    clusterEndpoints: ['10.1.2.3:80'],
    localEndpoints: null,
  },
  {
    name: 'only unready endpoints in same zone (should not filter)',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', zoneHints: A, ready: false },
      { ep: '10.1.2.4:80', zoneHints: B, ready: true },
      { ep: '10.1.2.5:80', zoneHints: C, ready: true },
      { ep: '10.1.2.6:80', zoneHints: A, ready: false },
    ],
    clusterEndpoints: ['10.1.2.4:80', '10.1.2.5:80'],
    localEndpoints: null,
  },
  {
    name: 'missing hints, no filtering applied',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', zoneHints: A, ready: true },
      { ep: '10.1.2.4:80', zoneHints: B, ready: true },
      { ep: '10.1.2.5:80', ready: true }, // endpoint is missing its hint
      { ep: '10.1.2.6:80', zoneHints: A, ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.5:80', '10.1.2.6:80'],
    localEndpoints: null,
  },
  {
    name: 'multiple hints per endpoint, filtering includes any endpoint with zone included',
    nodeLabels: { [ZONE]: 'zone-c' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', zoneHints: ['zone-a', 'zone-b', 'zone-c'], ready: true },
      { ep: '10.1.2.4:80', zoneHints: ['zone-b', 'zone-c'], ready: true },
      { ep: '10.1.2.5:80', zoneHints: ['zone-b', 'zone-d'], ready: true },
      { ep: '10.1.2.6:80', zoneHints: ['zone-c'], ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80', '10.1.2.4:80', '10.1.2.6:80'],
    localEndpoints: null,
  },
  {
    name: 'conflicting topology and localness require merging allEndpoints',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: { internalPolicyLocal: false, externalPolicyLocal: true, nodePort: 8080 },
    endpoints: [
      { ep: '10.0.0.0:80', zoneHints: A, ready: true, isLocal: true },
      { ep: '10.0.0.1:80', zoneHints: B, ready: true, isLocal: true },
      { ep: '10.0.0.2:80', zoneHints: A, ready: true, isLocal: false },
      { ep: '10.0.0.3:80', zoneHints: B, ready: true, isLocal: false },
    ],
    clusterEndpoints: ['10.0.0.0:80', '10.0.0.2:80'],
    localEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    allEndpoints: ['10.0.0.0:80', '10.0.0.1:80', '10.0.0.2:80'],
  },
  {
    name: 'internalTrafficPolicy: Local, with empty endpoints',
    svc: { internalPolicyLocal: true },
    endpoints: [],
    clusterEndpoints: null,
    localEndpoints: [],
  },
  {
    name: 'internalTrafficPolicy: Local, but all endpoints are remote',
    svc: { internalPolicyLocal: true },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: false },
      { ep: '10.0.0.1:80', ready: true, isLocal: false },
    ],
    clusterEndpoints: null,
    localEndpoints: [],
    onlyRemoteEndpoints: true,
  },
  {
    name: 'internalTrafficPolicy: Local, all endpoints are local',
    svc: { internalPolicyLocal: true },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: true },
      { ep: '10.0.0.1:80', ready: true, isLocal: true },
    ],
    clusterEndpoints: null,
    localEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'internalTrafficPolicy: Local, some endpoints are local',
    svc: { internalPolicyLocal: true },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: true },
      { ep: '10.0.0.1:80', ready: true, isLocal: false },
    ],
    clusterEndpoints: null,
    localEndpoints: ['10.0.0.0:80'],
  },
  {
    name: 'Cluster traffic policy, endpoints not Ready',
    svc: {},
    endpoints: [
      { ep: '10.0.0.0:80', ready: false },
      { ep: '10.0.0.1:80', ready: false },
    ],
    clusterEndpoints: [],
    localEndpoints: null,
  },
  {
    name: 'Cluster traffic policy, some endpoints are Ready',
    svc: {},
    endpoints: [
      { ep: '10.0.0.0:80', ready: false },
      { ep: '10.0.0.1:80', ready: true },
    ],
    clusterEndpoints: ['10.0.0.1:80'],
    localEndpoints: null,
  },
  {
    name: 'Cluster traffic policy, all endpoints are terminating',
    svc: {},
    endpoints: [
      { ep: '10.0.0.0:80', ready: false, serving: true, terminating: true, isLocal: true },
      { ep: '10.0.0.1:80', ready: false, serving: true, terminating: true, isLocal: false },
    ],
    clusterEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    localEndpoints: null,
  },
  {
    name: 'iTP: Local, eTP: Cluster, some endpoints local',
    svc: { internalPolicyLocal: true, externalPolicyLocal: false, nodePort: 8080 },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: true },
      { ep: '10.0.0.1:80', ready: true, isLocal: false },
    ],
    clusterEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    localEndpoints: ['10.0.0.0:80'],
    allEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'iTP: Cluster, eTP: Local, some endpoints local',
    svc: { internalPolicyLocal: false, externalPolicyLocal: true, nodePort: 8080 },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: true },
      { ep: '10.0.0.1:80', ready: true, isLocal: false },
    ],
    clusterEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    localEndpoints: ['10.0.0.0:80'],
    allEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'iTP: Local, eTP: Local, some endpoints local',
    svc: { internalPolicyLocal: true, externalPolicyLocal: true, nodePort: 8080 },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: true },
      { ep: '10.0.0.1:80', ready: true, isLocal: false },
    ],
    clusterEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    localEndpoints: ['10.0.0.0:80'],
    allEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'iTP: Local, eTP: Local, all endpoints remote',
    svc: { internalPolicyLocal: true, externalPolicyLocal: true, nodePort: 8080 },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: false },
      { ep: '10.0.0.1:80', ready: true, isLocal: false },
    ],
    clusterEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    localEndpoints: [],
    allEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'iTP: Local, eTP: Local, all endpoints remote and terminating',
    svc: { internalPolicyLocal: true, externalPolicyLocal: true, nodePort: 8080 },
    endpoints: [
      { ep: '10.0.0.0:80', ready: false, serving: true, terminating: true, isLocal: false },
      { ep: '10.0.0.1:80', ready: false, serving: true, terminating: true, isLocal: false },
    ],
    clusterEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    localEndpoints: [],
    allEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    onlyRemoteEndpoints: true,
  },
  {
    name: 'iTP: Cluster, eTP: Local, with terminating endpoints',
    svc: { internalPolicyLocal: false, externalPolicyLocal: true, nodePort: 8080 },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: false },
      { ep: '10.0.0.1:80', ready: false, serving: false, isLocal: true },
      { ep: '10.0.0.2:80', ready: false, serving: true, terminating: true, isLocal: true },
      { ep: '10.0.0.3:80', ready: false, serving: true, terminating: true, isLocal: false },
    ],
    clusterEndpoints: ['10.0.0.0:80'],
    localEndpoints: ['10.0.0.2:80'],
    allEndpoints: ['10.0.0.0:80', '10.0.0.2:80'],
  },
  {
    name: 'externalTrafficPolicy ignored if not externally accessible',
    svc: { externalPolicyLocal: true },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: false },
      { ep: '10.0.0.1:80', ready: true, isLocal: true },
    ],
    clusterEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
    localEndpoints: null,
    allEndpoints: ['10.0.0.0:80', '10.0.0.1:80'],
  },
  {
    name: 'no cluster endpoints for iTP:Local internal-only service',
    svc: { internalPolicyLocal: true },
    endpoints: [
      { ep: '10.0.0.0:80', ready: true, isLocal: false },
      { ep: '10.0.0.1:80', ready: true, isLocal: true },
    ],
    clusterEndpoints: null,
    localEndpoints: ['10.0.0.1:80'],
    allEndpoints: ['10.0.0.1:80'],
  },
];

// PreferSameNode (node hints), per upstream's topologyModeFromHints: node hints win when every
// ready endpoint has one and one names this node; otherwise zone hints are considered.
const nodeHintCases: Case[] = [
  {
    name: 'node hints: every ready endpoint hinted, one for this node → only that one',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', nodeHints: [NODE], zoneHints: A, ready: true },
      { ep: '10.1.2.4:80', nodeHints: ['node-2'], zoneHints: A, ready: true },
      { ep: '10.1.2.5:80', nodeHints: ['node-3'], zoneHints: B, ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80'],
    localEndpoints: null,
  },
  {
    name: 'node hints: none for this node → zone hints decide',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', nodeHints: ['node-2'], zoneHints: A, ready: true },
      { ep: '10.1.2.4:80', nodeHints: ['node-3'], zoneHints: B, ready: true },
      { ep: '10.1.2.5:80', nodeHints: ['node-4'], zoneHints: A, ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80', '10.1.2.5:80'],
    localEndpoints: null,
  },
  {
    name: 'node hints: one ready endpoint without a node hint → node hints ignored, zone hints used',
    nodeLabels: { [ZONE]: 'zone-b' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', nodeHints: [NODE], zoneHints: A, ready: true },
      { ep: '10.1.2.4:80', zoneHints: B, ready: true },
      { ep: '10.1.2.5:80', nodeHints: ['node-3'], zoneHints: B, ready: true },
    ],
    clusterEndpoints: ['10.1.2.4:80', '10.1.2.5:80'],
    localEndpoints: null,
  },
  {
    name: 'node hints: an unready endpoint without hints does not break the "all have hints" rule',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', nodeHints: [NODE], ready: true },
      { ep: '10.1.2.4:80', nodeHints: ['node-2'], ready: true },
      { ep: '10.1.2.5:80', ready: false },
    ],
    clusterEndpoints: ['10.1.2.3:80'],
    localEndpoints: null,
  },
  {
    name: 'node hints: neither node nor zone hints complete → every ready endpoint',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', nodeHints: [NODE], zoneHints: A, ready: true },
      { ep: '10.1.2.4:80', ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80', '10.1.2.4:80'],
    localEndpoints: null,
  },
  {
    name: 'node hints: no ready endpoint → serving-terminating fallback ignores hints',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: {},
    endpoints: [
      { ep: '10.1.2.3:80', nodeHints: ['node-2'], zoneHints: B, ready: false, serving: true, terminating: true },
      { ep: '10.1.2.4:80', nodeHints: [NODE], zoneHints: A, ready: false, serving: true, terminating: true },
      { ep: '10.1.2.5:80', ready: false, serving: false, terminating: true },
    ],
    clusterEndpoints: ['10.1.2.3:80', '10.1.2.4:80'],
    localEndpoints: null,
  },
  {
    name: 'node hints with eTP Local: local endpoints ignore hints, lists merged',
    nodeLabels: { [ZONE]: 'zone-a' },
    svc: { externalPolicyLocal: true, nodePort: 30080 },
    endpoints: [
      { ep: '10.1.2.3:80', nodeHints: [NODE], ready: true, isLocal: true },
      { ep: '10.1.2.4:80', nodeHints: ['node-2'], ready: true, isLocal: true },
      { ep: '10.1.2.5:80', nodeHints: ['node-3'], ready: true },
    ],
    clusterEndpoints: ['10.1.2.3:80'],
    localEndpoints: ['10.1.2.3:80', '10.1.2.4:80'],
    allEndpoints: ['10.1.2.3:80', '10.1.2.4:80'],
  },
];

function checkCase(tc: Case): void {
  const svc = servicePort(tc.svc);
  const eps = tc.endpoints.map(endpoint);
  const got = categorizeEndpoints(eps, svc, NODE, tc.nodeLabels ?? {});
  const keys = (l: Endpoint[]) => l.map((e) => e.key).sort();
  const sorted = (l: string[] | null | undefined) => [...(l ?? [])].sort();
  assert.deepEqual(keys(got.clusterEndpoints), sorted(tc.clusterEndpoints), 'clusterEndpoints');
  assert.deepEqual(keys(got.localEndpoints), sorted(tc.localEndpoints), 'localEndpoints');
  let expectedAll: string[] | undefined;
  if (tc.clusterEndpoints !== null && tc.localEndpoints === null) expectedAll = tc.clusterEndpoints;
  else if (tc.localEndpoints !== null && tc.clusterEndpoints === null) expectedAll = tc.localEndpoints;
  else expectedAll = tc.allEndpoints;
  assert.deepEqual(keys(got.allReachableEndpoints), sorted(expectedAll), 'allReachableEndpoints');
  assert.equal(got.hasAnyEndpoints, (expectedAll?.length ?? 0) > 0 || !!tc.onlyRemoteEndpoints, 'hasAnyEndpoints');
  // no endpoint appears twice in any list
  for (const l of [got.clusterEndpoints, got.localEndpoints, got.allReachableEndpoints]) {
    assert.equal(new Set(l.map((e) => e.key)).size, l.length);
  }
}

for (const tc of upstreamCases) test(`upstream: ${tc.name}`, () => checkCase(tc));
for (const tc of nodeHintCases) test(tc.name, () => checkCase(tc));

test('categorizeEndpoints: a merged allReachableEndpoints list is sorted by key', () => {
  const got = categorizeEndpoints(
    [
      endpoint({ ep: '10.0.0.9:80', ready: true, isLocal: false, zoneHints: A }),
      endpoint({ ep: '10.0.0.1:80', ready: true, isLocal: true, zoneHints: B }),
      endpoint({ ep: '10.0.0.10:80', ready: true, isLocal: false, zoneHints: A }),
    ],
    servicePort({ externalPolicyLocal: true, nodePort: 30080 }),
    NODE,
    { [ZONE]: 'zone-a' },
  );
  assert.deepEqual(got.allReachableEndpoints.map((e) => e.key), ['10.0.0.10:80', '10.0.0.1:80', '10.0.0.9:80']);
});

test('categorizeEndpoints: no endpoints at all', () => {
  for (const s of [{}, { internalPolicyLocal: true }, { externalPolicyLocal: true, nodePort: 30080 }]) {
    const got = categorizeEndpoints([], servicePort(s), NODE, {});
    assert.deepEqual([got.clusterEndpoints, got.localEndpoints, got.allReachableEndpoints, got.hasAnyEndpoints], [[], [], [], false]);
  }
});

test('lists kept in the view: the port\'s own list when every endpoint is used, one frozen empty list, or a list of exactly the endpoints used', () => {
  const all = [endpoint({ ep: '10.0.0.1:80', ready: true }), endpoint({ ep: '10.0.0.2:80', ready: true })];
  const cluster = categorizeEndpoints(all, servicePort({}), NODE);
  assert.equal(cluster.clusterEndpoints, all, 'every endpoint ready: the same list');
  assert.equal(cluster.allReachableEndpoints, all);
  assert.deepEqual(cluster.localEndpoints, []);
  assert.ok(Object.isFrozen(cluster.localEndpoints), 'no local endpoints: the shared frozen list');

  const mixed = [endpoint({ ep: '10.0.0.1:80', isLocal: true, ready: true }), endpoint({ ep: '10.0.0.2:80' }), endpoint({ ep: '10.0.0.3:80', ready: true })];
  const local = categorizeEndpoints(mixed, servicePort({ internalPolicyLocal: true }), NODE);
  assert.deepEqual(local.localEndpoints.map((e) => e.key), ['10.0.0.1:80']);
  assert.notEqual(local.localEndpoints, mixed);
  assert.ok(!Object.isFrozen(local.localEndpoints));
  assert.deepEqual(local.clusterEndpoints, []);
  const some = categorizeEndpoints(mixed, servicePort({}), NODE).clusterEndpoints;
  assert.deepEqual(some.map((e) => e.key), ['10.0.0.1:80', '10.0.0.3:80']);
  assert.equal(some[0], mixed[0], 'the same Endpoint objects');
});
