// The ipvs plan as the union of per-service-port fragments (planner.ts planPort), kept up to
// date one fragment at a time. A full plan puts every fragment into an empty state; a partial
// sync replaces only the changed Services' fragments and takes the difference: the virtual
// servers to re-check, the set entries and kube-ipvs0 addresses that appeared or went. Set
// entries and addresses are reference-counted (two Services may share an entry, e.g. a node
// port entry or a hairpin entry of a shared endpoint); two ports wanting the same virtual
// server resolve as a full plan does: the port with the greatest key wins. Pure: no I/O.
import type { IpvsTable, VirtualServerState } from '../../kernel/ipvs/model.ts';
import type { IPSetTable } from '../../kernel/ipset/model.ts';
import { SET_INFO, setName } from './names.ts';
import { renderIptables } from './iptables-rules.ts';
import { globalsOf, type IpvsPlan, type LBNoNodeAccess, type PlanContext, type PortFragment, type Rejected } from './plan-model.ts';

export function emptySets(family: 4 | 6): IPSetTable {
  const sets: IPSetTable = new Map();
  for (const info of SET_INFO) {
    const name = setName(info.key, family);
    sets.set(name, { name, type: info.type, family, comment: info.comment, entries: new Set() });
  }
  return sets;
}

/** What changed since the last takeDelta(). */
export interface PlanDelta {
  /** virtual server keys whose desired state may differ */
  virtualServers: string[];
  /** "SETNAME entry" that appeared / went */
  entriesAdded: string[];
  entriesDeleted: string[];
  addressesAdded: string[];
  addressesDeleted: string[];
}

function setOf(entry: string): string {
  return entry.slice(0, entry.indexOf(' '));
}

export class PlanState {
  readonly frags = new Map<string, PortFragment>();
  /** "ns/name" → its ports' keys */
  readonly byService = new Map<string, Set<string>>();
  /** the effective desired table: per key, the state of the greatest owning port */
  readonly table: IpvsTable = new Map();
  readonly owners = new Map<string, string>();
  readonly sets: IPSetTable;
  /** real servers in `table` */
  realServers = 0;
  private readonly vsOwners = new Map<string, Map<string, VirtualServerState>>();
  private readonly entryRefs = new Map<string, number>();
  private readonly addrRefs = new Map<string, number>();
  private readonly lbNoNode = new Map<string, LBNoNodeAccess[]>();
  private readonly rejectedBy = new Map<string, Rejected[]>();
  // since the last takeDelta(): touched keys with their presence before
  private touchedVS = new Set<string>();
  private entryBefore = new Map<string, boolean>();
  private addrBefore = new Map<string, boolean>();

  constructor(readonly family: 4 | 6) {
    this.sets = emptySets(family);
  }

  /** Replaces the fragment of service port `key` (undefined: the port is gone). */
  put(key: string, f: PortFragment | undefined): void {
    const old = this.frags.get(key);
    if (old) this.drop(old);
    if (!f) return;
    this.frags.set(key, f);
    let ports = this.byService.get(f.serviceKey);
    if (!ports) this.byService.set(f.serviceKey, (ports = new Set()));
    ports.add(key);
    for (const [vk, st] of f.vss) {
      let m = this.vsOwners.get(vk);
      if (!m) this.vsOwners.set(vk, (m = new Map()));
      m.set(key, st);
      this.resolve(vk);
    }
    for (const e of f.entries) this.ref(this.entryRefs, this.entryBefore, e, 1);
    for (const a of f.bound) this.ref(this.addrRefs, this.addrBefore, a, 1);
    if (f.lbNoNodeAccess.length) this.lbNoNode.set(key, f.lbNoNodeAccess);
    if (f.rejected.length) this.rejectedBy.set(key, f.rejected);
  }

  private drop(f: PortFragment): void {
    this.frags.delete(f.key);
    const ports = this.byService.get(f.serviceKey);
    ports?.delete(f.key);
    if (ports?.size === 0) this.byService.delete(f.serviceKey);
    for (const vk of f.vss.keys()) {
      const m = this.vsOwners.get(vk);
      m?.delete(f.key);
      if (m?.size === 0) this.vsOwners.delete(vk);
      this.resolve(vk);
    }
    for (const e of f.entries) this.ref(this.entryRefs, this.entryBefore, e, -1);
    for (const a of f.bound) this.ref(this.addrRefs, this.addrBefore, a, -1);
    this.lbNoNode.delete(f.key);
    this.rejectedBy.delete(f.key);
  }

  /** the effective state of a virtual server: that of its greatest owning port (as a full plan's last write) */
  private resolve(vk: string): void {
    this.touchedVS.add(vk);
    const cur = this.table.get(vk);
    if (cur) this.realServers -= cur.reals.size;
    const m = this.vsOwners.get(vk);
    if (!m) {
      this.table.delete(vk);
      this.owners.delete(vk);
      return;
    }
    let best = '';
    for (const k of m.keys()) if (best === '' || k > best) best = k;
    const st = m.get(best)!;
    this.table.set(vk, st);
    this.owners.set(vk, best);
    this.realServers += st.reals.size;
  }

  private ref(refs: Map<string, number>, before: Map<string, boolean>, k: string, d: 1 | -1): void {
    const n = refs.get(k) ?? 0;
    if (!before.has(k)) before.set(k, n > 0);
    const m = n + d;
    if (m > 0) refs.set(k, m);
    else refs.delete(k);
    if (refs === this.entryRefs && (n === 0) !== (m === 0)) {
      const set = this.sets.get(setOf(k));
      const e = k.slice(k.indexOf(' ') + 1);
      if (m > 0) set?.entries.add(e);
      else set?.entries.delete(e);
    }
  }

  /** What changed since the last call, and forget it. */
  takeDelta(): PlanDelta {
    const out: PlanDelta = { virtualServers: [...this.touchedVS], entriesAdded: [], entriesDeleted: [], addressesAdded: [], addressesDeleted: [] };
    for (const [e, was] of this.entryBefore) {
      const is = this.entryRefs.has(e);
      if (is && !was) out.entriesAdded.push(e);
      else if (!is && was) out.entriesDeleted.push(e);
    }
    for (const [a, was] of this.addrBefore) {
      const is = this.addrRefs.has(a);
      if (is && !was) out.addressesAdded.push(a);
      else if (!is && was) out.addressesDeleted.push(a);
    }
    this.touchedVS = new Set();
    this.entryBefore = new Map();
    this.addrBefore = new Map();
    return out;
  }

  /** every plan refusal of the current fragments */
  rejected(): Rejected[] {
    const keys = [...this.rejectedBy.keys()].sort();
    return keys.flatMap((k) => this.rejectedBy.get(k)!);
  }

  /** firewall rules of source-range LBs, in port order */
  lbNoNodeAccess(): LBNoNodeAccess[] {
    const keys = [...this.lbNoNode.keys()].sort();
    return keys.flatMap((k) => this.lbNoNode.get(k)!);
  }

  /** the owner of a set entry, for naming a refused line ('' for none) */
  entryOwner(setAndEntry: string): string {
    if (setOf(setAndEntry) === setName('ipvsIPs', this.family)) return '';
    for (const f of this.frags.values()) if (f.entries.has(setAndEntry)) return f.key;
    return '';
  }

  boundAddresses(): string[] {
    return [...this.addrRefs.keys()].sort();
  }

  iptables(ctx: PlanContext): string {
    return renderIptables({ family: this.family, sets: this.sets, masq: ctx.masq, lbNoNodeAccess: this.lbNoNodeAccess() });
  }

  /**
   * The whole plan, as planning every port afresh in key order gives it. From a state built
   * by partial updates, the fragments are re-assembled in key order first (the table's order
   * is then the plan's, for render and /debug).
   */
  toPlan(ctx: PlanContext): IpvsPlan {
    let st: PlanState = this;
    const keys = [...this.frags.keys()];
    if (keys.some((k, i) => i > 0 && keys[i - 1] > k)) {
      st = new PlanState(this.family);
      for (const k of keys.sort()) st.put(k, this.frags.get(k));
    }
    const entryOwners = new Map<string, string>();
    const ipvsIPs = setName('ipvsIPs', this.family);
    for (const f of st.frags.values()) {
      for (const e of f.entries) if (setOf(e) !== ipvsIPs && !entryOwners.has(e)) entryOwners.set(e, f.key);
    }
    const lbNoNodeAccess = st.lbNoNodeAccess();
    return {
      family: this.family,
      table: st.table,
      owners: st.owners,
      boundAddresses: st.boundAddresses(),
      nodePortIPs: ctx.npIPs,
      sets: st.sets,
      iptables: renderIptables({ family: this.family, sets: st.sets, masq: ctx.masq, lbNoNodeAccess }),
      ...globalsOf(ctx.input.config),
      lbNoNodeAccess,
      masq: ctx.masq,
      rejected: st.rejected(),
      entryOwners,
    };
  }
}
