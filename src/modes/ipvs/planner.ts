// The ipvs mode's planner: ProxyState → the desired IPVS table, addresses on kube-ipvs0,
// ipsets and iptables rules, as upstream's syncProxyRules decides them (one virtual server
// per ClusterIP, ExternalIP, LB ingress IP and node IP × NodePort; NAT real servers with
// weight 1; persistence for ClientIP affinity). Pure: no I/O.
import { canonicalIP, ipFamily } from '../../core/ip.ts';
import { portsInOrder, settingsOf, viewOf, type NodeSettings, type PortView, type PlanInput } from '../../core/nodeview.ts';
import type { Endpoint, ServicePort } from '../../core/model.ts';
import { SET_INFO, setName, type SetKey } from './names.ts';
import { entryRefusal, normalizeEntry } from '../../kernel/ipset/model.ts';
import { PlanState } from './plan-state.ts';
import type { IpvsPlan, LBNoNodeAccess, PlanContext, PortFragment } from './plan-model.ts';
import { realServerKey, virtualServerKey, type RealServer, type VirtualServer } from '../../kernel/ipvs/model.ts';

/** node IPs NodePort virtual servers are created on: the node view's (nodePortIPsFor) */
export function nodePortIPs(input: PlanInput): string[] {
  return nodePortIPsOfView(settingsOf(input));
}

function nodePortIPsOfView(view: NodeSettings): string[] {
  return view.nodePortIPs === 'all' ? view.nodeIPs : view.nodePortIPs;
}


export function planContext(input: PlanInput): PlanContext {
  const family = input.node.family;
  const view = viewOf(input);
  const npIPs = nodePortIPsOfView(view);
  const nodeIPSet = new Set(input.node.nodeIPs.map((ip) => canonicalIP(ip) ?? ip));
  const masq = masqOf(view);
  const key = JSON.stringify([
    family, npIPs, [...nodeIPSet], view.nodeName, view.nodeLabels, view.primaryNodeIP ?? null, input.config.ipvs.scheduler, masq,
  ]);
  return { input, family, view, npIPs, nodeIPSet, masq, key };
}

class FragmentBuilder {
  readonly f: PortFragment;

  constructor(readonly family: 4 | 6, sp: ServicePort) {
    this.f = { key: sp.key, serviceKey: sp.serviceKey, vss: new Map(), bound: new Set(), entries: new Set(), lbNoNodeAccess: [], rejected: [] };
  }

  get lbNoNodeAccess(): LBNoNodeAccess[] {
    return this.f.lbNoNodeAccess;
  }

  /** adds a set entry, or leaves it out and reports it when the kernel would refuse it */
  add(key: SetKey, entry: string, owner: string): void {
    const info = SET_INFO_BY_KEY.get(key)!;
    const name = setName(key, this.family);
    const e = normalizeEntry(entry);
    const why = entryRefusal(info.type, this.family, e);
    if (why) this.f.rejected.push({ owner, what: `ipset ${name} ${e}`, reason: why });
    else this.f.entries.add(`${name} ${e}`);
  }

  /**
   * Whether a service address can be a virtual server at all: the unspecified address
   * (0.0.0.0, ::) cannot go into kproxy's hash:ip,port sets and must never be bound to
   * kube-ipvs0, so its virtual server is left out and reported.
   */
  usableVIP(ip: string, owner: string, field: string): boolean {
    const c = canonicalIP(ip);
    if (c && c !== '0.0.0.0' && c !== '::') return true;
    this.f.rejected.push({ owner, what: `${field} ${ip}`, reason: 'the unspecified address cannot be a service address' });
    return false;
  }

  virtualServer(vs: VirtualServer, endpoints: Endpoint[], _owner: string, bind: boolean): void {
    const reals = new Map<string, RealServer>();
    for (const ep of endpoints) {
      const rs: RealServer = { address: ep.ip, port: ep.port, weight: 1, forward: 'masq' };
      reals.set(realServerKey(rs), rs);
    }
    this.f.vss.set(virtualServerKey(vs), { vs, reals });
    if (bind) this.f.bound.add(vs.address);
  }

  done(): PortFragment {
    // bound addresses passed usableVIP, so no service needs naming here
    for (const ip of this.f.bound) this.f.entries.add(`${setName('ipvsIPs', this.family)} ${ip}`);
    return this.f;
  }
}

const SET_INFO_BY_KEY = new Map(SET_INFO.map((i) => [i.key, i]));

/** The fragment of one service port as the node view decides it, or null when it plans nothing. */
export function planPort(ctx: PlanContext, cat: PortView): PortFragment | null {
  if (!cat.sp.clusterIP) return null;
  const b = new FragmentBuilder(ctx.family, cat.sp);
  planServicePort(b, cat, ctx.input.config, ctx.npIPs, ctx.nodeIPSet);
  return b.done();
}

function planServicePort(b: FragmentBuilder, cat: PortView, config: PlanInput['config'], npIPs: string[], nodeIPSet: Set<string>): void {
  const { sp, endpoints } = cat;
  if (!sp.clusterIP) return;
  const proto = sp.protocol.toLowerCase();
  // Every decision is the node view's (src/core/nodeview.ts); this only renders it.
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
    b.virtualServer(vsFor(sp.clusterIP, sp.port), cat.internalBackends, sp.key, true);
  }

  for (const ip of sp.externalIPs) {
    if (ipFamily(ip) !== b.family || !b.usableVIP(ip, sp.key, 'externalIP')) continue;
    b.add(sp.externalPolicyLocal ? 'externalIPLocal' : 'externalIP', `${ip},${proto}:${sp.port}`, sp.key);
    // an address that already lives on another interface must not be bound to kube-ipvs0
    b.virtualServer(vsFor(ip, sp.port), cat.externalBackends, sp.key, !nodeIPSet.has(ip));
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
    b.virtualServer(vsFor(ip, sp.port), cat.externalBackends, sp.key, !nodeIPSet.has(ip));
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
      b.virtualServer(vsFor(ip, sp.nodePort), cat.externalBackends, sp.key, false);
    }
  }

  if (cat.healthCheckNodePort) b.add('healthCheckNodePort', `${cat.healthCheckNodePort}`, sp.key);
}

/** Every fragment of a state, in the plan's order. */
export function planFragments(ctx: PlanContext): PortFragment[] {
  const out: PortFragment[] = [];
  for (const v of portsInOrder(ctx.view)) {
    const f = planPort(ctx, v);
    if (f) out.push(f);
  }
  return out;
}

export function plan(input: PlanInput): IpvsPlan {
  const ctx = planContext(input);
  const st = new PlanState(ctx.family);
  for (const f of planFragments(ctx)) st.put(f.key, f);
  return st.toPlan(ctx);
}

/** The iptables text and masquerade decisions of a context and the union of fragments. */
export function masqOf(view: NodeSettings): IpvsPlan['masq'] {
  // The view's local-traffic detector, as upstream ipvs writeIptablesRules uses it:
  // localDetector.IfNotLocal() on the cluster IP masquerade rule.
  const d = view.localDetector;
  const clusterCIDR = d?.kind === 'cidr' ? d.cidr : null;
  const notLocal = d === null ? null : d.kind === 'cidr' ? `! -s ${d.cidr}` : `! -i ${d.kind === 'interface' ? d.name : `${d.prefix}+`}`;
  const notLocalInterface = d === null || d.kind === 'cidr' ? null : d.kind === 'interface' ? d.name : `${d.prefix}+`;
  return { all: view.masqueradeAll, clusterCIDR, notLocal, notLocalInterface, mark: view.masqueradeMark };
}
