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
import {
  endpointsOfSlices,
  lastChangeTriggerTime,
  servicePortsOf,
  sliceServiceKey,
  type K8sEndpointSlice,
  type Report,
} from './convert.ts';
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

export class EndpointsChangeTracker {
  /**
   * valid EndpointSlices by service key then slice "ns/name": upstream's EndpointSliceCache.
   * Kept as JSON text, parsed when its service is recomputed: a parsed slice takes several
   * times the memory of its text (10,000 slices × 5 endpoints: 24 MiB as objects), and it is
   * read only when a slice of the same service changes or the node name does.
   */
  private readonly slices = new Map<string, Map<string, string>>();
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
      const text = JSON.stringify(valid);
      text.charCodeAt(0); // flattens V8's tree of pieces into one string, in place
      bySlice.set(id, text);
      this.sliceService.set(id, svcKey);
    }
    let pending = false;
    if (before !== undefined && before !== svcKey) pending = this.recompute(before);
    if (svcKey) pending = this.recompute(svcKey, id, valid ?? undefined) || pending;
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

  /** `freshId`'s slice is given parsed (`fresh`: it was just validated), the others are parsed from their text. */
  private recompute(svcKey: string, freshId?: string, fresh?: K8sEndpointSlice): boolean {
    let change = this.pending.get(svcKey);
    if (!change) {
      change = { previous: this.applied.get(svcKey) ?? new Map(), current: new Map() };
      this.pending.set(svcKey, change);
    }
    const slices = [...(this.slices.get(svcKey) ?? [])].map(([id, t]) => (id === freshId && fresh ? fresh : (JSON.parse(t) as K8sEndpointSlice)));
    change.current = endpointsOfSlices(slices, this.family, this.nodeName, this.report);
    if (isDeepStrictEqual(change.previous, change.current)) {
      this.pending.delete(svcKey);
      this.triggerTimes.delete(svcKey);
      return false;
    }
    return true;
  }

  /** Node name changes make "isLocal" change for every endpoint: recompute all. */
  setNodeName(nodeName: string): void {
    if (nodeName === this.nodeName) return;
    this.nodeName = nodeName;
    for (const svcKey of this.slices.keys()) this.recompute(svcKey);
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
