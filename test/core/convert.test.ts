// Unit tests for src/core/convert.ts: API objects → validated model. Bad input is reported
// (with the object's name) and skipped; everything else keeps working.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { servicePortsOf, endpointsOfSlices, sliceServiceKey, serviceSkipReason } from '../../src/core/convert.ts';
import { DEFAULT_AFFINITY_TIMEOUT, type K8sService, type K8sEndpointSlice, type K8sEndpoint } from '../../src/core/api.ts';

interface Reported {
  msg: string;
  obj: string;
}

function collector(): { reports: Reported[]; report: (msg: string, obj: string) => void } {
  const reports: Reported[] = [];
  return { reports, report: (msg, obj) => reports.push({ msg, obj }) };
}

function svc(name: string, spec: K8sService['spec'], extra: Partial<K8sService> = {}): K8sService {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: 'ns1', ...(extra.metadata ?? {}) },
    spec: { clusterIP: '172.30.0.41', ports: [{ name: 'p80', port: 80, protocol: 'TCP', targetPort: 8080 }], ...spec },
    status: extra.status,
  };
}

test('a plain ClusterIP service becomes one ServicePort per port', () => {
  const { reports, report } = collector();
  const ports = servicePortsOf(
    svc('svc1', { ports: [{ name: 'p80', port: 80 }, { name: 'p53', port: 53, protocol: 'UDP' }, { name: 'sctp', port: 9, protocol: 'SCTP' }] }),
    4,
    report,
  );
  assert.deepEqual(reports, []);
  assert.deepEqual(ports.map((p) => [p.key, p.serviceKey, p.protocol, p.port, p.clusterIP, p.family]), [
    ['ns1/svc1:p80', 'ns1/svc1', 'TCP', 80, '172.30.0.41', 4],
    ['ns1/svc1:p53', 'ns1/svc1', 'UDP', 53, '172.30.0.41', 4],
    ['ns1/svc1:sctp', 'ns1/svc1', 'SCTP', 9, '172.30.0.41', 4],
  ]);
  const p = ports[0];
  assert.deepEqual(p.portName, { namespace: 'ns1', name: 'svc1', port: 'p80', protocol: 'TCP' });
  assert.equal(p.nodePort, 0);
  assert.deepEqual(p.externalIPs, []);
  assert.deepEqual(p.loadBalancerVIPs, []);
  assert.equal(p.stickyMaxAgeSeconds, 0);
  assert.equal(p.externalPolicyLocal, false);
  assert.equal(p.internalPolicyLocal, false);
  assert.equal(p.healthCheckNodePort, 0);
});

test('an unnamed single port gets key "ns/name:" and protocol defaults to TCP', () => {
  const ports = servicePortsOf(svc('svc1', { ports: [{ port: 80 }] }), 4);
  assert.equal(ports.length, 1);
  assert.equal(ports[0].key, 'ns1/svc1:');
  assert.equal(ports[0].protocol, 'TCP');
});

test('the cluster IP is canonical (sloppy IPv4 accepted)', () => {
  const ports = servicePortsOf(svc('svc1', { clusterIP: '172.030.000.041' }), 4);
  assert.equal(ports[0].clusterIP, '172.30.0.41');
});

test('headless, ExternalName and service-proxy-name services are skipped silently', () => {
  const { reports, report } = collector();
  const headless = svc('h', { clusterIP: 'None' });
  const noIP = svc('n', { clusterIP: '' });
  const external = svc('e', { type: 'ExternalName', clusterIP: '' });
  const externalWithIP = svc('e2', { type: 'ExternalName' });
  const labelled = svc('l', {}, { metadata: { labels: { 'service.kubernetes.io/service-proxy-name': 'other' } } });
  for (const s of [headless, noIP, external, externalWithIP, labelled]) {
    assert.deepEqual(servicePortsOf(s, 4, report), [], s.metadata!.name);
    assert.notEqual(serviceSkipReason(s), null);
  }
  assert.deepEqual(reports, []);
  assert.equal(serviceSkipReason(svc('ok', {})), null);
});

test('an invalid clusterIP is reported and the service skipped; other services are fine', () => {
  const { reports, report } = collector();
  assert.deepEqual(servicePortsOf(svc('bad', { clusterIP: '172.30.0.999' }), 4, report), []);
  assert.equal(reports.length, 1);
  assert.equal(reports[0].obj, 'ns1/bad');
  assert.match(reports[0].msg, /clusterIP/);
  assert.match(reports[0].msg, /172\.30\.0\.999/);
  assert.equal(servicePortsOf(svc('good', {}), 4, report).length, 1);
  assert.equal(reports.length, 1);
});

test('invalid namespace or name is reported', () => {
  const { reports, report } = collector();
  const s = svc('x', {});
  s.metadata!.name = 'Bad Name"; -j ACCEPT';
  assert.deepEqual(servicePortsOf(s, 4, report), []);
  assert.equal(reports.length, 1);
  const s2 = svc('x', {});
  s2.metadata!.namespace = undefined;
  assert.deepEqual(servicePortsOf(s2, 4, report), []);
  assert.equal(reports.length, 2);
});

test('bad ports, protocols and port names are reported and skipped; the rest of the service stays', () => {
  const { reports, report } = collector();
  const ports = servicePortsOf(
    svc('svc1', {
      ports: [
        { name: 'ok', port: 80 },
        { name: 'zero', port: 0 },
        { name: 'big', port: 65536 },
        { name: 'frac', port: 80.5 },
        { name: 'str', port: '80' as unknown as number },
        { name: 'icmp', port: 81, protocol: 'ICMP' },
        { name: 'lower', port: 82, protocol: 'tcp' },
        { name: 'Bad_Name', port: 83 },
        { name: 'x" -j DROP', port: 84 },
        { name: 'ok', port: 85 }, // duplicate name
        { name: 'ok2', port: 86, protocol: 'UDP' },
      ],
    }),
    4,
    report,
  );
  assert.deepEqual(ports.map((p) => `${p.portName.port}/${p.protocol}/${p.port}`), ['ok/TCP/80', 'ok2/UDP/86']);
  assert.equal(reports.length, 9);
  assert.ok(reports.every((r) => r.obj === 'ns1/svc1'));
  const text = reports.map((r) => r.msg).join('\n');
  for (const needle of ['65536', 'ICMP', '"tcp"', 'Bad_Name', 'duplicate']) assert.ok(text.includes(needle), needle);
});

test('nodePort: kept for NodePort and LoadBalancer types, out of range reported', () => {
  const { reports, report } = collector();
  const np = servicePortsOf(svc('np', { type: 'NodePort', ports: [{ port: 80, nodePort: 30080 }] }), 4, report);
  assert.equal(np[0].nodePort, 30080);
  const lb = servicePortsOf(svc('lb', { type: 'LoadBalancer', ports: [{ port: 80, nodePort: 30081 }] }), 4, report);
  assert.equal(lb[0].nodePort, 30081);
  const cip = servicePortsOf(svc('cip', { type: 'ClusterIP', ports: [{ port: 80, nodePort: 30082 }] }), 4, report);
  assert.equal(cip[0].nodePort, 0);
  const bad = servicePortsOf(svc('bad', { type: 'NodePort', ports: [{ port: 80, nodePort: 70000 }] }), 4, report);
  assert.equal(bad.length, 1, 'the port itself still works');
  assert.equal(bad[0].nodePort, 0);
  assert.equal(reports.length, 1);
  assert.match(reports[0].msg, /70000/);
});

test('externalIPs: canonical, deduplicated, filtered by family; invalid ones reported', () => {
  const { reports, report } = collector();
  const s = svc('svc1', {
    clusterIPs: ['172.30.0.41', 'fd00:172:30::41'],
    externalIPs: ['192.168.99.11', 'fd00::99:11', '192.168.099.011', 'nope'],
  });
  const v4 = servicePortsOf(s, 4, report);
  const v6 = servicePortsOf(s, 6, () => {});
  assert.deepEqual(v4[0].externalIPs, ['192.168.99.11']);
  assert.equal(v4[0].clusterIP, '172.30.0.41');
  assert.deepEqual(v6[0].externalIPs, ['fd00::99:11']);
  assert.equal(v6[0].clusterIP, 'fd00:172:30::41');
  assert.equal(v6[0].family, 6);
  assert.equal(reports.length, 1);
  assert.match(reports[0].msg, /nope/);
});

test('a single-stack service has no ServicePorts in the other family', () => {
  assert.deepEqual(servicePortsOf(svc('svc1', {}), 6), []);
  assert.equal(servicePortsOf(svc('v6', { clusterIP: 'fd00::41' }), 4).length, 0);
  assert.equal(servicePortsOf(svc('v6', { clusterIP: 'fd00::41' }), 6)[0].clusterIP, 'fd00::41');
});

test('load balancer ingress: VIP mode (or unset) only, right family, only for type LoadBalancer', () => {
  const status = {
    loadBalancer: {
      ingress: [
        { ip: '1.2.3.4' },
        { ip: '1.2.3.5', ipMode: 'VIP' },
        { ip: '1.2.3.6', ipMode: 'Proxy' },
        { hostname: 'lb.example.com' },
        { ip: 'fd00::1234' },
      ],
    },
  };
  const lb = servicePortsOf(svc('lb', { type: 'LoadBalancer', ports: [{ port: 80, nodePort: 30080 }] }, { status }), 4);
  assert.deepEqual(lb[0].loadBalancerVIPs, ['1.2.3.4', '1.2.3.5']);
  const cip = servicePortsOf(svc('cip', {}, { status }), 4);
  assert.deepEqual(cip[0].loadBalancerVIPs, []);
});

test('loadBalancerSourceRanges are canonical CIDRs of the family; invalid ones reported', () => {
  const { reports, report } = collector();
  const ports = servicePortsOf(
    svc('lb', { type: 'LoadBalancer', loadBalancerSourceRanges: ['203.0.113.7/24', ' 10.0.0.0/8 ', 'fd00::/64', 'bogus'] }),
    4,
    report,
  );
  assert.deepEqual(ports[0].loadBalancerSourceRanges, ['203.0.113.0/24', '10.0.0.0/8']);
  assert.equal(reports.length, 1);
  assert.match(reports[0].msg, /bogus/);
});

test('sessionAffinity ClientIP: timeout from the config, default 10800, none otherwise', () => {
  const t = (spec: K8sService['spec']) => servicePortsOf(svc('s', spec), 4)[0].stickyMaxAgeSeconds;
  assert.equal(t({ sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 300 } } }), 300);
  assert.equal(t({ sessionAffinity: 'ClientIP' }), DEFAULT_AFFINITY_TIMEOUT);
  assert.equal(DEFAULT_AFFINITY_TIMEOUT, 10800);
  assert.equal(t({ sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 86400 } } }), 86400);
  assert.equal(t({ sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 0 } } }), DEFAULT_AFFINITY_TIMEOUT);
  assert.equal(t({ sessionAffinity: 'None', sessionAffinityConfig: { clientIP: { timeoutSeconds: 300 } } }), 0);
  assert.equal(t({}), 0);
});

test('externalTrafficPolicy Local only counts when the service is externally accessible', () => {
  const local = (spec: K8sService['spec']) => servicePortsOf(svc('s', { externalTrafficPolicy: 'Local', ...spec }), 4)[0].externalPolicyLocal;
  assert.equal(local({ type: 'NodePort', ports: [{ port: 80, nodePort: 30080 }] }), true);
  assert.equal(local({ type: 'LoadBalancer', ports: [{ port: 80, nodePort: 30080 }] }), true);
  assert.equal(local({ type: 'ClusterIP', externalIPs: ['192.168.99.11'] }), true);
  assert.equal(local({}), false, 'plain ClusterIP is not externally accessible');
  assert.equal(local({ type: 'ClusterIP' }), false);
  const cluster = servicePortsOf(svc('s', { type: 'NodePort', externalTrafficPolicy: 'Cluster', ports: [{ port: 80, nodePort: 30080 }] }), 4);
  assert.equal(cluster[0].externalPolicyLocal, false);
});

test('internalTrafficPolicy Local', () => {
  assert.equal(servicePortsOf(svc('s', { internalTrafficPolicy: 'Local' }), 4)[0].internalPolicyLocal, true);
  assert.equal(servicePortsOf(svc('s', { internalTrafficPolicy: 'Cluster' }), 4)[0].internalPolicyLocal, false);
});

test('healthCheckNodePort only with externalTrafficPolicy Local', () => {
  const lb = (etp: string, hc: number) =>
    servicePortsOf(
      svc('lb', { type: 'LoadBalancer', externalTrafficPolicy: etp, healthCheckNodePort: hc, ports: [{ port: 80, nodePort: 30080 }] }),
      4,
    )[0].healthCheckNodePort;
  assert.equal(lb('Local', 30000), 30000);
  assert.equal(lb('Cluster', 30000), 0);
  assert.equal(lb('Local', 70000), 0, 'out of range ignored');
});

// ---- EndpointSlices ----

function slice(name: string, endpoints: K8sEndpoint[], opts: Partial<K8sEndpointSlice> & { service?: string } = {}): K8sEndpointSlice {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name, namespace: 'ns1', labels: { 'kubernetes.io/service-name': opts.service ?? 'svc1' } },
    addressType: opts.addressType ?? 'IPv4',
    ports: opts.ports ?? [{ name: 'p80', port: 80, protocol: 'TCP' }],
    endpoints,
  };
}

const ep = (ip: string, extra: Partial<K8sEndpoint> = {}): K8sEndpoint => ({ addresses: [ip], ...extra });

test('sliceServiceKey', () => {
  assert.equal(sliceServiceKey(slice('s1', [])), 'ns1/svc1');
  const noLabel = slice('s1', []);
  noLabel.metadata!.labels = {};
  assert.equal(sliceServiceKey(noLabel), null);
  assert.equal(sliceServiceKey(slice('s1', [], { service: 'Bad Name' })), null);
});

test('endpointsOfSlices merges slices, sorts by "ip:port" text, and fills conditions', () => {
  const { reports, report } = collector();
  const eps = endpointsOfSlices(
    [
      slice('svc1-b', [ep('10.180.0.10'), ep('10.180.0.2', { nodeName: 'node-a', zone: 'zone-a' })]),
      slice('svc1-a', [ep('10.180.0.1', { nodeName: 'node-b' })]),
    ],
    4,
    'node-a',
    report,
  );
  assert.deepEqual(reports, []);
  assert.deepEqual([...eps.keys()], ['ns1/svc1:p80']);
  const list = eps.get('ns1/svc1:p80')!;
  // plain string order, as upstream's byEndpoint: "10.180.0.10:80" sorts before "10.180.0.1:80"
  // because '0' (0x30) < ':' (0x3a)
  assert.deepEqual(list.map((e) => e.key), ['10.180.0.10:80', '10.180.0.1:80', '10.180.0.2:80']);
  const local = list.find((e) => e.ip === '10.180.0.2')!;
  assert.equal(local.isLocal, true);
  assert.equal(local.zone, 'zone-a');
  assert.equal(local.port, 80);
  const remote = list.find((e) => e.ip === '10.180.0.1')!;
  assert.equal(remote.isLocal, false);
  // nil conditions: ready, serving, not terminating
  for (const e of list) assert.deepEqual([e.ready, e.serving, e.terminating], [true, true, false]);
});

test('conditions: explicit values and null mean what upstream says', () => {
  const eps = endpointsOfSlices(
    [
      slice('s', [
        ep('10.180.0.1', { conditions: { ready: null, serving: null, terminating: null } }),
        ep('10.180.0.2', { conditions: { ready: false, serving: true, terminating: true } }),
        ep('10.180.0.3', { conditions: { ready: false, serving: false, terminating: true } }),
        ep('10.180.0.4', { conditions: { ready: false } }),
        ep('10.180.0.5', { conditions: {} }),
      ]),
    ],
    4,
    'node-a',
  ).get('ns1/svc1:p80')!;
  const c = Object.fromEntries(eps.map((e) => [e.ip, [e.ready, e.serving, e.terminating]]));
  assert.deepEqual(c, {
    '10.180.0.1': [true, true, false],
    '10.180.0.2': [false, true, true],
    '10.180.0.3': [false, false, true],
    '10.180.0.4': [false, true, false],
    '10.180.0.5': [true, true, false],
  });
});

test('duplicate endpoints across slices collapse; a local copy wins', () => {
  const a = slice('svc1-a', [ep('10.180.0.1', { nodeName: 'node-b' })]);
  const b = slice('svc1-b', [ep('10.180.0.1', { nodeName: 'node-a' })]);
  const c = slice('svc1-c', [ep('10.180.0.1', { nodeName: 'node-c' })]);
  for (const order of [[a, b, c], [c, b, a], [b, a, c]]) {
    const list = endpointsOfSlices(order, 4, 'node-a').get('ns1/svc1:p80')!;
    assert.equal(list.length, 1);
    assert.equal(list[0].isLocal, true);
    assert.equal(list[0].nodeName, 'node-a');
  }
});

test('sloppy endpoint addresses are canonicalised and collapse with their canonical form', () => {
  const list = endpointsOfSlices(
    [slice('a', [ep('010.180.000.001')]), slice('b', [ep('10.180.0.1')])],
    4,
    'n',
  ).get('ns1/svc1:p80')!;
  assert.deepEqual(list.map((e) => e.key), ['10.180.0.1:80']);
});

test('addressType filtering and IPv6 keys', () => {
  const slices = [
    slice('v4', [ep('10.180.0.1')]),
    slice('v6', [ep('fd00:10:180::1')], { addressType: 'IPv6' }),
    slice('fqdn', [ep('pod.example.com')], { addressType: 'FQDN' }),
  ];
  const v4 = endpointsOfSlices(slices, 4, 'n').get('ns1/svc1:p80')!;
  assert.deepEqual(v4.map((e) => e.key), ['10.180.0.1:80']);
  const v6 = endpointsOfSlices(slices, 6, 'n').get('ns1/svc1:p80')!;
  assert.deepEqual(v6.map((e) => e.key), ['[fd00:10:180::1]:80']);
});

test('invalid addresses are reported and skipped; the rest of the slice stays', () => {
  const { reports, report } = collector();
  const list = endpointsOfSlices(
    [slice('s', [ep('10.180.0.999'), ep('10.180.0.1'), { addresses: [] }, {}, ep('fd00::1')])],
    4,
    'n',
    report,
  ).get('ns1/svc1:p80')!;
  assert.deepEqual(list.map((e) => e.key), ['10.180.0.1:80']);
  assert.equal(reports.length, 1);
  assert.match(reports[0].msg, /10\.180\.0\.999/);
  assert.equal(reports[0].obj, 'ns1/s');
});

test('ports: several ports, unnamed port, invalid names/ports/protocols rejected', () => {
  const { reports, report } = collector();
  const eps = endpointsOfSlices(
    [
      slice('s', [ep('10.180.0.1')], {
        ports: [
          { name: 'p80', port: 80 },
          { name: 'p53', port: 53, protocol: 'UDP' },
          { name: '', port: 81 },
          { name: 'bad"name', port: 82 },
          { name: 'big', port: 70000 },
          { name: 'proto', port: 83, protocol: 'ICMP' },
          { name: 'noport' },
        ],
      }),
    ],
    4,
    'n',
    report,
  );
  assert.deepEqual([...eps.keys()].sort(), ['ns1/svc1:', 'ns1/svc1:p53', 'ns1/svc1:p80']);
  assert.equal(eps.get('ns1/svc1:p53')![0].key, '10.180.0.1:53');
  assert.equal(reports.length, 3);
  const text = reports.map((r) => r.msg).join('\n');
  for (const needle of ['bad\\"name', '70000', 'ICMP']) assert.ok(text.includes(needle), needle);
});

test('a slice whose service-name label would break a rule is rejected', () => {
  const { reports, report } = collector();
  const eps = endpointsOfSlices([slice('s', [ep('10.180.0.1')], { service: 'x" -j ACCEPT #' })], 4, 'n', report);
  assert.equal(eps.size, 0);
  assert.equal(reports.length, 1);
  const noLabel = slice('s2', [ep('10.180.0.1')]);
  noLabel.metadata!.labels = undefined;
  assert.equal(endpointsOfSlices([noLabel], 4, 'n', report).size, 0);
  assert.equal(reports.length, 2);
});

test('hints are kept; empty hint names dropped', () => {
  const list = endpointsOfSlices(
    [
      slice('s', [
        ep('10.180.0.1', { hints: { forZones: [{ name: 'zone-a' }, { name: '' }], forNodes: [{ name: 'node-a' }] } }),
        ep('10.180.0.2'),
      ]),
    ],
    4,
    'n',
  ).get('ns1/svc1:p80')!;
  assert.deepEqual(list[0].zoneHints, ['zone-a']);
  assert.deepEqual(list[0].nodeHints, ['node-a']);
  assert.deepEqual(list[1].zoneHints, []);
  assert.deepEqual(list[1].nodeHints, []);
});

test('a slice with ports but no endpoints yields an empty list (service exists, no endpoints)', () => {
  const eps = endpointsOfSlices([slice('s', [])], 4, 'n');
  assert.deepEqual(eps.get('ns1/svc1:p80'), []);
  const nullEps = endpointsOfSlices([{ ...slice('s', []), endpoints: null }], 4, 'n');
  assert.deepEqual(nullEps.get('ns1/svc1:p80'), []);
});

test('empty address and range lists are one shared frozen list; a filled one is the Service\'s own', () => {
  const [a] = servicePortsOf(svc('a', {}), 4);
  const [b] = servicePortsOf(svc('b', { type: 'LoadBalancer', ports: [{ name: 'p80', port: 80, nodePort: 30080 }] }), 4);
  const [c] = servicePortsOf(svc('c', { externalIPs: ['203.0.113.7'], loadBalancerSourceRanges: ['203.0.113.0/24'] }), 4);
  const lists = [a.externalIPs, a.loadBalancerVIPs, a.loadBalancerSourceRanges, b.externalIPs, b.loadBalancerVIPs, b.loadBalancerSourceRanges, c.loadBalancerVIPs];
  for (const l of lists) {
    assert.equal(l, a.externalIPs, 'one shared empty list');
    assert.deepEqual(l, []);
    assert.ok(Object.isFrozen(l), 'a reader that pushes to it fails loudly');
  }
  const [e] = endpointsOfSlices([{ addressType: 'IPv4', metadata: { name: 's', namespace: 'ns1', labels: { 'kubernetes.io/service-name': 'a' } }, ports: [{ name: 'p80', port: 80 }], endpoints: [{ addresses: ['10.180.0.1'] }] }], 4, 'n').get('ns1/a:p80')!;
  assert.equal(e.zoneHints, a.externalIPs);
  assert.equal(e.nodeHints, a.externalIPs);
  assert.deepEqual(c.externalIPs, ['203.0.113.7']);
  assert.deepEqual(c.loadBalancerSourceRanges, ['203.0.113.0/24']);
  assert.ok(!Object.isFrozen(c.externalIPs));
});

test('the ports of one Service share its address lists; each has its own portName', () => {
  const ports = servicePortsOf(svc('a', { externalIPs: ['203.0.113.7'], ports: [{ name: 'p80', port: 80 }, { name: 'p443', port: 443 }] }), 4);
  assert.equal(ports.length, 2);
  assert.equal(ports[0].externalIPs, ports[1].externalIPs);
  assert.deepEqual(ports.map((p) => p.portName), [
    { namespace: 'ns1', name: 'a', port: 'p80', protocol: 'TCP' },
    { namespace: 'ns1', name: 'a', port: 'p443', protocol: 'TCP' },
  ]);
  assert.deepEqual(ports.map((p) => p.serviceKey), ['ns1/a', 'ns1/a']);
});
