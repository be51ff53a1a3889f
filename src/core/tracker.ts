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
  previous: Map<string, T>;
  current: Map<string, T>;
}

function portMap(ports: ServicePort[]): Map<string, ServicePort> {
  return new Map(ports.map((p) => [p.key, p]));
}

export class ServiceChangeTracker {
  private readonly pending = new Map<string, Change<ServicePort>>();
  /** the ports each service had when last applied, so "previous" is known for a first change */
  private readonly applied = new Map<string, Map<string, ServicePort>>();

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
      change = { previous: this.applied.get(key) ?? new Map(), current: new Map() };
      this.pending.set(key, change);
    }
    change.current = valid ? portMap(servicePortsOf(valid, this.family, this.report)) : new Map();
    if (isDeepStrictEqual(change.previous, change.current)) {
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
    return this.applied.get(serviceKey)?.keys() ?? [];
  }

  /** Applies pending changes to state.services; returns the service keys ("ns/name") that changed. */
  apply(state: ProxyState): Set<string> {
    const changed = new Set<string>();
    for (const [svcKey, change] of this.pending) {
      for (const k of change.previous.keys()) state.services.delete(k);
      for (const [k, sp] of change.current) state.services.set(k, sp);
      if (change.current.size) this.applied.set(svcKey, change.current);
      else this.applied.delete(svcKey);
      changed.add(svcKey);
    }
    this.pending.clear();
    return changed;
  }
}

/** One slice's endpoints by servicePortKey (endpointsOfSlices of that slice alone), and its name. */
interface SliceEndpoints {
  name: string;
  ports: Map<string, Endpoint[]>;
}

/**
 * A Service's endpoints from its slices' own, exactly as endpointsOfSlices of all its slices:
 * slices in name order, a duplicate address collapses to its first copy unless a later one
 * is local (each slice's lists already collapsed its own duplicates the same way), lists
 * sorted by key. One slice: its lists as they are.
 */
function mergeSlices(entries: SliceEndpoints[]): Map<string, Endpoint[]> {
  if (entries.length === 0) return new Map();
  if (entries.length === 1) return entries[0].ports;
  const byPort = new Map<string, Map<string, Endpoint>>();
  for (const entry of [...entries].sort((a, b) => a.name.localeCompare(b.name))) {
    for (const [k, list] of entry.ports) {
      let set = byPort.get(k);
      if (!set) byPort.set(k, (set = new Map()));
      for (const e of list) if (!set.has(e.key) || e.isLocal) set.set(e.key, e);
    }
  }
  const out = new Map<string, Endpoint[]>();
  for (const [k, set] of byPort) out.set(k, [...set.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)));
  return out;
}

export class EndpointsChangeTracker {
  /**
   * What each valid EndpointSlice contributes, by service key then slice "ns/name":
   * upstream's EndpointSliceCache, kept as the slice's own endpoints per service port (not the
   * slice: as objects 24 MiB at 10,000 slices × 5 endpoints, as JSON text 11 MiB). A Service
   * with one slice uses these very lists; several slices are merged as endpointsOfSlices does.
   */
  private readonly slices = new Map<string, Map<string, SliceEndpoints>>();
  /** slice "ns/name" → the service key it is filed under, so a relabelled slice leaves its old service */
  private readonly sliceService = new Map<string, string>();
  private readonly applied = new Map<string, Map<string, Endpoint[]>>();
  private readonly pending = new Map<string, Change<Endpoint[]>>();
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
      const bySlice = this.slices.get(before);
      bySlice?.delete(id);
      if (bySlice && !bySlice.size) this.slices.delete(before);
      this.sliceService.delete(id);
    }
    if (valid && svcKey) {
      let bySlice = this.slices.get(svcKey);
      if (!bySlice) this.slices.set(svcKey, (bySlice = new Map()));
      bySlice.set(id, { name: valid.metadata?.name ?? '', ports: endpointsOfSlices([valid], this.family, this.nodeName, this.report) });
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
      change = { previous: this.applied.get(svcKey) ?? new Map(), current: new Map() };
      this.pending.set(svcKey, change);
    }
    change.current = mergeSlices([...(this.slices.get(svcKey)?.values() ?? [])]);
    if (isDeepStrictEqual(change.previous, change.current)) {
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
      for (const [id, entry] of bySlice) {
        const ports = new Map<string, Endpoint[]>();
        for (const [k, list] of entry.ports) ports.set(k, list.map((e) => ({ ...e, isLocal: !!e.nodeName && e.nodeName === nodeName })));
        bySlice.set(id, { name: entry.name, ports });
      }
      this.recompute(svcKey);
    }
  }

  pendingCount(): number {
    return this.pending.size;
  }

  apply(state: ProxyState): Set<string> {
    const changed = new Set<string>();
    for (const [svcKey, change] of this.pending) {
      for (const k of change.previous.keys()) state.endpoints.delete(k);
      for (const [k, eps] of change.current) state.endpoints.set(k, eps);
      if (change.current.size) this.applied.set(svcKey, change.current);
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
