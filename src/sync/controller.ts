// Wires one proxy together: source → change trackers → sync loop → mode proxier. It is the
// only place that knows all of them; each stays testable on its own.
import { networkInterfaces } from 'node:os';
import { NODE_PORT_KEYWORDS, type ProxyConfig, type ModeName } from '../config/config.ts';
import { ProxyStateTracker } from '../core/tracker.ts';
import { canonicalIP, ipFamily } from '../core/ip.ts';
import { validateOptionsForMode } from '../core/validate.ts';
import type { ObjectKind } from '../core/api.ts';
import type { Logger } from '../log.ts';
import type { CommandRunner } from '../kernel/runner.ts';
import type { ModeModule, Proxier, SyncStats } from '../modes/types.ts';
import { type NodeContext, type PlanInput, buildNodeView, revertView, type NodeView } from '../core/nodeview.ts';
import { coded, kproxyError } from '../errors.ts';
import { IptablesExecutor } from '../kernel/iptables/exec.ts';
import { Links } from '../kernel/links.ts';
import { chainsFromSave } from '../kernel/iptables/save.ts';
import type { K8sNode, Source } from '../sources/types.ts';
import { SyncLoop } from './loop.ts';
import type { StaleFlowCleaner } from '../kernel/conntrack.ts';
import { ProxyHealth } from './health.ts';
import { GarbageAfterSync } from './memory.ts';

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
  /**
   * overrides interface discovery (tests): this node's addresses, of the family asked for
   * (addresses of the other family are ignored, so a plain list works)
   */
  nodeIPs?: (family: 4 | 6) => string[];
  /** the IP families to run, primary first (tests); default: chooseFamilies() */
  families?: Array<4 | 6>;
  /** skip removing other modes' leftovers (dry environments, tests) */
  skipCleanup?: boolean;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  /** how long a queued update may wait for a sync before /livez fails (default 2 × syncPeriod, as upstream) */
  healthTimeoutMs?: number;
  /** the health clock (tests) */
  now?: () => number;
  /** clears each family's stale UDP/SCTP conntrack flows after its successful sync; none: no clearing */
  conntrack?: StaleFlowCleaner;
}

export interface SyncRecord {
  at: number;
  full: boolean;
  durationMs: number;
  ok: boolean;
  stats?: SyncStats;
  error?: string;
  changed: string[];
  /** per IP family: how its proxier's sync went (a dual-stack node has two) */
  families?: FamilySyncRecord[];
}

export interface FamilySyncRecord {
  family: 4 | 6;
  ok: boolean;
  full: boolean;
  /** how long this family's part took (its proxier's sync and the conntrack cleanup) */
  durationMs?: number;
  stats?: SyncStats;
  error?: string;
  /** the failure's KPROXY_* code, when it has one (which metric counts it) */
  errorCode?: string;
  /** stale UDP/SCTP conntrack entries cleared after the sync, and how long it took */
  conntrack?: { deleted: number; failed: number; durationMs: number };
  /**
   * Network programming latencies this sync completed, in seconds: from each EndpointSlice
   * change's last-change-trigger-time to the end of the sync that programmed it.
   */
  networkProgrammingSeconds?: number[];
  /**
   * Service ports with endpoints but none usable for a Local traffic policy (upstream's
   * sync_proxy_rules_no_local_endpoints_total): internal (iTP Local), external (eTP Local)
   */
  noLocalEndpoints?: { internal: number; external: number };
}

/** trigger times kept per family while its syncs fail (each is one histogram observation later) */
const MAX_PENDING_TRIGGER_TIMES = 10_000;

/** What the node view says about Local traffic policies without local endpoints (kept by the view: no walk per sync). */
export function countNoLocalEndpoints(view: NodeView | undefined): { internal: number; external: number } {
  return view ? { ...view.noLocalEndpoints } : { internal: 0, external: 0 };
}

/** One IP family's half of the controller: its tracker and its proxier (upstream's metaproxier halves). */
export interface FamilyRuntime {
  family: 4 | 6;
  tracker: ProxyStateTracker;
  proxier: Proxier | null;
  /** services changed since this family's last successful sync */
  changedSinceSuccess: Set<string>;
  /** the last sync of this family failed: the next one is full */
  failed: boolean;
  /** the node view of this family's last successful sync (stale flows are relative to it) */
  lastView?: NodeView;
  /** trigger times (epoch ms) of endpoint changes applied but not yet programmed by a successful sync */
  triggerTimes: number[];
}

/** A family that does not run, and why (reported once at start: KPROXY_FAMILY_UNAVAILABLE). */
export interface UnavailableFamily {
  family: 4 | 6;
  error: string;
}

/**
 * The line that opens one family's section when render or /debug/rules show two families:
 * `# ==== kproxy IPv4 ====`. It is a comment in every payload format (iptables-restore, nft -f,
 * the ipvs and userspace texts), and what follows up to the next marker is that family's
 * payload, unchanged.
 */
export function familySectionMarker(family: 4 | 6): string {
  return `# ==== kproxy IPv${family} ====`;
}

export function familySection(family: 4 | 6, payload: string): string {
  return `${familySectionMarker(family)}\n${payload}${payload === '' || payload.endsWith('\n') ? '' : '\n'}`;
}

const isFamilyCIDR = (family: 4 | 6) => (c: string) => (c.includes(':') ? 6 : 4) === family;

/**
 * Which IP families this node runs, primary first. As upstream's server_linux.go: the primary
 * family is the bind address's when it names one ("::" says IPv6), else the node IP's; the
 * other family runs too (dual-stack) when the node has an address of it or the configuration
 * names a CIDR of it. A node whose addresses and configuration have one family runs that one.
 * Whether the family's tools work is checked after, when its proxier is created.
 */
export function chooseFamilies(config: ProxyConfig, nodeIPs: (family: 4 | 6) => string[]): Array<4 | 6> {
  const has = (f: 4 | 6) =>
    nodeIPs(f).some((ip) => ipFamily(ip) === f) ||
    config.clusterCIDRs.some(isFamilyCIDR(f)) ||
    config.nodePortAddresses.filter((c) => !isNodePortKeyword(c)).some(isFamilyCIDR(f));
  const bind = canonicalIP(config.bindAddress);
  let primary: 4 | 6;
  if (bind && bind !== '0.0.0.0' && bind !== '::') primary = ipFamily(bind) === 6 ? 6 : 4;
  else if (bind === '::') primary = 6;
  else primary = !has(4) && has(6) ? 6 : 4;
  const secondary: 4 | 6 = primary === 4 ? 6 : 4;
  return has(secondary) ? [primary, secondary] : [primary];
}

function isNodePortKeyword(c: string): boolean {
  return (NODE_PORT_KEYWORDS as readonly string[]).includes(c);
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
  readonly loop: SyncLoop;
  /** one per IP family that may run, primary first; start() drops those whose tools are missing */
  families: FamilyRuntime[];
  /** families that do not run on this node although it has addresses of them */
  readonly unavailableFamilies: UnavailableFamily[] = [];
  private nodeLabels: Record<string, string> = {};
  /** the Node's spec.podCIDRs and status.addresses: the node view's NodeCIDR detector and primary IP */
  private nodeFacts: { podCIDRs: string[]; addresses: Array<{ type: string; address: string }> } = { podCIDRs: [], addresses: [] };
  /** every address of this host (kube-ipvs0 left out), probed once at start; null: not probed */
  private hostIPs: string[] | null = null;
  private synced = false;
  /** stop() was called: a first sync waiting on the host work does not start */
  private stopping = false;
  readonly history: SyncRecord[] = [];
  readonly startedAt = Date.now();
  /** what /healthz and /livez answer from (upstream's ProxyHealthServer) */
  readonly health: ProxyHealth;
  private readonly listeners: Array<(r: SyncRecord) => void> = [];
  private readonly queuedListeners: Array<() => void> = [];
  private readonly changeListeners: Array<(kind: 'service' | 'endpoints') => void> = [];
  /** wall clock (trigger times are wall-clock times from the API server) */
  private readonly now: () => number;
  /** trigger times before this are ignored, as upstream's trackerStartTime (a restart is not a programming delay) */
  private readonly trackerStartedAt: number;
  private readonly invalidListeners: Array<(kind: ObjectKind, source: string) => void> = [];
  /** objects skipped as invalid since start, by kind */
  readonly invalidCounts: Record<ObjectKind, number> = { Service: 0, EndpointSlice: 0, Node: 0 };
  /** frees the garbage of a big load or full sync at once (src/sync/memory.ts) */
  private readonly gcAfterSync = new GarbageAfterSync();

  constructor(private readonly opts: ControllerOptions) {
    const log = opts.log;
    this.now = opts.now ?? Date.now;
    this.trackerStartedAt = this.now();
    this.health = new ProxyHealth({ healthTimeoutMs: opts.healthTimeoutMs ?? 2 * opts.config.syncPeriodMs, now: opts.now });
    // Invalid objects: the tracker's boundary validates, rate-limits the warnings (one per
    // object and field per 5 minutes) and calls onInvalid for every skip, which feeds
    // kproxy_invalid_objects_total.
    const families = opts.families ?? chooseFamilies(opts.config, (f) => this.nodeIPsOf(f));
    // Every family's tracker sees every object; only the primary (the first family that
    // runs) reports and counts what is invalid, so a bad object is warned about and counted
    // once, not once per family.
    const primary = (family: 4 | 6) => this.families[0]?.family === family;
    this.families = families.map((family) => ({
      family,
      tracker: new ProxyStateTracker(
        family,
        opts.nodeName,
        (msg, obj, detail) => {
          if (!primary(family)) return;
          if (detail) log.warn({ object: obj, kind: detail.kind, field: detail.field, value: detail.value }, msg);
          else log.warn({ object: obj }, `invalid API object: ${msg}; skipped`);
        },
        {
          ...validateOptionsForMode(opts.mode.name),
          onInvalid: (kind) => {
            if (primary(family)) this.countInvalid(kind);
          },
        },
      ),
      proxier: null,
      changedSinceSuccess: new Set<string>(),
      failed: false,
      triggerTimes: [],
    }));
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

  /** Called whenever a sync is queued (upstream's sync_proxy_rules_last_queued_timestamp_seconds). */
  onQueued(fn: () => void): void {
    this.queuedListeners.push(fn);
  }

  /** Called for every Service or EndpointSlice event, changing or not (upstream's *_changes_total). */
  onChange(fn: (kind: 'service' | 'endpoints') => void): void {
    this.changeListeners.push(fn);
  }

  /** Service and endpoint changes waiting for a sync (the primary family's trackers). */
  pendingChanges(): { services: number; endpoints: number } {
    const t = this.families[0]?.tracker;
    return { services: t?.services.pendingCount() ?? 0, endpoints: t?.endpoints.pendingCount() ?? 0 };
  }

  /** Called for every object skipped as invalid, with its kind and the source's name. */
  onInvalid(fn: (kind: ObjectKind, source: string) => void): void {
    this.invalidListeners.push(fn);
  }

  /** One object skipped as invalid: by a tracker's validation, or by the source itself. */
  private countInvalid(kind: ObjectKind): void {
    this.invalidCounts[kind]++;
    for (const l of this.invalidListeners) l(kind, this.opts.sourceName ?? 'unknown');
  }

  get isSynced(): boolean {
    return this.synced;
  }

  /** the primary family's tracker (validation of the Node, /debug/state's first half) */
  get tracker(): ProxyStateTracker {
    return this.families[0].tracker;
  }

  /** the primary family's proxier (null before start) */
  get proxier(): Proxier | null {
    return this.families[0]?.proxier ?? null;
  }

  /**
   * What /debug/rules shows: the last applied rules of every family. One family: its dump as
   * it is; two: a section per family, IPv4 first, each opened by a marker line
   * (familySectionMarker) and holding that family's payload as it is.
   */
  dumpRules(): string {
    const running = [...this.families].filter((f) => f.proxier).sort((a, b) => a.family - b.family);
    if (running.length === 1) return running[0].proxier!.dump();
    return running.map((f) => familySection(f.family, f.proxier!.dump())).join('');
  }

  /** What /debug/state shows: each family's services and endpoints, IPv4 first. */
  stateByFamily(): Array<{ family: 4 | 6; state: ProxyStateTracker['state'] }> {
    return [...this.families].sort((a, b) => a.family - b.family).map((f) => ({ family: f.family, state: f.tracker.state }));
  }

  private nodeIPsOf(family: 4 | 6): string[] {
    const ips = this.opts.nodeIPs ? this.opts.nodeIPs(family) : discoverNodeIPs(family);
    return ips.filter((ip) => ipFamily(ip) === family);
  }

  nodeContext(family: 4 | 6 = this.families[0]?.family ?? 4): NodeContext {
    return {
      nodeName: this.opts.nodeName,
      nodeIPs: this.nodeIPsOf(family),
      nodeLabels: this.nodeLabels,
      family,
      podCIDRs: this.nodeFacts.podCIDRs,
      addresses: this.nodeFacts.addresses,
      // the node IPs are host addresses too (given by the caller, they may be a test's)
      ...(this.hostIPs ? { hostIPs: [...new Set([...this.hostIPs, ...this.nodeIPsOf(family)])] } : {}),
    };
  }

  /**
   * The host's addresses, once: only nodePortAddresses CIDRs select among them (upstream
   * GetNodeIPs), so without a CIDR nothing is probed.
   */
  private async probeHostIPs(): Promise<void> {
    if (!this.opts.config.nodePortAddresses.some((c) => !isNodePortKeyword(c))) return;
    this.hostIPs = await new Links(this.opts.runner).hostAddresses(['kube-ipvs0']);
  }

  /**
   * The input of a sync. With `changed` (the services changed since the family's last
   * successful sync, whose view is lastView), only their ports are decided again.
   */
  planInput(family: 4 | 6 = this.families[0]?.family ?? 4, changed?: ReadonlySet<string>): PlanInput {
    const f = this.families.find((x) => x.family === family);
    if (!f) throw kproxyError('KPROXY_FAMILY_UNAVAILABLE', `IPv${family} does not run on this node`);
    const input: PlanInput = { state: f.tracker.state, config: this.opts.config, node: this.nodeContext(family) };
    // The view is computed once per sync and family; the last applied one gives the stale
    // UDP/SCTP flows of this sync.
    const changes = changed && { services: changed, portKeysOf: (k: string) => f.tracker.services.portKeysOf(k) };
    return { ...input, view: buildNodeView(input, f.lastView, changes) };
  }

  /**
   * One proxier per family, as upstream's metaproxier. A family whose proxier cannot be made
   * (ip6tables missing, IPv6 disabled, ...) is reported once, with KPROXY_FAMILY_UNAVAILABLE,
   * and the other family runs alone; only when no family can run does start() fail.
   */
  private async createProxiers(): Promise<void> {
    const { log, mode } = this.opts;
    let firstError: unknown = null;
    for (const f of this.families) {
      try {
        if (f.family === 6) await this.requireKernelIPv6();
        f.proxier = await mode.createProxier({ config: this.opts.config, log: log.child({ mode: mode.name, family: f.family }), runner: this.opts.runner, family: f.family });
      } catch (e) {
        firstError ??= e;
        this.unavailableFamilies.push({ family: f.family, error: (e as Error).message });
      }
    }
    const running = this.families.filter((f) => f.proxier);
    if (!running.length) throw firstError;
    for (const u of this.unavailableFamilies) {
      log.error(
        { family: u.family, err: u.error },
        coded('KPROXY_FAMILY_UNAVAILABLE', `IPv${u.family} is not served in ${mode.name} mode (${u.error}); IPv${running[0].family} keeps working; install the missing tool or enable IPv${u.family}, then restart`),
      );
    }
    this.families = running;
  }

  /**
   * IPv6 switched off in the kernel (net.ipv6.conf.all.disable_ipv6 = 1, or no IPv6 at all)
   * makes every IPv6 rule fail: the family is unavailable rather than a sync that never
   * succeeds. A host without the sysctl tool is not judged here (the proxier finds out).
   */
  private async requireKernelIPv6(): Promise<void> {
    let r;
    try {
      r = await this.opts.runner.run('sysctl', ['-n', 'net.ipv6.conf.all.disable_ipv6'], { timeoutMs: 10_000 });
    } catch {
      return;
    }
    if (r.code === 0 && r.stdout.trim() === '1') throw new Error('IPv6 is disabled in the kernel (net.ipv6.conf.all.disable_ipv6 = 1)');
    if (r.code !== 0 && /cannot stat|No such file/i.test(r.stderr)) throw new Error('the kernel has no IPv6 (no net.ipv6 sysctls)');
  }

  /**
   * The host work before the first sync: other modes' leftovers removed, the host's
   * addresses probed, the proxiers made (their tools probed).
   */
  private async prepareHost(): Promise<void> {
    if (!this.opts.skipCleanup) await this.cleanupOtherModes();
    await this.probeHostIPs();
    await this.createProxiers();
    this.opts.log.info({ families: this.families.map((f) => `IPv${f.family}`) }, 'IP families served');
  }

  async start(): Promise<void> {
    const { log } = this.opts;
    // The host work runs while the sources load: it waits on commands, the load on this
    // process's CPU. Events meanwhile go to every family's tracker; the first sync waits for both.
    const prepared = this.prepareHost();
    prepared.catch(() => {}); // awaited below, after the sources started
    await this.opts.source.start({
      onService: (o, n) => {
        for (const l of this.changeListeners) l('service');
        let pending = false;
        for (const f of this.families) if (f.tracker.services.update(o, n)) pending = true;
        if (pending) this.queueSync();
      },
      onEndpointSlice: (o, n) => {
        for (const l of this.changeListeners) l('endpoints');
        let pending = false;
        for (const f of this.families) if (f.tracker.endpoints.update(o, n)) pending = true;
        if (pending) this.queueSync();
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
      // the source refused the object as the API server would have (it logged why)
      onInvalid: (kind) => this.countInvalid(kind),
      onSynced: () => {
        if (this.synced) return;
        this.synced = true;
        log.info('sources synced; starting the sync loop');
        // the load's garbage freed before the first full sync builds its plan (src/sync/memory.ts)
        const loaded = this.pendingChanges();
        const gcStarted = performance.now();
        if (this.gcAfterSync.afterLoad(loaded.services + loaded.endpoints)) {
          log.info({ durationMs: Math.round(performance.now() - gcStarted), memoryMiB: GarbageAfterSync.usage() }, "collected the sources' load garbage");
        }
        this.health.queuedUpdate(); // the first sync is pending from now: /livez measures it from here
        for (const l of this.queuedListeners) l(); // as upstream's SyncLoop: "synthesize last change queued"
        prepared.then(
          () => this.stopping || this.loop.start(),
          () => {}, // start() rejects with it
        );
      },
    });
    try {
      await prepared;
    } catch (e) {
      await this.opts.source.stop().catch(() => {});
      throw e;
    }
  }

  /**
   * A change needs a sync. Before the sources synced no sync can run, so nothing counts as
   * queued for health (upstream's proxiers ignore events until initialized): a slow or
   * unreachable API server at start-up must not make the kubelet restart kproxy.
   */
  private queueSync(full = false): void {
    if (this.synced) {
      this.health.queuedUpdate();
      for (const l of this.queuedListeners) l();
    }
    if (full) this.loop.requestFull();
    else this.loop.request();
  }

  async stop(): Promise<void> {
    this.stopping = true;
    await this.opts.source.stop();
    await this.loop.stop();
    for (const f of this.families) await f.proxier?.stop();
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
        const text = await new IptablesExecutor(runner, 4).saveIfReadable('nat');
        return text !== null && [...chainsFromSave(text, 'nat')].some((c) => /^KUBE-(SVC|SEP)-/.test(c));
      }
    } catch {
      return false;
    }
    return false;
  }

  /**
   * Syncs every family's proxier in turn. A family that fails does not stop the other: its
   * rules keep converging, and the failed one is retried (with a full sync) by the loop. The
   * health clears only when every family is up to date, so the oldest update any family still
   * waits for is what /livez measures.
   */
  private async syncOnce(full: boolean): Promise<void> {
    const started = Date.now();
    this.health.syncStarted();
    const rec: SyncRecord = { at: started, full, durationMs: 0, ok: false, changed: [], families: [] };
    const changedAll = new Set<string>();
    const errors: Array<{ family: 4 | 6; err: Error }> = [];
    try {
      if (!this.families.some((f) => f.proxier)) throw new Error('proxier not created');
      for (const f of this.families) {
        const famStarted = Date.now();
        const changed = this.takeChanges(f);
        for (const k of changed) changedAll.add(k);
        await this.syncFamily(f, changed, full || f.failed, famStarted, rec.families!, errors);
      }
      const stats = sumFamilyStats(rec.families!);
      if (stats) rec.stats = stats;
      if (errors.length) throw this.familiesError(errors);
      rec.ok = true;
      this.health.updated();
    } catch (e) {
      this.health.syncFailed();
      rec.error = (e as Error).message;
      throw e;
    } finally {
      this.recordSync(rec, full, started, changedAll);
    }
  }

  /**
   * A family's tracker applies its pending changes; returns the Services to sync (every one
   * changed since the family's last success) and keeps the endpoint changes' trigger times.
   */
  private takeChanges(f: FamilyRuntime): Set<string> {
    for (const k of f.tracker.apply()) f.changedSinceSuccess.add(k);
    for (const t of f.tracker.endpoints.takeTriggerTimes()) {
      // bounded while syncs keep failing: the oldest changes are the ones the SLO is about
      if (t > this.trackerStartedAt && f.triggerTimes.length < MAX_PENDING_TRIGGER_TIMES) f.triggerTimes.push(t);
    }
    return new Set(f.changedSinceSuccess);
  }

  /**
   * One family's proxier sync, then its conntrack cleanup; its record goes to `records`, and
   * a failure to `errors` (it never throws: the other family is still synced).
   */
  private async syncFamily(
    f: FamilyRuntime,
    changed: Set<string>,
    famFull: boolean,
    famStarted: number,
    records: FamilySyncRecord[],
    errors: Array<{ family: 4 | 6; err: Error }>,
  ): Promise<void> {
    let input: PlanInput | undefined;
    try {
      if (!f.proxier) throw new Error('proxier not created');
      input = this.planInput(f.family, famFull ? undefined : changed);
      const stats = await f.proxier.sync(input, changed, famFull);
      f.lastView = input.view;
      f.changedSinceSuccess.clear();
      f.failed = false;
      // The changes are in the kernel now: their programming latency ends here (kept over
      // failed syncs, which upstream loses, until the sync that programs them).
      const programmedAt = this.now();
      const latencies = f.triggerTimes.map((t) => Math.max(0, programmedAt - t) / 1000);
      f.triggerTimes = [];
      // Stale UDP/SCTP flows and never-DNATed TCP attempts: the cleaner logs its failures and
      // never fails the sync.
      const flows = input.view?.staleFlows ?? [];
      const ct = flows.length && this.opts.conntrack ? await this.opts.conntrack.clean(f.family, flows).catch(() => undefined) : undefined;
      records.push({
        family: f.family, ok: true, full: famFull, durationMs: Date.now() - famStarted, stats,
        ...(ct ? { conntrack: ct } : {}),
        ...(latencies.length ? { networkProgrammingSeconds: latencies } : {}),
        noLocalEndpoints: countNoLocalEndpoints(input.view),
      });
    } catch (e) {
      // the incremental view updated lastView's maps: put them back (the next sync, full,
      // computes its stale flows against the last view applied)
      revertView(input?.view);
      f.failed = true;
      errors.push({ family: f.family, err: e as Error });
      const code = (e as { code?: unknown }).code;
      records.push({
        family: f.family, ok: false, full: famFull, durationMs: Date.now() - famStarted, error: (e as Error).message,
        ...(typeof code === 'string' ? { errorCode: code } : {}),
      });
    }
  }

  /** The error a sync with failed families throws. One family: its error as it is. Two: each message says which family it is. */
  private familiesError(errors: Array<{ family: 4 | 6; err: Error }>): Error {
    if (this.families.length === 1) return errors[0].err;
    const err = new Error(errors.map((x) => `IPv${x.family}: ${x.err.message}`).join('; '));
    return Object.assign(err, { code: (errors[0].err as { code?: string }).code });
  }

  /**
   * Ends a sync, whether it succeeded or not: its record goes to the history and the
   * listeners, a successful one is logged, and garbage is collected after it.
   */
  private recordSync(rec: SyncRecord, full: boolean, started: number, changedAll: Set<string>): void {
    rec.changed = [...changedAll].sort();
    rec.durationMs = Date.now() - started;
    this.history.push(rec);
    if (this.history.length > 50) this.history.shift();
    for (const l of this.listeners) l(rec);
    if (rec.ok) {
      // the periodic partial sync with nothing to do is the common case: not worth a line at info
      const quiet = !full && rec.changed.length === 0 && !rec.stats?.rulesWritten;
      this.opts.log[quiet ? 'debug' : 'info'](
        { full, durationMs: rec.durationMs, changed: rec.changed.length, rulesWritten: rec.stats?.rulesWritten, rulesTotal: rec.stats?.rulesTotal },
        'synced',
      );
      if (rec.stats?.diff) this.opts.log.debug({ diff: rec.stats.diff }, 'sync diff');
    }
    // after the record and the log line: the rules are in the kernel already
    const gcStarted = performance.now();
    if (this.gcAfterSync.afterSync({ ok: rec.ok, full, rulesTotal: rec.stats?.rulesTotal })) {
      const gcMs = Math.round(performance.now() - gcStarted);
      this.opts.log.info({ durationMs: gcMs, memoryMiB: GarbageAfterSync.usage() }, 'collected the full sync\'s garbage');
    }
  }
}

/** The stats of a sync: the sums over the families that synced (undefined when none did). */
function sumFamilyStats(families: FamilySyncRecord[]): SyncStats | undefined {
  const ok = families.filter((r) => r.ok && r.stats);
  if (!ok.length) return undefined;
  const diffs = ok.map((r) => r.stats!.diff).filter((d): d is string => !!d);
  const stats: SyncStats = {
    rulesWritten: ok.reduce((n, r) => n + r.stats!.rulesWritten, 0),
    rulesTotal: ok.reduce((n, r) => n + r.stats!.rulesTotal, 0),
    ...(diffs.length ? { diff: diffs.join('\n') } : {}),
  };
  const rejected = ok.reduce((n, r) => n + (r.stats!.rejected ?? 0), 0);
  if (rejected) stats.rejected = rejected;
  return stats;
}
