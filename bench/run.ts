// kproxy benchmarks: how rule programming scales with the number of services, per mode,
// side by side in one run (the "iptables grows linearly, nftables stays flat" claim).
//
//   node --import tsx bench/run.ts [--sizes 100,1000,5000,10000] [--endpoints 5]
//        [--modes iptables,nftables] [--repeat 3] [--changes 3] [--out bench/out]
//        [--svg docs/bench-one-service-change.svg] [--max-minutes 15] [--no-raw] [--raw-timeout 60]
//        [--exec-timeout S] [--no-verify]
//   node --import tsx bench/run.ts --report bench/out/a.json,bench/out/b.json [--svg FILE]
//
// --exec-timeout S lifts the executors' own time limits (60 s iptables-restore, 30 s nft) to S
// seconds, to learn how long a sync really takes where it would otherwise be killed.
// Modes: iptables, nftables, ipvs (only where the kernel has IPVS), and iptables-legacy: the
// iptables mode with iptables-legacy-* binaries swapped in by the command runner.
//
// Needs root: every kernel write happens inside network namespaces named kpb-* that the run
// creates and deletes (also on failure and on Ctrl-C). No traffic is sent.
import { mkdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { cpus, loadavg, totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { hostRunner } from '../src/kernel/runner.ts';
import { getMode } from '../src/modes/registry.ts';
import { measure, modeOf, VARIANTS, type Sample, type Variant } from './measure.ts';
import { Namespaces, TimedRunner } from './netns.ts';
import { benchConfig, Workload } from './workload.ts';
import { goalsTable, iptablesGoals, markdownTables, median, oneServiceChangeSVG, summarize, type GoalResult, type Summary } from './report.ts';

export interface BenchOptions {
  sizes: number[];
  endpoints: number;
  modes: Variant[];
  repeat: number;
  changes: number;
  outDir: string;
  svgPath: string | null;
  maxMinutes: number;
  raw: boolean;
  /** limit for each raw iptables-restore / nft -f reference, seconds */
  rawTimeoutS: number;
  /** replaces the executors' own time limits (60 s iptables-restore, 30 s nft), seconds; 0 keeps them */
  execTimeoutS: number;
  verify: boolean;
  log: (line: string) => void;
}

export interface Machine {
  date: string;
  kernel: string;
  cpus: number;
  cpuModel: string;
  memGiB: number;
  node: string;
  iptables: string;
  nft: string;
  loadBefore: number[];
  loadAfter: number[];
  /** median cost of `ip netns exec NS true`, paid by every command the bench runs */
  netnsExecMs: number;
}

export interface BenchResult {
  options: Omit<BenchOptions, 'log'>;
  machine: Machine;
  samples: Sample[];
  summary: Summary[];
  goals: GoalResult[];
  notes: string[];
  totalSeconds: number;
  markdown: string;
  jsonPath: string;
}

export class BenchError extends Error {}

async function firstLine(cmd: string, args: string[]): Promise<string> {
  try {
    const r = await hostRunner.run(cmd, args, { timeoutMs: 10_000 });
    return (r.stdout || r.stderr).split('\n')[0].trim();
  } catch {
    return 'not installed';
  }
}

async function netnsExecCost(nss: Namespaces): Promise<number> {
  const ns = await nss.create('probe');
  try {
    const runner = new TimedRunner(ns);
    for (let i = 0; i < 5; i++) await runner.run('true', []);
    return median(runner.take().map((r) => r.ms));
  } finally {
    await nss.delete(ns);
  }
}

async function describeMachine(nss: Namespaces): Promise<Machine> {
  return {
    date: new Date().toISOString(),
    kernel: await firstLine('uname', ['-r']),
    cpus: cpus().length,
    cpuModel: cpus()[0]?.model ?? 'unknown',
    memGiB: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    iptables: await firstLine('iptables', ['--version']),
    nft: await firstLine('nft', ['--version']),
    loadBefore: loadavg().map((l) => Math.round(l * 100) / 100),
    loadAfter: [],
    netnsExecMs: await netnsExecCost(nss),
  };
}

/** Modes that can be measured on this host; the others are reported and skipped. */
function runnableModes(modes: Variant[], notes: string[]): Variant[] {
  return modes.filter((m) => {
    if (m === 'userspace') {
      notes.push('userspace: skipped (it forwards in kproxy itself; there are no rules whose programming cost scales)');
      return false;
    }
    if (m === 'ipvs' && !existsSync('/proc/net/ip_vs') && !existsSync('/sys/module/ip_vs')) {
      notes.push('ipvs: skipped (this kernel has no IPVS; the IPVS test VM runs under software emulation, so its timings would not be comparable)');
      return false;
    }
    if (m === 'iptables-legacy' && !existsSync('/usr/sbin/iptables-legacy-restore') && !existsSync('/sbin/iptables-legacy-restore')) {
      notes.push('iptables-legacy: skipped (iptables-legacy-restore is not installed)');
      return false;
    }
    return true;
  });
}

function describeSample(s: Sample): string {
  if (s.error) return `N=${s.n} ${s.mode} rep=${s.rep}: render=${s.renderMs.toFixed(0)}ms full sync FAILED after ${s.full.wallMs.toFixed(0)}ms: ${s.error}`;
  const ch = median(s.changes.map((c) => c.wallMs));
  const raw = s.raw ? ` raw-full=${s.raw.fullApplyMs.toFixed(0)}ms${s.raw.oneServiceApplyMs !== undefined ? ` raw-one=${s.raw.oneServiceApplyMs.toFixed(0)}ms` : ''}` : '';
  const k = s.kernel ? ` kernel=${s.kernel.changesPresent ? 'ok' : 'MISSING'}` : '';
  return `N=${s.n} ${s.mode} rep=${s.rep}: render=${s.renderMs.toFixed(0)}ms full=${s.full.wallMs.toFixed(0)}ms change=${ch.toFixed(0)}ms rules=${s.full.rulesTotal}/${s.changes[0]?.rulesWritten ?? '-'}${raw}${k}`;
}

/** Compiles and JIT-warms each planner once, so the first size measured is not charged for it. */
function warmUp(modes: Variant[], endpoints: number): void {
  for (const v of modes) {
    const w = new Workload(50, endpoints, benchConfig(modeOf(v)));
    for (let i = 0; i < 3; i++) getMode(modeOf(v)).render(w.input());
  }
}

export async function runBench(o: BenchOptions): Promise<BenchResult> {
  if (process.getuid?.() !== 0) throw new BenchError('KPROXY_BENCH_ROOT: the benchmarks program kernel rules in network namespaces; run as root');
  const notes: string[] = [];
  const modes = runnableModes(o.modes, notes);
  for (const n of notes) o.log(`note: ${n}`);
  if (!modes.length) throw new BenchError('KPROXY_BENCH_NO_MODES: no mode left to measure; use --modes iptables,nftables');
  const nss = new Namespaces();
  const started = performance.now();
  const samples: Sample[] = [];
  const cleanupOnSignal = () => {
    void nss.deleteAll().finally(() => process.exit(130));
  };
  process.once('SIGINT', cleanupOnSignal);
  process.once('SIGTERM', cleanupOnSignal);
  let machine: Machine;
  try {
    machine = await describeMachine(nss);
    o.log(`machine: ${machine.kernel}, ${machine.cpus} cpus, load ${machine.loadBefore.join(' ')}, ${machine.iptables}, ${machine.nft}`);
    warmUp(modes, o.endpoints);
    let overBudget = false;
    /** variants whose first attempt at a size failed: not retried at it or any larger size */
    const failed = new Map<Variant, number>();
    for (const n of o.sizes) {
      for (let rep = 0; rep < o.repeat; rep++) {
        const minutes = (performance.now() - started) / 60_000;
        if (rep > 0 && minutes > o.maxMinutes) {
          if (!overBudget) notes.push(`time budget of ${o.maxMinutes} min exceeded at N=${n}: later sizes were measured once only`);
          overBudget = true;
          break;
        }
        // Interleaved: every mode at this size before the next repetition, so load drifts hit all alike.
        for (const m of modes) {
          if (failed.has(m)) continue;
          const s = await measure(m, getMode(modeOf(m)), nss, {
            n, endpoints: o.endpoints, rep, changes: o.changes, raw: o.raw, verify: o.verify && rep === 0, rawTimeoutMs: o.rawTimeoutS * 1000,
            execTimeoutMs: o.execTimeoutS ? o.execTimeoutS * 1000 : undefined,
          });
          samples.push(s);
          o.log(describeSample(s));
          if (s.kernel && !s.kernel.changesPresent) notes.push(`N=${n} ${m}: the one-service changes were NOT found in the kernel rules after the syncs`);
          if (s.error) {
            // A first attempt that fails (iptables-restore past its time limit) would fail again
            // at every larger size: stop there. A later repetition failing is load: keep going.
            if (rep === 0) failed.set(m, n);
            notes.push(`${m}: the first full sync at N=${n} (repetition ${rep + 1}) failed after ${(s.full.wallMs / 1000).toFixed(1)} s (${s.error})` +
              (rep === 0 ? '; not retried at this or larger sizes' : ''));
          }
        }
      }
    }
  } finally {
    await nss.deleteAll();
    process.off('SIGINT', cleanupOnSignal);
    process.off('SIGTERM', cleanupOnSignal);
  }
  machine.loadAfter = loadavg().map((l) => Math.round(l * 100) / 100);
  const totalSeconds = (performance.now() - started) / 1000;
  const summary = summarize(samples);
  const goals = modes.filter((m) => m === 'iptables' || m === 'iptables-legacy').flatMap((v) => iptablesGoals(summary, v));
  const header = [
    `Run ${machine.date}: ${o.sizes.join(', ')} services × ${o.endpoints} endpoints (ClusterIP + NodePort each), modes ${modes.join(', ')}, ` +
      `median of ${o.repeat} repetitions (${o.changes} one-service changes each), ${totalSeconds.toFixed(0)} s in total; ` +
      (o.execTimeoutS ? `executor time limits lifted to ${o.execTimeoutS} s.` : 'executors\' own time limits (iptables-restore 60 s, nft 30 s).'),
    `Machine: Linux ${machine.kernel}, ${machine.cpus} × ${machine.cpuModel}, ${machine.iptables}, ${machine.nft}, Node ${machine.node}; ` +
      `load average ${machine.loadBefore.join(' ')} before, ${machine.loadAfter.join(' ')} after; \`ip netns exec\` costs ${machine.netnsExecMs.toFixed(1)} ms per command.`,
  ];
  const markdown = [header.join('\n'), markdownTables(summary, modes), goalsTable(goals), notes.length ? `Notes:\n${notes.map((n) => `- ${n}`).join('\n')}` : '']
    .filter(Boolean)
    .join('\n\n');

  mkdirSync(o.outDir, { recursive: true });
  const stamp = machine.date.replace(/[:.]/g, '-');
  const jsonPath = join(o.outDir, `bench-${stamp}.json`);
  const { log: _log, ...options } = o;
  const result: BenchResult = { options, machine, samples, summary, goals, notes, totalSeconds, markdown, jsonPath };
  // JSON has no Infinity: a raw apply that hit its limit is written as "timeout".
  const json = JSON.stringify({ ...result, markdown: undefined }, (_k, v: unknown) => (v === Number.POSITIVE_INFINITY ? 'timeout' : v), 2);
  writeFileSync(jsonPath, json + '\n');
  writeFileSync(join(o.outDir, `bench-${stamp}.md`), markdown + '\n');
  if (o.svgPath) {
    mkdirSync(dirname(o.svgPath), { recursive: true });
    const sub = `${o.endpoints} endpoints/service; ${machine.cpus} cpus, load ${machine.loadBefore[0]}; Linux ${machine.kernel}; ${machine.iptables}`;
    writeFileSync(o.svgPath, oneServiceChangeSVG(summary, modes, sub));
  }
  return result;
}

function intList(flag: string, text: string): number[] {
  const xs = text.split(',').map((s) => s.trim()).filter(Boolean).map(Number);
  if (!xs.length || xs.some((x) => !Number.isInteger(x) || x < 1)) throw new BenchError(`KPROXY_BENCH_ARGS: ${flag} wants positive integers separated by commas, got ${JSON.stringify(text)}`);
  return xs;
}

function positive(flag: string, text: string): number {
  const v = Number(text);
  if (!Number.isFinite(v) || v <= 0) throw new BenchError(`KPROXY_BENCH_ARGS: ${flag} wants a positive number, got ${JSON.stringify(text)}`);
  return v;
}

export function parseBenchArgs(argv: string[], log: (l: string) => void = (l) => process.stderr.write(l + '\n')): BenchOptions {
  const { values } = parseArgs({
    args: argv,
    options: {
      sizes: { type: 'string', default: '100,1000,5000,10000' },
      endpoints: { type: 'string', default: '5' },
      modes: { type: 'string', default: 'iptables,nftables' },
      repeat: { type: 'string', default: '3' },
      changes: { type: 'string', default: '3' },
      out: { type: 'string', default: 'bench/out' },
      svg: { type: 'string', default: 'docs/bench-one-service-change.svg' },
      'no-svg': { type: 'boolean', default: false },
      'max-minutes': { type: 'string', default: '15' },
      'no-raw': { type: 'boolean', default: false },
      'raw-timeout': { type: 'string', default: '60' },
      'exec-timeout': { type: 'string', default: '0' },
      'no-verify': { type: 'boolean', default: false },
    },
    strict: true,
  });
  const modes = values.modes!.split(',').map((s) => s.trim()).filter(Boolean);
  for (const m of modes) {
    if (!(VARIANTS as readonly string[]).includes(m)) throw new BenchError(`KPROXY_BENCH_ARGS: unknown mode ${JSON.stringify(m)} (want some of ${VARIANTS.join(', ')})`);
  }
  return {
    sizes: intList('--sizes', values.sizes!),
    endpoints: intList('--endpoints', values.endpoints!)[0],
    modes: modes as Variant[],
    repeat: intList('--repeat', values.repeat!)[0],
    changes: intList('--changes', values.changes!)[0],
    outDir: resolve(values.out!),
    svgPath: values['no-svg'] ? null : resolve(values.svg!),
    maxMinutes: positive('--max-minutes', values['max-minutes']!),
    raw: !values['no-raw'],
    rawTimeoutS: positive('--raw-timeout', values['raw-timeout']!),
    execTimeoutS: values['exec-timeout'] === '0' ? 0 : positive('--exec-timeout', values['exec-timeout']!),
    verify: !values['no-verify'],
    log,
  };
}

/**
 * Tables, goals and plot again from the raw JSON of one or more earlier runs (their samples
 * pooled: e.g. a run with the executors' own limits plus one with lifted limits).
 */
export function reportFromFiles(paths: string[], svgPath: string | null): string {
  const runs = paths.map((p) => JSON.parse(readFileSync(p, 'utf8'), (_k, v: unknown) => (v === 'timeout' ? Number.POSITIVE_INFINITY : v)) as Omit<BenchResult, 'markdown'>);
  const samples = runs.flatMap((r) => r.samples);
  const modes = [...new Set(runs.flatMap((r) => r.options.modes))].filter((m) => samples.some((s) => s.mode === m));
  const summary = summarize(samples);
  const goals = modes.filter((m) => m === 'iptables' || m === 'iptables-legacy').flatMap((v) => iptablesGoals(summary, v));
  const header = runs.map((r, i) =>
    `Run ${i + 1} (${paths[i]}): ${r.machine.date}, sizes ${r.options.sizes.join(', ')}, modes ${r.options.modes.join(', ')}, ` +
    `${r.options.repeat} repetitions, ${r.totalSeconds.toFixed(0)} s, load ${r.machine.loadBefore.join(' ')} → ${r.machine.loadAfter.join(' ')}, ` +
    (r.options.execTimeoutS ? `executor limits lifted to ${r.options.execTimeoutS} s` : 'executors\' own limits') + '.');
  const notes = runs.flatMap((r) => r.notes);
  if (svgPath) {
    const m = runs[0].machine;
    writeFileSync(svgPath, oneServiceChangeSVG(summary, modes, `${runs[0].options.endpoints} endpoints/service; ${m.cpus} cpus (shared, load ≈ ${m.loadBefore[0]}); Linux ${m.kernel}; ${m.iptables}`));
  }
  return [header.join('\n'), markdownTables(summary, modes), goalsTable(goals), notes.length ? `Notes:\n${notes.map((n) => `- ${n}`).join('\n')}` : '']
    .filter(Boolean).join('\n\n');
}

async function main(): Promise<void> {
  const reportIdx = process.argv.indexOf('--report');
  if (reportIdx > 0) {
    // node --import tsx bench/run.ts --report a.json,b.json [--svg FILE]
    const svgIdx = process.argv.indexOf('--svg');
    const svg = svgIdx > 0 ? resolve(process.argv[svgIdx + 1]) : null;
    process.stdout.write(reportFromFiles(process.argv[reportIdx + 1].split(','), svg) + '\n');
    return;
  }
  const opts = parseBenchArgs(process.argv.slice(2));
  const r = await runBench(opts);
  process.stdout.write(r.markdown + '\n');
  process.stderr.write(`\nraw results: ${r.jsonPath}${opts.svgPath ? `\nplot: ${opts.svgPath}` : ''}\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e instanceof BenchError ? e.message : e.stack ?? e.message}\n`);
    process.exitCode = 1;
  });
}
