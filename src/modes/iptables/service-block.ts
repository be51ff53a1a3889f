// One Service port's part of the iptables ruleset, rendered from its node view (PortView,
// src/core/nodeview.ts: every decision is the view's, this only expresses it), with
// upstream's rule text (pkg/proxy/iptables/proxier.go syncProxyRules, the per-service loop):
// its KUBE-SERVICES / KUBE-NODEPORTS jumps and filter verdicts, and its own nat chains
// (KUBE-SVC-, KUBE-SVL-, KUBE-EXT-, KUBE-FW-, KUBE-SEP-). Pure.
import { flat } from '../../core/flat.ts';
import type { Endpoint, ServicePort } from '../../core/model.ts';
import type { FrontendVerdict, PortView } from '../../core/nodeview.ts';
import {
  KUBE_EXTERNAL_SERVICES, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL, KUBE_SERVICES,
  endpointChainName, probability, serviceChains, type ServiceChains,
} from './names.ts';
import { NFACCT_LOCALHOST_NODEPORTS_ACCEPTED, type IptablesOptions } from './options.ts';
import { chainLine, groupByChain, type ChainUnit } from './units.ts';

/** What a block is rendered with besides its port: the node's options and the sync's mode. */
export interface BlockSettings {
  opts: IptablesOptions;
  /** upstream's large-cluster mode: no per-endpoint comments */
  largeClusterMode: boolean;
  /** the local-traffic detector's match arguments, joined */
  ifLocal: string;
  ifNotLocal: string;
}

/** Everything one service port contributes to a sync. */
export interface ServiceBlock {
  /** filter table rules (always rendered; written unless unchanged) */
  filter: string[];
  /** nat KUBE-SERVICES / KUBE-NODEPORTS rules (always rendered; written unless unchanged) */
  natTop: string[];
  /** declarations of the service's own nat chains (written when the service changed); made from `active` when read */
  readonly chains: string[];
  /** rules of the service's own nat chains; made from `units` when read */
  readonly rules: string[];
  /** the service's own nat chains */
  active: string[];
  /** the service's own chains' rules, grouped per chain (built once, with the block) */
  units: ChainUnit[];
  /** how many endpoints it was rendered with (a fast partial sync's endpoint count) */
  endpoints: number;
  /** the port has a NodePort (a fast partial sync's count of them: plan.ts routeLocalnet) */
  nodePort: boolean;
  /**
   * The block cache (blocks.ts BlockCache.compact) dropped `units` (the text of the
   * service's own chains, needed only when they are written; `chains` and `rules` then read
   * empty): a write renders the block again.
   */
  compact?: {
    ruleCount: number;
    /** each declared chain's digest (unitDigest): a partial sync still skips unchanged chains */
    chains: Map<string, string>;
  };
}

/**
 * A rendered block. Its chain declarations and rules are not kept beside `units`, which
 * holds the same rules per chain: the blocks of every Service are live together during a full
 * sync, and the two lists cost ~7 MB at 10,000 Services.
 */
class RenderedBlock implements ServiceBlock {
  compact?: ServiceBlock['compact'];

  constructor(
    public filter: string[],
    public natTop: string[],
    public active: string[],
    public units: ChainUnit[],
    public endpoints: number,
    public nodePort: boolean,
  ) {}

  get chains(): string[] {
    return this.compact ? [] : this.active.map(chainLine);
  }

  get rules(): string[] {
    const out: string[] = [];
    for (const u of this.units) for (const r of u.rules) out.push(r);
    return out;
  }
}

/** What the render functions fill in: the block's lists while it is rendered. */
interface Draft {
  filter: string[];
  natTop: string[];
  rules: string[];
  active: string[];
}

/** The view's verdict as a filter rule's comment and target. */
function verdictRule(svcName: string, v: FrontendVerdict): { comment: string; target: string } {
  const comment = v === 'reject' ? `"${svcName} has no endpoints"` : v === 'drop' ? `"${svcName} has no local endpoints"` : '';
  return { comment, target: v === 'reject' ? 'REJECT' : 'DROP' };
}

/** A port's chain names and the match arguments its frontends share. */
interface PortNames extends ServiceChains {
  proto: string;
  internalChain: string;
  externalPolicyChain: string;
  lbChain: string;
}

function portNames(v: PortView): PortNames {
  const names = serviceChains(v.sp);
  return {
    ...names,
    proto: flat`-m ${names.protocol} -p ${names.protocol}`,
    internalChain: v.internalPolicy === 'local' ? names.svl : names.svc,
    externalPolicyChain: v.externalPolicy === 'local' ? names.svl : names.svc,
    lbChain: v.usesFirewallPath ? names.fw : names.ext,
  };
}

/** The port's dispatch rules: nat KUBE-SERVICES / KUBE-NODEPORTS jumps, filter verdicts and accepts. */
function frontendRules(b: Draft, v: PortView, opts: IptablesOptions, n: PortNames): void {
  const { sp } = v;
  const svcName = n.nameString;
  const { proto, ext } = n;
  const port = sp.port;
  const internal = verdictRule(svcName, v.internalVerdict);
  const external = verdictRule(svcName, v.externalVerdict);
  const rejectExternal = (match: string) => b.filter.push(flat`-A ${KUBE_EXTERNAL_SERVICES} -m comment --comment ${external.comment} ${match} -j ${external.target}`);
  if (sp.clusterIP) {
    if (v.hasInternalEndpoints) {
      b.natTop.push(flat`-A ${KUBE_SERVICES} -m comment --comment "${svcName} cluster IP" ${proto} -d ${sp.clusterIP} --dport ${port} -j ${n.internalChain}`);
    } else {
      b.filter.push(flat`-A ${KUBE_SERVICES} -m comment --comment ${internal.comment} ${proto} -d ${sp.clusterIP} --dport ${port} -j ${internal.target}`);
    }
  }
  for (const ip of sp.externalIPs) {
    if (v.hasAnyEndpoints) b.natTop.push(flat`-A ${KUBE_SERVICES} -m comment --comment "${svcName} external IP" ${proto} -d ${ip} --dport ${port} -j ${ext}`);
    if (!v.hasExternalEndpoints) rejectExternal(`${proto} -d ${ip} --dport ${port}`);
  }
  for (const ip of sp.loadBalancerVIPs) {
    if (v.hasAnyEndpoints) b.natTop.push(flat`-A ${KUBE_SERVICES} -m comment --comment "${svcName} loadbalancer IP" ${proto} -d ${ip} --dport ${port} -j ${n.lbChain}`);
    if (v.usesFirewallPath) b.filter.push(flat`-A ${KUBE_PROXY_FIREWALL} -m comment --comment "${svcName} traffic not accepted by ${n.fw}" ${proto} -d ${ip} --dport ${port} -j DROP`);
  }
  if (!v.hasExternalEndpoints) for (const ip of sp.loadBalancerVIPs) rejectExternal(`${proto} -d ${ip} --dport ${port}`);
  // Node ports are not subject to loadBalancerSourceRanges, as upstream.
  if (sp.nodePort !== 0) {
    if (v.hasAnyEndpoints) {
      if (opts.localhostNodePorts && opts.family !== 6 && opts.nfacctLocalhostNodePortsAccepted) {
        b.natTop.push(flat`-A ${KUBE_NODEPORTS} -m comment --comment ${svcName} ${proto} -d 127.0.0.0/8 --dport ${sp.nodePort} -m nfacct --nfacct-name ${NFACCT_LOCALHOST_NODEPORTS_ACCEPTED} -j ${ext}`);
      }
      b.natTop.push(flat`-A ${KUBE_NODEPORTS} -m comment --comment ${svcName} ${proto} --dport ${sp.nodePort} -j ${ext}`);
    }
    if (!v.hasExternalEndpoints) rejectExternal(`-m addrtype --dst-type LOCAL ${proto} --dport ${sp.nodePort}`);
  }
  if (v.healthCheckNodePort !== 0) {
    b.filter.push(flat`-A ${KUBE_NODEPORTS} -m comment --comment "${svcName} health check node port" -m tcp -p tcp --dport ${v.healthCheckNodePort} -j ACCEPT`);
  }
}

function declare(b: Draft, chain: string): void {
  b.active.push(chain);
}

/** Off-cluster traffic to the cluster IP may be routed back off-node: it is masqueraded. */
function clusterIPMasquerade(b: Draft, v: PortView, s: BlockSettings, n: PortNames): void {
  const { sp } = v;
  if (!v.hasInternalEndpoints || !sp.clusterIP) return;
  const args = flat`-m comment --comment "${n.nameString} cluster IP" ${n.proto} -d ${sp.clusterIP} --dport ${sp.port}`;
  if (s.opts.masqueradeAll) b.rules.push(flat`-A ${n.internalChain} ${args} -j ${KUBE_MARK_MASQ}`);
  else if (s.opts.localDetector) b.rules.push(flat`-A ${n.internalChain} ${args} ${s.ifNotLocal} -j ${KUBE_MARK_MASQ}`);
}

/** KUBE-EXT-: masquerade (or short-circuit) external traffic, then the external policy's chain. */
function externalChain(b: Draft, v: PortView, s: BlockSettings, n: PortNames): void {
  if (!v.usesExternalPath) return;
  const { ext, nameString: svcName } = n;
  declare(b, ext);
  if (v.externalPolicy === 'cluster') {
    b.rules.push(flat`-A ${ext} -m comment --comment "masquerade traffic for ${svcName} external destinations" -j ${KUBE_MARK_MASQ}`);
  } else {
    if (s.opts.localDetector && v.shortCircuitToCluster) {
      b.rules.push(flat`-A ${ext} -m comment --comment "pod traffic for ${svcName} external destinations" ${s.ifLocal} -j ${n.svc}`);
    }
    b.rules.push(flat`-A ${ext} -m comment --comment "masquerade LOCAL traffic for ${svcName} external destinations" -m addrtype --src-type LOCAL -j ${KUBE_MARK_MASQ}`);
    if (v.shortCircuitToCluster) b.rules.push(flat`-A ${ext} -m comment --comment "route LOCAL traffic for ${svcName} external destinations" -m addrtype --src-type LOCAL -j ${n.svc}`);
  }
  if (v.hasExternalEndpoints) b.rules.push(flat`-A ${ext} -j ${n.externalPolicyChain}`);
}

/** KUBE-FW-: the load balancer's source ranges; everything else falls through to KUBE-PROXY-FIREWALL's drop. */
function firewallChain(b: Draft, v: PortView, n: PortNames): void {
  if (!v.usesFirewallPath) return;
  const { fw, ext } = n;
  declare(b, fw);
  const head = flat`-A ${fw} -m comment --comment "${n.nameString} loadbalancer IP"`;
  for (const cidr of v.firewall!.sourceRanges) b.rules.push(flat`${head} -s ${cidr} -j ${ext}`);
  // A node reaching its own VIP-like LB IP loops back with the VIP as source.
  if (v.firewall!.nodeInRanges) for (const ip of v.sp.loadBalancerVIPs) b.rules.push(flat`${head} -s ${ip} -j ${ext}`);
  b.rules.push(flat`-A ${fw} -m comment --comment "other traffic to ${n.nameString} will be dropped by KUBE-PROXY-FIREWALL"`);
}

// Endpoint objects live in the state until they change, so their chain name is cached on them
// (with the port name and protocol it was made for: the text, not a new string to compare).
const sepCache = new WeakMap<Endpoint, { nameString: string; protocol: string; name: string }>();

function sepName(svcName: string, protocol: string, ep: Endpoint): string {
  const c = sepCache.get(ep);
  if (c && c.nameString === svcName && c.protocol === protocol) return c.name;
  const name = endpointChainName(svcName, protocol, ep.key);
  sepCache.set(ep, { nameString: svcName, protocol, name });
  return name;
}

/** KUBE-SVC- / KUBE-SVL-: affinity checks, then a random pick among the endpoints. */
function policyChain(b: Draft, sp: ServicePort, n: PortNames, chain: string, endpoints: Endpoint[], largeClusterMode: boolean): void {
  declare(b, chain);
  const comment = (ep: Endpoint) => (largeClusterMode ? '' : ` -m comment --comment "${n.nameString} -> ${ep.key}"`);
  if (sp.stickyMaxAgeSeconds > 0) {
    for (const ep of endpoints) {
      const sep = sepName(n.nameString, n.protocol, ep);
      b.rules.push(flat`-A ${chain}${comment(ep)} -m recent --name ${sep} --rcheck --seconds ${sp.stickyMaxAgeSeconds} --reap -j ${sep}`);
    }
  }
  const count = endpoints.length;
  for (let i = 0; i < count; i++) {
    const ep = endpoints[i];
    const stat = i < count - 1 ? ` -m statistic --mode random --probability ${probability(count - i)}` : '';
    b.rules.push(flat`-A ${chain}${comment(ep)}${stat} -j ${sepName(n.nameString, n.protocol, ep)}`);
  }
}

/** KUBE-SEP-: hairpin masquerade and the DNAT (recording affinity). */
function endpointChains(b: Draft, v: PortView, n: PortNames, largeClusterMode: boolean): void {
  const c = largeClusterMode ? '' : ` -m comment --comment ${n.nameString}`;
  for (const ep of v.allReachableEndpoints) {
    const sep = sepName(n.nameString, n.protocol, ep);
    declare(b, sep);
    // Hairpin: a pod reaching itself through the service must be masqueraded.
    b.rules.push(flat`-A ${sep}${c} -s ${ep.ip} -j ${KUBE_MARK_MASQ}`);
    const affinity = v.sp.stickyMaxAgeSeconds > 0 ? ` -m recent --name ${sep} --set` : '';
    b.rules.push(flat`-A ${sep}${c}${affinity} ${n.proto} -j DNAT --to-destination ${ep.key}`);
  }
}

/** One service port's block, from the port as the node view decides it. */
export function renderServiceBlock(v: PortView, s: BlockSettings): ServiceBlock {
  const b: Draft = { filter: [], natTop: [], rules: [], active: [] };
  const n = portNames(v);
  frontendRules(b, v, s.opts, n);
  clusterIPMasquerade(b, v, s, n);
  externalChain(b, v, s, n);
  firewallChain(b, v, n);
  if (v.usesClusterPath) policyChain(b, v.sp, n, n.svc, v.clusterEndpoints, s.largeClusterMode);
  if (v.usesLocalPath) policyChain(b, v.sp, n, n.svl, v.localEndpoints, s.largeClusterMode);
  endpointChains(b, v, n, s.largeClusterMode);
  // Exact-size copies: an array grown by push from empty reserves 17 slots (V8), ~150 bytes
  // per array where most of these hold one to three lines.
  return new RenderedBlock(b.filter.slice(), b.natTop.slice(), b.active.slice(), groupByChain(b.active, b.rules), v.endpoints.length, v.sp.nodePort !== 0);
}
