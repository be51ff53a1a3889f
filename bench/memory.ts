// Where kproxy's memory goes at N Services × E endpoints: the pieces of a `kproxy run` built
// one after the other in this process, the heap measured after a forced GC at each step.
//
//   sudo node --expose-gc --import tsx bench/memory.ts [--services 10000] [--endpoints 5]
//        [--mode iptables|iptables-legacy|nftables]
//
// Steps: the manifests source's cache (a digest per object, what it diffs a rescan against)
// → the trackers (each slice's endpoints per port, ServicePorts, Endpoint[],
// the state) → the proxier after its first full sync in a namespace (what it keeps between
// syncs: digests, the previous payload or table, caches). Each figure is retained heap
// (heapUsed + external after GC), not transient peaks; the process's RSS is printed too.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { ProxyStateTracker } from '../src/core/tracker.ts';
import { silentLogger } from '../src/log.ts';
import { getMode } from '../src/modes/registry.ts';
import { ManifestsSource } from '../src/sources/manifests.ts';
import { hotServices, writeManifests } from './kproxy-run.ts';
import { LEGACY_IPTABLES, Namespaces, TimedRunner } from './netns.ts';
import { benchConfig, NODE } from './workload.ts';

export interface MemoryStep {
  step: string;
  /** retained heap + external after GC, bytes */
  retained: number;
  /** growth over the previous step */
  delta: number;
  rss: number;
}

/** After a macrotask turn: what the last await chain still references is released only then. */
async function retained(): Promise<{ heap: number; rss: number }> {
  await new Promise((r) => setTimeout(r, 50));
  // V8 keeps the last string a regular expression ran on (RegExp.lastMatch): a whole file
  // read, here; any later match in the running process releases it.
  /x/.exec('x');
  for (let i = 0; i < 3; i++) global.gc?.();
  const m = process.memoryUsage();
  return { heap: m.heapUsed + m.external, rss: m.rss };
}

export async function memoryBreakdown(n: number, endpoints: number, variant: 'iptables' | 'iptables-legacy' | 'nftables'): Promise<MemoryStep[]> {
  if (!global.gc) throw new Error('KPROXY_BENCH_ARGS: run with node --expose-gc');
  const steps: MemoryStep[] = [];
  let prev = (await retained()).heap;
  const mark = async (step: string) => {
    const r = await retained();
    steps.push({ step, retained: r.heap, delta: r.heap - prev, rss: r.rss });
    prev = r.heap;
  };
  await mark('baseline (modules loaded)');
  const dir = mkdtempSync(join(tmpdir(), 'kpb-mem-'));
  const nss = new Namespaces();
  try {
    writeManifests(dir, n, endpoints, hotServices(n));
    const mode = variant === 'nftables' ? 'nftables' : 'iptables';
    const tracker = new ProxyStateTracker(4, NODE.nodeName);
    // The source alone (a handler that keeps nothing): its cache between scans.
    const noop = { onService: () => {}, onEndpointSlice: () => {}, onSynced: () => {} };
    const alone = new ManifestsSource({ dir, nodeName: NODE.nodeName, log: silentLogger(), pollMs: 3_600_000 });
    await alone.start(noop);
    await mark('manifests source: its cache between scans');
    await alone.stop();
    // Then the source feeding the trackers, as in `kproxy run`.
    const source = new ManifestsSource({ dir, nodeName: NODE.nodeName, log: silentLogger(), pollMs: 3_600_000 });
    await source.start({
      onService: (o, s) => void tracker.services.update(o, s),
      onEndpointSlice: (o, s) => void tracker.endpoints.update(o, s),
      onSynced: () => {},
    });
    tracker.apply();
    await mark('trackers + state (each slice\'s endpoints, ServicePorts, Endpoint[]), plus a second source cache');
    await source.stop();
    const ns = await nss.create('mem');
    const runner = new TimedRunner(ns, variant === 'iptables-legacy' ? LEGACY_IPTABLES : {}, 900_000);
    const proxier = await getMode(mode).createProxier({ config: benchConfig(mode), log: silentLogger(), runner });
    const keys = new Set([...tracker.state.services.values()].map((sp) => `${sp.portName.namespace}/${sp.portName.name}`));
    await proxier.sync({ state: tracker.state, config: benchConfig(mode), node: NODE }, keys, true);
    runner.take();
    await mark(`${variant} proxier after the first full sync (what it keeps between syncs)`);
    await proxier.stop();
    return steps;
  } finally {
    await nss.deleteAll();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const { values } = parseArgs({ options: { services: { type: 'string', default: '10000' }, endpoints: { type: 'string', default: '5' }, mode: { type: 'string', default: 'iptables-legacy' }, json: { type: 'boolean', default: false } } });
  const mib = (b: number) => `${(b / 2 ** 20).toFixed(1)} MiB`;
  const steps = await memoryBreakdown(Number(values.services), Number(values.endpoints), values.mode as 'iptables');
  if (values.json) {
    console.log(JSON.stringify(steps));
    process.exit(0);
  }
  console.log(`| step | retained heap | growth | RSS |\n|---|---:|---:|---:|`);
  for (const s of steps) console.log(`| ${s.step} | ${mib(s.retained)} | ${mib(s.delta)} | ${mib(s.rss)} |`);
}
