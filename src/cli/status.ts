// Asks a running kproxy for its health and last syncs. The details come from the local
// metrics/debug server (/debug/health, /debug/diff); the public /healthz says only
// healthy or not, and is asked only when the debug server does not answer.
import { sanitizeDetail, type AllocationSummary } from '../server/servers.ts';
import { kproxyError } from '../errors.ts';

async function getJSON(url: string): Promise<{ code: number; body: unknown }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(3000) });
  return { code: res.status, body: await res.json().catch(() => null) };
}

interface Report {
  healthy?: boolean;
  live?: boolean;
  nodeEligible?: boolean;
  mode?: string;
  synced?: boolean;
  lastUpdated?: string | null;
  syncFailures?: number;
  lastError?: string;
  source?: { connected?: boolean; lastContact?: string | null; problem?: string };
  reasons?: unknown[];
  allocations?: AllocationSummary;
}

/** The manifests source's allocations: which Services got which values, which were refused. */
export function allocationLines(a: AllocationSummary): string[] {
  const ranges = `${(Array.isArray(a.serviceClusterIPRange) ? a.serviceClusterIPRange : []).map(show).join(',')}, node ports ${show(a.serviceNodePortRange)}`;
  const lines = [`allocations:  ${a.allocatedServices} Service(s) got values from ${ranges}; ${a.refusedServices} refused`];
  for (const s of Array.isArray(a.allocated) ? a.allocated : []) {
    const parts = [
      ...(s.clusterIPs?.length ? [`clusterIPs ${s.clusterIPs.map(show).join(',')}`] : []),
      ...Object.entries(s.nodePorts ?? {}).map(([name, port]) => `nodePort ${name ? show(name) : '(unnamed)'}=${show(port)}`),
      ...(s.healthCheckNodePort !== undefined ? [`healthCheckNodePort ${show(s.healthCheckNodePort)}`] : []),
    ];
    lines.push(`  ${show(s.service)}: ${parts.join(', ')}`);
  }
  if (a.allocatedServices > (a.allocated?.length ?? 0)) lines.push(`  ... and ${a.allocatedServices - a.allocated.length} more (/debug/state)`);
  for (const r of Array.isArray(a.refused) ? a.refused : []) lines.push(`  REFUSED ${show(r.service)}: ${show(r.field)}: ${show(r.reason)}`);
  if (a.refusedServices > (a.refused?.length ?? 0)) lines.push(`  ... and ${a.refusedServices - a.refused.length} more refused (/debug/state)`);
  return lines;
}

/** Text from another process goes to the terminal only sanitized and bounded. */
const show = (v: unknown) => sanitizeDetail(v);

export async function statusCommand(o: { healthzAddress: string; metricsAddress: string }): Promise<void> {
  let rep: Report | null = null;
  let healthy: boolean;
  const lines: string[] = [];
  try {
    const r = await getJSON(`http://${o.metricsAddress}/debug/health`);
    if (r.code !== 200 || !r.body || typeof r.body !== 'object') throw new Error(`HTTP ${r.code}`);
    rep = r.body as Report;
    healthy = rep.healthy === true;
  } catch (e) {
    // No details: fall back to the public verdict.
    let code: number;
    try {
      code = (await getJSON(`http://${o.healthzAddress}/healthz`)).code;
    } catch (e2) {
      throw kproxyError(
        'KPROXY_STATUS_UNREACHABLE',
        `no kproxy answers on ${o.metricsAddress} (${(e as Error).message}) or ${o.healthzAddress} (${(e2 as Error).message}); is it running? Give --metrics-address and --healthz-address if it listens elsewhere`,
      );
    }
    healthy = code === 200;
    lines.push(`health:       ${healthy ? 'healthy' : 'UNHEALTHY'} (/healthz ${code})`);
    lines.push(`details:      metrics server ${o.metricsAddress} not reachable (${show((e as Error).message)}); give --metrics-address`);
  }
  if (rep) {
    const h = rep;
    lines.push(
      `health:       ${healthy ? 'healthy' : 'UNHEALTHY'} (/healthz ${healthy ? 200 : 503}, /livez ${h.live === false ? 503 : 200})`,
      `mode:         ${show(h.mode)}`,
      `synced:       ${h.synced}`,
      `last sync:    ${show(h.lastUpdated ?? 'never')}`,
      `node:         ${h.nodeEligible === false ? 'NOT ELIGIBLE (being deleted)' : 'eligible'}`,
      `sync errors:  ${h.syncFailures}${h.lastError ? ` (last: ${show(h.lastError)})` : ''}`,
      `source:       ${h.source?.connected ? 'connected' : 'DISCONNECTED'}, last contact ${show(h.source?.lastContact ?? 'never')}${h.source?.problem ? `, ${show(h.source.problem)}` : ''}`,
      ...(Array.isArray(h.reasons) ? h.reasons.slice(0, 10) : []).map((r) => `problem:      ${show(r)}`),
      ...(h.allocations && typeof h.allocations === 'object' ? allocationLines(h.allocations) : []),
    );
    try {
      const d = await getJSON(`http://${o.metricsAddress}/debug/diff`);
      const recs = Array.isArray(d.body) ? (d.body as Array<{ at: number; full: boolean; durationMs: number; ok: boolean; stats?: { rulesWritten: number; rulesTotal: number }; changed: string[]; error?: string }>) : [];
      lines.push('recent syncs:');
      for (const r of recs.slice(-5)) {
        lines.push(`  ${new Date(r.at).toISOString()} ${r.full ? 'full   ' : 'partial'} ${String(r.durationMs).padStart(5)}ms ${r.ok ? `wrote ${r.stats?.rulesWritten} of ${r.stats?.rulesTotal}` : `FAILED ${show(r.error)}`} changed=${r.changed?.length ?? 0}`);
      }
    } catch {
      lines.push(`recent syncs: metrics server ${o.metricsAddress} not reachable`);
    }
  }
  process.stdout.write(lines.join('\n') + '\n');
  if (!healthy) process.exitCode = 1;
}
