// The real process: `node bin/kproxy.js run --manifests DIR` inside a network namespace,
// timed from the outside. What it measures, at N services × E endpoints:
//  - cold start: process start → the first full sync's "synced" log line;
//  - memory: VmRSS and VmHWM of the process (/proc/PID/status) right after the first sync
//    and after the change stream;
//  - one-service change: a manifest file written (rename into place) → the new endpoint in
//    the kernel, detected two ways (--detect, default both, side by side):
//      packet  a client in kproxy's namespace connects to the Service's ClusterIP every 5 ms
//              (two connects per 5 ms tick; bench/change-probe.ts; bounded in count and
//              time) until the NEW endpoint
//              answers: a backend namespace behind a veth holds every endpoint address and
//              answers with the address the connection was DNATed to. Costs kproxy nothing
//              but a few hundred connects/s, so this is the figure the goals use.
//      kernel  the new endpoint's chain polled with `iptables -t nat -S CHAIN` / `nft list
//              chain` (the first method): each poll reads the table, 0.4 s (nftables) to
//              2 s (legacy) at 10k Services, which is both the resolution and CPU and
//              xtables-lock time taken from kproxy; kept for comparison;
//  - event → kernel latency: a stream of endpoint changes at a fixed rate for a bounded time,
//    p50 / p99 of write → detected (each detection method gets its own stream, packet first),
//    with the syncs kproxy logged meanwhile (how many, how many changes each took).
// Every Service sits in one big file; the EndpointSlices of a few "hot" services (the ones
// the changes touch) sit in a file each, so a change rewrites a small file, as an informer
// event would carry one object (a change to the big file would re-read 8 MB: that cost is the
// manifests-load figure, measured on its own). Every changed slice carries
// endpoints.kubernetes.io/last-change-trigger-time, so kubeproxy_network_programming_duration_seconds
// sees it where the metric exists.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync, existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { servicePortNameString, endpointChainName as iptablesEndpointChain } from '../src/modes/iptables/names.ts';
import { isKubeProxyTable, servicePortEndpointChainNameBase, shardOf, shardTable, TABLE } from '../src/modes/nftables/names.ts';
import { serviceKey, type ServicePort } from '../src/core/model.ts';
import { LEGACY_IPTABLES, podNetwork, TimedRunner, type Namespaces } from './netns.ts';
import { clusterIPOf, endpointIPOf, NAMESPACE, serviceName, serviceObject, sliceObject } from './workload.ts';
import { median, percentile, pollUntil, sleep } from './stats.ts';

export type RunVariant = 'iptables' | 'iptables-legacy' | 'nftables';
/** How a change is found in the kernel: a connection answered by the new endpoint, a poll of the rules, or both. */
export type Detect = 'packet' | 'kernel' | 'both';

export interface RunPhaseOptions {
  n: number;
  endpoints: number;
  variant: RunVariant;
  /** one-service changes, one after the other */
  changes: number;
  /** the change stream: rate per second and duration; 0 seconds skips it */
  streamRate: number;
  streamSeconds: number;
  /** limit for the first sync */
  startTimeoutMs: number;
  /** limit for one change to reach the kernel */
  changeTimeoutMs: number;
  /** default 'both' */
  detect?: Detect;
  workDir: string;
  log: (line: string) => void;
}

export interface StreamResult {
  sent: number;
  seen: number;
  p50Ms: number;
  p99Ms: number;
  maxMs: number;
  rate: number;
  seconds: number;
  syncs?: SyncSummary;
  /** packet detection: median connects per detection */
  connectsMedian?: number;
  /**
   * kproxy's own kubeproxy_network_programming_duration_seconds over the stream (scraped before
   * and after it): observations, and the buckets holding the p50 and p99 (upper bounds, s)
   */
  metric?: ProgrammingMetric;
}

export interface ProgrammingMetric {
  count: number;
  p50S: number;
  p99S: number;
}

export interface MemorySample {
  vmRssKiB: number;
  vmHwmKiB: number;
}

export interface RunPhaseResult {
  n: number;
  endpoints: number;
  variant: RunVariant;
  /** process spawned → the first full sync's "synced" line */
  coldStartMs?: number;
  /** the first sync's own duration as kproxy logged it */
  firstSyncMs?: number;
  /** process spawned → "sources synced" (the manifests loaded) */
  sourceLoadMs?: number;
  memAfterFirstSync?: MemorySample;
  /**
   * 2 s after kproxy's collection after the first sync (its "collected the full sync's
   * garbage" line, at most 10 s waited for): V8 returns the freed pages on a background
   * thread, so this is the RSS the node keeps (what the report quotes as "settled")
   */
  memSettled?: MemorySample;
  memAfterStream?: MemorySample;
  /** write → chain in the kernel (polled), ms, one per change */
  changeMs: number[];
  /** write → a connection to the ClusterIP answered by the new endpoint, ms, one per change */
  changePacketMs?: number[];
  /** connects each packet detection took (the endpoint is random per connection: the resolution) */
  changePacketConnects?: number[];
  /** the stream, detected by polling the kernel */
  stream?: StreamResult;
  /** the stream, detected by connections */
  streamPacket?: StreamResult;
  /** median time of one kernel check: the resolution of the latencies */
  checkMs: number;
  /** nftables: the kube-proxy tables in the kernel after the first sync (K tables from 1,000 Services) */
  nftTables?: string[];
  syncs: number;
  error?: string;
}

const HOT_MAX = 400;
const EXTRA_ENDPOINTS = 16;
/** the system interpreter when there is one: a pyenv shim costs ~0.4 s per start */
const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';
const repoRoot = resolve(import.meta.dirname, '..');

/** Indexes of the services whose slices live in files of their own, spread over the list. */
export function hotServices(n: number, count = HOT_MAX): number[] {
  const k = Math.min(n, count);
  const out = new Set<number>();
  for (let j = 0; j < k; j++) out.add(Math.floor(((j + 0.5) / k) * n));
  return [...out];
}

/** One YAML stream of JSON documents (JSON is YAML): the fast parser's good case. */
function docs(objects: unknown[]): string {
  return objects.map((o) => `---\n${JSON.stringify(o)}\n`).join('');
}

/**
 * Services (with their cold slices) per manifest file: 20,000 are ~17 MB, well under the
 * manifests source's limit per file (MAX_MANIFEST_FILE_BYTES, 64 MiB; 100,000 in one file
 * would be ~87 MB, refused).
 */
export const SERVICES_PER_FILE = 20_000;

/** The manifest file that holds service i: services.yaml for the first SERVICES_PER_FILE, then services-1.yaml, ... */
export function servicesFileOf(i: number): string {
  const k = Math.floor(i / SERVICES_PER_FILE);
  return k === 0 ? 'services.yaml' : `services-${k}.yaml`;
}

/** Writes the manifests directory: every Service and the cold slices in services*.yaml, each hot slice in a file of its own. */
export function writeManifests(dir: string, n: number, endpoints: number, hot: number[]): void {
  mkdirSync(dir, { recursive: true });
  const hotSet = new Set(hot);
  const stride = endpoints + EXTRA_ENDPOINTS;
  for (let first = 0; first < n; first += SERVICES_PER_FILE) {
    const chunks: string[] = [];
    for (let i = first; i < Math.min(n, first + SERVICES_PER_FILE); i++) {
      chunks.push(docs([serviceObject(i)]));
      if (!hotSet.has(i)) chunks.push(docs([sliceObject(i, endpoints, stride)]));
    }
    writeFileSync(join(dir, servicesFileOf(first)), chunks.join(''));
  }
  for (const i of hot) writeFileSync(join(dir, `hot-${serviceName(i)}.yaml`), docs([sliceObject(i, endpoints, stride)]));
}

/** Rewrites service i's slice with `count` endpoints, atomically (temp file + rename); returns the write time. */
function writeHotSlice(dir: string, i: number, count: number, endpoints: number): number {
  const slice = sliceObject(i, count, endpoints + EXTRA_ENDPOINTS);
  const at = new Date();
  (slice.metadata as { annotations?: Record<string, string> }).annotations = {
    // RFC 3339 with milliseconds (the EndpointSlice controller writes RFC3339Nano): whole
    // seconds would put up to 1 s of rounding into the network-programming metric
    'endpoints.kubernetes.io/last-change-trigger-time': at.toISOString(),
  };
  const tmp = join(dir, `.tmp-${serviceName(i)}`);
  writeFileSync(tmp, docs([slice]));
  const t = performance.now();
  renameSync(tmp, join(dir, `hot-${serviceName(i)}.yaml`));
  return t;
}

/**
 * The nftables table that holds service i, as the kernel shows it: upstream's `kube-proxy`
 * below 1,000 Services; from there the sharded mode's `kube-proxy-<shardOf(ns/name, K)>`,
 * K = the number of shard tables listed (src/modes/nftables/shards.ts).
 */
export function nftTableOf(tables: readonly string[], i: number): string {
  if (tables.includes(TABLE)) return TABLE;
  const shards = tables.filter((t) => isKubeProxyTable(t) && t !== TABLE);
  if (!shards.length) throw new Error(`KPROXY_BENCH_RUN: no kube-proxy table in the kernel (tables: ${tables.join(', ') || 'none'})`);
  const table = shardTable(shardOf(serviceKey(NAMESPACE, serviceName(i)), shards.length));
  if (!shards.includes(table)) throw new Error(`KPROXY_BENCH_RUN: ${table} (service ${serviceName(i)}, K=${shards.length}) is not in the kernel (tables: ${shards.join(', ')})`);
  return table;
}

/**
 * The kube-proxy tables of `ip` in the runner's namespace (`kube-proxy`, or the shards'
 * `kube-proxy-<n>`), by one netlink dump (bench/nft-tables.py): `nft list tables` (nft 1.0.6)
 * took 53–60 s at 10,000 Services in 16 tables here (`-t` too; why not looked into).
 */
export async function kubeProxyTables(runner: TimedRunner): Promise<string[]> {
  const r = await runner.run(PYTHON, ['-S', join(repoRoot, 'bench/nft-tables.py'), 'ip'], { timeoutMs: 30_000 });
  if (r.code !== 0) throw new Error(`KPROXY_BENCH_TABLES: nft-tables.py exited ${r.code}: ${r.stderr.trim().slice(0, 200)}`);
  return r.stdout.split('\n').map((l) => l.trim()).filter(isKubeProxyTable);
}

/** The kernel object that shows endpoint `ep` ("ip:port") of service i is programmed: the endpoint's chain (nftables: in `table`, nftTableOf). */
export function endpointCheck(variant: RunVariant, i: number, ep: string, table = TABLE): { cmd: string; args: string[] } {
  if (variant === 'nftables') {
    const base = servicePortEndpointChainNameBase({ namespace: NAMESPACE, name: serviceName(i), port: 'http' }, 'tcp', ep);
    // One netlink GETCHAIN (O(1)), not `nft list chain`: nft 1.0.6 first fetches every set
    // element of the table for it (~0.4 s at 10,000 Services, CPU the proxy then lacks), and
    // three pollers at that cost cannot keep up with 10 changes/s: the queue of unchecked
    // changes, not kproxy, made the latency grow (docs "nftables at scale").
    return { cmd: PYTHON, args: ['-S', join(repoRoot, 'bench/nft-chain-exists.py'), 'ip', table, `endpoint-${base}`] };
  }
  const sp = { portName: { namespace: NAMESPACE, name: serviceName(i), port: 'http' } } as unknown as ServicePort;
  return { cmd: 'iptables', args: ['-t', 'nat', '-S', iptablesEndpointChain(servicePortNameString(sp), 'tcp', ep)] };
}

/** A directory of symlinks that makes `iptables*` the legacy binaries for a process started with it first on PATH. */
/**
 * A directory of bash wrappers, first on kproxy's PATH, that run the real rule-writing binary
 * (iptables-restore / ip6tables-restore, legacy or not; nft) and append `start end name rc args`
 * (epoch seconds, $EPOCHREALTIME: no extra process) to `log`: how many writes a sync makes.
 */
export function writeLogShim(dir: string, variant: RunVariant, log: string): string {
  const bin = join(dir, 'write-log-bin');
  mkdirSync(bin, { recursive: true });
  const names = variant === 'nftables' ? ['nft'] : ['iptables-restore', 'ip6tables-restore'];
  for (const name of names) {
    const real = variant === 'iptables-legacy' ? LEGACY_IPTABLES[name] : name;
    const target = ['/usr/sbin', '/sbin', '/usr/bin'].map((d) => join(d, real)).find((p) => existsSync(p));
    if (!target) continue;
    writeFileSync(join(bin, name), `#!/bin/bash\ns=$EPOCHREALTIME\n${target} "$@"\nrc=$?\necho "$s $EPOCHREALTIME ${name} $rc $*" >> ${log}\nexit $rc\n`, { mode: 0o755 });
  }
  return bin;
}

/** The rule writes in a write log that started within [fromMs, toMs] (epoch ms): how many, median duration. */
export function writesIn(logText: string, fromMs: number, toMs: number): { writes: number; writeMedianMs: number } {
  const ms: number[] = [];
  for (const line of logText.split('\n')) {
    const [start, end, name, , ...args] = line.split(' ');
    const s = Number(start) * 1000;
    if (!name || !(s >= fromMs && s <= toMs)) continue;
    // a write: `nft -f`, or a restore that is not a `--version` probe
    if (name === 'nft' ? !args.includes('-f') : !name.endsWith('-restore') || args.includes('--version')) continue;
    ms.push(Number(end) * 1000 - s);
  }
  return { writes: ms.length, writeMedianMs: median(ms) };
}

export function legacyShim(dir: string): string {
  const bin = join(dir, 'legacy-bin');
  mkdirSync(bin, { recursive: true });
  for (const [from, to] of Object.entries(LEGACY_IPTABLES)) {
    const target = ['/usr/sbin', '/sbin'].map((d) => join(d, to)).find((p) => existsSync(p));
    if (!target) throw new Error(`KPROXY_BENCH_LEGACY: ${to} is not installed`);
    if (!existsSync(join(bin, from))) symlinkSync(target, join(bin, from));
  }
  return bin;
}

export function readMemory(pid: number): MemorySample | undefined {
  try {
    const s = readFileSync(`/proc/${pid}/status`, 'utf8');
    const kib = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB`, 'm').exec(s)?.[1] ?? NaN);
    return { vmRssKiB: kib('VmRSS'), vmHwmKiB: kib('VmHWM') };
  } catch {
    return undefined;
  }
}

export interface LogLine { msg?: string; full?: boolean; durationMs?: number; changed?: number; level?: number }

/** kproxy's JSON log lines as they arrive on its stdout, each with its arrival time, and the tail of its stderr. */
export interface FollowedLog {
  events: { at: number; line: LogLine }[];
  errTail: () => string;
}

/** Follows a kproxy process's stdout (pino JSON, one object a line) and keeps the last 2,000 characters of its stderr. */
export function followLog(proc: ChildProcess): FollowedLog {
  const events: FollowedLog['events'] = [];
  let tail = '';
  let errTail = '';
  proc.stdout!.on('data', (d: Buffer) => {
    const lines = (tail + d.toString()).split('\n');
    tail = lines.pop() ?? '';
    const at = performance.now();
    for (const l of lines) {
      try {
        events.push({ at, line: JSON.parse(l) as LogLine });
      } catch {
        /* not a log line */
      }
    }
  });
  proc.stderr!.on('data', (d: Buffer) => void (errTail = (errTail + d.toString()).slice(-2000)));
  return { events, errTail: () => errTail };
}

/** The syncs kproxy logged in a window: how many, how many changed services each took, how long each ran. */
export interface SyncSummary {
  count: number;
  full: number;
  /** changed services per sync: median and max (coalescing: a sync takes every change that waited) */
  changedMedian: number;
  changedMax: number;
  durationMedianMs: number;
  durationMaxMs: number;
  /** kproxy's rule writes (iptables-restore / nft -f runs) that started in the window, and their median duration */
  writes?: number;
  writeMedianMs?: number;
}

export function summarizeSyncs(lines: LogLine[]): SyncSummary {
  const s = lines.filter((l) => l.msg === 'synced');
  const changed = s.map((l) => l.changed ?? 0);
  const dur = s.map((l) => l.durationMs ?? 0);
  return {
    count: s.length, full: s.filter((l) => l.full).length,
    changedMedian: median(changed), changedMax: changed.length ? Math.max(...changed) : NaN,
    durationMedianMs: median(dur), durationMaxMs: dur.length ? Math.max(...dur) : NaN,
  };
}

/** Runs kproxy in a fresh namespace and measures it; kills it and deletes the namespace in every case. */
export async function runPhase(nss: Namespaces, o: RunPhaseOptions): Promise<RunPhaseResult> {
  const res: RunPhaseResult = { n: o.n, endpoints: o.endpoints, variant: o.variant, changeMs: [], checkMs: NaN, syncs: 0 };
  const dir = join(o.workDir, `manifests-${o.variant}-${o.n}`);
  const writeLog = join(o.workDir, `writes-${o.variant}-${o.n}.log`);
  rmSync(writeLog, { force: true });
  const writes = (fromMs: number) => {
    try {
      return writesIn(readFileSync(writeLog, 'utf8'), fromMs, Date.now());
    } catch {
      return undefined;
    }
  };
  rmSync(dir, { recursive: true, force: true });
  const hot = hotServices(o.n);
  writeManifests(dir, o.n, o.endpoints, hot);
  const ns = await nss.create(`run${o.variant === 'iptables-legacy' ? 'leg' : o.variant.slice(0, 3)}`);
  const runner = new TimedRunner(ns, o.variant === 'iptables-legacy' ? LEGACY_IPTABLES : {});
  const detect = o.detect ?? 'both';
  let proc: ChildProcess | undefined;
  let srv: string | undefined;
  const helpers: ChildProcess[] = [];
  const checkTimes: number[] = [];
  try {
    // The pods for packet detection: set up before kproxy starts, so its node IP is there from the start.
    if (detect !== 'kernel') {
      srv = await nss.create('runsrv');
      await podNetwork(ns, srv);
      const server = spawnProbe(srv, ['serve', '8080']);
      helpers.push(server.proc);
      if (!(await server.ready())) throw new Error(`KPROXY_BENCH_RUN: the pod listener did not start: ${server.output()}`);
    }
    const env: NodeJS.ProcessEnv = { ...process.env, KPROXY_LOG_LEVEL: 'info' };
    if (o.variant === 'iptables-legacy') env.PATH = `${legacyShim(o.workDir)}:${env.PATH}`;
    env.PATH = `${writeLogShim(join(o.workDir, o.variant), o.variant, writeLog)}:${env.PATH}`;
    const mode = o.variant === 'nftables' ? 'nftables' : 'iptables';
    const args = ['netns', 'exec', ns, process.execPath, join(repoRoot, 'bin/kproxy.js'), 'run', '--mode', mode, '--manifests', dir,
      '--hostname-override', 'kpb-node', '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'];
    const t0 = performance.now();
    proc = track(spawn('ip', args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env }));
    const { events, errTail } = followLog(proc);
    const exited = new Promise<void>((r) => proc!.once('exit', () => r()));
    let dead = false;
    void exited.then(() => (dead = true));

    const first = await pollUntil(async () => (dead ? null : events.find((e) => e.line.msg === 'synced' && e.line.full)), o.startTimeoutMs, 20);
    if (!first) {
      const failed = events.find((e) => (e.line.level ?? 0) >= 50);
      throw new Error(`KPROXY_BENCH_RUN: no first sync within ${o.startTimeoutMs / 1000} s${dead ? ' (kproxy exited)' : ''}: ${failed ? JSON.stringify(failed.line).slice(0, 300) : errTail().slice(-300)}`);
    }
    res.coldStartMs = first.at - t0;
    res.firstSyncMs = first.line.durationMs;
    const loaded = events.find((e) => e.line.msg === 'sources synced; starting the sync loop');
    if (loaded) res.sourceLoadMs = loaded.at - t0;
    res.memAfterFirstSync = readMemory(proc.pid!);
    await pollUntil(async () => (dead ? true : events.some((e) => e.line.msg === "collected the full sync's garbage") || null), 10_000, 50);
    await sleep(2000);
    if (!dead) res.memSettled = readMemory(proc.pid!);
    o.log(`  ${o.variant} N=${o.n}: cold start ${(res.coldStartMs / 1000).toFixed(1)} s, RSS ${((res.memAfterFirstSync?.vmRssKiB ?? 0) / 1024).toFixed(0)} MiB (settled ${((res.memSettled?.vmRssKiB ?? 0) / 1024).toFixed(0)} MiB), HWM ${((res.memAfterFirstSync?.vmHwmKiB ?? 0) / 1024).toFixed(0)} MiB`);

    let probe: Probe | undefined;
    if (detect !== 'kernel') {
      const p = spawnProbe(ns, ['watch', String(PROBE_TICK_MS), String(PROBE_MAX_PER_TICK), String(PROBE_PER_WATCH)], true);
      helpers.push(p.proc);
      if (!(await p.ready())) throw new Error(`KPROXY_BENCH_RUN: the probe did not start: ${p.output()}`);
      probe = new Probe(p.proc);
    }
    if (o.variant === 'nftables') {
      // the tables as the kernel has them: the mode as shipped shards from 1,000 Services
      res.nftTables = await kubeProxyTables(runner);
      o.log(`  nftables tables in the kernel: ${res.nftTables.length} (${res.nftTables.slice(0, 3).join(', ')}${res.nftTables.length > 3 ? ', …' : ''})`);
    }
    const tableOf = (i: number) => (o.variant === 'nftables' ? nftTableOf(res.nftTables!, i) : TABLE);
    const counts = new Map<number, number>(hot.map((i) => [i, o.endpoints]));
    const present = async (i: number, ep: string): Promise<boolean> => {
      const c = endpointCheck(o.variant, i, ep, tableOf(i));
      const ts = performance.now();
      const r = await runner.run(c.cmd, c.args, { timeoutMs: 30_000 });
      checkTimes.push(performance.now() - ts);
      return r.code === 0;
    };
    /** The next change: one more endpoint on the next hot service (not written yet). */
    let next = 0;
    const pick = (): { i: number; ep: string; count: number } => {
      const i = hot[next++ % hot.length];
      const count = counts.get(i)! + 1;
      if (count > o.endpoints + EXTRA_ENDPOINTS) throw new Error('KPROXY_BENCH_RUN: a hot service ran out of endpoint addresses; fewer changes');
      counts.set(i, count);
      return { i, ep: `${endpointIPOf(i * (o.endpoints + EXTRA_ENDPOINTS) + count - 1)}:8080`, count };
    };
    const write = (c: { i: number; count: number }) => writeHotSlice(dir, c.i, c.count, o.endpoints);
    const change = (): { i: number; ep: string; at: number } => {
      const c = pick();
      return { i: c.i, ep: c.ep, at: write(c) };
    };
    /** A change detected by connections: the watch starts, then the file is written. */
    const packetChange = async (): Promise<{ ms: number; connects: number; seen: boolean; what: string }> => {
      const c = pick();
      const w = probe!.watch(clusterIPOf(c.i), c.ep.split(':')[0], o.changeTimeoutMs);
      const at = write(c);
      const r = await w;
      return { ms: r.at - at, connects: r.connects, seen: r.seen, what: `${serviceName(c.i)} + ${c.ep}` };
    };

    // Settle, and space the one-service changes by more than minSyncPeriod (1 s by default):
    // each is then a change on an idle proxy, not one held back behind the previous sync.
    await sleep(1500);
    if (probe) {
      res.changePacketMs = [];
      res.changePacketConnects = [];
      for (let k = 0; k < o.changes; k++) {
        const r = await packetChange();
        if (!r.seen) throw new Error(`KPROXY_BENCH_RUN: change ${k + 1} (${r.what}) not answered by the new endpoint within ${o.changeTimeoutMs / 1000} s`);
        res.changePacketMs.push(r.ms);
        res.changePacketConnects.push(r.connects);
        await sleep(1200);
      }
    }
    if (detect !== 'packet') {
      for (let k = 0; k < o.changes; k++) {
        const c = change();
        const seen = await pollUntil(async () => ((await present(c.i, c.ep)) ? performance.now() : undefined), o.changeTimeoutMs, 0);
        if (seen === undefined) throw new Error(`KPROXY_BENCH_RUN: change ${k + 1} (${serviceName(c.i)} + ${c.ep}) not in the kernel within ${o.changeTimeoutMs / 1000} s`);
        res.changeMs.push(seen - c.at);
        await sleep(1200);
      }
    }

    if (o.streamSeconds > 0 && o.streamRate > 0) {
      if (probe) {
        const from = events.length;
        const before = await programmingBuckets(runner);
        const fromMs = Date.now();
        res.streamPacket = await packetStream(o, packetChange);
        res.streamPacket.syncs = { ...summarizeSyncs(events.slice(from).map((e) => e.line)), ...writes(fromMs) };
        // the metric is observed when the sync returns, a little after the rule answers
        await sleep(1000);
        res.streamPacket.metric = metricDelta(before, await programmingBuckets(runner));
        o.log(`  stream (packet): p50 ${res.streamPacket.p50Ms.toFixed(0)} ms p99 ${res.streamPacket.p99Ms.toFixed(0)} ms (${res.streamPacket.seen}/${res.streamPacket.sent}); syncs ${JSON.stringify(res.streamPacket.syncs)}`);
        // let the last syncs of that stream end before the next one starts
        await sleep(3000);
      }
      if (detect !== 'packet') {
        const from = events.length;
        const before = await programmingBuckets(runner);
        const fromMs = Date.now();
        res.stream = await stream(o, change, present);
        res.stream.syncs = { ...summarizeSyncs(events.slice(from).map((e) => e.line)), ...writes(fromMs) };
        res.stream.metric = metricDelta(before, await programmingBuckets(runner));
        o.log(`  stream (kernel poll): p50 ${res.stream.p50Ms.toFixed(0)} ms p99 ${res.stream.p99Ms.toFixed(0)} ms (${res.stream.seen}/${res.stream.sent}); syncs ${JSON.stringify(res.stream.syncs)}`);
      }
    }
    res.memAfterStream = readMemory(proc.pid!);
    res.syncs = events.filter((e) => e.line.msg === 'synced').length;
    res.checkMs = median(checkTimes);
    return res;
  } catch (e) {
    res.error = (e as Error).message.split('\n')[0].slice(0, 400);
    res.checkMs = median(checkTimes);
    return res;
  } finally {
    if (proc) await killGroup(proc);
    for (const h of helpers) await killGroup(h);
    await nss.delete(ns);
    if (srv) await nss.delete(srv);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Writes changes at o.streamRate per second for o.streamSeconds; each is watched by connections from the moment it is written. */
async function packetStream(
  o: RunPhaseOptions,
  packetChange: () => Promise<{ ms: number; connects: number; seen: boolean }>,
): Promise<StreamResult> {
  const total = Math.round(o.streamRate * o.streamSeconds);
  const start = performance.now();
  const watches: Promise<{ ms: number; connects: number; seen: boolean }>[] = [];
  for (let k = 0; k < total; k++) {
    const wait = start + (k * 1000) / o.streamRate - performance.now();
    if (wait > 0) await sleep(wait);
    watches.push(packetChange());
  }
  // each watch ends by itself within changeTimeoutMs (the probe's own limit)
  const rs = await Promise.all(watches);
  const seen = rs.filter((r) => r.seen);
  const latencies = seen.map((r) => r.ms);
  return {
    sent: total, seen: seen.length, rate: o.streamRate, seconds: o.streamSeconds,
    p50Ms: percentile(latencies, 50), p99Ms: percentile(latencies, 99), maxMs: latencies.length ? Math.max(...latencies) : NaN,
    connectsMedian: median(seen.map((r) => r.connects)),
  };
}

/** Writes changes at o.streamRate per second for o.streamSeconds while a poller finds each in the kernel. */
async function stream(
  o: RunPhaseOptions,
  change: () => { i: number; ep: string; at: number },
  present: (i: number, ep: string) => Promise<boolean>,
): Promise<StreamResult> {
  const total = Math.round(o.streamRate * o.streamSeconds);
  const pending: { i: number; ep: string; at: number }[] = [];
  const latencies: number[] = [];
  let writing = true;
  const writer = (async () => {
    const start = performance.now();
    for (let k = 0; k < total; k++) {
      const due = start + (k * 1000) / o.streamRate;
      const wait = due - performance.now();
      if (wait > 0) await sleep(wait);
      pending.push(change());
    }
    writing = false;
  })();
  // Up to 3 checks in flight; each looks at the oldest pending change it is given.
  const deadline = performance.now() + o.streamSeconds * 1000 + o.changeTimeoutMs;
  const worker = async () => {
    while (performance.now() < deadline && (writing || pending.length)) {
      const c = pending.shift();
      if (!c) {
        await sleep(5);
        continue;
      }
      if (await present(c.i, c.ep)) latencies.push(performance.now() - c.at);
      else pending.push(c);
    }
  };
  await Promise.all([writer, worker(), worker(), worker()]);
  return {
    sent: total, seen: latencies.length, rate: o.streamRate, seconds: o.streamSeconds,
    p50Ms: percentile(latencies, 50), p99Ms: percentile(latencies, 99), maxMs: Math.max(...latencies),
  };
}

/** Every process this module started and that still runs (kproxy, probes): killed on Ctrl-C too. */
const live = new Set<ChildProcess>();

function track(p: ChildProcess): ChildProcess {
  live.add(p);
  p.once('exit', () => live.delete(p));
  return p;
}

/** Kills every process runPhase started that still runs (the scale bench's SIGINT/SIGTERM handler). */
export async function killStarted(): Promise<void> {
  await Promise.all([...live].map((p) => killGroup(p)));
}

export async function killGroup(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const done = new Promise<void>((r) => p.once('exit', () => r()));
  const kill = (sig: NodeJS.Signals) => {
    try {
      process.kill(-p.pid!, sig);
    } catch {
      /* gone */
    }
  };
  kill('SIGTERM');
  const t = setTimeout(() => kill('SIGKILL'), 5000);
  await done;
  clearTimeout(t);
}

/** The probe's tick: each watched change gets connects every PROBE_TICK_MS. */
const PROBE_TICK_MS = 5;
/** At most this many connects per tick in all (≤ 1,600/s), shared round-robin by the watched changes. */
const PROBE_MAX_PER_TICK = 8;
/**
 * Connects per tick for one watched change (400/s): with 6 endpoints a connect finds the new
 * one with p = 1/6, two per tick with 0.31, so a detection comes on average ~14 ms after the
 * rule landed; more would take CPU from kproxy on a 2-core machine (the probe is in the
 * measured namespace's machine, as a real client would be).
 */
const PROBE_PER_WATCH = 2;


/** bench/change-probe.ts in a namespace; ready() waits (≤ 30 s) for its READY line. */
function spawnProbe(ns: string, args: string[], stdin = false): { proc: ChildProcess; ready: () => Promise<boolean>; output: () => string } {
  const proc = track(spawn('ip', ['netns', 'exec', ns, process.execPath, '--import', 'tsx', join(repoRoot, 'bench/change-probe.ts'), ...args], {
    stdio: [stdin ? 'pipe' : 'ignore', 'pipe', 'pipe'], detached: true, cwd: repoRoot,
  }));
  let out = '';
  const keep = (d: Buffer) => void (out = (out + d.toString()).slice(-4000));
  proc.stdout!.on('data', keep);
  proc.stderr!.on('data', keep);
  return { proc, ready: async () => (await pollUntil(async () => (out.includes('READY') ? true : undefined), 30_000, 20)) === true, output: () => out.slice(0, 300) };
}

/** The node-side client of bench/change-probe.ts: one watch per change, answered by a `seen`/`timeout` line. */
class Probe {
  private seq = 0;
  private readonly waiters = new Map<string, (r: { seen: boolean; at: number; connects: number }) => void>();

  constructor(private readonly proc: ChildProcess) {
    let tail = '';
    proc.stdout!.on('data', (d: Buffer) => {
      const at = performance.now();
      const lines = (tail + d.toString()).split('\n');
      tail = lines.pop() ?? '';
      for (const l of lines) {
        const [kind, id, connects] = l.trim().split(' ');
        const w = this.waiters.get(id);
        if (!w || (kind !== 'seen' && kind !== 'timeout')) continue;
        this.waiters.delete(id);
        w({ seen: kind === 'seen', at, connects: Number(connects) });
      }
    });
    proc.once('exit', () => {
      for (const w of this.waiters.values()) w({ seen: false, at: performance.now(), connects: 0 });
      this.waiters.clear();
    });
  }

  /** Connects to vip:80 until `want` answers; resolves when it did, or after timeoutMs (the probe's limit; ours is 5 s later). */
  watch(vip: string, want: string, timeoutMs: number): Promise<{ seen: boolean; at: number; connects: number }> {
    const id = `w${this.seq++}`;
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.waiters.delete(id);
        resolve({ seen: false, at: performance.now(), connects: 0 });
      }, timeoutMs + 5000);
      this.waiters.set(id, (r) => {
        clearTimeout(t);
        resolve(r);
      });
      this.proc.stdin!.write(`${id} ${vip} 80 ${want} ${timeoutMs}\n`);
    });
  }
}

const PROGRAMMING_BUCKET = /^kubeproxy_network_programming_duration_seconds_bucket\{([^}]*)\} (\S+)$/;

/** kproxy's network-programming histogram (cumulative bucket counts by upper bound, s), from its /metrics in the namespace. */
export async function programmingBuckets(runner: TimedRunner): Promise<Map<number, number> | undefined> {
  try {
    const r = await runner.run('curl', ['-s', '--max-time', '5', 'http://127.0.0.1:10249/metrics'], { timeoutMs: 10_000 });
    return r.code === 0 ? parseProgrammingBuckets(r.stdout) : undefined;
  } catch {
    return undefined;
  }
}

export function parseProgrammingBuckets(text: string): Map<number, number> {
  const out = new Map<number, number>();
  for (const line of text.split('\n')) {
    const m = PROGRAMMING_BUCKET.exec(line.trim());
    const le = m && /(?:^|,)le="([^"]+)"/.exec(m[1])?.[1];
    if (!m || !le) continue;
    const bound = le === '+Inf' ? Infinity : Number(le);
    out.set(bound, (out.get(bound) ?? 0) + Number(m[2])); // both families summed
  }
  return out;
}

/** The observations between two scrapes: how many, and the upper bounds of the buckets holding the p50 and the p99. */
export function metricDelta(before: Map<number, number> | undefined, after: Map<number, number> | undefined): ProgrammingMetric | undefined {
  if (!before || !after || !after.size) return undefined;
  const bounds = [...after.keys()].sort((a, b) => a - b);
  const cum = bounds.map((b) => (after.get(b) ?? 0) - (before.get(b) ?? 0));
  const count = cum[cum.length - 1];
  if (!(count > 0)) return { count: 0, p50S: NaN, p99S: NaN };
  const q = (p: number) => bounds[cum.findIndex((c) => c >= p * count)];
  return { count, p50S: q(0.5), p99S: q(0.99) };
}
