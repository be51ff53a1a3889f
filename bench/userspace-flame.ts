// Where the userspace data plane's time goes: `perf record -g` on kproxy's process (node
// with --perf-basic-prof, so JavaScript frames have names) — and on nginx stream's, for the
// comparison — under bench/userspace.ts's loads, in the same kind of namespace (`kpb-usf-…`,
// loopback addresses 127.0.0.x, nginx http backend on 127.0.0.2:8080, 1 worker each):
//
//   conn        wrk -t1 -c16 -H 'Connection: close'   (a connection per request)
//   keepalive   wrk -t1 -c32
//   c1          wrk -t1 -c1 --latency                 (the p99 load)
//
// For each peer and load it writes DIR/userspace-flame[-PEER]-LOAD.svg (a flame graph,
// bench/userspace-flame-svg.ts) and, with --folded FDIR, FDIR/userspace-flame[-PEER]-LOAD.folded
// (folded stacks, root first: they open in speedscope, inferno or flamegraph.pl too; --render
// redraws one), and DIR/userspace-flame.json (the figures below); and prints per load the requests/s, the CPU the profiled
// process used (utime + stime from /proc, % of one core, and µs per request), and the share
// of samples per kind of code (kernel, JS, GC, node/V8, libuv, libc) and under a few kernel
// paths (syscalls, connect, accept, close, send, receive, epoll, softirq).
//
//   node --import tsx bench/userspace-flame.ts [--out docs/bench/full] [--duration 6]
//        [--loads conn,keepalive,c1] [--peers kproxy,nginx] [--freq 999] [--repeat 1] [--base DIR] [--folded FDIR]
//   (--repeat N: N interleaved runs per peer and load, the stacks summed, the figures medians;
//    --node-arg A (repeatable): another node option for kproxy, e.g. --node-arg=--trace-gc)
//   (--base DIR: also kproxy from another checkout, key kproxy-base, files userspace-flame-kproxy-base-LOAD.*)
//   node --import tsx bench/userspace-flame.ts --render FILE.folded [--title T]   # redraw one
//
// perf's sampling (cpu-clock at --freq Hz) costs the profiled process a few per cent; the
// requests/s printed here are under the profiler, for the CPU per request, not for ratios
// (those come from bench/userspace.ts).
import { execFile } from 'node:child_process';
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { Netns, uniqueName } from '../test/support/netns.ts';
import { BACKEND, HTTP_PORT, inNs, kproxyPeer, median, nginxBackendConf, parseWrk, peers, processTree, waitListening, type Peer } from './userspace.ts';
import { flameSvg, foldPerfScript, foldedText, inclusiveShare, parseFolded, perfMapResolver, selfShares, type Folded, type Kind, type Resolver } from './userspace-flame-svg.ts';

const LOADS: Record<string, { args: string[]; what: string }> = {
  conn: { args: ['-t1', '-c16', '-H', 'Connection: close'], what: "new connections (wrk -t1 -c16 -H 'Connection: close')" },
  keepalive: { args: ['-t1', '-c32'], what: 'keep-alive requests (wrk -t1 -c32)' },
  c1: { args: ['-t1', '-c1', '--latency'], what: 'one connection, latency (wrk -t1 -c1)' },
};

/** Kernel and runtime paths reported as inclusive shares (a sample counts once per row). */
const PATHS: [string, RegExp][] = [
  ['syscalls', /^(entry_SYSCALL_64|do_syscall_64)_\[k\]$/],
  ['epoll_wait', /^(do_epoll_wait|__x64_sys_epoll_wait|__x64_sys_epoll_pwait)_\[k\]$/],
  ['accept', /^(__sys_accept4|do_accept|__x64_sys_accept4)_\[k\]$/],
  ['connect', /^(__sys_connect|__x64_sys_connect)_\[k\]$/],
  ['socket()', /^(__sys_socket|__x64_sys_socket)_\[k\]$/],
  ['close', /^(__x64_sys_close|__fput|____fput|tcp_close)_\[k\]$/],
  ['send (write/writev)', /^(tcp_sendmsg|__x64_sys_write|__x64_sys_writev)_\[k\]$/],
  ['receive (read)', /^(tcp_recvmsg|__x64_sys_read)_\[k\]$/],
  ['softirq (loopback rx)', /^(__do_softirq|net_rx_action|do_softirq)_\[k\]$/],
  ['setsockopt/getpeername', /^(__sys_setsockopt|__x64_sys_setsockopt|__sys_getpeername|__x64_sys_getpeername)_\[k\]$/],
  ['JavaScript (any JS frame)', /^(JS|LazyCompile|Function|InterpretedFunction|Baseline|Maglev|Turbofan):/],
];

function run(cmd: string, args: string[], timeoutMs: number): Promise<string> {
  return new Promise((res, rej) => {
    execFile(cmd, args, { timeout: timeoutMs, maxBuffer: 512 << 20, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
      if (err) rej(new Error(`${cmd} ${args.slice(0, 6).join(' ')}: ${err.message} ${stderr.slice(0, 400)}`));
      else res(stdout);
    });
  });
}

/** utime + stime of the processes, in seconds. */
function cpuSeconds(pids: number[]): number {
  let ticks = 0;
  for (const pid of pids) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      ticks += Number(f[11]) + Number(f[12]);
    } catch {
      // gone
    }
  }
  return ticks / 100;
}

const pct = (x: number) => `${(x * 100).toFixed(1)}%`;

/** One profiled run of one load on one peer. */
interface Sample {
  folded: Folded;
  rps: number;
  cpuCore: number;
  loadAverage: number;
}

export interface LoadProfile {
  peer: string;
  load: string;
  /** medians over the repetitions */
  rps: number;
  cpuCore: number;
  cpuUsPerReq: number;
  /** CPU µs per request of each repetition */
  cpuUsPerReqRuns: number[];
  samples: number;
  self: Record<Kind, number>;
  paths: Record<string, number>;
  loadAverages: number[];
}

/** the perf maps of the node processes profiled (node leaves them behind; removed at the end) */
const perfMaps = new Set<string>();

async function profileLoad(ns: Netns, peer: Peer, load: string, durationS: number, freq: number, dir: string): Promise<Sample> {
  const pids = peer.procs.flatMap((p) => processTree(p.pid!));
  const url = `http://${peer.host}:${peer.httpPort}/`;
  const loadAverage = Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[0]);
  const wrk = inNs(ns, 'wrk', [...LOADS[load].args, `-d${durationS}s`, url], (durationS + 30) * 1000);
  await new Promise((r) => setTimeout(r, 500));
  const data = join(dir, `${peer.key}-${load}.perf.data`);
  // The CPU is the profiled process's while perf records (the middle of wrk's run), the
  // requests/s wrk's over its run: a steady load makes them one window's.
  const cpu0 = cpuSeconds(pids);
  const t0 = process.hrtime.bigint();
  await run('perf', ['record', '-F', String(freq), '-g', '-o', data, '-p', pids.join(','), '--', 'sleep', String(Math.max(1, durationS - 1.5))], (durationS + 30) * 1000);
  const cpuCore = (cpuSeconds(pids) - cpu0) / (Number(process.hrtime.bigint() - t0) / 1e9);
  const w = parseWrk(await wrk);
  const script = await run('perf', ['script', '-i', data], 300_000);
  rmSync(data, { force: true });
  // JIT frames named from node's perf map here, the entry written last winning (perfMapResolver).
  const jit = new Map<number, Resolver>();
  for (const pid of pids) {
    perfMaps.add(`/tmp/perf-${pid}.map`);
    try {
      jit.set(pid, perfMapResolver(readFileSync(`/tmp/perf-${pid}.map`, 'utf8')));
    } catch {
      // not a node process (nginx), or no map
    }
  }
  return { folded: foldPerfScript(script, peer.key, jit), rps: w.rps, cpuCore, loadAverage };
}

function merge(into: Folded, f: Folded): void {
  for (const [k, n] of f) into.set(k, (into.get(k) ?? 0) + n);
}

/** Writes the flame graph (and the folded stacks) of one peer and load over its repetitions. */
function report(peer: Peer, load: string, runs: Sample[], freq: number, out: string, foldedDir?: string): LoadProfile {
  const folded: Folded = new Map();
  for (const r of runs) merge(folded, r.folded);
  const us = runs.map((r) => (r.cpuCore * 1e6) / r.rps);
  const p: LoadProfile = {
    peer: peer.key, load, rps: median(runs.map((r) => r.rps)), cpuCore: median(runs.map((r) => r.cpuCore)),
    cpuUsPerReq: median(us), cpuUsPerReqRuns: us, samples: [...folded.values()].reduce((a, b) => a + b, 0),
    self: selfShares(folded), paths: {}, loadAverages: runs.map((r) => r.loadAverage),
  };
  for (const [k, re] of PATHS) p.paths[k] = inclusiveShare(folded, re);
  const name = peer.key === 'kproxy' ? `userspace-flame-${load}` : `userspace-flame-${peer.key}-${load}`;
  if (foldedDir) writeFileSync(join(foldedDir, `${name}.folded`), foldedText(folded));
  writeFileSync(join(out, `${name}.svg`), flameSvg(folded, `${peer.name}: ${LOADS[load].what}`,
    `perf record -F ${freq} -g, ${p.samples} samples over ${runs.length} run(s); medians: ${Math.round(p.rps).toLocaleString('en-US')} req/s under the profiler, ` +
    `${(p.cpuCore * 100).toFixed(0)}% of a core, ${p.cpuUsPerReq.toFixed(1)} µs CPU per request; load average ${median(p.loadAverages)}`));
  return p;
}

export function summary(ps: LoadProfile[]): string {
  const cols = ps.map((p) => `${p.peer} ${p.load}`);
  const lines = [`| | ${cols.join(' | ')} |`, `|---|${cols.map(() => '---:').join('|')}|`];
  const row = (name: string, f: (p: LoadProfile) => string) => lines.push(`| ${name} | ${ps.map(f).join(' | ')} |`);
  row('req/s (under perf, median)', (p) => Math.round(p.rps).toLocaleString('en-US'));
  row('CPU, % of one core (median)', (p) => pct(p.cpuCore));
  row('CPU µs per request (median)', (p) => p.cpuUsPerReq.toFixed(1));
  row('CPU µs per request (each run)', (p) => p.cpuUsPerReqRuns.map((x) => x.toFixed(0)).join(', '));
  row('samples', (p) => String(p.samples));
  for (const k of Object.keys(ps[0]?.self ?? {}) as Kind[]) row(`self: ${k}`, (p) => pct(p.self[k]));
  for (const [k] of PATHS) row(`under ${k}`, (p) => pct(p.paths[k]));
  row('load average (1 min)', (p) => p.loadAverages.join(', '));
  return lines.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      out: { type: 'string', default: 'docs/bench/full' },
      duration: { type: 'string', default: '6' },
      loads: { type: 'string', default: 'conn,keepalive,c1' },
      peers: { type: 'string', default: 'kproxy,nginx' },
      freq: { type: 'string', default: '999' },
      render: { type: 'string' },
      title: { type: 'string' },
      base: { type: 'string' },
      folded: { type: 'string' },
      repeat: { type: 'string', default: '1' },
      'node-arg': { type: 'string', multiple: true, default: [] },
    },
  });
  if (values.render) {
    const f: Folded = parseFolded(readFileSync(values.render, 'utf8'));
    const svgPath = values.render.replace(/\.folded$/, '') + '.svg';
    writeFileSync(svgPath, flameSvg(f, values.title ?? basename(values.render)));
    console.log(`${svgPath}\n${JSON.stringify(selfShares(f))}`);
    return;
  }
  const out = resolve(values.out);
  mkdirSync(out, { recursive: true });
  const foldedDir = values.folded ? resolve(values.folded) : undefined;
  if (foldedDir) mkdirSync(foldedDir, { recursive: true });
  const durationS = Number(values.duration);
  const freq = Number(values.freq);
  const loads = values.loads.split(',');
  for (const l of loads) if (!LOADS[l]) throw new Error(`unknown load ${l} (${Object.keys(LOADS).join(', ')})`);
  const wanted = values.peers.split(',');
  // kproxy as bench/userspace.ts runs it (raw handles, 1 process), with JS frame names for perf.
  const list: Peer[] = [
    kproxyPeer('kproxy userspace (1 worker, raw handles)', 'kproxy', '127.0.0.6', 0, { metrics: 10249, healthz: 10256 },
      ['--perf-basic-prof', '--interpreted-frames-native-stack', ...values['node-arg']], { KPROXY_USERSPACE_TCP: 'raw' }),
    ...peers(0).filter((p) => p.key === 'nginx'),
  ].filter((p) => wanted.includes(p.key));
  if (values.base) {
    list.push(kproxyPeer(`kproxy at ${values.base}`, 'kproxy-base', '127.0.0.9', 0, { metrics: 10279, healthz: 10286 },
      ['--perf-basic-prof', '--interpreted-frames-native-stack'], { KPROXY_USERSPACE_TCP: 'raw' }, resolve(values.base)));
  }
  for (const tool of ['nginx', 'wrk', 'perf']) await run('sh', ['-c', `command -v ${tool}`], 5000).catch(() => { throw new Error(`${tool} is not installed`); });

  const dir = mkdtempSync(join(tmpdir(), 'kproxy-flame-'));
  const ns = Netns.create(uniqueName('kpb-usf'));
  const cleanup = async () => {
    await ns.destroy();
    rmSync(dir, { recursive: true, force: true });
    for (const f of perfMaps) rmSync(f, { force: true });
  };
  const onSignal = () => void cleanup().then(() => process.exit(130));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const results: LoadProfile[] = [];
  try {
    writeFileSync(join(dir, 'nginx-backend.conf'), nginxBackendConf(dir));
    ns.spawn('nginx', ['-c', join(dir, 'nginx-backend.conf'), '-p', dir]);
    await waitListening(ns, BACKEND, HTTP_PORT);
    for (const p of list) {
      // bench/userspace.ts's peers listen on iperf3's port too; only HTTP is loaded here.
      await p.start(ns, dir);
      await inNs(ns, 'wrk', ['-t1', '-c32', '-d2s', `http://${p.host}:${p.httpPort}/`], 30_000);
    }
    // Repetitions interleaved: each load runs on every peer before its next repetition, each
    // repetition starting one peer further on.
    const repeat = Number(values.repeat);
    const runs = new Map<string, Sample[]>();
    for (let rep = 0; rep < repeat; rep++) {
      for (const load of loads) {
        const k = rep % list.length;
        for (const p of [...list.slice(k), ...list.slice(0, k)]) {
          const r = await profileLoad(ns, p, load, durationS, freq, dir);
          runs.set(`${p.key} ${load}`, [...(runs.get(`${p.key} ${load}`) ?? []), r]);
          process.stderr.write(`rep ${rep + 1} ${p.key} ${load}: ${Math.round(r.rps)} req/s, ${pct(r.cpuCore)} of a core, ${((r.cpuCore * 1e6) / r.rps).toFixed(1)} µs CPU per request\n`);
        }
      }
    }
    for (const load of loads) for (const p of list) results.push(report(p, load, runs.get(`${p.key} ${load}`) ?? [], freq, out, foldedDir));
  } finally {
    await cleanup();
  }
  console.log(summary(results));
  writeFileSync(join(out, 'userspace-flame.json'), JSON.stringify({ date: new Date().toISOString(), durationS, freq, repeat: Number(values.repeat), results }, null, 2) + '\n');
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('bench/userspace-flame.ts')) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
