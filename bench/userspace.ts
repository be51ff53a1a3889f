// The userspace data plane next to the proxies it is compared with, in ONE run, in one
// network namespace (`kpb-us-…`, loopback addresses 127.0.0.x inside it):
//
//   direct          wrk / iperf3 straight to the backend
//   naive pipe      bench/userspace-naive-pipe.ts (20 lines of node:net pipe())
//   nginx stream    nginx, stream module, worker_processes 1
//   haproxy         haproxy, mode tcp, nbthread 1
//   kproxy          `node bin/kproxy.js run --mode userspace --manifests DIR`, 1 worker on raw
//                   libuv handles (KPROXY_USERSPACE_TCP=raw; src/modes/userspace/dataplane/tcp-raw.ts, the default)
//   kproxy-net      the same on net.Socket (KPROXY_USERSPACE_TCP=net; src/modes/userspace/dataplane/tcp.ts)
//   kproxy ×N       with `userspace.workers: N` (the default path)
//
// Backends: nginx (http, `return 200`, 1 worker) on 127.0.0.2:8080 and `iperf3 -s` on
// 127.0.0.2:5201. Figures, each a median of --repeat runs of --duration seconds, the peers
// interleaved within a repetition (each repetition starting one proxy further on), the load
// average recorded beside them:
//   1-stream throughput MB/s   iperf3 -c HOST -p 5201 -t D -J (received bytes / s)
//   new conn/s                 wrk -t1 -c16 -H 'Connection: close' (each request a connection)
//   p50 / p99 at c=1 (µs)      wrk -t1 -c1 --latency (keep-alive)
//   keep-alive req/s (c=32)    wrk -t1 -c32
// and once per proxy, before the loads: memory and fds per idle connection (--idle N
// connections held open, RSS and fd deltas of the proxy's process tree / N).
//
//   sudo scripts/setup-system.sh           # nginx + stream module, haproxy, iperf3, wrk
//   sudo node --import tsx bench/userspace.ts [--duration 3] [--repeat 3] [--workers 2]
//        [--idle 5000] [--only direct,naive,...] [--json FILE] [--svg docs/bench/userspace.svg]
//        [--base DIR]   # also kproxy from another checkout DIR (key kproxy-base), e.g. a
//                       # `git archive REV | tar -x -C DIR` with node_modules linked: before/after in one run
//   node --import tsx bench/userspace.ts --report FILE.json [--svg FILE]   # redraw from a run
// Where each proxy's CPU goes under these loads (perf flame graphs): bench/userspace-flame.ts.
import { execFile, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { Netns, repoRoot, uniqueName } from '../test/support/netns.ts';

export interface Figures {
  throughputMBs: number;
  connPerSec: number;
  p50us: number;
  p99us: number;
  keepAliveRps: number;
}
export interface IdleFigures {
  connections: number;
  rssBytesPerConn: number;
  fdsPerConn: number;
}
export interface PeerResult {
  key: string;
  name: string;
  runs: Figures[];
  median: Figures;
  idle?: IdleFigures;
  error?: string;
}
export interface BenchReport {
  date: string;
  host: { cpus: number; node: string; kernel: string };
  durationS: number;
  repeat: number;
  workers: number;
  peers: PeerResult[];
  /** 1-minute load average at the start of each proxy's measurement */
  loadAverages?: number[];
}

export const BACKEND = '127.0.0.2';
export const HTTP_PORT = 8080;
const IPERF_PORT = 5201;

export interface Peer {
  name: string;
  key: string;
  host: string;
  httpPort: number;
  iperfPort: number;
  procs: ChildProcess[];
  start(ns: Netns, dir: string): Promise<void>;
}

function run(cmd: string, args: string[], timeoutMs: number): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    execFile(cmd, args, { timeout: timeoutMs, maxBuffer: 16 << 20, killSignal: 'SIGKILL' }, (err, stdout, stderr) => {
      if (err) reject(new Error(`${cmd} ${args.slice(0, 6).join(' ')}: ${err.message} ${stderr.slice(0, 400)}`));
      else resolvePromise(stdout);
    });
  });
}

export function inNs(ns: Netns, cmd: string, args: string[], timeoutMs: number): Promise<string> {
  return run('ip', ['netns', 'exec', ns.name, cmd, ...args], timeoutMs);
}

/** Resolves once host:port accepts a connection inside the namespace (the bench process joins it). */
export async function waitListening(ns: Netns, host: string, port: number, timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (let i = 0; i < 1000 && Date.now() < deadline; i++) {
    try {
      await inNs(ns, 'bash', ['-c', `exec 3<>/dev/tcp/${host}/${port}`], 3000);
      return;
    } catch {
      await new Promise((r) => setTimeout(r, 200));
    }
  }
  throw new Error(`${host}:${port} did not start listening within ${timeoutMs}ms`);
}

// ---- output parsers (exported for test/bench) ----

/** "28.00us" / "1.20ms" / "2.00s" → µs */
export function wrkTimeUs(v: string): number {
  const m = /^([\d.]+)(us|ms|s|m)$/.exec(v.trim());
  if (!m) return NaN;
  const n = Number(m[1]);
  return m[2] === 'us' ? n : m[2] === 'ms' ? n * 1e3 : m[2] === 's' ? n * 1e6 : n * 60e6;
}

export function parseWrk(out: string): { rps: number; p50us: number; p99us: number; errors: number } {
  const rps = Number(/Requests\/sec:\s+([\d.]+)/.exec(out)?.[1] ?? NaN);
  const p50 = /^\s+50%\s+(\S+)/m.exec(out)?.[1];
  const p99 = /^\s+99%\s+(\S+)/m.exec(out)?.[1];
  const err = /Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/.exec(out);
  const non2xx = Number(/Non-2xx or 3xx responses: (\d+)/.exec(out)?.[1] ?? 0);
  const errors = (err ? Number(err[1]) + Number(err[3]) + Number(err[4]) : 0) + non2xx;
  return { rps, p50us: p50 ? wrkTimeUs(p50) : NaN, p99us: p99 ? wrkTimeUs(p99) : NaN, errors };
}

export function parseIperfMBs(json: string): number {
  const j = JSON.parse(json) as { end?: { sum_received?: { bytes: number; seconds: number } }; error?: string };
  if (j.error) throw new Error(`iperf3: ${j.error}`);
  const s = j.end?.sum_received;
  if (!s || !s.seconds) throw new Error('iperf3: no sum_received');
  return s.bytes / s.seconds / 1e6;
}

export function median(xs: number[]): number {
  const s = xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b);
  if (s.length === 0) return NaN;
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

export function medianFigures(runs: Figures[]): Figures {
  const pick = (k: keyof Figures) => median(runs.map((r) => r[k]));
  return { throughputMBs: pick('throughputMBs'), connPerSec: pick('connPerSec'), p50us: pick('p50us'), p99us: pick('p99us'), keepAliveRps: pick('keepAliveRps') };
}

// ---- process trees, RSS and fds ----

function childrenOf(): Map<number, number[]> {
  const kids = new Map<number, number[]>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      const list = kids.get(ppid) ?? [];
      list.push(Number(d));
      kids.set(ppid, list);
    } catch {
      // gone
    }
  }
  return kids;
}

export function processTree(root: number): number[] {
  const kids = childrenOf();
  const out: number[] = [];
  const stack = [root];
  while (stack.length && out.length < 10_000) {
    const p = stack.pop()!;
    out.push(p);
    stack.push(...(kids.get(p) ?? []));
  }
  return out;
}

function treeUsage(pids: number[]): { rss: number; fds: number } {
  let rss = 0;
  let fds = 0;
  for (const pid of pids) {
    for (const root of processTree(pid)) {
      try {
        const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${root}/status`, 'utf8'));
        rss += m ? Number(m[1]) * 1024 : 0;
        fds += readdirSync(`/proc/${root}/fd`).length;
      } catch {
        // gone
      }
    }
  }
  return { rss, fds };
}

// ---- peers ----

function nginxStreamConf(dir: string, listen: string): string {
  return `load_module /usr/lib/nginx/modules/ngx_stream_module.so;
daemon off; master_process on; worker_processes 1; worker_rlimit_nofile 65536;
pid ${dir}/nginx-stream.pid; error_log ${dir}/nginx-stream.err error;
events { worker_connections 30000; }
stream {
  server { listen ${listen}:80 reuseport; proxy_pass ${BACKEND}:${HTTP_PORT}; }
  server { listen ${listen}:${IPERF_PORT}; proxy_pass ${BACKEND}:${IPERF_PORT}; }
}
`;
}

export function nginxBackendConf(dir: string): string {
  return `daemon off; master_process on; worker_processes 1; worker_rlimit_nofile 65536;
pid ${dir}/nginx-backend.pid; error_log ${dir}/nginx-backend.err error;
events { worker_connections 30000; }
http {
  access_log off; keepalive_requests 100000000; keepalive_timeout 300s; client_header_timeout 300s;
  client_body_temp_path ${dir}/b-body; proxy_temp_path ${dir}/b-proxy; fastcgi_temp_path ${dir}/b-fcgi;
  uwsgi_temp_path ${dir}/b-uwsgi; scgi_temp_path ${dir}/b-scgi;
  server { listen ${BACKEND}:${HTTP_PORT} backlog=4096; location / { return 200 "ok\\n"; } }
}
`;
}

function haproxyConf(listen: string): string {
  return `global
  nbthread 1
  maxconn 9000
defaults
  mode tcp
  timeout connect 5s
  timeout client 300s
  timeout server 300s
frontend http
  bind ${listen}:80
  default_backend http
backend http
  server b1 ${BACKEND}:${HTTP_PORT}
frontend iperf
  bind ${listen}:${IPERF_PORT}
  default_backend iperf
backend iperf
  server b1 ${BACKEND}:${IPERF_PORT}
`;
}

function kproxyManifest(vip: string): string {
  return `apiVersion: v1
kind: Service
metadata: {name: bench, namespace: bench}
spec:
  type: ClusterIP
  clusterIP: ${vip}
  ports:
  - {name: http, port: 80, targetPort: ${HTTP_PORT}, protocol: TCP}
  - {name: iperf, port: ${IPERF_PORT}, targetPort: ${IPERF_PORT}, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: bench-1, namespace: bench, labels: {kubernetes.io/service-name: bench}}
addressType: IPv4
ports:
- {name: http, port: ${HTTP_PORT}, protocol: TCP}
- {name: iperf, port: ${IPERF_PORT}, protocol: TCP}
endpoints:
- addresses: ["${BACKEND}"]
  conditions: {ready: true}
`;
}

/** `node [nodeArgs] bin/kproxy.js run --mode userspace` serving one ClusterIP Service on `vip` (ports 80 and 5201). */
export function kproxyPeer(name: string, key: string, vip: string, workers: number, ports: { metrics: number; healthz: number }, nodeArgs: string[] = [], env: NodeJS.ProcessEnv = {}, root = repoRoot): Peer {
  const p: Peer = {
    name, key, host: vip, httpPort: 80, iperfPort: IPERF_PORT, procs: [],
    async start(ns, dir) {
      const mdir = join(dir, `manifests-${key}`);
      rmSync(mdir, { recursive: true, force: true });
      await run('mkdir', ['-p', mdir], 5000);
      writeFileSync(join(mdir, 'svc.yaml'), kproxyManifest(vip));
      const cfg = join(dir, `config-${key}.yaml`);
      const userspace = workers > 0 ? `userspace:\n  workers: ${workers}\n` : '';
      // With --config the bind-address flags are ignored (as kube-proxy does): two kproxy peers
      // in one namespace need their own metrics and healthz ports in the file.
      writeFileSync(cfg, `apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\n` +
        `metricsBindAddress: 127.0.0.1:${ports.metrics}\nhealthzBindAddress: 127.0.0.1:${ports.healthz}\n${userspace}`);
      p.procs.push(ns.spawn(process.execPath, [...nodeArgs, resolve(root, 'bin/kproxy.js'), 'run', '--config', cfg, '--manifests', mdir, '--hostname-override', 'bench-node',
        '--log-level', 'warn'],
        { env: { KPROXY_USERSPACE_REDIRECT: '0', ...env }, onOutput: (s) => process.stderr.write(`[${key}] ${s}`) }));
      await waitListening(ns, vip, 80, 60_000);
      await waitListening(ns, vip, IPERF_PORT, 10_000);
    },
  };
  return p;
}

/** glibc malloc without heap trimming and without mmap for the 64 KB read buffers (a DaemonSet can set the same env). */
export const MALLOC_ENV = { MALLOC_TRIM_THRESHOLD_: String(256 << 20), MALLOC_MMAP_THRESHOLD_: String(256 << 20) };

export function peers(workers: number): Peer[] {
  return [
    { name: 'direct, no proxy', key: 'direct', host: BACKEND, httpPort: HTTP_PORT, iperfPort: IPERF_PORT, procs: [], async start() {} },
    {
      name: 'naive Node pipe', key: 'naive', host: '127.0.0.3', httpPort: 80, iperfPort: IPERF_PORT, procs: [],
      async start(ns) {
        this.procs.push(ns.node('bench/userspace-naive-pipe.ts', [`127.0.0.3:80=${BACKEND}:${HTTP_PORT}`, `127.0.0.3:${IPERF_PORT}=${BACKEND}:${IPERF_PORT}`]));
        await waitListening(ns, '127.0.0.3', 80);
        await waitListening(ns, '127.0.0.3', IPERF_PORT);
      },
    },
    {
      name: 'nginx stream', key: 'nginx', host: '127.0.0.4', httpPort: 80, iperfPort: IPERF_PORT, procs: [],
      async start(ns, dir) {
        writeFileSync(join(dir, 'nginx-stream.conf'), nginxStreamConf(dir, '127.0.0.4'));
        this.procs.push(ns.spawn('nginx', ['-c', join(dir, 'nginx-stream.conf'), '-p', dir]));
        await waitListening(ns, '127.0.0.4', 80);
      },
    },
    {
      name: 'haproxy (tcp mode)', key: 'haproxy', host: '127.0.0.5', httpPort: 80, iperfPort: IPERF_PORT, procs: [],
      async start(ns, dir) {
        writeFileSync(join(dir, 'haproxy.cfg'), haproxyConf('127.0.0.5'));
        // haproxy wants 2 × maxconn fds and refuses to start below them (maxconn fits 20,000).
        this.procs.push(ns.spawn('haproxy', ['-db', '-f', join(dir, 'haproxy.cfg')], { onOutput: (s) => process.stderr.write(`[haproxy] ${s}`) }));
        await waitListening(ns, '127.0.0.5', 80);
      },
    },
    // The default TCP path: raw libuv handles (src/modes/userspace/dataplane/tcp-raw.ts) where this Node has them.
    kproxyPeer('kproxy userspace (1 worker, raw handles)', 'kproxy', '127.0.0.6', 0, { metrics: 10249, healthz: 10256 }, [], { KPROXY_USERSPACE_TCP: 'raw' }),
    // The net.Socket path (src/modes/userspace/dataplane/tcp.ts), for the two side by side in one run.
    kproxyPeer('kproxy userspace (1 worker, net.Socket)', 'kproxy-net', '127.0.0.8', 0, { metrics: 10269, healthz: 10276 }, [], { KPROXY_USERSPACE_TCP: 'net' }),
    ...(workers > 1 ? [kproxyPeer(`kproxy userspace (${workers} workers)`, `kproxy-w${workers}`, '127.0.0.7', workers, { metrics: 10259, healthz: 10266 })] : []),
  ];
}

// ---- measurements ----

async function measure(ns: Netns, p: Peer, durationS: number): Promise<Figures> {
  const url = `http://${p.host}:${p.httpPort}/`;
  const t = (durationS + 30) * 1000;
  const d = `${durationS}s`;
  const iperfOnce = async () => parseIperfMBs(await inNs(ns, 'iperf3', ['-c', p.host, '-p', String(p.iperfPort), '-t', String(durationS), '-J'], t));
  // iperf3 -s serves one test at a time: a probe's connection (waitListening) can leave it
  // busy for a moment ("control socket has closed unexpectedly"); one retry after a second.
  const iperf = await iperfOnce().catch(async (e: Error) => {
    process.stderr.write(`  ${p.key} iperf3: ${e.message.slice(0, 120)}; retrying once\n`);
    await new Promise((r) => setTimeout(r, 1000));
    return iperfOnce();
  });
  const close = parseWrk(await inNs(ns, 'wrk', ['-t1', '-c16', `-d${d}`, '-H', 'Connection: close', url], t));
  const lat = parseWrk(await inNs(ns, 'wrk', ['-t1', '-c1', `-d${d}`, '--latency', url], t));
  const ka = parseWrk(await inNs(ns, 'wrk', ['-t1', '-c32', `-d${d}`, url], t));
  for (const [what, r] of [['conn/s', close], ['c=1', lat], ['keep-alive', ka]] as const) {
    if (r.errors > 0) process.stderr.write(`  ${p.key} ${what}: ${r.errors} socket errors / non-2xx\n`);
  }
  return { throughputMBs: iperf, connPerSec: close.rps, p50us: lat.p50us, p99us: lat.p99us, keepAliveRps: ka.rps };
}

/** Holds n idle connections to the peer (from this process, which joins the namespace via a helper). */
async function measureIdle(ns: Netns, p: Peer, n: number): Promise<IdleFigures | undefined> {
  const pids = p.procs.map((c) => c.pid!).filter(Boolean);
  if (pids.length === 0) return undefined;
  return holdIdle(ns, p.key, p.host, p.httpPort, n, pids);
}

/**
 * Holds n idle connections to host:port (bench/userspace-idle-client.ts in the namespace)
 * and returns the RSS and fd deltas of the process trees of pids per connection held.
 */
export async function holdIdle(ns: Netns, key: string, host: string, port: number, n: number, pids: number[]): Promise<IdleFigures> {
  const before = treeUsage(pids);
  const client = ns.node('bench/userspace-idle-client.ts', [host, String(port), String(n)]);
  let out = '';
  client.stdout?.on('data', (b: Buffer) => (out += b.toString()));
  const deadline = Date.now() + 60_000;
  while (!out.includes('held') && Date.now() < deadline && client.exitCode === null) await new Promise((r) => setTimeout(r, 100));
  if (!out.includes('held')) {
    await ns.kill(client, 'SIGKILL');
    throw new Error(`idle client for ${key} did not hold ${n} connections: ${out.slice(-300)}`);
  }
  // The proxy dials the backend after accepting: wait until its fds settle.
  let last = -1;
  let after = treeUsage(pids);
  for (let i = 0; i < 50 && after.fds !== last; i++) {
    last = after.fds;
    await new Promise((r) => setTimeout(r, 300));
    after = treeUsage(pids);
  }
  await ns.kill(client, 'SIGKILL');
  const held = Number(/held (\d+)/.exec(out)?.[1] ?? n);
  return { connections: held, rssBytesPerConn: (after.rss - before.rss) / held, fdsPerConn: (after.fds - before.fds) / held };
}

// ---- report ----

const fmt = (v: number, d = 0) => (Number.isFinite(v) ? v.toLocaleString('en-US', { maximumFractionDigits: d, minimumFractionDigits: d }) : 'n/a');

export function markdown(r: BenchReport): string {
  const lines = [
    '| proxy | 1-stream throughput MB/s | new conn/s (HTTP, Connection: close) | p50 µs (c=1) | p99 µs (c=1) | keep-alive req/s (c=32) | idle conn: RSS bytes / fds each |',
    '|---|---:|---:|---:|---:|---:|---:|',
  ];
  for (const p of r.peers) {
    const m = p.median;
    const idle = p.idle ? `${fmt(p.idle.rssBytesPerConn)} B / ${fmt(p.idle.fdsPerConn, 2)}` : '–';
    lines.push(`| ${p.name}${p.error ? ' (failed)' : ''} | ${fmt(m.throughputMBs)} | ${fmt(m.connPerSec)} | ${fmt(m.p50us)} | ${fmt(m.p99us)} | ${fmt(m.keepAliveRps)} | ${idle} |`);
  }
  const la = (r.loadAverages ?? []).filter(Number.isFinite);
  if (la.length) lines.push('', `Load average (1 min) during the run: ${fmt(Math.min(...la), 1)}–${fmt(Math.max(...la), 1)}, median ${fmt(median(la), 1)} (${r.host.cpus} cores).`);
  return lines.join('\n');
}

export function goals(r: BenchReport): string {
  const by = (k: string) => r.peers.find((p) => p.key === k)?.median;
  const naive = by('naive');
  const nginx = by('nginx');
  const lines = ['| goal | kproxy (1 worker) | target | met? |', '|---|---:|---:|---|'];
  for (const p of r.peers.filter((x) => x.key.startsWith('kproxy'))) {
    const k = p.median;
    const row = (goal: string, v: number, target: number, higher = true, d = 0) =>
      lines.push(`| ${p.name}: ${goal} | ${fmt(v, d)} | ${higher ? '≥' : '≤'} ${fmt(target, d)} | ${(higher ? v >= target : v <= target) ? 'yes' : 'no'} |`);
    if (naive) {
      row('throughput ≥ naive pipe', k.throughputMBs, naive.throughputMBs);
      row('conn/s ≥ naive pipe', k.connPerSec, naive.connPerSec);
      row('p50 ≤ naive pipe', k.p50us, naive.p50us, false);
      row('keep-alive ≥ naive pipe', k.keepAliveRps, naive.keepAliveRps);
    }
    if (nginx) {
      row('throughput ≥ 0.6× nginx', k.throughputMBs, 0.6 * nginx.throughputMBs);
      row('conn/s ≥ 0.6× nginx', k.connPerSec, 0.6 * nginx.connPerSec);
      row('keep-alive ≥ 0.6× nginx', k.keepAliveRps, 0.6 * nginx.keepAliveRps);
    }
    row('p99 at c=1 ≤ 1 ms (µs)', k.p99us, 1000, false);
    if (p.idle) row('memory per idle connection ≤ 8 KB (bytes)', p.idle.rssBytesPerConn, 8192, false);
  }
  lines[0] = '| goal | kproxy | target | met? |';
  return lines.join('\n');
}

/** Four horizontal bar panels (one per figure), one bar per proxy. */
export function svg(r: BenchReport): string {
  const panels: { title: string; key: keyof Figures; better: string }[] = [
    { title: '1-stream throughput (MB/s)', key: 'throughputMBs', better: 'higher is better' },
    { title: 'new connections / s (Connection: close)', key: 'connPerSec', better: 'higher is better' },
    { title: 'p99 latency at c=1 (µs, wrk 4.1: one sample per 10–20 ms)', key: 'p99us', better: 'lower is better' },
    { title: 'keep-alive requests / s (c=32)', key: 'keepAliveRps', better: 'higher is better' },
  ];
  const peersOk = r.peers;
  const barH = 16;
  const panelH = 34 + peersOk.length * (barH + 4);
  const W = 760;
  const labelW = 210;
  const colors = ['#888888', '#b07aa1', '#4e79a7', '#59a14f', '#e15759', '#f28e2b', '#edc948'];
  const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;');
  const out = [`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${60 + panels.length * panelH}" font-family="sans-serif" font-size="12">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="10" y="20" font-size="15" font-weight="bold">userspace proxies on loopback, one network namespace, medians of ${r.repeat} × ${r.durationS}s</text>`,
    `<text x="10" y="38" fill="#555">${esc(r.date)}, ${r.host.cpus} cores (shared, noisy${r.loadAverages?.length ? `: load average ${fmt(median(r.loadAverages), 1)}` : ''}), node ${esc(r.host.node)}, 1 worker each unless named</text>`];
  panels.forEach((pn, i) => {
    const y0 = 60 + i * panelH;
    const vals = peersOk.map((p) => p.median[pn.key]);
    const max = Math.max(1, ...vals.filter(Number.isFinite));
    out.push(`<text x="10" y="${y0 + 14}" font-weight="bold">${esc(pn.title)} <tspan fill="#777" font-weight="normal">${pn.better}</tspan></text>`);
    peersOk.forEach((p, j) => {
      const y = y0 + 24 + j * (barH + 4);
      const v = vals[j];
      const w = Number.isFinite(v) ? ((W - labelW - 90) * v) / max : 0;
      out.push(`<text x="${labelW - 6}" y="${y + 12}" text-anchor="end">${esc(p.name)}</text>`);
      out.push(`<rect x="${labelW}" y="${y}" width="${w.toFixed(1)}" height="${barH}" fill="${colors[j % colors.length]}"/>`);
      out.push(`<text x="${(labelW + w + 4).toFixed(1)}" y="${y + 12}">${fmt(v)}</text>`);
    });
  });
  out.push('</svg>');
  return out.join('\n');
}

// ---- main ----

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      duration: { type: 'string', default: '3' },
      repeat: { type: 'string', default: '3' },
      workers: { type: 'string', default: '2' },
      idle: { type: 'string', default: '5000' },
      only: { type: 'string' },
      json: { type: 'string' },
      svg: { type: 'string' },
      report: { type: 'string' },
      'max-minutes': { type: 'string', default: '20' },
      base: { type: 'string' },
    },
  });
  if (values.report) {
    const r = JSON.parse(readFileSync(values.report, 'utf8')) as BenchReport;
    console.log(markdown(r) + '\n\n' + goals(r));
    if (values.svg) writeFileSync(values.svg, svg(r));
    return;
  }
  for (const tool of ['nginx', 'haproxy', 'iperf3', 'wrk']) {
    await run('sh', ['-c', `command -v ${tool}`], 5000).catch(() => {
      throw new Error(`${tool} is not installed; run scripts/setup-system.sh (as root) first`);
    });
  }
  const durationS = Number(values.duration);
  const repeat = Number(values.repeat);
  const workers = Number(values.workers);
  const idleN = Number(values.idle);
  const deadline = Date.now() + Number(values['max-minutes']) * 60_000;
  const only = values.only ? new Set(values.only.split(',')) : null;
  const list = peers(workers).filter((p) => !only || only.has(p.key));
  if (values.base) {
    list.push(kproxyPeer(`kproxy at ${values.base} (1 worker, raw handles)`, 'kproxy-base', '127.0.0.9', 0, { metrics: 10279, healthz: 10286 }, [], { KPROXY_USERSPACE_TCP: 'raw' }, resolve(values.base)));
  }

  const dir = mkdtempSync(join(tmpdir(), 'kproxy-bench-us-'));
  const ns = Netns.create(uniqueName('kpb-us'));
  const cleanup = async () => {
    await ns.destroy();
    rmSync(dir, { recursive: true, force: true });
  };
  const onSignal = () => void cleanup().then(() => process.exit(130));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  const loadAverages: number[] = [];
  const results = new Map<string, PeerResult>(list.map((p) => [p.key, { key: p.key, name: p.name, runs: [], median: medianFigures([]) }]));
  try {
    writeFileSync(join(dir, 'nginx-backend.conf'), nginxBackendConf(dir));
    ns.spawn('nginx', ['-c', join(dir, 'nginx-backend.conf'), '-p', dir]);
    ns.spawn('iperf3', ['-s', '-B', BACKEND, '-p', String(IPERF_PORT)]);
    await waitListening(ns, BACKEND, HTTP_PORT);
    await waitListening(ns, BACKEND, IPERF_PORT);
    for (const p of list) {
      try {
        await p.start(ns, dir);
      } catch (e) {
        results.get(p.key)!.error = (e as Error).message;
        process.stderr.write(`${p.key}: cannot start: ${(e as Error).message}\n`);
      }
    }
    const live = list.filter((p) => !results.get(p.key)!.error);
    // Idle connections first, on fresh processes: after the loads a proxy's heap holds garbage
    // that new connections reuse, and the RSS delta comes out too small or even negative.
    if (idleN > 0) {
      for (const p of live.filter((x) => x.key !== 'direct')) {
        try {
          results.get(p.key)!.idle = await measureIdle(ns, p, idleN);
          process.stderr.write(`idle ${p.key}: ${JSON.stringify(results.get(p.key)!.idle)}\n`);
        } catch (e) {
          process.stderr.write(`idle ${p.key}: ${(e as Error).message}\n`);
        }
      }
    }
    // Warm-up: JIT and connection pools, not measured.
    for (const p of live) await inNs(ns, 'wrk', ['-t1', '-c32', '-d1s', `http://${p.host}:${p.httpPort}/`], 30_000).catch(() => '');
    for (let rep = 0; rep < repeat && Date.now() < deadline; rep++) {
      // Each repetition starts with the next proxy: no proxy always runs right after the same one.
      const k = rep % live.length;
      for (const p of [...live.slice(k), ...live.slice(0, k)]) {
        loadAverages.push(Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[0]));
        try {
          const f = await measure(ns, p, durationS);
          results.get(p.key)!.runs.push(f);
          process.stderr.write(`rep ${rep + 1} ${p.key}: ${JSON.stringify(f)}\n`);
        } catch (e) {
          process.stderr.write(`rep ${rep + 1} ${p.key}: ${(e as Error).message}\n`);
        }
      }
    }
  } finally {
    await cleanup();
  }
  for (const r of results.values()) r.median = medianFigures(r.runs);
  const kernel = readFileSync('/proc/sys/kernel/osrelease', 'utf8').trim();
  const report: BenchReport = {
    date: new Date().toISOString(), host: { cpus: (await import('node:os')).availableParallelism(), node: process.version, kernel },
    durationS, repeat, workers, peers: [...results.values()], loadAverages,
  };
  if (values.json) writeFileSync(values.json, JSON.stringify(report, null, 2));
  if (values.svg) writeFileSync(values.svg, svg(report));
  console.log(markdown(report) + '\n\n' + goals(report));
}

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith('bench/userspace.ts')) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
