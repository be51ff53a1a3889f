// Hostile and odd input for the fuzz tests: API objects with wrong types, special or
// non-canonical IPs, names at and beyond the kernel's and Kubernetes' limits, ports out of
// range, huge arrays, and files that are not YAML at all. Built with fast-check, so the same
// seed gives the same corpus (a failure is reproducible from the seed in its message).
//
// Hostile objects live in namespaces "h-<n>" and never use the good Services' addresses, so a
// test can check that the good Services are programmed whatever else is in the directory.
import fc from 'fast-check';
import { stringify } from 'yaml';

/** Three good Services (TCP, UDP, NodePort) with ready endpoints: the ones that must stay programmed. */
export const GOOD = [
  { name: 'good-a', ip: '172.30.250.1', port: 80, proto: 'TCP', ep: ['10.180.250.1', '10.180.250.2'], targetPort: 8080 },
  { name: 'good-b', ip: '172.30.250.2', port: 53, proto: 'UDP', ep: ['10.180.250.3'], targetPort: 5353 },
  { name: 'good-c', ip: '172.30.250.3', port: 443, proto: 'TCP', ep: ['10.180.250.4'], targetPort: 8443, nodePort: 30443 },
] as const;
export const GOOD_NS = 'fuzz-good';

/** The good Services' manifests; `extraA` adds endpoints to good-a (a good change). */
export function goodManifests(extraA: string[] = []): string {
  const docs: unknown[] = [];
  for (const g of GOOD) {
    docs.push({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: g.name, namespace: GOOD_NS },
      spec: {
        type: 'nodePort' in g ? 'NodePort' : 'ClusterIP',
        clusterIP: g.ip,
        clusterIPs: [g.ip],
        ports: [{ name: 'p', port: g.port, protocol: g.proto, targetPort: g.targetPort, ...('nodePort' in g ? { nodePort: g.nodePort } : {}) }],
      },
    });
    docs.push({
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: { name: `${g.name}-1`, namespace: GOOD_NS, labels: { 'kubernetes.io/service-name': g.name } },
      addressType: 'IPv4',
      ports: [{ name: 'p', port: g.targetPort, protocol: g.proto }],
      endpoints: [...g.ep, ...(g.name === 'good-a' ? extraA : [])].map((ip) => ({ addresses: [ip], conditions: { ready: true }, nodeName: 'other-node' })),
    });
  }
  return docs.map((d) => stringify(d)).join('---\n');
}

const SPECIAL_IPS = [
  '127.0.0.1', '127.0.0.53', '0.0.0.0', '255.255.255.255', '224.0.0.1', '239.255.255.250', '169.254.169.254',
  '::', '::1', 'fe80::1', 'ff02::1', '010.1.2.3', '1.2.3', '::ffff:1.2.3.4', '1.2.3.4/32', '', ' 172.30.9.9',
  '172.30.9.9\n', '300.1.1.1', '1.2.3.4.5', 'fd00::1%eth0', 'localhost', '0x7f000001', '2130706433',
];
const HOSTILE_VALUES: unknown[] = [
  5, -1, 0, 1.5, 1e20, 'x', 's', '', null, [null], [[]], {}, [], true, false, { a: 1 }, ['x'], [5], '80', 'NaN',
  'a'.repeat(300), '"; drop', '$(reboot)', '\n-A INPUT -j DROP\n', '} ; flush ruleset ; {', 'é\u0000\u202e',
];
const SOURCE_RANGES = ['0.0.0.0/0', '::/0', '10.0.0.0/33', 'x', '1.2.3.4', '203.0.113.0/24', '0.0.0.0/32', '1.2.3.4/0', '::/129'];
const PORTS: unknown[] = [0, 65536, -1, 1.5, '80', 1e9, null, 65535, 1];

const lower = fc.constantFrom(...'abcdefghijklmnopqrstuvwxyz0123456789-'.split(''));
const dnsLabel = (max: number) =>
  fc.tuple(fc.constantFrom(...'abcdefghijklmnopqrstuvwxyz'.split('')), fc.array(lower, { maxLength: max - 2 }), fc.constantFrom(...'abcdefghijklmnopqrstuvwxyz0123456789'.split('')))
    .map(([a, mid, z]) => a + mid.join('') + z);
const hostileName = fc.oneof(
  dnsLabel(63),
  fc.constant('a'.repeat(63)),
  fc.constant('b'.repeat(64)),
  fc.constant('c'.repeat(253)),
  fc.constantFrom('UPPER', 'with space', 'quo"te', "it's", 'new\nline', 'semi;colon', 'slash/x', 'dot.ted', '-lead', 'trail-', 'ünï', '*', '$(id)', '`id`'),
  fc.string({ maxLength: 80 }),
);
const portName = fc.oneof(fc.constant(''), dnsLabel(15), fc.constant('p'.repeat(15)), fc.constant('q'.repeat(16)), fc.constantFrom('UP', 'a b', 'x"y', '12345'));

/** A Service that is valid, with every field from a well-formed distribution (before mutation). */
function baseService(i: number): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: `s${i}`, namespace: `h-${i}`, labels: { app: 'x' } },
    spec: {
      type: 'LoadBalancer',
      clusterIP: `172.30.${(i >> 8) & 0xff}.${i & 0xff}`,
      clusterIPs: [`172.30.${(i >> 8) & 0xff}.${i & 0xff}`],
      ports: [{ name: 'http', port: 80, protocol: 'TCP', targetPort: 8080, nodePort: 30000 + (i % 2000) }],
      externalIPs: ['198.51.100.10'],
      loadBalancerSourceRanges: ['203.0.113.0/24'],
      sessionAffinity: 'ClientIP',
      sessionAffinityConfig: { clientIP: { timeoutSeconds: 300 } },
      externalTrafficPolicy: 'Local',
      internalTrafficPolicy: 'Cluster',
      healthCheckNodePort: 32000 + (i % 700),
    },
    status: { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } },
  };
}

function baseSlice(i: number): Record<string, unknown> {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { name: `s${i}-1`, namespace: `h-${i}`, labels: { 'kubernetes.io/service-name': `s${i}` } },
    addressType: 'IPv4',
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    endpoints: [
      { addresses: [`10.180.${(i >> 8) & 0xff}.${i & 0xff}`], conditions: { ready: true, serving: true, terminating: false }, nodeName: 'fuzz-node', zone: 'z1', hints: { forZones: [{ name: 'z1' }] } },
    ],
  };
}

const SERVICE_PATHS = [
  ['spec'], ['spec', 'ports'], ['spec', 'ports', 0], ['spec', 'ports', 0, 'port'], ['spec', 'ports', 0, 'nodePort'], ['spec', 'ports', 0, 'name'],
  ['spec', 'ports', 0, 'protocol'], ['spec', 'ports', 0, 'targetPort'], ['spec', 'clusterIP'], ['spec', 'clusterIPs'], ['spec', 'clusterIPs', 0],
  ['spec', 'externalIPs'], ['spec', 'externalIPs', 0], ['spec', 'loadBalancerSourceRanges'], ['spec', 'loadBalancerSourceRanges', 0],
  ['spec', 'sessionAffinity'], ['spec', 'sessionAffinityConfig', 'clientIP', 'timeoutSeconds'], ['spec', 'externalTrafficPolicy'],
  ['spec', 'internalTrafficPolicy'], ['spec', 'healthCheckNodePort'], ['spec', 'type'], ['spec', 'ipFamilies'], ['metadata'], ['metadata', 'name'],
  ['metadata', 'namespace'], ['metadata', 'labels'], ['metadata', 'labels', 'service.kubernetes.io/service-proxy-name'], ['status'],
  ['status', 'loadBalancer', 'ingress'], ['status', 'loadBalancer', 'ingress', 0], ['status', 'loadBalancer', 'ingress', 0, 'ip'],
];
const SLICE_PATHS = [
  ['endpoints'], ['endpoints', 0], ['endpoints', 0, 'addresses'], ['endpoints', 0, 'addresses', 0], ['endpoints', 0, 'conditions'],
  ['endpoints', 0, 'conditions', 'ready'], ['endpoints', 0, 'nodeName'], ['endpoints', 0, 'zone'], ['endpoints', 0, 'hints'],
  ['endpoints', 0, 'hints', 'forZones'], ['endpoints', 0, 'hints', 'forZones', 0, 'name'], ['ports'], ['ports', 0], ['ports', 0, 'port'],
  ['ports', 0, 'name'], ['ports', 0, 'protocol'], ['addressType'], ['metadata', 'labels'], ['metadata', 'labels', 'kubernetes.io/service-name'],
  ['metadata', 'name'], ['metadata', 'namespace'],
];

function setPath(obj: Record<string, unknown>, path: (string | number)[], value: unknown): void {
  let cur: unknown = obj;
  for (let k = 0; k < path.length - 1; k++) {
    const key = path[k];
    const next = (cur as Record<string | number, unknown>)[key];
    if (next === null || typeof next !== 'object') {
      (cur as Record<string | number, unknown>)[key] = typeof path[k + 1] === 'number' ? [] : {};
    }
    cur = (cur as Record<string | number, unknown>)[key];
  }
  (cur as Record<string | number, unknown>)[path[path.length - 1]] = value;
}

type Mutation = (o: Record<string, unknown>) => void;

const valueFor = (path: (string | number)[]): fc.Arbitrary<unknown> => {
  const last = String(path[path.length - 1]);
  const generic = fc.oneof(fc.constantFrom(...HOSTILE_VALUES), fc.anything({ maxDepth: 2, maxKeys: 3 }));
  if (/ip|IPs|addresses/i.test(last) || last === '0') {
    return fc.oneof({ weight: 3, arbitrary: fc.constantFrom(...SPECIAL_IPS) }, { weight: 1, arbitrary: fc.array(fc.constantFrom(...SPECIAL_IPS), { maxLength: 3 }) }, { weight: 1, arbitrary: generic });
  }
  if (/port/i.test(last)) return fc.oneof(fc.constantFrom(...PORTS), generic);
  if (/Ranges/.test(last)) return fc.oneof(fc.array(fc.constantFrom(...SOURCE_RANGES), { minLength: 1, maxLength: 3 }), generic);
  if (last === 'name' || last === 'namespace') return fc.oneof(hostileName, generic);
  return generic;
};

const mutation = (paths: (string | number)[][]): fc.Arbitrary<Mutation> =>
  fc.constantFrom(...paths).chain((path) => valueFor(path).map((v) => (o: Record<string, unknown>) => setPath(o, path, v)));

/** Valid-but-extreme shapes: long names, many ports and endpoints, /0 source ranges, dual-stack. */
const extreme: fc.Arbitrary<Mutation> = fc.constantFrom<Mutation>(
  (o) => {
    setPath(o, ['metadata', 'namespace'], 'n'.repeat(63));
    setPath(o, ['metadata', 'name'], 'm'.repeat(63));
    setPath(o, ['spec', 'ports', 0, 'name'], 'p'.repeat(15));
  },
  (o) => setPath(o, ['spec', 'loadBalancerSourceRanges'], ['0.0.0.0/0']),
  (o) => setPath(o, ['spec', 'loadBalancerSourceRanges'], ['0.0.0.0/0', '::/0', '10.0.0.0/8']),
  (o) => setPath(o, ['spec', 'ports'], Array.from({ length: 100 }, (_, k) => ({ name: `p${k}`, port: 1000 + k, protocol: k % 3 === 0 ? 'UDP' : k % 3 === 1 ? 'SCTP' : 'TCP' }))),
  (o) => setPath(o, ['spec', 'ipFamilies'], ['IPv4', 'IPv6']),
  (o) => setPath(o, ['spec', 'externalIPs'], Array.from({ length: 200 }, (_, k) => `198.51.${k >> 8}.${k & 0xff}`)),
  (o) => setPath(o, ['spec', 'clusterIPs'], [(o.spec as { clusterIP?: unknown } | undefined)?.clusterIP ?? '172.30.254.254', 'fd00:30::1']),
  (o) => setPath(o, ['spec', 'type'], 'ExternalName'),
  (o) => setPath(o, ['spec', 'clusterIP'], 'None'),
  (o) => setPath(o, ['spec', 'sessionAffinityConfig', 'clientIP', 'timeoutSeconds'], 86400),
  (o) => setPath(o, ['endpoints'], Array.from({ length: 300 }, (_, k) => ({ addresses: [`10.181.${k >> 8}.${k & 0xff}`], conditions: { ready: k % 2 === 0, serving: true, terminating: k % 2 === 1 } }))),
  (o) => setPath(o, ['endpoints', 0, 'conditions'], { ready: false, serving: true, terminating: true }),
  (o) => setPath(o, ['addressType'], 'FQDN'),
);

const serviceArb = (i: number) =>
  fc.array(fc.oneof({ weight: 4, arbitrary: mutation(SERVICE_PATHS) }, { weight: 1, arbitrary: extreme }), { minLength: 1, maxLength: 3 })
    .map((muts) => {
      const o = baseService(i);
      for (const m of muts) m(o);
      return o;
    });
const sliceArb = (i: number) =>
  fc.array(fc.oneof({ weight: 4, arbitrary: mutation(SLICE_PATHS) }, { weight: 1, arbitrary: extreme }), { minLength: 1, maxLength: 3 })
    .map((muts) => {
      const o = baseSlice(i);
      for (const m of muts) m(o);
      return o;
    });

/** One hostile API object (a Service or an EndpointSlice) for index i. */
export const hostileObject = (i: number): fc.Arbitrary<Record<string, unknown>> => fc.oneof(serviceArb(i), sliceArb(i));

/** Whole-document and whole-file hostility: not YAML, not an object, YAML features. */
const RAW_FILES: string[] = [
  '\u0000\u0001\u0002binary\u00ff',
  'kind: Service\n\tmetadata: tab-indented\n',
  'apiVersion: v1\nkind: Service\nmetadata: {name: "unclosed\n',
  'a: &a ["x","x","x","x","x","x","x","x","x"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: [*d,*d,*d,*d,*d,*d,*d,*d,*d]\nkind: Service\n',
  `${'['.repeat(2000)}${']'.repeat(2000)}\n`,
  'kind: Service\nmetadata: !!js/function "function(){}"\n',
  '--- 5\n--- "string"\n--- [1,2]\n--- null\n',
  'kind: [Service]\nmetadata: {name: x, namespace: y}\n',
  'apiVersion: v1\nkind: Service\n',
  'apiVersion: v1\nkind: Service\nmetadata: {name: dup, namespace: h-dup}\nspec: {clusterIP: 172.30.200.1, ports: [{port: 80}]}\n',
  '{"kind": "Service", "metadata": {"name": "j", "namespace": "h-json"}, "spec": {"clusterIP": "172.30.200.2", "ports": [{"port": 1e400}]}}',
  'kind: Node\nmetadata: {name: fuzz-node, labels: "s"}\n',
  'kind: Node\nmetadata: {name: fuzz-node, labels: {topology.kubernetes.io/zone: [z]}}\n',
  '',
  '# only a comment\n',
  'x'.repeat(100_000),
];

export interface HostileFile {
  name: string;
  content: string;
}

/**
 * A deterministic directory's worth of hostile files: `count` files of one to three
 * hostile objects each, plus the raw files above (the duplicate one twice).
 */
export function hostileCorpus(count: number, seed: number): HostileFile[] {
  const files: HostileFile[] = RAW_FILES.map((content, k) => ({ name: `raw-${k}.yaml`, content }));
  files.push({ name: 'raw-dup-again.yaml', content: RAW_FILES[9] });
  const perFile = fc.sample(fc.integer({ min: 1, max: 3 }), { seed, numRuns: count });
  let i = 0;
  perFile.forEach((n, f) => {
    // Each object gets its own index, so its namespace ("h-<i>") and addresses differ from every other's.
    const docs = Array.from({ length: n }, () => {
      const idx = i++;
      return fc.sample(hostileObject(idx), { seed: seed + idx, numRuns: 1 })[0];
    });
    const json = f % 10 === 0;
    let content: string;
    try {
      content = json ? (JSON.stringify(docs[0]) ?? 'null') : docs.map((d) => stringify(d)).join('---\n');
    } catch {
      content = JSON.stringify(docs[0]) ?? 'null';
    }
    files.push({ name: `h-${String(f).padStart(5, '0')}.${json ? 'json' : 'yaml'}`, content });
  });
  return files;
}
