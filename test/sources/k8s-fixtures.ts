// Shared helpers for the Kubernetes source tests: object builders, a recording handler,
// bounded waits and a log capture.
import pino from 'pino';
import type { Logger } from '../../src/log.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import type { K8sNode, SourceHandler } from '../../src/sources/types.ts';
import type { KObject } from '../support/apiserver.ts';

export function svc(name: string, opts: { ns?: string; ip?: string; port?: number; labels?: Record<string, string>; type?: string; nodePort?: number } = {}): KObject {
  return {
    metadata: { name, namespace: opts.ns ?? 'default', labels: opts.labels },
    spec: {
      type: opts.type ?? 'ClusterIP',
      clusterIP: opts.ip ?? '172.30.0.10',
      clusterIPs: [opts.ip ?? '172.30.0.10'],
      ports: [{ name: 'http', protocol: 'TCP', port: opts.port ?? 80, targetPort: 8080, ...(opts.nodePort ? { nodePort: opts.nodePort } : {}) }],
    },
  };
}

export function slice(name: string, service: string, ips: string[], opts: { ns?: string; port?: number; labels?: Record<string, string>; nodeName?: string } = {}): KObject {
  return {
    metadata: { name, namespace: opts.ns ?? 'default', labels: { 'kubernetes.io/service-name': service, ...(opts.labels ?? {}) } },
    addressType: 'IPv4',
    endpoints: ips.map((ip) => ({ addresses: [ip], conditions: { ready: true, serving: true, terminating: false }, nodeName: opts.nodeName ?? 'node-b' })),
    ports: [{ name: 'http', port: opts.port ?? 8080, protocol: 'TCP' }],
  };
}

export function node(name: string, zone = 'zone-a'): KObject {
  return {
    metadata: { name, labels: { 'kubernetes.io/hostname': name, 'topology.kubernetes.io/zone': zone } },
    status: { addresses: [{ type: 'InternalIP', address: '192.168.0.2' }] },
  };
}

export interface Ev<T> {
  old: T | null;
  new: T | null;
}

/** A SourceHandler that records everything it is given. */
export class Recorder implements SourceHandler {
  services: Array<Ev<K8sService>> = [];
  slices: Array<Ev<K8sEndpointSlice>> = [];
  nodes: Array<K8sNode | null> = [];
  syncedCalls = 0;
  /** counts of events seen when onSynced was called */
  atSynced?: { services: number; slices: number };

  onService(o: K8sService | null, n: K8sService | null): void {
    this.services.push({ old: o, new: n });
  }
  onEndpointSlice(o: K8sEndpointSlice | null, n: K8sEndpointSlice | null): void {
    this.slices.push({ old: o, new: n });
  }
  onNode(n: K8sNode | null): void {
    this.nodes.push(n);
  }
  onSynced(): void {
    this.syncedCalls++;
    this.atSynced ??= { services: this.services.length, slices: this.slices.length };
  }

  /** Replays the recorded events into name → object, checking each old matches what was known. */
  static replay<T extends { metadata?: { name?: string; namespace?: string; resourceVersion?: string } }>(events: Array<Ev<T>>): Map<string, T> {
    const m = new Map<string, T>();
    for (const e of events) {
      const obj = (e.new ?? e.old)!;
      const key = `${obj.metadata?.namespace}/${obj.metadata?.name}`;
      const known = m.get(key) ?? null;
      if ((known?.metadata?.resourceVersion ?? null) !== (e.old?.metadata?.resourceVersion ?? null)) {
        throw new Error(`event for ${key}: old rv ${e.old?.metadata?.resourceVersion} but known rv ${known?.metadata?.resourceVersion}`);
      }
      if (e.new) m.set(key, e.new);
      else m.delete(key);
    }
    return m;
  }
}

export async function waitFor(cond: () => boolean, what: string, timeoutMs = 5000): Promise<number> {
  const t0 = Date.now();
  for (let i = 0; Date.now() - t0 < timeoutMs && i < 100_000; i++) {
    if (cond()) return Date.now() - t0;
    await sleep(20);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/** A debug-level logger whose records are kept in memory. */
export function captureLogger(): { log: Logger; records: Array<Record<string, unknown>> } {
  const records: Array<Record<string, unknown>> = [];
  const log = pino({ level: 'debug' }, { write: (s: string) => void records.push(JSON.parse(s)) });
  return { log, records };
}

/** name → resourceVersion of the server's current objects, for convergence checks. */
export function versions(objs: KObject[]): Map<string, string> {
  return new Map(objs.map((o) => [`${o.metadata?.namespace}/${o.metadata?.name}`, String(o.metadata?.resourceVersion)]));
}
