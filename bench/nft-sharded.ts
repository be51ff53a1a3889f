// The sharded nftables mode against the single table, in one run: for each size,
// in fresh kpb-* namespaces, interleaved per repetition,
//   - "one table": the mode's proxier with K forced to 1 (threshold above any size), i.e.
//     upstream's single `kube-proxy` table as before;
//   - "sharded": the mode's proxier as it ships (K = 1 below 1,000 Services, else
//     ~N/600 tables, at most 16);
// each: the cold start (sync(full), and its `nft -f` part), then --changes one-Service changes
// (one endpoint added to one Service, sync(partial): wall time and its `nft -f` part), then
// up to 3 Services deleted. Each sync gets the node view the controller would build (full at
// the start, then incremental: the change's time includes it). The load average (1 min) is
// printed with each size.
//
//   node --import tsx bench/nft-sharded.ts [--sizes 100,1000,10000] [--reps 3] [--changes 7] [--timeout 300]
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { buildNodeView } from '../src/core/nodeview.ts';
import { silentLogger } from '../src/log.ts';
import { NftProxier } from '../src/modes/nftables/proxier.ts';
import { execMs, isWrite, Namespaces, TimedRunner } from './netns.ts';
import { ScaleWorkload } from './nft-scale.ts';
import { fmtMs, median } from './report.ts';

const VARIANTS = [
  { name: 'one table', shards: { threshold: Number.MAX_SAFE_INTEGER } },
  { name: 'sharded', shards: {} },
] as const;

interface Cell {
  tables: number;
  coldMs: number[];
  coldNftMs: number[];
  changeMs: number[];
  changeNftMs: number[];
  deleteMs: number[];
  load: number[];
}

interface Options {
  sizes: number[];
  reps: number;
  changes: number;
  timeoutS: number;
}

export async function nftSharded(o: Options, log: (l: string) => void): Promise<Map<string, Cell>> {
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const nss = new Namespaces(`${process.pid}s`);
  const cells = new Map<string, Cell>();
  try {
    for (const n of o.sizes) {
      for (let rep = 0; rep < o.reps; rep++) {
        for (const v of VARIANTS) {
          // a fresh workload per run: the changes add endpoints
          const w = new ScaleWorkload(n, 5, o.changes + 3);
          const key = `${n} ${v.name}`;
          const cell = cells.get(key) ?? { tables: 0, coldMs: [], coldNftMs: [], changeMs: [], changeNftMs: [], deleteMs: [], load: [] };
          cells.set(key, cell);
          const ns = await nss.create('ks');
          try {
            const runner = new TimedRunner(ns, {}, o.timeoutS * 1000);
            const proxier = new NftProxier({ runner, log: silentLogger(), shards: v.shards });
            // the node view as the controller builds it (planInput): full, then per change
            // incremental (the sharded proxier takes the Service count and each changed
            // Service's ports from it)
            let view = buildNodeView(w.input('nftables'));
            const inputOf = (changed?: Set<string>) => {
              const input = w.input('nftables');
              view = changed ? buildNodeView(input, view, { services: changed, portKeysOf: (k) => w.tracker.services.portKeysOf(k) }) : view;
              return { ...input, view };
            };
            const t0 = performance.now();
            await proxier.sync(inputOf(), new Set(), true);
            cell.coldMs.push(performance.now() - t0);
            cell.coldNftMs.push(execMs(runner.take(), isWrite));
            cell.tables = proxier.shardCount;
            cell.load.push(os.loadavg()[0]);
            for (let c = 0; c < o.changes; c++) {
              const changed = w.addEndpoint(Math.floor((n * (c + 1)) / (o.changes + 1)));
              const t1 = performance.now();
              await proxier.sync(inputOf(changed), changed, false);
              cell.changeMs.push(performance.now() - t1);
              cell.changeNftMs.push(execMs(runner.take(), isWrite));
            }
            for (let c = 0; c < Math.min(3, o.changes); c++) {
              const changed = w.deleteService(Math.floor((n * (2 * c + 1)) / (2 * o.changes + 2)));
              const t1 = performance.now();
              await proxier.sync(inputOf(changed), changed, false);
              cell.deleteMs.push(performance.now() - t1);
              runner.take();
            }
            log(`N=${n} rep ${rep} ${v.name} (K=${cell.tables}): cold ${fmtMs(cell.coldMs.at(-1))} ms, change median so far ${fmtMs(median(cell.changeMs))} ms, load ${os.loadavg()[0].toFixed(1)}`);
            await proxier.stop();
          } finally {
            await nss.delete(ns);
          }
        }
      }
    }
  } finally {
    await nss.deleteAll();
  }
  return cells;
}

export function shardedTable(cells: Map<string, Cell>, sizes: number[]): string {
  const m = (xs: number[]) => (xs.length ? fmtMs(median(xs)) : '–');
  const lines = [
    '| services × 5 endpoints | proxier | tables | cold start (ms) | of which nft -f (ms) | one-Service change (ms) | ÷ same proxier at the smallest size | of which nft -f (ms) | Service deleted (ms) | load (1 min) |',
    '|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const v of VARIANTS) {
    const base = cells.get(`${sizes[0]} ${v.name}`);
    for (const n of sizes) {
      const c = cells.get(`${n} ${v.name}`);
      if (!c) continue;
      const ratio = base ? median(c.changeMs) / median(base.changeMs) : NaN;
      const load = `${Math.min(...c.load).toFixed(1)}–${Math.max(...c.load).toFixed(1)}`;
      lines.push(`| ${n.toLocaleString('en-US')} | ${v.name} | ${c.tables} | ${m(c.coldMs)} | ${m(c.coldNftMs)} | ${m(c.changeMs)} | ${ratio.toFixed(1)}× | ${m(c.changeNftMs)} | ${m(c.deleteMs)} | ${load} |`);
    }
  }
  return lines.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      sizes: { type: 'string', default: '100,1000,10000' },
      reps: { type: 'string', default: '3' },
      changes: { type: 'string', default: '7' },
      timeout: { type: 'string', default: '300' },
    },
  });
  const o: Options = { sizes: values.sizes!.split(',').map(Number), reps: Number(values.reps), changes: Number(values.changes), timeoutS: Number(values.timeout) };
  if (o.sizes.some((n) => !Number.isInteger(n) || n < 1)) throw new Error('KPROXY_BENCH_ARGS: --sizes wants positive integers');
  const started = new Date().toISOString();
  const load = os.loadavg().map((x) => x.toFixed(1)).join(' ');
  const cells = await nftSharded(o, (l) => process.stderr.write(l + '\n'));
  process.stdout.write(`nft-sharded, ${started}, ${os.cpus().length} CPUs, load average at start ${load}, at end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}\n\n`);
  process.stdout.write(shardedTable(cells, o.sizes) + '\n');
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
