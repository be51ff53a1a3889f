// Memory over time: `kproxy run` (manifests source) at 2,000 Services while one Service's
// EndpointSlice changes 5 times a second, for an hour (--quick: one minute), in the iptables
// and the nftables mode at the same time, each in a network namespace of its own. Every ~10 s
// it samples, per mode:
//   - VmRSS and VmHWM (/proc/PID/status) and the open fds (/proc/PID/fd);
//   - the syncs done: kproxy's kubeproxy_sync_proxy_rules_duration_seconds count (its
//     /metrics on 127.0.0.1 in the namespace, docs/metrics.md) and its "synced" log lines;
//   - the heap after GC: kproxy's node runs with --trace-gc, and the live heap V8 prints after
//     each Mark-Compact ("Mark-Compact 45.2 (60.1) -> 40.1 (58.0) MB": used (committed) before
//     -> after) is taken from its stdout. No endpoint is added to kproxy for it.
// Warm-up: the first --warmup seconds of the change stream (default a sixth of it: 10 minutes
// of the hour, 10 s of the quick minute). Each figure's baseline is its value at the first
// sample after warm-up; the summary gives the baseline, the end, the largest deviation from
// the baseline after warm-up, and the least-squares slope after warm-up (MiB per hour: a leak
// keeps a slope, a settling heap does not).
//
//   sudo node --import tsx bench/soak.ts [--quick] [--minutes 60] [--services 2000]
//        [--endpoints 5] [--rate 5] [--interval 10] [--warmup SECONDS]
//        [--modes iptables,nftables] [--json FILE] [--svg FILE] [--node-arg=--FLAG ...]
//        [--snapshot-at S1,S2 --snapshot-dir DIR]   # heap snapshots at S1, S2 s: bench/heap-diff.ts
//        [--v8-log DIR]   # kproxy's V8 output (e.g. --node-arg=--trace-gc-verbose) kept, a file per mode
//   node --import tsx bench/soak.ts --replot FILE.json [--json FILE] [--svg FILE]   # summary and plot again, from a run's JSON
//
// The changes cycle the hot slice through E … E+16 endpoints, so the state kproxy holds has a
// fixed upper bound: anything that grows with the number of changes is kept by kproxy, not
// by the workload. Every namespace and process the bench starts is removed at the end, on an
// error and on SIGINT/SIGTERM.
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { hotServices, killGroup, readMemory, writeManifests } from './kproxy-run.ts';
import { Namespaces, TimedRunner } from './netns.ts';
import { linePlotSVG, type Series } from './plot.ts';
import { median, pollUntil, sleep } from './stats.ts';
import { serviceName, sliceObject } from './workload.ts';
import { bundleEntry } from './bundle.ts';

const repoRoot = resolve(import.meta.dirname, '..');
const EXTRA_ENDPOINTS = 16;

export type SoakMode = 'iptables' | 'nftables';

export interface SoakOptions {
  modes: SoakMode[];
  services: number;
  endpoints: number;
  /** changes per second to the hot Service's slice */
  rate: number;
  /** length of the change stream, s */
  seconds: number;
  /** sampling interval, s */
  interval: number;
  /** the first part of the stream that is warm-up, s */
  warmup: number;
  startTimeoutMs: number;
  /** more node flags for kproxy (e.g. --max-semi-space-size=2), after --trace-gc */
  nodeArgs: string[];
  /**
   * s since the stream started at which kproxy writes a heap snapshot (it runs with
   * --heapsnapshot-signal=SIGUSR2 then) into snapshotDir: for bench/heap-diff.ts
   */
  snapshotAt: number[];
  snapshotDir?: string;
  /** a directory for kproxy's V8 output (--trace-gc lines and what other --node-arg flags print), one file per mode, ≤ 200 MB each */
  v8LogDir?: string;
}

/** One Mark-Compact as V8 printed it (--trace-gc): MiB used (committed) before → after. */
export interface GcEvent {
  /** s since the change stream started (negative: before it) */
  t: number;
  kind: string;
  beforeMiB: number;
  afterMiB: number;
  committedAfterMiB: number;
}

export interface SoakSample {
  /** s since the change stream started */
  t: number;
  rssMiB: number;
  hwmMiB: number;
  fds: number;
  /** the live heap after the last Mark-Compact so far (MiB) */
  heapAfterGcMiB: number;
  /** Mark-Compacts so far */
  markCompacts: number;
  /** kubeproxy_sync_proxy_rules_duration_seconds_count (NaN when the scrape failed) */
  syncsMetric: number;
  /** "synced" log lines so far (syncs that wrote something or were full) */
  syncsLogged: number;
  /** slice rewrites so far */
  changes: number;
}

export interface FigureSummary {
  atWarmup: number;
  end: number;
  min: number;
  max: number;
  /** largest |value − atWarmup| over the samples after warm-up */
  maxDeviation: number;
  /** the median of the last 5 minutes' samples: the end without one sample's accident (a full sync at that moment) */
  endMedian: number;
  /** least-squares slope over the samples after warm-up, per hour */
  slopePerHour: number;
}

export interface SoakModeResult {
  mode: SoakMode;
  pid?: number;
  firstSyncS?: number;
  samples: SoakSample[];
  gc: GcEvent[];
  summary?: Record<'rssMiB' | 'hwmMiB' | 'fds' | 'heapAfterGcMiB', FigureSummary>;
  /** s since the stream started of the full syncs kproxy logged (the first one is before it; then one an hour) */
  fullSyncs?: number[];
  /** heap snapshots written: s since the stream started, file */
  snapshots?: Array<{ t: number; file: string }>;
  syncs?: number;
  changes?: number;
  error?: string;
}

export interface SoakResult {
  date: string;
  host: { node: string; cpus: number };
  options: SoakOptions;
  command: string;
  /** what bin/kproxy.js ran: the esbuild bundle (dist/, as shipped) or the sources through tsx (more memory) */
  entry: 'dist bundle' | 'tsx sources';
  results: SoakModeResult[];
}

const MC = /(Mark-Compact(?: \(reduce\))?|Mark-Sweep)\s+([\d.]+) \(([\d.]+)\) -> ([\d.]+) \(([\d.]+)\) MB/;

/** A --trace-gc line's Mark-Compact, if it is one. */
export function parseGcLine(line: string): Omit<GcEvent, 't'> | undefined {
  const m = MC.exec(line);
  if (!m) return undefined;
  return { kind: m[1], beforeMiB: Number(m[2]), afterMiB: Number(m[4]), committedAfterMiB: Number(m[5]) };
}

const SYNC_COUNT = /^kubeproxy_sync_proxy_rules_duration_seconds_count(?:\{[^}]*\})? (\S+)$/;

/** The syncs kproxy counted (both families summed), from its /metrics text. */
export function parseSyncCount(text: string): number {
  let n = NaN;
  for (const line of text.split('\n')) {
    const m = SYNC_COUNT.exec(line.trim());
    if (m) n = (Number.isNaN(n) ? 0 : n) + Number(m[1]);
  }
  return n;
}

/** Baseline, end, range, largest deviation and slope of one figure after warm-up. */
export function summarize(points: Array<[number, number]>, warmup: number): FigureSummary | undefined {
  const after = points.filter(([t, v]) => t >= warmup && Number.isFinite(v));
  if (!after.length) return undefined;
  const base = after[0][1];
  const vs = after.map((p) => p[1]);
  const n = after.length;
  const mt = after.reduce((s, p) => s + p[0], 0) / n;
  const mv = vs.reduce((s, v) => s + v, 0) / n;
  const sxx = after.reduce((s, p) => s + (p[0] - mt) ** 2, 0);
  const sxy = after.reduce((s, p) => s + (p[0] - mt) * (p[1] - mv), 0);
  return {
    atWarmup: base, end: vs[n - 1], min: Math.min(...vs), max: Math.max(...vs),
    maxDeviation: Math.max(...vs.map((v) => Math.abs(v - base))),
    endMedian: median(after.filter(([t]) => t >= after[n - 1][0] - 300).map((p) => p[1])),
    slopePerHour: sxx > 0 ? (sxy / sxx) * 3600 : NaN,
  };
}

function fdCount(pid: number): number {
  try {
    return readdirSync(`/proc/${pid}/fd`).length;
  } catch {
    return NaN;
  }
}

/** Rewrites the hot slice with `count` endpoints: temp file (a dot file, which the source ignores) + rename. */
function writeSlice(dir: string, i: number, count: number, endpoints: number): void {
  const slice = sliceObject(i, count, endpoints + EXTRA_ENDPOINTS);
  (slice.metadata as { annotations?: Record<string, string> }).annotations = {
    'endpoints.kubernetes.io/last-change-trigger-time': new Date().toISOString(),
  };
  const tmp = join(dir, `.tmp-${serviceName(i)}`);
  writeFileSync(tmp, `---\n${JSON.stringify(slice)}\n`);
  renameSync(tmp, join(dir, `hot-${serviceName(i)}.yaml`));
}

/** Signals kproxy (SIGUSR2: --heapsnapshot-signal) and waits (≤ 120 s) until a new snapshot in dir stops growing. */
async function heapSnapshot(pid: number, dir: string): Promise<string | undefined> {
  const before = new Set(readdirSync(dir));
  process.kill(pid, 'SIGUSR2');
  let last = -1;
  return pollUntil(async () => {
    const f = readdirSync(dir).find((n) => n.endsWith('.heapsnapshot') && !before.has(n));
    if (!f) return undefined;
    const size = statSync(join(dir, f)).size;
    const done = size > 0 && size === last;
    last = size;
    return done ? join(dir, f) : undefined;
  }, 120_000, 1000);
}

const live = new Set<ChildProcess>();

/** One mode: kproxy in its namespace, the change stream and the sampler; everything removed at the end. */
async function soakMode(mode: SoakMode, nss: Namespaces, work: string, o: SoakOptions, log: (l: string) => void): Promise<SoakModeResult> {
  const res: SoakModeResult = { mode, samples: [], gc: [] };
  const dir = join(work, `manifests-${mode}`);
  const hot = hotServices(o.services, 1);
  writeManifests(dir, o.services, o.endpoints, hot);
  const ns = await nss.create(`soak${mode.slice(0, 3)}`);
  const runner = new TimedRunner(ns);
  let proc: ChildProcess | undefined;
  const t0 = performance.now();
  /** ms (performance.now) when the change stream started; 0 before */
  let streamAt = 0;
  try {
    const env: NodeJS.ProcessEnv = { ...process.env, KPROXY_LOG_LEVEL: 'info' };
    const metrics = '127.0.0.1:10249';
    const snapDir = o.snapshotAt.length ? join(o.snapshotDir ?? work, mode) : undefined;
    if (snapDir) mkdirSync(snapDir, { recursive: true });
    const nodeArgs = ['--trace-gc', ...o.nodeArgs, ...(snapDir ? ['--heapsnapshot-signal=SIGUSR2'] : [])];
    proc = spawn('ip', ['netns', 'exec', ns, process.execPath, ...nodeArgs, join(repoRoot, 'bin/kproxy.js'), 'run', '--mode', mode,
      '--manifests', dir, '--hostname-override', 'kpb-node', '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', metrics], { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env, cwd: snapDir });
    live.add(proc);
    proc.once('exit', () => live.delete(proc!));
    res.pid = proc.pid;
    let dead = false;
    proc.once('exit', () => (dead = true));
    let synced = 0;
    let firstSync = false;
    let tail = '';
    let errTail = '';
    const v8Log = o.v8LogDir ? join(o.v8LogDir, `${mode}-v8.log`) : undefined;
    if (v8Log) {
      mkdirSync(o.v8LogDir!, { recursive: true });
      writeFileSync(v8Log, '');
    }
    let v8LogBytes = 0;
    proc.stdout!.on('data', (d: Buffer) => {
      const lines = (tail + d.toString()).split('\n');
      tail = lines.pop() ?? '';
      const now = performance.now();
      for (const l of lines) {
        if (l.startsWith('{')) {
          if (l.includes('"msg":"synced"')) {
            synced++;
            if (l.includes('"full":true')) {
              firstSync = true;
              (res.fullSyncs ??= []).push(now); // s since the stream started, at the end
            }
          }
          continue;
        }
        if (v8Log && v8LogBytes < 200e6) {
          appendFileSync(v8Log, `${((now - (streamAt || t0)) / 1000).toFixed(1)} ${l}\n`);
          v8LogBytes += l.length + 8;
        }
        const g = parseGcLine(l);
        // t holds performance.now() (ms) until the end, where it becomes s since the stream started
        if (g) res.gc.push({ t: now, ...g });
      }
    });
    proc.stderr!.on('data', (d: Buffer) => void (errTail = (errTail + d.toString()).slice(-2000)));

    const ok = await pollUntil(async () => (dead ? false : firstSync || undefined), o.startTimeoutMs, 100);
    if (!ok) throw new Error(`KPROXY_BENCH_SOAK: ${mode}: no first sync within ${o.startTimeoutMs / 1000} s${dead ? ' (kproxy exited)' : ''}: ${errTail.slice(-300)}`);
    res.firstSyncS = (performance.now() - t0) / 1000;
    log(`  ${mode}: first sync after ${res.firstSyncS.toFixed(1)} s; changes at ${o.rate}/s for ${o.seconds} s`);
    streamAt = performance.now();

    const total = Math.round(o.rate * o.seconds);
    let changes = 0;
    const cycle = EXTRA_ENDPOINTS + 1;
    const writer = (async () => {
      for (let k = 0; k < total && !dead; k++) {
        const wait = streamAt + (k * 1000) / o.rate - performance.now();
        if (wait > 0) await sleep(wait);
        writeSlice(dir, hot[0], o.endpoints + ((k + 1) % cycle), o.endpoints);
        changes++;
      }
    })();
    const sample = async (): Promise<void> => {
      const t = (performance.now() - streamAt) / 1000;
      const mem = readMemory(proc!.pid!);
      const fds = fdCount(proc!.pid!);
      let syncsMetric = NaN;
      try {
        const r = await runner.run('curl', ['-s', '--max-time', '5', `http://${metrics}/metrics`], { timeoutMs: 10_000 });
        if (r.code === 0) syncsMetric = parseSyncCount(r.stdout);
      } catch {
        /* NaN */
      }
      const lastGc = res.gc[res.gc.length - 1];
      res.samples.push({
        t, rssMiB: (mem?.vmRssKiB ?? NaN) / 1024, hwmMiB: (mem?.vmHwmKiB ?? NaN) / 1024, fds,
        heapAfterGcMiB: lastGc?.afterMiB ?? NaN, markCompacts: res.gc.length, syncsMetric, syncsLogged: synced, changes,
      });
    };
    const samples = Math.ceil(o.seconds / o.interval);
    for (let s = 0; s <= samples && !dead; s++) {
      const wait = streamAt + s * o.interval * 1000 - performance.now();
      if (wait > 0) await sleep(wait);
      await sample();
      const x = res.samples[res.samples.length - 1];
      if (snapDir && o.snapshotAt.some((at) => at <= x.t && !(res.snapshots ?? []).some((h) => h.t >= at))) {
        const file = await heapSnapshot(proc.pid!, snapDir);
        (res.snapshots ??= []).push({ t: x.t, file: file ?? 'none within 120 s' });
        log(`  ${mode} t=${x.t.toFixed(0)} s: heap snapshot ${file}`);
      }
      if (s % Math.max(1, Math.round(60 / o.interval)) === 0) {
        log(`  ${mode} t=${x.t.toFixed(0)} s: RSS ${x.rssMiB.toFixed(1)} MiB, HWM ${x.hwmMiB.toFixed(1)} MiB, heap after GC ${x.heapAfterGcMiB.toFixed(1)} MiB (${x.markCompacts} MC), fds ${x.fds}, syncs ${x.syncsMetric}, changes ${x.changes}`);
      }
    }
    await writer;
    if (dead) throw new Error(`KPROXY_BENCH_SOAK: ${mode}: kproxy exited during the run: ${errTail.slice(-300)}`);
    res.changes = changes;
    res.syncs = res.samples[res.samples.length - 1]?.syncsMetric;
    return res;
  } catch (e) {
    res.error = (e as Error).message.slice(0, 500);
    return res;
  } finally {
    if (proc) await killGroup(proc);
    const since = (ms: number) => Math.round((ms - (streamAt || t0)) / 100) / 10;
    for (const g of res.gc) g.t = since(g.t);
    if (res.fullSyncs) res.fullSyncs = res.fullSyncs.map(since);
    await nss.delete(ns);
    rmSync(dir, { recursive: true, force: true });
    if (!res.error || res.samples.length) summarizeMode(res, o.warmup);
  }
}

export function summarizeMode(r: SoakModeResult, warmup: number): void {
  const fig = (k: 'rssMiB' | 'hwmMiB' | 'fds' | 'heapAfterGcMiB') => summarize(r.samples.map((s) => [s.t, s[k]]), warmup);
  const rss = fig('rssMiB'), hwm = fig('hwmMiB'), fds = fig('fds'), heap = fig('heapAfterGcMiB');
  if (rss && hwm && fds && heap) r.summary = { rssMiB: rss, hwmMiB: hwm, fds, heapAfterGcMiB: heap };
}

export async function runSoak(o: SoakOptions, log: (l: string) => void): Promise<SoakModeResult[]> {
  const nss = new Namespaces(`${process.pid}`);
  const work = mkdtempSync(join(tmpdir(), 'kpb-soak-'));
  const stop = async (sig: string) => {
    log(`${sig}: stopping kproxy and removing the namespaces`);
    await Promise.all([...live].map((p) => killGroup(p)));
    await nss.deleteAll();
    rmSync(work, { recursive: true, force: true });
    process.exit(130);
  };
  const onInt = () => void stop('SIGINT');
  const onTerm = () => void stop('SIGTERM');
  process.once('SIGINT', onInt);
  process.once('SIGTERM', onTerm);
  try {
    return await Promise.all(o.modes.map((m) => soakMode(m, nss, work, o, log)));
  } finally {
    await Promise.all([...live].map((p) => killGroup(p)));
    await nss.deleteAll();
    rmSync(work, { recursive: true, force: true });
    process.off('SIGINT', onInt);
    process.off('SIGTERM', onTerm);
  }
}

const f1 = (v: number) => (Number.isFinite(v) ? v.toFixed(1) : '–');

export function markdown(r: SoakResult): string {
  const o = r.options;
  const rows: string[] = [];
  for (const m of r.results) {
    if (!m.summary) {
      rows.push(`| ${m.mode} | ${m.error ?? 'no samples'} | | | | |`);
      continue;
    }
    const s = m.summary;
    const cell = (x: FigureSummary, unit: string) => `${f1(x.atWarmup)} → ${f1(x.end)} ${unit}, last 5 min ${f1(x.endMedian)} (max dev ${f1(x.maxDeviation)}, ${x.slopePerHour >= 0 ? '+' : ''}${f1(x.slopePerHour)}/h)`;
    rows.push(`| ${m.mode} | ${cell(s.rssMiB, 'MiB')} | ${cell(s.heapAfterGcMiB, 'MiB')} | ${cell(s.fds, '')} | ${f1(s.hwmMiB.end)} MiB | ${m.syncs ?? '–'} syncs, ${m.changes ?? '–'} changes${m.error ? `; ${m.error}` : ''} |`);
  }
  return `### Memory over time: ${o.services.toLocaleString('en-US')} Services, one Service's endpoints changing ${o.rate}/s for ${(o.seconds / 60).toFixed(0)} min (kproxy from the ${r.entry})\n\n` +
    `Values at the end of warm-up (the first ${o.warmup} s of the stream) → at the end, and the median of the last 5 minutes; max dev = the largest distance from the warm-up value after it; slope = least squares after warm-up.\n\n` +
    `| mode | RSS | heap after GC (Mark-Compact) | open fds | VmHWM | syncs |\n|---|---|---|---|---|---|\n${rows.join('\n')}\n`;
}

const COLORS: Record<SoakMode, string> = { iptables: '#1f77b4', nftables: '#d62728' };

export function plot(r: SoakResult): string {
  const series: Series[] = [];
  for (const m of r.results) {
    const pts = (k: 'rssMiB' | 'heapAfterGcMiB') => m.samples.filter((s) => s.t > 0).map((s): [number, number] => [s.t / 60, s[k]]);
    series.push({ label: `${m.mode} RSS`, color: COLORS[m.mode], points: pts('rssMiB') });
    series.push({ label: `${m.mode} heap after GC`, color: COLORS[m.mode], dash: true, points: pts('heapAfterGcMiB') });
  }
  const o = r.options;
  return linePlotSVG(series, {
    title: `kproxy run: memory over time (${o.services.toLocaleString('en-US')} Services, ${o.rate} endpoint changes/s)`,
    subtitle: `VmRSS and the live heap after each Mark-Compact (--trace-gc); warm-up: first ${o.warmup} s`,
    yLabel: 'MiB', xLabel: 'minutes since the change stream started', linearX: true, fmt: (v) => `${v.toFixed(0)}`,
  });
}

function parseSoakArgs(argv: string[]): { o: SoakOptions; json?: string; svg?: string; replot?: string } {
  const { values } = parseArgs({
    args: argv,
    options: {
      quick: { type: 'boolean', default: false },
      minutes: { type: 'string' },
      services: { type: 'string', default: '2000' },
      endpoints: { type: 'string', default: '5' },
      rate: { type: 'string', default: '5' },
      interval: { type: 'string' },
      warmup: { type: 'string' },
      modes: { type: 'string', default: 'iptables,nftables' },
      json: { type: 'string' },
      svg: { type: 'string' },
      replot: { type: 'string' },
      'node-arg': { type: 'string', multiple: true },
      'snapshot-at': { type: 'string' },
      'snapshot-dir': { type: 'string' },
      'v8-log': { type: 'string' },
    },
  });
  const seconds = values.minutes ? Number(values.minutes) * 60 : values.quick ? 60 : 3600;
  const modes = values.modes!.split(',').map((s) => s.trim()).filter(Boolean);
  for (const m of modes) if (m !== 'iptables' && m !== 'nftables') throw new Error(`KPROXY_BENCH_ARGS: unknown mode ${JSON.stringify(m)} (want iptables, nftables)`);
  const interval = values.interval ? Number(values.interval) : values.quick ? 5 : 10;
  const o: SoakOptions = {
    modes: modes as SoakMode[], services: Number(values.services), endpoints: Number(values.endpoints), rate: Number(values.rate),
    seconds, interval, warmup: values.warmup ? Number(values.warmup) : Math.round(seconds / 6), startTimeoutMs: 120_000,
    nodeArgs: values['node-arg'] ?? [],
    snapshotAt: (values['snapshot-at'] ?? '').split(',').filter(Boolean).map(Number),
    snapshotDir: values['snapshot-dir'] ? resolve(values['snapshot-dir']) : undefined,
    v8LogDir: values['v8-log'] ? resolve(values['v8-log']) : undefined,
  };
  if (o.snapshotAt.length && !o.snapshotDir) throw new Error('KPROXY_BENCH_ARGS: --snapshot-at needs --snapshot-dir (where the snapshots stay)');
  if (o.snapshotAt.some((v) => !(v >= 0))) throw new Error('KPROXY_BENCH_ARGS: --snapshot-at takes seconds, comma-separated');
  for (const [k, v] of Object.entries(o)) if (typeof v === 'number' && !(v >= 0)) throw new Error(`KPROXY_BENCH_ARGS: --${k} must be a number ≥ 0`);
  return { o, json: values.json, svg: values.svg, replot: values.replot };
}

async function main(): Promise<void> {
  const a = parseSoakArgs(process.argv.slice(2));
  const log = (l: string) => process.stderr.write(`${new Date().toISOString().slice(11, 19)} ${l}\n`);
  let r: SoakResult;
  if (a.replot) {
    r = JSON.parse(readFileSync(a.replot, 'utf8')) as SoakResult;
    for (const m of r.results) if (m.samples.length) summarizeMode(m, r.options.warmup);
  } else {
    if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: the soak bench creates network namespaces: run it as root');
    const entry = bundleEntry();
    log(`soak (kproxy from the ${entry}): ${a.o.modes.join(' + ')}, ${a.o.services} Services × ${a.o.endpoints} endpoints, ${a.o.rate} changes/s for ${a.o.seconds} s, a sample every ${a.o.interval} s, warm-up ${a.o.warmup} s`);
    const results = await runSoak(a.o, log);
    r = {
      date: new Date().toISOString(), host: { node: process.version, cpus: (await import('node:os')).cpus().length }, options: a.o,
      command: `node --import tsx bench/soak.ts ${process.argv.slice(2).join(' ')}`, entry, results,
    };
    if (results.some((x) => x.error)) process.exitCode = 1;
  }
  if (a.json) {
    mkdirSync(dirname(a.json), { recursive: true });
    writeFileSync(a.json, JSON.stringify(r, null, 1) + '\n');
  }
  if (a.svg) {
    mkdirSync(dirname(a.svg), { recursive: true });
    writeFileSync(a.svg, plot(r));
  }
  console.log(markdown(r));
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
