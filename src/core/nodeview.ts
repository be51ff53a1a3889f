// The node view (kpng's "brain"): what every service port does on this node, for one IP
// family, computed once per sync from the state, the Node and the config. Every decision
// about *what* a service does lives here, once, with a why-comment citing upstream
// (kubernetes/kubernetes pkg/proxy); the mode planners only decide *how* to express it.
// Pure: no I/O.
import { categorizeEndpoints } from './categorize.ts';
import { canonicalIP, cidrContains, ipFamily, isLoopback, parseCIDR } from './ip.ts';
import {
  externallyAccessible, usesClusterEndpoints, usesLocalEndpoints, type Endpoint, type ProxyState, type ServicePort,
} from './model.ts';
import { masqueradeMark, type ModeName, type ProxyConfig } from '../config/config.ts';
import { kproxyError } from '../errors.ts';
import { safeServicePort, type SkippedVIP } from './vip.ts';

/** Facts about this node that planners need. */
export interface NodeContext {
  nodeName: string;
  /** this node's own addresses of the planned family (NodePort targets, addrtype LOCAL) */
  nodeIPs: string[];
  nodeLabels: Record<string, string>;
  family: 4 | 6;
  /** the Node object's spec.podCIDRs (detectLocalMode NodeCIDR) */
  podCIDRs?: string[];
  /** the Node object's status.addresses (the primary node IP: nodePortAddresses "primary") */
  addresses?: Array<{ type: string; address: string }>;
  /**
   * Every address of this host, loopback included, probed once by the controller
   * (src/kernel/links.ts hostAddresses): the NodePort CIDRs select among them (upstream
   * GetNodeIPs). Absent (a render, a test): the node IPs and loopback.
   */
  hostIPs?: string[];
}

export interface PlanInput {
  state: ProxyState;
  config: ProxyConfig;
  node: NodeContext;
  /** the node view of this sync and family (src/core/nodeview.ts); computed when absent */
  view?: NodeView;
}

/** How "traffic from this cluster's pods" is recognised: upstream's LocalTrafficDetector. */
export type LocalDetectorSpec =
  | { kind: 'cidr'; cidr: string }
  | { kind: 'interface'; name: string }
  | { kind: 'interface-prefix'; prefix: string };

/** Where NodePorts are accepted. */
export interface NodePortAddresses {
  /** true: every local address (iptables `-m addrtype --dst-type LOCAL`, nftables `fib daddr type local`) */
  matchAll: boolean;
  /** when !matchAll: the node addresses NodePorts are accepted on, in order (loopback included when configured) */
  ips: string[];
  /** the CIDRs they were resolved from ("primary" already replaced by the primary IP's host CIDR) */
  cidrs: string[];
}

/** Firewall (loadBalancerSourceRanges) facts of one service port. */
export interface FirewallView {
  /** canonical CIDRs of this family */
  sourceRanges: string[];
  /**
   * A /0 range allows every source: no filtering is needed (kubernetes#132722, ipvs; the
   * iptables and nftables modes keep upstream's literal rule, which matches everything).
   */
  allowAll: boolean;
  /**
   * The node's own IP is inside the ranges: a node connecting to an LB IP that is also a
   * local address loops back with the LB IP as source, so the LB IPs are allowed too
   * (upstream iptables/nftables proxier: "allowFromNode").
   */
  nodeInRanges: boolean;
  /** the sources an LB IP accepts: the ranges, and the LB IPs themselves when the node is in them */
  allowedSources: string[];
}

/** What a frontend's traffic meets: the endpoints of its policy, or a verdict. */
export type FrontendVerdict = 'forward' | 'reject' | 'drop';

/** What one service port does on this node. */
export interface PortView {
  /** the tracker's ServicePort (identity kept for caches) */
  source: ServicePort;
  /**
   * The port as every mode renders it: `source` without the VIPs no rule may hold (loopback,
   * unspecified, link-local, multicast, broadcast: src/core/vip.ts), the same object when it has none.
   */
  sp: ServicePort;
  /** the VIPs left out of `sp`, with why (each mode's proxier logs them once) */
  skippedVIPs: SkippedVIP[];
  /** the state's endpoint list (identity kept for caches) */
  endpoints: Endpoint[];
  /** upstream CategorizeEndpoints (pkg/proxy/topology.go) */
  clusterEndpoints: Endpoint[];
  localEndpoints: Endpoint[];
  allReachableEndpoints: Endpoint[];
  hasAnyEndpoints: boolean;
  /**
   * Does internal traffic (ClusterIP) have endpoints to go to? With internalTrafficPolicy
   * Local only node-local ones count (upstream iptables proxier: hasInternalEndpoints).
   */
  hasInternalEndpoints: boolean;
  /** the same for external traffic (NodePort, LB IP, external IP) and externalTrafficPolicy */
  hasExternalEndpoints: boolean;
  /**
   * What internal traffic meets: its endpoints, or upstream's verdicts (iptables and nftables
   * proxiers): with no endpoint at all every frontend REJECTs; with endpoints, a Local policy
   * without node-local ones DROPs ("has no local endpoints").
   */
  internalVerdict: FrontendVerdict;
  /** the same for external traffic */
  externalVerdict: FrontendVerdict;
  /**
   * The endpoints a mode with one endpoint list per frontend (IPVS real servers) balances
   * internal traffic over: with a Local policy the node-local ones, or the cluster-wide ones
   * when there is none, so local pods still reach the Service (upstream ipvs syncEndpoint,
   * kubernetes#97081); otherwise the cluster-wide ones.
   */
  internalBackends: Endpoint[];
  /** the same for external traffic */
  externalBackends: Endpoint[];
  /** which chain internal traffic goes to: the cluster-wide or the node-local endpoints */
  internalPolicy: 'cluster' | 'local';
  externalPolicy: 'cluster' | 'local';
  /**
   * The cluster-wide endpoint set is rendered: upstream's UsesClusterEndpoints(), true for
   * every externally accessible service even with both policies Local, because pod and node
   * traffic to its external addresses is short-circuited to any endpoint (upstream
   * iptables and nftables proxiers: "usesClusterPolicyChain").
   */
  usesClusterPath: boolean;
  /** the node-local endpoint set is rendered (upstream's UsesLocalEndpoints()) */
  usesLocalPath: boolean;
  /** NodePort, external IPs or LB IPs (upstream's ExternallyAccessible()) */
  externallyAccessible: boolean;
  /**
   * The external chain exists: an externally accessible service with any endpoint; it holds
   * the masquerade or short-circuit rules even without externally usable endpoints
   * (upstream: usesExternalTrafficChain = hasEndpoints && ExternallyAccessible()).
   */
  usesExternalPath: boolean;
  /** pod and node traffic to external addresses with eTP Local goes to the cluster endpoints */
  shortCircuitToCluster: boolean;
  /** null when the port has no LB IPs or no source ranges of its family */
  firewall: FirewallView | null;
  /**
   * The firewall is rendered in iptables/nftables: upstream usesFWChain := hasEndpoints &&
   * len(LoadBalancerVIPs) > 0 && len(LoadBalancerSourceRanges) > 0 (without endpoints the
   * LB IP is rejected anyway).
   */
  usesFirewallPath: boolean;
  /** 0 when none; upstream serves it only for eTP Local (healthcheck.ServiceHealthServer) */
  healthCheckNodePort: number;
  /** ClientIP affinity timeout in seconds, 0 when none */
  affinitySeconds: number;
}

/**
 * A conntrack flow that must be cleared after the sync: UDP/SCTP as upstream's conntrack
 * cleanup, and (kproxy, not upstream) TCP connection attempts that were never DNATed.
 */
export type StaleFlow =
  /** flows DNATed to an endpoint that left the service (upstream: deleted UDP endpoints) */
  | { kind: 'endpoint'; protocol: 'UDP' | 'SCTP'; serviceIP: string; port: number; endpointIP: string; endpointPort: number }
  /**
   * flows to a service address whose service went from no endpoints to some (upstream: newly
   * active UDP services), or that has none in the first view (upstream: kubernetes#139629)
   */
  | { kind: 'service'; protocol: 'UDP' | 'SCTP'; ip: string; port: number }
  | { kind: 'nodePort'; protocol: 'UDP' | 'SCTP'; port: number }
  /**
   * TCP connection attempts to a service address (ip) or to a NodePort on any address (ip
   * null) that were made while the port had no rule, so were never DNATed and never answered
   * (conntrack state SYN_SENT, reply tuple = the original destination). Conntrack keeps such an
   * entry for 120 s and does not refresh it on a new SYN; a client that reuses the source port
   * (or a SYN retransmitted after the rules arrived) matches it, skips NAT and is lost.
   */
  | { kind: 'unNATed'; protocol: 'TCP'; ip: string | null; port: number };

/** One Service's health check (upstream's svcPortMap.HealthCheckNodePorts() with LocalReadyEndpoints()). */
export interface HealthCheckService {
  namespace: string;
  name: string;
  port: number;
  /** local ready endpoints (upstream EndpointsMap.LocalReadyEndpoints), over the Service's ports */
  localEndpoints: number;
}

/**
 * The node-wide settings (NodeSettings, below) plus every port's decisions.
 *
 * An incremental build (buildViewFrom with a previous view and the changes) updates the
 * previous view's maps in place and returns a new view object over them: copying 50,000
 * entries per sync would be a third of kproxy's own time for a one-Service change. The
 * previous view is then superseded; revertView(new view) puts its maps back (a sync that
 * failed: the next one, full, computes its stale flows against the last applied view).
 */
export interface NodeView extends NodeSettings {
  /**
   * every planned service port of the family, by servicePortKey: in key order after a full
   * build; an incremental one keeps unchanged ports where they are and adds new ones last
   */
  ports: Map<string, PortView>;
  /** each Service's ("ns/name") port keys in `ports`, sorted; its size is the number of Services of the family */
  servicePorts: Map<string, string[]>;
  /**
   * ports that have endpoints somewhere but none for internal (external) traffic here: a
   * Local traffic policy without local endpoints (upstream's sync_proxy_rules_no_local_endpoints_total)
   */
  noLocalEndpoints: { internal: number; external: number };
  /** the health-checked Services (eTP Local with a health check node port), by Service key */
  healthChecks: Map<string, HealthCheckService>;
  /** conntrack entries to clear after this sync, relative to the previous view */
  staleFlows: StaleFlow[];
}

// ---- per-port decisions ------------------------------------------------------------------

/**
 * The node facts a port's decisions depend on, as the sync's settings hold them (a conformance
 * case gives them literally): every mode's planner passes these, never node inputs of its own.
 */
export type PortFacts = Pick<NodeSettings, 'nodeName' | 'nodeLabels' | 'primaryNodeIP' | 'loopbackVIPs'>;

/** The port facts of a sync's settings (a plain object: the iptables planner fingerprints it). */
export function portFactsOf(s: NodeSettings): PortFacts {
  return { nodeName: s.nodeName, nodeLabels: s.nodeLabels, primaryNodeIP: s.primaryNodeIP, loopbackVIPs: s.loopbackVIPs };
}

// A port's view depends only on its ServicePort, its Endpoint[] and the node facts; the
// trackers replace those objects on change, so unchanged ports keep the same view object and
// the planners' per-port caches (keyed on the same identities) keep hitting at 10k services.
// A planner asking for a port the sync's view holds gets the view's own object.
const portCache = new WeakMap<ServicePort, { eps: Endpoint[]; factsKey: string; view: PortView }>();
const factsKeys = new WeakMap<PortFacts, string>();

function factsKeyOf(f: PortFacts): string {
  let k = factsKeys.get(f);
  if (k === undefined) factsKeys.set(f, (k = JSON.stringify([f.nodeName, f.nodeLabels, f.primaryNodeIP, f.loopbackVIPs])));
  return k;
}

/** The decisions for one service port; cached per (ServicePort, Endpoint[], node facts). */
export function portOf(facts: PortFacts, sp: ServicePort, endpoints: Endpoint[]): PortView {
  const factsKey = factsKeyOf(facts);
  const hit = portCache.get(sp);
  if (hit && hit.eps === endpoints && hit.factsKey === factsKey) return hit.view;
  const view = computePortView(sp, endpoints, facts);
  portCache.set(sp, { eps: endpoints, factsKey, view });
  return view;
}

function computePortView(source: ServicePort, endpoints: Endpoint[], node: PortFacts): PortView {
  // The API server accepts VIPs no rule may hold (src/core/vip.ts): the port is decided and
  // rendered without them.
  const { sp, skipped } = safeServicePort(source, { allowLoopback: node.loopbackVIPs });
  // upstream CategorizeEndpoints: ready first, serving+terminating as fallback, topology
  // hints narrowing the cluster set, node-local endpoints for Local policies.
  const cat = categorizeEndpoints(endpoints, sp, node.nodeName, node.nodeLabels);
  const hasAny = cat.hasAnyEndpoints;
  // upstream iptables proxier syncProxyRules: with a Local policy only local endpoints
  // count for that path; "has no local endpoints" is a DROP, not a REJECT, because the
  // service does have endpoints elsewhere.
  const hasInternal = hasAny && (!sp.internalPolicyLocal || cat.localEndpoints.length > 0);
  const hasExternal = hasAny && (!sp.externalPolicyLocal || cat.localEndpoints.length > 0);
  const ext = externallyAccessible(sp);
  // upstream: usesClusterPolicyChain := len(clusterEndpoints) > 0 && svcInfo.UsesClusterEndpoints()
  const usesClusterPath = cat.clusterEndpoints.length > 0 && usesClusterEndpoints(sp);
  // upstream: usesLocalPolicyChain := len(localEndpoints) > 0 && svcInfo.UsesLocalEndpoints()
  const usesLocalPath = cat.localEndpoints.length > 0 && usesLocalEndpoints(sp);
  let firewall: FirewallView | null = null;
  // upstream servicePortInfo keeps only the source ranges of the service port's family.
  const ranges = sp.loadBalancerSourceRanges.filter((c) => parseCIDR(c)?.family === sp.family);
  if (sp.loadBalancerVIPs.length > 0 && ranges.length > 0) {
    const nodeInRanges = node.primaryNodeIP !== null && ranges.some((c) => cidrContains(c, node.primaryNodeIP!));
    firewall = {
      sourceRanges: ranges,
      // kubernetes#132722: a /0 source range allows all sources.
      allowAll: ranges.some((c) => parseCIDR(c)?.prefix === 0),
      nodeInRanges,
      allowedSources: [...ranges, ...(nodeInRanges ? sp.loadBalancerVIPs.map((ip) => `${ip}/${sp.family === 6 ? 128 : 32}`) : [])],
    };
  }
  return {
    source,
    sp,
    skippedVIPs: skipped,
    endpoints,
    clusterEndpoints: cat.clusterEndpoints,
    localEndpoints: cat.localEndpoints,
    allReachableEndpoints: cat.allReachableEndpoints,
    hasAnyEndpoints: hasAny,
    hasInternalEndpoints: hasInternal,
    hasExternalEndpoints: hasExternal,
    internalVerdict: !hasAny ? 'reject' : hasInternal ? 'forward' : 'drop',
    externalVerdict: !hasAny ? 'reject' : hasExternal ? 'forward' : 'drop',
    internalBackends: sp.internalPolicyLocal && cat.localEndpoints.length ? cat.localEndpoints : cat.clusterEndpoints,
    externalBackends: sp.externalPolicyLocal && cat.localEndpoints.length ? cat.localEndpoints : cat.clusterEndpoints,
    internalPolicy: sp.internalPolicyLocal ? 'local' : 'cluster',
    externalPolicy: sp.externalPolicyLocal ? 'local' : 'cluster',
    usesClusterPath,
    usesLocalPath,
    externallyAccessible: ext,
    usesExternalPath: hasAny && ext,
    // upstream iptables/nftables: with eTP Local, "pod traffic" (detector) and "LOCAL
    // traffic" (src-type LOCAL / fib saddr type local) to external destinations go to the
    // cluster chain, simulating a trip out to the LB and back (kubernetes#109826 etc.).
    shortCircuitToCluster: sp.externalPolicyLocal && usesClusterPath,
    firewall,
    usesFirewallPath: hasAny && firewall !== null,
    // upstream serves the health check node port only for eTP Local services
    healthCheckNodePort: sp.externalPolicyLocal ? sp.healthCheckNodePort : 0,
    affinitySeconds: sp.stickyMaxAgeSeconds,
  };
}

// ---- node-wide decisions -----------------------------------------------------------------

/**
 * The Node object's primary IP of a family: upstream's GetNodeHostIPs (pkg/util/node) takes
 * the first InternalIP of each family, else the first ExternalIP; kube-proxy falls back to
 * the host's own address when the Node has none (cmd/kube-proxy/app/server.go detectNodeIPs).
 */
export function primaryNodeIP(node: NodeContext): string | null {
  const fam = node.family;
  const addrs = node.addresses ?? [];
  for (const type of ['InternalIP', 'ExternalIP']) {
    for (const a of addrs) {
      if (a.type !== type) continue;
      const ip = canonicalIP(a.address);
      if (ip && ipFamily(ip) === fam) return ip;
    }
  }
  for (const raw of node.nodeIPs) {
    const ip = canonicalIP(raw);
    if (ip && ipFamily(ip) === fam) return ip;
  }
  return null;
}

/**
 * upstream's effective nodePortAddresses: unset means every local address in the iptables
 * and ipvs modes, and "primary" in the nftables mode (v1.31+, cmd/kube-proxy/app/server.go).
 */
export function effectiveNodePortAddresses(config: ProxyConfig, mode: ModeName): string[] {
  if (config.nodePortAddresses.length === 0 && mode === 'nftables') return ['primary'];
  return config.nodePortAddresses;
}

/**
 * upstream NewNodePortAddresses + GetNodeIPs (pkg/proxy/util/nodeport_addresses.go): CIDRs
 * of the other family are ignored; "primary" stands for the primary node IP's host CIDR,
 * "localhost" for the family's loopback address, "all" for every address, mixed with CIDRs; none left, or a /0, means "all local addresses"; otherwise the local
 * addresses inside the CIDRs (loopback only when a CIDR contains it).
 */
export function resolveNodePortAddresses(family: 4 | 6, list: string[], localIPs: string[], primary: string | null): NodePortAddresses {
  const cidrs: string[] = [];
  const host = family === 6 ? 128 : 32;
  for (const c of list) {
    // the keywords stand for their CIDRs of the family (upstream NewNodePortAddresses, kubernetes#138427)
    const cidr = c === 'primary' ? (primary ? `${primary}/${host}` : null)
      : c === 'localhost' ? (family === 6 ? '::1/128' : '127.0.0.1/32')
      : c === 'all' ? (family === 6 ? '::/0' : '0.0.0.0/0')
      : c;
    const p = cidr ? parseCIDR(cidr) : null;
    if (p && p.family === family && !cidrs.includes(p.text)) cidrs.push(p.text);
  }
  const parsed = cidrs.map((c) => parseCIDR(c)!);
  if (parsed.length === 0 || parsed.some((c) => c.prefix === 0)) return { matchAll: true, ips: [], cidrs };
  const ips: string[] = [];
  const candidates = [...localIPs];
  if (primary) candidates.push(primary);
  for (const c of parsed) {
    for (const raw of candidates) {
      const ip = canonicalIP(raw);
      if (ip && cidrContains(c, ip) && !ips.includes(ip)) ips.push(ip);
    }
  }
  return { matchAll: false, ips, cidrs };
}

/**
 * The addresses a mode accepts NodePorts on: 'all' (every local address, as the mode's
 * "destination is local" match) or a list of node addresses.
 */
export type NodePortIPs = string[] | 'all';

/**
 * Where each mode accepts NodePorts, decided here once from the resolved addresses:
 * - iptables: every local address, or the resolved ones; loopback only for IPv4 with
 *   localhostNodePorts (upstream iptables proxier: route_localnet, "localhostNodePorts");
 *   with 'all' the mode's catch-all rule leaves loopback out itself unless allowed;
 * - nftables: the same, never loopback (upstream nftables proxier: NodePorts on localhost
 *   are not supported);
 * - ipvs: a virtual server per address, so 'all' is every node IP; never loopback
 *   (upstream ipvs proxier);
 * - userspace: the addresses it can bind, 'all' being every node IP.
 */
export function nodePortIPsFor(mode: ModeName, family: 4 | 6, n: NodePortAddresses, nodeIPs: string[], localhostNodePorts: boolean): NodePortIPs {
  const ofFamily = (list: string[]) => [...new Set(list.filter((ip) => ipFamily(ip) === family))];
  switch (mode) {
    case 'iptables':
      if (n.matchAll) return 'all';
      return ofFamily(n.ips.filter((ip) => !isLoopback(ip) || (family === 4 && localhostNodePorts)));
    case 'nftables':
      if (n.matchAll) return 'all';
      return ofFamily(n.ips.filter((ip) => !isLoopback(ip)));
    case 'ipvs':
      return ofFamily(nodePortAddressList(n, nodeIPs).filter((ip) => !isLoopback(ip)));
    default:
      return nodePortAddressList(n, nodeIPs);
  }
}

/** The NodePort addresses as a list: every node IP when they match all (modes that bind or create per address). */
export function nodePortAddressList(n: NodePortAddresses, nodeIPs: string[]): string[] {
  return n.matchAll ? nodeIPs : n.ips;
}

/** upstream ContainsIPv4Loopback: do the NodePort addresses include 127.0.0.1? */
export function nodePortsIncludeIPv4Loopback(n: NodePortAddresses): boolean {
  if (n.matchAll) return true;
  const v4 = n.cidrs.map((c) => parseCIDR(c)).filter((c) => c && c.family === 4);
  return v4.some((c) => isLoopback(c!.ip) || cidrContains(c!, '127.0.0.1'));
}

/**
 * upstream getLocalDetectors (cmd/kube-proxy/app/server_linux.go), per family:
 * ClusterCIDR → the first clusterCIDR of the family; NodeCIDR → the first of the Node's
 * spec.podCIDRs of the family; BridgeInterface → `-i br` / `iifname br`; InterfaceNamePrefix
 * → `-i prefix+` / `iifname "prefix*"`. A CIDR mode without a CIDR of the family detects
 * nothing (upstream logs "no cluster CIDR for family" and uses the no-op detector).
 */
export function resolveDetector(config: ProxyConfig, node: NodeContext): LocalDetectorSpec | null {
  const fam = node.family;
  const firstOfFamily = (list: string[]) => list.map((c) => parseCIDR(c)).find((c) => c && c.family === fam)?.text ?? null;
  switch (config.detectLocalMode) {
    case 'NodeCIDR': {
      const c = firstOfFamily(node.podCIDRs ?? []);
      return c ? { kind: 'cidr', cidr: c } : null;
    }
    case 'BridgeInterface':
      return config.detectLocal.bridgeInterface ? { kind: 'interface', name: config.detectLocal.bridgeInterface } : null;
    case 'InterfaceNamePrefix':
      return config.detectLocal.interfaceNamePrefix ? { kind: 'interface-prefix', prefix: config.detectLocal.interfaceNamePrefix } : null;
    default: {
      const c = firstOfFamily(config.clusterCIDRs);
      return c ? { kind: 'cidr', cidr: c } : null;
    }
  }
}

/** Node-wide settings, resolved from the config and the Node (or given by a conformance case). */
export interface NodeSettings {
  family: 4 | 6;
  nodeName: string;
  nodeLabels: Record<string, string>;
  /** this node's addresses of the family */
  nodeIPs: string[];
  /** the Node object's primary IP of the family, else the host's first; null when none */
  primaryNodeIP: string | null;
  nodePorts: NodePortAddresses;
  /** the addresses this mode accepts NodePorts on (nodePortIPsFor) */
  nodePortIPs: NodePortIPs;
  localDetector: LocalDetectorSpec | null;
  /** the literal mark text, e.g. "0x00004000" */
  masqueradeMark: string;
  masqueradeAll: boolean;
  /** iptables: NodePorts reachable on 127.0.0.1 (needs route_localnet=1), IPv4 only */
  localhostNodePorts: boolean;
  /** loopback Service VIPs are served: the userspace mode binds them itself (the standalone demo's are 127.0.100.x) */
  loopbackVIPs: boolean;
  /**
   * nftables: TCP NodePorts are served on the family's loopback address (127.0.0.1 / ::1) by a
   * userspace proxy beside the ruleset (localhostNodePortProxyWanted, KEP-6032)
   */
  localhostNodePortProxy: boolean;
}

/** The gate of the nftables mode's localhost NodePort proxy (upstream pkg/features, alpha in v1.37). */
export const LOCALHOST_NODEPORTS_GATE = 'KubeProxyNFTablesLocalhostNodePorts';

/**
 * Does the nftables mode run its userspace proxy for localhost NodePorts (KEP-6032,
 * kubernetes#138427)? Upstream's nftables NewProxier creates the LocalNodePortProxy only with
 * the gate on and an explicit opt-in: the NodePort addresses do not match every address, and
 * one of the family's CIDRs holds the loopback address itself (127.0.0.1 for IPv4, not just
 * any 127/8 address, kubernetes#142129 / #142138; ::1 for IPv6), as `--nodeport-addresses=
 * primary,localhost` gives. kproxy's gates are on unless set to false, so an explicit
 * `KubeProxyNFTablesLocalhostNodePorts: false` is the only way to turn it off.
 */
export function localhostNodePortProxyWanted(mode: ModeName, family: 4 | 6, n: NodePortAddresses, gates: Record<string, boolean>): boolean {
  if (mode !== 'nftables' || gates[LOCALHOST_NODEPORTS_GATE] === false || n.matchAll) return false;
  const loopback = family === 6 ? '::1' : '127.0.0.1';
  return n.cidrs.some((c) => {
    const p = parseCIDR(c);
    return !!p && p.family === family && cidrContains(p, loopback);
  });
}

/** Resolves the node-wide settings of a live node (or a dry-run render) for its family. */
export function nodeSettings(config: ProxyConfig, node: NodeContext): NodeSettings {
  const family = node.family;
  const primary = primaryNodeIP(node);
  const nodeIPs = node.nodeIPs.map((a) => canonicalIP(a)).filter((a): a is string => !!a && ipFamily(a) === family);
  const locals = node.hostIPs ?? [...nodeIPs, family === 4 ? '127.0.0.1' : '::1'];
  const nodePorts = resolveNodePortAddresses(family, effectiveNodePortAddresses(config, config.mode), locals, primary);
  const localhostNodePorts = family === 4 && config.localhostNodePorts && nodePortsIncludeIPv4Loopback(nodePorts);
  return {
    family,
    nodeName: node.nodeName,
    nodeLabels: node.nodeLabels,
    nodeIPs,
    primaryNodeIP: primary,
    nodePorts,
    nodePortIPs: nodePortIPsFor(config.mode, family, nodePorts, nodeIPs, localhostNodePorts),
    localDetector: resolveDetector(config, node),
    masqueradeMark: masqueradeMark(config.masqueradeBit),
    masqueradeAll: config.masqueradeAll,
    // upstream NewProxier (iptables): localhost NodePorts only for IPv4 and only when the
    // NodePort addresses include loopback ("localhostNodePorts ... ContainsIPv4Loopback").
    localhostNodePorts,
    loopbackVIPs: config.mode === 'userspace',
    localhostNodePortProxy: localhostNodePortProxyWanted(config.mode, family, nodePorts, config.featureGates ?? {}),
  };
}

// ---- the view ----------------------------------------------------------------------------

/** Work the node view did, for tests and benches: an event's sync must cost O(changed). */
export const nodeViewWork = { builds: 0, incremental: 0, portsVisited: 0 };

/**
 * What an incremental build needs besides the previous view: the services ("ns/name") that
 * changed since it, and where their ports are in the state now (the tracker knows).
 */
export interface ViewChanges {
  services: ReadonlySet<string>;
  portKeysOf: (serviceKey: string) => Iterable<string>;
}

/**
 * Builds the view from resolved settings (the conformance adapters' entry point). With the
 * previous view and what changed since (`changes`), only the changed services' ports are
 * looked at, in the previous view's maps (updated in place: the previous view is superseded,
 * revertView undoes it); the others keep their PortView objects, as a full build would give
 * them (the port cache returns the same objects for the same ServicePort, Endpoint[] and node).
 */
export function buildViewFrom(state: ProxyState, s: NodeSettings, previous?: NodeView, changes?: ViewChanges): NodeView {
  const facts = portFactsOf(s);
  nodeViewWork.builds++;
  // a superseded view's maps are its successor's: stale flows against it would be wrong
  if (previous && superseded.has(previous)) throw kproxyError('KPROXY_VIEW_INTERNAL', 'the node view was built from a view an incremental build already superseded');
  if (previous && changes && sameSettings(previous, s)) {
    nodeViewWork.incremental++;
    return updatedView(state, s, previous, changes, facts);
  }
  const ports = new Map<string, PortView>();
  const servicePorts = new Map<string, string[]>();
  const keys = [...state.services.keys()].sort();
  for (const key of keys) {
    const sp = state.services.get(key)!;
    if (sp.family !== s.family) continue;
    nodeViewWork.portsVisited++;
    ports.set(key, portOf(facts, sp, state.endpoints.get(key) ?? EMPTY));
    const list = servicePorts.get(sp.serviceKey);
    if (list) list.push(key);
    else servicePorts.set(sp.serviceKey, [key]);
  }
  const noLocalEndpoints = { internal: 0, external: 0 };
  for (const pv of ports.values()) countNoLocal(noLocalEndpoints, pv, 1);
  const healthChecks = new Map<string, HealthCheckService>();
  for (const [svc, list] of servicePorts) {
    const hc = healthCheckOf(list.map((k) => ports.get(k)!));
    if (hc) healthChecks.set(svc, hc);
  }
  return { ...s, ports, servicePorts, noLocalEndpoints, healthChecks, staleFlows: previous ? staleFlows(previous, ports) : firstViewFlows(ports) };
}

const SETTINGS_KEYS: Array<keyof NodeSettings> = [
  'family', 'nodeName', 'nodeLabels', 'nodeIPs', 'primaryNodeIP', 'nodePorts', 'nodePortIPs', 'localDetector', 'masqueradeMark', 'masqueradeAll', 'localhostNodePorts', 'loopbackVIPs', 'localhostNodePortProxy',
];

function sameSettings(a: NodeSettings, b: NodeSettings): boolean {
  return SETTINGS_KEYS.every((k) => a[k] === b[k] || JSON.stringify(a[k]) === JSON.stringify(b[k]));
}

/** upstream counts only ports that have endpoints somewhere (else the Service rejects) */
function countNoLocal(c: { internal: number; external: number }, pv: PortView, sign: 1 | -1): void {
  if (!pv.hasAnyEndpoints) return;
  if (!pv.hasInternalEndpoints) c.internal += sign;
  if (!pv.hasExternalEndpoints) c.external += sign;
}

/**
 * A Service's health check from its ports (key order): upstream serves one for eTP Local
 * Services with a health check node port (the view's healthCheckNodePort is 0 otherwise),
 * answering with the ready local endpoints counted over the Service's ports.
 */
function healthCheckOf(ports: PortView[]): HealthCheckService | undefined {
  const first = ports.find((pv) => pv.healthCheckNodePort);
  if (!first) return undefined;
  let local = 0;
  for (const pv of ports) for (const e of pv.endpoints) if (e.isLocal && e.ready) local++;
  return { namespace: first.sp.portName.namespace, name: first.sp.portName.name, port: first.healthCheckNodePort, localEndpoints: local };
}

/** views an incremental build has taken the maps of, and how to give them back */
const superseded = new WeakSet<NodeView>();
const undoOf = new WeakMap<NodeView, { previous: NodeView; undo: () => void }>();

/**
 * The previous view's maps with the changed services' ports replaced, in place: no decision
 * is made again for an unchanged port, and nothing is done per unchanged port.
 */
function updatedView(state: ProxyState, s: NodeSettings, previous: NodeView, changes: ViewChanges, facts: PortFacts): NodeView {
  const { ports, servicePorts, healthChecks } = previous;
  const noLocalEndpoints = { ...previous.noLocalEndpoints };
  /** the changed services' ports in the previous view, and in this one */
  const before = new Map<string, PortView>();
  const after = new Map<string, PortView>();
  const undoKeys = new Map<string, string[] | undefined>();
  const undoHealth = new Map<string, HealthCheckService | undefined>();
  for (const svc of changes.services) {
    if (undoKeys.has(svc)) continue;
    const oldKeys = servicePorts.get(svc);
    undoKeys.set(svc, oldKeys);
    undoHealth.set(svc, healthChecks.get(svc));
    for (const key of oldKeys ?? []) {
      const v = ports.get(key)!;
      before.set(key, v);
      countNoLocal(noLocalEndpoints, v, -1);
    }
    const keys: string[] = [];
    for (const key of changes.portKeysOf(svc)) {
      const sp = state.services.get(key);
      if (!sp || sp.family !== s.family) continue;
      nodeViewWork.portsVisited++;
      const v = portOf(facts, sp, state.endpoints.get(key) ?? EMPTY);
      after.set(key, v);
      keys.push(key);
      countNoLocal(noLocalEndpoints, v, 1);
    }
    keys.sort();
    // an unchanged key keeps its place in the map; a removed one goes, a new one comes last
    for (const key of oldKeys ?? []) if (!after.has(key)) ports.delete(key);
    for (const key of keys) ports.set(key, after.get(key)!);
    if (keys.length) servicePorts.set(svc, keys);
    else servicePorts.delete(svc);
    const hc = keys.length ? healthCheckOf(keys.map((k) => after.get(k)!)) : undefined;
    if (hc) healthChecks.set(svc, hc);
    else healthChecks.delete(svc);
  }
  superseded.add(previous);
  // A superseded view is never reverted (revertView leaves it alone): its undo goes. Kept, its
  // `previous` would keep the view before it alive, and so on: every view since the last full
  // build (an hour of syncs) would stay in memory.
  undoOf.delete(previous);
  const view: NodeView = {
    ...s, ports, servicePorts, noLocalEndpoints, healthChecks,
    // the unchanged ports are the same objects before and after: staleFlows skips them anyway
    staleFlows: staleFlows({ ...previous, ports: before }, after),
  };
  undoOf.set(view, {
    previous,
    undo: () => {
      for (const [svc, oldKeys] of undoKeys) {
        for (const key of servicePorts.get(svc) ?? []) ports.delete(key);
        for (const key of oldKeys ?? []) ports.set(key, before.get(key)!);
        if (oldKeys) servicePorts.set(svc, oldKeys);
        else servicePorts.delete(svc);
        const hc = undoHealth.get(svc);
        if (hc) healthChecks.set(svc, hc);
        else healthChecks.delete(svc);
      }
    },
  });
  return view;
}

/**
 * Undoes an incremental build (its sync failed): the previous view's maps are as they were
 * (a reverted port may move to the end of `ports`), and the previous view may be built from
 * again. A full build, or a view already reverted or superseded, is left alone.
 */
export function revertView(view: NodeView | undefined): void {
  if (!view || superseded.has(view)) return;
  const u = undoOf.get(view);
  if (!u) return;
  undoOf.delete(view);
  u.undo();
  superseded.add(view);
  superseded.delete(u.previous);
}

/**
 * The endpoint list of a port without endpoints: one shared array, so the port cache (keyed on
 * the Endpoint[] object) keeps hitting whichever module asks (the planners use it too).
 */
export const NO_ENDPOINTS: Endpoint[] = [];
const EMPTY = NO_ENDPOINTS;

/** The node view of one sync and family: computed once, rendered by every mode. */
export function buildNodeView(input: PlanInput, previous?: NodeView, changes?: ViewChanges): NodeView {
  return buildViewFrom(input.state, nodeSettings(input.config, input.node), previous, changes);
}

/**
 * The view's ports in key order (the order planners write them in): all of them, or those
 * of the given Services ("ns/name"), found through servicePorts without a scan.
 */
export function portsInOrder(view: NodeView, services?: Iterable<string>): PortView[] {
  const keys = services ? [...services].flatMap((svc) => view.servicePorts.get(svc) ?? []) : [...view.ports.keys()];
  return keys.sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)).map((k) => view.ports.get(k)!);
}

/** The node-wide settings of an input: the controller's view's, or resolved now (cheap: no ports). */
export function settingsOf(input: PlanInput): NodeSettings {
  return input.view ?? nodeSettings(input.config, input.node);
}

/** The view of an input: the one the controller computed, or a fresh one. */
export function viewOf(input: PlanInput): NodeView {
  return input.view ?? buildNodeView(input);
}

// ---- stale UDP/SCTP flows ------------------------------------------------------------------

function serviceAddresses(sp: ServicePort): string[] {
  return [...(sp.clusterIP ? [sp.clusterIP] : []), ...sp.externalIPs, ...sp.loadBalancerVIPs];
}

/**
 * Conntrack entries that would keep UDP/SCTP traffic on a wrong path (upstream
 * pkg/proxy/conntrack/cleanup.go CleanStaleEntries, and earlier deleteUDPEndpointConnections):
 * - flows DNATed to an endpoint the service no longer uses: UDP has no connection to close,
 *   so without clearing them packets keep going to a gone pod;
 * - flows to a UDP service's addresses and NodePort when it went from no endpoints to some:
 *   while it had none, packets were rejected and conntrack remembered that, blackholing the
 *   client until the entry expires (kubernetes#48370).
 * TCP needs neither: its connections end with the endpoint. But a TCP connection attempt made
 * while a port had no rule at all (before the Service existed, after it was deleted, before
 * kproxy's first sync) leaves a never-DNATed SYN_SENT entry that black-holes a later
 * connection from the same source port for up to 120 s (kproxy, not upstream: `unNATed`,
 * cleared when the port gets endpoints, and for every port with endpoints at the first sync).
 */
function staleFlows(prev: NodeView, now: Map<string, PortView>): StaleFlow[] {
  const out: StaleFlow[] = [];
  for (const [key, before] of prev.ports) {
    const proto = before.sp.protocol;
    if (proto !== 'UDP' && proto !== 'SCTP') continue;
    const after = now.get(key);
    if (after === before) continue;
    const kept = new Set((after?.allReachableEndpoints ?? []).map((e) => e.key));
    for (const ep of before.allReachableEndpoints) {
      if (kept.has(ep.key)) continue;
      for (const ip of serviceAddresses(before.sp)) {
        out.push({ kind: 'endpoint', protocol: proto, serviceIP: ip, port: before.sp.port, endpointIP: ep.ip, endpointPort: ep.port });
      }
      if (before.sp.nodePort) out.push({ kind: 'endpoint', protocol: proto, serviceIP: '', port: before.sp.nodePort, endpointIP: ep.ip, endpointPort: ep.port });
    }
  }
  for (const [key, after] of now) {
    const proto = after.sp.protocol;
    const before = prev.ports.get(key);
    if (before === after || !after.hasAnyEndpoints) continue;
    if (before && before.hasAnyEndpoints) continue;
    if (proto === 'TCP') {
      out.push(...unNATedOf(after));
      continue;
    }
    if (proto !== 'UDP' && proto !== 'SCTP') continue;
    for (const ip of serviceAddresses(after.sp)) out.push({ kind: 'service', protocol: proto, ip, port: after.sp.port });
    if (after.sp.nodePort) out.push({ kind: 'nodePort', protocol: proto, port: after.sp.nodePort });
  }
  return out;
}

function unNATedOf(pv: PortView): StaleFlow[] {
  const out: StaleFlow[] = serviceAddresses(pv.sp).map((ip) => ({ kind: 'unNATed', protocol: 'TCP', ip, port: pv.sp.port }));
  if (pv.sp.nodePort) out.push({ kind: 'unNATed', protocol: 'TCP', ip: null, port: pv.sp.nodePort });
  return out;
}

/**
 * The first view (no previous one, e.g. kproxy just started): never-DNATed TCP attempts to
 * every port with endpoints, and every flow to a UDP/SCTP port without endpoints. The latter
 * is upstream's CleanStaleEntries since kubernetes#139629 (kubernetes#139628): a service with
 * no endpoints is reconciled with an empty endpoint set, not skipped, so a flow DNATed to an
 * endpoint that left while no kube-proxy was watching (scaled to zero across a restart) is
 * deleted; otherwise conntrack keeps DNATing it before the reject rule sees the service
 * address, and a one-way sender refreshes the entry forever. Within a run the change from
 * some endpoints to none is an `endpoint` flow of staleFlows.
 */
function firstViewFlows(ports: Map<string, PortView>): StaleFlow[] {
  const out: StaleFlow[] = [];
  for (const pv of ports.values()) {
    const proto = pv.sp.protocol;
    if (proto === 'TCP') {
      if (pv.hasAnyEndpoints) out.push(...unNATedOf(pv));
    } else if (!pv.hasAnyEndpoints) {
      for (const ip of serviceAddresses(pv.sp)) out.push({ kind: 'service', protocol: proto, ip, port: pv.sp.port });
      if (pv.sp.nodePort) out.push({ kind: 'nodePort', protocol: proto, port: pv.sp.nodePort });
    }
  }
  return out;
}
