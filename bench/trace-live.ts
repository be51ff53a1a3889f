// One job: how long `kproxy trace --live` takes, end to end (the process started until it
// answers), at N NodePort Services × E endpoints, per kernel mode, beside the raw read of the
// same rules as the anchor: `iptables-save`, `iptables-legacy-save`, and for nftables `nft
// list table` of each kube-proxy table in turn (`nft list ruleset` reads the same rules but
// restarts the kernel's dump per message over the whole family: at 10,000 Services in 16
// tables it ran past 10 minutes on the 2-core bench host).
// Per variant it builds the state in a network namespace of its own (bench/workload.ts's
// Services, rendered by the mode, loaded with iptables-restore / nft -f: the rules kproxy
// would program; the namespace's loopback holds the node address 192.168.0.2), then times R runs of
// each, one after the other, and prints the medians. Every trace's answer is checked (the
// Service's endpoints and masquerade) so a fast wrong answer is not a result.
//
//   sudo node --import tsx bench/trace-live.ts [--quick] [--n 10000] [--runs 3] [--variants iptables-legacy,nftables]
//        [--baseline DIR] [--json FILE]
//
// --baseline DIR times a second kproxy (another checkout, its bundle built: `node
// scripts/build.mjs` there) in the same namespace, each run right after this one's trace, so
// that a change is measured against what it changes under the same load.
//
// kproxy runs as users run it: `node bin/kproxy.js`, which uses the esbuild bundle (dist/) when
// it is fresh; the bench builds the bundle first when it is not (scripts/build.mjs, what
// `npm ci` runs). IPVS is not here: the host kernel has no IPVS (bench/ipvs-in-vm.ts).
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { modes } from '../src/modes/registry.ts';
import { legacyShim } from './kproxy-run.ts';
import { LEGACY_IPTABLES, Namespaces } from './netns.ts';
import { median } from './stats.ts';
import { benchConfig, clusterIPOf, endpointIPOf, Workload } from './workload.ts';
import { ensureBundle } from './bundle.ts';

export const TRACE_VARIANTS = ['iptables', 'iptables-legacy', 'nftables'] as const;
export type TraceVariant = (typeof TRACE_VARIANTS)[number];

const repoRoot = resolve(import.meta.dirname, '..');
const ENDPOINTS = 5;
const NODE_IP = '192.168.0.2';
const CLIENT = '203.0.113.9';

export interface TraceLiveRow {
  variant: TraceVariant;
  n: number;
  /** the raw read of the rules (the anchor), ms per run */
  rawMs: number[];
  /** `kproxy trace --live`, ms per run */
  traceMs: number[];
  /** the --baseline kproxy's `trace --live`, ms per run, timed right after each of traceMs */
  baselineMs?: number[];
  baselineMedianMs?: number;
  rawMedianMs: number;
  traceMedianMs: number;
  /** lines of the raw read */
  rawLines: number;
}

function timed(cmd: string, args: string[], env?: NodeJS.ProcessEnv): { ms: number; stdout: string } {
  const t0 = performance.now();
  const r = spawnSync(cmd, args, { encoding: 'utf8', maxBuffer: 1 << 30, env: env ?? process.env, timeout: 600_000 });
  const ms = performance.now() - t0;
  if (r.status !== 0) throw new Error(`KPROXY_BENCH_TRACE: ${cmd} ${args.join(' ')} exited ${r.status}: ${(r.stderr || String(r.error ?? '')).slice(0, 400)}`);
  return { ms, stdout: r.stdout };
}

/** Loads the mode's rendered rules for the workload into the namespace. */
function load(ns: string, variant: TraceVariant, rendered: string): void {
  const [cmd, args] = variant === 'nftables' ? ['nft', ['-f', '-']] : [variant === 'iptables-legacy' ? LEGACY_IPTABLES['iptables-restore'] : 'iptables-restore', ['-w', '5']];
  const r = spawnSync('ip', ['netns', 'exec', ns, cmd, ...(args as string[])], { input: rendered, encoding: 'utf8', maxBuffer: 1 << 30, timeout: 600_000 });
  if (r.status !== 0) throw new Error(`KPROXY_BENCH_TRACE: loading ${variant} rules failed: ${(r.stderr || String(r.error ?? '')).slice(0, 400)}`);
}

/** The raw read of the variant's rules: one command, or for nftables one per table. */
function rawReads(variant: TraceVariant, tables: string[]): Array<[string, string[]]> {
  if (variant === 'nftables') return tables.map((t) => ['nft', ['list', 'table', 'ip', t]]);
  return [[variant === 'iptables-legacy' ? LEGACY_IPTABLES['iptables-save'] : 'iptables-save', []]];
}

function rawName(variant: TraceVariant): string {
  return variant === 'nftables' ? 'nft list table ip T, each table' : variant === 'iptables-legacy' ? 'iptables-legacy-save' : 'iptables-save';
}

/** The Service traced: the last one (its rules sit at the end of every list and in the last table). */
function expectation(n: number): { to: string; endpoints: string } {
  const i = n - 1;
  const stride = ENDPOINTS + 16;
  const eps = Array.from({ length: ENDPOINTS }, (_, k) => `${endpointIPOf(i * stride + k)}:8080`).sort();
  return { to: `${NODE_IP}:${30_000 + i}`, endpoints: eps.join(', ') };
}

export async function measureVariant(nss: Namespaces, variant: TraceVariant, n: number, runs: number, work: string, baseline?: string): Promise<TraceLiveRow> {
  const mode = variant === 'iptables-legacy' ? 'iptables' : variant;
  const w = new Workload(n, ENDPOINTS, benchConfig(mode));
  const rendered = modes[mode].render(w.input());
  const ns = await nss.create(`tr${variant === 'iptables-legacy' ? 'leg' : variant.slice(0, 3)}`);
  try {
    execFileSync('ip', ['netns', 'exec', ns, 'ip', 'addr', 'add', `${NODE_IP}/32`, 'dev', 'lo']);
    load(ns, variant, rendered);
    const env = variant === 'iptables-legacy' ? { ...process.env, PATH: `${legacyShim(work)}:${process.env.PATH}` } : process.env;
    // the tables the mode wrote (render's `add table` lines), for the raw nft read
    const tables = [...rendered.matchAll(/^add table ip (\S+)/gm)].map((m) => m[1]);
    const want = expectation(n);
    // the NodePort on the node's address: the longest path (KUBE-SERVICES, then KUBE-NODEPORTS; every table)
    const argsOf = (root: string) => ['netns', 'exec', ns, process.execPath, join(root, 'bin/kproxy.js'), 'trace', '--live', '--mode', mode, '--from', CLIENT, '--to', want.to, '--json'];
    const rawMs: number[] = [];
    const traceMs: number[] = [];
    const baselineMs: number[] = [];
    const check = (stdout: string, who: string) => {
      const got = JSON.parse(stdout) as { output: string; masq: boolean };
      if (got.output !== want.endpoints || got.masq !== true) {
        throw new Error(`KPROXY_BENCH_TRACE: ${variant} at ${n}: ${who} trace --live answered ${JSON.stringify(got.output)} masq ${got.masq}, want ${want.endpoints} masq true`);
      }
    };
    let rawLines = 0;
    for (let r = 0; r < runs; r++) {
      let ms = 0;
      rawLines = 0;
      for (const [cmd, args] of rawReads(variant, tables)) {
        const raw = timed('ip', ['netns', 'exec', ns, cmd, ...args], env);
        ms += raw.ms;
        rawLines += raw.stdout.split('\n').length - 1;
      }
      rawMs.push(ms);
      const t = timed('ip', argsOf(repoRoot), env);
      traceMs.push(t.ms);
      check(t.stdout, 'this');
      if (baseline) {
        const b = timed('ip', argsOf(baseline), env);
        baselineMs.push(b.ms);
        check(b.stdout, 'the baseline');
        if (b.stdout !== t.stdout) throw new Error(`KPROXY_BENCH_TRACE: ${variant} at ${n}: the baseline's trace differs:\n${b.stdout}\nthis one:\n${t.stdout}`);
      }
    }
    const row: TraceLiveRow = { variant, n, rawMs, traceMs, rawMedianMs: median(rawMs), traceMedianMs: median(traceMs), rawLines };
    return baseline ? { ...row, baselineMs, baselineMedianMs: median(baselineMs) } : row;
  } finally {
    await nss.delete(ns);
  }
}

function table(rows: TraceLiveRow[], runs: number): string {
  const s = (ms: number) => `${(ms / 1000).toFixed(2)} s`;
  const withBaseline = rows.some((r) => r.baselineMedianMs !== undefined);
  const out = [
    `\`kproxy trace --live\` (process start to answer; NodePort of the last Service, ${ENDPOINTS} endpoints each; median of ${runs} runs) beside the raw read of the same rules`,
    '',
    `| Services | mode | trace --live |${withBaseline ? ' baseline |' : ''} raw read | raw read command (lines) |`,
    `|---:|---|---:|${withBaseline ? '---:|' : ''}---:|---|`,
  ];
  for (const r of rows) {
    const b = withBaseline ? ` ${r.baselineMedianMs === undefined ? '-' : s(r.baselineMedianMs)} |` : '';
    out.push(`| ${r.n.toLocaleString('en-US')} | ${r.variant} | ${s(r.traceMedianMs)} |${b} ${s(r.rawMedianMs)} | \`${rawName(r.variant)}\` (${r.rawLines.toLocaleString('en-US')}) |`);
  }
  return out.join('\n') + '\n';
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      n: { type: 'string' },
      runs: { type: 'string' },
      variants: { type: 'string' },
      baseline: { type: 'string' },
      json: { type: 'string' },
    },
  });
  const sizes = (values.n ?? (values.quick ? '2000' : '10000')).split(',').map(Number);
  const runs = Number(values.runs ?? 3);
  const variants = (values.variants ?? TRACE_VARIANTS.join(',')).split(',') as TraceVariant[];
  for (const v of variants) if (!(TRACE_VARIANTS as readonly string[]).includes(v)) throw new Error(`KPROXY_BENCH_ARGS: unknown variant ${v}`);
  if (!(runs >= 3) || sizes.some((n) => !(n >= 1))) throw new Error('KPROXY_BENCH_ARGS: --runs wants 3 or more, --n positive sizes');
  const baseline = values.baseline === undefined ? undefined : resolve(values.baseline);
  if (baseline && !existsSync(join(baseline, 'dist/kproxy.js'))) throw new Error(`KPROXY_BENCH_ARGS: --baseline ${baseline} has no bundle (dist/kproxy.js): run node scripts/build.mjs there`);
  ensureBundle('trace-live');
  const nss = new Namespaces(`${process.pid}`);
  const work = mkdtempSync(join(tmpdir(), 'kpb-trace-'));
  const rows: TraceLiveRow[] = [];
  const stop = () => void nss.deleteAll().finally(() => process.exit(130));
  process.once('SIGINT', stop);
  try {
    for (const n of sizes) {
      for (const v of variants) {
        const row = await measureVariant(nss, v, n, runs, work, baseline);
        const base = row.baselineMs ? `, baseline ${row.baselineMs.map((x) => x.toFixed(0)).join(' ')} ms` : '';
        process.stderr.write(`trace-live: ${v} at ${n}: trace ${row.traceMs.map((x) => x.toFixed(0)).join(' ')} ms${base}, raw ${row.rawMs.map((x) => x.toFixed(0)).join(' ')} ms\n`);
        rows.push(row);
      }
    }
  } finally {
    await nss.deleteAll();
    rmSync(work, { recursive: true, force: true });
  }
  process.stdout.write(table(rows, runs));
  if (values.json) writeFileSync(values.json, JSON.stringify({ runs, rows }, null, 2) + '\n');
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
