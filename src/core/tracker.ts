// Change trackers, as upstream's ServiceChangeTracker / EndpointsChangeTracker: they keep
// {previous, current} per Service since the last sync, drop no-op changes (an update that
// ends where it started), and report exactly which services changed, which is what makes
// partial syncs possible. Pure: no I/O.
import { isDeepStrictEqual } from 'node:util';
import type { IPFamily } from './ip.ts';
import type { Endpoint, ProxyState, ServicePort } from './model.ts';
import {
  endpointsOfSlices,
  objectName,
  servicePortsOf,
  sliceServiceKey,
  type K8sEndpointSlice,
  type K8sService,
  type Report,
} from './convert.ts';

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
  ) {}

  /** Records an add (old null), update, or delete (new null). Returns whether a change is pending for it. */
  update(oldSvc: K8sService | null, newSvc: K8sService | null): boolean {
    const obj = newSvc ?? oldSvc;
    if (!obj?.metadata?.name || !obj.metadata.namespace) return false;
    const key = `${obj.metadata.namespace}/${obj.metadata.name}`;
    let change = this.pending.get(key);
    if (!change) {
      change = { previous: this.applied.get(key) ?? new Map(), current: new Map() };
      this.pending.set(key, change);
    }
    change.current = newSvc ? portMap(servicePortsOf(newSvc, this.family, this.report)) : new Map();
    if (isDeepStrictEqual(change.previous, change.current)) {
      this.pending.delete(key);
      return false;
    }
    return true;
  }

  pendingCount(): number {
    return this.pending.size;
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
  /** EndpointSlices by service key then slice name: upstream's EndpointSliceCache */
  private readonly slices = new Map<string, Map<string, K8sEndpointSlice>>();
  private readonly applied = new Map<string, Map<string, Endpoint[]>>();
  private readonly pending = new Map<string, Change<Endpoint[]>>();

  constructor(
    private readonly family: IPFamily,
    private nodeName: string,
    private readonly report: Report = () => {},
  ) {}

  update(oldSlice: K8sEndpointSlice | null, newSlice: K8sEndpointSlice | null): boolean {
    const obj = newSlice ?? oldSlice;
    if (!obj) return false;
    const svcKey = sliceServiceKey(obj);
    if (!svcKey) {
      this.report('EndpointSlice without a valid kubernetes.io/service-name label ignored', objectName(obj));
      // Relabelled from a valid service to an invalid one: it must still leave the old service.
      if (oldSlice && newSlice && sliceServiceKey(oldSlice)) return this.update(oldSlice, null);
      return false;
    }
    // A slice whose service label changed moves between services: remove it from the old one.
    if (oldSlice && newSlice) {
      const oldKey = sliceServiceKey(oldSlice);
      if (oldKey && oldKey !== svcKey) this.update(oldSlice, null);
    }
    const name = obj.metadata?.name ?? '';
    let bySlice = this.slices.get(svcKey);
    if (!bySlice) this.slices.set(svcKey, (bySlice = new Map()));
    if (newSlice) bySlice.set(name, newSlice);
    else bySlice.delete(name);
    if (!bySlice.size) this.slices.delete(svcKey);
    return this.recompute(svcKey);
  }

  private recompute(svcKey: string): boolean {
    let change = this.pending.get(svcKey);
    if (!change) {
      change = { previous: this.applied.get(svcKey) ?? new Map(), current: new Map() };
      this.pending.set(svcKey, change);
    }
    const slices = [...(this.slices.get(svcKey)?.values() ?? [])];
    change.current = endpointsOfSlices(slices, this.family, this.nodeName, this.report);
    if (isDeepStrictEqual(change.previous, change.current)) {
      this.pending.delete(svcKey);
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
    this.pending.clear();
    return changed;
  }
}

/** Both trackers plus the state they maintain, for one IP family. */
export class ProxyStateTracker {
  readonly state: ProxyState = { services: new Map(), endpoints: new Map() };
  readonly services: ServiceChangeTracker;
  readonly endpoints: EndpointsChangeTracker;

  constructor(family: IPFamily, nodeName: string, report: Report = () => {}) {
    this.services = new ServiceChangeTracker(family, report);
    this.endpoints = new EndpointsChangeTracker(family, nodeName, report);
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
