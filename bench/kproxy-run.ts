// The real process: `node bin/kproxy.js run --manifests DIR` inside a network namespace,
// timed from the outside. What it measures, at N services × E endpoints:
//  - cold start: process start → the first full sync's "synced" log line;
//  - memory: VmRSS and VmHWM of the process (/proc/PID/status) right after the first sync
//    and after the change stream;
//  - one-service change: a manifest file written (rename into place) → the new endpoint's
//    chain present in the kernel (polled with `iptables -t nat -S CHAIN` / `nft list chain`);
//  - event → kernel latency: a stream of endpoint changes at a fixed rate for a bounded time,
//    p50 / p99 of write → chain present.
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
import { servicePortEndpointChainNameBase } from '../src/modes/nftables/names.ts';
import type { ServicePort } from '../src/core/model.ts';
import { LEGACY_IPTABLES, TimedRunner, type Namespaces } from './netns.ts';
import { endpointIPOf, NAMESPACE, serviceName, serviceObject, sliceObject } from './workload.ts';
import { median, percentile, pollUntil, sleep } from './stats.ts';

export type RunVariant = 'iptables' | 'iptables-legacy' | 'nftables';

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
  workDir: string;
  log: (line: string) => void;
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
   * thread, so this is the RSS the node keeps (what bench/memory-run.ts reports)
   */
  memSettled?: MemorySample;
  memAfterStream?: MemorySample;
  /** write → chain in the kernel, ms, one per change */
  changeMs: number[];
  stream?: { sent: number; seen: number; p50Ms: number; p99Ms: number; maxMs: number; rate: number; seconds: number };
  /** median time of one kernel check: the resolution of the latencies */
  checkMs: number;
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

/** Writes the manifests directory: every Service and the cold slices in one file, each hot slice in its own. */
export function writeManifests(dir: string, n: number, endpoints: number, hot: number[]): void {
  mkdirSync(dir, { recursive: true });
  const hotSet = new Set(hot);
  const stride = endpoints + EXTRA_ENDPOINTS;
  const chunks: string[] = [];
  for (let i = 0; i < n; i++) {
    chunks.push(docs([serviceObject(i)]));
    if (!hotSet.has(i)) chunks.push(docs([sliceObject(i, endpoints, stride)]));
  }
  writeFileSync(join(dir, 'services.yaml'), chunks.join(''));
  for (const i of hot) writeFileSync(join(dir, `hot-${serviceName(i)}.yaml`), docs([sliceObject(i, endpoints, stride)]));
}

/** Rewrites service i's slice with `count` endpoints, atomically (temp file + rename); returns the write time. */
function writeHotSlice(dir: string, i: number, count: number, endpoints: number): number {
  const slice = sliceObject(i, count, endpoints + EXTRA_ENDPOINTS);
  const at = new Date();
  (slice.metadata as { annotations?: Record<string, string> }).annotations = {
    'endpoints.kubernetes.io/last-change-trigger-time': at.toISOString().replace(/\.\d+Z$/, 'Z'),
  };
  const tmp = join(dir, `.tmp-${serviceName(i)}`);
  writeFileSync(tmp, docs([slice]));
  const t = performance.now();
  renameSync(tmp, join(dir, `hot-${serviceName(i)}.yaml`));
  return t;
}

/** The kernel object that shows endpoint `ep` ("ip:port") of service i is programmed: the endpoint's chain. */
export function endpointCheck(variant: RunVariant, i: number, ep: string): { cmd: string; args: string[] } {
  if (variant === 'nftables') {
    const base = servicePortEndpointChainNameBase({ namespace: NAMESPACE, name: serviceName(i), port: 'http' }, 'tcp', ep);
    // One netlink GETCHAIN (O(1)), not `nft list chain`: nft 1.0.6 first fetches every set
    // element of the table for it (~0.4 s at 10,000 Services, CPU the proxy then lacks), and
    // three pollers at that cost cannot keep up with 10 changes/s: the queue of unchecked
    // changes, not kproxy, made the latency grow (docs "nftables at scale").
    return { cmd: PYTHON, args: ['-S', join(repoRoot, 'bench/nft-chain-exists.py'), 'ip', 'kube-proxy', `endpoint-${base}`] };
  }
  const sp = { portName: { namespace: NAMESPACE, name: serviceName(i), port: 'http' } } as unknown as ServicePort;
  return { cmd: 'iptables', args: ['-t', 'nat', '-S', iptablesEndpointChain(servicePortNameString(sp), 'tcp', ep)] };
}

/** A directory of symlinks that makes `iptables*` the legacy binaries for a process started with it first on PATH. */
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

interface LogLine { msg?: string; full?: boolean; durationMs?: number; level?: number }

/** Runs kproxy in a fresh namespace and measures it; kills it and deletes the namespace in every case. */
export async function runPhase(nss: Namespaces, o: RunPhaseOptions): Promise<RunPhaseResult> {
  const res: RunPhaseResult = { n: o.n, endpoints: o.endpoints, variant: o.variant, changeMs: [], checkMs: NaN, syncs: 0 };
  const dir = join(o.workDir, `manifests-${o.variant}-${o.n}`);
  rmSync(dir, { recursive: true, force: true });
  const hot = hotServices(o.n);
  writeManifests(dir, o.n, o.endpoints, hot);
  const ns = await nss.create(`run${o.variant === 'iptables-legacy' ? 'leg' : o.variant.slice(0, 3)}`);
  const runner = new TimedRunner(ns, o.variant === 'iptables-legacy' ? LEGACY_IPTABLES : {});
  let proc: ChildProcess | undefined;
  const checkTimes: number[] = [];
  try {
    const env: NodeJS.ProcessEnv = { ...process.env, KPROXY_LOG_LEVEL: 'info' };
    if (o.variant === 'iptables-legacy') env.PATH = `${legacyShim(o.workDir)}:${env.PATH}`;
    const mode = o.variant === 'nftables' ? 'nftables' : 'iptables';
    const args = ['netns', 'exec', ns, process.execPath, join(repoRoot, 'bin/kproxy.js'), 'run', '--mode', mode, '--manifests', dir,
      '--hostname-override', 'kpb-node', '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'];
    const t0 = performance.now();
    proc = spawn('ip', args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env });
    const events: { at: number; line: LogLine }[] = [];
    let tail = '';
    let errTail = '';
    proc.stdout!.on('data', (d: Buffer) => {
      const text = tail + d.toString();
      const lines = text.split('\n');
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
    const exited = new Promise<void>((r) => proc!.once('exit', () => r()));
    let dead = false;
    void exited.then(() => (dead = true));

    const first = await pollUntil(async () => (dead ? null : events.find((e) => e.line.msg === 'synced' && e.line.full)), o.startTimeoutMs, 20);
    if (!first) {
      const failed = events.find((e) => (e.line.level ?? 0) >= 50);
      throw new Error(`KPROXY_BENCH_RUN: no first sync within ${o.startTimeoutMs / 1000} s${dead ? ' (kproxy exited)' : ''}: ${failed ? JSON.stringify(failed.line).slice(0, 300) : errTail.slice(-300)}`);
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

    const counts = new Map<number, number>(hot.map((i) => [i, o.endpoints]));
    const present = async (i: number, ep: string): Promise<boolean> => {
      const c = endpointCheck(o.variant, i, ep);
      const ts = performance.now();
      const r = await runner.run(c.cmd, c.args, { timeoutMs: 30_000 });
      checkTimes.push(performance.now() - ts);
      return r.code === 0;
    };
    /** The next change: one more endpoint on the next hot service; returns what to look for. */
    let next = 0;
    const change = (): { i: number; ep: string; at: number } => {
      const i = hot[next++ % hot.length];
      const count = counts.get(i)! + 1;
      if (count > o.endpoints + EXTRA_ENDPOINTS) throw new Error('KPROXY_BENCH_RUN: a hot service ran out of endpoint addresses; fewer changes');
      counts.set(i, count);
      const ep = `${endpointIPOf(i * (o.endpoints + EXTRA_ENDPOINTS) + count - 1)}:8080`;
      return { i, ep, at: writeHotSlice(dir, i, count, o.endpoints) };
    };

    // Settle, and space the one-service changes by more than minSyncPeriod (1 s by default):
    // each is then a change on an idle proxy, not one held back behind the previous sync.
    await sleep(1500);
    for (let k = 0; k < o.changes; k++) {
      const c = change();
      const seen = await pollUntil(async () => ((await present(c.i, c.ep)) ? performance.now() : undefined), o.changeTimeoutMs, 0);
      if (seen === undefined) throw new Error(`KPROXY_BENCH_RUN: change ${k + 1} (${serviceName(c.i)} + ${c.ep}) not in the kernel within ${o.changeTimeoutMs / 1000} s`);
      res.changeMs.push(seen - c.at);
      await sleep(1200);
    }

    if (o.streamSeconds > 0 && o.streamRate > 0) res.stream = await stream(o, change, present);
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
    await nss.delete(ns);
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Writes changes at o.streamRate per second for o.streamSeconds while a poller finds each in the kernel. */
async function stream(
  o: RunPhaseOptions,
  change: () => { i: number; ep: string; at: number },
  present: (i: number, ep: string) => Promise<boolean>,
): Promise<RunPhaseResult['stream']> {
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
