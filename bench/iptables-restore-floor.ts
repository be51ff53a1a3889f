// One job: kproxy's one-Service change in the iptables mode beside the kernel's per-commit
// floor on the same loaded state. Per variant (iptables with the nf_tables backend, and
// iptables-legacy) N Services × E endpoints are loaded into a network namespace of its own by
// kproxy's first full sync (the iptables mode's Proxier in process, as bench/cold.ts measures
// it); then each of R runs adds one endpoint to one Service and times, one after the other:
//   kproxy      the partial sync, Proxier.sync(input, {that Service}, false): planning, the
//               restore, every other command it runs
//   floor       the very restore that sync wrote (same lines, same binary and flags,
//               `iptables-restore -w 5 --noflush --counters`), replayed: the commit a
//               one-endpoint change has to make (the replay leaves the kernel as it was)
//   one chain   the smallest commit that changes one Service: one of that Service's KUBE-SEP
//               chains flushed and written again (its declaration and rules, from the same payload)
// and prints the medians and kproxy − floor: what kproxy adds to the commit the kernel makes
// it wait for (the nf_tables backend's --noflush restore reads the whole ruleset back first, so
// its floor grows with N; legacy's replaces the whole table).
//
//   sudo node --import tsx bench/iptables-restore-floor.ts [--quick] [--n 100000] [--runs 5]
//        [--variants iptables,iptables-legacy] [--endpoints 5] [--timeout 1800] [--json FILE]
//
// --quick: N = 1,000 unless --n says otherwise. Needs root; every namespace (kpb-*) it creates is
// removed, also on failure and Ctrl-C. Each command is bounded by --timeout (seconds).
import { writeFileSync } from 'node:fs';
import { loadavg } from 'node:os';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import type { RunOptions, RunResult } from '../src/kernel/runner.ts';
import { silentLogger } from '../src/log.ts';
import { getMode } from '../src/modes/registry.ts';
import type { Proxier } from '../src/modes/types.ts';
import { LOCK_RETRIES, xtablesLockBusy } from './cold.ts';
import { changedServiceIndexes, timedSync, type SyncSample } from './measure.ts';
import { isWrite, LEGACY_IPTABLES, Namespaces, TimedRunner } from './netns.ts';
import { fmtMs, median } from './stats.ts';
import { benchConfig, MAX_SERVICES, Workload } from './workload.ts';
import { inputText } from '../src/kernel/runner.ts';

export const FLOOR_VARIANTS = ['iptables', 'iptables-legacy'] as const;
export type FloorVariant = (typeof FLOOR_VARIANTS)[number];

/** A restore a sync ran: what to replay. */
export interface Restore {
  cmd: string;
  args: string[];
  input: string;
}

/** A TimedRunner that also keeps the payloads of the rule-writing commands since the last takeWrites(). */
class RecordingRunner extends TimedRunner {
  private writes: Restore[] = [];

  override async run(cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> {
    const r = await super.run(cmd, args, opts);
    const rec = this.records[this.records.length - 1];
    if (rec && isWrite(rec) && r.code === 0) this.writes.push({ cmd, args, input: inputText(opts?.input) });
    return r;
  }

  takeWrites(): Restore[] {
    const out = this.writes;
    this.writes = [];
    return out;
  }
}

/**
 * The smallest commit that changes one Service, out of a restore payload a partial sync wrote:
 * the KUBE-SEP chain with the fewest rules, declared (with --noflush, a declaration flushes the
 * chain) and written again. Undefined when the payload declares no KUBE-SEP chain.
 */
export function oneChainPayload(payload: string): { chain: string; payload: string; rules: number } | undefined {
  const lines = payload.slice(payload.indexOf('*nat')).split('\n');
  let best: { chain: string; rules: string[] } | undefined;
  for (const l of lines) {
    const m = /^:(KUBE-SEP-\S+) /.exec(l);
    if (!m) continue;
    const rules = lines.filter((r) => r.startsWith(`-A ${m[1]} `));
    if (rules.length && (!best || rules.length < best.rules.length)) best = { chain: m[1], rules };
  }
  if (!best) return undefined;
  return { chain: best.chain, payload: ['*nat', `:${best.chain} - [0:0]`, ...best.rules, 'COMMIT', ''].join('\n'), rules: best.rules.length };
}

export interface FloorRun {
  /** index of the Service that gained an endpoint */
  service: number;
  kproxy: SyncSample;
  /** the replay of the restore(s) kproxy's partial sync wrote, ms */
  floorMs: number;
  /** one KUBE-SEP chain of that Service flushed and written again, ms */
  oneChainMs: number;
  /** bytes kproxy's partial sync sent to iptables-restore */
  payloadBytes: number;
  restores: number;
}

export interface FloorResult {
  variant: FloorVariant;
  n: number;
  endpoints: number;
  /** the first full sync that loaded the state (kproxy's cold start, in process), ms */
  loadMs: number;
  runs: FloorRun[];
  kproxyMedianMs: number;
  floorMedianMs: number;
  oneChainMedianMs: number;
  /** median over the runs of (kproxy − floor) */
  overFloorMedianMs: number;
  /** kproxy's own work in a change (wall − every command it ran), median */
  inProcessMedianMs: number;
  /** time in the commands other than the restore (e.g. the canary check once per syncPeriod), median */
  otherExecMedianMs: number;
  load: number[];
  /** every endpoint the changes added is in the kernel's nat table (iptables-save -t nat) after the runs */
  changesPresent?: boolean;
  error?: string;
}

export interface FloorOptions {
  n: number;
  endpoints: number;
  runs: number;
  variants: FloorVariant[];
  timeoutMs: number;
  log: (line: string) => void;
}

async function replay(runner: TimedRunner, restores: Restore[], timeoutMs: number): Promise<number> {
  let ms = 0;
  for (const w of restores) {
    const t0 = performance.now();
    const r = await runner.run(w.cmd, w.args, { input: w.input, timeoutMs });
    ms += performance.now() - t0;
    if (r.code !== 0) throw new Error(`KPROXY_BENCH_FLOOR: replaying ${w.cmd} exited ${r.code}: ${r.stderr.trim().slice(0, 300)}`);
  }
  return ms;
}

/** Loads N Services through the Proxier's first full sync; retried while another program holds the xtables lock. */
async function load(variant: FloorVariant, nss: Namespaces, w: Workload, o: FloorOptions): Promise<{ ns: string; runner: RecordingRunner; proxier: Proxier; loadMs: number }> {
  const rename = variant === 'iptables-legacy' ? LEGACY_IPTABLES : {};
  for (let attempt = 0; ; attempt++) {
    const ns = await nss.create(variant === 'iptables-legacy' ? 'flleg' : 'flipt');
    const runner = new RecordingRunner(ns, rename, o.timeoutMs);
    const proxier = await getMode('iptables').createProxier({ config: w.config, log: silentLogger(), runner });
    try {
      const full = await timedSync(proxier, runner, w, w.serviceKeys, true);
      runner.takeWrites();
      return { ns, runner, proxier, loadMs: full.wallMs };
    } catch (e) {
      await proxier.stop();
      await nss.delete(ns);
      const msg = (e as Error).message;
      if (!xtablesLockBusy(msg) || attempt >= LOCK_RETRIES) throw e;
      o.log(`  ${variant}: the xtables lock was held by another program; loading again`);
      await new Promise((res) => setTimeout(res, 3000));
    }
  }
}

export async function floorVariant(variant: FloorVariant, nss: Namespaces, o: FloorOptions): Promise<FloorResult> {
  const w = new Workload(o.n, o.endpoints, benchConfig('iptables'));
  const base = { variant, n: o.n, endpoints: o.endpoints, load: loadavg().map((l) => Math.round(l * 100) / 100) };
  const empty = { runs: [], kproxyMedianMs: NaN, floorMedianMs: NaN, oneChainMedianMs: NaN, overFloorMedianMs: NaN, inProcessMedianMs: NaN, otherExecMedianMs: NaN };
  const t0 = performance.now();
  let loaded: Awaited<ReturnType<typeof load>>;
  try {
    loaded = await load(variant, nss, w, o);
  } catch (e) {
    return { ...base, ...empty, loadMs: performance.now() - t0, error: (e as Error).message.split('\n')[0].slice(0, 300) };
  }
  const { ns, runner, proxier, loadMs } = loaded;
  o.log(`  ${variant} N=${o.n}: loaded by kproxy's first full sync in ${fmtMs(loadMs)}`);
  try {
    const runs: FloorRun[] = [];
    const added: string[] = [];
    for (const i of changedServiceIndexes(o.n, o.runs, 0)) {
      const changed = w.addEndpoint(i);
      if (changed.size !== 1) throw new Error(`KPROXY_BENCH_WORKLOAD: one endpoint change reported ${changed.size} changed services`);
      added.push(w.newestEndpoint(i));
      runner.takeWrites();
      const kproxy = await timedSync(proxier, runner, w, changed, false);
      const restores = runner.takeWrites();
      if (!restores.length) throw new Error(`KPROXY_BENCH_FLOOR: the partial sync for service ${i} wrote nothing`);
      const one = oneChainPayload(restores.map((r) => r.input).join(''));
      if (!one) throw new Error(`KPROXY_BENCH_FLOOR: the partial sync for service ${i} declared no KUBE-SEP chain`);
      const floorMs = await replay(runner, restores, o.timeoutMs);
      const oneChainMs = await replay(runner, [{ ...restores[0], input: one.payload }], o.timeoutMs);
      runner.take();
      runs.push({ service: i, kproxy, floorMs, oneChainMs, payloadBytes: restores.reduce((s, r) => s + r.input.length, 0), restores: restores.length });
      o.log(`  ${variant} N=${o.n} service ${i}: kproxy ${fmtMs(kproxy.wallMs)} (restore ${fmtMs(kproxy.writeMs)}, other commands ${fmtMs(kproxy.otherExecMs)}, own ${fmtMs(kproxy.inProcessMs)}), floor ${fmtMs(floorMs)}, one chain ${fmtMs(oneChainMs)}`);
    }
    // a fast change that did not land is not a result: read the nat table back once
    const saved = await runner.run('iptables-save', ['-t', 'nat'], { timeoutMs: o.timeoutMs });
    if (saved.code !== 0) throw new Error(`KPROXY_BENCH_FLOOR: iptables-save exited ${saved.code}: ${saved.stderr.trim().slice(0, 300)}`);
    const changesPresent = added.every((ep) => saved.stdout.includes(`--to-destination ${ep}`));
    return {
      ...base, loadMs, runs, changesPresent,
      kproxyMedianMs: median(runs.map((r) => r.kproxy.wallMs)),
      floorMedianMs: median(runs.map((r) => r.floorMs)),
      oneChainMedianMs: median(runs.map((r) => r.oneChainMs)),
      overFloorMedianMs: median(runs.map((r) => r.kproxy.wallMs - r.floorMs)),
      inProcessMedianMs: median(runs.map((r) => r.kproxy.inProcessMs)),
      otherExecMedianMs: median(runs.map((r) => r.kproxy.otherExecMs)),
    };
  } catch (e) {
    return { ...base, ...empty, loadMs, error: (e as Error).message.split('\n')[0].slice(0, 300) };
  } finally {
    await proxier.stop();
    await nss.delete(ns);
  }
}

export async function runFloor(nss: Namespaces, o: FloorOptions): Promise<FloorResult[]> {
  const out: FloorResult[] = [];
  for (const v of o.variants) {
    o.log(`${v} N=${o.n}: ${o.runs} one-endpoint changes`);
    out.push(await floorVariant(v, nss, o));
  }
  return out;
}

export function table(rs: FloorResult[]): string {
  const rows = [
    '| variant | N | loaded by kproxy (first full sync) | kproxy one change | floor: its restore replayed | one chain | kproxy − floor | kproxy own work | other commands | load |',
    '|---|---|---|---|---|---|---|---|---|---|',
  ];
  for (const r of rs) {
    if (r.error) {
      rows.push(`| ${r.variant} | ${r.n.toLocaleString('en-US')} | ${fmtMs(r.loadMs)} | FAILED: ${r.error.replace(/\|/g, '\\|')} | | | | | | ${r.load[0]} |`);
      continue;
    }
    const missing = r.changesPresent === false ? ' (NOT in the kernel)' : '';
    rows.push(`| ${r.variant} | ${r.n.toLocaleString('en-US')} | ${fmtMs(r.loadMs)} | ${fmtMs(r.kproxyMedianMs)}${missing} | ${fmtMs(r.floorMedianMs)} | ${fmtMs(r.oneChainMedianMs)} | ${fmtMs(r.overFloorMedianMs)} | ${fmtMs(r.inProcessMedianMs)} | ${fmtMs(r.otherExecMedianMs)} | ${r.load[0]} |`);
  }
  return rows.join('\n');
}

export function parseFloorArgs(argv: string[]): FloorOptions & { json?: string } {
  const { values } = parseArgs({
    args: argv,
    strict: true,
    options: {
      quick: { type: 'boolean', default: false },
      n: { type: 'string' }, runs: { type: 'string', default: '5' }, endpoints: { type: 'string', default: '5' },
      variants: { type: 'string', default: FLOOR_VARIANTS.join(',') }, timeout: { type: 'string', default: '1800' }, json: { type: 'string' },
    },
  });
  const int = (flag: string, text: string, max: number) => {
    const x = Number(text);
    if (!Number.isInteger(x) || x < 1 || x > max) throw new Error(`KPROXY_BENCH_ARGS: ${flag} wants an integer 1..${max}, got ${JSON.stringify(text)}`);
    return x;
  };
  const variants = values.variants!.split(',').map((s) => s.trim()).filter(Boolean);
  for (const v of variants) if (!(FLOOR_VARIANTS as readonly string[]).includes(v)) throw new Error(`KPROXY_BENCH_ARGS: --variants wants some of ${FLOOR_VARIANTS.join(', ')}, got ${JSON.stringify(v)}`);
  return {
    n: int('--n', values.n ?? (values.quick ? '1000' : '100000'), MAX_SERVICES),
    runs: int('--runs', values.runs!, 1000),
    endpoints: int('--endpoints', values.endpoints!, 100),
    variants: variants as FloorVariant[],
    timeoutMs: int('--timeout', values.timeout!, 86_400) * 1000,
    log: (l) => process.stderr.write(l + '\n'),
    ...(values.json ? { json: values.json } : {}),
  };
}

async function main(): Promise<void> {
  const o = parseFloorArgs(process.argv.slice(2));
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: the bench programs iptables rules in network namespaces; run as root');
  const nss = new Namespaces();
  const onSignal = () => void nss.deleteAll().finally(() => process.exit(130));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  let rs: FloorResult[];
  try {
    rs = await runFloor(nss, o);
  } finally {
    await nss.deleteAll();
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
  }
  console.log(`\niptables one-Service change beside the per-commit floor: N = ${o.n.toLocaleString('en-US')} × ${o.endpoints} endpoints, medians of ${o.runs} runs\n`);
  console.log(table(rs));
  if (o.json) writeFileSync(o.json, JSON.stringify({ date: new Date().toISOString(), options: { ...o, log: undefined }, results: rs }, null, 2) + '\n');
  if (rs.some((r) => r.error || r.changesPresent === false)) process.exitCode = 1;
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
