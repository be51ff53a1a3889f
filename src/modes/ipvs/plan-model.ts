// The shapes of an ipvs plan (the desired IPVS table, ipsets, kube-ipvs0 addresses and
// iptables text), of one service port's part of it, and the plan's node-level parts. Pure.
import type { NodeView, PlanInput } from '../../core/nodeview.ts';
import type { IPSetTable } from '../../kernel/ipset/model.ts';
import type { IpvsTable, VirtualServerState } from '../../kernel/ipvs/model.ts';
import { plannedSysctls, type IPVSSysctl } from './sysctls.ts';

export interface LBNoNodeAccess {
  ip: string;
  port: number;
  protocol: string;
}

/** something the kernel would refuse, left out of the plan and reported (never applied) */
export interface Rejected {
  /** the service port key ("ns/name:port") */
  owner: string;
  /** what was left out: "ipset KUBE-CLUSTER-IP 0.0.0.0,tcp:80" or "virtual server ..." */
  what: string;
  reason: string;
}

export interface IpvsPlan {
  family: 4 | 6;
  table: IpvsTable;
  /** service port key for every virtual server key (tracing, logs) */
  owners: Map<string, string>;
  /** addresses kube-ipvs0 must carry, sorted */
  boundAddresses: string[];
  /** node IPs used for NodePort virtual servers */
  nodePortIPs: string[];
  sets: IPSetTable;
  iptables: string;
  sysctls: IPVSSysctl[];
  /** `ipvsadm --set` seconds (0 = keep), or null when none is configured */
  timeouts: { tcp: number; tcpFin: number; udp: number } | null;
  /** source-range LBs that the node itself must not reach (KUBE-IPVS-OUT-FILTER) */
  lbNoNodeAccess: LBNoNodeAccess[];
  /** masquerade decisions the iptables text encodes, for the tracer */
  masq: { all: boolean; clusterCIDR: string | null; notLocal?: string | null; notLocalInterface?: string | null; mark: string };
  /** entries and addresses left out because the kernel would refuse them */
  rejected: Rejected[];
  /** "SET entry" → the service port that wants it (to name the owner of a refused line) */
  entryOwners: Map<string, string>;
}

/**
 * What one service port contributes to the plan: its virtual servers, the addresses it binds
 * to kube-ipvs0, its set entries, its firewall rules and what was left out. The plan is the
 * union of the fragments (src/modes/ipvs/plan-state.ts), so a partial sync re-plans only the
 * changed Services' fragments and applies the difference.
 */
export interface PortFragment {
  /** service port key "ns/name:port" */
  key: string;
  /** "ns/name" */
  serviceKey: string;
  /** by virtualServerKey, in planning order */
  vss: Map<string, VirtualServerState>;
  /** addresses to bind to kube-ipvs0 */
  bound: Set<string>;
  /** "SETNAME entry" (set names hold no space) */
  entries: Set<string>;
  lbNoNodeAccess: LBNoNodeAccess[];
  rejected: Rejected[];
}

/** The node-level facts every fragment is planned with (the same for every port of a sync). */
export interface PlanContext {
  input: PlanInput;
  family: 4 | 6;
  /** the node view of the sync: its ports are what the planner renders */
  view: NodeView;
  npIPs: string[];
  nodeIPSet: Set<string>;
  masq: IpvsPlan['masq'];
  /** a fingerprint of everything above that a fragment depends on: another key, another plan */
  key: string;
}

function seconds(ms: number): number {
  return Math.round(ms / 1000);
}

/** The node-level parts of a plan: sysctls and ipvsadm timeouts. */
export function globalsOf(cfg: PlanInput['config']): Pick<IpvsPlan, 'sysctls' | 'timeouts'> {
  const t = cfg.ipvs;
  const timeouts =
    t.tcpTimeoutMs > 0 || t.tcpFinTimeoutMs > 0 || t.udpTimeoutMs > 0
      ? { tcp: seconds(t.tcpTimeoutMs), tcpFin: seconds(t.tcpFinTimeoutMs), udp: seconds(t.udpTimeoutMs) }
      : null;
  return { sysctls: plannedSysctls(cfg.ipvs.strictARP), timeouts };
}
