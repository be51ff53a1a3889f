// The ipvs mode's planner: ProxyState → the desired IPVS table, addresses on kube-ipvs0,
// ipsets and iptables rules, as upstream's syncProxyRules decides them (one virtual server
// per ClusterIP, ExternalIP, LB ingress IP and node IP × NodePort; NAT real servers with
// weight 1; persistence for ClientIP affinity). Pure: no I/O.
import { canonicalIP, ipFamily, isLoopback } from '../../core/ip.ts';
import { portView, settingsOf, type NodeSettings, type PortView } from '../../core/nodeview.ts';
import type { Endpoint, ServicePort } from '../../core/model.ts';
import type { PlanInput } from '../types.ts';
import { safeServicePort } from '../vip.ts';
import { IPVSSysctl, plannedSysctls } from './sysctls.ts';
import { SET_INFO, setName, type SetKey } from './names.ts';
import { entryRefusal, normalizeEntry, type IPSetTable } from './ipsets.ts';
import { renderIptables } from './iptables-rules.ts';
import { realServerKey, virtualServerKey, type IpvsTable, type RealServer, type VirtualServer } from './ipvs-model.ts';

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
 * node IPs NodePort virtual servers are created on: the node view's NodePort addresses
 * (every node IP when they match all), never loopback (upstream ipvs: NodePorts on
 * loopback are not supported).
 */
export function nodePortIPs(input: PlanInput): string[] {
  return nodePortIPsOfView(settingsOf(input));
}

function nodePortIPsOfView(view: NodeSettings): string[] {
  const out = view.nodePorts.matchAll ? view.nodeIPs : view.nodePorts.ips;
  return [...new Set(out.filter((ip) => ipFamily(ip) === view.family && !isLoopback(ip)))];
}

function seconds(ms: number): number {
  return Math.round(ms / 1000);
}

function emptySets(family: 4 | 6): IPSetTable {
  const sets: IPSetTable = new Map();
  for (const info of SET_INFO) {
    const name = setName(info.key, family);
    sets.set(name, { name, type: info.type, family, comment: info.comment, entries: new Set() });
  }
  return sets;
}

class PlanBuilder {
  readonly table: IpvsTable = new Map();
  readonly owners = new Map<string, string>();
  readonly bound = new Set<string>();
  readonly sets: IPSetTable;
  readonly lbNoNodeAccess: LBNoNodeAccess[] = [];
  readonly rejected: Rejected[] = [];
  readonly entryOwners = new Map<string, string>();

  constructor(readonly family: 4 | 6) {
    this.sets = emptySets(family);
  }

  /** adds a set entry, or leaves it out and reports it when the kernel would refuse it */
  add(key: SetKey, entry: string, owner: string): void {
    const set = this.sets.get(setName(key, this.family))!;
    const e = normalizeEntry(entry);
    const why = entryRefusal(set.type, this.family, e);
    if (why) this.rejected.push({ owner, what: `ipset ${set.name} ${e}`, reason: why });
    else {
      set.entries.add(e);
      if (owner && !this.entryOwners.has(`${set.name} ${e}`)) this.entryOwners.set(`${set.name} ${e}`, owner);
    }
  }

  /**
   * Whether a service address can be a virtual server at all: the unspecified address
   * (0.0.0.0, ::) cannot go into kproxy's hash:ip,port sets and must never be bound to
   * kube-ipvs0, so its virtual server is left out and reported.
   */
  usableVIP(ip: string, owner: string, field: string): boolean {
    const c = canonicalIP(ip);
    if (c && c !== '0.0.0.0' && c !== '::') return true;
    this.rejected.push({ owner, what: `${field} ${ip}`, reason: 'the unspecified address cannot be a service address' });
    return false;
  }

  virtualServer(vs: VirtualServer, endpoints: Endpoint[], owner: string, bind: boolean): void {
    const reals = new Map<string, RealServer>();
    for (const ep of endpoints) {
      const rs: RealServer = { address: ep.ip, port: ep.port, weight: 1, forward: 'masq' };
      reals.set(realServerKey(rs), rs);
    }
    const key = virtualServerKey(vs);
    this.table.set(key, { vs, reals });
    this.owners.set(key, owner);
    if (bind) this.bound.add(vs.address);
  }
}

/** upstream's syncEndpoint choice: local endpoints when the policy is Local and any exist */
function pickEndpoints(cat: PortView, onlyLocal: boolean): Endpoint[] {
  if (onlyLocal) return cat.localEndpoints.length ? cat.localEndpoints : cat.clusterEndpoints;
  return cat.clusterEndpoints;
}

function planServicePort(b: PlanBuilder, sp: ServicePort, input: PlanInput, view: NodeSettings, npIPs: string[], nodeIPSet: Set<string>): void {
  const { config, state } = input;
  if (!sp.clusterIP) return;
  const proto = sp.protocol.toLowerCase();
  const endpoints = state.endpoints.get(sp.key) ?? [];
  // Every decision is the node view's (src/core/nodeview.ts); this only renders it.
  const cat = portView(sp, endpoints, { nodeName: view.nodeName, nodeLabels: view.nodeLabels, nodeIP: view.primaryNodeIP });
  const scheduler = config.ipvs.scheduler;
  const vsFor = (address: string, port: number): VirtualServer => ({
    protocol: sp.protocol,
    address,
    port,
    scheduler,
    persistence: sp.stickyMaxAgeSeconds > 0 ? sp.stickyMaxAgeSeconds : 0,
    // upstream sets IP_VS_SVC_F_SCHED2 (FlagSourceHash) for mh, which ipvsadm calls mh-port
    schedFlags: scheduler === 'mh' ? ['mh-port'] : [],
  });

  // hairpin: a local endpoint reaching itself through the service is masqueraded
  for (const ep of endpoints) {
    if (ep.isLocal) b.add('loopBack', `${ep.ip},${proto}:${ep.port},${ep.ip}`, sp.key);
  }

  if (b.usableVIP(sp.clusterIP, sp.key, 'clusterIP')) {
    b.add('clusterIP', `${sp.clusterIP},${proto}:${sp.port}`, sp.key);
    b.virtualServer(vsFor(sp.clusterIP, sp.port), pickEndpoints(cat, sp.internalPolicyLocal), sp.key, true);
  }

  for (const ip of sp.externalIPs) {
    if (ipFamily(ip) !== b.family || !b.usableVIP(ip, sp.key, 'externalIP')) continue;
    b.add(sp.externalPolicyLocal ? 'externalIPLocal' : 'externalIP', `${ip},${proto}:${sp.port}`, sp.key);
    // an address that already lives on another interface must not be bound to kube-ipvs0
    b.virtualServer(vsFor(ip, sp.port), pickEndpoints(cat, sp.externalPolicyLocal), sp.key, !nodeIPSet.has(ip));
  }

  // A /0 source range allows every source (the view's allowAll, kubernetes#132722), exactly
  // as no source range does; hash:ip,port,net cannot store a /0 anyway: no firewall at all.
  const fw = cat.firewall;
  const ranges = fw?.sourceRanges ?? [];
  const firewalled = fw !== null && !fw.allowAll;
  for (const ip of sp.loadBalancerVIPs) {
    if (ipFamily(ip) !== b.family || !b.usableVIP(ip, sp.key, 'loadBalancer ingress IP')) continue;
    const entry = `${ip},${proto}:${sp.port}`;
    b.add('loadBalancer', entry, sp.key);
    if (sp.externalPolicyLocal) b.add('loadBalancerLocal', entry, sp.key);
    if (firewalled) {
      b.add('loadBalancerFW', entry, sp.key);
      for (const cidr of ranges) b.add('loadBalancerSourceCIDR', `${entry},${cidr}`, sp.key);
      if (fw!.nodeInRanges) b.add('loadBalancerSourceIP', `${entry},${ip}`, sp.key);
      else b.lbNoNodeAccess.push({ ip, port: sp.port, protocol: proto });
    }
    b.virtualServer(vsFor(ip, sp.port), pickEndpoints(cat, sp.externalPolicyLocal), sp.key, !nodeIPSet.has(ip));
  }

  if (sp.nodePort && npIPs.length) {
    const entries = sp.protocol === 'SCTP' ? npIPs.map((ip) => `${ip},sctp:${sp.nodePort}`) : [`${sp.nodePort}`];
    const keys: Record<string, [SetKey, SetKey]> = {
      TCP: ['nodePortTCP', 'nodePortLocalTCP'],
      UDP: ['nodePortUDP', 'nodePortLocalUDP'],
      SCTP: ['nodePortSCTP', 'nodePortLocalSCTP'],
    };
    const [all, local] = keys[sp.protocol];
    for (const e of entries) {
      b.add(all, e, sp.key);
      if (sp.externalPolicyLocal) b.add(local, e, sp.key);
    }
    for (const ip of npIPs) {
      b.virtualServer(vsFor(ip, sp.nodePort), pickEndpoints(cat, sp.externalPolicyLocal), sp.key, false);
    }
  }

  if (cat.healthCheckNodePort) b.add('healthCheckNodePort', `${cat.healthCheckNodePort}`, sp.key);
}

export function plan(input: PlanInput): IpvsPlan {
  const family = input.node.family;
  const b = new PlanBuilder(family);
  const view = settingsOf(input);
  const npIPs = nodePortIPsOfView(view);
  const nodeIPSet = new Set(input.node.nodeIPs.map((ip) => canonicalIP(ip) ?? ip));
  const ports = [...input.state.services.values()]
    .filter((sp) => sp.family === family)
    .sort((a, b2) => (a.key < b2.key ? -1 : a.key > b2.key ? 1 : 0));
  // A loopback (or other special) VIP must never become a virtual server or be bound.
  for (const sp of ports) planServicePort(b, safeServicePort(sp).sp, input, view, npIPs, nodeIPSet);

  const boundAddresses = [...b.bound].sort();
  // bound addresses passed usableVIP, so no service needs naming here
  for (const ip of boundAddresses) b.add('ipvsIPs', ip, '');

  const cfg = input.config;
  // The view's local-traffic detector, as upstream ipvs writeIptablesRules uses it:
  // localDetector.IfNotLocal() on the cluster IP masquerade rule.
  const d = view.localDetector;
  const clusterCIDR = d?.kind === 'cidr' ? d.cidr : null;
  const notLocal = d === null ? null : d.kind === 'cidr' ? `! -s ${d.cidr}` : `! -i ${d.kind === 'interface' ? d.name : `${d.prefix}+`}`;
  const notLocalInterface = d === null || d.kind === 'cidr' ? null : d.kind === 'interface' ? d.name : `${d.prefix}+`;
  const masq = { all: view.masqueradeAll, clusterCIDR, notLocal, notLocalInterface, mark: view.masqueradeMark };
  const iptables = renderIptables({ family, sets: b.sets, masq, lbNoNodeAccess: b.lbNoNodeAccess });
  const t = cfg.ipvs;
  const timeouts =
    t.tcpTimeoutMs > 0 || t.tcpFinTimeoutMs > 0 || t.udpTimeoutMs > 0
      ? { tcp: seconds(t.tcpTimeoutMs), tcpFin: seconds(t.tcpFinTimeoutMs), udp: seconds(t.udpTimeoutMs) }
      : null;
  return {
    family,
    table: b.table,
    owners: b.owners,
    boundAddresses,
    nodePortIPs: npIPs,
    sets: b.sets,
    iptables,
    sysctls: plannedSysctls(cfg.ipvs.strictARP),
    timeouts,
    lbNoNodeAccess: b.lbNoNodeAccess,
    masq,
    rejected: b.rejected,
    entryOwners: b.entryOwners,
  };
}
