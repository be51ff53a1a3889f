// Asks a running kproxy for its health and last syncs.
async function getJSON(url: string): Promise<{ code: number; body: unknown }> {
  const res = await fetch(url, { signal: AbortSignal.timeout(3000) });
  return { code: res.status, body: await res.json().catch(() => null) };
}

export async function statusCommand(o: { healthzAddress: string; metricsAddress: string }): Promise<void> {
  let health: { code: number; body: unknown };
  try {
    health = await getJSON(`http://${o.healthzAddress}/healthz`);
  } catch (e) {
    throw new Error(`KPROXY_STATUS_UNREACHABLE: no kproxy answers on ${o.healthzAddress} (${(e as Error).message}); is it running?`);
  }
  const h = health.body as Record<string, unknown> & { source?: Record<string, unknown>; reasons?: string[] };
  const lines = [
    `health:       ${health.code === 200 ? 'healthy' : 'UNHEALTHY'} (${health.code})`,
    `mode:         ${h.mode}`,
    `synced:       ${h.synced}`,
    `last sync:    ${h.lastUpdated ?? 'never'}`,
    `sync errors:  ${h.syncFailures}${h.lastError ? ` (last: ${h.lastError})` : ''}`,
    `source:       ${h.source?.connected ? 'connected' : 'DISCONNECTED'}, last contact ${h.source?.lastContact ?? 'never'}${h.source?.problem ? `, ${h.source.problem}` : ''}`,
    ...(h.reasons ?? []).map((r) => `problem:      ${r}`),
  ];
  try {
    const d = await getJSON(`http://${o.metricsAddress}/debug/diff`);
    const recs = (d.body as Array<{ at: number; full: boolean; durationMs: number; ok: boolean; stats?: { rulesWritten: number; rulesTotal: number }; changed: string[]; error?: string }>) ?? [];
    lines.push('recent syncs:');
    for (const r of recs.slice(-5)) {
      lines.push(`  ${new Date(r.at).toISOString()} ${r.full ? 'full   ' : 'partial'} ${String(r.durationMs).padStart(5)}ms ${r.ok ? `wrote ${r.stats?.rulesWritten} of ${r.stats?.rulesTotal}` : `FAILED ${r.error}`} changed=${r.changed.length}`);
    }
  } catch {
    lines.push(`recent syncs: metrics server ${o.metricsAddress} not reachable`);
  }
  process.stdout.write(lines.join('\n') + '\n');
  if (health.code !== 200) process.exitCode = 1;
}
