// Services and EndpointSlices strictly inside the API server's rules, built with fast-check: the
// objects a real cluster can hand kproxy. Every rule below is the API server's
// (pkg/apis/core/validation ValidateService, validateServicePort, ValidateLoadBalancerStatus,
// ValidateEndpointIP; pkg/apis/discovery/validation ValidateEndpointSlice) or its allocators'
// (unique ClusterIPs and NodePorts):
//
// - namespace and port names are DNS-1123 labels up to 63 characters (a port name may be all
//   digits, "8443"); a Service name is a DNS label (RelaxedServiceNameValidation), so it may
//   start with a digit; a named targetPort is an IANA_SVC_NAME (up to 15, at least one letter);
// - every port has a name when a Service has more than one, names and port/protocol pairs are
//   unique; NodePorts only for NodePort and LoadBalancer (LoadBalancer without them when
//   allocateLoadBalancerNodePorts is false), unique per protocol across Services;
// - externalTrafficPolicy only on externally accessible Services (NodePort, LoadBalancer, or
//   with externalIPs), healthCheckNodePort only with LoadBalancer and Local,
//   loadBalancerSourceRanges and status.loadBalancer.ingress only with LoadBalancer;
// - headless Services (clusterIP None) are of type ClusterIP without NodePorts or externalIPs;
//   ExternalName Services have no ClusterIP and no internalTrafficPolicy;
// - every address is ordinary unicast (ValidateEndpointIP), and canonical, so a test can look for
//   it in rendered text as written.
//
// Addresses follow the project's plan (ClusterIPs 172.30.0.0/16 and fd00:172:30::/48,
// endpoints 10.180.0.0/16 and fd00:10:180::/48, LB IPs 1.2.x.x and 2001:db8:ff::/48, external
// IPs 198.51.100.0/24 and 2001:db8::/48); the node is node-a, 192.168.0.2 and fd00:192:168::2.
import fc from 'fast-check';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import type { ProxyState } from '../../src/core/model.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';

export const NODE_NAME = 'node-a';
export const NODE_IP = { 4: '192.168.0.2', 6: 'fd00:192:168::2' } as const;

const LETTERS = 'abcdefghijklmnopqrstuvwxyz';
const DIGITS = '0123456789';
const ALNUM = LETTERS + DIGITS;

const charOf = (alphabet: string) => fc.integer({ min: 0, max: alphabet.length - 1 }).map((i) => alphabet[i]);

/** A DNS-1123 label of 1..max characters, often exactly max long. */
export function dnsLabel(max = 63): fc.Arbitrary<string> {
  const length = fc.oneof({ weight: 2, arbitrary: fc.constant(max) }, { weight: 3, arbitrary: fc.integer({ min: 1, max }) });
  const general = length.chain((n) =>
    n === 1
      ? charOf(ALNUM)
      : fc
          .tuple(charOf(ALNUM), fc.array(charOf(ALNUM + '-'), { minLength: n - 2, maxLength: n - 2 }), charOf(ALNUM))
          .map(([a, mid, z]) => a + mid.join('') + z),
  );
  // all digits: a valid label, and a port name the API server accepts ("8443")
  const digits = length.chain((n) => fc.array(charOf(DIGITS), { minLength: n, maxLength: n }).map((d) => d.join('')));
  return fc.oneof({ weight: 4, arbitrary: general }, { weight: 1, arbitrary: digits });
}

/** IANA_SVC_NAME (IsValidPortName): 1-15 of [-a-z0-9], a letter, no "--", no '-' at either end. */
export const ianaSvcName: fc.Arbitrary<string> = fc
  .array(fc.array(charOf(ALNUM), { minLength: 1, maxLength: 5 }).map((c) => c.join('')), { minLength: 1, maxLength: 3 })
  .chain((parts) => fc.tuple(fc.constant(parts.join('-').slice(0, 15).replace(/-+$/, '')), charOf(LETTERS), fc.nat()))
  .map(([s, letter, at]) => {
    if (/[a-z]/.test(s)) return s;
    // no letter yet: one letter in place of a digit
    const i = at % s.length;
    return s[i] === '-' ? letter + s.slice(1) : s.slice(0, i) + letter + s.slice(i + 1);
  });

const hexGroup = fc.integer({ min: 1, max: 0xffff }).map((n) => n.toString(16));
/** Four non-zero groups: an IPv6 address ending in them has no zero run, so it is canonical as written. */
const fourGroups = fc.array(hexGroup, { minLength: 4, maxLength: 4 }).map((g) => g.join(':'));

export type Stack = 'v4' | 'v6' | 'v4v6' | 'v6v4';
export type Kind = 'ClusterIP' | 'NodePort' | 'LoadBalancer' | 'ExternalName' | 'Headless';
export type Protocol = 'TCP' | 'UDP' | 'SCTP';

interface PortDraft {
  protocol: Protocol;
  port: number;
  /** a number, or an IANA name that the slices resolve to `endpointPort` */
  targetPort: number | string;
  endpointPort: number;
}

interface EndpointDraft {
  v4: [number, number];
  v6: string;
  ready: boolean;
  serving: boolean;
  terminating: boolean;
  local: boolean;
}

interface ServiceDraft {
  namespace: string;
  name: string;
  stack: Stack;
  kind: Kind;
  ports: PortDraft[];
  portNames: string[];
  clusterHost: number;
  clusterV6: string;
  externalIPs: number;
  lbIngress: number;
  lbIpModeProxy: boolean;
  sourceRanges: Array<{ prefix: number; a: number; b: number; masked: boolean }>;
  externalLocal: boolean;
  internalLocal: boolean;
  affinity: number | null | 'default';
  allocateNodePorts: boolean;
  /** per family, 0-2 slices of endpoints; a slice may leave out one port */
  slices: Array<{ endpoints: EndpointDraft[]; dropPort: number | null }>;
}

const endpointDraft: fc.Arbitrary<EndpointDraft> = fc.record({
  v4: fc.tuple(fc.integer({ min: 0, max: 255 }), fc.integer({ min: 1, max: 254 })),
  v6: fourGroups,
  ready: fc.boolean(),
  serving: fc.boolean(),
  terminating: fc.boolean(),
  local: fc.boolean(),
});

const portDrafts: fc.Arbitrary<PortDraft[]> = fc
  .uniqueArray(
    fc.record({
      protocol: fc.constantFrom<Protocol>('TCP', 'TCP', 'UDP', 'SCTP'),
      port: fc.oneof(fc.constantFrom(80, 443, 53, 8443), fc.integer({ min: 1, max: 65535 })),
      named: fc.boolean(),
      name: ianaSvcName,
      endpointPort: fc.integer({ min: 1, max: 65535 }),
    }),
    { minLength: 1, maxLength: 4, selector: (p) => `${p.port}/${p.protocol}` },
  )
  .map((ps) => ps.map((p) => ({ protocol: p.protocol, port: p.port, targetPort: p.named ? p.name : p.endpointPort, endpointPort: p.endpointPort })));

const serviceDraft: fc.Arbitrary<ServiceDraft> = portDrafts.chain((ports) =>
  fc.record({
    namespace: dnsLabel(),
    name: dnsLabel(),
    stack: fc.constantFrom<Stack>('v4', 'v6', 'v4v6', 'v6v4'),
    kind: fc.constantFrom<Kind>('ClusterIP', 'NodePort', 'LoadBalancer', 'LoadBalancer', 'ExternalName', 'Headless'),
    ports: fc.constant(ports),
    // one port may be unnamed; more need distinct names
    portNames:
      ports.length === 1
        ? fc.oneof(fc.constant<string[]>(['']), dnsLabel().map((n) => [n]))
        : fc.uniqueArray(dnsLabel(), { minLength: ports.length, maxLength: ports.length }),
    clusterHost: fc.integer({ min: 1, max: 254 }),
    clusterV6: fourGroups,
    externalIPs: fc.integer({ min: 0, max: 2 }),
    lbIngress: fc.integer({ min: 1, max: 2 }),
    lbIpModeProxy: fc.boolean(),
    sourceRanges: fc.array(
      fc.record({ prefix: fc.oneof({ weight: 1, arbitrary: fc.constant(0) }, { weight: 9, arbitrary: fc.integer({ min: 8, max: 32 }) }), a: fc.integer({ min: 1, max: 223 }), b: fc.integer({ min: 0, max: 255 }), masked: fc.boolean() }),
      { maxLength: 2 },
    ),
    externalLocal: fc.boolean(),
    internalLocal: fc.boolean(),
    affinity: fc.oneof(fc.constant(null), fc.constant<'default'>('default'), fc.integer({ min: 1, max: 86400 })),
    allocateNodePorts: fc.oneof({ weight: 4, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
    slices: fc.array(fc.record({ endpoints: fc.array(endpointDraft, { maxLength: 4 }), dropPort: fc.oneof({ weight: 4, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.nat(3) }) }), { maxLength: 2 }),
  }),
);

/** A generated port as the modes must program it (or, for headless and ExternalName, skip it). */
export interface ExpectedPort {
  namespace: string;
  name: string;
  portName: string;
  protocol: Protocol;
  port: number;
  /** 0: none */
  nodePort: number;
  clusterIPs: { 4?: string; 6?: string };
  /** headless and ExternalName ports: no proxy programs them (upstream's ShouldSkipService) */
  skipped: boolean;
}

export interface World {
  services: K8sService[];
  slices: K8sEndpointSlice[];
  ports: ExpectedPort[];
}

const FAMILY_NAME = { 4: 'IPv4', 6: 'IPv6' } as const;

function families(stack: Stack): Array<4 | 6> {
  return stack === 'v4' ? [4] : stack === 'v6' ? [6] : stack === 'v4v6' ? [4, 6] : [6, 4];
}

/**
 * A loadBalancerSourceRanges entry: a network, or (ParseCIDRSloppy accepts it) an address with
 * host bits under its prefix; /0 too.
 */
function sourceRange(r: { prefix: number; a: number; b: number; masked: boolean }, family: 4 | 6): string {
  if (r.prefix === 0) return family === 4 ? '0.0.0.0/0' : '::/0';
  if (family === 6) {
    // 2001:db8:a:b:1:2:3:4 under a /40../64 prefix, all eight groups written out
    const prefix = r.prefix + 32;
    const groups = [0x2001, 0xdb8, r.a, r.b, 1, 2, 3, 4].map((g, k) => {
      const keep = Math.max(0, Math.min(16, prefix - 16 * k));
      return r.masked ? (keep === 0 ? 0 : g & (0xffff << (16 - keep)) & 0xffff) : g;
    });
    return `${groups.map((g) => g.toString(16)).join(':')}/${prefix}`;
  }
  const addr = ((r.a << 24) | (r.b << 16) | 0x0201) >>> 0;
  const value = r.masked && r.prefix < 32 ? (addr & ~((1 << (32 - r.prefix)) - 1)) >>> 0 : addr;
  return `${value >>> 24}.${(value >>> 16) & 255}.${(value >>> 8) & 255}.${value & 255}/${r.prefix}`;
}

/** The objects of one Service draft; i numbers the Service in its world (unique IPs and NodePorts). */
function build(d: ServiceDraft, i: number, nodePortBase: number): { service: K8sService; slices: K8sEndpointSlice[]; ports: ExpectedPort[] } {
  const fams = families(d.stack);
  const headless = d.kind === 'Headless';
  const externalName = d.kind === 'ExternalName';
  const type = headless ? 'ClusterIP' : d.kind;
  const withNodePorts = type === 'NodePort' || (type === 'LoadBalancer' && d.allocateNodePorts);
  const clusterIPOf = { 4: `172.30.${i}.${d.clusterHost}`, 6: `fd00:172:30:${(i + 1).toString(16)}:${d.clusterV6}` } as const;
  const externalIPs = headless || externalName ? [] : fams.flatMap((f) => Array.from({ length: d.externalIPs }, (_, k) => (f === 4 ? `198.51.100.${i * 4 + k + 1}` : `2001:db8:${i + 1}::${k + 1}`)));
  const externallyAccessible = type === 'NodePort' || type === 'LoadBalancer' || (type === 'ClusterIP' && externalIPs.length > 0);
  const ports = d.ports.map((p, k) => ({
    name: d.portNames[k] || undefined,
    protocol: p.protocol,
    port: p.port,
    targetPort: p.targetPort,
    ...(withNodePorts ? { nodePort: nodePortBase + i * 8 + k } : {}),
  }));
  const spec: Record<string, unknown> = { type, ports };
  if (externalName) {
    spec.externalName = 'backend.example.com';
  } else {
    spec.clusterIP = headless ? 'None' : clusterIPOf[fams[0]];
    spec.clusterIPs = headless ? ['None'] : fams.map((f) => clusterIPOf[f]);
    spec.ipFamilies = fams.map((f) => FAMILY_NAME[f]);
    spec.ipFamilyPolicy = fams.length === 2 ? 'RequireDualStack' : 'SingleStack';
    spec.internalTrafficPolicy = d.internalLocal ? 'Local' : 'Cluster';
    spec.sessionAffinity = d.affinity === null ? 'None' : 'ClientIP';
    if (typeof d.affinity === 'number') spec.sessionAffinityConfig = { clientIP: { timeoutSeconds: d.affinity } };
  }
  if (externalIPs.length) spec.externalIPs = externalIPs;
  if (externallyAccessible) spec.externalTrafficPolicy = d.externalLocal ? 'Local' : 'Cluster';
  const service: K8sService & { status?: unknown } = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: d.namespace, name: d.name },
    spec: spec as K8sService['spec'],
  };
  if (type === 'LoadBalancer') {
    if (!d.allocateNodePorts) spec.allocateLoadBalancerNodePorts = false;
    if (d.externalLocal) spec.healthCheckNodePort = 32700 + i;
    if (d.sourceRanges.length) spec.loadBalancerSourceRanges = fams.flatMap((f) => d.sourceRanges.map((r) => sourceRange(r, f)));
    service.status = {
      loadBalancer: {
        ingress: fams.flatMap((f) =>
          Array.from({ length: d.lbIngress }, (_, k) => ({
            ip: f === 4 ? `1.2.${3 + i}.${4 + k}` : `2001:db8:ff:${i + 1}::${k + 1}`,
            ...(d.lbIpModeProxy && k === 1 ? { ipMode: 'Proxy' } : {}),
          })),
        ),
      },
    };
  }

  const slices: K8sEndpointSlice[] = [];
  if (!externalName) {
    for (const f of fams) {
      const seen = new Set<string>();
      d.slices.forEach((s, n) => {
        const endpoints = s.endpoints
          .map((e) => ({ e, address: f === 4 ? `10.180.${e.v4[0]}.${e.v4[1]}` : `fd00:10:180:${i + 1}:${e.v6}` }))
          .filter(({ address }) => !seen.has(address) && (seen.add(address), true))
          .map(({ e, address }) => ({
            addresses: [address],
            conditions: { ready: e.ready, serving: e.serving, terminating: e.terminating },
            nodeName: e.local ? NODE_NAME : 'node-b',
            zone: 'zone-a',
          }));
        slices.push({
          apiVersion: 'discovery.k8s.io/v1',
          kind: 'EndpointSlice',
          metadata: {
            namespace: d.namespace,
            name: `${d.name}-${f === 4 ? 'v4' : 'v6'}${n}`,
            labels: { 'kubernetes.io/service-name': d.name, 'endpointslice.kubernetes.io/managed-by': 'endpointslice-controller.k8s.io' },
          },
          addressType: FAMILY_NAME[f],
          endpoints,
          ports: d.ports
            .map((p, k) => ({ name: d.portNames[k], protocol: p.protocol, port: p.endpointPort }))
            .filter((_, k) => s.dropPort === null || s.dropPort !== k),
        });
      });
    }
  }

  const expected = ports.map((p, k) => ({
    namespace: d.namespace,
    name: d.name,
    portName: d.portNames[k],
    protocol: p.protocol,
    port: p.port,
    nodePort: p.nodePort ?? 0,
    clusterIPs: headless || externalName ? {} : Object.fromEntries(fams.map((f) => [f, clusterIPOf[f]])),
    skipped: headless || externalName,
  }));
  return { service, slices, ports: expected };
}

/** 1..maxServices Services with their slices; (namespace, name) unique, as in a cluster. */
export function world(maxServices = 4): fc.Arbitrary<World> {
  return fc
    .tuple(fc.uniqueArray(serviceDraft, { minLength: 1, maxLength: maxServices, selector: (d) => `${d.namespace}/${d.name}` }), fc.integer({ min: 30000, max: 32000 }))
    .map(([drafts, nodePortBase]) => {
      const out: World = { services: [], slices: [], ports: [] };
      drafts.forEach((d, i) => {
        const b = build(d, i, nodePortBase);
        out.services.push(b.service);
        out.slices.push(...b.slices);
        out.ports.push(...b.ports);
      });
      return out;
    });
}

/**
 * A world through one family's trackers, as a source hands the objects over (validation
 * included): the state a mode plans, the objects validation refused (what
 * kproxy_invalid_objects_total counts) and everything reported.
 */
export function trackWorld(w: World, family: 4 | 6): { state: ProxyState; invalid: string[]; reports: string[] } {
  const invalid: string[] = [];
  const reports: string[] = [];
  const t = new ProxyStateTracker(family, NODE_NAME, (msg, obj) => reports.push(`${obj}: ${msg}`), {
    onInvalid: (kind, obj) => invalid.push(`${kind} ${obj}`),
  });
  for (const s of w.services) t.services.update(null, s);
  for (const s of w.slices) t.endpoints.update(null, s);
  t.apply();
  return { state: t.state, invalid, reports };
}
