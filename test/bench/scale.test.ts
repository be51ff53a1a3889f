// The scale bench's report (bench/scale.ts), pure: goals judged from a synthetic result,
// markdown tables, SVG plots; and its argument parsing. The harness itself runs the real
// kernel for minutes, so it is exercised by `bench/scale.ts --quick`, not here.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { goals, markdown, nftTablesLine, parseScaleArgs, plots, ScaleError, type ScaleResult } from '../../bench/scale.ts';
import type { Sample } from '../../bench/measure.ts';
import { metricDelta, parseProgrammingBuckets, writesIn, type RunPhaseResult } from '../../bench/kproxy-run.ts';
import { waitFor } from '../support/wait.ts';
import { MAX_SERVICES } from '../../bench/workload.ts';

function sample(n: number, mode: Sample['mode'], fullMs: number, error?: string): Sample {
  const sync = { wallMs: fullMs, writeMs: fullMs / 2, otherExecMs: 1, inProcessMs: 1, commands: 2, rulesWritten: 10, rulesTotal: 100, payloadBytes: 1000 };
  return { n, mode, rep: 0, endpointsPerService: 5, renderMs: 5, renderBytes: 100, full: sync, changes: error ? [] : [{ ...sync, wallMs: 50 }], error };
}

function run(n: number, variant: RunPhaseResult['variant'], changeMs: number[], rssMiB: number): RunPhaseResult {
  return {
    n, endpoints: 5, variant, changeMs, checkMs: 5, syncs: 3, coldStartMs: 3000, firstSyncMs: 2000, sourceLoadMs: 900,
    memAfterFirstSync: { vmRssKiB: rssMiB * 1024, vmHwmKiB: rssMiB * 1100 },
    stream: n === 10_000 ? { sent: 300, seen: 300, p50Ms: 600, p99Ms: 1200, maxMs: 1300, rate: 10, seconds: 30 } : undefined,
  };
}

function result(): ScaleResult {
  const options = parseScaleArgs(['--quick'], () => {});
  const { log: _l, ...rest } = options;
  return {
    options: rest,
    machine: { date: '2026-12-03T10:00:00.000Z', kernel: '6.1', cpus: 2, cpuModel: 'x', memGiB: 24, node: 'v20', iptables: 'v1.8.9', nft: 'v1.0.6', loadBefore: [2, 2, 2], loadAfter: [3, 3, 3] },
    manifests: { services: 10_000, delivered: 10_000, fileBytes: 9e6, loadMs: 1500, maxBlockMs: 60, rssBefore: 1e8, rssAfter: 1.5e8 },
    cold: [
      { n: 100, samples: [sample(100, 'iptables', 200), sample(100, 'nftables', 150)], raw: { iptablesFlush: 100, legacyFlush: 50, nft: 90, payloadLines: {} } },
      { n: 10_000, samples: [sample(10_000, 'iptables', 14_000), sample(10_000, 'iptables-legacy', 20_000, 'KPROXY_X: killed'), sample(10_000, 'nftables', 9_000)], raw: { iptablesFlush: 10_000, legacyFlush: 6_000, nft: 500, payloadLines: {} } },
    ],
    run: [run(100, 'iptables', [60, 70, 80], 80), run(10_000, 'iptables', [250, 260, 400], 240), run(100, 'nftables', [50, 60, 55], 80), run(10_000, 'nftables', [300, 320, 310], 260)],
    connect: [
      { n: 100, variant: 'iptables', loadMs: 100, targets: { first: { p50Ms: 0.1, p99Ms: 0.3, count: 100, failed: 0 }, last: { p50Ms: 0.1, p99Ms: 0.3, count: 100, failed: 0 }, pod: { p50Ms: 0.08, p99Ms: 0.2, count: 100, failed: 0 } } },
      { n: 10_000, variant: 'iptables', loadMs: 9000, targets: { first: { p50Ms: 0.1, p99Ms: 0.3, count: 100, failed: 0 }, last: { p50Ms: 2, p99Ms: 3, count: 100, failed: 0 }, pod: { p50Ms: 2, p99Ms: 3, count: 100, failed: 0 } } },
    ],
    notes: ['a note'], goals: [], totalSeconds: 100,
  };
}

test('goals are judged from the measurements at the sizes they are stated at', () => {
  const g = goals(result());
  const find = (s: string) => g.find((x) => x.goal.includes(s))!;
  assert.equal(find('(nf_tables) ≤ 1.5×').met, true, '14 s ≤ 1.5 × 10 s');
  assert.equal(find('(legacy) ≤ 1.5×').met, false, 'a failed first sync misses the goal');
  assert.match(find('(legacy) ≤ 1.5×').measured, /failed/);
  assert.equal(find('50,000 completes').met, undefined, 'not measured is neither met nor missed');
  assert.equal(find('nftables cold start at 10,000').met, true, '9 s ≤ the raw 10 s');
  assert.equal(find('iptables: one-Service change').met, false, 'median 260 ms ≤ 300 ms but > 3 × 70 ms');
  assert.equal(find('nftables: one-Service change').met, false, '310 ms > 100 ms');
  assert.equal(find('manifests').met, true);
  assert.equal(find('RSS').met, false, 'nftables 260 MiB > 250 MB');
  assert.match(find('RSS').measured, /iptables 240 MiB/);
  assert.match(find('event → kernel').measured, /600 ms \/ 1.20 s/);
  assert.equal(find('--quick').met, true, '100 s < 5 minutes');
  assert.match(find('--quick').measured, /^100 s at load 2→3/);
});

test('the memory phase\'s run at 10,000 (no changes asked) is not taken for the change goal\'s', () => {
  const r = result();
  const memoryOnly = (v: RunPhaseResult['variant']): RunPhaseResult => ({ ...run(10_000, v, [], 300), stream: undefined });
  // the memory phase runs first: its result comes before the run phase's in r.run
  r.run = [memoryOnly('iptables'), memoryOnly('iptables-legacy'), ...r.run];
  const g = goals(r);
  const find = (s: string) => g.find((x) => x.goal.startsWith(s))!;
  assert.match(find('iptables: one-Service change').measured, /^260 ms at 10k, 70 ms at 100/, 'the run phase\'s changes');
  assert.equal(find('iptables-legacy: one-Service change').met, undefined, 'a memory-only run: not measured, not "failed"');
  assert.match(find('iptables-legacy: one-Service change').measured, /^not measured/);
  r.run.push({ ...run(10_000, 'iptables-legacy', [], 300), error: 'KPROXY_BENCH_RUN: change 1 not in the kernel within 60 s' });
  assert.match(goals(r).find((x) => x.goal.startsWith('iptables-legacy: one-Service'))!.measured, /^failed: KPROXY_BENCH_RUN: change 1/);
  // the change table leaves the memory-only runs out; the run table keeps them (cold start, RSS)
  const md = markdown(r);
  const changeTable = md.slice(md.indexOf('### One-Service change'), md.indexOf('### First-packet'));
  assert.equal((changeTable.match(/^\| iptables \| 10,000 \|/gm) ?? []).length, 1, 'one iptables row at 10,000: the run phase\'s');
  assert.match(changeTable, /^\| iptables-legacy \| 10,000 \| – \| – \|/m, 'the failed run is listed');
  const runTable = md.slice(md.indexOf('### `kproxy run`'), md.indexOf('### One-Service change'));
  assert.equal((runTable.match(/^\| iptables \| 10,000 \|/gm) ?? []).length, 2);
});

test('markdown has every section and a goals table; plots are SVG with a line per series', () => {
  const r = result();
  r.goals = goals(r);
  const md = markdown(r);
  for (const h of ['### Manifests source', '### Cold start', '### `kproxy run`', '### First-packet connect latency', '### Goals']) assert.ok(md.includes(h), h);
  assert.match(md, /\| 10,000 \| 10.0 s \| 6.00 s \| 500 ms \| 14.0 s \| failed after 20.0 s \| 9.00 s \|/);
  assert.match(md, /load average 2 2 2 before, 3 3 3 after/);
  assert.match(md, /\| manifests: one 8 MB \/ 10,000-Service file loads in ≤ 2 s \| 1.50 s .* \| yes \|/);
  const p = plots(r);
  assert.deepEqual(Object.keys(p).sort(), ['scale-cold-start.svg', 'scale-connect-latency.svg', 'scale-one-service-change.svg']);
  for (const svg of Object.values(p)) assert.match(svg, /^<svg [^>]*xmlns="http:\/\/www.w3.org\/2000\/svg"/);
  // cold: iptables and nftables lines (legacy failed at its only large size but has none at 100), 3 raw references
  assert.equal((p['scale-cold-start.svg'].match(/<path /g) ?? []).length, 5);
  assert.equal((p['scale-connect-latency.svg'].match(/<path /g) ?? []).length, 3);
});

test('markdown names the nftables tables each phase found in the kernel (the sharded mode from 1,000 Services)', () => {
  const r = result();
  assert.equal(nftTablesLine(r), '', 'nothing recorded: no line');
  r.cold[0].samples[1].kernel = { listedLines: 900, tables: ['kube-proxy'], changesPresent: true };
  r.cold[1].samples[2].kernel = { listedLines: 90_000, tables: Array.from({ length: 16 }, (_, s) => `kube-proxy-${s}`), changesPresent: true };
  r.run[3].nftTables = Array.from({ length: 16 }, (_, s) => `kube-proxy-${s}`);
  r.connect.push({ ...r.connect[1], variant: 'nftables', tables: ['kube-proxy-0', 'kube-proxy-1'] });
  const line = nftTablesLine(r);
  assert.match(line, /cold \(after kproxy's first sync and changes\) 100: 1 \(kube-proxy\), 10,000: 16;/);
  assert.match(line, /run \(`kproxy run` after its first sync\) 10,000: 16;/);
  assert.match(line, /connect \(the rendered tables loaded\) 10,000: 2\./);
  r.goals = goals(r);
  assert.ok(markdown(r).includes(line));
});

test('--quick picks small sizes; bad arguments are refused with a code', () => {
  const q = parseScaleArgs(['--quick'], () => {});
  assert.equal(q.quick, true);
  assert.ok(Math.max(...q.sizes) <= 2000 && q.streamSeconds <= 10 && !q.breakdown && q.memorySize === 10_000);
  assert.equal(q.nftMax, MAX_SERVICES, 'nftables at every size: the shape without anonymous maps is merged');
  assert.deepEqual([q.ipvsSizes, q.ipvsConnectSizes], [[100], [100]], 'the quick VM run stays small');
  assert.ok(q.phases.includes('ipvs'));
  const full = parseScaleArgs([], () => {});
  assert.ok(full.sizes.includes(50_000) && full.connectSizes.includes(20_000) && full.runSizes.includes(10_000));
  assert.ok(full.ipvsSizes.includes(1000) && full.ipvsTimeoutS > q.ipvsTimeoutS);
  assert.ok(full.ipvsConnectSizes.includes(10_000), 'the full VM run measures connect latency at 10,000');
  assert.equal(full.ipvsFullChangeMax, 1000, 'the full-sync change comparison stops at 1,000 in the full run (minutes at 10,000 under emulation)');
  assert.equal(q.ipvsFullChangeMax, undefined);
  assert.equal(parseScaleArgs(['--ipvs-full-change-max', '5000'], () => {}).ipvsFullChangeMax, 5000);
  const only = parseScaleArgs(['--ipvs-sizes', 'none', '--ipvs-connect-modes', 'iptables'], () => {});
  assert.deepEqual([only.ipvsSizes, only.ipvsConnectModes], [[], ['iptables']], 'a VM boot for iptables connect latency only');
  assert.throws(() => parseScaleArgs(['--ipvs-connect-modes', 'nft'], () => {}), /KPROXY_BENCH_ARGS/);
  assert.throws(() => parseScaleArgs(['--ipvs-sizes', '100,x'], () => {}), /KPROXY_BENCH_ARGS/);
  assert.equal(parseScaleArgs([], () => {}).rawIptablesMax, MAX_SERVICES, 'raw references at every size by default');
  assert.equal(parseScaleArgs(['--raw-iptables-max', '20000'], () => {}).rawIptablesMax, 20_000);
  assert.throws(() => parseScaleArgs(['--raw-iptables-max', 'x'], () => {}), (e: Error) => e instanceof ScaleError && /--raw-iptables-max/.test(e.message));
  assert.throws(() => parseScaleArgs(['--variants', 'ipvs'], () => {}), (e: Error) => e instanceof ScaleError && /KPROXY_BENCH_ARGS/.test(e.message));
  assert.throws(() => parseScaleArgs(['--sizes', '0'], () => {}), /KPROXY_BENCH_ARGS/);
  assert.throws(() => parseScaleArgs(['--phases', 'nope'], () => {}), /KPROXY_BENCH_ARGS/);
});

function ipvsTargets(last: number) {
  return { first: { p10Ms: 0.5, p50Ms: 1, p99Ms: 2, count: 100, failed: 0 }, last: { p10Ms: last / 2, p50Ms: last, p99Ms: last * 2, count: 100, failed: 0 }, pod: { p10Ms: 0.4, p50Ms: 0.9, p99Ms: 2, count: 100, failed: 0 } };
}

function withIpvs(): ScaleResult {
  const r = result();
  const cold = (n: number, raw: number, kp: number, change: number[]) => ({
    n, kproxyMs: kp, kproxyExecMs: kp * 0.9, changeMs: change, virtualServers: 2 * n,
    raw: { ipset: raw / 4, iptables: raw / 4, ipvsadm: raw / 4, addresses: raw / 4, total: raw, ipvsLines: 12 * n, setLines: 2 * n },
    firstSyncCommands: 'ipvsadm -R ×1 10.00 s', changeCommands: 'ipvsadm -Ln ×1 2.00 s',
  });
  r.ipvs = {
    vmSeconds: 300, exitCode: 0, kernel: '6.1.0-57-amd64', endpoints: 5, seconds: 290,
    options: { coldSizes: [100, 1000], connectSizes: [100, 1000], endpoints: 5, changes: 3, connectCount: 100, memMiB: 1024, timeoutS: 600 },
    cold: [cold(100, 9000, 9500, [4000, 5000, 6000]), cold(1000, 20_000, 60_000, [20_000, 25_000, 30_000])],
    connect: [
      { n: 100, mode: 'ipvs', loadMs: 9000, targets: ipvsTargets(1.1) }, { n: 100, mode: 'iptables', loadMs: 3000, targets: ipvsTargets(1.2) },
      { n: 1000, mode: 'ipvs', loadMs: 60_000, targets: ipvsTargets(1.1) }, { n: 1000, mode: 'iptables', loadMs: 9000, targets: ipvsTargets(3) },
    ],
  };
  return r;
}

test('the ipvs phase: goals are reported (met only at the sizes they name), a section and two plots', () => {
  const r = withIpvs();
  const g = goals(r);
  const find = (s: string) => g.find((x) => x.goal.startsWith(s))!;
  const cold = find('IPVS (VM): cold start');
  assert.match(cold.measured, /1,000: 1\.0 min|1,000: 60\.0 s vs raw 20\.0 s \(3\.00×\)/);
  assert.equal(cold.met, undefined, '10,000 not measured: neither met nor missed');
  assert.match(find('IPVS (VM): one-Service change').measured, /1,000: 25\.0 s \(5\.0× from 100 to 1,000\)/);
  const con = find('IPVS (VM): first-packet');
  assert.equal(con.met, true, 'both modes at two sizes');
  assert.match(con.measured, /1,000: ipvs 1\.10 \(0\.55 ms\), iptables 3\.00 \(1\.50 ms\)/, 'last ÷ first in p10, and the last p10');
  assert.match(find("the seed's claim").measured, /VM ipvs: last ÷ first Service \(p10, one window\) 1\.10 at 100 → 1\.10 at 1,000/);
  assert.match(find("the seed's claim").measured, /VM iptables: last ÷ first Service \(p10, one window\) 1\.20 at 100 → 3\.00 at 1,000/);
  r.goals = g;
  const md = markdown(r);
  assert.match(md, /### IPVS in the IPVS VM/);
  assert.match(md, /\| 1,000 \| 5\.00 s \| 5\.00 s \| 5\.00 s \(12,000 lines\) \| 5\.00 s \| 20\.0 s \| 60\.0 s \(54\.0 s\) \| 3\.00 \| 25\.0 s/);
  assert.match(md, /\| iptables \| 1,000 \| 0\.50 \/ 1\.00 \/ 2\.00 \| 1\.50 \/ 3\.00 \/ 6\.00 \|/);
  const p = plots(r);
  assert.ok(p['scale-ipvs-vm-connect.svg'] && p['scale-ipvs-vm-sync.svg']);
  assert.equal((p['scale-ipvs-vm-connect.svg'].match(/<path /g) ?? []).length, 6);
  assert.equal((p['scale-ipvs-vm-connect-ratio.svg'].match(/<path /g) ?? []).length, 4, 'last ÷ first, p10 and p50, per mode');
  assert.equal((p['scale-ipvs-vm-sync.svg'].match(/<path /g) ?? []).length, 3);
});

test('a failed VM run is reported as such, not as not measured', () => {
  const r = result();
  r.ipvs = { vmSeconds: 250, exitCode: 124, error: 'KPROXY_BENCH_IPVS_VM: the VM run hit its --timeout of 240 s', options: { coldSizes: [100], connectSizes: [100], endpoints: 5, changes: 3, connectCount: 100, memMiB: 1024, timeoutS: 240 } };
  const g = goals(r).find((x) => x.goal.startsWith('IPVS (VM): cold start'))!;
  assert.match(g.measured, /nothing measured; KPROXY_BENCH_IPVS_VM: the VM run hit its --timeout/);
  assert.match(markdown({ ...r, goals: [] }), /\*\*The VM run failed:\*\* KPROXY_BENCH_IPVS_VM/);
});

test('the VM command line shares a symlinked node_modules at its own path', async () => {
  const { mkdtempSync, mkdirSync, symlinkSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const { vmArgs } = await import('../../bench/ipvs-vm.ts');
  const d = mkdtempSync(join(tmpdir(), 'kpb-vmargs-'));
  try {
    mkdirSync(join(d, 'real-nm'));
    mkdirSync(join(d, 'repo'));
    symlinkSync(join(d, 'real-nm'), join(d, 'repo', 'node_modules'));
    const a = vmArgs({ coldSizes: [100, 1000], connectSizes: [100], endpoints: 5, changes: 3, connectCount: 50, memMiB: 2048, timeoutS: 900 }, '/project/bench/out/x.json', join(d, 'repo'));
    const shares = a.flatMap((x, i) => (a[i - 1] === '--share' ? [x] : []));
    assert.deepEqual(shares, [`${join(d, 'repo')}:/project`, '/usr/bin:/hostbin:ro', `${join(d, 'real-nm')}:${join(d, 'real-nm')}:ro`]);
    assert.deepEqual(a.slice(a.indexOf('bench/ipvs-in-vm.sh') + 1, a.indexOf('bench/ipvs-in-vm.sh') + 3), ['--cold-sizes', '100,1000']);
    assert.equal(a[a.indexOf('--mem') + 1], '2048');
    assert.ok(!a.includes('--full-change-max'), 'absent: the guest default (every size)');
    const b = vmArgs({ coldSizes: [100], connectSizes: [100, 10_000], endpoints: 5, changes: 3, connectCount: 50, memMiB: 4096, timeoutS: 900, fullChangeMax: 1000 }, '/x.json', join(d, 'repo'));
    assert.equal(b[b.indexOf('--full-change-max') + 1], '1000');
    assert.equal(b[b.indexOf('--connect-sizes') + 1], '100,10000');
    assert.ok(!b.includes('--connect-modes'), 'absent: both modes');
    const c = vmArgs({ coldSizes: [], connectSizes: [10_000], endpoints: 5, changes: 3, connectCount: 50, memMiB: 4096, timeoutS: 900, connectModes: ['iptables'] }, '/x.json', join(d, 'repo'));
    assert.deepEqual([c[c.indexOf('--connect-modes') + 1], c[c.indexOf('--cold-sizes') + 1]], ['iptables', '']);
  } finally {
    rmSync(d, { recursive: true, force: true });
  }
});

test("a VM killed at its limit: the result is rebuilt from the samples it printed", async () => {
  const { fromLines } = await import('../../bench/ipvs-vm.ts');
  const cold = { n: 100, kproxyMs: 3000, kproxyExecMs: 2000, changeMs: [400], virtualServers: 200, raw: { ipset: 1, iptables: 1, ipvsadm: 1, addresses: 1, total: 4, ipvsLines: 1200, setLines: 200 } };
  const r = fromLines([
    'ipvs-bench: start at uptime 7.26s, kernel 6.1.0-57-amd64, 1 vCPU, 960 MiB',
    `IPVSBENCH ${JSON.stringify({ connect: { n: 100, mode: 'ipvs', loadMs: 5, targets: ipvsTargets(1) } })}`,
    `IPVSBENCH ${JSON.stringify({ cold })}`,
    'IPVSBENCH {"cold": {"n": 1000, "kpro',
  ]);
  assert.equal(r.kernel, '6.1.0-57-amd64');
  assert.deepEqual(r.cold, [cold], 'the cut line is left out');
  assert.equal(r.connect?.length, 1);
  assert.equal(r.connect?.[0].targets.last.p10Ms, 0.5);
});

test('a busy xtables lock (another program on the host) is told apart from a failure of what is measured', async () => {
  const { xtablesLockBusy } = await import('../../bench/cold.ts');
  assert.equal(xtablesLockBusy("KPROXY_IPTABLES_RESTORE_FAILED: iptables-restore failed (exit 4): Can't lock /run/xtables.lock: Resource temporarily unavailable"), true);
  assert.equal(xtablesLockBusy('Another app is currently holding the xtables lock. Stopped waiting after 5s.'), true);
  assert.equal(xtablesLockBusy('KPROXY_EXEC_TIMEOUT: iptables-restore killed after 60 s'), false);
  assert.equal(xtablesLockBusy(undefined), false);
});

test('the one-Service change goal is judged on the packet detection when the run has it; both detections are reported', () => {
  const r = result();
  const withPacket = (x: RunPhaseResult, ms: number[]): RunPhaseResult => ({
    ...x, changePacketMs: ms, changePacketConnects: ms.map(() => 40),
    streamPacket: x.stream && { ...x.stream, p50Ms: 450, p99Ms: 900, connectsMedian: 30, syncs: { count: 20, full: 0, changedMedian: 10, changedMax: 14, durationMedianMs: 200, durationMaxMs: 400 } },
  });
  // the kernel poll says 260 ms at 10k (> 3 × 70 ms at 100); the connections say 120 vs 60 ms
  r.run = r.run.map((x) => (x.variant === 'iptables' ? withPacket(x, x.n === 100 ? [55, 60, 65] : [110, 120, 130]) : x));
  r.goals = goals(r);
  const find = (s: string) => r.goals.find((x) => x.goal.includes(s))!;
  assert.equal(find('iptables: one-Service change').met, true);
  assert.match(find('iptables: one-Service change').measured, /120 ms at 10k, 60 ms at 100 \(2.0×; packet detection\)/);
  assert.match(find('nftables: one-Service change').measured, /kernel poll/, 'no packet samples: the poll is used, and said so');
  assert.match(find('event → kernel').measured, /iptables 450 ms \/ 900 ms \(300\/300 seen, packet\)/);
  const md = markdown(r);
  assert.match(md, /### One-Service change and a stream of endpoint changes/);
  assert.match(md, /\| iptables \| 10,000 \| 120 ms \(3\) \| 260 ms \(3\) \| 5.00 ms \| 450 ms \/ 900 ms \(300\/300, 10\/s × 30 s\) \| 20 \(10 \/ 14 each, 200 ms\) \| 600 ms \/ 1.20 s/);
  // a solid (packet) and a dashed (kernel poll) line for iptables, the poll line only for nftables
  assert.equal((plots(r)['scale-one-service-change.svg'].match(/<path /g) ?? []).length, 3);
  assert.equal(parseScaleArgs(['--detect', 'packet'], () => {}).detect, 'packet');
  assert.equal(parseScaleArgs([], () => {}).detect, 'both');
  assert.throws(() => parseScaleArgs(['--detect', 'ping'], () => {}), (e: Error) => e instanceof ScaleError && /KPROXY_BENCH_ARGS: --detect/.test(e.message));
});

test('the network-programming histogram is read from /metrics text and differenced between two scrapes', () => {
  const text = (counts: number[]) => [
    '# HELP kubeproxy_network_programming_duration_seconds In Cluster Network Programming Latency in seconds',
    '# TYPE kubeproxy_network_programming_duration_seconds histogram',
    ...[0.25, 0.5, 1, 2, 3].map((le, i) => `kubeproxy_network_programming_duration_seconds_bucket{le="${le}",ip_family="4"} ${counts[i]}`),
    `kubeproxy_network_programming_duration_seconds_bucket{le="+Inf",ip_family="4"} ${counts[4]}`,
    `kubeproxy_network_programming_duration_seconds_count{ip_family="4"} ${counts[4]}`,
    'kubeproxy_sync_proxy_rules_duration_seconds_bucket{le="0.25",ip_family="4"} 99',
  ].join('\n');
  const before = parseProgrammingBuckets(text([1, 2, 5, 5, 5]));
  assert.equal(before.get(1), 5);
  assert.equal(before.get(Infinity), 5);
  // 100 more: 10 within 0.5 s, 60 within 1 s, 99 within 2 s, all within 3 s
  const after = parseProgrammingBuckets(text([1, 12, 65, 104, 105]));
  assert.deepEqual(metricDelta(before, after), { count: 100, p50S: 1, p99S: 2 });
  assert.deepEqual(metricDelta(before, before), { count: 0, p50S: NaN, p99S: NaN });
  assert.equal(metricDelta(undefined, after), undefined, 'no scrape: no figure');
});

test('the write log counts the rule writes that started in a window, reads and probes not', () => {
  const log = [
    '1000.000000 1000.900000 iptables-restore 0 -w 5 --noflush --counters',
    '1001.000000 1001.100000 ip6tables-restore 0 -w 5 --noflush --counters',
    '1001.500000 1001.600000 iptables-restore 0 --version',
    '1002.000000 1002.500000 nft 0 -f -',
    '1002.600000 1002.700000 nft 0 list table ip kube-proxy',
    '1009.000000 1010.000000 iptables-restore 0 -w 5 --noflush --counters',
    '',
  ].join('\n');
  assert.deepEqual(writesIn(log, 1_000_000, 1_005_000), { writes: 3, writeMedianMs: 500 });
  // probes (`--version`) and reads (`nft list`) are not writes
  assert.equal(writesIn(log, 1_001_400, 1_002_800).writes, 1);
  assert.equal(writesIn(log, 1_003_000, 1_008_000).writes, 0);
});

test('killVm kills the VM runner and what it runs under `timeout`, which sits in a process group of its own', async () => {
  const { spawn } = await import('node:child_process');
  const { mkdtempSync, readFileSync, existsSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { join } = await import('node:path');
  const { killVm } = await import('../../bench/ipvs-vm.ts');
  const d = mkdtempSync(join(tmpdir(), 'kpb-killvm-'));
  const pidFile = join(d, 'pid');
  // the runner's shape: a shell that runs the "VM" under timeout and waits for it
  const p = spawn('bash', ['-c', `timeout -k 2 60 sh -c 'echo $$ > ${pidFile}; exec sleep 60'; echo after`], { detached: true, stdio: 'ignore' });
  try {
    const inner = Number(await waitFor('the child to write its pid', () => existsSync(pidFile) && readFileSync(pidFile, 'utf8').trim(), 10_000));
    const alive = (pid: number) => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    };
    assert.ok(alive(inner));
    await killVm(p);
    await waitFor('the process under timeout to be killed', () => !alive(inner), 10_000);
  } finally {
    try {
      process.kill(-p.pid!, 'SIGKILL');
    } catch {
      /* gone */
    }
    rmSync(d, { recursive: true, force: true });
  }
});

test('linePlotSVG: yMin lifts a linear axis off 0 (ratios near 1), the default keeps 0', async () => {
  const { linePlotSVG } = await import('../../bench/plot.ts');
  const series = [{ label: 'a', color: '#000', points: [[100, 0.9], [1000, 1.4]] as Array<[number, number]> }];
  const o = { title: 't', subtitle: 's', yLabel: 'y', fmt: (v: number) => v.toFixed(2) };
  const lifted = linePlotSVG(series, { ...o, yMin: 0.8 });
  assert.match(lifted, />0\.80<\/text>/);
  assert.doesNotMatch(lifted, />0\.00<\/text>/);
  assert.match(linePlotSVG(series, o), />0\.00<\/text>/);
});
