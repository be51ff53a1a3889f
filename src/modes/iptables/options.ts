// The planner's settings, resolved once per sync: from the effective ProxyConfig plus what
// the proxier learned about the host (runtime), or from an upstream conformance case's
// config.json (which sets the fake proxier's fields directly). Pure.
import { canonicalIP, cidrContains, ipFamily, isLoopback, parseCIDR } from '../../core/ip.ts';
import type { ProxyConfig } from '../../config/config.ts';
import { masqueradeMark } from '../../config/config.ts';
import type { NodeContext } from '../types.ts';

/** upstream's LocalTrafficDetector: match arguments for "from a local pod" and its negation. */
export interface LocalDetector {
  ifLocal: string[];
  ifNotLocal: string[];
}

export interface NodePortAddressing {
  /** true: NodePorts on every local address (`-m addrtype --dst-type LOCAL`) */
  matchAll: boolean;
  /** when !matchAll: the node addresses NodePorts are accepted on, in order */
  ips: string[];
}

export interface IptablesOptions {
  family: 4 | 6;
  nodeName: string;
  nodeLabels: Record<string, string>;
  /** the proxier's node IP (for loadBalancerSourceRanges that include the node) */
  nodeIP: string | null;
  masqueradeMark: string;
  masqueradeAll: boolean;
  localDetector: LocalDetector | null;
  localhostNodePorts: boolean;
  nodePorts: NodePortAddressing;
  conntrackTCPLiberal: boolean;
  hasRandomFully: boolean;
  nfacctCTStateInvalidDropped: boolean;
  nfacctLocalhostNodePortsAccepted: boolean;
  largeClusterEndpointsThreshold: number;
}

export const NFACCT_CT_STATE_INVALID_DROPPED = 'ct_state_invalid_dropped_pkts';
export const NFACCT_LOCALHOST_NODEPORTS_ACCEPTED = 'localhost_nps_accepted_pkts';

export function cidrDetector(cidr: string): LocalDetector {
  return { ifLocal: ['-s', cidr], ifNotLocal: ['!', '-s', cidr] };
}

/**
 * upstream's NewNodePortAddresses + GetNodeIPs: CIDRs of the other family are ignored; none
 * left (or a zero CIDR) means "all local addresses"; otherwise the local addresses inside.
 */
export function nodePortAddressing(family: 4 | 6, cidrs: string[], localIPs: string[]): NodePortAddressing {
  const parsed = cidrs.map((c) => parseCIDR(c)).filter((c): c is NonNullable<typeof c> => !!c && c.family === family);
  if (parsed.length === 0 || parsed.some((c) => c.prefix === 0)) return { matchAll: true, ips: [] };
  const ips: string[] = [];
  for (const c of parsed) {
    for (const raw of localIPs) {
      const ip = canonicalIP(raw);
      if (ip && cidrContains(c, ip) && !ips.includes(ip)) ips.push(ip);
    }
  }
  return { matchAll: false, ips };
}

/** Does the NodePort address set include IPv4 loopback (upstream's ContainsIPv4Loopback)? */
export function containsIPv4Loopback(cidrs: string[]): boolean {
  const v4 = cidrs.map((c) => parseCIDR(c)).filter((c): c is NonNullable<typeof c> => !!c && c.family === 4);
  if (v4.length === 0) return true; // defaults to 0.0.0.0/0
  return v4.some((c) => isLoopback(c.ip) || cidrContains(c, '127.0.0.1'));
}

/** Facts about the host that only the proxier can learn (it probes at start). */
export interface RuntimeFacts {
  hasRandomFully: boolean;
  conntrackTCPLiberal: boolean;
  nfacctCounters: string[];
  /** every local address, for nodePortAddresses (defaults to node.nodeIPs + loopback) */
  localIPs?: string[];
}

export const DEFAULT_FACTS: RuntimeFacts = { hasRandomFully: false, conntrackTCPLiberal: false, nfacctCounters: [] };

/** Options for a real run (or a dry-run render) from the effective config. */
export function optionsFromConfig(config: ProxyConfig, node: NodeContext, facts: RuntimeFacts = DEFAULT_FACTS): IptablesOptions {
  const family = node.family;
  const clusterCIDR = config.clusterCIDRs.find((c) => parseCIDR(c)?.family === family);
  const localIPs = facts.localIPs ?? [...node.nodeIPs, family === 4 ? '127.0.0.1' : '::1'];
  let npaCIDRs = config.nodePortAddresses;
  if (npaCIDRs.includes('primary')) {
    npaCIDRs = node.nodeIPs.map((ip) => `${ip}/${ipFamily(ip) === 6 ? 128 : 32}`);
  }
  // As upstream's NewProxier: localhost NodePorts only when loopback is a NodePort address.
  const localhostNodePorts = family === 4 && config.localhostNodePorts && containsIPv4Loopback(npaCIDRs);
  return {
    family,
    nodeName: node.nodeName,
    nodeLabels: node.nodeLabels,
    nodeIP: node.nodeIPs[0] ?? null,
    masqueradeMark: masqueradeMark(config.masqueradeBit),
    masqueradeAll: config.masqueradeAll,
    localDetector: clusterCIDR ? cidrDetector(parseCIDR(clusterCIDR)!.text) : null,
    localhostNodePorts,
    nodePorts: nodePortAddressing(family, npaCIDRs, localIPs),
    conntrackTCPLiberal: facts.conntrackTCPLiberal,
    hasRandomFully: facts.hasRandomFully,
    nfacctCTStateInvalidDropped: facts.nfacctCounters.includes(NFACCT_CT_STATE_INVALID_DROPPED),
    nfacctLocalhostNodePortsAccepted: facts.nfacctCounters.includes(NFACCT_LOCALHOST_NODEPORTS_ACCEPTED),
    largeClusterEndpointsThreshold: 1000,
  };
}
