// Transcription of upstream Kubernetes' validation test tables for Services and EndpointSlices
// into v1 JSON objects: services.json and endpointslices.json next to this file are written from
// here (`node --import tsx test/core/upstream-validation/transcribe.ts`), and
// test/core/upstream-validation.test.ts checks they are still what this file produces.
//
// Each upstream case is a base object plus a tweak and an error count; here the tweak is written
// again in JavaScript on the v1 JSON shape, case by case and in upstream's order, and the result
// is stored AFTER the tweak, as the API server serves it. Go zero values have no JSON form where
// the v1 field is `omitempty` (an empty string, a nil pointer, slice or map, a zero nodePort):
// they are left out, which is the faithful JSON. `upstream` is "accept" when upstream's table
// expects zero errors, "reject" otherwise.
//
// kproxyAccepts on a rejected case says why kproxy accepting it cannot hurt; the test checks that
// the set of rejected cases kproxy accepts is exactly the set that carries one.
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';

/* eslint-disable @typescript-eslint/no-explicit-any */
type Obj = any;

export interface UpstreamCase {
  name: string;
  test: string;
  /** the upstream function the table calls */
  validates: string;
  /** position in the upstream table (names repeat in upstream's tables) */
  index: number;
  object: Obj;
  upstream: 'accept' | 'reject';
  gates?: Record<string, boolean>;
  note?: string;
  kproxyAccepts?: string;
}

export interface UpstreamFile {
  header: Record<string, unknown>;
  cases: UpstreamCase[];
}

// ---- why kproxy may accept what upstream rejects -----------------------------------------------

const defaulted = (field: string, value: string) =>
  `no v1 JSON form: the Go zero value of ${field} is omitted in JSON, and the v1 defaulting (SetDefaults_Service) sets ${value} before validation, so the API server stores the object; kproxy reads the absent field as ${value}`;
const unused = (what: string) => `kproxy does not read ${what}; the rest of the object is valid`;
const gated = (gate: string, value: boolean, other: string) =>
  `an API server with ${gate}=${value} accepts this object (the case "${other}"), so kproxy must accept it whichever way the gate is set`;
const HEADLESS = 'a headless Service (clusterIP None): kproxy programs nothing for it (convert.ts serviceSkipReason), whatever else it holds';
const EXTERNAL_NAME = 'an ExternalName Service: kproxy programs nothing for it (convert.ts serviceSkipReason), whatever else it holds';
const FAMILY_FROM_ADDRESS =
  'kproxy takes each cluster IP\'s family from the address itself (convert.ts clusterIPForFamily) and never reads spec.ipFamilies; every cluster IP here is valid';

// ---- Services: pkg/apis/core/validation/validation_test.go ---------------------------------------

/**
 * makeValidService, in the v1 JSON shape. Its empty labels and annotations maps serialise to
 * nothing (omitempty); tweaks that write into them fill them.
 */
function makeValidService(): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: 'valid', namespace: 'valid', labels: {}, annotations: {}, resourceVersion: '1' },
    spec: {
      selector: { key: 'val' },
      sessionAffinity: 'None',
      type: 'ClusterIP',
      ports: [{ name: 'p', protocol: 'TCP', port: 8675, targetPort: 8675 }],
      internalTrafficPolicy: 'Cluster',
    },
    status: { loadBalancer: {} },
  };
}

const sp = (name: string, port: number, protocol: string, targetPort: number | string, nodePort = 0): Obj => ({ name, protocol, port, targetPort, nodePort });
const REQUIRE = 'RequireDualStack';
const SINGLE = 'SingleStack';
const PREFER = 'PreferDualStack';

/** type LoadBalancer the way the table writes it: ETP Cluster and allocateLoadBalancerNodePorts true */
function lb(s: Obj): void {
  s.spec.type = 'LoadBalancer';
  s.spec.externalTrafficPolicy = 'Cluster';
  s.spec.allocateLoadBalancerNodePorts = true;
}
function nodePort(s: Obj): void {
  s.spec.type = 'NodePort';
  s.spec.externalTrafficPolicy = 'Cluster';
}
function ips(s: Obj, clusterIP: string, clusterIPs: string[] | null): void {
  s.spec.clusterIP = clusterIP;
  s.spec.clusterIPs = clusterIPs;
}
const SRC_RANGES = 'service.beta.kubernetes.io/load-balancer-source-ranges';

/**
 * The v1 JSON of a Service: Go zero values of `omitempty` fields are left out (empty strings,
 * nil pointers, empty slices and maps, a zero nodePort or healthCheckNodePort), array elements
 * never are; port and targetPort have no omitempty; status.loadBalancer is a struct, always there.
 */
function serviceJSON(s: Obj): Obj {
  const KEEP_ZERO = new Set(['port', 'targetPort']);
  const element = (e: unknown): unknown => (e !== null && typeof e === 'object' && !Array.isArray(e) ? (omit(e, '') ?? {}) : e);
  const omit = (v: unknown, key: string): unknown => {
    if (Array.isArray(v)) return v.length === 0 ? undefined : v.map(element);
    if (v !== null && typeof v === 'object') {
      const out: Record<string, unknown> = {};
      for (const [k, e] of Object.entries(v)) {
        const w = omit(e, k);
        if (w !== undefined) out[k] = w;
      }
      return Object.keys(out).length ? out : undefined;
    }
    if (v === undefined || v === null || v === '') return undefined;
    return v === 0 && !KEEP_ZERO.has(key) ? undefined : v;
  };
  const out = omit(s, '') as Obj;
  out.status ??= {};
  out.status.loadBalancer ??= {};
  return out;
}

type SvcRow = [name: string, tweak: (s: Obj) => void, upstream: 'accept' | 'reject', extra?: { gates?: Record<string, boolean>; note?: string; kproxyAccepts?: string }];

const STRICT_ON = { StrictIPCIDRValidation: true };
const STRICT_OFF = { StrictIPCIDRValidation: false };

// TestValidateServiceCreate: every case runs with StrictIPCIDRValidation = !legacyIPs,
// PreferSameTrafficDistribution = newTrafficDist and RelaxedServiceNameValidation =
// relaxedServiceNames (false unless the case says otherwise); `gates` records the ones a case
// depends on.
const SERVICE_CREATE: SvcRow[] = [
  ['default', () => {}, 'accept'],
  ['default, with legacy IP validation', () => {}, 'accept', { gates: STRICT_OFF }],
  ['missing namespace', (s) => (s.metadata.namespace = ''), 'reject'],
  ['invalid namespace', (s) => (s.metadata.namespace = '-123'), 'reject'],
  ['missing name', (s) => (s.metadata.name = ''), 'reject'],
  ['invalid name', (s) => (s.metadata.name = '-123'), 'reject'],
  ['too long name', (s) => (s.metadata.name = 'a'.repeat(64)), 'reject'],
  ['invalid generateName', (s) => (s.metadata.generateName = '-123'), 'reject', { kproxyAccepts: unused('metadata.generateName') }],
  ['too long generateName', (s) => (s.metadata.generateName = 'a'.repeat(64)), 'reject', { kproxyAccepts: unused('metadata.generateName') }],
  ['invalid label', (s) => (s.metadata.labels['NoUppercaseOrSpecialCharsLike=Equals'] = 'bar'), 'reject'],
  ['invalid annotation', (s) => (s.metadata.annotations['NoSpecialCharsLike=Equals'] = 'bar'), 'reject', { kproxyAccepts: unused("a Service's annotations") }],
  ['nil selector', (s) => (s.spec.selector = null), 'accept'],
  ['invalid selector', (s) => (s.spec.selector['NoSpecialCharsLike=Equals'] = 'bar'), 'reject', { kproxyAccepts: unused('spec.selector (the EndpointSlices say which endpoints a Service has)') }],
  ['missing session affinity', (s) => (s.spec.sessionAffinity = ''), 'reject', { kproxyAccepts: defaulted('spec.sessionAffinity', 'None') }],
  ['missing type', (s) => (s.spec.type = ''), 'reject', { kproxyAccepts: defaulted('spec.type', 'ClusterIP') }],
  ['missing ports', (s) => (s.spec.ports = null), 'reject', { kproxyAccepts: 'a Service with no ports has no service port for kproxy to program: it adds nothing to the state' }],
  ['missing ports but headless', (s) => { s.spec.ports = null; ips(s, 'None', ['None']); }, 'accept'],
  ['empty port[0] name', (s) => (s.spec.ports[0].name = ''), 'accept'],
  ['empty port[1] name', (s) => s.spec.ports.push(sp('', 12345, 'TCP', 12345)), 'reject'],
  ['empty multi-port port[0] name', (s) => { s.spec.ports[0].name = ''; s.spec.ports.push(sp('p', 12345, 'TCP', 12345)); }, 'reject'],
  ['invalid port name', (s) => (s.spec.ports[0].name = 'INVALID'), 'reject'],
  ['missing protocol', (s) => (s.spec.ports[0].protocol = ''), 'reject', { kproxyAccepts: defaulted('spec.ports[0].protocol', 'TCP') }],
  ['invalid protocol', (s) => (s.spec.ports[0].protocol = 'INVALID'), 'reject'],
  ['invalid cluster ip', (s) => ips(s, 'invalid', ['invalid']), 'reject'],
  ['valid legacy cluster ip with legacy validation', (s) => ips(s, '001.002.003.004', ['001.002.003.004']), 'accept', { gates: STRICT_OFF }],
  ['invalid legacy cluster ip with strict validation', (s) => ips(s, '001.002.003.004', ['001.002.003.004']), 'reject', { gates: STRICT_ON, kproxyAccepts: gated('StrictIPCIDRValidation', false, 'valid legacy cluster ip with legacy validation') + '; kproxy reads leading zeros as decimal, as ParseIPSloppy does' }],
  ['missing port', (s) => (s.spec.ports[0].port = 0), 'reject'],
  ['invalid port', (s) => (s.spec.ports[0].port = 65536), 'reject'],
  ['invalid TargetPort int', (s) => (s.spec.ports[0].targetPort = 65536), 'reject'],
  ['valid port headless', (s) => { s.spec.ports[0].port = 11722; s.spec.ports[0].targetPort = 11722; ips(s, 'None', ['None']); }, 'accept'],
  ['invalid port headless 1', (s) => { s.spec.ports[0].port = 11722; s.spec.ports[0].targetPort = 11721; ips(s, 'None', ['None']); }, 'accept', { note: 'upstream tolerates targetPort on headless Services in the v1 API' }],
  ['invalid port headless 2', (s) => { s.spec.ports[0].port = 11722; s.spec.ports[0].targetPort = 'target'; ips(s, 'None', ['None']); }, 'accept', { note: 'upstream tolerates targetPort on headless Services in the v1 API' }],
  ['invalid externalIPs localhost', (s) => { s.spec.externalTrafficPolicy = 'Cluster'; s.spec.externalIPs = ['127.0.0.1']; }, 'reject'],
  ['invalid externalIPs unspecified', (s) => { s.spec.externalTrafficPolicy = 'Cluster'; s.spec.externalIPs = ['0.0.0.0']; }, 'reject'],
  ['invalid externalIPs loopback', (s) => { s.spec.externalTrafficPolicy = 'Cluster'; s.spec.externalIPs = ['127.0.0.1']; }, 'reject'],
  ['invalid externalIPs host', (s) => { s.spec.externalTrafficPolicy = 'Cluster'; s.spec.externalIPs = ['myhost.mydomain']; }, 'reject'],
  ['valid legacy externalIPs with legacy validation', (s) => { s.spec.externalTrafficPolicy = 'Cluster'; s.spec.externalIPs = ['001.002.003.004']; }, 'accept', { gates: STRICT_OFF }],
  ['invalid legacy externalIPs with strict validation', (s) => { s.spec.externalTrafficPolicy = 'Cluster'; s.spec.externalIPs = ['001.002.003.004']; }, 'reject', { gates: STRICT_ON, kproxyAccepts: gated('StrictIPCIDRValidation', false, 'valid legacy externalIPs with legacy validation') + '; kproxy reads leading zeros as decimal, as ParseIPSloppy does' }],
  ['valid externalIPs', (s) => { s.spec.externalTrafficPolicy = 'Cluster'; s.spec.externalIPs = ['1.2.3.4']; }, 'accept'],
  ['dup port name', (s) => { s.spec.ports[0].name = 'p'; s.spec.ports.push(sp('p', 12345, 'TCP', 12345)); }, 'reject'],
  ['valid load balancer protocol UDP 1', (s) => { lb(s); s.spec.ports[0].protocol = 'UDP'; }, 'accept'],
  ['valid load balancer protocol UDP 2', (s) => { lb(s); s.spec.ports[0] = sp('q', 12345, 'UDP', 12345); }, 'accept'],
  ['load balancer with mix protocol', (s) => { lb(s); s.spec.ports.push(sp('q', 12345, 'UDP', 12345)); }, 'accept'],
  ['valid 1', () => {}, 'accept'],
  ['valid 2', (s) => { s.spec.ports[0].protocol = 'UDP'; s.spec.ports[0].targetPort = 12345; }, 'accept'],
  ['valid 3', (s) => (s.spec.ports[0].targetPort = 'http'), 'accept'],
  ['valid cluster ip - none ', (s) => ips(s, 'None', ['None']), 'accept'],
  ['valid cluster ip - empty', (s) => { s.spec.clusterIPs = null; s.spec.ports[0].targetPort = 'http'; }, 'accept'],
  ['valid type - clusterIP', (s) => (s.spec.type = 'ClusterIP'), 'accept'],
  ['valid type - loadbalancer', (s) => lb(s), 'accept'],
  ['valid type - loadbalancer with allocateLoadBalancerNodePorts=false', (s) => { lb(s); s.spec.allocateLoadBalancerNodePorts = false; }, 'accept'],
  ['invalid type - missing AllocateLoadBalancerNodePorts for loadbalancer type', (s) => { s.spec.type = 'LoadBalancer'; s.spec.externalTrafficPolicy = 'Cluster'; }, 'reject', { kproxyAccepts: defaulted('spec.allocateLoadBalancerNodePorts', 'true for type LoadBalancer') + ' (kproxy does not read the field at all)' }],
  ['valid type loadbalancer 2 ports', (s) => { lb(s); s.spec.ports.push(sp('q', 12345, 'TCP', 12345)); }, 'accept'],
  ['valid external load balancer 2 ports', (s) => { lb(s); s.spec.ports.push(sp('q', 12345, 'TCP', 12345)); }, 'accept'],
  ['duplicate nodeports', (s) => { nodePort(s); s.spec.ports.push(sp('q', 1, 'TCP', 1, 1), sp('r', 2, 'TCP', 2, 1)); }, 'reject'],
  ['duplicate nodeports (different protocols)', (s) => { nodePort(s); s.spec.ports.push(sp('q', 1, 'TCP', 1, 1), sp('r', 2, 'UDP', 2, 1), sp('s', 3, 'SCTP', 3, 1)); }, 'accept'],
  ['invalid duplicate ports (with same protocol)', (s) => { s.spec.type = 'ClusterIP'; s.spec.ports.push(sp('q', 12345, 'TCP', 8080), sp('r', 12345, 'TCP', 80)); }, 'reject'],
  ['valid duplicate ports (with different protocols)', (s) => { s.spec.type = 'ClusterIP'; s.spec.ports.push(sp('q', 12345, 'TCP', 8080), sp('r', 12345, 'UDP', 80), sp('s', 12345, 'SCTP', 8088)); }, 'accept'],
  ['valid type - cluster', (s) => (s.spec.type = 'ClusterIP'), 'accept'],
  ['valid type - nodeport', (s) => nodePort(s), 'accept'],
  ['valid type - loadbalancer with allocateLoadBalancerNodePorts=true', (s) => lb(s), 'accept'],
  ['valid type loadbalancer 2 ports', (s) => { lb(s); s.spec.ports.push(sp('q', 12345, 'TCP', 12345)); }, 'accept'],
  ['valid type loadbalancer with NodePort', (s) => { lb(s); s.spec.ports.push(sp('q', 12345, 'TCP', 12345, 12345)); }, 'accept'],
  ['valid type=NodePort service with NodePort', (s) => { nodePort(s); s.spec.ports.push(sp('q', 12345, 'TCP', 12345, 12345)); }, 'accept'],
  ['valid type=NodePort service without NodePort', (s) => { nodePort(s); s.spec.ports.push(sp('q', 12345, 'TCP', 12345)); }, 'accept'],
  ['valid cluster service without NodePort', (s) => { s.spec.type = 'ClusterIP'; s.spec.ports.push(sp('q', 12345, 'TCP', 12345)); }, 'accept'],
  ['invalid cluster service with NodePort', (s) => { s.spec.type = 'ClusterIP'; s.spec.ports.push(sp('q', 12345, 'TCP', 12345, 12345)); }, 'reject', { kproxyAccepts: 'kproxy uses a nodePort only for types NodePort and LoadBalancer (convert.ts servicePortsOf); on a ClusterIP Service it is ignored' }],
  ['invalid public service with duplicate NodePort', (s) => { nodePort(s); s.spec.ports.push(sp('p1', 1, 'TCP', 1, 1), sp('p2', 2, 'TCP', 2, 1)); }, 'reject'],
  ['valid type=LoadBalancer', (s) => { lb(s); s.spec.ports.push(sp('q', 12345, 'TCP', 12345)); }, 'accept'],
  ['valid port type=LoadBalancer', (s) => { lb(s); s.spec.ports.push(sp('kubelet', 10250, 'TCP', 12345)); }, 'accept'],
  ['valid LoadBalancer source range annotation', (s) => { lb(s); s.metadata.annotations[SRC_RANGES] = '1.2.3.0/24,  5.6.0.0/16'; }, 'accept'],
  ['valid empty LoadBalancer source range annotation', (s) => { lb(s); s.metadata.annotations[SRC_RANGES] = ''; }, 'accept'],
  ['valid whitespace-only LoadBalancer source range annotation', (s) => { lb(s); s.metadata.annotations[SRC_RANGES] = '  '; }, 'accept'],
  ['invalid LoadBalancer source range annotation (hostname)', (s) => { lb(s); s.metadata.annotations[SRC_RANGES] = 'foo.bar'; }, 'reject', { kproxyAccepts: unused('the load-balancer-source-ranges annotation (only spec.loadBalancerSourceRanges, as upstream kube-proxy)') }],
  ['invalid LoadBalancer source range annotation (invalid CIDR)', (s) => { lb(s); s.metadata.annotations[SRC_RANGES] = '1.2.3.4/33'; }, 'reject', { kproxyAccepts: unused('the load-balancer-source-ranges annotation (only spec.loadBalancerSourceRanges, as upstream kube-proxy)') }],
  ['invalid LoadBalancer source range annotation for non LoadBalancer type service', (s) => { s.metadata.annotations[SRC_RANGES] = '1.2.3.0/24'; }, 'reject', { kproxyAccepts: unused('the load-balancer-source-ranges annotation (only spec.loadBalancerSourceRanges, as upstream kube-proxy)') }],
  ['invalid empty-but-set LoadBalancer source range annotation for non LoadBalancer type service', (s) => { s.metadata.annotations[SRC_RANGES] = ''; }, 'reject', { kproxyAccepts: unused('the load-balancer-source-ranges annotation (only spec.loadBalancerSourceRanges, as upstream kube-proxy)') }],
  ['valid legacy LoadBalancer source range with legacy validation', (s) => { lb(s); s.spec.loadBalancerSourceRanges = ['001.002.003.000/24']; }, 'accept', { gates: STRICT_OFF }],
  ['invalid legacy LoadBalancer source range with strict validation', (s) => { lb(s); s.spec.loadBalancerSourceRanges = ['001.002.003.000/24']; }, 'reject', { gates: STRICT_ON, kproxyAccepts: gated('StrictIPCIDRValidation', false, 'valid legacy LoadBalancer source range with legacy validation') + '; kproxy reads leading zeros as decimal, as ParseCIDRSloppy does' }],
  ['invalid legacy LoadBalancer source range annotation with strict validation', (s) => { lb(s); s.metadata.annotations[SRC_RANGES] = '001.002.003.000/24'; }, 'reject', { gates: STRICT_ON, kproxyAccepts: unused('the load-balancer-source-ranges annotation (only spec.loadBalancerSourceRanges, as upstream kube-proxy)') }],
  ['valid LoadBalancer source range', (s) => { lb(s); s.spec.loadBalancerSourceRanges = ['1.2.3.0/24', '5.6.0.0/16']; }, 'accept'],
  ['valid LoadBalancer source range with whitespace', (s) => { lb(s); s.spec.loadBalancerSourceRanges = ['1.2.3.0/24  ', ' 5.6.0.0/16']; }, 'accept'],
  ['invalid empty LoadBalancer source range', (s) => { lb(s); s.spec.loadBalancerSourceRanges = ['   ']; }, 'reject'],
  ['invalid LoadBalancer source range (hostname)', (s) => { lb(s); s.spec.loadBalancerSourceRanges = ['foo.bar']; }, 'reject'],
  ['invalid LoadBalancer source range (invalid CIDR)', (s) => { lb(s); s.spec.loadBalancerSourceRanges = ['1.2.3.4/33']; }, 'reject'],
  ['invalid source range for non LoadBalancer type service', (s) => { s.spec.loadBalancerSourceRanges = ['1.2.3.0/24', '5.6.0.0/16']; }, 'reject', { kproxyAccepts: 'source ranges only filter traffic to load-balancer IPs, which kproxy takes only from type LoadBalancer Services (convert.ts, nodeview.ts firewall); on a ClusterIP Service they change nothing' }],
  ['invalid source range annotation ignored with valid source range field', (s) => { lb(s); s.metadata.annotations[SRC_RANGES] = 'foo.bar'; s.spec.loadBalancerSourceRanges = ['1.2.3.0/24', '5.6.0.0/16']; }, 'accept'],
  ['valid ExternalName', (s) => { s.spec.type = 'ExternalName'; s.spec.externalName = 'foo.bar.example.com'; }, 'accept'],
  ['valid ExternalName (trailing dot)', (s) => { s.spec.type = 'ExternalName'; s.spec.externalName = 'foo.bar.example.com.'; }, 'accept'],
  ['invalid ExternalName clusterIP (valid IP)', (s) => { s.spec.type = 'ExternalName'; ips(s, '1.2.3.4', ['1.2.3.4']); s.spec.externalName = 'foo.bar.example.com'; }, 'reject', { kproxyAccepts: EXTERNAL_NAME }],
  ['invalid ExternalName clusterIP (None)', (s) => { s.spec.type = 'ExternalName'; ips(s, 'None', ['None']); s.spec.externalName = 'foo.bar.example.com'; }, 'reject', { kproxyAccepts: EXTERNAL_NAME }],
  ['invalid ExternalName (not a DNS name)', (s) => { s.spec.type = 'ExternalName'; s.spec.externalName = '-123'; }, 'reject', { kproxyAccepts: EXTERNAL_NAME }],
  ['LoadBalancer type cannot have None ClusterIP', (s) => { ips(s, 'None', ['None']); lb(s); }, 'reject', { kproxyAccepts: HEADLESS }],
  ['invalid node port with clusterIP None', (s) => { nodePort(s); s.spec.ports.push(sp('q', 1, 'TCP', 1, 1)); ips(s, 'None', ['None']); }, 'reject', { kproxyAccepts: HEADLESS }],
  // ESIPP section
  ['invalid externalTraffic field', (s) => { s.spec.type = 'LoadBalancer'; s.spec.allocateLoadBalancerNodePorts = true; s.spec.externalTrafficPolicy = 'invalid'; }, 'reject'],
  ['nil internalTraffic field when feature gate is on', (s) => (s.spec.internalTrafficPolicy = null), 'reject', { kproxyAccepts: defaulted('spec.internalTrafficPolicy', 'Cluster') }],
  ['internalTrafficPolicy field nil when type is ExternalName', (s) => { s.spec.internalTrafficPolicy = null; s.spec.type = 'ExternalName'; s.spec.externalName = 'foo.bar.com'; }, 'accept'],
  ['internalTrafficPolicy field is set when type is ExternalName', (s) => { s.spec.internalTrafficPolicy = 'Cluster'; s.spec.type = 'ExternalName'; s.spec.externalName = 'foo.bar.com'; }, 'accept'],
  ['invalid internalTraffic field', (s) => (s.spec.internalTrafficPolicy = 'invalid'), 'reject'],
  ['internalTrafficPolicy field set to Cluster', (s) => (s.spec.internalTrafficPolicy = 'Cluster'), 'accept'],
  ['internalTrafficPolicy field set to Local', (s) => (s.spec.internalTrafficPolicy = 'Local'), 'accept'],
  ['negative healthCheckNodePort field', (s) => { s.spec.type = 'LoadBalancer'; s.spec.allocateLoadBalancerNodePorts = true; s.spec.externalTrafficPolicy = 'Local'; s.spec.healthCheckNodePort = -1; }, 'reject'],
  ['negative healthCheckNodePort field', (s) => { s.spec.type = 'LoadBalancer'; s.spec.allocateLoadBalancerNodePorts = true; s.spec.externalTrafficPolicy = 'Local'; s.spec.healthCheckNodePort = 31100; }, 'accept'],
  ['invalid timeoutSeconds field', (s) => { s.spec.type = 'ClusterIP'; s.spec.sessionAffinity = 'ClientIP'; s.spec.sessionAffinityConfig = { clientIP: { timeoutSeconds: -1 } }; }, 'reject'],
  ['sessionAffinityConfig can\'t be set when session affinity is None', (s) => { lb(s); s.spec.sessionAffinity = 'None'; s.spec.sessionAffinityConfig = { clientIP: { timeoutSeconds: 90 } }; }, 'reject', { kproxyAccepts: 'the v1 defaulting (SetDefaults_Service) drops sessionAffinityConfig when sessionAffinity is None, so the API server stores the object; kproxy reads the config only for ClientIP (convert.ts)' }],
  // ip families
  ['invalid, service with invalid ipFamilies', (s) => (s.spec.ipFamilies = ['not-a-valid-ip-family']), 'reject'],
  ['invalid, service with invalid ipFamilies (2nd)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; s.spec.ipFamilies = ['IPv4', 'not-a-valid-ip-family']; }, 'reject'],
  ['IPFamilyPolicy(singleStack) is set for two families', (s) => { s.spec.ipFamilyPolicy = SINGLE; s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'accept', { note: 'validated in the allocator, not in validation' }],
  ['valid, IPFamilyPolicy(preferDualStack) is set for two families (note: alloc sets families)', (s) => { s.spec.ipFamilyPolicy = PREFER; s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'accept'],
  ['invalid, service with 2+ ipFamilies', (s) => { s.spec.ipFamilyPolicy = REQUIRE; s.spec.ipFamilies = ['IPv4', 'IPv6', 'IPv4']; }, 'reject'],
  ['invalid, service with same ip families', (s) => { s.spec.ipFamilyPolicy = REQUIRE; s.spec.ipFamilies = ['IPv6', 'IPv6']; }, 'reject', { kproxyAccepts: FAMILY_FROM_ADDRESS }],
  ['valid, nil service ipFamilies', (s) => (s.spec.ipFamilies = null), 'accept'],
  ['valid, service with valid ipFamilies (v4)', (s) => (s.spec.ipFamilies = ['IPv4']), 'accept'],
  ['valid, service with valid ipFamilies (v6)', (s) => (s.spec.ipFamilies = ['IPv6']), 'accept'],
  ['valid, service with valid ipFamilies(v4,v6)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'accept'],
  ['valid, service with valid ipFamilies(v6,v4)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; s.spec.ipFamilies = ['IPv6', 'IPv4']; }, 'accept'],
  ['valid, service preferred dual stack with single family', (s) => { s.spec.ipFamilyPolicy = PREFER; s.spec.ipFamilies = ['IPv6']; }, 'accept'],
  // cluster IPs
  ['invalid, garbage single ip', (s) => ips(s, 'garbage-ip', ['garbage-ip']), 'reject'],
  ['invalid, garbage ips', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, 'garbage-ip', ['garbage-ip', 'garbage-second-ip']); }, 'reject'],
  ['invalid, garbage first ip', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, 'garbage-ip', ['garbage-ip', '2001::1']); }, 'reject'],
  ['invalid, garbage second ip', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '2001::1', ['2001::1', 'garbage-ip']); }, 'reject'],
  ['invalid, NONE + IP', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, 'None', ['None', '2001::1']); }, 'reject', { kproxyAccepts: HEADLESS }],
  ['invalid, IP + NONE', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '2001::1', ['2001::1', 'None']); }, 'reject'],
  ['invalid, EMPTY STRING + IP', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '', ['', '2001::1']); }, 'reject'],
  ['invalid, IP + EMPTY STRING', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '2001::1', ['2001::1', '']); }, 'reject'],
  ['invalid, same ip family (v6)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '2001::1', ['2001::1', '2001::4']); s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'reject'],
  ['invalid, same ip family (v4)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '10.0.0.1', ['10.0.0.1', '10.0.0.10']); s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'reject'],
  ['invalid, more than two ips', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '10.0.0.1', ['10.0.0.1', '2001::1', '10.0.0.10']); s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'reject'],
  [' multi ip, dualstack not set (request for downgrade)', (s) => { s.spec.ipFamilyPolicy = SINGLE; ips(s, '10.0.0.1', ['10.0.0.1', '2001::1']); s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'accept'],
  ['valid, headless-no-selector + multi family + gate off', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, 'None', ['None']); s.spec.ipFamilies = ['IPv4', 'IPv6']; s.spec.selector = null; }, 'accept'],
  ['valid, multi ip, single ipfamilies preferDualStack', (s) => { s.spec.ipFamilyPolicy = PREFER; ips(s, '10.0.0.1', ['10.0.0.1', '2001::1']); s.spec.ipFamilies = ['IPv4']; }, 'accept'],
  ['valid, multi ip, single ipfamilies (must match when provided) + requireDualStack', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '10.0.0.1', ['10.0.0.1', '2001::1']); s.spec.ipFamilies = ['IPv4']; }, 'accept'],
  ['invalid, families don\'t match (v4=>v6)', (s) => { ips(s, '10.0.0.1', ['10.0.0.1']); s.spec.ipFamilies = ['IPv6']; }, 'reject', { kproxyAccepts: FAMILY_FROM_ADDRESS }],
  ['invalid, families don\'t match (v6=>v4)', (s) => { ips(s, '2001::1', ['2001::1']); s.spec.ipFamilies = ['IPv4']; }, 'reject', { kproxyAccepts: FAMILY_FROM_ADDRESS }],
  ['valid. no field set', () => {}, 'accept'],
  ['valid, single ip', (s) => { s.spec.ipFamilyPolicy = SINGLE; ips(s, '10.0.0.1', ['10.0.0.1']); }, 'accept'],
  ['valid, single family', (s) => { s.spec.ipFamilyPolicy = SINGLE; s.spec.ipFamilies = ['IPv6']; }, 'accept'],
  ['valid, single ip + single family', (s) => { s.spec.ipFamilyPolicy = SINGLE; ips(s, '2001::1', ['2001::1']); s.spec.ipFamilies = ['IPv6']; }, 'accept'],
  ['valid, single ip + single family (dual stack requested)', (s) => { s.spec.ipFamilyPolicy = PREFER; ips(s, '2001::1', ['2001::1']); s.spec.ipFamilies = ['IPv6']; }, 'accept'],
  ['valid, single ip, multi ipfamilies', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '10.0.0.1', ['10.0.0.1']); s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'accept'],
  ['valid, multi ips, multi ipfamilies (4,6)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '10.0.0.1', ['10.0.0.1', '2001::1']); s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'accept'],
  ['valid, ips, multi ipfamilies (6,4)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '2001::1', ['2001::1', '10.0.0.1']); s.spec.ipFamilies = ['IPv6', 'IPv4']; }, 'accept'],
  ['valid, multi ips (6,4)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '2001::1', ['2001::1', '10.0.0.1']); }, 'accept'],
  ['valid, multi ipfamilies (6,4)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; s.spec.ipFamilies = ['IPv6', 'IPv4']; }, 'accept'],
  ['valid, multi ips (4,6)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '10.0.0.1', ['10.0.0.1', '2001::1']); }, 'accept'],
  ['valid,  multi ipfamilies (4,6)', (s) => { s.spec.ipFamilyPolicy = REQUIRE; s.spec.ipFamilies = ['IPv4', 'IPv6']; }, 'accept'],
  ['valid, dual stack', (s) => (s.spec.ipFamilyPolicy = REQUIRE), 'accept'],
  ['valid appProtocol', (s) => (s.spec.ports = [{ port: 12345, targetPort: 12345, protocol: 'TCP', appProtocol: 'HTTP' }]), 'accept'],
  ['valid custom appProtocol', (s) => (s.spec.ports = [{ port: 12345, targetPort: 12345, protocol: 'TCP', appProtocol: 'example.com/protocol' }]), 'accept'],
  ['invalid appProtocol', (s) => (s.spec.ports = [{ port: 12345, targetPort: 12345, protocol: 'TCP', appProtocol: 'example.com/protocol_with{invalid}[characters]' }]), 'reject', { kproxyAccepts: unused('spec.ports[].appProtocol') }],
  ['invalid cluster ip != clusterIP in multi ip service', (s) => { s.spec.ipFamilyPolicy = REQUIRE; ips(s, '10.0.0.10', ['10.0.0.1', '2001::1']); }, 'reject'],
  ['invalid cluster ip != clusterIP in single ip service', (s) => ips(s, '10.0.0.10', ['10.0.0.1']), 'reject'],
  ['Use AllocateLoadBalancerNodePorts when type is not LoadBalancer', (s) => (s.spec.allocateLoadBalancerNodePorts = true), 'reject', { kproxyAccepts: unused('spec.allocateLoadBalancerNodePorts') }],
  ['valid LoadBalancerClass when type is LoadBalancer', (s) => { lb(s); s.spec.loadBalancerClass = 'test.com/test-load-balancer-class'; }, 'accept'],
  ['invalid LoadBalancerClass', (s) => { lb(s); s.spec.loadBalancerClass = 'Bad/LoadBalancerClass'; }, 'reject', { kproxyAccepts: unused('spec.loadBalancerClass (upstream kube-proxy does not either)') }],
  ['invalid: set LoadBalancerClass when type is not LoadBalancer', (s) => { s.spec.type = 'ClusterIP'; s.spec.loadBalancerClass = 'test.com/test-load-balancer-class'; }, 'reject', { kproxyAccepts: unused('spec.loadBalancerClass (upstream kube-proxy does not either)') }],
  ['topology annotations are mismatched', (s) => { s.metadata.annotations['service.kubernetes.io/topology-aware-hints'] = 'original'; s.metadata.annotations['service.kubernetes.io/topology-mode'] = 'different'; }, 'reject', { kproxyAccepts: unused("a Service's annotations (topology comes from the hints in EndpointSlices)") }],
  ['valid: trafficDistribution field set to PreferClose', (s) => (s.spec.trafficDistribution = 'PreferClose'), 'accept'],
  ['valid: trafficDistribution field set to PreferSameZone with feature gate', (s) => (s.spec.trafficDistribution = 'PreferSameZone'), 'accept', { gates: { PreferSameTrafficDistribution: true } }],
  ['valid: trafficDistribution field set to PreferSameNode with feature gate', (s) => (s.spec.trafficDistribution = 'PreferSameNode'), 'accept', { gates: { PreferSameTrafficDistribution: true } }],
  ['invalid: trafficDistribution field set to Random', (s) => (s.spec.trafficDistribution = 'Random'), 'reject', { kproxyAccepts: 'spec.trafficDistribution is informational in kproxy: which endpoints a node uses is decided by the hints the EndpointSlice controller writes (categorize.ts), as in upstream kube-proxy' }],
  ['invalid: trafficDistribution field set to PreferSameZone without feature gate', (s) => (s.spec.trafficDistribution = 'PreferSameZone'), 'reject', { gates: { PreferSameTrafficDistribution: false }, kproxyAccepts: gated('PreferSameTrafficDistribution', true, 'valid: trafficDistribution field set to PreferSameZone with feature gate') }],
  ['invalid: trafficDistribution field set to PreferSameNode without feature gate', (s) => (s.spec.trafficDistribution = 'PreferSameNode'), 'reject', { gates: { PreferSameTrafficDistribution: false }, kproxyAccepts: gated('PreferSameTrafficDistribution', true, 'valid: trafficDistribution field set to PreferSameNode with feature gate') }],
  ['valid: service name begins with a digit feature gate enabled', (s) => (s.metadata.name = '1-test-service'), 'accept', { gates: { RelaxedServiceNameValidation: true } }],
  ['invalid: service name begins with a digit feature gate disabled', (s) => (s.metadata.name = '1-test-service'), 'reject', { gates: { RelaxedServiceNameValidation: false }, kproxyAccepts: gated('RelaxedServiceNameValidation', true, 'valid: service name begins with a digit feature gate enabled') }],
];

// TestValidateServiceExternalTrafficPolicy calls validateServiceExternalTrafficPolicy alone.
const SERVICE_ETP: SvcRow[] = [
  ['valid loadBalancer service with externalTrafficPolicy and healthCheckNodePort set', (s) => { s.spec.type = 'LoadBalancer'; s.spec.allocateLoadBalancerNodePorts = true; s.spec.externalTrafficPolicy = 'Local'; s.spec.healthCheckNodePort = 34567; }, 'accept'],
  ['valid nodePort service with externalTrafficPolicy set', (s) => { s.spec.type = 'NodePort'; s.spec.externalTrafficPolicy = 'Local'; }, 'accept'],
  ['valid clusterIP service with none of externalTrafficPolicy and healthCheckNodePort set', (s) => (s.spec.type = 'ClusterIP'), 'accept'],
  ['cannot set healthCheckNodePort field on loadBalancer service with externalTrafficPolicy!=Local', (s) => { s.spec.type = 'LoadBalancer'; s.spec.allocateLoadBalancerNodePorts = true; s.spec.externalTrafficPolicy = 'Cluster'; s.spec.healthCheckNodePort = 34567; }, 'reject', { kproxyAccepts: 'kproxy serves a health check node port only for externalTrafficPolicy Local (convert.ts servicePortsOf); here it is ignored' }],
  ['cannot set healthCheckNodePort field on nodePort service', (s) => { s.spec.type = 'NodePort'; s.spec.externalTrafficPolicy = 'Local'; s.spec.healthCheckNodePort = 34567; }, 'reject', { kproxyAccepts: 'no API server stores it (only a manifest can hold it); kproxy then answers health checks on that port for the Local NodePort Service (convert.ts takes healthCheckNodePort for any Local externally accessible Service, where upstream kube-proxy takes it for type LoadBalancer only: NeedsHealthCheck), a listener that reports local endpoints and forwards nothing' }],
  ['cannot set externalTrafficPolicy or healthCheckNodePort fields on clusterIP service', (s) => { s.spec.type = 'ClusterIP'; s.spec.externalTrafficPolicy = 'Local'; s.spec.healthCheckNodePort = 34567; }, 'reject', { kproxyAccepts: 'externalTrafficPolicy and healthCheckNodePort matter only for externally accessible Services (convert.ts: LoadBalancer, NodePort, or ClusterIP with external IPs); this one has none, so both are ignored' }],
  ['cannot set externalTrafficPolicy field on ExternalName service', (s) => { s.spec.type = 'ExternalName'; s.spec.externalTrafficPolicy = 'Local'; }, 'reject', { kproxyAccepts: EXTERNAL_NAME }],
  ['externalTrafficPolicy is required on NodePort service', (s) => (s.spec.type = 'NodePort'), 'reject', { kproxyAccepts: defaulted('spec.externalTrafficPolicy', 'Cluster for externally accessible Services') }],
  ['externalTrafficPolicy is required on LoadBalancer service', (s) => (s.spec.type = 'LoadBalancer'), 'reject', { kproxyAccepts: defaulted('spec.externalTrafficPolicy', 'Cluster for externally accessible Services') + '; allocateLoadBalancerNodePorts is defaulted to true the same way' }],
  ['externalTrafficPolicy is required on ClusterIP service with externalIPs', (s) => { s.spec.type = 'ClusterIP'; s.spec.externalIPs = ['1.2.3,4']; }, 'reject'],
];

// TestValidateLoadBalancerStatus calls ValidateLoadBalancerStatus(status, oldStatus, spec) with
// a spec of type LoadBalancer (ClusterIP in the first case) and StrictIPCIDRValidation =
// !legacyIPs. Here the status sits on makeValidService made a valid Service of that type.
type StatusRow = [name: string, ingress: Obj[], upstream: 'accept' | 'reject', extra?: { clusterIPType?: boolean; gates?: Record<string, boolean>; note?: string; kproxyAccepts?: string }];
const LB_STATUS: StatusRow[] = [
  ['type is not LB', [{ ip: '1.2.3.4' }], 'reject', { clusterIPType: true, kproxyAccepts: 'kproxy takes load-balancer IPs only from type LoadBalancer Services (convert.ts servicePortsOf): the status of a ClusterIP Service is ignored' }],
  ['valid vip ipMode', [{ ip: '1.2.3.4', ipMode: 'VIP' }], 'accept'],
  ['valid proxy ipMode', [{ ip: '1.2.3.4', ipMode: 'Proxy' }], 'accept'],
  ['invalid ipMode', [{ ip: '1.2.3.4', ipMode: 'dummy' }], 'reject'],
  ['missing ipMode', [{ ip: '1.2.3.4' }], 'reject', { kproxyAccepts: 'no v1 JSON form: the v1 defaulting (SetDefaults_Service) sets ipMode VIP on every ingress entry with an IP of a LoadBalancer Service before validation; kproxy reads an absent ipMode as VIP' }],
  ['missing ip with ipMode present', [{ ipMode: 'Proxy' }], 'reject', { kproxyAccepts: 'an ingress entry without an IP gives kproxy no address: it is skipped (convert.ts servicePortsOf)' }],
  ['legacy IP with legacy validation', [{ ip: '001.002.003.004', ipMode: 'VIP' }], 'accept', { gates: STRICT_OFF }],
  ['legacy IP with strict validation', [{ ip: '001.002.003.004', ipMode: 'VIP' }], 'reject', { gates: STRICT_ON, kproxyAccepts: gated('StrictIPCIDRValidation', false, 'legacy IP with legacy validation') + '; kproxy reads leading zeros as decimal, as ParseIPSloppy does' }],
  ['invalid ingress IP ignored on update', [{ ip: '1.2.3.04', ipMode: 'VIP' }], 'accept', { gates: STRICT_ON, note: 'an update: the old status held the same IP, which ratcheting keeps; the object is one the API server stores and serves' }],
  ['invalid ingress IP ignored when adding IP', [{ ip: '1.2.3.04', ipMode: 'VIP' }, { ip: '5.6.7.8', ipMode: 'VIP' }], 'accept', { gates: STRICT_ON, note: 'an update: the old status held 1.2.3.04, which ratcheting keeps; the object is one the API server stores and serves' }],
  ['invalid ingress IP can be fixed', [{ ip: '1.2.3.4', ipMode: 'VIP' }], 'accept', { gates: STRICT_ON, note: 'an update from a status holding 1.2.3.04' }],
];

export function serviceCases(): UpstreamFile {
  const cases: UpstreamCase[] = [];
  const add = (test: string, validates: string, rows: SvcRow[]) =>
    rows.forEach(([name, tweak, upstream, extra], index) => {
      const s = makeValidService();
      tweak(s);
      cases.push({ name, test, validates, index, object: serviceJSON(s), upstream, ...extra });
    });
  add('TestValidateServiceCreate', 'ValidateServiceCreate', SERVICE_CREATE);
  add('TestValidateServiceExternalTrafficPolicy', 'validateServiceExternalTrafficPolicy', SERVICE_ETP);
  LB_STATUS.forEach(([name, ingress, upstream, extra], index) => {
    const s = makeValidService();
    if (!extra?.clusterIPType) lb(s);
    s.status.loadBalancer.ingress = ingress;
    const { clusterIPType: _, ...rest } = extra ?? {};
    cases.push({ name, test: 'TestValidateLoadBalancerStatus', validates: 'ValidateLoadBalancerStatus', index, object: serviceJSON(s), upstream, ...rest });
  });
  return {
    header: {
      source: {
        repo: 'AIAgentSandox/kubernetes, a copy of kubernetes/kubernetes',
        commit: '64149d1201ab96736d5aa902df411d40a3f6f714',
        path: 'pkg/apis/core/validation/validation_test.go',
        version:
          'master after v1.34: TestValidateServiceCreate sets emulation version 1.34 to turn PreferSameTrafficDistribution off (the gate is locked on at this version), and has the RelaxedServiceNameValidation (v1.34) and StrictIPCIDRValidation cases',
      },
      tables: {
        TestValidateServiceCreate: 'every case (ValidateServiceCreate on makeValidService plus the tweak)',
        TestValidateServiceExternalTrafficPolicy: 'every case; the table calls validateServiceExternalTrafficPolicy alone, and every case it accepts is also a valid Service as a whole',
        TestValidateLoadBalancerStatus: 'every case; the table validates a status against a bare spec, here the status sits on a valid Service of that type',
      },
      base:
        'makeValidService: metadata name and namespace "valid", resourceVersion "1", empty labels and annotations; spec selector {key: val}, sessionAffinity None, type ClusterIP, ports [{name p, protocol TCP, port 8675, targetPort 8675}], internalTrafficPolicy Cluster; no cluster IP. Its definition lies outside the parts of this 1 MB copy that were read for the transcription; the fields are those of its definition in kubernetes/kubernetes pkg/apis/core/validation/services_test.go (a24fee9f) plus internalTrafficPolicy Cluster, which the table itself requires ("nil internalTraffic field when feature gate is on" expects one error), and every case of the table agrees with them (no cluster IP: "valid, single family" accepts an IPv6-only family list)',
      omitted: {
        TestValidateServiceUpdate: 'update-only table (two objects); none of its cases is a plain create',
      },
      notExpressible: [],
      jsonForm:
        'Go zero values of omitempty fields (empty strings, nil pointers, slices and maps, nodePort and healthCheckNodePort 0) are left out, as the API serves the object; status.loadBalancer is always present (a struct in Go)',
    },
    cases,
  };
}

// ---- EndpointSlices: pkg/apis/discovery/validation/validation_test.go -----------------------------

const META = { name: 'hello', namespace: 'world' };
const httpPort = [{ name: 'http', protocol: 'TCP' }];
/** one endpoint as v1 JSON serves it (conditions is a struct: always present) */
const ep = (o: Obj): Obj => ({ addresses: o.addresses, conditions: {}, ...Object.fromEntries(Object.entries(o).filter(([k]) => k !== 'addresses')) });
const gen = {
  ips: (n: number) => ({ $generateIPAddresses: n }),
  ports: (n: number) => ({ $generatePorts: n }),
  endpoints: (n: number) => ({ $generateEndpoints: n }),
  topology: (n: number) => ({ $generateTopology: n }),
};
/** an EndpointSlice in the v1 JSON shape; ports and endpoints have no omitempty (nil is null) */
const slice = (o: { metadata?: Obj; addressType?: string; ports?: Obj; endpoints?: Obj }): Obj => ({
  apiVersion: 'discovery.k8s.io/v1',
  kind: 'EndpointSlice',
  metadata: o.metadata ?? META,
  addressType: o.addressType ?? '',
  endpoints: o.endpoints ?? null,
  ports: o.ports ?? null,
});
const zones = (...names: string[]) => names.map((name) => ({ name }));

type SliceRow = [name: string, object: Obj, upstream: 'accept' | 'reject', extra?: { gates?: Record<string, boolean>; note?: string; kproxyAccepts?: string }];

// TestValidateEndpointSlice: ValidateEndpointSlice(slice, nil) with StrictIPCIDRValidation =
// !legacyIPs. Upstream's table is a Go map; the order here is the order of the source.
const SLICE: SliceRow[] = [
  ['good-slice', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hostname: 'valid-123' })] }), 'accept'],
  ['good-ipv6', slice({ addressType: 'IPv6', ports: httpPort, endpoints: [ep({ addresses: ['a00:100::4'], hostname: 'valid-123' })] }), 'accept'],
  ['good-fqdns', slice({ addressType: 'FQDN', ports: httpPort, endpoints: [ep({ addresses: ['foo.example.com', 'example.com', 'example.com.', 'hyphens-are-good.example.com'], hostname: 'valid-123' })] }), 'accept'],
  ['all-protocols', slice({ addressType: 'IPv4', ports: [{ name: 'tcp', protocol: 'TCP' }, { name: 'udp', protocol: 'UDP' }, { name: 'sctp', protocol: 'SCTP' }], endpoints: [ep({ addresses: gen.ips(1), hostname: 'valid-123' })] }), 'accept'],
  ['app-protocols', slice({ addressType: 'IPv4', ports: [{ name: 'one', protocol: 'TCP', appProtocol: 'HTTP' }, { name: 'two', protocol: 'TCP', appProtocol: 'https' }, { name: 'three', protocol: 'TCP', appProtocol: 'my-protocol' }, { name: 'four', protocol: 'TCP', appProtocol: 'example.com/custom-protocol' }], endpoints: [ep({ addresses: gen.ips(1), hostname: 'valid-123' })] }), 'accept'],
  ['empty-port-name', slice({ addressType: 'IPv4', ports: [{ name: '', protocol: 'TCP' }, { name: 'http', protocol: 'TCP' }], endpoints: [ep({ addresses: gen.ips(1) })] }), 'accept'],
  ['long-port-name', slice({ addressType: 'IPv4', ports: [{ name: 'a'.repeat(63), protocol: 'TCP' }], endpoints: [ep({ addresses: gen.ips(1) })] }), 'accept'],
  ['empty-ports-and-endpoints', slice({ addressType: 'IPv4', ports: [], endpoints: [] }), 'accept'],
  ['max-endpoints', slice({ addressType: 'IPv4', ports: gen.ports(1), endpoints: gen.endpoints(1000) }), 'accept'],
  ['max-ports', slice({ addressType: 'IPv4', ports: gen.ports(20000) }), 'accept'],
  ['max-addresses', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(100) })] }), 'accept'],
  ['max-topology-keys', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), deprecatedTopology: gen.topology(16) })] }), 'accept'],
  ['valid-hints', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hints: { forZones: zones('zone-a'), forNodes: zones('node-1') } })] }), 'accept'],
  ['legacy-ip-with-legacy-validation', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: ['012.034.056.078'], hostname: 'valid-123' })] }), 'accept', { gates: STRICT_OFF }],
  // expected failures
  ['duplicate-port-name', slice({ addressType: 'IPv4', ports: [{ name: '', protocol: 'TCP' }, { name: '', protocol: 'TCP' }], endpoints: [] }), 'reject'],
  ['bad-port-name-caps', slice({ addressType: 'IPv4', ports: [{ name: 'aCapital', protocol: 'TCP' }], endpoints: [] }), 'reject'],
  ['bad-port-name-chars', slice({ addressType: 'IPv4', ports: [{ name: 'almost_valid', protocol: 'TCP' }], endpoints: [] }), 'reject'],
  ['bad-port-name-length', slice({ addressType: 'IPv4', ports: [{ name: 'a'.repeat(64), protocol: 'TCP' }], endpoints: [] }), 'reject'],
  ['invalid-port-protocol', slice({ addressType: 'IPv4', ports: [{ name: 'http', protocol: 'foo' }] }), 'reject'],
  ['too-many-ports', slice({ addressType: 'IPv4', ports: gen.ports(20001) }), 'reject'],
  ['too-many-endpoints', slice({ addressType: 'IPv4', ports: gen.ports(1), endpoints: gen.endpoints(1001) }), 'reject'],
  ['no-endpoint-addresses', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(0) })] }), 'reject'],
  ['too-many-addresses', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(101) })] }), 'reject'],
  ['bad-topology-key', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), deprecatedTopology: { '--INVALID': 'example' } })] }), 'reject', { kproxyAccepts: unused('endpoints[].deprecatedTopology (the zone comes from endpoints[].zone)') }],
  ['too-many-topology-keys', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), deprecatedTopology: gen.topology(17) })] }), 'reject', { kproxyAccepts: unused('endpoints[].deprecatedTopology (the zone comes from endpoints[].zone)') }],
  ['bad-hostname', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hostname: '--INVALID' })] }), 'reject'],
  ['bad-meta', slice({ metadata: { name: '*&^', namespace: 'foo' }, addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hostname: 'valid-123' })] }), 'reject'],
  ['bad-ip', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: ['123.456.789.012'], hostname: 'valid-123' })] }), 'reject'],
  ['legacy-ip-with-strict-validation', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: ['012.034.056.078'], hostname: 'valid-123' })] }), 'reject', { gates: STRICT_ON, kproxyAccepts: gated('StrictIPCIDRValidation', false, 'legacy-ip-with-legacy-validation') + '; kproxy reads leading zeros as decimal, as ParseIPSloppy does' }],
  ['bad-ipv4', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: ['123.456.789.012', '2001:4860:4860::8888'], hostname: 'valid-123' })] }), 'reject'],
  ['bad-ipv6', slice({ addressType: 'IPv6', ports: httpPort, endpoints: [ep({ addresses: ['123.456.789.012', '2001:4860:4860:defg'], hostname: 'valid-123' })] }), 'reject'],
  ['bad-fqdns', slice({ addressType: 'FQDN', ports: httpPort, endpoints: [ep({ addresses: ['foo.*', 'FOO.example.com', 'underscores_are_bad.example.com', '*.example.com'], hostname: 'valid-123' })] }), 'reject'],
  ['bad-app-protocol', slice({ addressType: 'IPv4', ports: [{ name: 'http', protocol: 'TCP', appProtocol: '--' }], endpoints: [ep({ addresses: gen.ips(1), hostname: 'valid-123' })] }), 'reject', { kproxyAccepts: unused('ports[].appProtocol') }],
  ['invalid-zone-hint', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hints: { forZones: zones('inv@lid') } })] }), 'reject'],
  ['overlapping-zone-hints', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hints: { forZones: zones('zone-a', 'zone-b', 'zone-a') } })] }), 'reject', { kproxyAccepts: 'kproxy only asks whether a zone is among an endpoint\'s hints (categorize.ts); a zone listed twice answers the same' }],
  ['too-many-zone-hints', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hints: { forZones: zones('zone-a', 'zone-b', 'zone-c', 'zone-d', 'zone-e', 'zone-f', 'zone-g', 'zone-h', 'zone-i') } })] }), 'reject'],
  ['invalid-node-hints', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hints: { forNodes: zones('!@#$!@', '') } })] }), 'reject'],
  ['overlapping-node-hints', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hints: { forNodes: zones('node-1', 'node-2', 'node-1') } })] }), 'reject', { kproxyAccepts: 'kproxy only asks whether a node is among an endpoint\'s hints (categorize.ts); a node listed twice answers the same' }],
  ['too-many-node-hints', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hints: { forNodes: zones('node-1', 'node-2', 'node-3', 'node-4', 'node-5', 'node-6', 'node-7', 'node-8', 'node-9') } })] }), 'reject'],
  ['empty-everything', { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: {}, addressType: '', endpoints: null, ports: null }, 'reject'],
  ['special-ipv4', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: ['127.0.0.1'], hostname: 'valid-123' })] }), 'reject'],
  ['special-ipv6', slice({ addressType: 'IPv6', ports: httpPort, endpoints: [ep({ addresses: ['fe80::9656:d028:8652:66b6'], hostname: 'valid-123' })] }), 'reject'],
];

// TestValidateEndpointSliceCreate: ValidateEndpointSliceCreate with StrictIPCIDRValidation on.
const SLICE_CREATE: SliceRow[] = [
  ['good-slice', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hostname: 'valid-123' })] }), 'accept'],
  ['good-slice-node-name', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hostname: 'valid-123', nodeName: 'valid-node-name' })] }), 'accept'],
  ['bad-node-name', slice({ addressType: 'IPv4', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1), hostname: 'valid-123', nodeName: 'INvalid-node-name' })] }), 'reject'],
  ['deprecated-address-type', slice({ addressType: 'IP', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1) })] }), 'reject'],
  ['bad-address-type', slice({ addressType: 'other', ports: httpPort, endpoints: [ep({ addresses: gen.ips(1) })] }), 'reject'],
];

export function sliceCases(): UpstreamFile {
  const cases: UpstreamCase[] = [];
  const add = (test: string, validates: string, rows: SliceRow[]) =>
    rows.forEach(([name, object, upstream, extra], index) => cases.push({ name, test, validates, index, object, upstream, ...extra }));
  add('TestValidateEndpointSlice', 'ValidateEndpointSlice', SLICE);
  add('TestValidateEndpointSliceCreate', 'ValidateEndpointSliceCreate', SLICE_CREATE);
  return {
    header: {
      source: {
        repo: 'unnati2401/kubernetes, a copy of kubernetes/kubernetes',
        commit: 'a5e8298a09abde4bb7dc5ddf057a162fa850f2bd',
        path: 'pkg/apis/discovery/validation/validation_test.go',
        version:
          'v1.34-era master: forNodes hints (PreferSameTrafficDistribution), StrictIPCIDRValidation legacy-IP cases, MarkCoveredByDeclarative in validation.go; newer than the stored kubernetes/kubernetes copy (462f616, no forNodes)',
      },
      tables: {
        TestValidateEndpointSlice: 'every case but one (see notExpressible); upstream\'s table is a Go map, the order is the order of the source',
        TestValidateEndpointSliceCreate: 'every case',
      },
      omitted: {
        TestValidateEndpointSliceUpdate: 'update-only table (two objects)',
      },
      notExpressible: [
        {
          test: 'TestValidateEndpointSlice',
          name: 'zone-key-topology',
          why: 'the internal object holds topology.kubernetes.io/zone in DeprecatedTopology, which no v1 object converts to: the v1 conversion moves that key into endpoints[].zone (upstream\'s error is "reserved key was not removed in conversion")',
        },
      ],
      generated:
        'lists made by upstream\'s helpers are written as {"$generatePorts": n} (ports http-0.. with protocol TCP), {"$generateEndpoints": n} (endpoints with address 10.1.2.(i%255)), {"$generateIPAddresses": n} (10.1.2.(i%255)) and {"$generateTopology": n} (topology-i: example); the test expands them exactly so',
      jsonForm:
        'endpoints and ports have no omitempty in discovery/v1 (a Go nil is null); endpoint conditions is a struct (always {}); pointers left nil are left out; none of the objects carries the kubernetes.io/service-name label, as in upstream\'s table',
    },
    cases,
  };
}

// ---- the files ------------------------------------------------------------------------------------

export const DATA_DIR = dirname(fileURLToPath(import.meta.url));
export const SERVICES_FILE = join(DATA_DIR, 'services.json');
export const SLICES_FILE = join(DATA_DIR, 'endpointslices.json');

export function render(f: UpstreamFile): string {
  // one case per line keeps the files readable and their diffs small
  const lines = f.cases.map((c) => `    ${JSON.stringify(c)}`);
  return `{\n  "header": ${JSON.stringify(f.header, null, 2).replace(/\n/g, '\n  ')},\n  "cases": [\n${lines.join(',\n')}\n  ]\n}\n`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  writeFileSync(SERVICES_FILE, render(serviceCases()));
  writeFileSync(SLICES_FILE, render(sliceCases()));
  console.log(`wrote ${SERVICES_FILE} and ${SLICES_FILE}`);
}
