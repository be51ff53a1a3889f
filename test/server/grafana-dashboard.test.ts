// deploy/grafana-dashboard.json: a valid Grafana dashboard model whose data
// source is a variable, and whose every query names only metrics that kproxy's Metrics
// registry really exports (in any mode), so the dashboard cannot drift from the code.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Metrics } from '../../src/server/servers.ts';

/* eslint-disable @typescript-eslint/no-explicit-any */
const dashboard = JSON.parse(readFileSync(new URL('../../deploy/grafana-dashboard.json', import.meta.url), 'utf8'));

const PROMQL_WORDS = new Set(['by', 'without', 'on', 'ignoring', 'group_left', 'group_right', 'and', 'or', 'unless', 'offset', 'bool', 'inf', 'nan']);

/**
 * The metric names a PromQL expression reads: what is left once strings, label matchers,
 * ranges, grouping clauses, function calls, numbers and keywords are taken out.
 */
export function metricNames(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, '""')
    .replace(/\{[^}]*\}/g, ' ')
    .replace(/\[[^\]]*\]/g, ' ')
    .replace(/\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)/g, ' ');
  const out: string[] = [];
  for (const m of bare.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?/g)) {
    if (m[1]) continue; // a function
    const before = bare[m.index! - 1];
    if (before !== undefined && /[0-9.]/.test(before)) continue; // the exponent of a number (1e3)
    if (PROMQL_WORDS.has(m[0].toLowerCase())) continue;
    out.push(m[0]);
  }
  return out;
}

/** every panel, rows' nested panels included */
function allPanels(d: any): any[] {
  return (d.panels ?? []).flatMap((p: any) => [p, ...(p.panels ?? [])]);
}

test('metricNames finds the metrics of a query and nothing else', () => {
  assert.deepEqual(
    metricNames('histogram_quantile(0.99, sum by (le, ip_family) (rate(foo_bucket{instance=~"$instance", a="b(c)"}[$__rate_interval]))) / on (x) bar_total > 1e3'),
    ['foo_bucket', 'bar_total'],
  );
  assert.deepEqual(metricNames('time() - max by (instance) (x_seconds)'), ['x_seconds']);
});

test('the dashboard is a Grafana dashboard model with its data source as a variable', () => {
  assert.equal(typeof dashboard.title, 'string');
  assert.equal(typeof dashboard.uid, 'string');
  assert.ok(dashboard.uid.length <= 40, 'Grafana uids are at most 40 characters');
  assert.ok(Number.isInteger(dashboard.schemaVersion) && dashboard.schemaVersion >= 30);
  assert.equal(dashboard.id, null, 'no id: importable into any Grafana');
  const vars = dashboard.templating.list;
  const ds = vars.find((v: any) => v.type === 'datasource');
  assert.ok(ds, 'a data source variable');
  assert.equal(ds.query, 'prometheus');
  const dsRef = `\${${ds.name}}`;
  const panels = allPanels(dashboard);
  assert.ok(panels.length >= 10);
  const ids = panels.map((p: any) => p.id);
  assert.equal(new Set(ids).size, ids.length, 'panel ids are unique');
  for (const p of panels) {
    for (const k of ['x', 'y', 'w', 'h']) assert.ok(Number.isInteger(p.gridPos?.[k]), `${p.title}: gridPos.${k}`);
    assert.ok(p.gridPos.x + p.gridPos.w <= 24, `${p.title} fits the 24-column grid`);
    if (p.type === 'row') continue;
    assert.deepEqual(p.datasource, { type: 'prometheus', uid: dsRef }, `${p.title} uses the data source variable`);
    assert.ok(p.targets?.length > 0, `${p.title} has queries`);
    const refIds = p.targets.map((t: any) => t.refId);
    assert.equal(new Set(refIds).size, refIds.length, `${p.title}: refIds are unique`);
    for (const t of p.targets) {
      assert.equal(typeof t.expr, 'string');
      assert.equal(t.datasource?.uid, dsRef, `${p.title}: query ${t.refId} uses the data source variable`);
    }
  }
  // variables that queries use are defined
  const defined = new Set([...vars.map((v: any) => v.name), '__rate_interval', '__range', '__interval']);
  for (const p of panels) for (const t of p.targets ?? []) for (const m of t.expr.matchAll(/\$(\w+)/g)) assert.ok(defined.has(m[1]), `$${m[1]} is defined`);
});

test('every query names only metrics the registry exports, and the dashboard shows the sync, programming, pending-change, failure and health metrics', async () => {
  // every mode's registry: the mode-specific upstream metrics differ
  const exported = new Set<string>();
  for (const mode of [undefined, 'iptables', 'ipvs', 'nftables', 'userspace']) for (const n of await new Metrics({ mode }).names()) exported.add(n);
  const base = (n: string) => n.replace(/_(bucket|sum|count)$/, '');
  const used = new Set<string>();
  for (const p of allPanels(dashboard)) {
    for (const t of p.targets ?? []) {
      const names = metricNames(t.expr);
      assert.ok(names.length > 0, `${p.title}: ${t.expr} reads a metric`);
      for (const n of names) {
        const known = exported.has(n) || (n !== base(n) && exported.has(base(n)));
        assert.ok(known, `${p.title}: ${n} is not exported by kproxy`);
        used.add(exported.has(n) ? n : base(n));
      }
    }
  }
  for (const want of [
    'kubeproxy_sync_full_proxy_rules_duration_seconds',
    'kubeproxy_sync_partial_proxy_rules_duration_seconds',
    'kubeproxy_network_programming_duration_seconds',
    'kubeproxy_sync_proxy_rules_last_timestamp_seconds',
    'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds',
    'kubeproxy_sync_proxy_rules_endpoint_changes_pending',
    'kubeproxy_sync_proxy_rules_service_changes_pending',
    'kubeproxy_sync_proxy_rules_iptables_total',
    'kubeproxy_sync_proxy_rules_iptables_restore_failures_total',
    'kubeproxy_sync_proxy_rules_nftables_sync_failures_total',
    'kubeproxy_sync_proxy_rules_no_local_endpoints_total',
    'kubeproxy_proxy_healthz_total',
    'kubeproxy_proxy_livez_total',
    'kubeproxy_conntrack_reconciler_deleted_entries_total',
    'kproxy_sync_failures_total',
    'kproxy_invalid_objects_total',
  ]) {
    assert.ok(used.has(want), `the dashboard shows ${want}`);
  }
});
