// The soak bench's pure parts (bench/soak.ts): V8's --trace-gc lines, kproxy's sync counter,
// the figures after warm-up, the report and the plot. The bench itself runs kproxy for an hour
// (`bench/soak.ts --quick`: a minute), so it is exercised by running it, not here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { markdown, parseGcLine, parseSyncCount, plot, summarize, type SoakResult } from '../../bench/soak.ts';
import { benchArgs } from '../../bench/index.ts';

test('parseGcLine: the live heap after a Mark-Compact, as node 20 prints it; scavenges are not full collections', () => {
  // lines printed by `node --trace-gc` (v20.20)
  const mc = '[29097:0x19a186e0]      787 ms: Mark-Compact 71.1 (102.9) -> 15.6 (49.4) MB, 10.31 / 0.00 ms  (+ 0.2 ms in 2 steps since start of marking, biggest step 0.2 ms, walltime since start of marking 52 ms) (average mu = 1.000, current mu = 1.000) finalize incremental marking via stack guard; GC in old space requested';
  assert.deepEqual(parseGcLine(mc), { kind: 'Mark-Compact', beforeMiB: 71.1, afterMiB: 15.6, committedAfterMiB: 49.4 });
  const reduce = '[1:0x5]   60000 ms: Mark-Compact (reduce) 40.2 (45.0) -> 38.9 (41.5) MB, 20.1 / 0.0 ms  (average mu = 0.99, current mu = 0.98) memory reducer';
  assert.equal(parseGcLine(reduce)?.kind, 'Mark-Compact (reduce)');
  assert.equal(parseGcLine(reduce)?.afterMiB, 38.9);
  assert.equal(parseGcLine('[29097:0x19a186e0]       12 ms: Scavenge 3.8 (4.3) -> 3.4 (5.3) MB, 0.98 / 0.00 ms  (average mu = 1.000, current mu = 1.000) allocation failure;'), undefined);
  assert.equal(parseGcLine('{"level":30,"msg":"synced"}'), undefined);
});

test('parseSyncCount: the sync histogram\'s count, both families summed; NaN when absent', () => {
  const text = [
    '# TYPE kubeproxy_sync_proxy_rules_duration_seconds histogram',
    'kubeproxy_sync_proxy_rules_duration_seconds_bucket{ip_family="4",le="0.001"} 0',
    'kubeproxy_sync_proxy_rules_duration_seconds_sum{ip_family="4"} 12.5',
    'kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="4"} 120',
    'kubeproxy_sync_proxy_rules_duration_seconds_count{ip_family="6"} 118',
    'kubeproxy_sync_proxy_rules_last_timestamp_seconds{ip_family="4"} 1.7e9',
  ].join('\n');
  assert.equal(parseSyncCount(text), 238);
  assert.ok(Number.isNaN(parseSyncCount('kproxy_rules_total 5')));
});

test('summarize: the first value after warm-up is the baseline; deviation and slope count only what follows', () => {
  // a spike during warm-up, then +1 per 360 s (10 per hour), one sample 5 below the baseline
  const points: Array<[number, number]> = [[0, 500], [300, 90], [600, 100], [960, 101], [1320, 95], [3600, 110]];
  const s = summarize(points, 600)!;
  assert.equal(s.atWarmup, 100);
  assert.equal(s.end, 110);
  assert.equal(s.min, 95);
  assert.equal(s.max, 110);
  assert.equal(s.maxDeviation, 10);
  assert.equal(s.endMedian, 110, 'the last 5 minutes hold one sample');
  assert.equal(summarize([[600, 10], [3300, 20], [3400, 22], [3500, 21], [3600, 90]], 600)!.endMedian, 21.5, 'one high sample at the end moves the median little');
  assert.ok(s.slopePerHour > 0 && s.slopePerHour < 20, `slope ${s.slopePerHour}`);
  const flat = summarize([[600, 50], [1200, 50], [1800, 50]], 600)!;
  assert.equal(flat.slopePerHour, 0);
  assert.equal(flat.maxDeviation, 0);
  assert.equal(summarize([[0, 1]], 600), undefined, 'no sample after warm-up');
});

test('markdown and plot: a row per mode, a failed mode says why; the plot\'s x axis is minutes', () => {
  const sample = (t: number, rss: number) => ({ t, rssMiB: rss, hwmMiB: 200, fds: 22, heapAfterGcMiB: rss / 4, markCompacts: 1, syncsMetric: t, syncsLogged: t, changes: 5 * t });
  const samples = [0, 600, 1200, 1800, 2400, 3000, 3600].map((t) => sample(t, 120 + t / 1000));
  const r: SoakResult = {
    date: '2026-12-06T05:00:00.000Z', host: { node: 'v20', cpus: 2 }, command: 'node --import tsx bench/soak.ts', entry: 'dist bundle',
    options: { modes: ['iptables', 'nftables'], services: 2000, endpoints: 5, rate: 5, seconds: 3600, interval: 10, warmup: 600, startTimeoutMs: 1, nodeArgs: [], snapshotAt: [] },
    results: [
      { mode: 'iptables', samples, gc: [], syncs: 3600, changes: 18000, summary: { rssMiB: summarize(samples.map((s) => [s.t, s.rssMiB]), 600)!, hwmMiB: summarize(samples.map((s) => [s.t, s.hwmMiB]), 600)!, fds: summarize(samples.map((s) => [s.t, s.fds]), 600)!, heapAfterGcMiB: summarize(samples.map((s) => [s.t, s.heapAfterGcMiB]), 600)! } },
      { mode: 'nftables', samples: [], gc: [], error: 'KPROXY_BENCH_SOAK: nftables: no first sync within 120 s' },
    ],
  };
  const md = markdown(r);
  assert.match(md, /\| iptables \| 120\.6 → 123\.6 MiB, last 5 min 123\.6 \(max dev 3\.0/);
  assert.match(md, /\| nftables \| KPROXY_BENCH_SOAK: nftables: no first sync/);
  const svg = plot(r);
  assert.match(svg, /minutes since the change stream started/);
  assert.match(svg, />60<\/text>/, 'a tick at 60 minutes');
  assert.doesNotMatch(svg, /log scale\)<\/text>\s*<text transform/, 'the x axis is linear');
});

test('npm run bench: --only soak runs bench/soak.ts, a minute with --quick, and writes soak-{quick,full}.json', () => {
  const q = benchArgs('soak', true, '/out', '/work');
  assert.equal(q.file, 'bench/soak.ts');
  assert.deepEqual(q.args, ['--quick', '--json', '/out/soak-quick.json', '--svg', '/out/quick/soak.svg']);
  const f = benchArgs('soak', false, '/out', '/work');
  assert.deepEqual(f.args, ['--json', '/out/soak-full.json', '--svg', '/out/full/soak.svg']);
});
