// The HTTP endpoints: healthz/livez (default 0.0.0.0:10256, as upstream) and metrics plus
// debug endpoints (default 127.0.0.1:10249: rules and state are not for the network).
import { createServer, type Server, type IncomingMessage, type ServerResponse } from 'node:http';
import client from 'prom-client';
import type { ProxyController, SyncRecord } from '../sync/controller.ts';
import type { Source } from '../sources/types.ts';
import type { Logger } from '../log.ts';
import type { UserspaceProxier } from '../dataplane/proxier.ts';

export interface HealthReport {
  healthy: boolean;
  lastUpdated: string | null;
  currentTime: string;
  synced: boolean;
  mode: string;
  syncFailures: number;
  lastError?: string;
  source: { connected: boolean; lastContact: string | null; staleSeconds: number | null; problem?: string };
  reasons: string[];
}

/**
 * Healthy means the data plane reflects what kproxy knows: it has synced, and no change or
 * retry has been waiting longer than healthTimeout (2 × syncPeriod, as upstream). A source
 * that cannot reach its origin does not make the data plane unhealthy (rules stay in place),
 * but the report says how stale the view is.
 */
export function healthReport(ctrl: ProxyController, source: Source, mode: string, healthTimeoutMs: number, now = Date.now()): HealthReport {
  const st = ctrl.loop.status;
  const src = source.health();
  const reasons: string[] = [];
  if (!ctrl.isSynced) reasons.push('sources not synced yet');
  else if (!st.lastSuccessAt) reasons.push('no successful sync yet');
  if (st.pendingSince && now - st.pendingSince > healthTimeoutMs) reasons.push(`changes pending for ${Math.round((now - st.pendingSince) / 1000)}s`);
  if (st.consecutiveFailures > 0 && st.lastSuccessAt && now - st.lastSuccessAt > healthTimeoutMs) reasons.push(`sync failing: ${st.lastError}`);
  const healthy = reasons.length === 0;
  return {
    healthy,
    lastUpdated: st.lastSuccessAt ? new Date(st.lastSuccessAt).toISOString() : null,
    currentTime: new Date(now).toISOString(),
    synced: ctrl.isSynced,
    mode,
    syncFailures: st.failures,
    lastError: st.lastError,
    source: {
      connected: src.connected,
      lastContact: src.lastContactMs ? new Date(src.lastContactMs).toISOString() : null,
      staleSeconds: src.lastContactMs ? Math.round((now - src.lastContactMs) / 1000) : null,
      problem: src.problem,
    },
    reasons,
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
  healthTimeoutMs: number;
  log: Logger;
}

export class Metrics {
  readonly registry = new client.Registry();
  private readonly duration = new client.Histogram({
    name: 'kubeproxy_sync_proxy_rules_duration_seconds',
    help: 'SyncProxyRules latency in seconds',
    labelNames: ['full'],
    buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
    registers: [this.registry],
  });
  private readonly lastTs = new client.Gauge({ name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds', help: 'The last time proxy rules were successfully synced', registers: [this.registry] });
  private readonly failures = new client.Counter({ name: 'kproxy_sync_failures_total', help: 'Syncs that failed (the previous rules stayed in place)', registers: [this.registry] });
  private readonly written = new client.Gauge({ name: 'kproxy_sync_rules_written', help: 'Rules or objects written by the last sync', registers: [this.registry] });
  private readonly total = new client.Gauge({ name: 'kproxy_rules_total', help: 'Rules or objects kproxy believes are installed', registers: [this.registry] });
  private readonly services = new client.Gauge({ name: 'kproxy_service_ports', help: 'Service ports known to kproxy', registers: [this.registry] });
  private readonly invalid = new client.Counter({ name: 'kproxy_invalid_objects_total', help: 'API objects refused at validation and skipped (every refused add or update counts)', labelNames: ['kind', 'source'], registers: [this.registry] });

  countInvalid(kind: string, source: string): void {
    this.invalid.inc({ kind, source });
  }

  private readonly usSeen = new Map<string, { accepted: number; failed: number }>();
  private readonly usAccepted = new client.Counter({ name: 'kproxy_userspace_connections_accepted_total', help: 'Connections (TCP) or sessions (UDP) accepted by the userspace proxy', labelNames: ['service_port', 'protocol'], registers: [this.registry] });
  private readonly usFailed = new client.Counter({ name: 'kproxy_userspace_connections_failed_total', help: 'Connections or datagrams the userspace proxy could not forward to any endpoint', labelNames: ['service_port', 'protocol'], registers: [this.registry] });
  private readonly usActive = new client.Gauge({ name: 'kproxy_userspace_connections_active', help: 'Open spliced connections or UDP sessions', labelNames: ['service_port', 'protocol'], registers: [this.registry] });

  /** The userspace proxier keeps monotonic totals; prom counters get the deltas. */
  collectUserspace(proxier: unknown): void {
    const p = proxier as Partial<UserspaceProxier> | null;
    if (!p || typeof p.counters !== 'function') return;
    for (const c of p.counters()) {
      const labels = { service_port: c.servicePort, protocol: c.protocol };
      const key = `${c.servicePort}|${c.protocol}`;
      const prev = this.usSeen.get(key) ?? { accepted: 0, failed: 0 };
      if (c.accepted > prev.accepted) this.usAccepted.inc(labels, c.accepted - prev.accepted);
      if (c.failed > prev.failed) this.usFailed.inc(labels, c.failed - prev.failed);
      this.usActive.set(labels, c.active);
      this.usSeen.set(key, { accepted: c.accepted, failed: c.failed });
    }
  }

  record(r: SyncRecord, servicePorts: number): void {
    if (!r.ok) {
      this.failures.inc();
      return;
    }
    this.duration.observe({ full: String(r.full) }, r.durationMs / 1000);
    this.lastTs.set(r.at / 1000);
    this.written.set(r.stats?.rulesWritten ?? 0);
    this.total.set(r.stats?.rulesTotal ?? 0);
    this.services.set(servicePorts);
  }
}

export async function startServers(deps: ServerDeps, healthzAddr: string, metricsAddr: string): Promise<{ close(): Promise<void>; metrics: Metrics }> {
  const metrics = new Metrics();
  deps.ctrl.onSync((r) => metrics.record(r, deps.ctrl.tracker.state.services.size));
  deps.ctrl.onInvalid((kind, source) => metrics.countInvalid(kind, source));
  const servers: Server[] = [];

  const json = (res: ServerResponse, code: number, body: unknown) => {
    res.writeHead(code, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body, null, 2) + '\n');
  };

  const health = createServer((req: IncomingMessage, res: ServerResponse) => {
    const rep = healthReport(deps.ctrl, deps.source, deps.mode, deps.healthTimeoutMs);
    if (req.url?.startsWith('/healthz')) return json(res, rep.healthy ? 200 : 503, rep);
    if (req.url?.startsWith('/livez')) {
      // Liveness ignores the source: a cluster outage must not make the kubelet restart us.
      const starting = Date.now() - deps.ctrl.startedAt < deps.healthTimeoutMs;
      const live = rep.reasons.every((r) => !r.startsWith('sync failing') && !(starting && r.startsWith('no successful')));
      return json(res, live ? 200 : 503, rep);
    }
    json(res, 404, { error: 'not found' });
  });

  const metricsServer = createServer(async (req, res) => {
    const url = req.url ?? '/';
    if (url.startsWith('/metrics')) {
      metrics.collectUserspace(deps.ctrl.proxier);
      res.writeHead(200, { 'content-type': metrics.registry.contentType });
      return res.end(await metrics.registry.metrics());
    }
    if (url.startsWith('/debug/rules')) {
      res.writeHead(200, { 'content-type': 'text/plain' });
      return res.end(deps.ctrl.proxier?.dump() ?? '');
    }
    if (url.startsWith('/debug/diff')) return json(res, 200, deps.ctrl.history.slice(-20));
    if (url.startsWith('/debug/state')) {
      const s = deps.ctrl.tracker.state;
      return json(res, 200, { services: Object.fromEntries(s.services), endpoints: Object.fromEntries(s.endpoints) });
    }
    if (url.startsWith('/healthz')) {
      const rep = healthReport(deps.ctrl, deps.source, deps.mode, deps.healthTimeoutMs);
      return json(res, rep.healthy ? 200 : 503, rep);
    }
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
  return {
    metrics,
    close: async () => {
      await Promise.all(servers.map((s) => new Promise<void>((r) => { s.closeAllConnections?.(); s.close(() => r()); })));
    },
  };
}
