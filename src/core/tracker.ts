// Change trackers, as upstream's ServiceChangeTracker / EndpointsChangeTracker: they keep
// {previous, current} per Service since the last sync, drop no-op changes (an update that
// ends where it started), and report exactly which services changed, which is what makes
// partial syncs possible. Pure: no I/O.
//
// Every object is validated here (src/core/validate.ts) before anything reads it: this is the
// one place every source passes through. An invalid new version of an object counts as a
// delete of the old one, not as "keep the last good version": the state then holds exactly
// the valid objects the source currently has, which is what a restart, `render` and `trace`
// (that only ever see the current objects) compute too. Rules that depend on history would
// differ between a long-running kproxy and a fresh one, and the warning says what to fix.
import { isDeepStrictEqual } from 'node:util';
import type { IPFamily } from './ip.ts';
import type { Endpoint, ProxyState, ServicePort } from './model.ts';
import { endpointsOfSlices, lastChangeTriggerTime, servicePortsOf, sliceServiceKey } from './convert.ts';
import { type K8sEndpointSlice, type Report } from './api.ts';
import { Boundary, objectIdentity, type BoundaryOptions } from './validate.ts';

interface Change<T> {
  previous: T;
  current: T;
}

// A Service's ports, and its endpoint lists per port, are kept as plain arrays, not a Map per
// Service and per slice: a small Map costs ~180 bytes, and at 10,000 Services with one slice
// each there were 30,000 of them (~5 MiB). Order is as the objects give it (spec order, slice
// port order), as a Map's insertion order was; two versions are compared as a Map was, order
// aside (samePorts, sameLists).

const NO_PORTS: readonly ServicePort[] = Object.freeze([]);

/** Whether two lists of a Service's ports hold the same ports, in any order. */
function samePorts(a: readonly ServicePort[], b: readonly ServicePort[]): boolean {
  if (a.length !== b.length) return false;
  return a.every((p) => {
    const q = b.find((x) => x.key === p.key);
    return q !== undefined && isDeepStrictEqual(p, q);
  });
}

/**
 * Endpoint lists by servicePortKey, flat: `[key, list, key, list, ...]`, each key once.
 * One port (the usual case) is one small array instead of a Map.
 */
export type PortLists = ReadonlyArray<string | Endpoint[]>;

const NO_LISTS: PortLists = Object.freeze([]);

/**
 * An array kept for long is allocated at its exact length: one grown by push has room for 16
 * more elements (~130 bytes of nothing, on each of 10,000 Services' arrays).
 */
function portListsOf(byPort: Map<string, Endpoint[]>): PortLists {
  if (byPort.size === 0) return NO_LISTS;
  const out = new Array<string | Endpoint[]>(byPort.size * 2);
  let i = 0;
  for (const [k, list] of byPort) {
    out[i++] = k;
    out[i++] = list;
  }
  return out;
}

/** Calls fn for each (servicePortKey, list) of a PortLists, in order. */
function forEachList(lists: PortLists, fn: (key: string, list: Endpoint[]) => void): void {
  for (let i = 0; i < lists.length; i += 2) fn(lists[i] as string, lists[i + 1] as Endpoint[]);
}

/** The list of one port in a PortLists, or undefined. */
function listOf(lists: PortLists, key: string): Endpoint[] | undefined {
  for (let i = 0; i < lists.length; i += 2) if (lists[i] === key) return lists[i + 1] as Endpoint[];
  return undefined;
}

/** Whether two PortLists hold the same lists by port, in any order of the ports. */
function sameLists(a: PortLists, b: PortLists): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i += 2) {
    const other = listOf(b, a[i] as string);
    if (other === undefined || !isDeepStrictEqual(a[i + 1], other)) return false;
  }
  return true;
}

export class ServiceChangeTracker {
  private readonly pending = new Map<string, Change<readonly ServicePort[]>>();
  /** the ports each service had when last applied, so "previous" is known for a first change */
  private readonly applied = new Map<string, readonly ServicePort[]>();

  constructor(
    private readonly family: IPFamily,
    private readonly report: Report = () => {},
    private readonly boundary: Boundary = new Boundary(report),
  ) {}

  /**
   * Records an add (old null), update, or delete (new null). Returns whether a change is
   * pending for it. Takes any value: an invalid new version is reported and acts as a delete.
   */
  update(oldSvc: unknown, newSvc: unknown): boolean {
    const valid = newSvc ? this.boundary.service(newSvc) : null;
    const key = objectIdentity(newSvc) ?? objectIdentity(oldSvc);
    if (!key) return false;
    let change = this.pending.get(key);
    if (!change) {
      change = { previous: this.applied.get(key) ?? NO_PORTS, current: NO_PORTS };
      this.pending.set(key, change);
    }
    const ports = valid ? servicePortsOf(valid, this.family, this.report) : [];
    // kept until the next change: at its exact length (portListsOf)
    change.current = ports.length ? ports.slice() : NO_PORTS;
    if (samePorts(change.previous, change.current)) {
      this.pending.delete(key);
      return false;
    }
    return true;
  }

  pendingCount(): number {
    return this.pending.size;
  }

  /** The servicePortKeys a service ("ns/name") has in the state since the last apply. */
  portKeysOf(serviceKey: string): Iterable<string> {
    return (this.applied.get(serviceKey) ?? NO_PORTS).map((p) => p.key);
  }

  /** Applies pending changes to state.services; returns the service keys ("ns/name") that changed. */
  apply(state: ProxyState): Set<string> {
    const changed = new Set<string>();
    for (const [svcKey, change] of this.pending) {
      for (const p of change.previous) state.services.delete(p.key);
      for (const p of change.current) state.services.set(p.key, p);
      // keyed by the ports' own serviceKey: the same text, one string less per Service
      if (change.current.length) this.applied.set(change.current[0].serviceKey, change.current);
      else this.applied.delete(svcKey);
      changed.add(svcKey);
    }
    this.pending.clear();
    return changed;
  }
}

/** One slice's endpoints by servicePortKey (endpointsOfSlices of that slice alone), and its "ns/name". */
interface SliceEndpoints {
  id: string;
  ports: PortLists;
}

/** A Service's slices: the one slice itself (the usual case: no array per Service), or several. */
type ServiceSlices = SliceEndpoints | SliceEndpoints[];

function slicesOf(s: ServiceSlices | undefined): readonly SliceEndpoints[] {
  return s === undefined ? [] : Array.isArray(s) ? s : [s];
}

/** slicesOf's inverse: the one slice itself, several as an array, none as undefined. */
function asServiceSlices(list: SliceEndpoints[]): ServiceSlices | undefined {
  return list.length === 0 ? undefined : list.length === 1 ? list[0] : list;
}

/** A slice's name: its "ns/name" after the namespace (a namespace holds no "/"). */
function sliceName(id: string): string {
  return id.slice(id.indexOf('/') + 1);
}

/**
 * A Service's endpoints from its slices' own, exactly as endpointsOfSlices of all its slices:
 * slices in name order, a duplicate address collapses to its first copy unless a later one
 * is local (each slice's lists already collapsed its own duplicates the same way), lists
 * sorted by key. One slice: its lists as they are.
 */
function mergeSlices(entries: readonly SliceEndpoints[]): PortLists {
  if (entries.length === 0) return NO_LISTS;
  if (entries.length === 1) return entries[0].ports;
  const byPort = new Map<string, Map<string, Endpoint>>();
  const named = entries.map((e) => ({ name: sliceName(e.id), ports: e.ports }));
  for (const entry of named.sort((a, b) => a.name.localeCompare(b.name))) {
    forEachList(entry.ports, (k, list) => {
      let set = byPort.get(k);
      if (!set) byPort.set(k, (set = new Map()));
      for (const e of list) if (!set.has(e.key) || e.isLocal) set.set(e.key, e);
    });
  }
  const out = new Map<string, Endpoint[]>();
  for (const [k, set] of byPort) out.set(k, [...set.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)));
  return portListsOf(out);
}

export class EndpointsChangeTracker {
  /**
   * What each valid EndpointSlice contributes, by service key: upstream's EndpointSliceCache,
   * kept as each slice's own endpoints per service port (not the slice: as objects 24 MiB at
   * 10,000 slices × 5 endpoints, as JSON text 11 MiB). A Service with one slice uses these
   * very lists; several slices are merged as endpointsOfSlices does.
   */
  private readonly slices = new Map<string, ServiceSlices>();
  /** slice "ns/name" → the service key it is filed under, so a relabelled slice leaves its old service */
  private readonly sliceService = new Map<string, string>();
  private readonly applied = new Map<string, PortLists>();
  private readonly pending = new Map<string, Change<PortLists>>();
  /**
   * The last-change-trigger-times of the pending changes, by service key: upstream's
   * lastChangeTriggerTimes, from which network_programming_duration_seconds is measured once
   * the sync that programs them succeeds. A change that turns out a no-op drops its times.
   */
  private readonly triggerTimes = new Map<string, number[]>();
  private appliedTriggerTimes: number[] = [];

  constructor(
    private readonly family: IPFamily,
    private nodeName: string,
    private readonly report: Report = () => {},
    private readonly boundary: Boundary = new Boundary(report),
  ) {}

  /**
   * Records an add, update or delete of a slice. Takes any value: an invalid new version is
   * reported and acts as a delete. The old object is used only for its identity: what the
   * slice contributed is what this tracker filed, whatever the source says it was.
   */
  update(oldSlice: unknown, newSlice: unknown): boolean {
    const valid = newSlice ? this.boundary.endpointSlice(newSlice) : null;
    const id = objectIdentity(newSlice) ?? objectIdentity(oldSlice);
    if (!id) return false;
    const svcKey = valid ? sliceServiceKey(valid) : null;
    const before = this.sliceService.get(id);
    if (before !== undefined) {
      const kept = asServiceSlices(slicesOf(this.slices.get(before)).filter((e) => e.id !== id));
      if (kept) this.slices.set(before, kept);
      else this.slices.delete(before);
      this.sliceService.delete(id);
    }
    if (valid && svcKey) {
      const entry = { id, ports: portListsOf(endpointsOfSlices([valid], this.family, this.nodeName, this.report)) };
      const bySlice = this.slices.get(svcKey);
      this.slices.set(svcKey, asServiceSlices([...slicesOf(bySlice), entry])!);
      this.sliceService.set(id, svcKey);
    }
    let pending = false;
    if (before !== undefined && before !== svcKey) pending = this.recompute(before);
    if (svcKey) pending = this.recompute(svcKey) || pending;
    this.noteTriggerTime(valid, svcKey ?? before);
    return pending;
  }

  /**
   * As upstream's EndpointSliceUpdate: a deleted slice's trigger time is that of its last
   * update, not of the deletion, so a deletion drops the service's times instead.
   */
  private noteTriggerTime(valid: K8sEndpointSlice | null, svcKey: string | undefined): void {
    if (svcKey === undefined || !this.pending.has(svcKey)) return;
    const t = valid ? lastChangeTriggerTime(valid) : null;
    if (!valid) this.triggerTimes.delete(svcKey);
    else if (t !== null) this.triggerTimes.set(svcKey, [...(this.triggerTimes.get(svcKey) ?? []), t]);
  }

  /** The trigger times of the changes the last apply() applied (each returned once). */
  takeTriggerTimes(): number[] {
    const out = this.appliedTriggerTimes;
    this.appliedTriggerTimes = [];
    return out;
  }

  private recompute(svcKey: string): boolean {
    let change = this.pending.get(svcKey);
    if (!change) {
      change = { previous: this.applied.get(svcKey) ?? NO_LISTS, current: NO_LISTS };
      this.pending.set(svcKey, change);
    }
    change.current = mergeSlices(slicesOf(this.slices.get(svcKey)));
    if (sameLists(change.previous, change.current)) {
      this.pending.delete(svcKey);
      this.triggerTimes.delete(svcKey);
      return false;
    }
    return true;
  }

  /**
   * Node name changes make "isLocal" change for every endpoint: recompute all, from each
   * endpoint's nodeName. (A slice that lists one address twice, on two nodes, was collapsed
   * with the old name's locality; the next update of the slice applies the new one.)
   */
  setNodeName(nodeName: string): void {
    if (nodeName === this.nodeName) return;
    this.nodeName = nodeName;
    for (const [svcKey, bySlice] of this.slices) {
      const relocated = slicesOf(bySlice).map((entry) => ({
        id: entry.id,
        ports: entry.ports.map((x) => (typeof x === 'string' ? x : x.map((e) => ({ ...e, isLocal: !!e.nodeName && e.nodeName === nodeName })))),
      }));
      this.slices.set(svcKey, asServiceSlices(relocated)!);
      this.recompute(svcKey);
    }
  }

  pendingCount(): number {
    return this.pending.size;
  }

  apply(state: ProxyState): Set<string> {
    const changed = new Set<string>();
    for (const [svcKey, change] of this.pending) {
      forEachList(change.previous, (k) => state.endpoints.delete(k));
      forEachList(change.current, (k, eps) => state.endpoints.set(k, eps));
      if (change.current.length) this.applied.set(svcKey, change.current);
      else this.applied.delete(svcKey);
      changed.add(svcKey);
    }
    this.appliedTriggerTimes = [...this.triggerTimes.values()].flat();
    this.triggerTimes.clear();
    this.pending.clear();
    return changed;
  }
}

/** Both trackers plus the state they maintain, for one IP family. */
export class ProxyStateTracker {
  readonly state: ProxyState = { services: new Map(), endpoints: new Map() };
  readonly services: ServiceChangeTracker;
  readonly endpoints: EndpointsChangeTracker;

  /** validates every object the trackers see; also for the Node (controller, render, trace) */
  readonly boundary: Boundary;

  constructor(family: IPFamily, nodeName: string, report: Report = () => {}, options: BoundaryOptions = {}) {
    this.boundary = new Boundary(report, options);
    this.services = new ServiceChangeTracker(family, report, this.boundary);
    this.endpoints = new EndpointsChangeTracker(family, nodeName, report, this.boundary);
  }

  hasPending(): boolean {
    return this.services.pendingCount() + this.endpoints.pendingCount() > 0;
  }

  /** Applies everything pending; returns the service keys ("ns/name") whose rules may change. */
  apply(): Set<string> {
    const a = this.services.apply(this.state);
    const b = this.endpoints.apply(this.state);
    return new Set([...a, ...b]);
  }
}
