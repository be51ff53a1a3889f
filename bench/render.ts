// One job: kproxy render at N beside a raw restore of its payload, same run; medians of --runs.
//
// The manifests directory holds N NodePort Services × E endpoints in one file (bench/kproxy-run.ts's
// writeManifests: bench/workload.ts's objects as a stream of JSON documents). Per mode, each run
// times `node bin/kproxy.js render --mode M --manifests DIR` as a child process, from the spawn
// until it exits with the payload fully written to a file (its peak RSS, VmHWM, from
// /usr/bin/time when it is installed, otherwise sampled from /proc every 20 ms), then restores
// that very file into a fresh network namespace: a flushing `iptables-restore` (nf_tables
// backend) for iptables, `nft -f` for nftables. The ratio render / raw is the figure.
//
//   sudo node --import tsx bench/render.ts [--quick] [--n 10000] [--endpoints 5] [--runs 3]
//        [--modes iptables,nftables] [--json FILE] [--keep DIR]
//
// --keep DIR keeps each mode's payload there (DIR/render-MODE-N.txt), for a byte comparison of
// render's output across versions. kproxy runs as users run it: bin/kproxy.js, which uses the
// esbuild bundle (dist/) when it is fresh; the bench builds the bundle first when it is not.
import { spawn } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { hash } from 'node:crypto';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { ExecError } from '../src/kernel/runner.ts';
import { LOCK_RETRIES, xtablesLockBusy } from './cold.ts';
import { writeManifests } from './kproxy-run.ts';
import { Namespaces, TimedRunner } from './netns.ts';
import { median } from './stats.ts';
import { ensureBundle } from './bundle.ts';

export const RENDER_MODES = ['iptables', 'nftables'] as const;
export type RenderMode = (typeof RENDER_MODES)[number];

const repoRoot = resolve(import.meta.dirname, '..');
const TIME = '/usr/bin/time';

export interface RenderRow {
  mode: RenderMode;
  n: number;
  endpoints: number;
  /** `kproxy render`, spawn → exit, ms per run */
  renderMs: number[];
  /** the raw restore of the payload into a fresh namespace, ms per run */
  rawMs: number[];
  /** peak RSS of the render process, KiB per run */
  hwmKiB: number[];
  renderMedianMs: number;
  rawMedianMs: number;
  hwmMedianKiB: number;
  /** renderMedianMs / rawMedianMs */
  ratio: number;
  payloadBytes: number;
  payloadLines: number;
  /** sha256 of the payload (base64): the same in every run, or the bench fails */
  payloadSha256: string;
  /** the load average when the mode's runs started */
  loadavg: number[];
}

export interface RenderResult {
  date: string;
  host: { node: string; cpus: number };
  command: string;
  entry: 'dist bundle' | 'tsx sources';
  options: { n: number; endpoints: number; runs: number; modes: RenderMode[] };
  rows: RenderRow[];
}

/** The process's VmHWM in KiB, or NaN once it is gone. */
function vmHwmKiB(pid: number): number {
  try {
    const m = /^VmHWM:\s+(\d+) kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) : NaN;
  } catch {
    return NaN;
  }
}

export function renderArgs(mode: RenderMode, dir: string, statePath: string): string[] {
  // the node and cluster of bench/workload.ts (NODE, benchConfig); a state file that does not
  // exist: the allocations come from the manifests alone, whatever the host keeps
  return [join(repoRoot, 'bin/kproxy.js'), 'render', '--mode', mode, '--manifests', dir, '--hostname-override', 'kpb-node',
    '--node-ip', '192.168.0.2', '--cluster-cidr', '10.0.0.0/8', '--manifests-state', statePath];
}

/** One `kproxy render` into outFile: wall ms from spawn to exit, and the peak RSS. */
async function timeRender(mode: RenderMode, dir: string, outFile: string, statePath: string): Promise<{ ms: number; hwmKiB: number }> {
  const useTime = existsSync(TIME);
  const hwmFile = `${outFile}.hwm`;
  const args = renderArgs(mode, dir, statePath);
  const [cmd, argv] = useTime ? [TIME, ['-f', '%M', '-o', hwmFile, process.execPath, ...args]] : [process.execPath, args];
  const out = openSync(outFile, 'w');
  const errChunks: Buffer[] = [];
  try {
    const t0 = performance.now();
    const p = spawn(cmd, argv, { stdio: ['ignore', out, 'pipe'], cwd: repoRoot });
    p.stderr!.on('data', (c: Buffer) => errChunks.push(c));
    let sampled = NaN;
    const sampler = useTime ? undefined : setInterval(() => {
      const v = vmHwmKiB(p.pid!);
      if (!Number.isNaN(v)) sampled = Number.isNaN(sampled) ? v : Math.max(sampled, v);
    }, 20);
    const code = await new Promise<number>((done, fail) => {
      p.once('error', fail);
      p.once('close', (c, sig) => done(c ?? (sig ? 128 : 1)));
    });
    const ms = performance.now() - t0;
    if (sampler) clearInterval(sampler);
    if (code !== 0) throw new Error(`KPROXY_BENCH_RENDER: kproxy render --mode ${mode} exited ${code}: ${Buffer.concat(errChunks).toString().slice(-400)}`);
    const hwmKiB = useTime ? Number(readFileSync(hwmFile, 'utf8').trim().split('\n').pop()) : sampled;
    return { ms, hwmKiB };
  } finally {
    closeSync(out);
  }
}

/** One raw restore of the payload into a fresh namespace (another program holding the xtables lock: measured again). */
async function rawRestore(nss: Namespaces, mode: RenderMode, payload: string, timeoutMs: number): Promise<number> {
  const [cmd, args] = mode === 'nftables' ? ['nft', ['-f', '-']] : ['iptables-restore', ['-w', '5']];
  for (let attempt = 0; ; attempt++) {
    const ns = await nss.create(`rnd${mode.slice(0, 3)}`);
    try {
      const runner = new TimedRunner(ns);
      const t0 = performance.now();
      const r = await runner.run(cmd, args, { input: payload, timeoutMs });
      const ms = performance.now() - t0;
      if (r.code === 0) return ms;
      if (!(xtablesLockBusy(r.stderr) && attempt < LOCK_RETRIES)) throw new Error(`KPROXY_BENCH_RENDER: ${cmd} of the ${mode} payload exited ${r.code}: ${r.stderr.slice(0, 400)}`);
    } catch (e) {
      if (e instanceof ExecError && e.code === 'KPROXY_EXEC_TIMEOUT') return Number.POSITIVE_INFINITY;
      throw e;
    } finally {
      await nss.delete(ns);
    }
    await new Promise((r) => setTimeout(r, 3000));
  }
}

export interface RenderBenchOptions {
  n: number;
  endpoints: number;
  runs: number;
  modes: RenderMode[];
  keep?: string;
  timeoutMs: number;
  log: (line: string) => void;
}

export async function renderBench(o: RenderBenchOptions): Promise<RenderRow[]> {
  const work = mkdtempSync(join(tmpdir(), 'kpb-render-'));
  const nss = new Namespaces(`r${process.pid}`);
  const rows: RenderRow[] = [];
  try {
    const dir = join(work, 'manifests');
    writeManifests(dir, o.n, o.endpoints, []);
    const statePath = join(work, 'no-state.json');
    for (const mode of o.modes) {
      const la = loadavg();
      const renderMs: number[] = [];
      const rawMs: number[] = [];
      const hwmKiB: number[] = [];
      let sha = '';
      let payload = '';
      for (let r = 0; r < o.runs; r++) {
        const outFile = join(work, `render-${mode}-${r}.txt`);
        const t = await timeRender(mode, dir, outFile, statePath);
        payload = readFileSync(outFile, 'utf8');
        const s = hash('sha256', payload, 'base64');
        if (sha && s !== sha) throw new Error(`KPROXY_BENCH_RENDER: render --mode ${mode} wrote a different payload in run ${r + 1}`);
        sha = s;
        const raw = await rawRestore(nss, mode, payload, o.timeoutMs);
        renderMs.push(t.ms);
        hwmKiB.push(t.hwmKiB);
        rawMs.push(raw);
        o.log(`  ${mode} N=${o.n} run ${r + 1}: render ${(t.ms / 1000).toFixed(2)} s (HWM ${(t.hwmKiB / 1024).toFixed(0)} MiB), raw ${(raw / 1000).toFixed(2)} s`);
        if (o.keep && r === 0) {
          mkdirSync(o.keep, { recursive: true });
          copyFileSync(outFile, join(o.keep, `render-${mode}-${o.n}.txt`));
        }
        rmSync(outFile, { force: true });
      }
      const renderMedianMs = median(renderMs);
      const rawMedianMs = median(rawMs);
      rows.push({
        mode, n: o.n, endpoints: o.endpoints, renderMs, rawMs, hwmKiB, renderMedianMs, rawMedianMs, hwmMedianKiB: median(hwmKiB),
        ratio: renderMedianMs / rawMedianMs, payloadBytes: Buffer.byteLength(payload), payloadLines: payload.split('\n').length - 1,
        payloadSha256: sha, loadavg: la,
      });
    }
  } finally {
    await nss.deleteAll();
    rmSync(work, { recursive: true, force: true });
  }
  return rows;
}

export function table(rows: RenderRow[]): string {
  const raw = (m: RenderMode) => (m === 'nftables' ? 'nft -f' : 'iptables-restore');
  const lines = [
    '| mode | N | kproxy render | raw restore | ratio | render HWM | payload | load avg |',
    '|---|---|---|---|---|---|---|---|',
  ];
  for (const r of rows) {
    lines.push(`| ${r.mode} | ${r.n.toLocaleString('en-US')} | ${(r.renderMedianMs / 1000).toFixed(2)} s | ${raw(r.mode)} ${(r.rawMedianMs / 1000).toFixed(2)} s | ${r.ratio.toFixed(2)}× | ${(r.hwmMedianKiB / 1024).toFixed(0)} MiB | ${r.payloadLines.toLocaleString('en-US')} lines, ${(r.payloadBytes / 1024 / 1024).toFixed(1)} MiB | ${r.loadavg.map((x) => x.toFixed(2)).join(' ')} |`);
  }
  return lines.join('\n');
}

export function parseRenderArgs(argv: string[]): RenderBenchOptions & { json?: string } {
  const { values } = parseArgs({
    args: argv,
    options: {
      quick: { type: 'boolean', default: false },
      n: { type: 'string' },
      endpoints: { type: 'string', default: '5' },
      runs: { type: 'string' },
      modes: { type: 'string', default: RENDER_MODES.join(',') },
      json: { type: 'string' },
      keep: { type: 'string' },
      'timeout-ms': { type: 'string', default: '600000' },
    },
  });
  const modes = values.modes!.split(',').map((s) => s.trim()).filter(Boolean);
  for (const m of modes) if (!(RENDER_MODES as readonly string[]).includes(m)) throw new Error(`KPROXY_BENCH_ARGS: unknown mode ${JSON.stringify(m)} (want some of ${RENDER_MODES.join(', ')})`);
  const int = (s: string, what: string) => {
    const v = Number(s);
    if (!Number.isInteger(v) || v < 1) throw new Error(`KPROXY_BENCH_ARGS: --${what} must be a positive integer, got ${JSON.stringify(s)}`);
    return v;
  };
  return {
    n: int(values.n ?? (values.quick ? '1000' : '10000'), 'n'),
    endpoints: int(values.endpoints!, 'endpoints'),
    runs: int(values.runs ?? (values.quick ? '1' : '3'), 'runs'),
    modes: modes as RenderMode[],
    json: values.json,
    keep: values.keep,
    timeoutMs: int(values['timeout-ms']!, 'timeout-ms'),
    log: (l) => process.stderr.write(`${l}\n`),
  };
}

async function main(): Promise<void> {
  const o = parseRenderArgs(process.argv.slice(2));
  const entry = ensureBundle('render');
  o.log(`render: N=${o.n} × ${o.endpoints} endpoints, ${o.runs} run(s) per mode, ${entry}`);
  const rows = await renderBench(o);
  console.log(table(rows));
  if (o.json) {
    const result: RenderResult = {
      date: new Date().toISOString(), host: { node: process.version, cpus: cpus().length },
      command: `node --import tsx bench/render.ts ${process.argv.slice(2).join(' ')}`, entry,
      options: { n: o.n, endpoints: o.endpoints, runs: o.runs, modes: o.modes }, rows,
    };
    mkdirSync(resolve(o.json, '..'), { recursive: true });
    writeFileSync(o.json, `${JSON.stringify(result, null, 2)}\n`);
  }
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
