// /metrics carries upstream kube-proxy's metrics: after real syncs (the
// iptables proxier and planner against the stateful fake iptables; no root), a scrape of the
// metrics server has every name of upstream's pkg/proxy/metrics/metrics.go that applies, with
// upstream's type, label names and histogram buckets, checked against a table copied from
// upstream (not computed by the code under test), and values that follow what happened.
import type { StaleFlow } from '../../src/core/nodeview.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyController, type SyncRecord } from '../../src/sync/controller.ts';
import { Metrics, startServers } from '../../src/server/servers.ts';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import type { ModeModule } from '../../src/modes/types.ts';
import type { Source, SourceHandler } from '../../src/sources/types.ts';
import { waitFor } from '../support/wait.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */

// upstream: metrics.ExponentialBuckets(0.001, 2, 15)
const EXP = '0.001 0.002 0.004 0.008 0.016 0.032 0.064 0.128 0.256 0.512 1.024 2.048 4.096 8.192 16.384';
// upstream: metrics.MergeBuckets(LinearBuckets(0.25, 0.25, 2), LinearBuckets(1, 1, 59),
// LinearBuckets(60, 5, 12), LinearBuckets(120, 30, 7)); MergeBuckets starts with a 0 bucket
const NPL =
  '0 0.25 0.5 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 ' +
  '60 65 70 75 80 85 90 95 100 105 110 115 120 150 180 210 240 270 300';

interface Upstream {
  name: string;
  type: 'counter' | 'gauge' | 'histogram';
  labels: string[];
  buckets?: string;
  /** the modes upstream's RegisterMetrics registers it for (all when absent) */
  modes?: string[];
}

// pkg/proxy/metrics/metrics.go (master), subsystem "kubeproxy"
const UPSTREAM: Upstream[] = [
  { name: 'kubeproxy_sync_proxy_rules_duration_seconds', type: 'histogram', labels: ['ip_family'], buckets: EXP },
  { name: 'kubeproxy_sync_full_proxy_rules_duration_seconds', type: 'histogram', labels: ['ip_family'], buckets: EXP },
  { name: 'kubeproxy_sync_partial_proxy_rules_duration_seconds', type: 'histogram', labels: ['ip_family'], buckets: EXP },
  { name: 'kubeproxy_sync_proxy_rules_last_timestamp_seconds', type: 'gauge', labels: ['ip_family'] },
  { name: 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', type: 'gauge', labels: ['ip_family'] },
  { name: 'kubeproxy_network_programming_duration_seconds', type: 'histogram', labels: ['ip_family'], buckets: NPL },
  { name: 'kubeproxy_sync_proxy_rules_endpoint_changes_pending', type: 'gauge', labels: [] },
  { name: 'kubeproxy_sync_proxy_rules_endpoint_changes_total', type: 'counter', labels: [] },
  { name: 'kubeproxy_sync_proxy_rules_service_changes_pending', type: 'gauge', labels: [] },
  { name: 'kubeproxy_sync_proxy_rules_service_changes_total', type: 'counter', labels: [] },
  { name: 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total', type: 'counter', labels: ['ip_family'], modes: ['iptables', 'ipvs'] },
  { name: 'kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total', type: 'counter', labels: ['ip_family'], modes: ['iptables'] },
  { name: 'kubeproxy_sync_proxy_rules_iptables_total', type: 'gauge', labels: ['ip_family', 'table'], modes: ['iptables'] },
  { name: 'kubeproxy_sync_proxy_rules_iptables_last', type: 'gauge', labels: ['ip_family', 'table'], modes: ['iptables'] },
  { name: 'kubeproxy_sync_proxy_rules_nftables_sync_failures_total', type: 'counter', labels: ['ip_family'], modes: ['nftables'] },
  { name: 'kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total', type: 'counter', labels: ['ip_family'], modes: ['nftables'] },
  { name: 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', type: 'gauge', labels: ['ip_family', 'traffic_policy'] },
  { name: 'kubeproxy_proxy_healthz_total', type: 'counter', labels: ['code'] },
  { name: 'kubeproxy_proxy_livez_total', type: 'counter', labels: ['code'] },
  { name: 'kubeproxy_conntrack_reconciler_sync_duration_seconds', type: 'histogram', labels: ['ip_family'], buckets: EXP },
  { name: 'kubeproxy_conntrack_reconciler_deleted_entries_total', type: 'counter', labels: ['ip_family'] },
];

interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

/** The Prometheus text format: TYPE lines and samples (label values here have no escapes). */
function parseExposition(text: string): { types: Map<string, string>; samples: Sample[] } {
  const types = new Map<string, string>();
  const samples: Sample[] = [];
  for (const line of text.split('\n')) {
    const t = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (t) types.set(t[1], t[2]);
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)/.exec(line);
    assert.ok(m, `a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_]\w*)="([^"]*)"/g)) labels[l[1]] = l[2];
    samples.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return { types, samples };
}

/** Checks name, type, label names and buckets of every upstream metric of `mode` in a scrape. */
function checkAgainstUpstream(text: string, mode: string): void {
  const { types, samples } = parseExposition(text);
  for (const u of UPSTREAM) {
    const registered = !u.modes || u.modes.includes(mode);
    assert.equal(types.get(u.name), registered ? u.type : undefined, `${u.name}: ${registered ? `a ${u.type}` : `not registered in ${mode} mode, as upstream`}`);
    if (!registered) continue;
    const own = samples.filter((s) => s.name === u.name || (u.type === 'histogram' && [`${u.name}_bucket`, `${u.name}_sum`, `${u.name}_count`].includes(s.name)));
    assert.ok(own.length > 0, `${u.name} has samples`);
    for (const s of own) {
      const names = Object.keys(s.labels).filter((k) => k !== 'le').sort();
      assert.deepEqual(names, [...u.labels].sort(), `${s.name} labels`);
      if (s.labels.ip_family !== undefined) assert.match(s.labels.ip_family, /^IPv[46]$/);
    }
    if (u.buckets) {
      const series = new Map<string, string[]>();
      for (const s of own.filter((x) => x.name === `${u.name}_bucket`)) {
        const key = JSON.stringify({ ...s.labels, le: undefined });
        series.set(key, [...(series.get(key) ?? []), s.labels.le]);
      }
      assert.ok(series.size > 0, `${u.name} has buckets`);
      for (const les of series.values()) assert.deepEqual(les, [...u.buckets.split(' '), '+Inf'], `${u.name} buckets`);
    }
  }
}

const value = (text: string, name: string, labels: Record<string, string> = {}): number | undefined =>
  parseExposition(text).samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value;

const svc = (name: string, spec: any = {}): any => ({
  metadata: { name, namespace: 't' },
  spec: { clusterIP: name === 'web' ? '172.30.0.10' : '172.30.0.11', ports: [{ name: 'http', port: 80 }], ...spec },
});
const slice = (name: string, ip: string, nodeName: string, triggerAt?: number, protocol = 'TCP'): any => ({
  metadata: {
    name: `${name}-1`, namespace: 't', labels: { 'kubernetes.io/service-name': name },
    ...(triggerAt ? { annotations: { 'endpoints.kubernetes.io/last-change-trigger-time': new Date(triggerAt).toISOString(), 'other.example/annotation': 'dropped' } } : {}),
  },
  addressType: 'IPv4',
  ports: [{ name: 'http', port: 8080, protocol }],
  endpoints: [{ addresses: [ip], nodeName }],
});

test('after real iptables syncs, /metrics has upstream names, types, labels and buckets, with values that follow the syncs', async () => {
  let handler: SourceHandler | null = null;
  const source: Source = { start: async (h) => void (handler = h), stop: async () => {}, health: () => ({ synced: true, connected: true, lastContactMs: Date.now() }) };
  const log = pino({ level: 'silent' });
  const config = { ...resolveConfig({ mode: 'iptables' }), minSyncPeriodMs: 5 };
  const fake = new FakeIptables(4);
  const mode: ModeModule = {
    name: 'iptables', render: () => '', cleanup: async () => {},
    createProxier: async () => new IptablesProxier({ runner: fake, log, config }),
  };
  const startedAt = Date.now();
  const cleaned: StaleFlow[] = [];
  const ctrl = new ProxyController({
    config, nodeName: 'node-a', mode, allModes: { iptables: mode } as any, source, sourceName: 'test', runner: fake, log,
    skipCleanup: true, nodeIPs: () => ['192.168.0.2'], families: [4], healthTimeoutMs: 60_000, backoffInitialMs: 20, backoffMaxMs: 50,
    // the first sync clears flows to the UDP web Service, which has no endpoint yet (upstream
    // CleanStaleEntries since kubernetes#139629), and never-DNATed TCP attempts to the TCP
    // Service with endpoints; the web Service's first endpoint makes flows to its ClusterIP stale
    conntrack: { clean: async (_family, flows) => (cleaned.push(...flows), { deleted: flows.length, failed: 0, durationMs: 2 }) },
  });
  const servers = await startServers({ ctrl, source, mode: 'iptables', log }, '127.0.0.1:0', '127.0.0.1:0');
  const scrape = async () => (await fetch(`http://127.0.0.1:${servers.ports.metrics}/metrics`)).text();
  await ctrl.start();
  try {
    const h = handler!;
    h.onService(null, svc('web', { ports: [{ name: 'http', port: 80, protocol: 'UDP' }] }));
    // internalTrafficPolicy Local with its only endpoint on another node: upstream's no_local_endpoints{internal}
    h.onService(null, svc('local', { internalTrafficPolicy: 'Local' }));
    h.onEndpointSlice(null, slice('local', '10.180.1.1', 'node-b'));
    h.onSynced();
    await waitFor('first sync', () => ctrl.history.some((r) => r.ok), 20_000);

    // a failed partial sync (the kernel refuses the batch), then its full retry; the change's
    // trigger time is after kproxy started (earlier ones are ignored, as upstream) and 1.1 s ago
    await new Promise((r) => setTimeout(r, Math.max(0, startedAt + 1200 - Date.now())));
    fake.failNextRestoreAtLine = 1;
    const triggerAt = Date.now() - 1100;
    h.onEndpointSlice(null, slice('web', '10.180.0.1', 'node-a', triggerAt, 'UDP'));
    await waitFor('the retry after the failure', () => ctrl.history.some((r) => !r.ok) && ctrl.history.at(-1)!.ok, 20_000);
    for (let i = 0; i < 3; i++) await fetch(`http://127.0.0.1:${servers.ports.healthz}/healthz`);
    await fetch(`http://127.0.0.1:${servers.ports.healthz}/livez`);

    const text = await scrape();
    checkAgainstUpstream(text, 'iptables');

    const v4 = { ip_family: 'IPv4' };
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total', v4), 1);
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total', v4), 1, 'the failed sync was a partial one');
    const syncs = ctrl.history.length;
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_duration_seconds_count', v4), syncs, 'every sync is observed, failed ones too, as upstream');
    assert.equal(
      (value(text, 'kubeproxy_sync_full_proxy_rules_duration_seconds_count', v4) ?? 0) + (value(text, 'kubeproxy_sync_partial_proxy_rules_duration_seconds_count', v4) ?? 0),
      syncs,
    );
    assert.equal(value(text, 'kubeproxy_sync_partial_proxy_rules_duration_seconds_count', v4), ctrl.history.filter((r) => !r.full).length);
    // one change with a trigger time, programmed by the retry (not lost with the failed sync)
    assert.equal(value(text, 'kubeproxy_network_programming_duration_seconds_count', v4), 1);
    const npl = value(text, 'kubeproxy_network_programming_duration_seconds_sum', v4)!;
    assert.ok(npl >= 1.1 && npl < 60, `programming latency ${npl}s counts from the trigger time`);
    assert.equal(value(text, 'kubeproxy_network_programming_duration_seconds_bucket', { ...v4, le: '1' }), 0);
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', { ...v4, traffic_policy: 'internal' }), 1);
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_no_local_endpoints_total', { ...v4, traffic_policy: 'external' }), 0);
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_service_changes_total'), 2);
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_endpoint_changes_total'), 2);
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_service_changes_pending'), 0);
    assert.equal(value(text, 'kubeproxy_sync_proxy_rules_endpoint_changes_pending'), 0);
    const nat = value(text, 'kubeproxy_sync_proxy_rules_iptables_total', { ...v4, table: 'nat' })!;
    const installed = [...fake.tables.get('nat')!].filter(([c]) => c.startsWith('KUBE-')).reduce((n, [, rules]) => n + rules.length, 0);
    assert.equal(nat, installed, 'the nat rule count is what the (fake) kernel holds');
    assert.ok((value(text, 'kubeproxy_sync_proxy_rules_iptables_total', { ...v4, table: 'filter' }) ?? 0) > 0);
    const last = value(text, 'kubeproxy_sync_proxy_rules_last_timestamp_seconds', v4)!;
    const queued = value(text, 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', v4)!;
    assert.ok(Math.abs(last - Date.now() / 1000) < 60 && last >= queued, `last sync ${last} after last queued ${queued}`);
    assert.equal(value(text, 'kubeproxy_proxy_healthz_total', { code: '200' }), 3);
    assert.equal(value(text, 'kubeproxy_proxy_livez_total', { code: '200' }), 1);
    assert.deepEqual(cleaned.map((f) => `${f.kind} ${f.protocol}`).sort(), ['service UDP', 'service UDP', 'unNATed TCP']);
    assert.equal(value(text, 'kubeproxy_conntrack_reconciler_deleted_entries_total', v4), 3);
    assert.match(text, /^process_resident_memory_bytes \d/m, 'process metrics, as upstream exports');
    assert.match(text, /^kproxy_rules_total \d/m, "kproxy's own stay");
  } finally {
    await ctrl.stop();
    await servers.close();
  }
});

test('pending changes show on /metrics until the sync that applies them', async () => {
  const m = new Metrics({ processMetrics: false });
  let pending = { services: 3, endpoints: 5 };
  m.attach({ onSync: () => {}, onInvalid: () => {}, onQueued: () => {}, onChange: () => {}, pendingChanges: () => pending, families: [] });
  let text = await m.registry.metrics();
  assert.equal(value(text, 'kubeproxy_sync_proxy_rules_service_changes_pending'), 3);
  assert.equal(value(text, 'kubeproxy_sync_proxy_rules_endpoint_changes_pending'), 5);
  pending = { services: 0, endpoints: 0 };
  text = await m.registry.metrics();
  assert.equal(value(text, 'kubeproxy_sync_proxy_rules_endpoint_changes_pending'), 0);
});

const famRec = (f: Partial<NonNullable<SyncRecord['families']>[number]>): SyncRecord => ({
  at: Date.now(), full: !!f.full, durationMs: 3, ok: !!f.ok, changed: [], families: [{ family: 4, ok: false, full: false, durationMs: 3, ...f }],
});

test('nftables mode: upstream registers the nftables failure counters, not the iptables ones', async () => {
  const m = new Metrics({ mode: 'nftables', processMetrics: false });
  m.record(famRec({ ok: false, full: false, error: 'nft -f refused', errorCode: 'KPROXY_NFT_APPLY' }), 1);
  m.record(famRec({ ok: true, stats: { rulesWritten: 1, rulesTotal: 9, cleanupFailures: 2, tables: 3 } }), 1);
  m.queued([4, 6]);
  const text = await m.registry.metrics();
  assert.equal(value(text, 'kproxy_nftables_tables', { ip_family: 'IPv4' }), 3, 'the tables of the last sync');
  assert.equal(value(text, 'kubeproxy_sync_proxy_rules_nftables_sync_failures_total', { ip_family: 'IPv4' }), 1);
  assert.equal(value(text, 'kubeproxy_sync_proxy_rules_nftables_cleanup_failures_total', { ip_family: 'IPv4' }), 2);
  assert.ok(value(text, 'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds', { ip_family: 'IPv6' })! > 0, 'queued is per family');
  assert.doesNotMatch(text, /iptables_restore_failures_total/);
  // the partial sync fails: no iptables counter to count it
  const ipvs = new Metrics({ mode: 'ipvs', processMetrics: false });
  ipvs.record(famRec({ ok: false, errorCode: 'KPROXY_IPVS_IPTABLES_FAILED' }), 1);
  ipvs.record(famRec({ ok: false, errorCode: 'KPROXY_IPVS_APPLY_FAILED' }), 1);
  const ipvsText = await ipvs.registry.metrics();
  assert.equal(value(ipvsText, 'kubeproxy_sync_proxy_rules_iptables_restore_failures_total', { ip_family: 'IPv4' }), 1, 'only the IPVS mode\'s iptables-restore failures');
  assert.doesNotMatch(ipvsText, /partial_restore_failures|nftables_sync_failures/);
});
