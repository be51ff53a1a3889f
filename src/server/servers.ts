// The HTTP endpoints: healthz/livez (default 0.0.0.0:10256, as upstream) and metrics plus
// debug endpoints (default 127.0.0.1:10249: rules and state are not for the network).
import { createServer, type Server, type IncomingMessage, type ServerResponse } from 'node:http';
import client from 'prom-client';
import type { FamilySyncRecord, ProxyController, SyncRecord } from '../sync/controller.ts';
import type { ObjectKind } from '../core/api.ts';
import type { Source } from '../sources/types.ts';
import type { AllocationReport } from '../sources/service-alloc.ts';
import type { Logger } from '../log.ts';
import type { UserspaceProxier } from '../modes/userspace/proxier.ts';
import { TO_BE_DELETED_TAINT, type HealthVerdict } from '../sync/health.ts';

/** The zero time upstream writes as lastUpdated when no sync ever succeeded (Go's time.Time{}). */
const ZERO_TIME = '0001-01-01T00:00:00Z';
/** No string in the debug report is longer than this (error texts can carry whole payloads). */
export const MAX_DETAIL_CHARS = 512;

/**
 * Makes a string from an error or a source fit for a report: no control characters (a log
 * or terminal reading it must not be steered), no internal file signatures
 * (`mtime:size:inode|`), at most `max` characters.
 */
export function sanitizeDetail(s: unknown, max = MAX_DETAIL_CHARS): string {
  let t = String(s ?? '')
    .replace(/\b\d+(?:\.\d+)?:\d+:\d+\|/g, '')
    .replace(/[\u0000-\u001f\u007f-\u009f\u2028\u2029]+/g, ' ')
    .replace(/ {2,}/g, ' ')
    .trim();
  if (t.length > max) t = t.slice(0, max - 1) + '…';
  return t;
}

/**
 * The public /healthz and /livez bodies: upstream's fields and nothing else (they listen on
 * 0.0.0.0 by default, so no paths, errors or rule text). As upstream, lastUpdated is the
 * current time while healthy (older releases reported the last sync loop run).
 */
export function publicHealthBody(v: HealthVerdict, kind: 'healthz' | 'livez'): { code: number; body: string } {
  const ok = kind === 'healthz' ? v.healthy : v.live;
  const currentTime = new Date(v.currentTime).toISOString();
  const lastUpdated = ok ? currentTime : v.lastUpdated ? new Date(v.lastUpdated).toISOString() : ZERO_TIME;
  const body = kind === 'healthz' ? { lastUpdated, currentTime, nodeEligible: v.nodeEligible } : { lastUpdated, currentTime };
  return { code: ok ? 200 : 503, body: JSON.stringify(body) };
}

export interface HealthReport {
  /** what /healthz answers */
  healthy: boolean;
  /** what /livez answers */
  live: boolean;
  nodeEligible: boolean;
  lastUpdated: string | null;
  currentTime: string;
  healthTimeoutSeconds: number;
  /** the oldest update still waiting for a successful sync */
  oldestPendingQueued: string | null;
  synced: boolean;
  mode: string;
  syncFailures: number;
  consecutiveFailures: number;
  lastError?: string;
  source: { connected: boolean; lastContact: string | null; staleSeconds: number | null; problem?: string };
  reasons: string[];
  /** the IP families served, primary first */
  families?: string[];
  /** families not served although the node has addresses of them (KPROXY_FAMILY_UNAVAILABLE) */
  unavailableFamilies?: Array<{ family: string; error: string }>;
  /** the manifests source's allocations: counts, and the first few of each (all in /debug/state) */
  allocations?: AllocationSummary;
}

/** What `kproxy status` shows of the manifests source's allocations. */
export interface AllocationSummary {
  serviceClusterIPRange: string[];
  serviceNodePortRange: string;
  allocatedServices: number;
  refusedServices: number;
  allocated: AllocationReport['allocated'];
  refused: AllocationReport['refused'];
}

/** At most this many Services of each list in /debug/health (status prints them); /debug/state has all. */
export const ALLOCATIONS_SHOWN = 20;

export function allocationSummary(r: AllocationReport): AllocationSummary {
  return {
    serviceClusterIPRange: r.serviceClusterIPRange,
    serviceNodePortRange: r.serviceNodePortRange,
    allocatedServices: r.allocated.length,
    refusedServices: r.refused.length,
    allocated: r.allocated.slice(0, ALLOCATIONS_SHOWN),
    refused: r.refused.slice(0, ALLOCATIONS_SHOWN).map((x) => ({ ...x, reason: sanitizeDetail(x.reason) })),
  };
}

/**
 * The detailed report for the local debug server (/debug/health) and `kproxy status`: the
 * verdicts of /healthz and /livez, why, how stale the source's view is, the last error. A
 * source that cannot reach its origin does not make the data plane unhealthy (rules stay
 * in place), but the report says how stale the view is.
 */
export function healthReport(ctrl: ProxyController, source: Source, mode: string): HealthReport {
  const v = ctrl.health.verdict();
  const now = v.currentTime;
  const st = ctrl.loop.status;
  const src = source.health();
  const reasons: string[] = [];
  if (!ctrl.isSynced) reasons.push('sources not synced yet');
  else if (!v.lastUpdated) reasons.push('no successful sync yet');
  if (!v.live) reasons.push(`an update has waited ${Math.round((now - v.oldestPendingQueued) / 1000)}s for a successful sync (health timeout ${Math.round(ctrl.health.healthTimeoutMs / 1000)}s)`);
  if (!v.nodeEligible) reasons.push(`node not eligible: being deleted or tainted ${TO_BE_DELETED_TAINT}`);
  if (st.consecutiveFailures > 0) reasons.push(`last ${st.consecutiveFailures} sync(s) failed`);
  return {
    healthy: v.healthy,
    live: v.live,
    nodeEligible: v.nodeEligible,
    lastUpdated: v.lastUpdated ? new Date(v.lastUpdated).toISOString() : null,
    currentTime: new Date(now).toISOString(),
    healthTimeoutSeconds: ctrl.health.healthTimeoutMs / 1000,
    oldestPendingQueued: v.oldestPendingQueued ? new Date(v.oldestPendingQueued).toISOString() : null,
    synced: ctrl.isSynced,
    mode,
    syncFailures: st.failures,
    consecutiveFailures: st.consecutiveFailures,
    lastError: st.lastError === undefined ? undefined : sanitizeDetail(st.lastError),
    source: {
      connected: src.connected,
      lastContact: src.lastContactMs ? new Date(src.lastContactMs).toISOString() : null,
      staleSeconds: src.lastContactMs ? Math.round((now - src.lastContactMs) / 1000) : null,
      problem: src.problem === undefined ? undefined : sanitizeDetail(src.problem),
    },
    reasons,
    families: ctrl.families.map((f) => `IPv${f.family}`),
    ...(ctrl.unavailableFamilies.length
      ? { unavailableFamilies: ctrl.unavailableFamilies.map((u) => ({ family: `IPv${u.family}`, error: sanitizeDetail(u.error) })) }
      : {}),
    ...(source.allocations ? { allocations: allocationSummary(source.allocations()) } : {}),
  };
}

function splitHostPort(addr: string): { host: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]*)):(\d+)$/.exec(addr);
  if (!m) return { host: addr, port: 0 };
  return { host: m[1] ?? (m[2] || '0.0.0.0'), port: Number(m[3]) };
}

function listen(server: Server, addr: string): Promise<void> {
  const { host, port } = splitHostPort(addr);
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

export interface ServerDeps {
  ctrl: ProxyController;
  source: Source;
  mode: string;
  log: Logger;
}

/** prometheus.ExponentialBuckets(start, factor, count) */
function exponentialBuckets(start: number, factor: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => Number((start * factor ** i).toPrecision(12)));
}

/** prometheus.LinearBuckets(start, width, count) */
function linearBuckets(start: number, width: number, count: number): number[] {
  return Array.from({ length: count }, (_, i) => start + width * i);
}

/** upstream's sync latency buckets: ExponentialBuckets(0.001, 2, 15), 1 ms to 16.384 s */
export const SYNC_DURATION_BUCKETS = exponentialBuckets(0.001, 2, 15);

/**
 * upstream's network programming buckets: MergeBuckets(LinearBuckets(0.25, 0.25, 2),
 * LinearBuckets(1, 1, 59), LinearBuckets(60, 5, 12), LinearBuckets(120, 30, 7)); MergeBuckets
 * starts from a 0 bucket (component-base/metrics/buckets.go).
 */
export const NETWORK_PROGRAMMING_BUCKETS = [0, ...linearBuckets(0.25, 0.25, 2), ...linearBuckets(1, 1, 59), ...linearBuckets(60, 5, 12), ...linearBuckets(120, 30, 7)];

/** iptables-restore failures: upstream's sync_proxy_rules_iptables_restore_failures_total */
const RESTORE_FAILURE_CODES = new Set(['KPROXY_IPTABLES_RESTORE_FAILED', 'KPROXY_IPTABLES_RESTORE_TIMEOUT', 'KPROXY_IPVS_IPTABLES_FAILED']);
/** nft -f failures (the nftables mode counts every failed sync; these say so without a mode) */
const NFT_FAILURE_CODES = new Set(['KPROXY_NFT_APPLY', 'KPROXY_NFT_TIMEOUT']);

const ipFamilyLabel = (family: 4 | 6) => (family === 6 ? 'IPv6' : 'IPv4');

/** The controller's side that the metrics read (ProxyController; a fake in tests). */
export interface MetricsSource {
  onSync(fn: (r: SyncRecord) => void): void;
  onInvalid(fn: (kind: ObjectKind, source: string) => void): void;
  onQueued(fn: () => void): void;
  onChange(fn: (kind: 'service' | 'endpoints') => void): void;
  pendingChanges(): { services: number; endpoints: number };
  families: Array<{ family: 4 | 6; tracker: { state: { services: Map<string, unknown> } }; proxier: unknown }>;
}

export interface MetricsOptions {
  /**
   * The proxy mode: the mode-specific upstream metrics are registered as upstream's
   * RegisterMetrics does (iptables: the iptables restore failures and rule counts; ipvs: the
   * restore failures; nftables: the nftables failures). Absent: all of them (tests, docs).
   */
  mode?: string;
  /** process_* and nodejs_* metrics of prom-client (default true) */
  processMetrics?: boolean;
}

/**
 * Every metric /metrics exports: upstream's (pkg/proxy/metrics/metrics.go: subsystem
 * kubeproxy, the same names, types, label names and buckets; ip_family labels as upstream's
 * dual-stack proxiers) and kproxy's own (kproxy_*).
 */
export class Metrics {
  readonly registry = new client.Registry();
  readonly mode?: string;
  private readonly has = (...modes: string[]) => this.mode === undefined || modes.includes(this.mode);
  private pending: () => { services: number; endpoints: number } = () => ({ services: 0, endpoints: 0 });

  // ---- upstream's (kubeproxy_*) ----
  private readonly duration = new client.Histogram({ name: 'kubeproxy_sync_proxy_rules_duration_seconds', help: 'SyncProxyRules latency in seconds', labelNames: ['ip_family'], buckets: SYNC_DURATION_BUCKETS, registers: [this.registry] });
  // upstream registers these two for iptables and nftables only; every kproxy mode syncs full or partial
  private readonly fullDuration = new client.Histogram({ name: 'kubeproxy_sync_full_proxy_rules_duration_seconds', help: 'SyncProxyRules latency in seconds for full resyncs', labelNames: ['ip_family'], buckets: SYNC_DURATION_BUCKETS, registers: [this.registry] });
  private readonly partialDuration = new client.Histogram({ name: 'kubeproxy_sync_partial_proxy_rules_duration_seconds', help: 'SyncProxyRules latency in seconds for partial resyncs', labelNames: ['ip_family'], buckets: SYNC_DURATION_BUCKETS, registers: [this.registry] });
  private readonly lastTs = new client.Gauge({ name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds', help: 'The last time proxy rules were successfully synced', labelNames: ['ip_family'], registers: [this.registry] });
  private readonly lastQueuedTs = new client.Gauge({ name: 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', help: 'The last time a sync of proxy rules was queued', labelNames: ['ip_family'], registers: [this.registry] });
  private readonly programming = new client.Histogram({ name: 'kubeproxy_network_programming_duration_seconds', help: 'In Cluster Network Programming Latency in seconds', labelNames: ['ip_family'], buckets: NETWORK_PROGRAMMING_BUCKETS, registers: [this.registry] });
  private readonly endpointChangesTotal = new client.Counter({ name: 'kubeproxy_sync_proxy_rules_endpoint_changes_total', help: 'Cumulative proxy rules Endpoint changes', registers: [this.registry] });
  private readonly serviceChangesTotal = new client.Counter({ name: 'kubeproxy_sync_proxy_rules_service_changes_total', help: 'Cumulative proxy rules Service changes', registers: [this.registry] });
  private readonly noLocal = new client.Gauge({ name: 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', help: 'Number of services with a Local traffic policy and no endpoints', labelNames: ['ip_family', 'traffic_policy'], registers: [this.registry] });
  readonly healthzTotal = new client.Counter({ name: 'kubeproxy_proxy_healthz_total', help: 'Cumulative proxy healthz HTTP status', labelNames: ['code'], registers: [this.registry] });
  readonly livezTotal = new client.Counter({ name: 'kubeproxy_proxy_livez_total', help: 'Cumulative proxy livez HTTP status', labelNames: ['code'], registers: [this.registry] });
  private readonly ctDeleted = new client.Counter({ name: 'kubeproxy_conntrack_reconciler_deleted_entries_total', help: 'Cumulative conntrack flows deleted by conntrack reconciler', labelNames: ['ip_family'], registers: [this.registry] });
  private readonly ctDuration = new client.Histogram({ name: 'kubeproxy_conntrack_reconciler_sync_duration_seconds', help: 'ReconcileConntrackFlowsLatency latency in seconds', labelNames: ['ip_family'], buckets: SYNC_DURATION_BUCKETS, registers: [this.registry] });
  private readonly restoreFailures?: client.Counter<'ip_family'>;
  private readonly partialRestoreFailures?: client.Counter<'ip_family'>;
  private readonly iptablesTotal?: client.Gauge<'ip_family' | 'table'>;
  private readonly iptablesLast?: client.Gauge<'ip_family' | 'table'>;
  private readonly nftSyncFailures?: client.Counter<'ip_family'>;
  private readonly nftCleanupFailures?: client.Counter<'ip_family'>;
  private readonly lnpListeners?: client.Gauge<'ip_family'>;
  private readonly lnpFailures?: client.Counter<'ip_family'>;
  private readonly lnpFailuresSeen = new Map<string, number>();
  private readonly nftTables?: client.Gauge<'ip_family'>;

  // ---- kproxy's own (kproxy_*) ----
  private readonly failures = new client.Counter({ name: 'kproxy_sync_failures_total', help: 'Syncs that failed (the previous rules stayed in place)', registers: [this.registry] });
  private readonly written = new client.Gauge({ name: 'kproxy_sync_rules_written', help: 'Rules or objects written by the last sync', registers: [this.registry] });
  private readonly total = new client.Gauge({ name: 'kproxy_rules_total', help: 'Rules or objects kproxy believes are installed', registers: [this.registry] });
  private readonly services = new client.Gauge({ name: 'kproxy_service_ports', help: 'Service ports known to kproxy', registers: [this.registry] });
  private readonly invalid = new client.Counter({ name: 'kproxy_invalid_objects_total', help: 'API objects refused at validation and skipped (every refused add or update counts)', labelNames: ['kind', 'source'], registers: [this.registry] });
  private readonly excluded = new client.Gauge({ name: 'kproxy_sync_excluded_services', help: 'Services left out of the last sync because the kernel refused their part of an atomic transaction', registers: [this.registry] });
  private readonly rejected = new client.Counter({ name: 'kproxy_sync_rejected_objects_total', help: 'Objects (set entries, virtual servers) the kernel refused and the sync left out', registers: [this.registry] });

  constructor(opts: MetricsOptions = {}) {
    this.mode = opts.mode;
    const registers = [this.registry];
    // Read at scrape time (upstream sets them on every change and sync).
    const metrics = this;
    new client.Gauge({
      name: 'kubeproxy_sync_proxy_rules_endpoint_changes_pending', help: 'Pending proxy rules Endpoint changes', registers,
      collect() { this.set(metrics.pending().endpoints); },
    });
    new client.Gauge({
      name: 'kubeproxy_sync_proxy_rules_service_changes_pending', help: 'Pending proxy rules Service changes', registers,
      collect() { this.set(metrics.pending().services); },
    });
    if (this.has('iptables', 'ipvs')) {
      this.restoreFailures = new client.Counter({ name: 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total', help: 'Cumulative proxy iptables restore failures', labelNames: ['ip_family'], registers });
    }
    if (this.has('iptables')) {
      this.partialRestoreFailures = new client.Counter({ name: 'kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total', help: 'Cumulative proxy iptables partial restore failures', labelNames: ['ip_family'], registers });
      this.iptablesTotal = new client.Gauge({ name: 'kubeproxy_sync_proxy_rules_iptables_total', help: 'Total number of iptables rules owned by kube-proxy', labelNames: ['ip_family', 'table'], registers });
      this.iptablesLast = new client.Gauge({ name: 'kubeproxy_sync_proxy_rules_iptables_last', help: 'Number of iptables rules written by kube-proxy in last sync', labelNames: ['ip_family', 'table'], registers });
    }
    if (this.has('nftables')) {
      this.nftSyncFailures = new client.Counter({ name: 'kubeproxy_sync_proxy_rules_nftables_sync_failures_total', help: 'Cumulative proxy nftables sync failures', labelNames: ['ip_family'], registers });
      this.nftCleanupFailures = new client.Counter({ name: 'kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total', help: 'Cumulative proxy nftables cleanup failures', labelNames: ['ip_family'], registers });
      // upstream pkg/proxy/metrics (v1.37, alpha, KEP-6032): the localhost NodePort proxy's listeners
      this.lnpListeners = new client.Gauge({ name: 'kubeproxy_nftables_localhost_nodeport_listeners', help: 'Number of active localhost NodePort proxy listeners', labelNames: ['ip_family'], registers });
      this.lnpFailures = new client.Counter({ name: 'kubeproxy_nftables_localhost_nodeport_listener_creation_failures_total', help: 'Cumulative localhost NodePort proxy listener creation failures', labelNames: ['ip_family'], registers });
      this.nftTables = new client.Gauge({ name: 'kproxy_nftables_tables', help: 'Number of nftables tables the Services are spread over (1: upstream\'s kube-proxy table)', labelNames: ['ip_family'], registers });
    }
    if (opts.processMetrics !== false) client.collectDefaultMetrics({ register: this.registry });
  }

  /** Feeds the metrics from a controller: syncs, invalid objects, queued syncs, changes. */
  attach(ctrl: MetricsSource): void {
    ctrl.onSync((r) => this.record(r, ctrl.families.reduce((n, f) => n + f.tracker.state.services.size, 0)));
    ctrl.onInvalid((kind, source) => this.countInvalid(kind, source));
    ctrl.onQueued(() => this.queued(ctrl.families.map((f) => f.family)));
    ctrl.onChange((kind) => this.countChange(kind));
    this.pending = () => ctrl.pendingChanges();
  }

  countInvalid(kind: string, source: string): void {
    this.invalid.inc({ kind, source });
  }

  /** a Service or EndpointSlice event reached the trackers (counted whether it changes anything or not, as upstream) */
  countChange(kind: 'service' | 'endpoints'): void {
    (kind === 'service' ? this.serviceChangesTotal : this.endpointChangesTotal).inc();
  }

  /** a sync was queued for these families */
  queued(families: Array<4 | 6>, at = Date.now()): void {
    for (const f of families) this.lastQueuedTs.set({ ip_family: ipFamilyLabel(f) }, at / 1000);
  }

    private readonly usSeen = new Map<string, { accepted: number; failed: number; refused: number; denied: number; idleClosed: number }>();
  private readonly usRefused = new client.Counter({ name: 'kproxy_userspace_connections_refused_total', help: 'Connections (TCP) or sessions (UDP) the userspace proxy refused: reason="limit" (userspace.maxConnections, UDP session limits, out of fds) or "denied" (source ranges, traffic policy)', labelNames: ['service_port', 'protocol', 'reason'], registers: [this.registry] });
  private readonly usIdleClosed = new client.Counter({ name: 'kproxy_userspace_connections_idle_closed_total', help: 'TCP connections the userspace proxy closed after userspace.idleTimeout of silence', labelNames: ['service_port', 'protocol'], registers: [this.registry] });
  private readonly usAccepted = new client.Counter({ name: 'kproxy_userspace_connections_accepted_total', help: 'Connections (TCP) or sessions (UDP) accepted by the userspace proxy', labelNames: ['service_port', 'protocol'], registers: [this.registry] });
  private readonly usFailed = new client.Counter({ name: 'kproxy_userspace_connections_failed_total', help: 'Connections or datagrams the userspace proxy could not forward to any endpoint', labelNames: ['service_port', 'protocol'], registers: [this.registry] });
  private readonly usActive = new client.Gauge({ name: 'kproxy_userspace_connections_active', help: 'Open spliced connections or UDP sessions', labelNames: ['service_port', 'protocol'], registers: [this.registry] });

  /** The userspace proxier keeps monotonic totals; prom counters get the deltas. */
  collectUserspace(proxiers: unknown): void {
    // One proxier per IP family: a service port's counters are the sum over the families.
    const sum = new Map<string, { servicePort: string; protocol: string; accepted: number; failed: number; active: number; refused: number; denied: number; idleClosed: number }>();
    for (const proxier of Array.isArray(proxiers) ? proxiers : [proxiers]) {
      const p = proxier as Partial<UserspaceProxier> | null;
      if (!p || typeof p.counters !== 'function') continue;
      for (const c of p.counters()) {
        const k = `${c.servicePort}|${c.protocol}`;
        const s = sum.get(k) ?? { servicePort: c.servicePort, protocol: c.protocol, accepted: 0, failed: 0, active: 0, refused: 0, denied: 0, idleClosed: 0 };
        s.accepted += c.accepted;
        s.failed += c.failed;
        s.active += c.active;
        s.refused += c.refused ?? 0;
        s.denied += c.denied ?? 0;
        s.idleClosed += c.idleClosed ?? 0;
        sum.set(k, s);
      }
    }
    for (const c of sum.values()) {
      const labels = { service_port: c.servicePort, protocol: c.protocol };
      const key = `${c.servicePort}|${c.protocol}`;
      const prev = this.usSeen.get(key) ?? { accepted: 0, failed: 0, refused: 0, denied: 0, idleClosed: 0 };
      if (c.accepted > prev.accepted) this.usAccepted.inc(labels, c.accepted - prev.accepted);
      if (c.failed > prev.failed) this.usFailed.inc(labels, c.failed - prev.failed);
      if (c.refused > prev.refused) this.usRefused.inc({ ...labels, reason: 'limit' }, c.refused - prev.refused);
      if (c.denied > prev.denied) this.usRefused.inc({ ...labels, reason: 'denied' }, c.denied - prev.denied);
      if (c.idleClosed > prev.idleClosed) this.usIdleClosed.inc(labels, c.idleClosed - prev.idleClosed);
      this.usActive.set(labels, c.active);
      this.usSeen.set(key, { accepted: c.accepted, failed: c.failed, refused: c.refused, denied: c.denied, idleClosed: c.idleClosed });
    }
  }

  record(r: SyncRecord, servicePorts: number): void {
    // per family, as upstream's per-family proxiers: a family that synced counts even when the other failed
    for (const f of r.families ?? []) this.recordFamily(r, f);
    if (!r.ok) {
      this.failures.inc();
      return;
    }
    this.written.set(r.stats?.rulesWritten ?? 0);
    this.total.set(r.stats?.rulesTotal ?? 0);
    this.services.set(servicePorts);
    this.excluded.set(r.stats?.excludedServices?.length ?? 0);
    if (r.stats?.rejected) this.rejected.inc(r.stats.rejected);
  }

  private recordFamily(r: SyncRecord, f: FamilySyncRecord): void {
    const ip_family = ipFamilyLabel(f.family);
    const labels = { ip_family };
    // Upstream observes the latency of failed syncs too (a deferred Observe).
    if (f.durationMs !== undefined) {
      const s = f.durationMs / 1000;
      this.duration.observe(labels, s);
      (f.full ? this.fullDuration : this.partialDuration).observe(labels, s);
    }
    if (f.conntrack) {
      this.ctDeleted.inc(labels, f.conntrack.deleted);
      this.ctDuration.observe(labels, f.conntrack.durationMs / 1000);
    }
    if (!f.ok) {
      const code = f.errorCode ?? '';
      if (RESTORE_FAILURE_CODES.has(code)) this.restoreFailures?.inc(labels);
      // upstream counts every failed partial sync of the iptables proxier (it falls back to a full one)
      if (!f.full && (this.mode === 'iptables' || (this.mode === undefined && RESTORE_FAILURE_CODES.has(code)))) this.partialRestoreFailures?.inc(labels);
      if (this.mode === 'nftables' || (this.mode === undefined && NFT_FAILURE_CODES.has(code))) this.nftSyncFailures?.inc(labels);
      return;
    }
    this.lastTs.set(labels, (r.at + (f.durationMs ?? r.durationMs)) / 1000);
    for (const s of f.networkProgrammingSeconds ?? []) this.programming.observe(labels, s);
    if (f.noLocalEndpoints) {
      this.noLocal.set({ ip_family, traffic_policy: 'internal' }, f.noLocalEndpoints.internal);
      this.noLocal.set({ ip_family, traffic_policy: 'external' }, f.noLocalEndpoints.external);
    }
    for (const [table, n] of Object.entries(f.stats?.rulesByTable ?? {})) {
      this.iptablesTotal?.set({ ip_family, table }, n.total);
      this.iptablesLast?.set({ ip_family, table }, n.written);
    }
    if (f.stats?.cleanupFailures) this.nftCleanupFailures?.inc(labels, f.stats.cleanupFailures);
    if (f.stats?.tables !== undefined) this.nftTables?.set(labels, f.stats.tables);
  }

  /** every metric name this registry exports (the dashboard test checks its queries against it) */
  async names(): Promise<string[]> {
    return (await this.registry.getMetricsAsJSON()).map((m) => m.name);
  }

  private readonly usPlanRefused = new client.Gauge({ name: 'kproxy_userspace_refused_service_ports', help: 'Service ports the userspace mode refuses at plan time (reason="sctp": Node has no SCTP sockets)', labelNames: ['reason'], registers: [this.registry] });

  private readonly usWorkers = new client.Gauge({ name: 'kproxy_userspace_workers', help: 'userspace.workers processes running besides kproxy\'s own', registers: [this.registry] });
  private readonly usWorkerRestarts = new client.Counter({ name: 'kproxy_userspace_worker_restarts_total', help: 'userspace worker processes started again after an exit or a refused start', registers: [this.registry] });
  private readonly usWorkerStartFailures = new client.Counter({ name: 'kproxy_userspace_worker_start_failures_total', help: 'userspace worker starts the host refused (EMFILE, EAGAIN, ...)', registers: [this.registry] });
  private usWorkersSeen = { restarts: 0, failures: 0 };

  /** The userspace worker processes (userspace.workers > 1), summed over the families. */
  collectUserspaceWorkers(proxiers: unknown): void {
    let live = 0;
    let restarts = 0;
    let failures = 0;
    let any = false;
    for (const proxier of Array.isArray(proxiers) ? proxiers : [proxiers]) {
      const p = proxier as Partial<UserspaceProxier> | null;
      const h = p && typeof p.workerHealth === 'function' ? p.workerHealth() : null;
      if (!h || typeof p?.workerStats !== 'function') continue;
      any = true;
      live += p.workerStats().filter((w) => w.pid > 0).length;
      restarts += h.restarts;
      failures += h.forkErrors;
    }
    if (!any) return;
    this.usWorkers.set(live);
    // the pools keep monotonic totals; the counters get the deltas
    if (restarts > this.usWorkersSeen.restarts) this.usWorkerRestarts.inc(restarts - this.usWorkersSeen.restarts);
    if (failures > this.usWorkersSeen.failures) this.usWorkerStartFailures.inc(failures - this.usWorkersSeen.failures);
    this.usWorkersSeen = { restarts, failures };
  }

  /** The nftables mode's localhost NodePort listeners per family (src/modes/nftables/localhost-nodeports.ts). */
  collectLocalhostNodePorts(families: Array<{ family: 4 | 6; proxier: unknown }>): void {
    if (!this.lnpListeners || !this.lnpFailures) return;
    for (const f of families) {
      const p = f.proxier as { localhostNodePorts?: () => { listeners: number; creationFailures: number } } | null;
      if (!p || typeof p.localhostNodePorts !== 'function') continue;
      const { listeners, creationFailures } = p.localhostNodePorts();
      const ip_family = ipFamilyLabel(f.family);
      this.lnpListeners.set({ ip_family }, listeners);
      // the proxier keeps a monotonic total; the counter gets the delta
      const seen = this.lnpFailuresSeen.get(ip_family) ?? 0;
      if (creationFailures > seen) this.lnpFailures.inc({ ip_family }, creationFailures - seen);
      this.lnpFailuresSeen.set(ip_family, creationFailures);
    }
  }

  /** Service ports the userspace proxiers refuse at plan time (SCTP), summed over the families. */
  collectUserspaceRefusals(proxiers: unknown): void {
    let sctp: number | null = null;
    for (const proxier of Array.isArray(proxiers) ? proxiers : [proxiers]) {
      const p = proxier as Partial<UserspaceProxier> | null;
      if (p && typeof p.refused === 'function') sctp = (sctp ?? 0) + p.refused().sctp.length;
    }
    if (sctp !== null) this.usPlanRefused.set({ reason: 'sctp' }, sctp);
  }
}

export interface RunningServers {
  close(): Promise<void>;
  metrics: Metrics;
  /** the ports actually bound (an address with port 0 gets one from the kernel) */
  ports: { healthz?: number; metrics?: number };
}

export async function startServers(deps: ServerDeps, healthzAddr: string, metricsAddr: string): Promise<RunningServers> {
  const metrics = new Metrics({ mode: deps.mode });
  metrics.attach(deps.ctrl);
  const servers: Server[] = [];

  const json = (res: ServerResponse, code: number, body: unknown) => {
    res.writeHead(code, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body, null, 2) + '\n');
  };

  // The public health server: upstream's /healthz (readiness: synced, nothing late, node
  // eligible) and /livez (liveness: nothing late), small fixed bodies, counted as upstream.
  const { healthzTotal, livezTotal } = metrics;
  const healthPath = (req: IncomingMessage) => (req.url ?? '/').split('?')[0];
  const answerHealth = (res: ServerResponse, kind: 'healthz' | 'livez', count: boolean) => {
    const { code, body } = publicHealthBody(deps.ctrl.health.verdict(), kind);
    if (count) (kind === 'healthz' ? healthzTotal : livezTotal).inc({ code: String(code) });
    res.writeHead(code, { 'content-type': 'application/json', 'x-content-type-options': 'nosniff' });
    res.end(body);
  };
  const health = createServer((req: IncomingMessage, res: ServerResponse) => {
    const path = healthPath(req);
    if (path === '/healthz' || path === '/livez') return answerHealth(res, path === '/healthz' ? 'healthz' : 'livez', true);
    res.writeHead(404, { 'content-type': 'text/plain', 'x-content-type-options': 'nosniff' });
    res.end('404 page not found\n');
  });

  const metricsServer = createServer(async (req, res) => {
    const url = req.url ?? '/';
    if (url.startsWith('/metrics')) {
      metrics.collectUserspace(deps.ctrl.families.map((f) => f.proxier));
      metrics.collectUserspaceRefusals(deps.ctrl.families.map((f) => f.proxier));
      metrics.collectUserspaceWorkers(deps.ctrl.families.map((f) => f.proxier));
      metrics.collectLocalhostNodePorts(deps.ctrl.families);
      res.writeHead(200, { 'content-type': metrics.registry.contentType });
      return res.end(await metrics.registry.metrics());
    }
    if (url.startsWith('/debug/rules')) {
      res.writeHead(200, { 'content-type': 'text/plain' });
      return res.end(deps.ctrl.dumpRules());
    }
    if (url.startsWith('/debug/diff')) return json(res, 200, deps.ctrl.history.slice(-20).map((r) => (r.error === undefined ? r : { ...r, error: sanitizeDetail(r.error) })));
    if (url.startsWith('/debug/state')) {
      // The primary family's state at the top level (as before dual-stack); every family's
      // under "families", IPv4 first.
      const s = deps.ctrl.tracker.state;
      const families = deps.ctrl.stateByFamily().map((f) => ({ family: `IPv${f.family}`, services: Object.fromEntries(f.state.services), endpoints: Object.fromEntries(f.state.endpoints) }));
      // the manifests source: which Services got which allocated cluster IPs and node ports, which were refused
      const allocations = deps.source.allocations?.();
      return json(res, 200, { services: Object.fromEntries(s.services), endpoints: Object.fromEntries(s.endpoints), families, ...(allocations ? { allocations } : {}) });
    }
    // The detailed health report stays on this local server: paths, errors, staleness.
    if (url.startsWith('/debug/health')) return json(res, 200, healthReport(deps.ctrl, deps.source, deps.mode));
    if (healthPath(req) === '/healthz' || healthPath(req) === '/livez') return answerHealth(res, healthPath(req) === '/healthz' ? 'healthz' : 'livez', false);
    json(res, 404, { error: 'not found' });
  });

  if (healthzAddr) {
    await listen(health, healthzAddr);
    servers.push(health);
  }
  if (metricsAddr) {
    await listen(metricsServer, metricsAddr);
    servers.push(metricsServer);
  }
  deps.log.info({ healthz: healthzAddr, metrics: metricsAddr }, 'serving health and metrics');
  const portOf = (s: Server) => {
    const a = s.address();
    return a && typeof a === 'object' ? a.port : undefined;
  };
  return {
    metrics,
    ports: { healthz: healthzAddr ? portOf(health) : undefined, metrics: metricsAddr ? portOf(metricsServer) : undefined },
    close: async () => {
      await Promise.all(servers.map((s) => new Promise<void>((r) => { s.closeAllConnections?.(); s.close(() => r()); })));
    },
  };
}
