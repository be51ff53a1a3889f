// Wires one proxy together: source → change trackers → sync loop → mode proxier. It is the
// only place that knows all of them; each stays testable on its own.
import { networkInterfaces } from 'node:os';
import type { ProxyConfig, ModeName } from '../config/config.ts';
import { ProxyStateTracker } from '../core/tracker.ts';
import { canonicalIP, ipFamily } from '../core/ip.ts';
import { validateOptionsForMode, type ObjectKind } from '../core/validate.ts';
import type { Logger } from '../log.ts';
import type { CommandRunner } from '../exec/runner.ts';
import type { ModeModule, NodeContext, PlanInput, Proxier, SyncStats } from '../modes/types.ts';
import { buildNodeView } from '../core/nodeview.ts';
import type { K8sNode, Source } from '../sources/types.ts';
import { SyncLoop } from './loop.ts';
import { ProxyHealth } from './health.ts';

export interface ControllerOptions {
  config: ProxyConfig;
  nodeName: string;
  mode: ModeModule;
  /** every mode, for cleaning up what the others left */
  allModes: Record<ModeName, ModeModule>;
  source: Source;
  /** the source's name for metrics ("manifests", "kubernetes"); default "unknown" */
  sourceName?: string;
  runner: CommandRunner;
  log: Logger;
  /** overrides interface discovery (tests) */
  nodeIPs?: () => string[];
  /** skip removing other modes' leftovers (dry environments, tests) */
  skipCleanup?: boolean;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** how long a queued update may wait for a sync before /livez fails (default 2 × syncPeriod, as upstream) */
  healthTimeoutMs?: number;
  /** the health clock (tests) */
  now?: () => number;
}

export interface SyncRecord {
  at: number;
  full: boolean;
  durationMs: number;
  ok: boolean;
  stats?: SyncStats;
  error?: string;
  changed: string[];
}

/** This node's addresses of a family, as the kernel sees them (kube-ipvs0 and loopback excluded). */
export function discoverNodeIPs(family: 4 | 6): string[] {
  const out: string[] = [];
  for (const [name, addrs] of Object.entries(networkInterfaces())) {
    if (name === 'kube-ipvs0') continue;
    for (const a of addrs ?? []) {
      if (a.internal) continue;
      const ip = canonicalIP(a.address.split('%')[0]);
      if (ip && ipFamily(ip) === family && !ip.startsWith('fe80:') && !out.includes(ip)) out.push(ip);
    }
  }
  return out;
}

export class ProxyController {
  readonly tracker: ProxyStateTracker;
  readonly loop: SyncLoop;
  proxier: Proxier | null = null;
  private nodeLabels: Record<string, string> = {};
  /** the Node's spec.podCIDRs and status.addresses: the node view's NodeCIDR detector and primary IP */
  private nodeFacts: { podCIDRs: string[]; addresses: Array<{ type: string; address: string }> } = { podCIDRs: [], addresses: [] };
  private changedSinceSuccess = new Set<string>();
  private synced = false;
  readonly history: SyncRecord[] = [];
  readonly startedAt = Date.now();
  /** what /healthz and /livez answer from (upstream's ProxyHealthServer) */
  readonly health: ProxyHealth;
  private readonly listeners: Array<(r: SyncRecord) => void> = [];
  private readonly invalidListeners: Array<(kind: ObjectKind, source: string) => void> = [];
  /** objects skipped as invalid since start, by kind */
  readonly invalidCounts: Record<ObjectKind, number> = { Service: 0, EndpointSlice: 0, Node: 0 };

  constructor(private readonly opts: ControllerOptions) {
    const log = opts.log;
    this.health = new ProxyHealth({ healthTimeoutMs: opts.healthTimeoutMs ?? 2 * opts.config.syncPeriodMs, now: opts.now });
    // Invalid objects: the tracker's boundary validates, rate-limits the warnings (one per
    // object and field per 5 minutes) and calls onInvalid for every skip, which feeds
    // kproxy_invalid_objects_total.
    this.tracker = new ProxyStateTracker(
      4,
      opts.nodeName,
      (msg, obj, detail) =>
        detail
          ? log.warn({ object: obj, kind: detail.kind, field: detail.field, value: detail.value }, msg)
          : log.warn({ object: obj }, `invalid API object: ${msg}; skipped`),
      {
        ...validateOptionsForMode(opts.mode.name),
        onInvalid: (kind) => {
          this.invalidCounts[kind]++;
          for (const l of this.invalidListeners) l(kind, opts.sourceName ?? 'unknown');
        },
      },
    );
    this.loop = new SyncLoop({
      minSyncPeriodMs: opts.config.minSyncPeriodMs,
      syncPeriodMs: opts.config.syncPeriodMs,
      sync: (full) => this.syncOnce(full),
      backoffInitialMs: opts.backoffInitialMs,
      backoffMaxMs: opts.backoffMaxMs,
      onError: (err, attempt, wait) =>
        log.error({ err: (err as Error).message, attempt, retryInMs: wait }, 'sync failed; the previous rules stay in place; retrying with a full sync'),
    });
  }

  onSync(fn: (r: SyncRecord) => void): void {
    this.listeners.push(fn);
  }

  /** Called for every object skipped as invalid, with its kind and the source's name. */
  onInvalid(fn: (kind: ObjectKind, source: string) => void): void {
    this.invalidListeners.push(fn);
  }

  get isSynced(): boolean {
    return this.synced;
  }

  nodeContext(): NodeContext {
    return {
      nodeName: this.opts.nodeName,
      nodeIPs: (this.opts.nodeIPs ?? (() => discoverNodeIPs(4)))(),
      nodeLabels: this.nodeLabels,
      family: 4,
      podCIDRs: this.nodeFacts.podCIDRs,
      addresses: this.nodeFacts.addresses,
    };
  }

  planInput(): PlanInput {
    const input: PlanInput = { state: this.tracker.state, config: this.opts.config, node: this.nodeContext() };
    return { ...input, view: buildNodeView(input) };
  }

  async start(): Promise<void> {
    const { log, mode } = this.opts;
    if (!this.opts.skipCleanup) await this.cleanupOtherModes();
    this.proxier = await mode.createProxier({ config: this.opts.config, log: log.child({ mode: mode.name }), runner: this.opts.runner });
    await this.opts.source.start({
      onService: (o, n) => {
        if (this.tracker.services.update(o, n)) this.queueSync();
      },
      onEndpointSlice: (o, n) => {
        if (this.tracker.endpoints.update(o, n)) this.queueSync();
      },
      onNode: (node: K8sNode | null) => {
        // An invalid Node is reported and counts as no Node: no topology labels.
        const valid = node ? this.tracker.boundary.node(node) : null;
        this.health.syncNode(valid);
        const labels = valid?.metadata?.labels ?? {};
        const facts = { podCIDRs: [...(valid?.spec?.podCIDRs ?? [])], addresses: (valid?.status?.addresses ?? []).map((a) => ({ type: a.type, address: a.address })) };
        if (JSON.stringify(labels) !== JSON.stringify(this.nodeLabels) || JSON.stringify(facts) !== JSON.stringify(this.nodeFacts)) {
          this.nodeLabels = { ...labels };
          this.nodeFacts = facts;
          this.queueSync(true);
        }
      },
      onSynced: () => {
        if (this.synced) return;
        this.synced = true;
        log.info('sources synced; starting the sync loop');
        this.health.queuedUpdate(); // the first sync is pending from now: /livez measures it from here
        this.loop.start();
      },
    });
  }

  /**
   * A change needs a sync. Before the sources synced no sync can run, so nothing counts as
   * queued for health (upstream's proxiers ignore events until initialized): a slow or
   * unreachable API server at start-up must not make the kubelet restart kproxy.
   */
  private queueSync(full = false): void {
    if (this.synced) this.health.queuedUpdate();
    if (full) this.loop.requestFull();
    else this.loop.request();
  }

  async stop(): Promise<void> {
    await this.opts.source.stop();
    await this.loop.stop();
    await this.proxier?.stop();
  }

  /**
   * Removes what other modes left. iptables and ipvs share KUBE-* chain names, so their
   * cleanups run only when the other mode's own traces exist; otherwise a plain restart of
   * one would tear down the chains it is still forwarding with.
   */
  private async cleanupOtherModes(): Promise<void> {
    const { allModes, mode, runner, log } = this.opts;
    for (const other of Object.values(allModes)) {
      if (other.name === mode.name) continue;
      const shared = (mode.name === 'iptables' || mode.name === 'ipvs') && (other.name === 'iptables' || other.name === 'ipvs');
      if (shared && !(await this.hasLeftovers(other.name))) continue;
      try {
        await other.cleanup(runner, log.child({ cleanup: other.name }));
      } catch (e) {
        log.warn({ mode: other.name, err: (e as Error).message }, 'cleanup of another mode failed; continuing');
      }
    }
  }

  private async hasLeftovers(name: ModeName): Promise<boolean> {
    const { runner } = this.opts;
    try {
      if (name === 'ipvs') {
        const r = await runner.run('ip', ['link', 'show', 'kube-ipvs0']);
        return r.code === 0;
      }
      if (name === 'iptables') {
        const r = await runner.run('iptables-save', ['-t', 'nat']);
        return r.code === 0 && /^:KUBE-(SVC|SEP)-/m.test(r.stdout);
      }
    } catch {
      return false;
    }
    return false;
  }

  private async syncOnce(full: boolean): Promise<void> {
    const started = Date.now();
    this.health.syncStarted();
    for (const k of this.tracker.apply()) this.changedSinceSuccess.add(k);
    const changed = new Set(this.changedSinceSuccess);
    const rec: SyncRecord = { at: started, full, durationMs: 0, ok: false, changed: [...changed].sort() };
    try {
      if (!this.proxier) throw new Error('proxier not created');
      rec.stats = await this.proxier.sync(this.planInput(), changed, full);
      rec.ok = true;
      this.changedSinceSuccess.clear();
      this.health.updated();
    } catch (e) {
      this.health.syncFailed();
      rec.error = (e as Error).message;
      throw e;
    } finally {
      rec.durationMs = Date.now() - started;
      this.history.push(rec);
      if (this.history.length > 50) this.history.shift();
      for (const l of this.listeners) l(rec);
      if (rec.ok) {
        this.opts.log.info(
          { full, durationMs: rec.durationMs, changed: rec.changed.length, rulesWritten: rec.stats?.rulesWritten, rulesTotal: rec.stats?.rulesTotal },
          'synced',
        );
        if (rec.stats?.diff) this.opts.log.debug({ diff: rec.stats.diff }, 'sync diff');
      }
    }
  }
}
