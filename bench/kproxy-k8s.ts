// The real process fed by the Kubernetes source: `node bin/kproxy.js run --kubeconfig FILE` in a
// network namespace, beside the test API server (test/support/apiserver-main.ts) in the same
// namespace holding N Services × E endpoints (one EndpointSlice each) and the node. What it
// measures, from the outside:
//  - cold start: process start → the first full sync's "synced" log line;
//  - "sources synced": process start → the lists delivered;
//  - VmRSS and VmHWM (/proc/PID/status) right after the first sync: the high-water mark covers
//    everything from the process's start (module loading, the lists, the first plan and its
//    apply), which is the figure a node's memory limit must allow for;
//  - VmRSS and VmHWM after one change (an endpoint added to one Service through the API) has
//    been synced: the change's sync and the collection after the first sync are in it too.
//
//   sudo node --import tsx bench/kproxy-k8s.ts [--services 10000] [--endpoints 5]
//        [--variant iptables|iptables-legacy|nftables] [--repeat 1] [--json]
//
// Needs root; the namespace and both processes are removed, also on failure.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { followLog, killGroup, legacyShim, readMemory, type MemorySample, type RunVariant } from './kproxy-run.ts';
import { Namespaces } from './netns.ts';
import { pollUntil, sleep } from './stats.ts';
import { NODE, serviceObject, sliceObject } from './workload.ts';

const repoRoot = resolve(import.meta.dirname, '..');
/** objects per create batch sent to the API server (one stdin line each) */
const BATCH = 500;
const EXTRA_ENDPOINTS = 16;

export interface K8sRunOptions {
  n: number;
  endpoints: number;
  variant: RunVariant;
  /** limit for the first sync and for the change */
  timeoutMs: number;
  log: (line: string) => void;
}

export interface K8sRunResult {
  n: number;
  endpoints: number;
  variant: RunVariant;
  coldStartMs?: number;
  sourceLoadMs?: number;
  firstSyncMs?: number;
  memAfterFirstSync?: MemorySample;
  memAfterChange?: MemorySample;
  error?: string;
}


/** The test API server in `ns`, with a line-per-command client (apiserver-main.ts's protocol). */
async function startApiServer(ns: string, kubeconfig: string, started: ChildProcess[]): Promise<(op: Record<string, unknown>) => Promise<unknown>> {
  const p = spawn('ip', ['netns', 'exec', ns, process.execPath, '--import', 'tsx', join(repoRoot, 'test/support/apiserver-main.ts'), '--kubeconfig', kubeconfig],
    { stdio: ['pipe', 'pipe', 'pipe'], detached: true, cwd: repoRoot });
  started.push(p);
  const waiters = new Map<number, (v: { ok: boolean; result?: unknown; error?: string }) => void>();
  let ready = false;
  let tail = '';
  let err = '';
  p.stderr!.on('data', (d: Buffer) => void (err = (err + d.toString()).slice(-2000)));
  p.stdout!.on('data', (d: Buffer) => {
    const lines = (tail + d.toString()).split('\n');
    tail = lines.pop() ?? '';
    for (const l of lines) {
      let m: { event?: string; id?: number; ok: boolean; result?: unknown; error?: string };
      try {
        m = JSON.parse(l);
      } catch {
        continue;
      }
      if (m.event === 'ready') ready = true;
      else if (typeof m.id === 'number') waiters.get(m.id)?.(m), waiters.delete(m.id);
    }
  });
  if (!(await pollUntil(async () => (ready || p.exitCode !== null ? true : undefined), 60_000, 20)) || !ready) {
    throw new Error(`KPROXY_BENCH_K8S: the test API server did not start: ${err.slice(-300)}`);
  }
  let seq = 0;
  return (op) => new Promise((res, rej) => {
    const id = ++seq;
    waiters.set(id, (v) => (v.ok ? res(v.result) : rej(new Error(`KPROXY_BENCH_K8S: ${String(op.op)}: ${v.error}`))));
    p.stdin!.write(JSON.stringify({ ...op, id }) + '\n');
  });
}

/** Runs kproxy against a test API server holding the workload; kills both and deletes the namespace in every case. */
export async function k8sRun(nss: Namespaces, o: K8sRunOptions): Promise<K8sRunResult> {
  const res: K8sRunResult = { n: o.n, endpoints: o.endpoints, variant: o.variant };
  const work = mkdtempSync(join(tmpdir(), 'kpb-k8s-'));
  const started: ChildProcess[] = [];
  const ns = await nss.create(`k8s${o.variant === 'iptables-legacy' ? 'leg' : o.variant.slice(0, 3)}`);
  try {
    const kubeconfig = join(work, 'kubeconfig');
    const call = await startApiServer(ns, kubeconfig, started);
    const stride = o.endpoints + EXTRA_ENDPOINTS;
    await call({ op: 'create', resource: 'nodes', object: {
      apiVersion: 'v1', kind: 'Node', metadata: { name: NODE.nodeName, labels: NODE.nodeLabels },
      status: { addresses: NODE.nodeIPs.map((address) => ({ type: 'InternalIP', address })) },
    } });
    for (let i = 0; i < o.n; i += BATCH) {
      const ops = [];
      for (let j = i; j < Math.min(o.n, i + BATCH); j++) {
        ops.push({ op: 'create', resource: 'services', object: serviceObject(j) });
        ops.push({ op: 'create', resource: 'endpointslices', object: sliceObject(j, o.endpoints, stride) });
      }
      await call({ op: 'batch', ops });
    }
    const env: NodeJS.ProcessEnv = { ...process.env, KPROXY_LOG_LEVEL: 'info' };
    if (o.variant === 'iptables-legacy') env.PATH = `${legacyShim(work)}:${env.PATH}`;
    const mode = o.variant === 'nftables' ? 'nftables' : 'iptables';
    const t0 = performance.now();
    const proc = spawn('ip', ['netns', 'exec', ns, process.execPath, join(repoRoot, 'bin/kproxy.js'), 'run', '--mode', mode, '--kubeconfig', kubeconfig,
      '--hostname-override', NODE.nodeName, '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'], { stdio: ['ignore', 'pipe', 'pipe'], detached: true, env });
    started.push(proc);
    const { events, errTail } = followLog(proc);
    const dead = () => proc.exitCode !== null || proc.signalCode !== null;
    const syncs = () => events.filter((e) => e.line.msg === 'synced');
    const first = await pollUntil(async () => (dead() ? null : syncs().find((e) => e.line.full)), o.timeoutMs, 20);
    if (!first) throw new Error(`KPROXY_BENCH_K8S: no first sync within ${o.timeoutMs / 1000} s${dead() ? ' (kproxy exited)' : ''}: ${errTail().slice(-300)}`);
    res.coldStartMs = first.at - t0;
    res.firstSyncMs = first.line.durationMs;
    const loaded = events.find((e) => e.line.msg === 'sources synced; starting the sync loop');
    if (loaded) res.sourceLoadMs = loaded.at - t0;
    res.memAfterFirstSync = readMemory(proc.pid!);
    // the collection after the first sync, then one change through the API
    await pollUntil(async () => (events.some((e) => e.line.msg === "collected the full sync's garbage") ? true : undefined), 10_000, 50);
    await sleep(1500);
    const before = syncs().length;
    await call({ op: 'update', resource: 'endpointslices', object: sliceObject(0, o.endpoints + 1, stride) });
    if (await pollUntil(async () => (syncs().length > before ? true : undefined), o.timeoutMs, 20)) res.memAfterChange = readMemory(proc.pid!);
    const mib = (s?: MemorySample) => (s ? `RSS ${(s.vmRssKiB / 1024).toFixed(0)} MiB, HWM ${(s.vmHwmKiB / 1024).toFixed(0)} MiB` : 'n/a');
    o.log(`  ${o.variant} N=${o.n} (Kubernetes source): cold start ${(res.coldStartMs / 1000).toFixed(1)} s; after the first sync ${mib(res.memAfterFirstSync)}; after one change ${mib(res.memAfterChange)}`);
  } catch (e) {
    res.error = (e as Error).message;
    o.log(`  ${o.variant} N=${o.n} (Kubernetes source): ${res.error}`);
  } finally {
    for (const p of started.reverse()) await killGroup(p);
    await nss.delete(ns);
    rmSync(work, { recursive: true, force: true });
  }
  return res;
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const { values } = parseArgs({ options: {
    services: { type: 'string', default: '10000' }, endpoints: { type: 'string', default: '5' },
    variant: { type: 'string', default: 'iptables' }, repeat: { type: 'string', default: '1' }, json: { type: 'boolean', default: false },
  } });
  const nss = new Namespaces();
  const cleanup = () => void nss.deleteAll().finally(() => process.exit(130));
  process.once('SIGINT', cleanup);
  process.once('SIGTERM', cleanup);
  const out: K8sRunResult[] = [];
  try {
    for (let r = 0; r < Number(values.repeat); r++) {
      out.push(await k8sRun(nss, { n: Number(values.services), endpoints: Number(values.endpoints), variant: values.variant as RunVariant, timeoutMs: 600_000, log: (l) => console.error(l) }));
    }
  } finally {
    await nss.deleteAll();
  }
  if (values.json) console.log(JSON.stringify(out));
  if (out.some((r) => r.error)) process.exitCode = 1;
}
