// The net.Socket TCP path (src/modes/userspace/dataplane/tcp.ts) of this tree against the same path of a base
// tree (an older commit, e.g. main before a change), and the naive Node pipe, side by side in
// ONE run, in one fresh network namespace (`kpb-usab-…`, loopback addresses inside it):
//   naive      bench/userspace-naive-pipe.ts
//   base       BASE/bench/userspace-forwarder-main.ts (the base tree's TcpForwarder alone)
//   this       bench/userspace-forwarder-main.ts (this tree's TcpForwarder alone)
// each a plain process on its own 127.0.0.x:80 forwarding to one nginx backend (127.0.0.2:8080,
// `return 200`). Per proxy, before the loads: RSS and fds per idle spliced connection
// (--idle N connections held by bench/userspace-idle-client.ts, the deltas of the proxy's
// process tree / N, as bench/userspace.ts measures them: no forced GC), the median of
// --idle-repeat measurements. Then --repeat rounds, the
// proxies in turn (each round starting one proxy further on), of:
//   new conn/s        wrk -t1 -c16 -H 'Connection: close', and the proxy's CPU (user + system)
//                     per connection over that load, which a loaded machine moves less
//   p50 / p99 (c=1)   wrk -t1 -c1 --latency
//   keep-alive req/s  wrk -t1 -c32
// medians printed as a markdown table with the load average at the start and the end.
//
//   git archive COMMIT | tar -x -C BASE && ln -s "$PWD/node_modules" BASE/node_modules
//   sudo node --import tsx bench/userspace-net-ab.ts --base BASE [--duration 3] [--repeat 5] [--idle 5000] [--idle-repeat 3] [--json FILE]
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { loadavg, tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { Netns, repoRoot, uniqueName } from '../test/support/netns.ts';
import { BACKEND, HTTP_PORT, holdIdle, inNs, median, nginxBackendConf, parseWrk, processTree, waitListening } from './userspace.ts';

interface Proxy {
  key: string;
  name: string;
  host: string;
  file: string;
  proc?: ChildProcess;
  idle?: { connections: number; rssBytesPerConn: number; fdsPerConn: number };
  runs: { connPerSec: number; cpuUsPerConn: number; p50us: number; p99us: number; keepAliveRps: number }[];
}

async function measureIdle(ns: Netns, p: Proxy, n: number): Promise<Proxy['idle']> {
  const idle = await holdIdle(ns, p.key, p.host, 80, n, [p.proc!.pid!]);
  return { ...idle, rssBytesPerConn: Math.round(idle.rssBytesPerConn) };
}

/** Starts a proxy (the forwarder's 24 h idle timeout is kproxy's default: the sweep runs) and warms it with one short load. */
async function start(ns: Netns, p: Proxy): Promise<void> {
  p.proc = ns.spawn(process.execPath, ['--import', 'tsx', p.file, `${p.host}:80=${BACKEND}:${HTTP_PORT}`], {
    onOutput: (s) => !s.startsWith('listening') && process.stderr.write(`${p.key}: ${s}`),
  });
  await waitListening(ns, p.host, 80);
  await inNs(ns, 'wrk', ['-t1', '-c4', '-d1s', `http://${p.host}:80/`], 30_000);
}

/** CPU seconds (user + system) of a process tree, from /proc/PID/stat (clock ticks of 1/100 s). */
function cpuS(root: number): number {
  let ticks = 0;
  for (const pid of processTree(root)) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(f[11]) + Number(f[12]);
    } catch {
      /* gone */
    }
  }
  return ticks / 100;
}

async function round(ns: Netns, p: Proxy, d: number): Promise<void> {
  const url = `http://${p.host}:80/`;
  const t = (d + 30) * 1000;
  // The proxy's CPU per new connection moves less with the machine's load than the rate does.
  const cpu0 = cpuS(p.proc!.pid!);
  const closeOut = await inNs(ns, 'wrk', ['-t1', '-c16', `-d${d}s`, '-H', 'Connection: close', url], t);
  const cpu = cpuS(p.proc!.pid!) - cpu0;
  const close = parseWrk(closeOut);
  const requests = Number(/(\d+) requests in/.exec(closeOut)?.[1] ?? NaN);
  const lat = parseWrk(await inNs(ns, 'wrk', ['-t1', '-c1', `-d${d}s`, '--latency', url], t));
  const ka = parseWrk(await inNs(ns, 'wrk', ['-t1', '-c32', `-d${d}s`, url], t));
  for (const [what, r] of [['conn/s', close], ['c=1', lat], ['keep-alive', ka]] as const) {
    if (r.errors > 0) process.stderr.write(`  ${p.key} ${what}: ${r.errors} socket errors / non-2xx\n`);
  }
  p.runs.push({ connPerSec: close.rps, cpuUsPerConn: (cpu * 1e6) / requests, p50us: lat.p50us, p99us: lat.p99us, keepAliveRps: ka.rps });
}

const fmt = (x: number) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : '–');

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      base: { type: 'string' },
      duration: { type: 'string', default: '3' },
      repeat: { type: 'string', default: '5' },
      idle: { type: 'string', default: '5000' },
      'idle-repeat': { type: 'string', default: '3' },
      json: { type: 'string' },
    },
  });
  const d = Number(values.duration);
  const repeat = Number(values.repeat);
  const idleN = Number(values.idle);
  const idleRepeat = Number(values['idle-repeat']);
  const proxies: Proxy[] = [
    { key: 'naive', name: 'naive pipe', host: '127.0.0.3', file: resolve(repoRoot, 'bench/userspace-naive-pipe.ts'), runs: [] },
    ...(values.base ? [{ key: 'base', name: `TcpForwarder, base (${values.base})`, host: '127.0.0.4', file: resolve(values.base, 'bench/userspace-forwarder-main.ts'), runs: [] }] : []),
    { key: 'this', name: 'TcpForwarder, this tree', host: '127.0.0.5', file: resolve(repoRoot, 'bench/userspace-forwarder-main.ts'), runs: [] },
  ];
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-usab-'));
  const ns = Netns.create(uniqueName('kpb-usab'));
  const onSignal = () => void ns.destroy().then(() => process.exit(130));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const loadStart = loadavg()[0];
  const started = new Date().toISOString();
  try {
    writeFileSync(join(dir, 'nginx-backend.conf'), nginxBackendConf(dir));
    ns.spawn('nginx', ['-c', join(dir, 'nginx-backend.conf'), '-p', dir]);
    await waitListening(ns, BACKEND, HTTP_PORT);
    // Idle memory without a forced GC moves with what the process freed and kept before:
    // each measurement on freshly started proxies (warmed by one short load), --idle-repeat
    // of them interleaved, and their median.
    const idleRuns = new Map<string, NonNullable<Proxy['idle']>[]>();
    for (let r = 0; idleN > 0 && r < idleRepeat; r++) {
      for (const p of proxies) {
        await start(ns, p);
        const one = (await measureIdle(ns, p, idleN))!;
        await ns.kill(p.proc!, 'SIGKILL');
        idleRuns.set(p.key, [...(idleRuns.get(p.key) ?? []), one]);
        process.stderr.write(`idle ${r + 1} ${p.key}: ${JSON.stringify(one)} load ${loadavg()[0].toFixed(2)}\n`);
      }
    }
    for (const p of proxies) {
      const runs = idleRuns.get(p.key);
      if (runs) p.idle = { connections: median(runs.map((x) => x.connections)), rssBytesPerConn: median(runs.map((x) => x.rssBytesPerConn)), fdsPerConn: median(runs.map((x) => x.fdsPerConn)) };
    }
    for (const p of proxies) await start(ns, p);
    for (let r = 0; r < repeat; r++) {
      for (let i = 0; i < proxies.length; i++) {
        const p = proxies[(i + r) % proxies.length];
        await round(ns, p, d);
        process.stderr.write(`round ${r + 1} ${p.key}: ${JSON.stringify(p.runs.at(-1))} load ${loadavg()[0].toFixed(2)}\n`);
      }
    }
  } finally {
    await ns.destroy();
    rmSync(dir, { recursive: true, force: true });
  }
  const loadEnd = loadavg()[0];
  const m = (p: Proxy, k: keyof Proxy['runs'][0]) => median(p.runs.map((x) => x[k]));
  const lines = [
    `${started}, ${repeat} rounds of ${d} s, medians; load average (1 min) ${loadStart.toFixed(2)} at the start, ${loadEnd.toFixed(2)} at the end`,
    '',
    '| proxy | new conn/s (c=16, Connection: close) | proxy CPU µs per new conn | p50 µs (c=1) | p99 µs (c=1) | keep-alive req/s (c=32) | idle conn: RSS bytes / fds each |',
    '|---|---:|---:|---:|---:|---:|---:|',
    ...proxies.map((p) => `| ${p.name} | ${fmt(m(p, 'connPerSec'))} | ${fmt(m(p, 'cpuUsPerConn'))} | ${fmt(m(p, 'p50us'))} | ${fmt(m(p, 'p99us'))} | ${fmt(m(p, 'keepAliveRps'))} | ${p.idle ? `${fmt(p.idle.rssBytesPerConn)} B / ${p.idle.fdsPerConn.toFixed(2)}` : '–'} |`),
  ];
  process.stdout.write(lines.join('\n') + '\n');
  if (values.json) writeFileSync(values.json, JSON.stringify({ started, loadStart, loadEnd, duration: d, repeat, proxies: proxies.map(({ proc: _p, ...rest }) => rest) }, null, 2));
}

await main();
