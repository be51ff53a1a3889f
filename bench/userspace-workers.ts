// How the userspace data plane scales with userspace.workers, in ONE run, in one network
// namespace (`kpb-usw-…`, loopback 127.0.0.x inside it): kproxy with 1, 2, 3, 4 … workers
// (each its own `node bin/kproxy.js run --mode userspace` on its own VIP), and once more with
// the most workers and a node-wide maxConnections (the lease path of
// src/modes/userspace/dataplane/worker-cap.ts, to see what sharing the cap costs), next to the backend
// reached directly (the machine's ceiling). The variants are interleaved within a
// repetition; each figure is the median of --repeat runs of --duration seconds:
//   new conn/s                 wrk -t1 -c16 -H 'Connection: close' (each request a connection)
//   keep-alive req/s (c=32)    wrk -t1 -c32
// The 1-minute load average is read before every run and reported with the figures. On a
// shared machine the rates depend on the CPU share each variant wins, so the CPU time the
// variant's process tree used (utime + stime from /proc, every worker included) is measured
// too: requests per CPU-second is the cost figure the machine's load does not skew much.
//
//   sudo scripts/bench-install.sh     # nginx, wrk
//   sudo node --import tsx bench/userspace-workers.ts [--workers-list 1,2,3,4] [--duration 3]
//        [--repeat 3] [--cap 100000] [--json FILE] [--svg docs/bench-userspace-workers.svg]
//   node --import tsx bench/userspace-workers.ts --report FILE.json [--svg FILE]   # redraw
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, mkdirSync } from 'node:fs';
import { availableParallelism, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { Netns, repoRoot, uniqueName } from '../test/support/netns.ts';
import { BACKEND, HTTP_PORT, inNs, median, nginxBackendConf, parseWrk, processTree, waitListening } from './userspace.ts';

export interface WorkersRun {
  connPerSec: number;
  keepAliveRps: number;
  load1: number;
  /** requests per CPU-second of the proxy's process tree (NaN for direct) */
  connPerCpuSec?: number;
  keepAlivePerCpuSec?: number;
}
export interface WorkersVariant {
  key: string;
  name: string;
  /** 0: the backend reached directly */
  workers: number;
  maxConnections: number;
  runs: WorkersRun[];
  error?: string;
}
export interface WorkersReport {
  date: string;
  host: { cpus: number; node: string; kernel: string };
  durationS: number;
  repeat: number;
  loadBefore: string;
  loadAfter: string;
  variants: WorkersVariant[];
}

interface Target extends WorkersVariant {
  host: string;
  port: number;
  proc?: ChildProcess;
}

function manifest(vip: string): string {
  return `apiVersion: v1
kind: Service
metadata: {name: bench, namespace: bench}
spec:
  clusterIP: ${vip}
  ports: [{name: http, port: 80, targetPort: ${HTTP_PORT}, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: bench-1, namespace: bench, labels: {kubernetes.io/service-name: bench}}
addressType: IPv4
ports: [{name: http, port: ${HTTP_PORT}, protocol: TCP}]
endpoints: [{addresses: ["${BACKEND}"], conditions: {ready: true}}]
`;
}

async function startKproxy(ns: Netns, dir: string, t: Target, index: number): Promise<void> {
  const mdir = join(dir, `manifests-${t.key}`);
  mkdirSync(mdir, { recursive: true });
  writeFileSync(join(mdir, 'svc.yaml'), manifest(t.host));
  const cfg = join(dir, `config-${t.key}.yaml`);
  const cap = t.maxConnections > 0 ? `  maxConnections: ${t.maxConnections}\n` : '';
  writeFileSync(cfg, `apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n` +
    `metricsBindAddress: 127.0.0.1:${10300 + index}\nhealthzBindAddress: 127.0.0.1:${10400 + index}\nuserspace:\n  workers: ${t.workers}\n${cap}`);
  t.proc = ns.spawn(process.execPath, [resolve(repoRoot, 'bin/kproxy.js'), 'run', '--config', cfg, '--manifests', mdir, '--hostname-override', 'bench-node', '--log-level', 'warn'],
  { env: { KPROXY_USERSPACE_REDIRECT: '0' }, onOutput: (s) => process.stderr.write(`[${t.key}] ${s}`) });
  await waitListening(ns, t.host, 80, 60_000);
}

function load1(): number {
  return Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[0]);
}

const CLK_TCK = 100;

/** CPU seconds (user + system) used so far by a process and everything below it. */
function treeCpuSeconds(pid: number | undefined): number {
  if (!pid) return NaN;
  let ticks = 0;
  for (const p of processTree(pid)) {
    try {
      const stat = readFileSync(`/proc/${p}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(f[11]) + Number(f[12]);
    } catch {
      // gone
    }
  }
  return ticks / CLK_TCK;
}

/** wrk's total requests ("N requests in 3.00s"). */
function wrkRequests(out: string): number {
  return Number(/(\d+) requests in/.exec(out)?.[1] ?? NaN);
}

async function wrkWithCpu(ns: Netns, t: Target, args: string[], limit: number): Promise<{ rps: number; perCpuSec: number; errors: number }> {
  const c0 = treeCpuSeconds(t.proc?.pid);
  const out = await inNs(ns, 'wrk', args, limit);
  const cpu = treeCpuSeconds(t.proc?.pid) - c0;
  const r = parseWrk(out);
  return { rps: r.rps, perCpuSec: cpu > 0 ? wrkRequests(out) / cpu : NaN, errors: r.errors };
}

async function measure(ns: Netns, t: Target, durationS: number): Promise<WorkersRun> {
  const url = `http://${t.host}:${t.port}/`;
  const limit = (durationS + 30) * 1000;
  const load = load1();
  const close = await wrkWithCpu(ns, t, ['-t1', '-c16', `-d${durationS}s`, '-H', 'Connection: close', url], limit);
  const ka = await wrkWithCpu(ns, t, ['-t1', '-c32', `-d${durationS}s`, url], limit);
  if (close.errors + ka.errors > 0) process.stderr.write(`  ${t.key}: ${close.errors + ka.errors} socket errors / non-2xx\n`);
  return { connPerSec: close.rps, keepAliveRps: ka.rps, load1: load, connPerCpuSec: close.perCpuSec, keepAlivePerCpuSec: ka.perCpuSec };
}

const fmt = (v: number, d = 0) => (Number.isFinite(v) ? v.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d }) : 'n/a');

function medians(v: WorkersVariant): { conn: number; ka: number; load: number; connCpu: number; kaCpu: number } {
  const m = (f: (r: WorkersRun) => number | undefined) => median(v.runs.map((r) => f(r) ?? NaN));
  return { conn: m((r) => r.connPerSec), ka: m((r) => r.keepAliveRps), load: m((r) => r.load1), connCpu: m((r) => r.connPerCpuSec), kaCpu: m((r) => r.keepAlivePerCpuSec) };
}

export function workersMarkdown(r: WorkersReport): string {
  const one = r.variants.find((v) => v.workers === 1 && v.maxConnections === 0);
  const base = one ? medians(one) : null;
  const lines = [
    '| variant | new conn/s (Connection: close) | × 1 worker | conn / CPU-s | keep-alive req/s (c=32) | × 1 worker | req / CPU-s | runs | load (1 min, median) |',
    '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const v of r.variants) {
    const m = medians(v);
    const x = (a: number, b: number | undefined) => (b && v.workers > 0 && Number.isFinite(a / b) ? `${fmt(a / b, 2)}×` : '–');
    const cpu = (a: number) => (Number.isFinite(a) ? fmt(a) : '–');
    lines.push(`| ${v.name}${v.error ? ' (failed)' : ''} | ${fmt(m.conn)} | ${x(m.conn, base?.conn)} | ${cpu(m.connCpu)} | ${fmt(m.ka)} | ${x(m.ka, base?.ka)} | ${cpu(m.kaCpu)} | ${v.runs.length} | ${fmt(m.load, 2)} |`);
  }
  return lines.join('\n');
}

/** Bar panels (conn/s, keep-alive req/s, and each per CPU-second), one bar per variant. */
export function workersSvg(r: WorkersReport): string {
  const panels = [
    { title: 'new connections / s (Connection: close, c=16)', pick: (v: WorkersVariant) => medians(v).conn },
    { title: 'keep-alive requests / s (c=32)', pick: (v: WorkersVariant) => medians(v).ka },
    { title: 'new connections per CPU-second of kproxy (all its processes)', pick: (v: WorkersVariant) => medians(v).connCpu },
    { title: 'keep-alive requests per CPU-second of kproxy', pick: (v: WorkersVariant) => medians(v).kaCpu },
  ];
  const barH = 16;
  const panelH = 34 + r.variants.length * (barH + 4);
  const W = 760;
  const labelW = 260;
  const colors = ['#888888', '#4e79a7', '#59a14f', '#f28e2b', '#e15759', '#b07aa1', '#edc948', '#76b7b2'];
  const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;');
  const out = [`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${60 + panels.length * panelH}" font-family="sans-serif" font-size="12">`,
    '<rect width="100%" height="100%" fill="white"/>',
    `<text x="10" y="20" font-size="15" font-weight="bold">kproxy userspace workers on loopback, one namespace, medians of ${r.repeat} × ${r.durationS}s</text>`,
    `<text x="10" y="38" fill="#555">${esc(r.date)}, ${r.host.cpus} cores shared with wrk, the backend and other work (load ${esc(r.loadBefore)} → ${esc(r.loadAfter)})</text>`];
  panels.forEach((pn, i) => {
    const y0 = 60 + i * panelH;
    const vals = r.variants.map(pn.pick);
    const max = Math.max(1, ...vals.filter(Number.isFinite));
    out.push(`<text x="10" y="${y0 + 14}" font-weight="bold">${esc(pn.title)} <tspan fill="#777" font-weight="normal">higher is better</tspan></text>`);
    r.variants.forEach((v, j) => {
      const y = y0 + 24 + j * (barH + 4);
      const w = Number.isFinite(vals[j]) ? ((W - labelW - 90) * vals[j]) / max : 0;
      out.push(`<text x="${labelW - 6}" y="${y + 12}" text-anchor="end">${esc(v.name)}</text>`);
      out.push(`<rect x="${labelW}" y="${y}" width="${w.toFixed(1)}" height="${barH}" fill="${colors[j % colors.length]}"/>`);
      out.push(`<text x="${(labelW + w + 4).toFixed(1)}" y="${y + 12}">${fmt(vals[j])}</text>`);
    });
  });
  out.push('</svg>');
  return out.join('\n');
}

function targets(list: number[], cap: number): Target[] {
  const out: Target[] = [{ key: 'direct', name: 'direct, no proxy (ceiling)', workers: 0, maxConnections: 0, runs: [], host: BACKEND, port: HTTP_PORT }];
  list.forEach((n, i) => out.push({ key: `w${n}`, name: `kproxy, ${n} worker${n > 1 ? 's' : ''}`, workers: n, maxConnections: 0, runs: [], host: `127.0.0.${20 + i}`, port: 80 }));
  const most = Math.max(...list);
  if (cap > 0 && most > 1) {
    out.push({ key: `w${most}-cap`, name: `kproxy, ${most} workers, cap ${cap}`, workers: most, maxConnections: cap, runs: [], host: '127.0.0.40', port: 80 });
  }
  return out;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      'workers-list': { type: 'string', default: '1,2,3,4' },
      duration: { type: 'string', default: '3' },
      repeat: { type: 'string', default: '3' },
      cap: { type: 'string', default: '100000' },
      json: { type: 'string' },
      svg: { type: 'string' },
      report: { type: 'string' },
      'max-minutes': { type: 'string', default: '15' },
    },
  });
  if (values.report) {
    const r = JSON.parse(readFileSync(values.report, 'utf8')) as WorkersReport;
    console.log(workersMarkdown(r));
    if (values.svg) writeFileSync(values.svg, workersSvg(r));
    return;
  }
  const list = values['workers-list'].split(',').map(Number).filter((n) => Number.isInteger(n) && n >= 1 && n <= 64);
  const durationS = Number(values.duration);
  const repeat = Number(values.repeat);
  const deadline = Date.now() + Number(values['max-minutes']) * 60_000;
  const all = targets(list, Number(values.cap));
  const loadBefore = readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

  const dir = mkdtempSync(join(tmpdir(), 'kproxy-bench-usw-'));
  const ns = Netns.create(uniqueName('kpb-usw'));
  const cleanup = async () => {
    await ns.destroy();
    rmSync(dir, { recursive: true, force: true });
  };
  const onSignal = () => void cleanup().then(() => process.exit(130));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    writeFileSync(join(dir, 'nginx-backend.conf'), nginxBackendConf(dir));
    ns.spawn('nginx', ['-c', join(dir, 'nginx-backend.conf'), '-p', dir]);
    await waitListening(ns, BACKEND, HTTP_PORT);
    for (const [i, t] of all.entries()) {
      if (t.workers === 0) continue;
      try {
        await startKproxy(ns, dir, t, i);
      } catch (e) {
        t.error = (e as Error).message;
        process.stderr.write(`${t.key}: cannot start: ${t.error}\n`);
      }
    }
    const live = all.filter((t) => !t.error);
    // Warm-up (JIT, every worker forked and holding its listener), not measured.
    for (const t of live) await inNs(ns, 'wrk', ['-t1', '-c32', '-d2s', `http://${t.host}:${t.port}/`], 30_000).catch(() => '');
    for (let rep = 0; rep < repeat && Date.now() < deadline; rep++) {
      for (const t of live) {
        try {
          const f = await measure(ns, t, durationS);
          t.runs.push(f);
          process.stderr.write(`rep ${rep + 1} ${t.key}: ${JSON.stringify(f)}\n`);
        } catch (e) {
          process.stderr.write(`rep ${rep + 1} ${t.key}: ${(e as Error).message}\n`);
        }
      }
    }
  } finally {
    await cleanup();
  }
  const report: WorkersReport = {
    date: new Date().toISOString(),
    host: { cpus: availableParallelism(), node: process.version, kernel: readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim() },
    durationS, repeat, loadBefore, loadAfter: readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' '),
    variants: all.map(({ key, name, workers, maxConnections, runs, error }) => ({ key, name, workers, maxConnections, runs, error })),
  };
  if (values.json) writeFileSync(values.json, JSON.stringify(report, null, 2));
  if (values.svg) writeFileSync(values.svg, workersSvg(report));
  console.log(workersMarkdown(report));
}

if (process.argv[1]?.endsWith('bench/userspace-workers.ts')) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
