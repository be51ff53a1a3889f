// Walks a packet through an IPVS table plus the mode's ipsets and masquerade rules: which
// virtual server it hits, the candidate real servers, the scheduler, persistence, and
// whether the iptables rules masquerade it. Works on a plan or on live state. Pure.
import { cidrContains, joinHostPort } from '../../core/ip.ts';
import type { TraceResult } from '../trace-types.ts';
import type { IPSetTable } from '../../kernel/ipset/model.ts';
import { setName, type SetKey } from './names.ts';
import { virtualServerKey, type IpvsTable } from '../../kernel/ipvs/model.ts';
import { readSave } from '../../kernel/iptables/save.ts';

export interface MasqConfig {
  all: boolean;
  clusterCIDR: string | null;
  /** detectLocalMode BridgeInterface / InterfaceNamePrefix: the `! -i` match ("cbr0", "veth+") */
  notLocalInterface?: string | null;
}

/**
 * The walk's questions to the ipsets, answered as the kernel's set match answers them (and
 * `ipset test`): an entry of a hash:ip,port,net set matches an address inside one of its nets.
 */
export interface SetLookup {
  has(set: string, entry: string): boolean;
}

/** membership in listed sets (a plan's, or `ipset save` output) */
export function tableLookup(sets: IPSetTable): SetLookup {
  return {
    has(name, entry) {
      const s = sets.get(name);
      if (!s) return false;
      if (s.entries.has(entry)) return true;
      if (s.type !== 'hash:ip,port,net') return false;
      // ip,proto:port,addr in a net set: an entry ip,proto:port,CIDR whose net holds addr
      const cut = entry.lastIndexOf(',');
      const head = entry.slice(0, cut + 1);
      const addr = entry.slice(cut + 1);
      for (const e of s.entries) if (e.startsWith(head) && cidrMatch(e.slice(head.length), addr)) return true;
      return false;
    },
  };
}

export interface TraceInput {
  family: 4 | 6;
  table: IpvsTable;
  sets: IPSetTable;
  /** asked instead of `sets` when given (a live trace asks the kernel one entry at a time) */
  setLookup?: SetLookup;
  masq: MasqConfig;
  /** addresses that are LOCAL on the node besides the VIPs in KUBE-IPVS-IPS */
  nodeIPs: string[];
}

export interface Packet {
  from: string;
  to: string;
  port: number;
  protocol: 'TCP' | 'UDP' | 'SCTP';
}

function cidrMatch(cidr: string, ip: string): boolean {
  return cidr.includes('/') ? cidrContains(cidr, ip) : cidr === ip;
}

/** A packet's walk: what it is matched with, and the rules and notes it collects on the way. */
interface Walk {
  inp: TraceInput;
  pkt: Packet;
  /** the protocol as ipset entries spell it: tcp, udp, sctp */
  proto: string;
  /** the packet's destination as an ipset entry: "ip,proto:port" */
  ipPort: string;
  rules: string[];
  notes: string[];
  has: (k: SetKey, e: string) => boolean;
}

export function traceIpvs(inp: TraceInput, pkt: Packet): TraceResult {
  const proto = pkt.protocol.toLowerCase();
  const lookup = inp.setLookup ?? tableLookup(inp.sets);
  const w: Walk = {
    inp,
    pkt,
    proto,
    ipPort: `${pkt.to},${proto}:${pkt.port}`,
    rules: [],
    notes: [],
    has: (k, e) => lookup.has(setName(k, inp.family), e),
  };
  const loopbackSource = pkt.from.startsWith('127.') || pkt.from === '::1';
  if (firewallDrops(w)) return { output: 'DROP', masq: false, rules: w.rules, notes: w.notes };
  let masq = false;
  if (loopbackSource) w.rules.push('nat KUBE-SERVICES: -s loopback -j RETURN');
  else masq = natMarksMasq(w);
  return throughVirtualServer(w, masq);
}

/** one ipset question of a walk: is `entry` in the kernel set `set` */
export interface SetQuestion {
  set: string;
  entry: string;
}

/**
 * The ipset questions a walk of `pkt` can ask over `inp` (its `sets`/`setLookup` unused): those
 * of the walk that hears "no" to every question, and of each walk that hears "yes" to one of
 * them. What a live trace asks the kernel in one go before the walk that counts; that walk
 * may still ask one more (the caller asks again), it never answers from a guess.
 */
export function setQuestions(inp: Omit<TraceInput, 'sets' | 'setLookup'>, pkt: Packet, maxWalks = 64): SetQuestion[] {
  const asked = new Map<string, SetQuestion>();
  const walk = (yes?: string) =>
    traceIpvs({ ...inp, sets: new Map(), setLookup: { has(set, entry) {
      const k = `${set} ${entry}`;
      if (!asked.has(k)) asked.set(k, { set, entry });
      return k === yes;
    } } }, pkt);
  walk();
  const keys = () => [...asked.keys()];
  for (let i = 0; i < asked.size && i < maxWalks; i++) walk(keys()[i]);
  return [...asked.values()];
}

/** filter: LoadBalancer source ranges (KUBE-PROXY-FIREWALL → KUBE-SOURCE-RANGES-FIREWALL); true when the packet is dropped. */
function firewallDrops(w: Walk): boolean {
  const { inp, pkt, ipPort, rules, has } = w;
  if (!has('loadBalancerFW', ipPort)) return false;
  rules.push(`filter KUBE-PROXY-FIREWALL: ${ipPort} in ${setName('loadBalancerFW', inp.family)}`);
  const allowed = has('loadBalancerSourceCIDR', `${ipPort},${pkt.from}`) || has('loadBalancerSourceIP', `${ipPort},${pkt.from}`);
  if (!allowed) {
    rules.push('filter KUBE-SOURCE-RANGES-FIREWALL: -j DROP');
    return true;
  }
  rules.push('filter KUBE-SOURCE-RANGES-FIREWALL: source allowed, RETURN');
  return false;
}

/** nat KUBE-SERVICES for a packet not from loopback: load balancer, cluster IP, external IP and node port marks; true when one marks it for masquerade. */
function natMarksMasq(w: Walk): boolean {
  const { inp, ipPort, rules, has } = w;
  let masq = false;
  if (has('loadBalancer', ipPort)) {
    rules.push(`nat KUBE-SERVICES: ${ipPort} in ${setName('loadBalancer', inp.family)} -j KUBE-LOAD-BALANCER`);
    if (has('loadBalancerLocal', ipPort)) rules.push('nat KUBE-LOAD-BALANCER: externalTrafficPolicy Local, RETURN');
    else {
      rules.push('nat KUBE-LOAD-BALANCER: -j KUBE-MARK-MASQ');
      masq = true;
    }
  }
  if (has('clusterIP', ipPort) && clusterIPMasq(w)) masq = true;
  if (has('externalIP', ipPort)) {
    rules.push(`nat KUBE-SERVICES: ${ipPort} in ${setName('externalIP', inp.family)} -j KUBE-MARK-MASQ`);
    masq = true;
  }
  if (nodePortMasq(w)) masq = true;
  return masq;
}

/** nat KUBE-SERVICES for a cluster IP: masqueradeAll, the cluster CIDR, the local interface or a VIP source decides; true when it marks. */
function clusterIPMasq(w: Walk): boolean {
  const { inp, pkt, proto, rules, notes, has } = w;
  if (inp.masq.all) {
    rules.push('nat KUBE-SERVICES: cluster IP, masqueradeAll -j KUBE-MARK-MASQ');
    return true;
  }
  if (inp.masq.clusterCIDR) {
    if (cidrContains(inp.masq.clusterCIDR, pkt.from)) return false;
    rules.push(`nat KUBE-SERVICES: cluster IP, source not in ${inp.masq.clusterCIDR} -j KUBE-MARK-MASQ`);
    return true;
  }
  if (inp.masq.notLocalInterface) {
    // A trace knows the source address, not the input interface: the packet is taken as
    // not coming in on the pods' interface, as from outside the node.
    rules.push(`nat KUBE-SERVICES: cluster IP, ! -i ${inp.masq.notLocalInterface} (assumed: a trace has no input interface) -j KUBE-MARK-MASQ`);
    notes.push(`detectLocalMode by interface: masquerade depends on the input interface (${inp.masq.notLocalInterface}), which a trace does not know`);
    return true;
  }
  if (has('clusterIP', `${pkt.from},${proto}:${pkt.port}`)) {
    rules.push('nat KUBE-SERVICES: source is a VIP (src,dst) -j KUBE-MARK-MASQ');
    return true;
  }
  return false;
}

/** nat KUBE-NODE-PORT for a packet to a local address: its protocol's node port sets decide; true when it marks. */
function nodePortMasq(w: Walk): boolean {
  const { inp, pkt, proto, ipPort, rules, has } = w;
  const local = inp.nodeIPs.includes(pkt.to) || has('ipvsIPs', pkt.to);
  if (!local) return false;
  const np: Record<string, [SetKey, SetKey, string]> = {
    tcp: ['nodePortLocalTCP', 'nodePortTCP', String(pkt.port)],
    udp: ['nodePortLocalUDP', 'nodePortUDP', String(pkt.port)],
    sctp: ['nodePortLocalSCTP', 'nodePortSCTP', ipPort],
  };
  const [localSet, allSet, entry] = np[proto];
  if (has(localSet, entry)) rules.push('nat KUBE-NODE-PORT: externalTrafficPolicy Local, RETURN');
  else if (has(allSet, entry)) {
    rules.push(`nat KUBE-NODE-PORT: ${entry} in ${setName(allSet, inp.family)} -j KUBE-MARK-MASQ`);
    return true;
  }
  return false;
}

/** The IPVS part: the virtual server hit, its scheduler and persistence, the real servers it forwards to, and hairpin masquerade. */
function throughVirtualServer(w: Walk, masqIn: boolean): TraceResult {
  const { inp, pkt, proto, rules, notes, has } = w;
  let masq = masqIn;
  const vsKey = virtualServerKey({ address: pkt.to, port: pkt.port, protocol: pkt.protocol });
  const st = inp.table.get(vsKey);
  if (!st) {
    rules.push(`ipvs: no virtual server ${vsKey}`);
    return { output: '', masq: false, rules, notes };
  }
  const persist = st.vs.persistence > 0 ? ` persistent ${st.vs.persistence}` : '';
  rules.push(`ipvs: virtual server ${vsKey} ${st.vs.scheduler}${persist}`);
  notes.push(`scheduler ${st.vs.scheduler}${st.vs.schedFlags.length ? ` (${st.vs.schedFlags.join(',')})` : ''}`);
  notes.push(st.vs.persistence > 0 ? `persistence ${st.vs.persistence}s (sessionAffinity ClientIP)` : 'no persistence');
  const all = [...st.reals.values()];
  const draining = all.filter((r) => r.weight === 0).map((r) => joinHostPort(r.address, r.port)).sort();
  if (draining.length) notes.push(`draining (weight 0, no new connections): ${draining.join(', ')}`);
  const live = all.filter((r) => r.weight > 0);
  if (live.length === 0) {
    // IPVS answers a packet for a virtual server without destinations with ICMP port unreachable
    rules.push('ipvs: no real server with weight > 0: ICMP port unreachable');
    return { output: 'REJECT', masq: false, rules, notes };
  }
  const targets = live.map((r) => joinHostPort(r.address, r.port)).sort();
  for (const r of live) {
    if (has('loopBack', `${r.address},${proto}:${r.port},${pkt.from}`)) {
      rules.push(`nat KUBE-POSTROUTING: hairpin ${r.address},${proto}:${r.port},${pkt.from} in ${setName('loopBack', inp.family)} -j MASQUERADE`);
      masq = true;
    }
  }
  rules.push(`ipvs: masquerading (NAT) forward to ${targets.join(', ')}`);
  return { output: targets.join(', '), masq, rules, notes };
}

/** the masquerade settings encoded in live `iptables-save -t nat` text */
export function masqConfigFromIptables(text: string, family: 4 | 6): MasqConfig {
  const set = setName('clusterIP', family);
  const lines = [...readSave(text).values()].flatMap((t) => t.rules.map((r) => r.line));
  for (const line of lines) {
    if (!line.startsWith('-A KUBE-SERVICES') || !line.includes(`--match-set ${set} `) || !line.includes('-j KUBE-MARK-MASQ')) continue;
    const m = /! -s (\S+)/.exec(line);
    if (m) return { all: false, clusterCIDR: m[1] };
    const i = /! -i (\S+)/.exec(line);
    if (i) return { all: false, clusterCIDR: null, notLocalInterface: i[1] };
    if (line.includes(' src,dst')) return { all: false, clusterCIDR: null };
    return { all: true, clusterCIDR: null };
  }
  return { all: false, clusterCIDR: null };
}
