// Unit tests for src/core/validate.ts and the tracker boundary:
// hostile objects are refused with the field path that is wrong, valid upstream-style objects
// pass unchanged, nothing thrown anywhere for any input (fast-check), warnings are one per
// object and field and rate-limited, and a tracker fed good and bad objects holds exactly the
// good ones.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import {
  Boundary,
  formatPath,
  shortValue,
  endpointIPReason,
  unusableEndpointReason,
  validateEndpointSlice,
  validateNode,
  validateService,
  type Issue,
} from '../../src/core/validate.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { servicePortsOf, endpointsOfSlices } from '../../src/core/convert.ts';
import { safeServicePort } from '../../src/core/vip.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
type Obj = any;

function goodSvc(): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: 'web', namespace: 'ns1', labels: { app: 'web' } },
    spec: {
      type: 'LoadBalancer',
      clusterIP: '172.30.0.41',
      clusterIPs: ['172.30.0.41'],
      ipFamilies: ['IPv4'],
      ports: [
        { name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080 },
        { name: 'dns', protocol: 'UDP', port: 53, targetPort: 'dns-port', nodePort: 30053 },
      ],
      externalIPs: ['192.168.99.11'],
      loadBalancerSourceRanges: ['203.0.113.0/24'],
      sessionAffinity: 'ClientIP',
      sessionAffinityConfig: { clientIP: { timeoutSeconds: 600 } },
      externalTrafficPolicy: 'Local',
      internalTrafficPolicy: 'Cluster',
      healthCheckNodePort: 30000,
    },
    status: { loadBalancer: { ingress: [{ ip: '1.2.3.4', ipMode: 'VIP' }] } },
  };
}

function goodSlice(): Obj {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: 'web-abc12', namespace: 'ns1', labels: { 'kubernetes.io/service-name': 'web' } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: [
      {
        addresses: ['10.180.0.1'],
        conditions: { ready: true, serving: true, terminating: false },
        nodeName: 'node-a',
        zone: 'zone-a',
        hints: { forZones: [{ name: 'zone-a' }], forNodes: [{ name: 'node-a' }] },
      },
      { addresses: ['10.180.0.2'], conditions: { ready: null }, nodeName: 'node-b' },
    ],
  };
}

const at = (o: Obj, path: (string | number)[], v: unknown): Obj => {
  let cur = o;
  for (const p of path.slice(0, -1)) cur = cur[p];
  cur[path[path.length - 1]] = v;
  return o;
};

const long = (n: number, c = 'a') => c.repeat(n);

// [what, mutation of a good object, expected field path]
const HOSTILE_SERVICES: Array<[string, (s: Obj) => unknown, string]> = [
  // the six examples of the issue that crashed the process
  ['ports: 5', (s) => (s.spec.ports = 5), 'spec.ports'],
  ['clusterIPs: "x"', (s) => (s.spec.clusterIPs = 'x'), 'spec.clusterIPs'],
  ['ports: [null]', (s) => (s.spec.ports = [null]), 'spec.ports[0]'],
  ['labels: "s"', (s) => (s.metadata.labels = 's'), 'metadata.labels'],
  // types
  ['port as a string', (s) => (s.spec.ports[0].port = '80'), 'spec.ports[0].port'],
  ['port missing', (s) => delete s.spec.ports[0].port, 'spec.ports[0].port'],
  ['port a float', (s) => (s.spec.ports[0].port = 80.5), 'spec.ports[0].port'],
  ['port NaN', (s) => (s.spec.ports[0].port = NaN), 'spec.ports[0].port'],
  ['nodePort as a string', (s) => (s.spec.ports[0].nodePort = '30080'), 'spec.ports[0].nodePort'],
  ['targetPort a number-like string', (s) => (s.spec.ports[0].targetPort = '8080'), 'spec.ports[0].targetPort'],
  ['spec an array', (s) => (s.spec = [1, 2]), 'spec'],
  ['metadata null', (s) => (s.metadata = null), 'metadata'],
  ['name a number', (s) => (s.metadata.name = 5), 'metadata.name'],
  ['externalIPs an object', (s) => (s.spec.externalIPs = { a: 1 }), 'spec.externalIPs'],
  ['externalIPs [null]', (s) => (s.spec.externalIPs = [null]), 'spec.externalIPs[0]'],
  ['ingress: "x"', (s) => (s.status.loadBalancer.ingress = 'x'), 'status.loadBalancer.ingress'],
  ['ingress ip a number', (s) => (s.status.loadBalancer.ingress[0].ip = 1234), 'status.loadBalancer.ingress[0].ip'],
  ['sessionAffinityConfig.clientIP a list', (s) => (s.spec.sessionAffinityConfig.clientIP = [600]), 'spec.sessionAffinityConfig.clientIP'],
  ['label value a number', (s) => (s.metadata.labels.app = 7), 'metadata.labels.app'],
  // longer than any array in a request the API server takes (3 MiB, 2 bytes an item)
  ['huge ports array', (s) => (s.spec.ports = new Array(1_600_000).fill(0)), 'spec.ports'],
  ['3 clusterIPs', (s) => (s.spec.clusterIPs = ['172.30.0.41', 'fd00::1', '172.30.0.42']), 'spec.clusterIPs'],
  // names
  ['namespace too long', (s) => (s.metadata.namespace = long(64)), 'metadata.namespace'],
  ['namespace upper case', (s) => (s.metadata.namespace = 'NS1'), 'metadata.namespace'],
  ['name too long', (s) => (s.metadata.name = long(64)), 'metadata.name'],
  ['name with a quote', (s) => (s.metadata.name = 'we"b'), 'metadata.name'],
  ['port name longer than 63', (s) => (s.spec.ports[0].name = long(64)), 'spec.ports[0].name'],
  ['port name upper case', (s) => (s.spec.ports[0].name = 'HTTP'), 'spec.ports[0].name'],
  ['port name ends with "-"', (s) => (s.spec.ports[0].name = 'http-'), 'spec.ports[0].name'],
  ['named targetPort longer than 15', (s) => (s.spec.ports[0].targetPort = long(16)), 'spec.ports[0].targetPort'],
  ['named targetPort without a letter', (s) => (s.spec.ports[0].targetPort = '8080'), 'spec.ports[0].targetPort'],
  ['port name with a space', (s) => (s.spec.ports[0].name = 'a b'), 'spec.ports[0].name'],
  ['duplicate port name', (s) => (s.spec.ports[1].name = 'http'), 'spec.ports[1].name'],
  ['duplicate node port and protocol', (s) => Object.assign(s.spec.ports[1], { protocol: 'TCP', nodePort: 30080 }), 'spec.ports[1].nodePort'],
  ['unnamed port among several', (s) => delete s.spec.ports[1].name, 'spec.ports[1].name'],
  ['label value too long', (s) => (s.metadata.labels.app = long(64)), 'metadata.labels.app'],
  ['label key with two slashes', (s) => (s.metadata.labels['a/b/c'] = 'x'), 'metadata.labels["a/b/c"]'],
  // values
  ['port 0', (s) => (s.spec.ports[0].port = 0), 'spec.ports[0].port'],
  ['port 65536', (s) => (s.spec.ports[0].port = 65536), 'spec.ports[0].port'],
  ['nodePort 70000', (s) => (s.spec.ports[0].nodePort = 70000), 'spec.ports[0].nodePort'],
  ['protocol ICMP', (s) => (s.spec.ports[0].protocol = 'ICMP'), 'spec.ports[0].protocol'],
  ['healthCheckNodePort -1', (s) => (s.spec.healthCheckNodePort = -1), 'spec.healthCheckNodePort'],
  ['affinity timeout 0', (s) => (s.spec.sessionAffinityConfig.clientIP.timeoutSeconds = 0), 'spec.sessionAffinityConfig.clientIP.timeoutSeconds'],
  ['affinity timeout 86401', (s) => (s.spec.sessionAffinityConfig.clientIP.timeoutSeconds = 86401), 'spec.sessionAffinityConfig.clientIP.timeoutSeconds'],
  ['type unknown', (s) => (s.spec.type = 'Magic'), 'spec.type'],
  ['externalTrafficPolicy unknown', (s) => (s.spec.externalTrafficPolicy = 'Nearby'), 'spec.externalTrafficPolicy'],
  ['source range not a CIDR', (s) => (s.spec.loadBalancerSourceRanges = ['bogus']), 'spec.loadBalancerSourceRanges[0]'],
  ['source range prefix 33', (s) => (s.spec.loadBalancerSourceRanges = ['10.0.0.0/33']), 'spec.loadBalancerSourceRanges[0]'],
  ['clusterIP not an IP', (s) => ((s.spec.clusterIP = '172.30.0.999'), (s.spec.clusterIPs = undefined)), 'spec.clusterIP'],
  ['clusterIPs[0] differs from clusterIP', (s) => (s.spec.clusterIPs = ['172.30.0.42']), 'spec.clusterIPs[0]'],
  ['dual-stack with two IPv4', (s) => (s.spec.clusterIPs = ['172.30.0.41', '172.30.0.42']), 'spec.clusterIPs[1]'],
  ['IPv6 with a zone', (s) => (s.spec.externalIPs = ['fe80::1%eth0']), 'spec.externalIPs[0]'],
  // external IPs: ValidateEndpointIP
  ['externalIP loopback', (s) => (s.spec.externalIPs = ['127.0.0.53']), 'spec.externalIPs[0]'],
  ['externalIP unspecified', (s) => (s.spec.externalIPs = ['0.0.0.0']), 'spec.externalIPs[0]'],
  ['externalIP link-local multicast IPv4', (s) => (s.spec.externalIPs = ['224.0.0.251']), 'spec.externalIPs[0]'],
  ['externalIP link-local multicast IPv6', (s) => (s.spec.externalIPs = ['ff02::1']), 'spec.externalIPs[0]'],
  ['externalIP link-local IPv6', (s) => (s.spec.externalIPs = ['fe80::1']), 'spec.externalIPs[0]'],
];

/**
 * Service IPs the API server accepts (validateClusterIPs and ValidateLoadBalancerStatus check
 * IsValidIP only; ValidateEndpointIP lets global multicast and broadcast through) and no kernel
 * mode can serve: the Service is accepted, and that one address never reaches a rule.
 */
const UNSAFE_BUT_ACCEPTED: Array<[string, (s: Obj) => unknown, string]> = [
  ['clusterIP 127.0.0.1', (s) => ((s.spec.clusterIP = '127.0.0.1'), (s.spec.clusterIPs = ['127.0.0.1'])), '127.0.0.1'],
  ['clusterIP 0.0.0.0', (s) => ((s.spec.clusterIP = '0.0.0.0'), (s.spec.clusterIPs = undefined)), '0.0.0.0'],
  ['clusterIP multicast', (s) => ((s.spec.clusterIP = '239.1.2.3'), (s.spec.clusterIPs = undefined)), '239.1.2.3'],
  ['clusterIP broadcast', (s) => ((s.spec.clusterIP = '255.255.255.255'), (s.spec.clusterIPs = undefined)), '255.255.255.255'],
  ['clusterIP link-local', (s) => ((s.spec.clusterIP = '169.254.169.254'), (s.spec.clusterIPs = undefined)), '169.254.169.254'],
  ['clusterIP IPv4-mapped loopback', (s) => ((s.spec.clusterIP = '::ffff:127.0.0.1'), (s.spec.clusterIPs = undefined)), '127.0.0.1'],
  ['externalIP global multicast', (s) => (s.spec.externalIPs = ['239.1.2.3']), '239.1.2.3'],
  ['externalIP broadcast', (s) => (s.spec.externalIPs = ['255.255.255.255']), '255.255.255.255'],
  ['LB ingress 0.0.0.0', (s) => (s.status.loadBalancer.ingress[0].ip = '0.0.0.0'), '0.0.0.0'],
  ['LB ingress loopback', (s) => (s.status.loadBalancer.ingress[0].ip = '127.0.0.9'), '127.0.0.9'],
];

const HOSTILE_SLICES: Array<[string, (s: Obj) => unknown, string]> = [
  // from the issue
  ['hints.forZones: "z"', (s) => (s.endpoints[0].hints.forZones = 'z'), 'endpoints[0].hints.forZones'],
  ['endpoints: [null]', (s) => (s.endpoints = [null]), 'endpoints[0]'],
  // types and shapes
  ['endpoints: 5', (s) => (s.endpoints = 5), 'endpoints'],
  ['addresses: "10.180.0.1"', (s) => (s.endpoints[0].addresses = '10.180.0.1'), 'endpoints[0].addresses'],
  ['addresses empty', (s) => (s.endpoints[0].addresses = []), 'endpoints[0].addresses'],
  ['ready: "true"', (s) => (s.endpoints[0].conditions.ready = 'true'), 'endpoints[0].conditions.ready'],
  ['ports: {}', (s) => (s.ports = {}), 'ports'],
  ['port as a string', (s) => (s.ports[0].port = '8080'), 'ports[0].port'],
  ['forZones [null]', (s) => (s.endpoints[0].hints.forZones = [null]), 'endpoints[0].hints.forZones[0]'],
  ['9 zone hints', (s) => (s.endpoints[0].hints.forZones = Array.from({ length: 9 }, (_, i) => ({ name: `z${i}` }))), 'endpoints[0].hints.forZones'],
  ['1001 endpoints', (s) => (s.endpoints = Array.from({ length: 1001 }, (_, i) => ({ addresses: [`10.1.${i >> 8}.${i & 255}`] }))), 'endpoints'],
  ['addressType missing', (s) => delete s.addressType, 'addressType'],
  ['addressType IPv5', (s) => (s.addressType = 'IPv5'), 'addressType'],
  ['service-name label not a service name', (s) => (s.metadata.labels['kubernetes.io/service-name'] = 'Not Valid'), 'metadata.labels["kubernetes.io/service-name"]'],
  ['slice name too long', (s) => (s.metadata.name = long(254)), 'metadata.name'],
  ['nodeName with a slash', (s) => (s.endpoints[0].nodeName = 'a/b'), 'endpoints[0].nodeName'],
  ['port name upper case', (s) => (s.ports[0].name = 'HTTP'), 'ports[0].name'],
  ['duplicate port name', (s) => s.ports.push({ name: 'http', port: 8081, protocol: 'TCP' }), 'ports[1].name'],
  // addresses
  ['address not an IP', (s) => (s.endpoints[0].addresses = ['10.180.0.999']), 'endpoints[0].addresses[0]'],
  ['IPv6 address in an IPv4 slice', (s) => (s.endpoints[0].addresses = ['fd00::1']), 'endpoints[0].addresses[0]'],
  ['address 0.0.0.0', (s) => (s.endpoints[0].addresses = ['0.0.0.0']), 'endpoints[0].addresses[0]'],
  ['address loopback', (s) => (s.endpoints[0].addresses = ['127.0.0.1']), 'endpoints[0].addresses[0]'],
  ['address link-local', (s) => (s.endpoints[0].addresses = ['169.254.1.1']), 'endpoints[0].addresses[0]'],
  ['address multicast', (s) => (s.endpoints[0].addresses = ['224.0.0.1']), 'endpoints[0].addresses[0]'],
];

function paths(issues: Issue[]): string[] {
  return issues.map((i) => i.path);
}

describe('hostile Services are refused with the field that is wrong', () => {
  for (const [what, mutate, path] of HOSTILE_SERVICES) {
    test(what, () => {
      const s = goodSvc();
      mutate(s);
      const r = validateService(s);
      assert.equal(r.ok, false, 'refused');
      assert.ok(!r.ok && paths(r.issues).includes(path), `want ${path}, got ${!r.ok && JSON.stringify(r.issues)}`);
      for (const i of !r.ok ? r.issues : []) assert.ok(i.value.length <= 101, `value truncated: ${i.value.length}`);
      // and through a tracker: no throw, nothing in the state
      const t = new ProxyStateTracker(4, 'node-a');
      t.services.update(null, s);
      t.apply();
      assert.equal(t.state.services.size, 0);
    });
  }
});

describe('hostile EndpointSlices are refused with the field that is wrong', () => {
  for (const [what, mutate, path] of HOSTILE_SLICES) {
    test(what, () => {
      const s = goodSlice();
      mutate(s);
      const r = validateEndpointSlice(s);
      assert.equal(r.ok, false, 'refused');
      assert.ok(!r.ok && paths(r.issues).includes(path), `want ${path}, got ${!r.ok && JSON.stringify(r.issues)}`);
      const t = new ProxyStateTracker(4, 'node-a');
      t.endpoints.update(null, s);
      t.apply();
      assert.equal(t.state.endpoints.size, 0);
    });
  }
});

describe('Service IPs the API server accepts but no mode can serve: the Service stays, the address is left out', () => {
  for (const [what, mutate, ip] of UNSAFE_BUT_ACCEPTED) {
    test(what, () => {
      const s = goodSvc();
      mutate(s);
      const r = validateService(s);
      assert.ok(r.ok, JSON.stringify(!r.ok && r.issues));
      const t = new ProxyStateTracker(4, 'node-a');
      t.services.update(null, s);
      t.apply();
      assert.ok(t.state.services.size > 0, 'the Service is in the state');
      for (const sp of t.state.services.values()) {
        const safe = safeServicePort(sp);
        assert.ok(safe.skipped.some((k) => k.ip === ip), `${ip} reported as skipped`);
        assert.ok(![safe.sp.clusterIP, ...safe.sp.externalIPs, ...safe.sp.loadBalancerVIPs].includes(ip), `${ip} left out`);
      }
    });
  }
});

test('the table holds the issue examples and at least 30 more', () => {
  assert.ok(HOSTILE_SERVICES.length + HOSTILE_SLICES.length >= 36);
});

describe('valid upstream-style objects pass unchanged', () => {
  const dualStack: Obj = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: 'dual', namespace: 'ns1' },
    spec: {
      type: 'ClusterIP',
      clusterIP: '172.30.0.50',
      clusterIPs: ['172.30.0.50', 'fd00:10:96::50'],
      ipFamilies: ['IPv4', 'IPv6'],
      ports: [{ name: 'p80', port: 80, protocol: 'TCP', targetPort: 80 }],
    },
  };
  const externalName: Obj = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: 'ext', namespace: 'ns1' },
    spec: { type: 'ExternalName', externalName: 'example.com', ports: [{ port: 443 }] },
  };
  const headless: Obj = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: 'headless', namespace: 'ns1' },
    spec: { clusterIP: 'None', clusterIPs: ['None'], ports: [{ name: 'p', port: 80 }] },
  };
  const ipv6Slice: Obj = {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: 'dual-v6', namespace: 'ns1', labels: { 'kubernetes.io/service-name': 'dual' } },
    addressType: 'IPv6',
    ports: [{ name: 'p80', port: 80, protocol: 'TCP' }],
    endpoints: [{ addresses: ['fd00:10:180::1'], conditions: { ready: true } }],
  };
  const fqdnSlice: Obj = {
    metadata: { name: 'ext-1', namespace: 'ns1', labels: { 'kubernetes.io/service-name': 'ext' } },
    addressType: 'FQDN',
    endpoints: [{ addresses: ['example.com'] }],
    ports: null,
  };
  const sloppy: Obj = {
    metadata: { name: 'sloppy', namespace: 'ns1' },
    spec: { clusterIP: '172.030.000.041', ports: [{ port: 80 }], externalIPs: null, type: null },
  };
  for (const [what, obj] of [
    ['LoadBalancer with ingress, Local policy, affinity', goodSvc()],
    ['dual-stack', dualStack],
    ['ExternalName', externalName],
    ['headless', headless],
    ['sloppy IPv4 and nulls, as in old objects', sloppy],
  ] as const) {
    test(`Service: ${what}`, () => {
      const r = validateService(structuredClone(obj));
      assert.ok(r.ok, JSON.stringify(!r.ok && r.issues));
      assert.deepEqual(r.value, obj);
      for (const fam of [4, 6] as const) assert.deepEqual(servicePortsOf(r.value, fam), servicePortsOf(obj, fam));
    });
  }
  const unlabelledSlice: Obj = { ...goodSlice(), metadata: { name: 'custom-1', namespace: 'ns1' } };
  for (const [what, obj] of [
    ['topology hints, conditions, node names', goodSlice()],
    ['IPv6', ipv6Slice],
    ['FQDN', fqdnSlice],
    ['FQDN with a trailing dot (IsFullyQualifiedDomainName)', { ...fqdnSlice, endpoints: [{ addresses: ['example.com.'] }] }],
    ['without labels: valid, and belongs to no Service', unlabelledSlice],
  ] as const) {
    test(`EndpointSlice: ${what}`, () => {
      const r = validateEndpointSlice(structuredClone(obj));
      assert.ok(r.ok, JSON.stringify(!r.ok && r.issues));
      assert.deepEqual(r.value, obj);
      assert.deepEqual(endpointsOfSlices([r.value], 4, 'node-a'), endpointsOfSlices([obj], 4, 'node-a'));
    });
  }
  test('loopback is accepted only when the mode allows it (userspace)', () => {
    const s = goodSvc();
    s.spec.externalIPs = ['127.0.100.1'];
    assert.equal(validateService(s).ok, false);
    assert.equal(validateService(s, { allowLoopback: true }).ok, true);
    const sl = goodSlice();
    sl.endpoints[0].addresses = ['127.0.1.1'];
    assert.equal(validateEndpointSlice(sl).ok, false);
    assert.equal(validateEndpointSlice(sl, { allowLoopback: true }).ok, true);
    // never the unspecified address, even so
    s.spec.externalIPs = ['0.0.0.0'];
    assert.equal(validateService(s, { allowLoopback: true }).ok, false);
  });
  test('unknown fields are dropped, known ones kept', () => {
    const s = goodSvc();
    s.metadata.managedFields = [{ manager: 'kubectl' }];
    s.spec.someFutureField = { x: 1 };
    const r = validateService(s);
    assert.ok(r.ok);
    assert.equal((r.value as Obj).metadata.managedFields, undefined);
    assert.equal((r.value as Obj).spec.someFutureField, undefined);
    assert.equal(r.value.spec?.ports?.length, 2);
  });
});

test('Node: labels and name checked', () => {
  assert.equal(validateNode({ metadata: { name: 'node-a', labels: { 'topology.kubernetes.io/zone': 'zone-a' } } }).ok, true);
  const bad = validateNode({ metadata: { name: 'node-a', labels: 'zone-a' } });
  assert.ok(!bad.ok && bad.issues[0].path === 'metadata.labels');
  assert.equal(validateNode(null).ok, false);
});

test('special IPs, path formatting and value truncation', () => {
  // ValidateEndpointIP: unspecified, loopback, link-local unicast, link-local multicast
  for (const ip of ['0.0.0.0', '::', '127.0.0.1', '127.255.0.1', '::1', '169.254.0.1', 'fe80::1', 'febf::1', '224.0.0.1', '224.0.0.255', 'ff02::1', 'ff12::1']) {
    assert.ok(endpointIPReason(ip), ip);
  }
  for (const ip of ['172.30.0.1', '10.0.0.1', '1.2.3.4', 'fd00::1', '2001:db8::1', 'fec0::1', '223.255.255.255', '240.0.0.1', '224.0.1.1', '239.255.255.255', 'ff05::1', '255.255.255.255']) {
    assert.equal(endpointIPReason(ip), null, ip);
  }
  // what the API server accepts there and no mode can forward to
  for (const ip of ['224.0.1.1', '239.255.255.255', 'ff05::1', 'ff0e::1', '255.255.255.255']) assert.ok(unusableEndpointReason(ip), ip);
  for (const ip of ['10.0.0.1', '240.0.0.1', 'fd00::1', '2001:db8::ff']) assert.equal(unusableEndpointReason(ip), null, ip);
  assert.equal(formatPath(['spec', 'ports', 0, 'port']), 'spec.ports[0].port');
  assert.equal(formatPath(['metadata', 'labels', 'kubernetes.io/service-name']), 'metadata.labels["kubernetes.io/service-name"]');
  assert.ok(shortValue('x'.repeat(10_000)).length <= 101);
  assert.ok(shortValue(Array.from({ length: 1e5 }, () => ({ a: 'b'.repeat(50) }))).length <= 101);
  const cyclic: Obj = { a: 1 };
  cyclic.self = cyclic;
  assert.doesNotThrow(() => shortValue(cyclic));
});

describe('warnings: one per object and field, rate-limited, memory bounded; every skip counted', () => {
  test('the same object and field warns once per interval, counts every time', () => {
    let now = 0;
    const warnings: Array<{ msg: string; obj: string; field?: string }> = [];
    const counted: string[] = [];
    const b = new Boundary((msg, obj, d) => warnings.push({ msg, obj, field: d?.field }), {
      now: () => now,
      warnIntervalMs: 300_000,
      onInvalid: (kind, obj) => counted.push(`${kind} ${obj}`),
    });
    const bad = goodSvc();
    bad.spec.ports = 5;
    for (let i = 0; i < 3; i++) assert.equal(b.service(bad), null);
    assert.equal(warnings.length, 1);
    assert.equal(warnings[0].obj, 'Service ns1/web');
    assert.equal(warnings[0].field, 'spec.ports');
    assert.match(warnings[0].msg, /spec\.ports.*value 5/);
    assert.deepEqual(counted, ['Service ns1/web', 'Service ns1/web', 'Service ns1/web']);
    // another field of the same object, or the same field of another object: warned
    const bad2 = goodSvc();
    bad2.spec.clusterIP = '172.30.0.999';
    bad2.spec.clusterIPs = undefined;
    b.service(bad2);
    const other = goodSvc();
    other.metadata.name = 'other';
    other.spec.ports = 5;
    b.service(other);
    assert.deepEqual(warnings.map((w) => `${w.obj} ${w.field}`), ['Service ns1/web spec.ports', 'Service ns1/web spec.clusterIP', 'Service ns1/other spec.ports']);
    now = 299_999;
    b.service(bad);
    assert.equal(warnings.length, 3, 'still within the interval');
    now = 300_000;
    b.service(bad);
    assert.equal(warnings.length, 4, 'repeated once the interval passed');
  });

  test('memory stays bounded however many objects are invalid', () => {
    const b = new Boundary(() => {}, { maxRemembered: 50 });
    for (let i = 0; i < 1000; i++) {
      const s = goodSvc();
      s.metadata.name = `svc${i}`;
      s.spec.ports = 'x';
      b.service(s);
    }
    assert.ok(b.rememberedCount() <= 50);
  });

  test('a hostile object name is quoted and truncated in the warning', () => {
    const warnings: string[] = [];
    const b = new Boundary((msg, obj) => warnings.push(obj));
    const s = goodSvc();
    s.metadata.name = `evil\nname${'x'.repeat(500)}`;
    b.service(s);
    assert.equal(warnings.length, 1);
    assert.ok(!warnings[0].includes('\n'));
    assert.ok(warnings[0].length < 150);
  });
});

describe('tracker at the boundary', () => {
  test('mixed good and bad objects: the state holds exactly the good services', () => {
    const reports: string[] = [];
    const t = new ProxyStateTracker(4, 'node-a', (m, o) => reports.push(`${o}: ${m}`));
    const good = (name: string, ip: string): Obj => {
      const s = goodSvc();
      s.metadata.name = name;
      s.spec.clusterIP = ip;
      s.spec.clusterIPs = [ip];
      return s;
    };
    const objects: Obj[] = [good('a', '172.30.0.1')];
    for (const [, mutate] of HOSTILE_SERVICES) {
      const s = good(`bad${objects.length}`, '172.30.1.1');
      mutate(s);
      objects.push(s);
    }
    objects.push(good('b', '172.30.0.2'), 5, null, 'x', [], { metadata: { name: 'n', namespace: 'ns1' }, spec: { ports: [null] } });
    objects.push(good('c', '172.30.0.3'));
    for (const o of objects) assert.doesNotThrow(() => t.services.update(null, o));
    const sl = goodSlice();
    t.endpoints.update(null, sl);
    for (const [, mutate] of HOSTILE_SLICES) {
      const s = goodSlice();
      s.metadata.name = `bad-${Math.random().toString(36).slice(2)}`;
      mutate(s);
      assert.doesNotThrow(() => t.endpoints.update(null, s));
    }
    t.apply();
    const services = [...new Set([...t.state.services.values()].map((p) => p.serviceKey))].sort();
    assert.deepEqual(services, ['ns1/a', 'ns1/b', 'ns1/c']);
    assert.deepEqual([...t.state.endpoints.keys()], ['ns1/web:http']);
    assert.deepEqual(t.state.endpoints.get('ns1/web:http')!.map((e) => e.key), ['10.180.0.1:8080', '10.180.0.2:8080']);
    assert.ok(reports.length >= HOSTILE_SERVICES.length);
  });

  test('a Service that becomes invalid is removed (as a delete), and comes back when fixed', () => {
    const t = new ProxyStateTracker(4, 'node-a');
    const v1 = goodSvc();
    t.services.update(null, v1);
    t.apply();
    assert.equal(t.state.services.size, 2);
    const v2 = goodSvc();
    v2.spec.ports = [null];
    assert.equal(t.services.update(v1, v2), true);
    assert.deepEqual([...t.apply()], ['ns1/web']);
    assert.equal(t.state.services.size, 0, 'no stale rules for the last good version');
    // deleting the invalid version: nothing left to do
    assert.equal(t.services.update(v2, null), false);
    // fixed again
    t.services.update(null, goodSvc());
    t.apply();
    assert.equal(t.state.services.size, 2);
  });

  test('a slice that becomes invalid loses its endpoints; its service keeps those of other slices', () => {
    const t = new ProxyStateTracker(4, 'node-a');
    const a = goodSlice();
    const b = goodSlice();
    b.metadata.name = 'web-other';
    b.endpoints = [{ addresses: ['10.180.0.9'] }];
    t.endpoints.update(null, a);
    t.endpoints.update(null, b);
    t.apply();
    const bad = goodSlice();
    bad.endpoints = [null];
    assert.equal(t.endpoints.update(a, bad), true);
    t.apply();
    assert.deepEqual(t.state.endpoints.get('ns1/web:http')!.map((e) => e.key), ['10.180.0.9:8080']);
    // a source that does not pass the old object still removes what the slice contributed
    t.endpoints.update(null, a);
    t.apply();
    t.endpoints.update(null, bad);
    t.apply();
    assert.deepEqual(t.state.endpoints.get('ns1/web:http')!.map((e) => e.key), ['10.180.0.9:8080']);
  });

  test('a slice port outside 1-65535 (accepted upstream: validatePorts checks no number) is left out; the slice stays', () => {
    const reports: string[] = [];
    const t = new ProxyStateTracker(4, 'node-a', (msg) => reports.push(msg));
    t.services.update(null, goodSvc());
    const sl = goodSlice();
    sl.ports = [sl.ports[0], { name: 'other', port: 0, protocol: 'TCP' }, { name: 'big', port: 70000, protocol: 'TCP' }];
    assert.ok(validateEndpointSlice(sl).ok, 'the API server accepts the slice, and so does kproxy');
    t.endpoints.update(null, sl);
    t.apply();
    assert.ok(t.state.endpoints.get('ns1/web:http')!.length > 0, 'the good port keeps its endpoints');
    assert.ok(reports.some((r) => r.includes('70000')), reports.join('\n'));
  });

  test('a multicast or broadcast endpoint (accepted upstream) is left out; the other endpoints of the slice stay', () => {
    const reports: string[] = [];
    const t = new ProxyStateTracker(4, 'node-a', (msg) => reports.push(msg));
    t.services.update(null, goodSvc());
    const sl = goodSlice();
    sl.endpoints = [{ addresses: ['239.1.1.1'] }, { addresses: ['255.255.255.255'] }, { addresses: ['10.180.0.7'] }];
    assert.ok(validateEndpointSlice(sl).ok, 'the API server accepts the slice, and so does kproxy');
    t.endpoints.update(null, sl);
    t.apply();
    assert.deepEqual(t.state.endpoints.get('ns1/web:http')!.map((e) => e.ip), ['10.180.0.7']);
    assert.ok(reports.some((r) => r.includes('239.1.1.1') && r.includes('multicast')), reports.join('\n'));
  });
});

// ---- fuzz ----------------------------------------------------------------------------------

const PROPERTY_RUNS = 400;

/** Paths into a valid object where a fuzzed value is put. */
const SVC_PATHS: (string | number)[][] = [
  ['metadata'], ['metadata', 'name'], ['metadata', 'namespace'], ['metadata', 'labels'], ['spec'], ['spec', 'type'],
  ['spec', 'clusterIP'], ['spec', 'clusterIPs'], ['spec', 'clusterIPs', 0], ['spec', 'ports'], ['spec', 'ports', 0],
  ['spec', 'ports', 0, 'port'], ['spec', 'ports', 0, 'name'], ['spec', 'ports', 0, 'protocol'], ['spec', 'ports', 0, 'nodePort'],
  ['spec', 'ports', 1, 'targetPort'], ['spec', 'externalIPs'], ['spec', 'externalIPs', 0], ['spec', 'loadBalancerSourceRanges'],
  ['spec', 'sessionAffinity'], ['spec', 'sessionAffinityConfig'], ['spec', 'sessionAffinityConfig', 'clientIP', 'timeoutSeconds'],
  ['spec', 'externalTrafficPolicy'], ['spec', 'healthCheckNodePort'], ['status'], ['status', 'loadBalancer', 'ingress'],
  ['status', 'loadBalancer', 'ingress', 0, 'ip'],
];
const SLICE_PATHS: (string | number)[][] = [
  ['metadata'], ['metadata', 'labels'], ['metadata', 'labels', 'kubernetes.io/service-name'], ['addressType'], ['endpoints'],
  ['endpoints', 0], ['endpoints', 0, 'addresses'], ['endpoints', 0, 'addresses', 0], ['endpoints', 0, 'conditions'],
  ['endpoints', 0, 'conditions', 'ready'], ['endpoints', 0, 'nodeName'], ['endpoints', 0, 'zone'], ['endpoints', 0, 'hints'],
  ['endpoints', 0, 'hints', 'forZones'], ['endpoints', 0, 'hints', 'forZones', 0], ['ports'], ['ports', 0], ['ports', 0, 'port'],
  ['ports', 0, 'name'], ['ports', 0, 'protocol'],
];

/** Odd values worth trying beside fc.anything(): near-valid strings and numbers. */
const oddValue = fc.oneof(
  fc.anything(),
  fc.constantFrom('', 'None', '127.0.0.1', '0.0.0.0', '::', '::1', '1.2.3.4', '10.0.0.0/8', 'TCP', 'x'.repeat(300), '80', 'ClientIP', 'Local', '-1'),
  fc.integer(),
  fc.double(),
  fc.constantFrom(null, undefined, [], {}, [null], 0, 65536, NaN, Infinity),
);

function mutate(base: Obj, paths: (string | number)[][]) {
  return fc.tuple(fc.constantFrom(...paths), oddValue).map(([path, v]) => {
    const o = structuredClone(base);
    try {
      at(o, path, v);
    } catch {
      // the path's parent was not there: the unmutated object is fine too
    }
    return o;
  });
}

function feed(t: ProxyStateTracker, svc: unknown, slice: unknown): void {
  const good = goodSvc();
  t.services.update(null, good);
  t.services.update(good, svc);
  t.endpoints.update(null, slice);
  t.apply();
  t.services.update(svc, null);
  t.endpoints.update(slice, goodSlice());
  t.endpoints.setNodeName('node-b');
  t.apply();
}

describe('fuzz: no input throws, anywhere from the tracker to a rule', () => {
  test('fc.anything() as Services, EndpointSlices and Nodes', () => {
    fc.assert(
      fc.property(fc.anything({ withNullPrototype: true, withObjectString: true, maxDepth: 4 }), fc.anything(), (a, b) => {
        const t = new ProxyStateTracker(4, 'node-a');
        feed(t, a, b);
        feed(t, b, a);
        t.boundary.node(a);
        const withMeta = { metadata: { name: 'x', namespace: 'ns1', labels: { 'kubernetes.io/service-name': 'x' } }, spec: a, endpoints: a, ports: b, addressType: 'IPv4' };
        feed(t, withMeta, withMeta);
      }),
      { numRuns: PROPERTY_RUNS },
    );
  });

  test('mutated valid Services and Slices: no throw; accepted ones convert and are in the state', async () => {
    const { modes } = await import('../../src/modes/registry.ts');
    const { resolveConfig } = await import('../../src/config/config.ts');
    fc.assert(
      fc.property(mutate(goodSvc(), SVC_PATHS), mutate(goodSlice(), SLICE_PATHS), (svc, slice) => {
        const t = new ProxyStateTracker(4, 'node-a');
        t.services.update(null, svc);
        t.endpoints.update(null, slice);
        t.apply();
        const ok = validateService(svc).ok;
        const ports = [...t.state.services.values()];
        if (!ok) assert.equal(ports.length, 0);
        // accepted Services render in every kernel mode without throwing
        if (ports.length) {
          for (const m of ['iptables', 'nftables', 'ipvs'] as const) {
            const cfg = resolveConfig({ mode: m });
            assert.equal(typeof modes[m].render({ state: t.state, config: cfg, node: { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 } }), 'string');
          }
        }
      }),
      { numRuns: 150 },
    );
  });
});
