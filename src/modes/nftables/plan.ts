// The nftables planner: proxy state → the desired content of the `kube-proxy` table, as
// upstream's syncProxyRules() (pkg/proxy/nftables/proxier.go) builds it in a full sync.
// Dispatch is by verdict maps (service-ips, service-nodeports), "no endpoints" handling by
// the no-endpoint-* maps checked from the filter hooks, load balancing by
// a chain of `numgen random mod N-k 0 goto` rules (no anonymous map per service: see
// selection.ts; the one deliberate difference from upstream's table shape), affinity by
// per-endpoint dynamic sets. Pure.
import type { Endpoint, ProxyState, ServicePort } from '../../core/model.ts';
import { NO_ENDPOINTS, nodePortIPsFor, portFactsOf, portOf, resolveNodePortAddresses, settingsOf, type LocalDetectorSpec, type NodePortIPs, type NodeSettings, type PlanInput, type PortFacts, type PortView, type FrontendVerdict } from '../../core/nodeview.ts';
import { affinitySetName, endpointChainName, flatString, nftComment, serviceChainNames, TABLE, type ServiceChainNames } from './names.ts';
import { Interner } from '../../core/intern.ts';
import type { SkippedVIP } from '../../core/vip.ts';
import { addElement, addRule, addSet, ensureChain, newRuleset, type NftChain, type NftElement, type NftRule, type NftSet, type Ruleset } from './ruleset.ts';
import { selectionRules } from './selection.ts';

/** How "traffic from this cluster's pods" is recognised (upstream's LocalTrafficDetector). */
export type LocalDetector = LocalDetectorSpec | null;

export interface NftPlanOptions {
  family: 4 | 6;
  /** the node facts every port's decisions are taken with (src/core/nodeview.ts portOf) */
  node: PortFacts;
  /** addresses that accept NodePorts, or 'all' (every local address but loopback) */
  nodePortIPs: string[] | 'all';
  localDetector: LocalDetector;
  masqueradeAll: boolean;
  /** the literal mark text, e.g. "0x4000" */
  masqueradeMark: string;
  /** service CIDRs of the family; traffic to unallocated IPs in them is dropped */
  serviceCIDRs: string[];
  /** the table's name (default `kube-proxy`, upstream's; `kube-proxy-<n>` for a shard) */
  table?: string;
  /**
   * One of several tables (K > 1, shards.ts): the drop of traffic to unallocated ClusterIPs
   * (serviceCIDRs) moves out of cluster-ips-check into base chains after every table's
   * filter chains (UNALLOCATED_CHAINS), because a table knows only its own Services'
   * ClusterIPs: inline, it would drop a packet to another table's ClusterIP on a port the
   * Service lacks before that table rejects it (upstream: REJECT).
   */
  sharded?: boolean;
}

// Chain, set and map names (upstream constants).
export const C = {
  filterPreroutingPreDNAT: 'filter-prerouting-pre-dnat',
  filterOutputPreDNAT: 'filter-output-pre-dnat',
  filterInput: 'filter-input',
  filterForward: 'filter-forward',
  filterOutput: 'filter-output',
  natPrerouting: 'nat-prerouting',
  natOutput: 'nat-output',
  natPostrouting: 'nat-postrouting',
  services: 'services',
  serviceIPs: 'service-ips',
  serviceNodePorts: 'service-nodeports',
  nodePortIPs: 'nodeport-ips',
  clusterIPs: 'cluster-ips',
  serviceEndpointsCheck: 'service-endpoints-check',
  nodePortEndpointsCheck: 'nodeport-endpoints-check',
  noEndpointServices: 'no-endpoint-services',
  noEndpointNodePorts: 'no-endpoint-nodeports',
  reject: 'reject-chain',
  clusterIPsCheck: 'cluster-ips-check',
  firewallIPs: 'firewall-ips',
  firewallCheck: 'firewall-check',
  markMasq: 'mark-for-masquerade',
  masquerading: 'masquerading',
} as const;

// Filter chains run before DNAT (-110) where they must see the service IP, at the normal
// filter priority (0) where they may reject (reject is only valid in input/forward/output).
export const BASE_CHAINS = [
  { name: C.filterPreroutingPreDNAT, type: 'filter', hook: 'prerouting', priority: -110 },
  { name: C.filterOutputPreDNAT, type: 'filter', hook: 'output', priority: -110 },
  { name: C.filterForward, type: 'filter', hook: 'forward', priority: 0 },
  { name: C.filterInput, type: 'filter', hook: 'input', priority: 0 },
  { name: C.filterOutput, type: 'filter', hook: 'output', priority: 0 },
  { name: C.natPrerouting, type: 'nat', hook: 'prerouting', priority: -100 },
  { name: C.natOutput, type: 'nat', hook: 'output', priority: -100 },
  { name: C.natPostrouting, type: 'nat', hook: 'postrouting', priority: 100 },
] as const;

export const BASE_CHAIN_NAMES: readonly string[] = BASE_CHAINS.map((c) => c.name);

/**
 * A sharded table's (NftPlanOptions.sharded) drop of new connections to unallocated
 * ClusterIPs: at filter + 10, after every kube-proxy table's filter chains at 0 have rejected
 * the invalid ports of their own ClusterIPs; a packet to a valid port was DNATed before
 * (nat prerouting / output at -100), so it no longer has a ClusterIP destination here.
 */
export const UNALLOCATED_CHAINS = [
  { name: 'filter-forward-unallocated', type: 'filter', hook: 'forward', priority: 10 },
  { name: 'filter-output-unallocated', type: 'filter', hook: 'output', priority: 10 },
] as const;

// Rules jumping from base chains to the top-level regular chains, in rule order per chain.
const JUMP_CHAINS: Array<{ dst: string; src: string; extra: string }> = [
  { dst: C.nodePortEndpointsCheck, src: C.filterInput, extra: 'ct state new' },
  { dst: C.serviceEndpointsCheck, src: C.filterInput, extra: 'ct state new' },
  { dst: C.serviceEndpointsCheck, src: C.filterForward, extra: 'ct state new' },
  { dst: C.serviceEndpointsCheck, src: C.filterOutput, extra: 'ct state new' },
  { dst: C.firewallCheck, src: C.filterPreroutingPreDNAT, extra: 'ct state new' },
  { dst: C.firewallCheck, src: C.filterOutputPreDNAT, extra: 'ct state new' },
  { dst: C.services, src: C.natOutput, extra: '' },
  { dst: C.services, src: C.natPrerouting, extra: '' },
  { dst: C.masquerading, src: C.natPostrouting, extra: '' },
  { dst: C.clusterIPsCheck, src: C.filterForward, extra: 'ct state new' },
  { dst: C.clusterIPsCheck, src: C.filterOutput, extra: 'ct state new' },
];

function ipX(family: 4 | 6): string {
  return family === 6 ? 'ip6' : 'ip';
}

function addrType(family: 4 | 6): string {
  return family === 6 ? 'ipv6_addr' : 'ipv4_addr';
}

function noLocalhost(family: 4 | 6): string {
  return family === 6 ? 'ip6 daddr != ::1' : 'ip daddr != 127.0.0.0/8';
}

function ifLocal(d: LocalDetector, family: 4 | 6): string | null {
  if (!d) return null;
  if (d.kind === 'cidr') return `${ipX(family)} saddr ${d.cidr}`;
  if (d.kind === 'interface') return `iifname ${d.name}`;
  return `iifname ${d.prefix}*`;
}

function ifNotLocal(d: LocalDetector, family: 4 | 6): string | null {
  if (!d) return null;
  if (d.kind === 'cidr') return `${ipX(family)} saddr != ${d.cidr}`;
  if (d.kind === 'interface') return `iifname != ${d.name}`;
  return `iifname != ${d.prefix}*`;
}

/** The fixed part of the table: base chains, dispatch, no-endpoint handling, firewall, masquerade. */
function setupTable(rs: Ruleset, o: NftPlanOptions): void {
  const ip = ipX(o.family);
  const addr = addrType(o.family);
  for (const bc of BASE_CHAINS) ensureChain(rs, bc.name, { type: bc.type, hook: bc.hook, priority: bc.priority });
  for (const j of JUMP_CHAINS) {
    ensureChain(rs, j.dst);
    addRule(rs, j.src, [j.extra, 'jump', j.dst].filter(Boolean).join(' '));
  }
  for (const c of [C.services, C.clusterIPsCheck, C.masquerading, C.markMasq]) ensureChain(rs, c);

  addRule(rs, C.markMasq, `mark set mark or ${o.masqueradeMark}`);
  addRule(rs, C.masquerading, `mark and ${o.masqueradeMark} == 0 return`);
  addRule(rs, C.masquerading, `mark set mark xor ${o.masqueradeMark}`);
  addRule(rs, C.masquerading, 'masquerade fully-random');

  addSet(rs, { kind: 'set', name: C.clusterIPs, type: addr, comment: 'Active ClusterIPs' });
  addRule(rs, C.clusterIPsCheck, `${ip} daddr @${C.clusterIPs} reject`, 'Reject traffic to invalid ports of ClusterIPs');
  if (o.serviceCIDRs.length > 0 && !o.sharded) {
    addRule(rs, C.clusterIPsCheck, `${ip} daddr { ${o.serviceCIDRs.join(',')} } drop`, 'Drop traffic to unallocated ClusterIPs');
  } else if (o.serviceCIDRs.length > 0) {
    for (const bc of UNALLOCATED_CHAINS) {
      ensureChain(rs, bc.name, { type: bc.type, hook: bc.hook, priority: bc.priority });
      addRule(rs, bc.name, `ct state new ${ip} daddr { ${o.serviceCIDRs.join(',')} } drop`, 'Drop traffic to unallocated ClusterIPs');
    }
  }

  const matchAll = o.nodePortIPs === 'all';
  if (!matchAll) {
    addSet(rs, { kind: 'set', name: C.nodePortIPs, type: addr, comment: 'IPs that accept NodePort traffic' });
    for (const a of o.nodePortIPs as string[]) addElement(rs, C.nodePortIPs, { key: [a] });
  }

  addSet(rs, {
    kind: 'map',
    name: C.noEndpointServices,
    type: `${addr} . inet_proto . inet_service : verdict`,
    comment: 'vmap to drop or reject packets to services with no endpoints',
  });
  addSet(rs, {
    kind: 'map',
    name: C.noEndpointNodePorts,
    type: 'inet_proto . inet_service : verdict',
    comment: 'vmap to drop or reject packets to service nodeports with no endpoints',
  });
  ensureChain(rs, C.reject, { comment: 'helper for @no-endpoint-services / @no-endpoint-nodeports' });
  addRule(rs, C.reject, 'reject');
  addRule(rs, C.serviceEndpointsCheck, `${ip} daddr . meta l4proto . th dport vmap @${C.noEndpointServices}`);
  addRule(
    rs,
    C.nodePortEndpointsCheck,
    matchAll
      ? `${noLocalhost(o.family)} meta l4proto . th dport vmap @${C.noEndpointNodePorts}`
      : `${ip} daddr @${C.nodePortIPs} meta l4proto . th dport vmap @${C.noEndpointNodePorts}`,
  );

  addSet(rs, {
    kind: 'map',
    name: C.firewallIPs,
    type: `${addr} . inet_proto . inet_service : verdict`,
    comment: 'destinations that are subject to LoadBalancerSourceRanges',
  });
  addRule(rs, C.firewallCheck, `${ip} daddr . meta l4proto . th dport vmap @${C.firewallIPs}`);

  addSet(rs, {
    kind: 'map',
    name: C.serviceIPs,
    type: `${addr} . inet_proto . inet_service : verdict`,
    comment: 'ClusterIP, ExternalIP and LoadBalancer IP traffic',
  });
  addSet(rs, { kind: 'map', name: C.serviceNodePorts, type: 'inet_proto . inet_service : verdict', comment: 'NodePort traffic' });
  addRule(rs, C.services, `${ip} daddr . meta l4proto . th dport vmap @${C.serviceIPs}`);
  addRule(
    rs,
    C.services,
    matchAll
      ? `fib daddr type local ${noLocalhost(o.family)} meta l4proto . th dport vmap @${C.serviceNodePorts}`
      : `${ip} daddr @${C.nodePortIPs} meta l4proto . th dport vmap @${C.serviceNodePorts}`,
  );
}

/**
 * The chain that picks an endpoint. Upstream writes an anonymous map per chain
 * (`numgen random mod N vmap { 0 : goto A , 1 : goto B }`), and creating 10,000 anonymous
 * maps take the kernel 150 s; here it is one rule per endpoint, as iptables' statistic
 * rules: the same uniform choice among the same endpoint chains (selection.ts).
 */
function writeServiceToEndpointRules(rs: Ruleset, o: NftPlanOptions, sp: ServicePort, chain: string, eps: Endpoint[]): void {
  ensureChain(rs, chain);
  if (sp.stickyMaxAgeSeconds > 0) {
    for (const ep of eps) {
      addRule(rs, chain, `${ipX(o.family)} saddr @${affinitySetName(sp, ep.key)} goto ${endpointChainName(sp, ep.key)}`);
    }
  }
  for (const rule of selectionRules(eps.map((ep) => endpointChainName(sp, ep.key)))) addRule(rs, chain, rule);
}

/** One service port: map elements always; its chains (service, external, firewall, endpoints). */
function planServicePort(rs: Ruleset, o: NftPlanOptions, cat: PortView): void {
  if (!cat.sp.clusterIP) return;
  // Every decision is the node view's (src/core/nodeview.ts); this only renders it.
  const names = serviceChainNames(cat.sp);
  addPortElements(rs, cat, names);
  addPortChains(rs, o, cat, names);
}

/** The port's elements of the shared sets and maps: where each of its addresses goes. */
function addPortElements(rs: Ruleset, cat: PortView, names: ServiceChainNames): void {
  const { sp } = cat;
  if (!sp.clusterIP) return;
  const proto = sp.protocol.toLowerCase();
  const port = String(sp.port);
  const hasEndpoints = cat.hasAnyEndpoints;
  const internalChain = cat.internalPolicy === 'local' ? names.local : names.cluster;
  const hasExternal = cat.hasExternalEndpoints;
  // The view's verdicts as nft verdicts ('' where traffic goes to its endpoints).
  const verdict = (v: FrontendVerdict) => (v === 'reject' ? `goto ${C.reject}` : v === 'drop' ? 'drop' : '');
  const externalVerdict = verdict(cat.externalVerdict);
  // Within nft's 128-byte limit: one long name must not fail the whole transaction.
  const comment = nftComment(sp.key);

  addElement(rs, C.clusterIPs, { key: [sp.clusterIP] });
  if (cat.hasInternalEndpoints) {
    addElement(rs, C.serviceIPs, { key: [sp.clusterIP, proto, port], value: `goto ${internalChain}` });
  } else {
    addElement(rs, C.noEndpointServices, { key: [sp.clusterIP, proto, port], value: verdict(cat.internalVerdict), comment });
  }

  for (const eip of sp.externalIPs) {
    if (hasEndpoints) addElement(rs, C.serviceIPs, { key: [eip, proto, port], value: `goto ${names.external}` });
    if (!hasExternal) addElement(rs, C.noEndpointServices, { key: [eip, proto, port], value: externalVerdict, comment });
  }

  for (const lb of sp.loadBalancerVIPs) {
    if (hasEndpoints) addElement(rs, C.serviceIPs, { key: [lb, proto, port], value: `goto ${names.external}` });
    if (cat.usesFirewallPath) addElement(rs, C.firewallIPs, { key: [lb, proto, port], value: `goto ${names.firewall}` });
  }
  if (!hasExternal) {
    for (const lb of sp.loadBalancerVIPs) {
      addElement(rs, C.noEndpointServices, { key: [lb, proto, port], value: externalVerdict, comment });
    }
  }

  if (sp.nodePort !== 0) {
    const np = String(sp.nodePort);
    if (hasEndpoints) addElement(rs, C.serviceNodePorts, { key: [proto, np], value: `goto ${names.external}` });
    if (!hasExternal) addElement(rs, C.noEndpointNodePorts, { key: [proto, np], value: externalVerdict, comment });
  }
}

/** The port's chains, endpoint chains first so that the verdicts' targets exist in declaration order. */
function addPortChains(rs: Ruleset, o: NftPlanOptions, cat: PortView, names: ServiceChainNames): void {
  const { sp } = cat;
  const ip = ipX(o.family);
  for (const ep of cat.allReachableEndpoints) ensureChain(rs, endpointChainName(sp, ep.key));
  if (cat.hasInternalEndpoints) {
    const internalChain = cat.internalPolicy === 'local' ? names.local : names.cluster;
    if (o.masqueradeAll) {
      addRule(rs, internalChain, `${ip} daddr ${sp.clusterIP} jump ${C.markMasq}`);
    } else {
      const notLocal = ifNotLocal(o.localDetector, o.family);
      // Masquerade off-cluster traffic to the ClusterIP: a static route to the service
      // range through any node may bounce off-node.
      if (notLocal) addRule(rs, internalChain, `${ip} daddr ${sp.clusterIP} ${notLocal} jump ${C.markMasq}`);
    }
  }
  // The external chain is needed even without externally usable endpoints: it holds the
  // short-circuit rules for pod and node traffic.
  if (cat.usesExternalPath) addExternalChain(rs, o, cat, names);
  if (cat.usesFirewallPath) {
    const sources = [...cat.firewall!.sourceRanges];
    // A node connecting to a VIP that is also a local address loops back with the VIP as
    // source; allow that when the node itself is allowed.
    if (cat.firewall!.nodeInRanges) sources.push(...sp.loadBalancerVIPs);
    addRule(rs, names.firewall, `${ip} saddr != { ${sources.join(' , ')} } drop`);
  }
  addEndpointChains(rs, o, cat, names);
}

function addExternalChain(rs: Ruleset, o: NftPlanOptions, cat: PortView, names: ServiceChainNames): void {
  ensureChain(rs, names.external);
  if (cat.externalPolicy === 'cluster') {
    // Non-local endpoints may be on another node: masquerade so replies come back here.
    addRule(rs, names.external, `jump ${C.markMasq}`);
  } else {
    const local = ifLocal(o.localDetector, o.family);
    // Pod traffic to an external IP behaves as if it went out to the LB and back in.
    if (local && cat.shortCircuitToCluster) addRule(rs, names.external, `${local} goto ${names.cluster}`, 'short-circuit pod traffic');
    // Node traffic gets the node IP (or the LB IP) as source: masquerade it.
    addRule(rs, names.external, `fib saddr type local jump ${C.markMasq}`, 'masquerade local traffic');
    if (cat.shortCircuitToCluster) addRule(rs, names.external, `fib saddr type local goto ${names.cluster}`, 'short-circuit local traffic');
  }
  if (cat.hasExternalEndpoints) addRule(rs, names.external, `goto ${cat.externalPolicy === 'local' ? names.local : names.cluster}`);
}

/** Affinity sets, the service chains' picks (upstream's usesClusterPolicyChain / local), and each endpoint's DNAT chain. */
function addEndpointChains(rs: Ruleset, o: NftPlanOptions, cat: PortView, names: ServiceChainNames): void {
  const { sp } = cat;
  const ip = ipX(o.family);
  const sticky = cat.affinitySeconds > 0;
  if (sticky) {
    for (const ep of cat.allReachableEndpoints) {
      addSet(rs, {
        kind: 'set',
        name: affinitySetName(sp, ep.key),
        type: addrType(o.family),
        flags: ['dynamic', 'timeout'],
        timeoutSeconds: cat.affinitySeconds,
      });
    }
  }
  // upstream nftables proxier: usesClusterPolicyChain := len(clusterEndpoints) > 0 && UsesClusterEndpoints()
  if (cat.usesClusterPath) writeServiceToEndpointRules(rs, o, sp, names.cluster, cat.clusterEndpoints);
  if (cat.usesLocalPath) writeServiceToEndpointRules(rs, o, sp, names.local, cat.localEndpoints);
  const proto = sp.protocol.toLowerCase();
  for (const ep of cat.allReachableEndpoints) {
    const chain = endpointChainName(sp, ep.key);
    // Hairpin: a pod reaching itself through the service must be masqueraded.
    addRule(rs, chain, `${ip} saddr ${ep.ip} jump ${C.markMasq}`);
    if (sticky) addRule(rs, chain, `update @${affinitySetName(sp, ep.key)} { ${ip} saddr }`);
    addRule(rs, chain, `meta l4proto ${proto} dnat to ${ep.key}`);
  }
}

/**
 * What one service port contributes to the table: its own chains and (affinity) sets, and
 * its elements of the shared sets and maps (cluster-ips, service-ips, ...). A fragment
 * depends only on the ServicePort, its endpoints and the options, so the same inputs plan it
 * again exactly (a diff plans a changed port's previous fragment from its previous inputs).
 * Fragments are shared between rulesets: never mutate one.
 */
export interface PortFragment {
  /** its own chains, in declaration order (an array, not a Map: a table's fragments are live together) */
  chains: NftChain[];
  /** the port's own sets (affinity), in declaration order */
  sets: Map<string, NftSet>;
  /**
   * its elements of the shared sets and maps, by set in declaration order, then in insertion
   * order (an array, not a Map per set: a table's fragments are live together)
   */
  elements: FragmentElement[];
  /** addresses of the port left out because they can never be a Service VIP (vip.ts) */
  skipped?: SkippedVIP[];
}

/** The shared sets and maps service ports add elements to (all declared by setupTable). */
const SHARED_SETS: readonly string[] = [C.clusterIPs, C.serviceIPs, C.noEndpointServices, C.firewallIPs, C.serviceNodePorts, C.noEndpointNodePorts];

export function isSharedSetName(name: string): boolean {
  return SHARED_SETS.includes(name);
}

/** One element a port adds to a shared set or map: `key` is elementKey(el.key). */
export interface FragmentElement {
  set: string;
  key: string;
  el: NftElement;
}

const EMPTY_FRAGMENT: PortFragment = { chains: [], sets: new Map(), elements: [] };

/** Plans one service port on its own (the same objects planRuleset would add for it). */
export function planPortFragment(o: NftPlanOptions, original: ServicePort, endpoints: Endpoint[]): PortFragment {
  if (original.family !== o.family || !original.clusterIP) return EMPTY_FRAGMENT;
  // The port as the node view decides it, without the VIPs no rule may hold (src/core/vip.ts:
  // a loopback ClusterIP's no-endpoints reject would match all of localhost).
  const v = portOf(o.node, original, endpoints);
  const { sp, skippedVIPs: skipped } = v;
  if (!sp.clusterIP) return { ...EMPTY_FRAGMENT, skipped };
  const scratch = newRuleset(o.family === 6 ? 'ip6' : 'ip', o.table ?? TABLE);
  for (const name of SHARED_SETS) scratch.sets.set(name, { kind: 'set', name, type: '', elements: new Map() });
  planServicePort(scratch, o, v);
  const frag: PortFragment = { chains: compactChains(scratch.chains), sets: NO_SETS, elements: [] };
  if (skipped.length) frag.skipped = skipped;
  for (const [name, set] of scratch.sets) {
    if (!isSharedSetName(name)) {
      if (frag.sets === NO_SETS) frag.sets = new Map();
      frag.sets.set(name, set);
    } else for (const [k, el] of set.elements) frag.elements.push(compactElement(name, k, el));
  }
  // push grows an array to 17 slots: keep an exact-size copy
  frag.elements = frag.elements.slice();
  return frag;
}

// ---- memory: a table's fragments are live together while a full sync writes it (10^4 chains
// and rules per table at 10,000 Services, 10^5 at 100,000): flat and shared, they hold the peak ----

/** shared by the fragments of ports without affinity sets (never mutated: fragments are read-only) */
const NO_SETS: Map<string, NftSet> = new Map();


/** small strings repeated in every fragment ("tcp", "80", verdicts): one flat copy each */
const interned = new Interner(4096, flatString);

/** identical rules (e.g. `jump mark-for-masquerade`) share one object: rules are never mutated */
const sharedRules = new Map<string, NftRule>();
function compactRule(r: NftRule): NftRule {
  if (r.comment === undefined && r.rule.length <= 40) {
    let shared = sharedRules.get(r.rule);
    if (!shared) {
      shared = { rule: flatString(r.rule) };
      if (sharedRules.size < 4096) sharedRules.set(shared.rule, shared);
    }
    return shared;
  }
  return r.comment === undefined ? { rule: flatString(r.rule) } : { rule: flatString(r.rule), comment: interned.get(r.comment) };
}

function compactChains(chains: Map<string, NftChain>): NftChain[] {
  const out: NftChain[] = [];
  for (const ch of chains.values()) {
    // names.ts gives flat names (cached per ServicePort): reused, not copied
    const name = ch.name;
    const rules = ch.rules.map(compactRule);
    // A service port's chains are regular chains with rules only: a literal of those two
    // fields is smaller than a spread copy.
    const own = Object.keys(ch).length === 2 ? { name, rules } : { ...ch, name, rules };
    out.push(own);
  }
  return out.slice(); // exact size (push grew it to 17 slots)
}

function compactElement(set: string, k: string, el: NftElement): FragmentElement {
  const c: NftElement = { key: el.key.map((p) => (p.length <= 5 ? interned.get(p) : p)) };
  if (el.value !== undefined) c.value = el.value.length <= 32 ? interned.get(el.value) : flatString(el.value);
  if (el.comment !== undefined) c.comment = el.comment;
  // k is elementKey()'s join: already flat
  return { set, key: k, el: c };
}

/** Adds a fragment to a ruleset exactly as planning the port into it would have. */
function mergeFragment(rs: Ruleset, f: PortFragment): void {
  for (const { set, key, el } of f.elements) rs.sets.get(set)!.elements.set(key, el);
  for (const ch of f.chains) {
    const have = rs.chains.get(ch.name);
    // Names are unique per port; a clash (truncated names) appends, as addRule would.
    rs.chains.set(ch.name, have ? { ...have, rules: [...have.rules, ...ch.rules] } : ch);
  }
  for (const s of f.sets.values()) if (!rs.sets.has(s.name)) rs.sets.set(s.name, s);
}

/** The table from the fixed part and the ports' fragments, in port key order. */
export function assembleRuleset(o: NftPlanOptions, fragments: Iterable<PortFragment>): Ruleset {
  const rs = newRuleset(o.family === 6 ? 'ip6' : 'ip', o.table ?? TABLE, 'rules for kube-proxy');
  setupTable(rs, o);
  for (const f of fragments) mergeFragment(rs, f);
  return rs;
}

/** Service port keys of the planned family, in the order planRuleset adds them. */
export function plannedPortKeys(state: ProxyState, o: NftPlanOptions): string[] {
  return [...state.services.keys()].filter((k) => state.services.get(k)!.family === o.family).sort();
}

/** The desired table for a state: upstream's full sync. */
export function planRuleset(state: ProxyState, o: NftPlanOptions): Ruleset {
  const frags = plannedPortKeys(state, o).map((key) => planPortFragment(o, state.services.get(key)!, state.endpoints.get(key) ?? NO_ENDPOINTS));
  return assembleRuleset(o, frags);
}

// ---- options from the running configuration ----

/** Node addresses that accept NodePorts for a list of CIDRs (or "primary"): conformance cases, decided as the node view does. */
export function caseNodePortIPs(cidrs: string[], family: 4 | 6, localAddrs: string[], primary: string | null): NodePortIPs {
  return nodePortIPsFor('nftables', family, resolveNodePortAddresses(family, cidrs, localAddrs, primary), [], false);
}

/** Options for a live node: the node view's node-wide settings. */
export function optionsFromInput(input: PlanInput): NftPlanOptions {
  return optionsFromSettings(settingsOf(input));
}

export function optionsFromSettings(s: NodeSettings): NftPlanOptions {
  return {
    family: s.family,
    node: portFactsOf(s),
    nodePortIPs: s.nodePortIPs,
    localDetector: s.localDetector,
    masqueradeAll: s.masqueradeAll,
    masqueradeMark: s.masqueradeMark,
    serviceCIDRs: [],
  };
}
