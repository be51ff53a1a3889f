// kproxy's own path from a manifest write to the Proxier.sync call, at N Services × E
// endpoints, with a fake proxier (no kernel): what `kproxy run --manifests DIR` does between
// the file system and the mode, wired as run.ts wires it (ProxyController + the metrics
// server attached + the manifests source), timed step by step.
//
//   node --import tsx bench/manifest-path.ts [--sizes 100,1000,10000] [--endpoints 5] [--changes 20]
//
// Per size: the initial load (source start → "sources synced"), then --changes one-slice
// changes, each a small file renamed into place, one at a time (the next after the sync):
//   write → delivered   the watch event, the debounce (50 ms), the scan and the parse, up to
//                        the handler's call for the changed object
//   delivered → queued  the trackers (validation, ServicePorts / endpoints) and queueSync
//   queued → sync call  the sync loop's timer, the trackers' apply, the node view, to the
//                        Proxier.sync call (minSyncPeriod 1 ms: the coalescing delay is not kproxy's cost)
// Medians, and the load average beside them.
import { mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import pino from 'pino';
import { resolveConfig } from '../src/config/config.ts';
import type { ModeModule, Proxier } from '../src/modes/types.ts';
import type { PlanInput } from '../src/core/nodeview.ts';
import { startServers } from '../src/server/servers.ts';
import { ManifestsSource } from '../src/sources/manifests.ts';
import type { SourceHandler } from '../src/sources/types.ts';
import { ProxyController } from '../src/sync/controller.ts';
import type { CommandRunner } from '../src/kernel/runner.ts';
import { hotServices, writeManifests } from './kproxy-run.ts';
import { median } from './stats.ts';
import { NODE, serviceName, sliceObject } from './workload.ts';

export interface PathResult {
  n: number;
  loadMs: number;
  firstSyncCallMs: number;
  changes: Array<{ writeToDelivered: number; deliveredToQueued: number; queuedToSync: number; total: number }>;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

async function until<T>(what: string, f: () => T | undefined, timeoutMs: number): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (let i = 0; i < 1_000_000 && performance.now() < deadline; i++) {
    const v = f();
    if (v !== undefined) return v;
    await sleep(1);
  }
  throw new Error(`KPROXY_BENCH_RUN: timed out waiting for ${what}`);
}

export async function manifestPath(n: number, endpoints: number, changes: number, timeoutMs = 300_000): Promise<PathResult> {
  const dir = mkdtempSync(join(tmpdir(), 'kpb-path-'));
  const hot = hotServices(n);
  writeManifests(dir, n, endpoints, hot);
  const stride = endpoints + 16;
  const syncCalls: number[] = [];
  const proxier: Proxier = {
    sync: async () => {
      syncCalls.push(performance.now());
      return { rulesWritten: 0, rulesTotal: 0 };
    },
    dump: () => '',
    stop: async () => {},
  };
  const mode = { name: 'iptables', render: () => '', cleanup: async () => {}, createProxier: async () => proxier } as unknown as ModeModule;
  const config = resolveConfig({ mode: 'iptables', minSyncPeriod: '1ms', clusterCIDR: '10.0.0.0/8' } as never);
  const log = pino({ level: 'silent' });
  const runner = { run: async () => ({ code: 0, stdout: '', stderr: '' }) } as unknown as CommandRunner;
  // The source, with its handler wrapped: when the changed object reaches it, and when the trackers are done.
  const source = new ManifestsSource({ dir, nodeName: NODE.nodeName, log, pollMs: 3_600_000 });
  let watchFor: string | null = null;
  let delivered = 0;
  let queued = 0;
  const start = source.start.bind(source);
  source.start = (h: SourceHandler) =>
    start({
      ...h,
      onEndpointSlice: (o, s) => {
        const hit = watchFor !== null && s?.metadata?.name === watchFor;
        if (hit) delivered = performance.now();
        h.onEndpointSlice(o, s);
        if (hit) queued = performance.now();
      },
    });
  const ctrl = new ProxyController({ config, nodeName: NODE.nodeName, mode, allModes: { iptables: mode } as never, source, sourceName: 'manifests', runner, log, skipCleanup: true, nodeIPs: () => NODE.nodeIPs, families: [4] });
  const servers = await startServers({ ctrl, source, mode: 'iptables', log }, '', '');
  const res: PathResult = { n, loadMs: NaN, firstSyncCallMs: NaN, changes: [] };
  try {
    const t0 = performance.now();
    await ctrl.start();
    res.loadMs = performance.now() - t0;
    await until('the first sync', () => syncCalls[0], timeoutMs);
    res.firstSyncCallMs = syncCalls[0] - t0;
    await until('the first sync to end', () => (ctrl.history.length ? true : undefined), timeoutMs);
    const count = new Map<number, number>();
    for (let k = 0; k < changes; k++) {
      const i = hot[k % hot.length];
      const c = (count.get(i) ?? endpoints) + 1;
      if (c > stride) break;
      count.set(i, c);
      const slice = sliceObject(i, c, stride);
      watchFor = (slice.metadata as { name: string }).name;
      delivered = queued = 0;
      const calls = syncCalls.length;
      const tmp = join(dir, `.tmp-${serviceName(i)}`);
      writeFileSync(tmp, `---\n${JSON.stringify(slice)}\n`);
      const tw = performance.now();
      renameSync(tmp, join(dir, `hot-${serviceName(i)}.yaml`));
      const ts = await until(`change ${k + 1}`, () => syncCalls[calls], 30_000);
      res.changes.push({ writeToDelivered: delivered - tw, deliveredToQueued: queued - delivered, queuedToSync: ts - queued, total: ts - tw });
      await ctrl.loop.idle(30_000);
      await sleep(20);
    }
    return res;
  } finally {
    await ctrl.stop();
    await servers.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const { values } = parseArgs({ options: { sizes: { type: 'string', default: '100,1000,10000' }, endpoints: { type: 'string', default: '5' }, changes: { type: 'string', default: '20' } } });
  const load = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
  const ms = (x: number) => (x >= 1000 ? `${(x / 1000).toFixed(2)} s` : `${x.toFixed(1)} ms`);
  console.log(`manifest write → Proxier.sync call (fake proxier, minSyncPeriod 1 ms), ${values.endpoints} endpoints per Service; medians of ${values.changes} changes\n`);
  console.log('| N | initial load | first sync called | write → delivered | delivered → queued | queued → sync call | write → sync call (p50 / max) | load avg |');
  console.log('|---:|---:|---:|---:|---:|---:|---:|---|');
  for (const n of values.sizes!.split(',').map(Number)) {
    const r = await manifestPath(n, Number(values.endpoints), Number(values.changes));
    const m = (f: (c: PathResult['changes'][number]) => number) => median(r.changes.map(f));
    console.log(`| ${n.toLocaleString('en')} | ${ms(r.loadMs)} | ${ms(r.firstSyncCallMs)} | ${ms(m((c) => c.writeToDelivered))} | ${ms(m((c) => c.deliveredToQueued))} | ${ms(m((c) => c.queuedToSync))} | ${ms(m((c) => c.total))} / ${ms(Math.max(...r.changes.map((c) => c.total)))} | ${load()} |`);
  }
}
