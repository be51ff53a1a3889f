// The difference between the desired IPVS table and the live one, as `ipvsadm -R` lines,
// with upstream's graceful termination: a real server that leaves a virtual server is set to
// weight 0 and deleted only once its connections have drained (UDP at once). Virtual
// servers kproxy does not own are never touched. Pure: no I/O.
import { cidrContains, ipFamily } from '../../core/ip.ts';
import type { IPSetTable } from '../../kernel/ipset/model.ts';
import { setName, type SetKey } from './names.ts';
import {
  realServerKey,
  rsDeleteLine,
  rsLine,
  sameVirtualServer,
  vsDeleteLine,
  vsLine,
  type IpvsTable,
  type RealServer,
  type VirtualServer,
} from '../../kernel/ipvs/model.ts';

export interface IpvsDiff {
  lines: string[];
  /** "vsKey/rsKey" of real servers left at weight 0 until they drain */
  terminating: Set<string>;
  counts: { vsAdded: number; vsEdited: number; vsDeleted: number; rsAdded: number; rsEdited: number; rsDeleted: number };
}

export function terminatingKey(vsKey: string, rs: { address: string; port: number }): string {
  return `${vsKey}/${realServerKey(rs)}`;
}

/** connections still using a real server; unknown counters count as "in use" */
function inUse(rs: RealServer): boolean {
  if (rs.activeConn === undefined || rs.inactConn === undefined) return true;
  return rs.activeConn + rs.inactConn > 0;
}

export function drainsAtOnce(vs: VirtualServer): boolean {
  // UDP has no connection end to wait for; expire_nodest_conn drops its entries
  return vs.protocol === 'UDP';
}

export function diffIpvs(desired: IpvsTable, live: IpvsTable, owned: (vsKey: string, vs: VirtualServer) => boolean): IpvsDiff {
  const lines: string[] = [];
  const deletes: string[] = [];
  const terminating = new Set<string>();
  const counts = { vsAdded: 0, vsEdited: 0, vsDeleted: 0, rsAdded: 0, rsEdited: 0, rsDeleted: 0 };

  for (const [key, want] of desired) {
    const have = live.get(key);
    if (!have) {
      lines.push(vsLine('-A', want.vs));
      counts.vsAdded++;
    } else if (!sameVirtualServer(want.vs, have.vs)) {
      lines.push(vsLine('-E', want.vs));
      counts.vsEdited++;
    }
    for (const [rk, rs] of want.reals) {
      const cur = have?.reals.get(rk);
      if (!cur) {
        lines.push(rsLine('-a', want.vs, rs));
        counts.rsAdded++;
      } else if (cur.weight !== rs.weight || (cur.forward !== rs.forward && !(cur.forward === 'local' && rs.forward === 'masq'))) {
        // also brings back a real server that was draining when its endpoint returned
        lines.push(rsLine('-e', want.vs, rs));
        counts.rsEdited++;
      }
    }
    if (!have) continue;
    for (const [rk, cur] of have.reals) {
      if (want.reals.has(rk)) continue;
      if (drainsAtOnce(want.vs) || !inUse(cur)) {
        deletes.push(rsDeleteLine(want.vs, cur));
        counts.rsDeleted++;
        continue;
      }
      if (cur.weight !== 0) {
        lines.push(rsLine('-e', want.vs, { ...cur, weight: 0 }));
        counts.rsEdited++;
      }
      terminating.add(terminatingKey(key, cur));
    }
  }
  for (const [key, have] of live) {
    if (desired.has(key) || !owned(key, have.vs)) continue;
    deletes.push(vsDeleteLine(have.vs));
    counts.vsDeleted++;
  }
  return { lines: [...lines, ...deletes], terminating, counts };
}

/**
 * Delete lines for terminating real servers that have drained (or a line-free answer when
 * none has). Those gone from the live table are simply forgotten.
 */
export function drainLines(terminating: Set<string>, live: IpvsTable): { lines: string[]; still: Set<string> } {
  const lines: string[] = [];
  const still = new Set<string>();
  for (const [vsKey, st] of live) {
    for (const rs of st.reals.values()) {
      const k = terminatingKey(vsKey, rs);
      if (!terminating.has(k)) continue;
      if (rs.weight === 0 && (drainsAtOnce(st.vs) || !inUse(rs))) lines.push(rsDeleteLine(st.vs, rs));
      else if (rs.weight === 0) still.add(k);
    }
  }
  return { lines, still };
}

export interface Ownership {
  /** addresses currently on kube-ipvs0 */
  dummyAddresses: string[];
  /** live ipsets (KUBE-IPVS-IPS, service sets, nodeport sets) */
  liveSets: IPSetTable;
  /** node IPs NodePort virtual servers use */
  nodeIPs: string[];
  /** virtual server keys this process created */
  created: Set<string>;
  excludeCIDRs: string[];
  family: 4 | 6;
}

/**
 * Which live virtual servers kproxy owns: a VIP on kube-ipvs0 or in KUBE-IPVS-IPS, an
 * ip:port in one of its service sets (ExternalIPs on other interfaces), a node IP with a port
 * in its NodePort sets, or one it created. excludeCIDRs are never owned (upstream's rule).
 */
export function ownershipPredicate(o: Ownership): (vsKey: string, vs: VirtualServer) => boolean {
  const entries = (k: SetKey) => o.liveSets.get(setName(k, o.family))?.entries ?? new Set<string>();
  const vips = new Set([...o.dummyAddresses, ...entries('ipvsIPs')]);
  const ipPorts = new Set<string>();
  for (const k of ['clusterIP', 'externalIP', 'externalIPLocal', 'loadBalancer'] as SetKey[]) {
    for (const e of entries(k)) ipPorts.add(e);
  }
  const nodePorts: Record<string, Set<string>> = {
    TCP: entries('nodePortTCP'),
    UDP: entries('nodePortUDP'),
    SCTP: new Set([...entries('nodePortSCTP')].map((e) => e.split(':').pop() ?? '')),
  };
  const nodeIPs = new Set(o.nodeIPs);
  return (key, vs) => {
    if (ipFamily(vs.address) !== o.family) return false;
    if (o.excludeCIDRs.some((c) => cidrContains(c, vs.address))) return false;
    if (o.created.has(key) || vips.has(vs.address)) return true;
    if (ipPorts.has(`${vs.address},${vs.protocol.toLowerCase()}:${vs.port}`)) return true;
    return nodeIPs.has(vs.address) && nodePorts[vs.protocol].has(String(vs.port));
  };
}

/**
 * The virtual servers of `desired` as the kernel holds them once every line of
 * diffIpvs(desired, live) went in: the desired state, plus the real servers it left draining
 * at weight 0. Shares the desired states where nothing drains (they are never mutated).
 */
export function afterDiff(desired: IpvsTable, live: IpvsTable, terminating: Set<string>): IpvsTable {
  const out: IpvsTable = new Map();
  for (const [key, want] of desired) {
    const have = live.get(key);
    let st = want;
    if (have && terminating.size) {
      for (const [rk, cur] of have.reals) {
        if (want.reals.has(rk) || !terminating.has(terminatingKey(key, cur))) continue;
        if (st === want) st = { vs: want.vs, reals: new Map(want.reals) };
        st.reals.set(rk, { ...cur, weight: 0 });
      }
    }
    out.set(key, st);
  }
  return out;
}
