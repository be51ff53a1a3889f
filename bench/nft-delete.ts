// A deleted Service in the nftables mode, side by side in one run: two NftProxiers over the
// same state, each with its own kproxy table (its own cold start, a fresh kpb-* namespace):
//   deferred  (the default): the Service's dispatch elements and ClusterIP linger, harmless,
//             and go later with its retired chains (an idle sync: timed too, as "cleanup");
//   at once   (deferElementDeletes: false, as before): its elements go with `delete element`
//             in the partial sync, which makes nft 1.0.6 list every chain of the table.
// Per repetition one Service is deleted (the same for both; which proxier syncs first
// alternates), medians of --reps. The load average (1 min) is printed beside each size.
//
//   sudo node --import tsx bench/nft-delete.ts [--sizes 100,10000] [--endpoints 5] [--reps 7] [--timeout 300]
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { ProxyStateTracker } from '../src/core/tracker.ts';
import { silentLogger } from '../src/log.ts';
import type { PlanInput } from '../src/core/nodeview.ts';
import { NftProxier } from '../src/modes/nftables/proxier.ts';
import { Namespaces, TimedRunner } from './netns.ts';
import { fmtMs, median } from './stats.ts';
import { benchConfig, NODE, serviceObject, sliceObject } from './workload.ts';

interface DeleteRow {
  n: number;
  coldMs: { deferred: number; atOnce: number };
  deferredMs: number[];
  cleanupMs: number[];
  atOnceMs: number[];
  load: string;
}

export async function nftDelete(o: { sizes: number[]; endpoints: number; reps: number; timeoutS: number }, log: (l: string) => void): Promise<DeleteRow[]> {
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const nss = new Namespaces(`${process.pid}d`);
  const rows: DeleteRow[] = [];
  try {
    for (const n of o.sizes) {
      const tracker = new ProxyStateTracker(4, NODE.nodeName);
      for (let i = 0; i < n; i++) {
        tracker.services.update(null, serviceObject(i));
        tracker.endpoints.update(null, sliceObject(i, o.endpoints, o.endpoints));
      }
      const all = tracker.apply();
      const input: PlanInput = { state: tracker.state, config: benchConfig('nftables'), node: NODE };
      const make = async (deferElementDeletes: boolean) => {
        const ns = await nss.create(deferElementDeletes ? 'dd' : 'dn');
        const runner = new TimedRunner(ns, {}, o.timeoutS * 1000);
        const p = new NftProxier({ runner, log: silentLogger(), deferElementDeletes, staleChainDelayMs: 0, staleChainBatchMs: 0 });
        const t0 = performance.now();
        await p.sync(input, all, true);
        return { ns, p, coldMs: performance.now() - t0 };
      };
      const deferred = await make(true);
      const atOnce = await make(false);
      const row: DeleteRow = { n, coldMs: { deferred: deferred.coldMs, atOnce: atOnce.coldMs }, deferredMs: [], cleanupMs: [], atOnceMs: [], load: os.loadavg()[0].toFixed(1) };
      log(`N=${n}: cold starts ${fmtMs(deferred.coldMs)} / ${fmtMs(atOnce.coldMs)} (load ${row.load})`);
      for (let c = 0; c < o.reps; c++) {
        const i = Math.floor((n * (c + 1)) / (o.reps + 1));
        tracker.services.update(serviceObject(i), null);
        tracker.endpoints.update(sliceObject(i, o.endpoints, o.endpoints), null);
        const changed = tracker.apply();
        const timed = async (p: NftProxier, ch: Set<string>) => {
          const t0 = performance.now();
          await p.sync(input, ch, false);
          return performance.now() - t0;
        };
        const order = c % 2 ? [atOnce, deferred] : [deferred, atOnce];
        for (const x of order) (x === deferred ? row.deferredMs : row.atOnceMs).push(await timed(x.p, changed));
        if (deferred.p.lingeringElements().length === 0) throw new Error('KPROXY_BENCH_DELETE: nothing lingers after the deferred deletion');
        // The later cleanup (idle sync): the lingering elements, then the retired chains; for
        // the other proxier its retired chains (not timed).
        row.cleanupMs.push(await timed(deferred.p, new Set()));
        await atOnce.p.sync(input, new Set(), false);
        if (deferred.p.lingeringElements().length !== 0) throw new Error('KPROXY_BENCH_DELETE: the idle sync left elements');
      }
      row.load += ` / ${os.loadavg()[0].toFixed(1)}`;
      log(`N=${n}: Service deleted: deferred ${fmtMs(median(row.deferredMs))} (cleanup later ${fmtMs(median(row.cleanupMs))}), at once ${fmtMs(median(row.atOnceMs))}; load ${row.load}`);
      rows.push(row);
      await nss.delete(deferred.ns);
      await nss.delete(atOnce.ns);
    }
  } finally {
    await nss.deleteAll();
  }
  return rows;
}

export function deleteTable(rows: DeleteRow[]): string {
  const L = [
    '| services × 5 endpoints | Service deleted, deferred (ms) | its cleanup later: idle sync (ms) | Service deleted, `delete element` at once (ms) | load (1 min) |',
    '|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) L.push(`| ${r.n.toLocaleString('en-US')} | ${fmtMs(median(r.deferredMs))} | ${fmtMs(median(r.cleanupMs))} | ${fmtMs(median(r.atOnceMs))} | ${r.load} |`);
  return L.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      sizes: { type: 'string', default: '100,10000' },
      endpoints: { type: 'string', default: '5' },
      reps: { type: 'string', default: '7' },
      timeout: { type: 'string', default: '300' },
    },
  });
  const o = { sizes: values.sizes!.split(',').map(Number), endpoints: Number(values.endpoints), reps: Number(values.reps), timeoutS: Number(values.timeout) };
  if (o.sizes.some((n) => !Number.isInteger(n) || n < o.reps + 1 || n > 30_000)) throw new Error('KPROXY_BENCH_ARGS: --sizes wants integers from reps+1 to 30000');
  const started = new Date().toISOString();
  const load = os.loadavg().map((x) => x.toFixed(1)).join(' ');
  const rows = await nftDelete(o, (l) => process.stderr.write(l + '\n'));
  process.stdout.write(`nft-delete, ${started}, ${os.cpus().length} CPUs, load average at start ${load}, at end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}\n\n${deleteTable(rows)}\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
