// Incremental planning for partial syncs. Planning every service port on every sync made a
// one-endpoint change at 10,000 services cost 1.6 s of kproxy's own time; a port's
// fragment (plan.ts) depends only on its ServicePort, its Endpoint[] and the options, and
// the trackers replace those objects whenever they change, so a fragment is reused while
// both are the same objects and the options are equal. The table is then assembled from
// the fragments (cheap Map inserts, no hashing or rule text), and the partial transaction
// compares only what the replanned ports touch. Pure.
import type { Endpoint, ProxyState, ServicePort } from '../../core/model.ts';
import { NO_ENDPOINTS } from '../../core/nodeview.ts';
import { assembleRuleset, planPortFragment, type NftPlanOptions, type PortFragment } from './plan.ts';
import { countObjects, type NftChain, type NftElement, type NftSet, type Ruleset } from './ruleset.ts';

interface ElementRef {
  n: number;
  el: NftElement;
  conflict: boolean;
}

function isRef(r: ElementRef | NftElement): r is ElementRef {
  return 'n' in r;
}

function isConflict(r: ElementRef | NftElement | undefined): boolean {
  return r !== undefined && isRef(r) && r.conflict;
}

interface CachedPort {
  sp: ServicePort;
  eps: Endpoint[] | undefined;
  frag: PortFragment;
}

/** Fragments of the ports that were replanned, added or removed, before and after. */
export interface TouchedFragments {
  old: PortFragment[];
  new: PortFragment[];
  /** who owns the touched fragments' objects */
  owners: OwnerIndex;
}

/**
 * The objects a partial plan may have changed, each with its value in the previous table
 * (undefined: it was not there). Everything else is the same object in both tables.
 */
export interface PreviousValues {
  chains: Map<string, NftChain | undefined>;
  /** the ports' own sets (affinity) */
  sets: Map<string, NftSet | undefined>;
  /** shared set name → element key → previous element */
  elements: Map<string, Map<string, NftElement | undefined>>;
}

export interface IncrementalPlan {
  /**
   * The table. On a partial plan it is the previous table changed in place (copying 10^5
   * map entries per sync costs more than the planning saves), so a caller that needs the
   * previous state keeps `previous`, not the old object.
   */
  desired: Ruleset;
  /** null when everything was planned afresh (first plan, full sync, options changed) */
  previous: PreviousValues | null;
  /** service ports planned by this call */
  planned: number;
  /** who owns the objects a partial plan touched (null with `previous`: allOwners()) */
  owners: Owners | null;
}

export class IncrementalPlanner {
  private readonly cache = new Map<string, CachedPort>();
  private optionsKey: string | null = null;
  /** planned port keys in order, reused while no port is added or removed */
  private keys: string[] = [];
  /** service ports planned since creation (instrumentation for tests) */
  plannedTotal = 0;
  /** the table last returned; patched, not rebuilt, by the next partial plan */
  private last: Ruleset | null = null;
  /**
   * countObjects(last), kept up to date by patch(): counting 10^5 objects on every partial
   * sync was a third of kproxy's own time for a one-Service change at 10,000 Services
   */
  objectCount = 0;
  /** incremented by every plan(): tells a caller whether fragments() is still what it applied */
  generation = 0;
  /**
   * set → elementKey → how many fragments add it (ports of one Service share a ClusterIP),
   * and whether they disagree about its verdict or comment (by set, not by "set\0key": the
   * fragments' key strings are reused, no second key string per element)
   */
  private readonly elementRefs = new Map<string, Map<string, ElementRef | NftElement>>();

  private ref(set: string, key: string): ElementRef | NftElement | undefined {
    return this.elementRefs.get(set)?.get(key);
  }

  /**
   * `changedServices` null plans every port afresh; otherwise ports of those services, and
   * any port whose ServicePort or Endpoint[] object is not the cached one, are replanned.
   * `portKeys`, when given with `changedServices`: every port key that may have changed since
   * the last plan (the changed Services' keys before and after: the sharded proxier's
   * ShardStates knows them); only those are looked at, instead of every port of the state.
   */
  plan(state: ProxyState, o: NftPlanOptions, changedServices: ReadonlySet<string> | null, portKeys?: ReadonlySet<string>): IncrementalPlan {
    this.generation++;
    const optionsKey = JSON.stringify(o);
    const fresh = changedServices === null || optionsKey !== this.optionsKey;
    if (fresh) this.cache.clear();
    this.optionsKey = optionsKey;

    const touched: TouchedFragments = { old: [], new: [], owners: new OwnerIndex() };
    let planned = 0;
    let keysChanged = fresh;
    let seen = 0;
    const replan = (key: string, sp: ServicePort): void => {
      const eps = state.endpoints.get(key);
      const c = this.cache.get(key);
      if (c && c.sp === sp && c.eps === eps && !changedServices?.has(sp.serviceKey)) return;
      const frag = planPortFragment(o, sp, eps ?? NO_ENDPOINTS);
      planned++;
      this.cache.set(key, { sp, eps, frag });
      if (c) touched.old.push(c.frag);
      else keysChanged = true;
      touched.new.push(frag);
      touched.owners.add(key, frag);
      if (c) touched.owners.add(key, c.frag);
    };
    if (!fresh && portKeys) {
      // O(changed): only the given keys; one that left the state leaves the table
      for (const key of portKeys) {
        const sp = state.services.get(key);
        if (sp && sp.family === o.family) {
          replan(key, sp);
          continue;
        }
        const c = this.cache.get(key);
        if (!c) continue;
        this.cache.delete(key);
        touched.old.push(c.frag);
        touched.owners.add(key, c.frag);
        keysChanged = true;
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
      keysChanged = true;
      for (const [key, c] of this.cache) {
        const sp = state.services.get(key);
        if (sp && sp.family === o.family) continue;
        this.cache.delete(key);
        touched.old.push(c.frag);
        touched.owners.add(key, c.frag);
      }
    }
    if (keysChanged) this.keys = [...this.cache.keys()].sort();
    this.plannedTotal += planned;
    if (fresh || !this.last) {
      this.assemble(o);
      return { desired: this.last!, previous: null, planned, owners: null };
    }
    const previous = previousValues(this.last, touched);
    if (!this.patch(this.last, touched)) this.assemble(o);
    return { desired: this.last!, previous, planned, owners: touched.owners };
  }

  private assemble(o: NftPlanOptions): void {
    this.last = assembleRuleset(o, this.fragments());
    this.objectCount = countObjects(this.last);
    this.countElementRefs();
  }

  /** The ServicePort planned under a port key (to name the Service of a refused operation). */
  servicePort(key: string): ServicePort | undefined {
    return this.cache.get(key)?.sp;
  }

  /** Who owns each object of the whole table (a full transaction's operations). */
  allOwners(): Owners {
    const index = new OwnerIndex();
    for (const [key, c] of this.cache) index.add(key, c.frag);
    return index;
  }

  /** The fragments in port key order: assembled, they give the table in planRuleset's order. */
  fragments(): PortFragment[] {
    return this.keys.map((k) => this.cache.get(k)!.frag);
  }

  private countElementRefs(): void {
    this.elementRefs.clear();
    for (const c of this.cache.values()) this.addRefs(c.frag, 1);
  }

  private addRefs(f: PortFragment, d: 1 | -1): void {
    for (const { set, key, el } of f.elements) {
      let refs = this.elementRefs.get(set);
      if (!refs) this.elementRefs.set(set, (refs = new Map()));
      const r = refs.get(key);
      // One adder (nearly every element): the element itself stands for { n: 1, el, conflict: false }.
      if (d === 1) {
        if (!r) refs.set(key, el);
        else if (!isRef(r)) refs.set(key, { n: 2, el: r, conflict: r.value !== el.value || r.comment !== el.comment });
        else {
          r.n++;
          if (r.el.value !== el.value || r.el.comment !== el.comment) r.conflict = true;
        }
      } else if (r && (!isRef(r) || --r.n === 0)) refs.delete(key);
    }
  }

  /**
   * Takes the old fragments out of the table and puts the new ones in, in place. Object
   * order then differs from a fresh assembly (new chains come last), which nft does not
   * care about; dumps use fragments(). Returns false, having changed nothing in the table,
   * where ports disagree about a shared object (two Services adding the same element with
   * different verdicts, or a chain name clash): which one wins then depends on the port
   * order, so the caller assembles the whole table.
   */
  private patch(rs: Ruleset, touched: TouchedFragments): boolean {
    for (const f of touched.old) this.addRefs(f, -1);
    for (const f of touched.new) this.addRefs(f, 1);
    for (const f of [...touched.old, ...touched.new]) {
      for (const { set, key } of f.elements) if (isConflict(this.ref(set, key))) return false;
    }
    const removed = new Set<string>();
    for (const f of touched.old) for (const { name } of f.chains) removed.add(name);
    const added = new Set<string>();
    for (const f of touched.new) {
      for (const { name } of f.chains) {
        if (added.has(name) || (rs.chains.has(name) && !removed.has(name))) return false;
        added.add(name);
      }
    }
    let n = this.objectCount;
    for (const f of touched.old) {
      for (const { name } of f.chains) {
        const ch = rs.chains.get(name);
        if (ch && rs.chains.delete(name)) n -= 1 + ch.rules.length;
      }
      for (const name of f.sets.keys()) {
        const set = rs.sets.get(name);
        if (set && rs.sets.delete(name)) n -= 1 + set.elements.size;
      }
      // Still added by another port (with the same content): it stays.
      for (const { set, key } of f.elements) if (!this.ref(set, key) && rs.sets.get(set)!.elements.delete(key)) n--;
    }
    for (const f of touched.new) {
      for (const ch of f.chains) {
        const name = ch.name;
        const had = rs.chains.get(name);
        if (had) n -= 1 + had.rules.length;
        rs.chains.set(name, ch);
        n += 1 + ch.rules.length;
      }
      for (const [name, set] of f.sets) {
        if (rs.sets.has(name)) continue;
        rs.sets.set(name, set);
        n += 1 + set.elements.size;
      }
      for (const { set, key, el } of f.elements) {
        const target = rs.sets.get(set)!.elements;
        if (!target.has(key)) n++;
        target.set(key, el);
      }
    }
    this.objectCount = n;
    return true;
  }
}

/** The previous values of everything the touched fragments name. */
function previousValues(rs: Ruleset, touched: TouchedFragments): PreviousValues {
  const out: PreviousValues = { chains: new Map(), sets: new Map(), elements: new Map() };
  for (const f of [...touched.old, ...touched.new]) {
    for (const { name } of f.chains) out.chains.set(name, rs.chains.get(name));
    for (const s of f.sets.keys()) out.sets.set(s, rs.sets.get(s));
    for (const { set, key } of f.elements) {
      let m = out.elements.get(set);
      if (!m) out.elements.set(set, (m = new Map()));
      m.set(key, rs.sets.get(set)?.elements.get(key));
    }
  }
  return out;
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
