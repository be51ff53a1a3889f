// The exact issues src/core/validate.ts reports (path, message, value) for wrong types, numbers,
// enums, label maps and arrays: the words kproxy logs for a skipped object, which users and log
// searches rely on. Also what a valid object keeps: an absent field stays absent.
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { validateEndpointSlice, validateNode, validateService, type Issue } from '../../src/core/validate.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
type Obj = any;

function svc(): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: 'web', namespace: 'ns1', labels: { app: 'web' } },
    spec: {
      type: 'NodePort',
      clusterIP: '172.30.0.41',
      clusterIPs: ['172.30.0.41'],
      ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080 }],
      sessionAffinityConfig: { clientIP: { timeoutSeconds: 600 } },
    },
  };
}

function slice(): Obj {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: 'web-abc12', namespace: 'ns1', labels: { 'kubernetes.io/service-name': 'web' } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: [{ addresses: ['10.180.0.1'], conditions: { ready: true }, nodeName: 'node-a' }],
  };
}

function issuesOf(r: { ok: boolean; issues?: Issue[] }): Issue[] {
  assert.equal(r.ok, false, 'the object is refused');
  return r.issues!;
}

const BETWEEN = 'must be between 1 and 65535';
const FRACTION = 'must be a integer, not float';

describe('issue messages', () => {
  // [what, mutation, expected issues as [path, message, value]]
  const SERVICE_CASES: Array<[string, (s: Obj) => unknown, Array<[string, string, string]>]> = [
    ['port missing', (s) => delete s.spec.ports[0].port, [['spec.ports[0].port', 'required', 'undefined']]],
    ['port a string', (s) => (s.spec.ports[0].port = '80'), [['spec.ports[0].port', 'must be a number, not string', '"80"']]],
    ['port NaN', (s) => (s.spec.ports[0].port = NaN), [['spec.ports[0].port', 'must be a number, not nan', 'NaN']]],
    ['port a fraction', (s) => (s.spec.ports[0].port = 80.5), [['spec.ports[0].port', FRACTION, '80.5']]],
    ['port a negative fraction: both rules', (s) => (s.spec.ports[0].port = -0.5), [['spec.ports[0].port', FRACTION, '-0.5'], ['spec.ports[0].port', BETWEEN, '-0.5']]],
    // YAML's .inf: a number, so the integer and range rules speak, not the type
    ['port Infinity', (s) => (s.spec.ports[0].port = Infinity), [['spec.ports[0].port', FRACTION, 'Infinity'], ['spec.ports[0].port', BETWEEN, 'Infinity']]],
    ['port 0', (s) => (s.spec.ports[0].port = 0), [['spec.ports[0].port', BETWEEN, '0']]],
    ['nodePort 70000', (s) => (s.spec.ports[0].nodePort = 70000), [['spec.ports[0].nodePort', 'must be between 0 and 65535', '70000']]],
    ['affinity timeout 0', (s) => (s.spec.sessionAffinityConfig.clientIP.timeoutSeconds = 0), [['spec.sessionAffinityConfig.clientIP.timeoutSeconds', 'must be between 1 and 86400', '0']]],
    ['targetPort a list', (s) => (s.spec.ports[0].targetPort = [1]), [['spec.ports[0].targetPort', 'must be a number or a port name, not array', '[1]']]],
    ['protocol ICMP', (s) => (s.spec.ports[0].protocol = 'ICMP'), [['spec.ports[0].protocol', 'must be one of "TCP", "UDP", "SCTP", ""', '"ICMP"']]],
    ['protocol a number', (s) => (s.spec.ports[0].protocol = 6), [['spec.ports[0].protocol', "must be a 'TCP' | 'UDP' | 'SCTP' | '', not number", '6']]],
    ['type lower case', (s) => (s.spec.type = 'nodeport'), [['spec.type', 'must be one of "ClusterIP", "NodePort", "LoadBalancer", "ExternalName", ""', '"nodeport"']]],
    ['spec a list', (s) => (s.spec = [1, 2]), [['spec', 'must be an object, not array', '[1,2]']]],
    ['metadata null', (s) => (s.metadata = null), [['metadata', 'must be an object, not null', 'null']]],
    ['name a number', (s) => (s.metadata.name = 5), [['metadata.name', 'must be a string, not number', '5']]],
    ['name missing', (s) => delete s.metadata.name, [['metadata.name', 'required', 'undefined']]],
    ['namespace upper case', (s) => (s.metadata.namespace = 'NS1'), [['metadata.namespace', "must be a DNS-1123 label: lower case alphanumerics or '-', starting and ending with an alphanumeric", '"NS1"']]],
    ['clusterIPs a string', (s) => (s.spec.clusterIPs = 'x'), [['spec.clusterIPs', 'must be an array, not string', '"x"']]],
    ['clusterIPs null inside', (s) => (s.spec.clusterIPs = [null]), [['spec.clusterIPs[0]', 'must be a string, not null', 'null']]],
    ['3 clusterIPs', (s) => (s.spec.clusterIPs = ['172.30.0.41', 'fd00::1', '172.30.0.42']), [['spec.clusterIPs', 'must have at most 2 items', '["172.30.0.41","fd00::1","172.30.0.42"]']]],
    ['trafficDistribution over 253 characters', (s) => (s.spec.trafficDistribution = 'a'.repeat(254)), [['spec.trafficDistribution', 'String must contain at most 253 character(s)', `"${'a'.repeat(99)}…`]]],
    ['labels a string', (s) => (s.metadata.labels = 's'), [['metadata.labels', 'must be an object, not string', '"s"']]],
    ['labels a list', (s) => (s.metadata.labels = ['a']), [['metadata.labels', 'must be an object, not array', '["a"]']]],
    // each entry's key, then its value, in the map's order
    [
      'label keys and values',
      (s) => (s.metadata.labels = { 'Bad Key': 7, ok: 'a b', '-x': 'fine' }),
      [
        ['metadata.labels["Bad Key"]', "name part must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", '7'],
        ['metadata.labels["Bad Key"]', 'must be a string, not number', '7'],
        ['metadata.labels.ok', "must be a label value: empty, or alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", '"a b"'],
        ['metadata.labels["-x"]', "name part must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", '"fine"'],
      ],
    ],
    ['label key prefix', (s) => (s.metadata.labels = { 'Example.com/app': 'x' }), [['metadata.labels["Example.com/app"]', "prefix must be a DNS-1123 subdomain: lower case alphanumerics, '-' or '.', starting and ending with an alphanumeric", '"x"']]],
    // JSON.parse makes "__proto__" an own key: a label key like any other, and not a valid one
    ['a __proto__ label key from JSON', (s) => (s.metadata.labels = JSON.parse('{"__proto__": "x"}')), [['metadata.labels.__proto__', "name part must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric", '"x"']]],
  ];
  for (const [what, mutate, want] of SERVICE_CASES) {
    test(`Service: ${what}`, () => {
      const s = svc();
      mutate(s);
      assert.deepEqual(issuesOf(validateService(s)).map((i) => [i.path, i.message, i.value]), want);
    });
  }

  const SLICE_CASES: Array<[string, (s: Obj) => unknown, Array<[string, string, string]>]> = [
    ['addressType missing', (s) => delete s.addressType, [['addressType', 'required', 'undefined']]],
    ['addressType lower case', (s) => (s.addressType = 'ipv4'), [['addressType', 'must be one of "IPv4", "IPv6", "FQDN"', '"ipv4"']]],
    ['ready a string', (s) => (s.endpoints[0].conditions.ready = 'yes'), [['endpoints[0].conditions.ready', 'must be a boolean, not string', '"yes"']]],
    ['addresses missing', (s) => delete s.endpoints[0].addresses, [['endpoints[0].addresses', 'must be an array, not undefined', 'undefined']]],
    ['addresses empty', (s) => (s.endpoints[0].addresses = []), [['endpoints[0].addresses', 'must not be empty', '[]']]],
    ['an IPv6 address in an IPv4 slice', (s) => (s.endpoints[0].addresses = ['fd00::1']), [['endpoints[0].addresses[0]', 'must be a valid IPv4 address', '"fd00::1"']]],
    ['a loopback address', (s) => (s.endpoints[0].addresses = ['127.0.0.1']), [['endpoints[0].addresses[0]', 'may not be in the loopback range (127.0.0.0/8, ::1/128)', '"127.0.0.1"']]],
    ['a link-local address with leading zeros', (s) => (s.endpoints[0].addresses = ['169.254.001.001']), [['endpoints[0].addresses[0]', 'may not be in the link-local range (169.254.0.0/16, fe80::/10)', '"169.254.001.001"']]],
    ['a link-local multicast address', (s) => (s.endpoints[0].addresses = ['224.0.0.251']), [['endpoints[0].addresses[0]', 'may not be in the link-local multicast range (224.0.0.0/24, ff02::/10)', '"224.0.0.251"']]],
    ['the unspecified address', (s) => (s.endpoints[0].addresses = ['0.0.0.0']), [['endpoints[0].addresses[0]', 'may not be unspecified', '"0.0.0.0"']]],
    ['an octet over 255', (s) => (s.endpoints[0].addresses = ['10.0.0.256']), [['endpoints[0].addresses[0]', 'must be a valid IPv4 address', '"10.0.0.256"']]],
    ['port a fraction', (s) => (s.ports[0].port = 1.5), [['ports[0].port', FRACTION, '1.5']]],
  ];
  for (const [what, mutate, want] of SLICE_CASES) {
    test(`EndpointSlice: ${what}`, () => {
      const s = slice();
      mutate(s);
      assert.deepEqual(issuesOf(validateEndpointSlice(s)).map((i) => [i.path, i.message, i.value]), want);
    });
  }

  test('Node: a podCIDRs string and a taint without a key', () => {
    const node = { metadata: { name: 'node-a' }, spec: { podCIDRs: '10.0.0.0/24', taints: [{ effect: 'NoSchedule' }] } };
    assert.deepEqual(issuesOf(validateNode(node)).map((i) => [i.path, i.message, i.value]), [
      ['spec.podCIDRs', 'must be an array, not string', '"10.0.0.0/24"'],
      ['spec.taints[0].key', 'required', 'undefined'],
    ]);
  });
});

describe('what a valid object keeps', () => {
  test('an absent optional field stays absent; null stays null; unknown fields are dropped', () => {
    const s = svc();
    s.spec.selector = { app: 'web' };
    s.spec.externalName = null;
    const r = validateService(s);
    assert.ok(r.ok);
    const spec = r.value.spec as Obj;
    assert.equal('selector' in spec, false);
    assert.equal('externalIPs' in spec, false);
    assert.equal(spec.externalName, null);
    assert.deepEqual(r.value.metadata, { name: 'web', namespace: 'ns1', labels: { app: 'web' } });
  });

  test('a slice keeps only the last-change-trigger-time annotation, and none when it has none', () => {
    const plain = validateEndpointSlice(slice());
    assert.ok(plain.ok);
    assert.equal('annotations' in plain.value.metadata!, false);
    const s = slice();
    s.metadata.annotations = { 'endpoints.kubernetes.io/last-change-trigger-time': '2024-01-01T00:00:00Z', other: 'x' };
    const r = validateEndpointSlice(s);
    assert.ok(r.ok);
    assert.deepEqual(r.value.metadata!.annotations, { 'endpoints.kubernetes.io/last-change-trigger-time': '2024-01-01T00:00:00Z' });
  });

  test('an endpoint address with leading zeros is accepted as upstream accepts it', () => {
    const s = slice();
    s.endpoints[0].addresses = ['010.180.000.001'];
    assert.ok(validateEndpointSlice(s).ok);
  });
});
