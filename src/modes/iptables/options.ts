// The planner's settings, resolved once per sync: from the effective ProxyConfig plus what
// the proxier learned about the host (runtime), or from an upstream conformance case's
// config.json (which sets the fake proxier's fields directly). Pure.
import type { ProxyConfig } from '../../config/config.ts';
import { nodePortIPsFor, nodeSettings, portFactsOf, resolveNodePortAddresses, type LocalDetectorSpec, type NodePortIPs, type NodeSettings, type NodeContext, type PortFacts } from '../../core/nodeview.ts';

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
  /** the node facts every port's decisions are taken with (src/core/nodeview.ts portOf) */
  node: PortFacts;
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

/** upstream's detect-local iptables arguments (pkg/proxy/util/localdetector.go) for the view's detector. */
export function detectorArgs(d: LocalDetectorSpec | null): LocalDetector | null {
  if (!d) return null;
  if (d.kind === 'cidr') return cidrDetector(d.cidr);
  const dev = d.kind === 'interface' ? d.name : `${d.prefix}+`;
  return { ifLocal: ['-i', dev], ifNotLocal: ['!', '-i', dev] };
}

/** The node view's NodePort addresses as the planner takes them. */
function addressing(ips: NodePortIPs): NodePortAddressing {
  return ips === 'all' ? { matchAll: true, ips: [] } : { matchAll: false, ips };
}

/** The NodePort addressing of a list of CIDRs (conformance cases set them literally), decided as the node view does. */
export function nodePortAddressing(family: 4 | 6, cidrs: string[], localIPs: string[], localhostNodePorts: boolean): NodePortAddressing {
  const r = resolveNodePortAddresses(family, cidrs, localIPs, null);
  return addressing(nodePortIPsFor('iptables', family, r, [], localhostNodePorts));
}

/** Facts about the host that only the proxier can learn (it probes at start). */
export interface RuntimeFacts {
  hasRandomFully: boolean;
  conntrackTCPLiberal: boolean;
  nfacctCounters: string[];
  /** large-cluster mode above this many endpoints (upstream: 1000; tests lower it) */
  largeClusterEndpointsThreshold?: number;
}

export const DEFAULT_FACTS: RuntimeFacts = { hasRandomFully: false, conntrackTCPLiberal: false, nfacctCounters: [] };

/** Options for a real run (or a dry-run render) from the effective config. */
export function optionsFromConfig(config: ProxyConfig, node: NodeContext, facts: RuntimeFacts = DEFAULT_FACTS): IptablesOptions {
  // Every node-wide decision (NodePort addresses, detector, localhost NodePorts) is the node view's.
  const s = nodeSettings(config, node);
  return optionsFromSettings(s, facts);
}

/** iptables options from the node view's node-wide settings. */
export function optionsFromSettings(s: NodeSettings, facts: RuntimeFacts = DEFAULT_FACTS): IptablesOptions {
  return {
    family: s.family,
    node: portFactsOf(s),
    masqueradeMark: s.masqueradeMark,
    masqueradeAll: s.masqueradeAll,
    localDetector: detectorArgs(s.localDetector),
    localhostNodePorts: s.localhostNodePorts,
    nodePorts: addressing(s.nodePortIPs),
    conntrackTCPLiberal: facts.conntrackTCPLiberal,
    hasRandomFully: facts.hasRandomFully,
    nfacctCTStateInvalidDropped: facts.nfacctCounters.includes(NFACCT_CT_STATE_INVALID_DROPPED),
    nfacctLocalhostNodePortsAccepted: facts.nfacctCounters.includes(NFACCT_LOCALHOST_NODEPORTS_ACCEPTED),
    largeClusterEndpointsThreshold: facts.largeClusterEndpointsThreshold ?? 1000,
  };
}
