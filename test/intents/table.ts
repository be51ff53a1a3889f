// The table of intents: one LoadBalancer Service per combination of
// internal and external traffic policy, endpoint set and session affinity, in both IP
// families, and the packet flows that reach it (every frontend × every kind of source).
// Each flow carries the result upstream's iptables mode gives, from `oracle()` below, which
// is written from upstream's rules, not from kproxy's code.
//
// Address plan (upstream's test plan; one address per service where a frontend needs one):
//   ClusterIPs 172.30.0.N / fd00:172:30::N, LB IPs 1.2.3.N / fd00:1:2:3::N,
//   external IPs 192.168.99.N / fd00:99::N, node 192.168.0.2 / fd00::2,
//   endpoints on this node 10.180.0.N / fd00:10:180::N, on another node 10.180.1.N /
//   fd00:10:180::1:N, a pod on this node 10.0.0.5 / fd00:10::5 (inside the clusterCIDR
//   10.0.0.0/8 / fd00:10::/32), an outside client 203.0.113.7 / fd00:203::7.
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { clientIPAffinity, lbStatus, makeService, makeSlice, type EndpointOpts } from '../support/builders.ts';

export type Family = 4 | 6;
export type Policy = 'Cluster' | 'Local';
/**
 * lr: one ready endpoint on this node and one on another; r: remote ready only;
 * l: local ready only; t: terminating only (a local and a remote endpoint, both serving and
 * terminating, neither ready); none: no endpoints at all.
 */
export type EndpointSet = 'lr' | 'r' | 'l' | 't' | 'none';
export type Affinity = 'None' | 'ClientIP';
export type Frontend = 'clusterIP' | 'nodePort' | 'loadBalancerIP' | 'externalIP';
/** pod: a pod on this node (inside the clusterCIDR); node: the node itself (source = node IP); outside: an off-cluster client */
export type Source = 'pod' | 'node' | 'outside';

export const POLICIES: Policy[] = ['Cluster', 'Local'];
export const ENDPOINT_SETS: EndpointSet[] = ['lr', 'r', 'l', 't', 'none'];
export const AFFINITIES: Affinity[] = ['None', 'ClientIP'];
export const FRONTENDS: Frontend[] = ['clusterIP', 'nodePort', 'loadBalancerIP', 'externalIP'];
export const SOURCES: Source[] = ['pod', 'node', 'outside'];

export const NODE_NAME = 'node1';
const OTHER_NODE = 'node2';
export const NAMESPACE = 'ns';
export const PORT = 80;
const TARGET_PORT = 8080;

export interface FamilyPlan {
  family: Family;
  nodeIP: string;
  clusterCIDR: string;
  sources: Record<Source, string>;
  clusterIP(n: number): string;
  lbIP(n: number): string;
  externalIP(n: number): string;
  localEndpoint(n: number): string;
  remoteEndpoint(n: number): string;
  endpointKey(ip: string): string;
}

const hex = (n: number) => n.toString(16);

export const FAMILIES: Record<Family, FamilyPlan> = {
  4: {
    family: 4,
    nodeIP: '192.168.0.2',
    clusterCIDR: '10.0.0.0/8',
    sources: { pod: '10.0.0.5', node: '192.168.0.2', outside: '203.0.113.7' },
    clusterIP: (n) => `172.30.0.${n}`,
    lbIP: (n) => `1.2.3.${n}`,
    externalIP: (n) => `192.168.99.${n}`,
    localEndpoint: (n) => `10.180.0.${n}`,
    remoteEndpoint: (n) => `10.180.1.${n}`,
    endpointKey: (ip) => `${ip}:${TARGET_PORT}`,
  },
  6: {
    family: 6,
    nodeIP: 'fd00::2',
    clusterCIDR: 'fd00:10::/32',
    sources: { pod: 'fd00:10::5', node: 'fd00::2', outside: 'fd00:203::7' },
    clusterIP: (n) => `fd00:172:30::${hex(n)}`,
    lbIP: (n) => `fd00:1:2:3::${hex(n)}`,
    externalIP: (n) => `fd00:99::${hex(n)}`,
    localEndpoint: (n) => `fd00:10:180::${hex(n)}`,
    remoteEndpoint: (n) => `fd00:10:180::1:${hex(n)}`,
    endpointKey: (ip) => `[${ip}]:${TARGET_PORT}`,
  },
};

export interface ServiceCase {
  /** 1-based; picks the service's addresses and NodePort */
  n: number;
  name: string;
  itp: Policy;
  etp: Policy;
  endpoints: EndpointSet;
  affinity: Affinity;
  nodePort: number;
}

export interface Expected {
  /** "ip:port, ip:port" sorted | "REJECT" | "DROP" | "" */
  output: string;
  masq: boolean;
}

export interface Flow {
  /** a readable, unique name: "v4 svc-itp-c-etp-l-lr-none: pod → loadBalancerIP" */
  name: string;
  family: Family;
  svc: ServiceCase;
  frontend: Frontend;
  source: Source;
  from: string;
  to: string;
  port: number;
  protocol: 'TCP';
  expected: Expected;
}

export function serviceCases(): ServiceCase[] {
  const out: ServiceCase[] = [];
  let n = 0;
  for (const itp of POLICIES) {
    for (const etp of POLICIES) {
      for (const endpoints of ENDPOINT_SETS) {
        for (const affinity of AFFINITIES) {
          n++;
          const name = `svc-itp-${itp[0].toLowerCase()}-etp-${etp[0].toLowerCase()}-${endpoints}-${affinity === 'None' ? 'noaff' : 'aff'}`;
          out.push({ n, name, itp, etp, endpoints, affinity, nodePort: 30000 + n });
        }
      }
    }
  }
  return out;
}

export function serviceObject(fp: FamilyPlan, s: ServiceCase): K8sService {
  const clusterIP = fp.clusterIP(s.n);
  return makeService(NAMESPACE, s.name, {
    type: 'LoadBalancer',
    clusterIP,
    clusterIPs: [clusterIP],
    ipFamilies: [fp.family === 4 ? 'IPv4' : 'IPv6'],
    ports: [{ name: 'p80', protocol: 'TCP', port: PORT, targetPort: TARGET_PORT, nodePort: s.nodePort }],
    externalIPs: [fp.externalIP(s.n)],
    internalTrafficPolicy: s.itp,
    externalTrafficPolicy: s.etp,
    ...(s.etp === 'Local' ? { healthCheckNodePort: 32000 + s.n } : {}),
    ...(s.affinity === 'ClientIP' ? clientIPAffinity(10800) : { sessionAffinity: s.affinity }),
  }, lbStatus(fp.lbIP(s.n)));
}

function endpoint(ip: string, node: string, state: 'ready' | 'terminating'): EndpointOpts {
  return state === 'ready' ? { ip, node, ready: true, serving: true, terminating: false } : { ip, node, ready: false, serving: true, terminating: true };
}

/** null for the "none" endpoint set: no EndpointSlice at all */
export function sliceObject(fp: FamilyPlan, s: ServiceCase): K8sEndpointSlice | null {
  const local = fp.localEndpoint(s.n);
  const remote = fp.remoteEndpoint(s.n);
  const eps: Record<EndpointSet, EndpointOpts[]> = {
    lr: [endpoint(local, NODE_NAME, 'ready'), endpoint(remote, OTHER_NODE, 'ready')],
    r: [endpoint(remote, OTHER_NODE, 'ready')],
    l: [endpoint(local, NODE_NAME, 'ready')],
    t: [endpoint(local, NODE_NAME, 'terminating'), endpoint(remote, OTHER_NODE, 'terminating')],
    none: [],
  };
  if (s.endpoints === 'none') return null;
  return makeSlice(NAMESPACE, s.name, { name: `${s.name}-abcde`, family: fp.family, endpoints: eps[s.endpoints], ports: [{ name: 'p80', port: TARGET_PORT }] });
}

// ---------------------------------------------------------------------------------------
// The oracle: upstream kube-proxy's iptables mode, flow by flow.
// ---------------------------------------------------------------------------------------

/**
 * upstream's CategorizeEndpoints (pkg/proxy/topology.go) for the endpoint sets of the
 * table: every service here is externally accessible, so UsesClusterEndpoints() is always
 * true; the cluster set is the ready endpoints, or, when none is ready, the serving and
 * terminating ones; the local set is the ready local endpoints, or, when none, the serving
 * and terminating local ones (KEP-1669). No topology hints are set.
 */
export function categorize(fp: FamilyPlan, s: ServiceCase): { cluster: string[]; local: string[]; hasAny: boolean } {
  const L = fp.endpointKey(fp.localEndpoint(s.n));
  const R = fp.endpointKey(fp.remoteEndpoint(s.n));
  const table: Record<EndpointSet, { cluster: string[]; local: string[] }> = {
    lr: { cluster: [L, R], local: [L] },
    r: { cluster: [R], local: [] },
    l: { cluster: [L], local: [L] },
    t: { cluster: [L, R], local: [L] },
    none: { cluster: [], local: [] },
  };
  const c = table[s.endpoints];
  return { cluster: [...c.cluster].sort(), local: [...c.local].sort(), hasAny: c.cluster.length > 0 };
}

const list = (eps: string[]) => eps.join(', ');

/**
 * What upstream's iptables syncProxyRules does with the first packet of a connection
 * (flow semantics of ../shared/conformance/README.md):
 *
 * - hasEndpoints false (no ready nor serving-terminating endpoint anywhere): filter
 *   KUBE-SERVICES / KUBE-EXTERNAL-SERVICES REJECT every frontend (TestNoEndpointsReject).
 * - ClusterIP: KUBE-SERVICES → the internal policy chain (KUBE-SVC, or KUBE-SVL for iTP
 *   Local). With iTP Local and no local endpoint, no nat rule and filter DROP
 *   (TestInternalTrafficPolicy). Masquerade: the "cluster IP" rule in that chain with
 *   `! -s clusterCIDR` (off-cluster sources, which includes the node's own IP).
 * - NodePort, LB IP, external IP: → KUBE-EXT. eTP Cluster: KUBE-MARK-MASQ then KUBE-SVC
 *   (every source, masq). eTP Local (TestExternalTrafficPolicyLocal, TestOnlyLocal*):
 *   a pod source (`-s clusterCIDR`) short-circuits to KUBE-SVC, the cluster endpoints, no
 *   masq (UsesClusterEndpoints() is true for every externally accessible service);
 *   a LOCAL source (the node) is masqueraded and sent to KUBE-SVC; anything else goes to
 *   KUBE-SVL, the local endpoints, no masq, or, with no local endpoint, no nat rule and
 *   filter KUBE-EXTERNAL-SERVICES DROP.
 * - Session affinity adds `recent --rcheck` rules that never match a first packet, so it
 *   changes no outcome (TestSessionAffinity).
 * - Terminating endpoints are used only when no ready one exists, per set
 *   (TestTerminatingEndpoints*); that is categorize() above.
 */
export function oracle(fp: FamilyPlan, s: ServiceCase, frontend: Frontend, source: Source): Expected {
  const cat = categorize(fp, s);
  if (!cat.hasAny) return { output: 'REJECT', masq: false };
  if (frontend === 'clusterIP') {
    const eps = s.itp === 'Local' ? cat.local : cat.cluster;
    if (eps.length === 0) return { output: 'DROP', masq: false };
    // only the pod source is inside the clusterCIDR; the node IP and the outside client are not
    return { output: list(eps), masq: source !== 'pod' };
  }
  if (s.etp === 'Cluster') return { output: list(cat.cluster), masq: true };
  if (source === 'pod') return { output: list(cat.cluster), masq: false };
  if (source === 'node') return { output: list(cat.cluster), masq: true };
  if (cat.local.length === 0) return { output: 'DROP', masq: false };
  return { output: list(cat.local), masq: false };
}

export function destination(fp: FamilyPlan, s: ServiceCase, frontend: Frontend): { to: string; port: number } {
  switch (frontend) {
    case 'clusterIP':
      return { to: fp.clusterIP(s.n), port: PORT };
    case 'nodePort':
      return { to: fp.nodeIP, port: s.nodePort };
    case 'loadBalancerIP':
      return { to: fp.lbIP(s.n), port: PORT };
    case 'externalIP':
      return { to: fp.externalIP(s.n), port: PORT };
  }
}

export function flows(family: Family): Flow[] {
  const fp = FAMILIES[family];
  const out: Flow[] = [];
  for (const svc of serviceCases()) {
    for (const frontend of FRONTENDS) {
      for (const source of SOURCES) {
        const { to, port } = destination(fp, svc, frontend);
        out.push({
          name: `v${family} ${svc.name}: ${source} → ${frontend}`,
          family,
          svc,
          frontend,
          source,
          from: fp.sources[source],
          to,
          port,
          protocol: 'TCP',
          expected: oracle(fp, svc, frontend, source),
        });
      }
    }
  }
  return out;
}
