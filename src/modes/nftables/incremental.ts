// Incremental planning for partial syncs. Planning every service port on every sync made a
// one-endpoint change at 10,000 services cost 1.6 s of kproxy's own time; a port's
// fragment (plan.ts) depends only on its ServicePort, its Endpoint[] and the options, and
// the trackers replace those objects whenever they change, so a port is replanned only when
// one of them is not the object it was planned from, and the partial transaction compares
// only what the replanned ports touch. Pure.
//
// Memory: what is kept between syncs is each port's two input objects (which the trackers
// hold anyway) and an index of the table by name (TableIndex): which port owns each chain
// and affinity set, and which ports add each element of the shared sets and maps. The
// fragments themselves (rule text: ~3.5 KB a port with 5 endpoints) are planned again when a
// diff needs one: a changed port's previous fragment is planned from its previous objects
// (the same options give the same fragment), and the table as a whole only when a full
// transaction writes it.
import type { Endpoint, ProxyState, ServicePort } from '../../core/model.ts';
import { NO_ENDPOINTS } from '../../core/nodeview.ts';
import { assembleRuleset, planPortFragment, type NftPlanOptions, type PortFragment } from './plan.ts';
import { countObjects, type NftChain, type NftElement, type NftSet, type Ruleset, type TableLookup } from './ruleset.ts';

/** What a port was planned from: the trackers' objects (replaced whenever they change). */
interface PlannedPort {
  sp: ServicePort;
  eps: Endpoint[] | undefined;
}

/** Fragments of the ports that were replanned, added or removed, before and after. */
export interface TouchedFragments {
  /** port key → its previous fragment (none for an added port), in the order they were touched */
  old: Map<string, PortFragment>;
  /** port key → its new fragment (none for a removed port) */
  new: Map<string, PortFragment>;
  /** who owns the touched fragments' objects */
  owners: OwnerIndex;
}

/**
 * The objects a partial plan may have changed, each with its value in the previous table
 * (undefined: it was not there). Everything else is the same in both tables.
 */
export interface PreviousValues {
  chains: Map<string, NftChain | undefined>;
  /** the ports' own sets (affinity) */
  sets: Map<string, NftSet | undefined>;
  /** shared set name → element key → previous element */
  elements: Map<string, Map<string, NftElement | undefined>>;
}

export interface IncrementalPlan {
  /** the table after this plan, read by name */
  desired: TableLookup;
  /** the whole table, when every port was planned afresh (first plan, full sync, options changed); else null */
  table: Ruleset | null;
  /** the previous values of what a partial plan touched; null when everything was planned afresh */
  previous: PreviousValues | null;
  /**
   * The table before this plan, planned again from the ports' previous objects, when the
   * options changed on a partial plan (the whole table is diffed then); else null.
   */
  previousTable: Ruleset | null;
  /** service ports planned by this call */
  planned: number;
  /** who owns the objects of the plan: the touched ones on a partial plan, every one afresh */
  owners: Owners;
}

/** Several ports add the same element: their keys (in the order they were added), and whether they disagree about its verdict or comment. */
interface ElementRef {
  adders: string[];
  conflict: boolean;
}

/** A chain several ports name (a clash): the table holds their rules merged, in port key order. */
interface MergedChain {
  owners: string[];
  rules: number;
}

type FragmentOf = (portKey: string) => PortFragment;

/**
 * An element no port adds any more, in the middle of patch(): it keeps its place, as the
 * table's element does when a new fragment adds it again (the order of a set's elements is
 * the order a whole-table diff deletes them in).
 */
const GONE: ElementRef = Object.freeze({ adders: [], conflict: false }) as ElementRef;

/**
 * A port's fragment planned from a copy of its ServicePort: the caches keyed by the
 * ServicePort object (the node view's PortView, names.ts's chain names) are neither read nor
 * written. For a previous fragment whose ServicePort is still current (its endpoints changed):
 * planned through the caches it would replace the current port's view with the previous one,
 * and the node view's next sync would find a new view object for an unchanged port.
 */
function planAside(o: NftPlanOptions, sp: ServicePort, eps: Endpoint[] | undefined): PortFragment {
  return planPortFragment(o, { ...sp }, eps ?? NO_ENDPOINTS);
}

function chainOf(f: PortFragment, name: string): NftChain | undefined {
  for (const ch of f.chains) if (ch.name === name) return ch;
  return undefined;
}

function elementOf(f: PortFragment, set: string, key: string): NftElement | undefined {
  for (const e of f.elements) if (e.set === set && e.key === key) return e.el;
  return undefined;
}

function differs(a: NftElement | undefined, b: NftElement): boolean {
  return a === undefined || a.value !== b.value || a.comment !== b.comment;
}

/** Chain name → the port whose fragment has it, for some fragments (the touched ones). */
type ChainOwners = ReadonlyMap<string, string>;

function chainOwners(frags: ReadonlyMap<string, PortFragment>): ChainOwners {
  const out = new Map<string, string>();
  for (const [key, f] of frags) for (const { name } of f.chains) if (!out.has(name)) out.set(name, key);
  return out;
}

/**
 * The table's objects by name, with what each comes from, instead of the objects: the port
 * chains' names, an affinity set's owner, a shared element's adders. A value is the owner's
 * fragment's object, planned again when it is read. It changes exactly as the table of
 * fragments would (assemble: merged in port key order; patch: the old fragments out, the new
 * ones in), so the values it gives are the ones that table would hold.
 *
 * A port chain's name is made from its port's key and, for an endpoint chain, the endpoint
 * (names.ts), so exactly one port's fragment has it: its owner, found among the touched
 * fragments (a partial plan reads only those), else by looking through every port. Two ports
 * name the same chain only through a collision of the names' 40-bit hashes; the table then
 * holds their rules merged (`merged`).
 */
class TableIndex {
  /** the table without ports: base chains, shared sets and maps (without the ports' elements) */
  readonly fixed: Ruleset;
  /** the port chains' names (a Set: two-thirds of a Map to an owner; 70,000 at 10,000 Services) */
  private readonly chains = new Set<string>();
  /** chains several ports name (assembled merged), with their owners in port key order */
  private readonly merged = new Map<string, MergedChain>();
  private readonly sets = new Map<string, string>();
  /**
   * set → element key → the port that adds it, or the ports (several ports of one Service
   * share its ClusterIP); by set, so the fragments' key strings are the only ones kept. In the
   * table's order of the set's elements.
   */
  private readonly elements = new Map<string, Map<string, string | ElementRef>>();
  /** countObjects() of the table, kept up to date by patch() */
  objectCount = 0;

  /** `ports`: every planned port key (to find a chain's owner outside the touched fragments) */
  constructor(
    o: NftPlanOptions,
    private readonly ports: () => Iterable<string>,
  ) {
    this.fixed = assembleRuleset(o, []);
  }

  /** The port whose fragment has the chain: among `owners`, else any port's (only ever there through a hash collision). */
  private ownerOf(name: string, fragmentOf: FragmentOf, owners: ChainOwners): string | undefined {
    const hint = owners.get(name);
    if (hint !== undefined) return hint;
    for (const k of this.ports()) if (chainOf(fragmentOf(k), name)) return k;
    return undefined;
  }

  hasChain(name: string): boolean {
    return this.fixed.chains.has(name) || this.chains.has(name);
  }

  hasSet(name: string): boolean {
    return this.fixed.sets.has(name) || this.sets.has(name);
  }

  /** Whether the element is in the table (fixed elements aside). */
  private hasElement(set: string, key: string): boolean {
    const r = this.elements.get(set)?.get(key);
    return r !== undefined && r !== GONE;
  }

  /** The keys of a shared set's port elements, in the table's order. */
  elementKeys(set: string): Iterable<string> {
    return this.elements.get(set)?.keys() ?? [];
  }

  chain(name: string, fragmentOf: FragmentOf, owners: ChainOwners): NftChain | undefined {
    const fixed = this.fixed.chains.get(name);
    if (fixed) return fixed;
    if (!this.chains.has(name)) return undefined;
    const m = this.merged.get(name);
    if (m) {
      // merged as assembleRuleset's mergeFragment does: the first one's declaration, every rule
      const parts = m.owners.map((k) => chainOf(fragmentOf(k), name)!);
      return { ...parts[0], rules: parts.flatMap((ch) => ch.rules) };
    }
    const owner = this.ownerOf(name, fragmentOf, owners);
    return owner === undefined ? undefined : chainOf(fragmentOf(owner), name);
  }

  set(name: string, fragmentOf: FragmentOf): NftSet | undefined {
    const fixed = this.fixed.sets.get(name);
    if (fixed) return fixed;
    const owner = this.sets.get(name);
    return owner === undefined ? undefined : fragmentOf(owner).sets.get(name);
  }

  element(set: string, key: string, fragmentOf: FragmentOf): NftElement | undefined {
    const fixed = this.fixed.sets.get(set)?.elements.get(key);
    if (fixed) return fixed;
    const r = this.elements.get(set)?.get(key);
    if (r === undefined || r === GONE) return undefined;
    if (typeof r === 'string') return elementOf(fragmentOf(r), set, key);
    // Ports that agree give the same element. Ports that disagree: the table holds the one
    // assembled last, in port key order (patch() never changes such an element).
    const from = r.conflict ? r.adders.reduce((a, b) => (b > a ? b : a)) : r.adders[0];
    return elementOf(fragmentOf(from), set, key);
  }

  /** Whether ports disagree about the element. */
  private conflicted(set: string, key: string): boolean {
    const r = this.elements.get(set)?.get(key);
    return r !== undefined && typeof r !== 'string' && r.conflict;
  }

  /**
   * A port's fragment adds (d = 1) or no longer adds (d = -1) its elements; one no port adds
   * is GONE until sweep(). Whether ports disagree is decided against the element the first
   * adder gave (agreeing adders all give it); `fragmentOf` gives the fragment a port adds at
   * this point of the plan.
   */
  private addRefs(portKey: string, f: PortFragment, d: 1 | -1, fragmentOf: FragmentOf): void {
    for (const { set, key, el } of f.elements) {
      let refs = this.elements.get(set);
      if (!refs) this.elements.set(set, (refs = new Map()));
      const r = refs.get(key);
      if (d === 1) {
        if (r === undefined || r === GONE) refs.set(key, portKey);
        else if (typeof r === 'string') refs.set(key, { adders: [r, portKey], conflict: differs(elementOf(fragmentOf(r), set, key), el) });
        else {
          // a disagreement stays
          if (!r.conflict && differs(elementOf(fragmentOf(r.adders[0]), set, key), el)) r.conflict = true;
          r.adders.push(portKey);
        }
      } else if (r !== undefined && r !== GONE) {
        if (typeof r === 'string') refs.set(key, GONE);
        else {
          const i = r.adders.lastIndexOf(portKey);
          r.adders.splice(i >= 0 ? i : r.adders.length - 1, 1);
          if (r.adders.length === 0) refs.set(key, GONE);
        }
      }
    }
  }

  /** Drops the GONE elements (the table deletes them). */
  private sweep(present: ReadonlyMap<string, ReadonlyMap<string, boolean>>): void {
    for (const [set, keys] of present) {
      const refs = this.elements.get(set);
      if (refs) for (const key of keys.keys()) if (refs.get(key) === GONE) refs.delete(key);
    }
  }

  /**
   * The index of the table assembled from every port's fragment (assembleRuleset): chains
   * merged in port key order where names clash, an affinity set from the first port naming
   * it, elements in the order of the ports' keys (`keys`).
   */
  rebuild(keys: readonly string[], fragmentOf: FragmentOf): void {
    this.chains.clear();
    this.merged.clear();
    this.sets.clear();
    this.elements.clear();
    let n = countObjects(this.fixed);
    keys.forEach((k, i) => {
      const f = fragmentOf(k);
      for (const ch of f.chains) {
        if (!this.chains.has(ch.name)) {
          this.chains.add(ch.name);
          n += 1 + ch.rules.length;
          continue;
        }
        n += ch.rules.length;
        const m = this.merged.get(ch.name);
        if (m) {
          m.owners.push(k);
          m.rules += ch.rules.length;
          continue;
        }
        const first = keys.slice(0, i).find((p) => chainOf(fragmentOf(p), ch.name))!;
        this.merged.set(ch.name, { owners: [first, k], rules: chainOf(fragmentOf(first), ch.name)!.rules.length + ch.rules.length });
      }
      for (const [name, s] of f.sets) {
        if (this.sets.has(name)) continue;
        this.sets.set(name, k);
        n += 1 + s.elements.size;
      }
    });
    for (const k of keys) this.addRefs(k, fragmentOf(k), 1, fragmentOf);
    for (const refs of this.elements.values()) n += refs.size;
    this.objectCount = n;
  }

  /**
   * The values, in the table as it is, of everything the touched fragments name (before
   * patch() changes it). `fragmentOf` gives each port's fragment as the table has it.
   */
  previousValues(touched: TouchedFragments, fragmentOf: FragmentOf): PreviousValues {
    const out: PreviousValues = { chains: new Map(), sets: new Map(), elements: new Map() };
    const owners = chainOwners(touched.old);
    for (const f of [...touched.old.values(), ...touched.new.values()]) {
      for (const { name } of f.chains) if (!out.chains.has(name)) out.chains.set(name, this.chain(name, fragmentOf, owners));
      for (const s of f.sets.keys()) if (!out.sets.has(s)) out.sets.set(s, this.set(s, fragmentOf));
      for (const { set, key } of f.elements) {
        let m = out.elements.get(set);
        if (!m) out.elements.set(set, (m = new Map()));
        if (!m.has(key)) m.set(key, this.element(set, key, fragmentOf));
      }
    }
    return out;
  }

  /**
   * Takes the old fragments out of the table and puts the new ones in. Returns false where
   * ports disagree about a shared object (two Services adding the same element with different
   * verdicts, or a chain name clash): which one wins then depends on the port order, so the
   * caller rebuilds the whole index. `before` gives the fragments the table holds before,
   * `after` those it holds after.
   */
  patch(touched: TouchedFragments, before: FragmentOf, after: FragmentOf): boolean {
    const present = new Map<string, Map<string, boolean>>();
    for (const f of [...touched.old.values(), ...touched.new.values()]) {
      for (const { set, key } of f.elements) {
        let m = present.get(set);
        if (!m) present.set(set, (m = new Map()));
        if (!m.has(key)) m.set(key, this.hasElement(set, key));
      }
    }
    for (const [key, f] of touched.old) this.addRefs(key, f, -1, after);
    for (const [key, f] of touched.new) this.addRefs(key, f, 1, after);
    this.sweep(present);
    for (const [set, keys] of present) for (const key of keys.keys()) if (this.conflicted(set, key)) return false;
    const removed = new Set<string>();
    for (const f of touched.old.values()) for (const { name } of f.chains) removed.add(name);
    const added = new Set<string>();
    for (const f of touched.new.values()) {
      for (const { name } of f.chains) {
        if (added.has(name) || (this.hasChain(name) && !removed.has(name))) return false;
        added.add(name);
      }
    }
    let n = this.objectCount;
    for (const f of touched.old.values()) {
      for (const ch of f.chains) {
        const m = this.merged.get(ch.name);
        if (!this.chains.delete(ch.name)) continue;
        // the table's chain: this fragment's own (its name's only owner), or the merged one
        n -= 1 + (m ? m.rules : ch.rules.length);
        this.merged.delete(ch.name);
      }
      for (const name of f.sets.keys()) {
        const set = this.set(name, before);
        if (set === undefined || !this.sets.delete(name)) continue;
        n -= 1 + set.elements.size;
      }
    }
    for (const [key, f] of touched.new) {
      for (const ch of f.chains) {
        this.chains.add(ch.name);
        n += 1 + ch.rules.length;
      }
      for (const [name, set] of f.sets) {
        if (this.hasSet(name)) continue;
        this.sets.set(name, key);
        n += 1 + set.elements.size;
      }
    }
    // An element stays while another port still adds it (with the same content).
    for (const [set, keys] of present) for (const [key, was] of keys) n += Number(this.hasElement(set, key)) - Number(was);
    this.objectCount = n;
    return true;
  }

  /** The table as a TableLookup, each value from `fragmentOf`'s fragment of its owner (a chain's among `owners` first). */
  lookup(fragmentOf: FragmentOf, owners: ChainOwners = new Map()): TableLookup {
    const { family, table } = this.fixed;
    return {
      family,
      table,
      hasChain: (name) => this.hasChain(name),
      chain: (name) => this.chain(name, fragmentOf, owners),
      hasSet: (name) => this.hasSet(name),
      set: (name) => this.set(name, fragmentOf),
      element: (set, key) => this.element(set, key, fragmentOf),
    };
  }
}

/** A plan's inputs: enough to plan its table again. */
interface PlanInputs {
  cache: ReadonlyMap<string, PlannedPort>;
  options: NftPlanOptions;
  keys: readonly string[];
}

export class IncrementalPlanner {
  private cache = new Map<string, PlannedPort>();
  /**
   * The inputs of the table last committed (a transaction applied it), while a plan afresh
   * since has not been: a failed full sync leaves the kernel with that table.
   */
  private held: PlanInputs | null = null;
  private options: NftPlanOptions | null = null;
  private optionsKey: string | null = null;
  /** planned port keys in order, reused while no port is added or removed */
  private keys: string[] = [];
  /** service ports planned since creation (instrumentation for tests) */
  plannedTotal = 0;
  /** the table last planned, by name */
  private index: TableIndex | null = null;
  /**
   * Every planned port key, for the index. Made here, not where the index is: a closure keeps
   * its whole scope's context alive (there, every fragment of a full plan).
   */
  private readonly portKeys = (): Iterable<string> => this.cache.keys();

  /**
   * countObjects() of the table last planned, kept up to date by patches: counting 10^5
   * objects on every partial sync was a third of kproxy's own time for a one-Service change
   * at 10,000 Services
   */
  get objectCount(): number {
    return this.index?.objectCount ?? 0;
  }

  /** A port's fragment planned again from the objects it was planned from (the same options give the same fragment). */
  private fragmentOf(key: string): PortFragment {
    const c = this.cache.get(key)!;
    return planPortFragment(this.options!, c.sp, c.eps ?? NO_ENDPOINTS);
  }

  /** Each port's fragment, planned again at most once while `fixed` has none for it. */
  private memo(fixed: ReadonlyMap<string, PortFragment>): FragmentOf {
    const planned = new Map<string, PortFragment>();
    return (key) => {
      let f = fixed.get(key) ?? planned.get(key);
      if (!f) planned.set(key, (f = this.fragmentOf(key)));
      return f;
    };
  }

  /**
   * `changedServices` null plans every port afresh; otherwise ports of those services, and
   * any port whose ServicePort or Endpoint[] object is not the one it was planned from, are
   * replanned. `portKeys`, when given with `changedServices`: every port key that may have
   * changed since the last plan (the changed Services' keys before and after: the sharded
   * proxier's ShardStates knows them); only those are looked at, instead of every port of the
   * state.
   */
  plan(state: ProxyState, o: NftPlanOptions, changedServices: ReadonlySet<string> | null, portKeys?: ReadonlySet<string>): IncrementalPlan {
    const optionsKey = JSON.stringify(o);
    const fresh = changedServices === null || optionsKey !== this.optionsKey || !this.index;
    if (fresh) {
      // The options changed on a partial plan: the whole table is diffed against the one before
      // (planned aside when the node facts changed: the node view holds the new ones' views).
      const previousTable = changedServices !== null && this.index ? this.lastTable(JSON.stringify(o.node) !== JSON.stringify(this.options!.node)) : null;
      return { ...this.planAfresh(state, o), previousTable };
    }
    const index = this.index!;
    const touched: TouchedFragments = { old: new Map(), new: new Map(), owners: new OwnerIndex() };
    let planned = 0;
    let keysChanged = false;
    let seen = 0;
    const leave = (key: string, c: PlannedPort): void => {
      this.cache.delete(key);
      const frag = planPortFragment(o, c.sp, c.eps ?? NO_ENDPOINTS);
      touched.old.set(key, frag);
      touched.owners.add(key, frag);
      keysChanged = true;
    };
    const replan = (key: string, sp: ServicePort): void => {
      const eps = state.endpoints.get(key);
      const c = this.cache.get(key);
      if (c && c.sp === sp && c.eps === eps && !changedServices.has(sp.serviceKey)) return;
      const old = !c ? undefined : c.sp === sp && c.eps !== eps ? planAside(o, c.sp, c.eps) : planPortFragment(o, c.sp, c.eps ?? NO_ENDPOINTS);
      const frag = planPortFragment(o, sp, eps ?? NO_ENDPOINTS);
      planned++;
      this.cache.set(key, { sp, eps });
      if (old) touched.old.set(key, old);
      else keysChanged = true;
      touched.new.set(key, frag);
      touched.owners.add(key, frag);
      if (old) touched.owners.add(key, old);
    };
    if (portKeys) {
      // O(changed): only the given keys; one that left the state leaves the table
      for (const key of portKeys) {
        const sp = state.services.get(key);
        if (sp && sp.family === o.family) {
          replan(key, sp);
          continue;
        }
        const c = this.cache.get(key);
        if (c) leave(key, c);
      }
      seen = this.cache.size;
    } else {
      for (const [key, sp] of state.services) {
        if (sp.family !== o.family) continue;
        seen++;
        replan(key, sp);
      }
    }
    if (this.cache.size > seen) {
      // Ports were removed: their fragments leave the table.
      for (const [key, c] of [...this.cache]) {
        const sp = state.services.get(key);
        if (!sp || sp.family !== o.family) leave(key, c);
      }
    }
    if (keysChanged) this.keys = [...this.cache.keys()].sort();
    this.plannedTotal += planned;
    // Before: a touched port's previous fragment (none for an added port); after: its new one
    // (none for a removed port). Every other port's is the same in both, planned again if read.
    const after = this.memo(touched.new);
    const before = this.memo(touched.old);
    const previous = index.previousValues(touched, before);
    if (!index.patch(touched, before, after)) index.rebuild(this.keys, after);
    return { desired: index.lookup(after, chainOwners(touched.new)), table: null, previous, previousTable: null, planned, owners: touched.owners };
  }

  /** Every port planned: the whole table, its index and its owners. */
  private planAfresh(state: ProxyState, o: NftPlanOptions): Omit<IncrementalPlan, 'previousTable'> {
    if (this.index && !this.held) this.held = { cache: this.cache, options: this.options!, keys: this.keys };
    this.cache = new Map();
    this.options = o;
    this.optionsKey = JSON.stringify(o);
    const frags = new Map<string, PortFragment>();
    const owners = new OwnerIndex();
    for (const [key, sp] of state.services) {
      if (sp.family !== o.family) continue;
      const eps = state.endpoints.get(key);
      const frag = planPortFragment(o, sp, eps ?? NO_ENDPOINTS);
      this.cache.set(key, { sp, eps });
      frags.set(key, frag);
      owners.add(key, frag);
    }
    this.plannedTotal += frags.size;
    this.keys = [...this.cache.keys()].sort();
    const table = assembleRuleset(o, this.keys.map((k) => frags.get(k)!));
    const index = (this.index = new TableIndex(o, this.portKeys));
    const fragmentOf = (key: string) => frags.get(key)!;
    index.rebuild(this.keys, fragmentOf);
    // The lookup answers from the index: the fragments go once the full transaction is written.
    return { desired: index.lookup(this.memo(new Map())), table, previous: null, planned: frags.size, owners };
  }

  /** The ServicePort planned under a port key (to name the Service of a refused operation). */
  servicePort(key: string): ServicePort | undefined {
    return this.cache.get(key)?.sp;
  }

  /** The fragments in port key order, planned again (`aside`: planAside): assembled, they give the table in planRuleset's order. */
  fragments(aside = false): PortFragment[] {
    return this.keys.map((k) => {
      if (!aside) return this.fragmentOf(k);
      const c = this.cache.get(k)!;
      return planAside(this.options!, c.sp, c.eps);
    });
  }

  /** The table last planned, planned again from every port's objects (the table before an options change). */
  assembled(aside = false): Ruleset {
    return assembleRuleset(this.options!, this.fragments(aside));
  }

  /**
   * The table last planned, its shared sets' elements in the order the table has them (a
   * whole-table diff deletes the ones that go in that order).
   */
  private lastTable(aside: boolean): Ruleset {
    const rs = this.assembled(aside);
    for (const set of rs.sets.values()) {
      const keys = [...this.index!.elementKeys(set.name)];
      if (keys.length === 0) continue;
      const els = new Map<string, NftElement>();
      for (const k of keys) els.set(k, set.elements.get(k)!);
      for (const [k, el] of set.elements) if (!els.has(k)) els.set(k, el);
      set.elements = els;
    }
    return rs;
  }

  /** The table last planned is in the kernel. */
  committed(): void {
    this.held = null;
  }

  /**
   * The table the kernel holds, planned again: the last one planned, or after a plan afresh
   * that was not committed (a failed full sync), the one before it (planned aside: its
   * objects may be replaced ones).
   */
  appliedTable(): Ruleset {
    const h = this.held;
    if (!h) return this.assembled();
    return assembleRuleset(h.options, h.keys.map((k) => planAside(h.options, h.cache.get(k)!.sp, h.cache.get(k)!.eps)));
  }
}

/** Which service port (its key) planned an object; undefined for the table's fixed part. */
export interface Owners {
  chain(name: string): string | undefined;
  set(name: string): string | undefined;
  element(set: string, key: string): string | undefined;
}

/**
 * The service port key of each chain, set and element of some fragments (names are unique
 * per port; an element shared by several ports names the first one added).
 */
export class OwnerIndex implements Owners {
  private readonly chains = new Map<string, string>();
  private readonly sets = new Map<string, string>();
  private readonly elements = new Map<string, Map<string, string>>();

  add(portKey: string, f: PortFragment): void {
    for (const { name } of f.chains) if (!this.chains.has(name)) this.chains.set(name, portKey);
    for (const name of f.sets.keys()) if (!this.sets.has(name)) this.sets.set(name, portKey);
    for (const { set, key } of f.elements) {
      let m = this.elements.get(set);
      if (!m) this.elements.set(set, (m = new Map()));
      if (!m.has(key)) m.set(key, portKey);
    }
  }

  chain(name: string): string | undefined {
    return this.chains.get(name);
  }

  set(name: string): string | undefined {
    return this.sets.get(name);
  }

  element(set: string, key: string): string | undefined {
    return this.elements.get(set)?.get(key);
  }
}
