// `kproxy run --mode nftables` in a namespace under a stream of endpoint changes, with the
// syncs' own durations beside the latency, and an optional mixed stream (every second change
// also removes the oldest endpoint of another Service: retired chains), which
// bench/kproxy-run.ts's stream (additions only) does not exercise.
//
//   sudo node --import tsx bench/nft-stream.ts [--services 10000] [--seconds 30] [--rate 10] [--mixed] [--pollers 3] [--mode nftables|iptables]
//
// Latency = slice file renamed into place → the new endpoint's chain present in the kernel,
// polled by `--pollers` workers with bench/kproxy-run.ts's endpointCheck (one netlink
// GETCHAIN for nftables). Prints p50 / p99 overall and for each half of the stream (a proxy
// that falls behind shows a larger second half), the syncs logged during the stream and their
// durations, and the load average. Bounded: the stream, then at most 60 s to drain.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { endpointCheck, hotServices, killGroup, writeManifests } from './kproxy-run.ts';
import { Namespaces, TimedRunner } from './netns.ts';
import { percentile, pollUntil, sleep } from './stats.ts';
import { endpointIPOf, serviceName, sliceObject } from './workload.ts';

const ENDPOINTS = 5;
/** kproxy-run.ts's slice stride (endpoints + room for 16 more) */
const STRIDE = ENDPOINTS + 16;
const repoRoot = resolve(import.meta.dirname, '..');

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      services: { type: 'string', default: '10000' },
      seconds: { type: 'string', default: '30' },
      rate: { type: 'string', default: '10' },
      mixed: { type: 'boolean', default: false },
      pollers: { type: 'string', default: '3' },
      mode: { type: 'string', default: 'nftables' },
    },
  });
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (kproxy runs in a kpb-* namespace)');
  const n = Number(values.services);
  const seconds = Number(values.seconds);
  const rate = Number(values.rate);
  const pollers = Number(values.pollers);
  const mode = values.mode as 'nftables' | 'iptables';
  const dir = join(os.tmpdir(), `kpb-nft-stream-${process.pid}`);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const hot = hotServices(n);
  writeManifests(dir, n, ENDPOINTS, hot);
  const nss = new Namespaces(`${process.pid}s`);
  let proc: ChildProcess | undefined;
  const loadStart = os.loadavg().map((x) => x.toFixed(1)).join(' ');
  try {
    const ns = await nss.create('stream');
    const runner = new TimedRunner(ns);
    const syncs: { ms: number; full: boolean }[] = [];
    proc = spawn('ip', ['netns', 'exec', ns, process.execPath, join(repoRoot, 'bin/kproxy.js'), 'run', '--mode', mode, '--manifests', dir,
      '--hostname-override', 'kpb-node', '--cluster-cidr', '10.0.0.0/8', '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
    { stdio: ['ignore', 'pipe', 'ignore'], detached: true, env: { ...process.env, KPROXY_LOG_LEVEL: 'info' } });
    let tail = '';
    proc.stdout!.on('data', (d: Buffer) => {
      const lines = (tail + d.toString()).split('\n');
      tail = lines.pop() ?? '';
      for (const l of lines) {
        try {
          const j = JSON.parse(l) as { msg?: string; durationMs?: number; full?: boolean };
          if (j.msg === 'synced') syncs.push({ ms: j.durationMs ?? NaN, full: !!j.full });
        } catch {
          /* not a log line */
        }
      }
    });
    const t0 = performance.now();
    if (!(await pollUntil(async () => (syncs.some((s) => s.full) ? true : undefined), 300_000, 50))) throw new Error('KPROXY_BENCH_RUN: no first sync within 300 s');
    process.stderr.write(`N=${n}: first sync after ${((performance.now() - t0) / 1000).toFixed(1)} s\n`);
    await sleep(3000);

    const hi = new Map(hot.map((i) => [i, ENDPOINTS]));
    const lo = new Map(hot.map((i) => [i, 0]));
    const writeSlice = (i: number): number => {
      const slice = sliceObject(i, hi.get(i)!, STRIDE);
      slice.endpoints = (slice.endpoints ?? []).slice(lo.get(i)!);
      const tmp = join(dir, `.tmp-${serviceName(i)}`);
      writeFileSync(tmp, `---\n${JSON.stringify(slice)}\n`);
      const at = performance.now();
      renameSync(tmp, join(dir, `hot-${serviceName(i)}.yaml`));
      return at;
    };
    let next = 0;
    const change = (k: number): { i: number; ep: string; at: number } => {
      if (values.mixed && k % 2 === 1) {
        const j = hot[(next + Math.floor(hot.length / 2)) % hot.length];
        if (hi.get(j)! - lo.get(j)! > 1) {
          lo.set(j, lo.get(j)! + 1);
          writeSlice(j);
        }
      }
      const i = hot[next++ % hot.length];
      if (hi.get(i)! >= STRIDE) throw new Error('KPROXY_BENCH_RUN: a hot service ran out of endpoint addresses; a shorter stream');
      hi.set(i, hi.get(i)! + 1);
      return { i, ep: `${endpointIPOf(i * STRIDE + hi.get(i)! - 1)}:8080`, at: writeSlice(i) };
    };
    const total = Math.round(rate * seconds);
    const pending: { i: number; ep: string; at: number }[] = [];
    const seen: [number, number][] = [];
    let writing = true;
    const syncsBefore = syncs.length;
    const start = performance.now();
    const writer = (async () => {
      for (let k = 0; k < total; k++) {
        const wait = start + (k * 1000) / rate - performance.now();
        if (wait > 0) await sleep(wait);
        pending.push(change(k));
      }
      writing = false;
    })();
    const deadline = start + seconds * 1000 + 60_000;
    const worker = async () => {
      while (performance.now() < deadline && (writing || pending.length)) {
        const c = pending.shift();
        if (!c) {
          await sleep(5);
          continue;
        }
        const chk = endpointCheck(mode, c.i, c.ep);
        const r = await runner.run(chk.cmd, chk.args, { timeoutMs: 30_000 });
        if (r.code === 0) seen.push([c.at, performance.now() - c.at]);
        else pending.push(c);
      }
    };
    await Promise.all([writer, ...Array.from({ length: pollers }, worker)]);
    seen.sort((a, b) => a[0] - b[0]);
    const lat = seen.map((x) => x[1]);
    const f = (xs: number[]) => (xs.length ? `p50 ${(percentile(xs, 50) / 1000).toFixed(2)} s / p99 ${(percentile(xs, 99) / 1000).toFixed(2)} s` : '–');
    const during = syncs.slice(syncsBefore).map((s) => s.ms);
    const half = Math.floor(lat.length / 2);
    process.stdout.write(
      `nft-stream, ${new Date().toISOString()}, ${os.cpus().length} CPUs, load average at start ${loadStart}, at end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}\n` +
        `mode ${mode}, ${n} Services × ${ENDPOINTS}, ${rate}/s × ${seconds} s${values.mixed ? ', mixed (every second change also removes an endpoint)' : ''}, ${pollers} pollers\n` +
        `latency ${f(lat)} (${lat.length}/${total} seen); first half ${f(lat.slice(0, half))}, second half ${f(lat.slice(half))}\n` +
        `syncs during the stream: ${during.length}, duration p50 ${percentile(during, 50).toFixed(0)} ms, max ${Math.max(...during).toFixed(0)} ms: ${during.map((x) => x.toFixed(0)).join(' ')}\n`,
    );
  } finally {
    if (proc) await killGroup(proc);
    await nss.deleteAll();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((e: Error) => {
  process.stderr.write(`${e.message}\n`);
  process.exitCode = 1;
});
