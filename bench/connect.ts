// First-packet connect latency against the number of Services (the seed's claim: iptables
// walks KUBE-SERVICES rule by rule, nftables looks the destination up in a map).
//
// Per mode and size, two namespaces: NODE (kproxy's rules; the client runs here, as node or
// host-network traffic) and SRV (every pod: `local 10.0.0.0/8` on its loopback and one
// listener on 0.0.0.0:8080), joined by a veth pair that exists only inside them. The rules
// are kproxy's for N services × E endpoints: the iptables mode's first full sync (the mode's
// Proxier, jumps from the built-in chains included), or the nftables mode's rendered
// transaction applied with `nft -f`. The client times connect() → SYN-ACK, sequentially,
// round-robin over: the FIRST service's ClusterIP, the LAST one's, and a pod IP directly
// (non-service traffic, which still walks the service chains in iptables).
import { spawn, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import type { PlanInput } from '../src/core/nodeview.ts';
import type { CommandRunner } from '../src/kernel/runner.ts';
import { silentLogger } from '../src/log.ts';
import { getMode } from '../src/modes/registry.ts';
import { LEGACY_IPTABLES, podNetwork, TimedRunner, type Namespaces } from './netns.ts';
import { killGroup, kubeProxyTables } from './kproxy-run.ts';
import { benchConfig, clusterIPOf, endpointIPOf, Workload } from './workload.ts';
import { percentile, pollUntil } from './stats.ts';
import { LOCK_RETRIES, xtablesLockBusy } from './cold.ts';

export type ConnectVariant = 'iptables' | 'iptables-legacy' | 'nftables';

export interface ConnectResult {
  n: number;
  variant: ConnectVariant;
  /** loading the rules (raw apply), ms */
  loadMs: number;
  targets: Record<'first' | 'last' | 'pod', { p50Ms: number; p99Ms: number; count: number; failed: number }>;
  /** nftables: the kube-proxy tables in the kernel once loaded (the mode's K tables from 1,000 Services) */
  tables?: string[];
  error?: string;
}

const repoRoot = resolve(import.meta.dirname, '..');

/**
 * Loads the iptables mode's rules as kproxy's first full sync does, through the mode's entry
 * point (its Proxier): the KUBE-* chains and the built-in chains' jumps to them. `runner` runs
 * every command in the node namespace.
 */
export async function loadIptables(runner: CommandRunner, input: PlanInput): Promise<void> {
  const proxier = await getMode('iptables').createProxier({ config: benchConfig('iptables'), log: silentLogger(), runner });
  try {
    await proxier.sync(input, new Set(), true);
  } finally {
    await proxier.stop();
  }
}

function spawnIn(ns: string, args: string[], onOut: (s: string) => void): ChildProcess {
  const p = spawn('ip', ['netns', 'exec', ns, process.execPath, '--import', 'tsx', resolve(repoRoot, 'bench/connect-client.ts'), ...args], {
    stdio: ['ignore', 'pipe', 'pipe'], detached: true, cwd: repoRoot,
  });
  p.stdout!.on('data', (d: Buffer) => onOut(d.toString()));
  p.stderr!.on('data', (d: Buffer) => onOut(d.toString()));
  return p;
}

export async function connectPhase(
  nss: Namespaces, o: { n: number; endpoints: number; variant: ConnectVariant; count: number; timeoutMs: number; log: (l: string) => void },
): Promise<ConnectResult> {
  const res: ConnectResult = { n: o.n, variant: o.variant, loadMs: NaN, targets: {} as ConnectResult['targets'] };
  const node = await nss.create('cn');
  const srv = await nss.create('cs');
  const procs: ChildProcess[] = [];
  try {
    await podNetwork(node, srv);

    let serverOut = '';
    procs.push(spawnIn(srv, ['serve', '8080'], (s) => void (serverOut += s)));

    const mode = o.variant === 'nftables' ? 'nftables' : 'iptables';
    const input = new Workload(o.n, o.endpoints, benchConfig(mode)).input();
    const runner = new TimedRunner(node, o.variant === 'iptables-legacy' ? LEGACY_IPTABLES : {}, 900_000);
    for (let attempt = 0; ; attempt++) {
      const t0 = performance.now();
      let err = '';
      if (mode === 'nftables') {
        const r = await runner.run('nft', ['-f', '-'], { input: getMode('nftables').render(input) });
        if (r.code !== 0) err = r.stderr;
      } else {
        await loadIptables(runner, input).catch((e: Error) => void (err = e.message || 'failed'));
      }
      res.loadMs = performance.now() - t0;
      if (!err) break;
      // another program holding the (host-wide) xtables lock: wait and load again
      if (!xtablesLockBusy(err) || attempt >= LOCK_RETRIES) throw new Error(`KPROXY_BENCH_CONNECT: loading the rules failed: ${err.trim().slice(0, 300)}`);
      await new Promise((res) => setTimeout(res, 3000));
    }
    // what the data path walks: the mode's render is its tables as shipped (sharded from 1,000 Services)
    if (mode === 'nftables') res.tables = await kubeProxyTables(runner);
    if (!(await pollUntil(async () => (serverOut.includes('READY') ? true : undefined), 30_000, 20))) {
      throw new Error(`KPROXY_BENCH_CONNECT: the pod listener did not start: ${serverOut.slice(0, 300)}`);
    }

    let clientOut = '';
    const client = spawnIn(node, ['connect', String(o.count), String(o.timeoutMs),
      `first=${clusterIPOf(0)}:80`, `last=${clusterIPOf(o.n - 1)}:80`, `pod=${endpointIPOf(0)}:8080`], (s) => void (clientOut += s));
    procs.push(client);
    const exited = new Promise<void>((r) => client.once('exit', () => r()));
    const budget = o.count * 3 * o.timeoutMs + 60_000;
    const done = await Promise.race([exited.then(() => true), new Promise<false>((r) => setTimeout(() => r(false), budget).unref())]);
    if (!done) throw new Error(`KPROXY_BENCH_CONNECT: the client did not finish within ${budget / 1000} s`);
    const line = clientOut.split('\n').find((l) => l.startsWith('{'));
    if (!line) throw new Error(`KPROXY_BENCH_CONNECT: no result from the client: ${clientOut.slice(0, 300)}`);
    const raw = JSON.parse(line) as Record<string, number[]>;
    for (const k of ['first', 'last', 'pod'] as const) {
      const ok = raw[k].filter((x) => Number.isFinite(x));
      res.targets[k] = { p50Ms: percentile(ok, 50), p99Ms: percentile(ok, 99), count: ok.length, failed: raw[k].length - ok.length };
    }
    const t = res.targets;
    o.log(`  connect ${o.variant} N=${o.n}: first ${t.first.p50Ms.toFixed(3)}/${t.first.p99Ms.toFixed(3)} ms, last ${t.last.p50Ms.toFixed(3)}/${t.last.p99Ms.toFixed(3)} ms, pod ${t.pod.p50Ms.toFixed(3)}/${t.pod.p99Ms.toFixed(3)} ms (p50/p99; load ${(res.loadMs / 1000).toFixed(1)} s${res.tables ? `; ${res.tables.length} nftables tables` : ''})`);
    if (t.first.failed + t.last.failed + t.pod.failed > 0) res.error = `${t.first.failed + t.last.failed + t.pod.failed} connects failed`;
    return res;
  } catch (e) {
    res.error = (e as Error).message.split('\n')[0].slice(0, 400);
    return res;
  } finally {
    for (const p of procs) await killGroup(p);
    await nss.delete(node);
    await nss.delete(srv);
  }
}
