// The iptables mode at scale, side by side with the raw reference in one run:
// - cold start: kproxy's first full sync (IptablesProxier.sync, chunked on nf_tables) into an
//   empty kpb-* namespace, next to a raw *flushing* iptables-restore of the same rendered
//   ruleset (`iptables-restore -w 5 --counters`, no --noflush) into another empty namespace,
//   and, for the record, the raw `--noflush` restore of that one payload (what kproxy did
//   before chunking) where it finishes within the limit;
// - one-Service change: one endpoint added to one service, then IptablesProxier.sync of that
//   service (partial sync), in the namespace the cold start filled; median of --changes;
//   beside it, in that same namespace, the raw floors (median of --changes runs each): an
//   empty `*nat COMMIT` --noflush restore (the process, the cache fetch and, on legacy, the
//   whole-table read and write-back) and a one-chain restore (`:KPB-FLOOR` and one rule: the
//   smallest write, i.e. what the kernel charges for any rule change in that table).
// Per backend: nf_tables (iptables-restore) and legacy (iptables-legacy-restore, via the
// binary renaming bench/netns.ts does, as update-alternatives would on a node).
//
//   sudo node --import tsx bench/iptables-scale.ts [--sizes 100,1000,10000] [--backends nf_tables,legacy]
//        [--endpoints 5] [--changes 7] [--adds 3] [--chunk-lines 5000] [--timeout 600] [--no-noflush-ref]
//
// Prints one markdown table per backend. The machine is shared: medians, and the load average
// is printed with each table. 50,000 services: ClusterIP services above 35,535 (no node
// port left), and no room for extra endpoints, so no change is measured there.
import { loadavg } from 'node:os';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { ProxyStateTracker } from '../src/core/tracker.ts';
import { silentLogger } from '../src/log.ts';
import type { PlanInput } from '../src/core/nodeview.ts';
import { getMode } from '../src/modes/registry.ts';
import { IptablesProxier } from '../src/modes/iptables/proxier.ts';
import { LEGACY_IPTABLES, Namespaces, TimedRunner } from './netns.ts';
import { fmtMs } from './report.ts';
import { benchConfig, MAX_NODE_PORT_SERVICES, NODE, serviceObject, sliceObject } from './workload.ts';

type Backend = 'nf_tables' | 'legacy';

/** N services × E endpoints; services past the node-port range are ClusterIP only. */
class ScaleWorkload {
  readonly tracker = new ProxyStateTracker(4, NODE.nodeName);
  readonly keys: Set<string>;
  readonly stride: number;
  private readonly counts: number[];
  readonly config = benchConfig('iptables');

  constructor(readonly n: number, readonly e: number) {
    // Endpoint addresses come from 10.180.0.0/14 (endpointIPOf): N × stride must fit.
    this.stride = Math.min(e + 4, Math.floor((4 * 65_536 - 2) / n));
    if (this.stride < e) throw new Error(`KPROXY_BENCH_SIZE: ${n} services × ${e} endpoints do not fit 10.180.0.0/14`);
    this.counts = new Array<number>(n).fill(e);
    for (let i = 0; i < n; i++) {
      const s = serviceObject(i);
      if (i >= MAX_NODE_PORT_SERVICES) {
        s.spec!.type = 'ClusterIP';
        for (const p of s.spec!.ports ?? []) delete p.nodePort;
      }
      this.tracker.services.update(null, s);
      this.tracker.endpoints.update(null, sliceObject(i, e, this.stride));
    }
    this.keys = this.tracker.apply();
  }

  input(): PlanInput {
    return { state: this.tracker.state, config: this.config, node: NODE };
  }

  canChange(i: number): boolean {
    return this.counts[i] < this.stride;
  }

  private added = 0;

  /** A new Service (with E endpoints) after the N: its dispatch rules are new. */
  addService(): Set<string> {
    const i = this.n + this.added++;
    const s = serviceObject(i);
    if (i >= MAX_NODE_PORT_SERVICES) {
      s.spec!.type = 'ClusterIP';
      for (const p of s.spec!.ports ?? []) delete p.nodePort;
    }
    this.tracker.services.update(null, s);
    this.tracker.endpoints.update(null, sliceObject(i, this.e, this.stride));
    return this.tracker.apply();
  }

  addEndpoint(i: number): Set<string> {
    const before = sliceObject(i, this.counts[i], this.stride);
    this.counts[i]++;
    this.tracker.endpoints.update(before, sliceObject(i, this.counts[i], this.stride));
    return this.tracker.apply();
  }
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length ? (s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2) : NaN;
};

export interface ScaleRow {
  n: number;
  backend: Backend;
  rules: number;
  rawFlushMs: number;
  rawNoflushMs?: number;
  coldMs: number;
  coldRestores: number;
  /** time inside the first sync's restores, and inside its other commands (probes, saves) */
  coldRestoreMs?: number;
  coldOtherMs?: number;
  coldRules: number;
  changeMs?: number;
  changeAll: number[];
  /** time inside iptables-restore of each change */
  changeRestoreMs: number[];
  /** a new Service each (KUBE-SERVICES and KUBE-NODEPORTS change: the full-scan partial sync) */
  addAll: number[];
  /** raw `--noflush` restores into the filled namespace: `*nat COMMIT` and one chain with one rule */
  floorEmptyMs: number[];
  floorChainMs: number[];
  load: string;
  error?: string;
}

export interface ScaleOptions {
  sizes: number[];
  backends: Backend[];
  endpoints: number;
  changes: number;
  chunkLines?: number;
  timeoutS: number;
  noflushRef: boolean;
  /** one-Service additions measured after the changes (dispatch rules change) */
  adds: number;
}

async function timed(runner: TimedRunner, cmd: string, args: string[], input: string, timeoutMs: number): Promise<number> {
  const t0 = performance.now();
  const r = await runner.run(cmd, args, { input, timeoutMs });
  const ms = performance.now() - t0;
  if (r.code !== 0) return ms >= timeoutMs - 100 ? Number.POSITIVE_INFINITY : Number.NaN;
  return ms;
}

async function countRules(runner: TimedRunner): Promise<number> {
  const r = await runner.run('iptables-save', ['-t', 'nat'], { timeoutMs: 600_000 });
  let n = 0;
  for (const l of r.stdout.split('\n')) if (l.startsWith('-A KUBE-')) n++;
  return n;
}

export async function iptablesScale(o: ScaleOptions, log: (l: string) => void): Promise<ScaleRow[]> {
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const nss = new Namespaces(`${process.pid}i`);
  const rows: ScaleRow[] = [];
  const timeoutMs = o.timeoutS * 1000;
  try {
    for (const n of o.sizes) {
      const w = new ScaleWorkload(n, o.endpoints);
      for (const backend of o.backends) {
        // Rendered per backend: the previous backend's changes and additions are in the state.
        const payload = getMode('iptables').render(w.input());
        let natRules = 0;
        for (let i = payload.indexOf('\n-A KUBE-', payload.indexOf('*nat')); i >= 0; i = payload.indexOf('\n-A KUBE-', i + 1)) natRules++;
        const rename = backend === 'legacy' ? LEGACY_IPTABLES : {};
        const restore = backend === 'legacy' ? 'iptables-legacy-restore' : 'iptables-restore';
        const row: ScaleRow = { n, backend, rules: natRules, rawFlushMs: NaN, coldMs: NaN, coldRestores: 0, coldRules: 0, changeAll: [], changeRestoreMs: [], addAll: [], floorEmptyMs: [], floorChainMs: [], load: loadavg().map((x) => x.toFixed(1)).join(' ') };
        // The raw reference: a flushing restore of the whole payload into an empty namespace.
        let ns = await nss.create('raw');
        try {
          row.rawFlushMs = await timed(new TimedRunner(ns), restore, ['-w', '5', '--counters'], payload, timeoutMs);
        } finally {
          await nss.delete(ns);
        }
        log(`N=${n} ${backend}: raw flushing restore ${fmtMs(row.rawFlushMs)}`);
        if (o.noflushRef) {
          ns = await nss.create('nf');
          try {
            row.rawNoflushMs = await timed(new TimedRunner(ns), restore, ['-w', '5', '--noflush', '--counters'], payload, timeoutMs);
          } finally {
            await nss.delete(ns);
          }
          log(`N=${n} ${backend}: raw --noflush restore ${fmtMs(row.rawNoflushMs)}`);
        }
        // kproxy: the first full sync, then one-service changes, in one namespace.
        ns = await nss.create('kp');
        try {
          const runner = new TimedRunner(ns, rename, timeoutMs);
          const p = new IptablesProxier({ runner, log: silentLogger(), config: w.config, chunkLines: o.chunkLines });
          const t0 = performance.now();
          try {
            await p.sync(w.input(), w.keys, true);
            row.coldMs = performance.now() - t0;
            const coldRan = runner.records;
            row.coldRestores = coldRan.filter((r) => r.cmd === 'iptables-restore').length;
            row.coldRestoreMs = coldRan.filter((r) => r.cmd === 'iptables-restore').reduce((a, r) => a + r.ms, 0);
            row.coldOtherMs = coldRan.filter((r) => r.cmd !== 'iptables-restore').reduce((a, r) => a + r.ms, 0);
            log(`N=${n} ${backend}: first sync: ${row.coldRestores} restores ${fmtMs(row.coldRestoreMs)}, other commands ${fmtMs(row.coldOtherMs)} (${coldRan.filter((r) => r.cmd !== 'iptables-restore').map((r) => `${r.cmd} ${r.args.join(' ')} ${fmtMs(r.ms)}`).join('; ')}), in-process ${fmtMs(row.coldMs - row.coldRestoreMs - row.coldOtherMs)}`);
            row.coldRules = await countRules(runner);
            log(`N=${n} ${backend}: kproxy first sync ${fmtMs(row.coldMs)} in ${row.coldRestores} restores, ${row.coldRules} nat rules in the kernel (payload ${natRules})`);
            for (let k = 0; k < o.changes; k++) {
              const i = Math.floor(((k + 0.5) / o.changes) * n) % n;
              if (!w.canChange(i)) break;
              const changed = w.addEndpoint(i);
              runner.take();
              const t1 = performance.now();
              await p.sync(w.input(), changed, false);
              row.changeAll.push(performance.now() - t1);
              const ran = runner.take();
              row.changeRestoreMs.push(ran.filter((r) => r.cmd.endsWith('-restore')).reduce((a, r) => a + r.ms, 0));
              log(`  change ${k}: ${fmtMs(row.changeAll[k])}: ${ran.map((r) => `${r.cmd} ${r.args.filter((a) => a.startsWith('-') && a !== '-w').join(' ')} ${fmtMs(r.ms)}`).join('; ')}`);
            }
            if (row.changeAll.length) row.changeMs = median(row.changeAll);
            for (let k = 0; k < o.adds; k++) {
              const changed = w.addService();
              runner.take();
              const t1 = performance.now();
              await p.sync(w.input(), changed, false);
              row.addAll.push(performance.now() - t1);
              const ran = runner.take();
              log(`  service add ${k}: ${fmtMs(row.addAll[k])}: ${ran.map((r) => `${r.cmd} ${fmtMs(r.ms)} in=${r.inputBytes}`).join('; ')}`);
            }
            // The floors, in the same namespace (kproxy's rules in place): a chain of no one's.
            const floorArgs = ['-w', '5', '--noflush', '--counters'];
            for (let k = 0; k < Math.max(3, o.changes); k++) {
              row.floorEmptyMs.push(await timed(runner, 'iptables-restore', floorArgs, '*nat\nCOMMIT\n', timeoutMs));
              row.floorChainMs.push(await timed(runner, 'iptables-restore', floorArgs, `*nat\n:KPB-FLOOR - [0:0]\n-A KPB-FLOOR -m comment --comment "floor ${k}" -j RETURN\nCOMMIT\n`, timeoutMs));
            }
            log(`N=${n} ${backend}: raw floors: empty commit ${row.floorEmptyMs.map((x) => fmtMs(x)).join(', ')}; one chain ${row.floorChainMs.map((x) => fmtMs(x)).join(', ')}`);
            log(`N=${n} ${backend}: one-service change ${row.changeAll.map((x) => fmtMs(x)).join(', ')}`);
          } catch (e) {
            row.error = (e as Error).message.split('\n')[0].slice(0, 200);
            row.coldMs = performance.now() - t0;
            log(`N=${n} ${backend}: failed: ${row.error}`);
          }
        } finally {
          await nss.delete(ns);
        }
        rows.push(row);
      }
    }
  } finally {
    await nss.deleteAll();
  }
  return rows;
}

const cell = (ms: number | undefined) => (ms === undefined ? '–' : ms === Number.POSITIVE_INFINITY ? 'timeout' : Number.isNaN(ms) ? 'failed' : fmtMs(ms));

/** Median of the runs that worked, and how many failed (e.g. the host-wide xtables lock taken for longer than -w 5). */
function floorCell(xs: number[]): string {
  const ok = xs.filter(Number.isFinite);
  if (!xs.length) return '–';
  return `${ok.length ? cell(median(ok)) : 'failed'}${ok.length < xs.length ? ` (${xs.length - ok.length} failed)` : ''}`;
}

export function scaleTable(rows: ScaleRow[], backend: Backend): string {
  const out = [
    `| services (N) | nat rules | raw flushing restore | raw --noflush restore (one payload) | kproxy first sync (restores) | ratio to raw flushing | one-service change (median) | of which iptables-restore | of which kproxy | raw floor: empty commit | raw floor: one chain | Service added (median) | load |`,
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|',
  ];
  for (const r of rows.filter((x) => x.backend === backend)) {
    const ratio = r.error ? '–' : (r.coldMs / r.rawFlushMs).toFixed(2) + '×';
    const cold = r.error ? `failed after ${cell(r.coldMs)}` : `${cell(r.coldMs)} (${r.coldRestores})`;
    out.push(`| ${r.n.toLocaleString('en-US')} | ${r.rules.toLocaleString('en-US')} | ${cell(r.rawFlushMs)} | ${cell(r.rawNoflushMs)} | ${cold} | ${ratio} | ${cell(r.changeMs)} | ${r.changeRestoreMs.length ? cell(median(r.changeRestoreMs)) : '–'} | ${r.changeAll.length ? cell(median(r.changeAll.map((x, i) => x - r.changeRestoreMs[i]))) : '–'} | ${floorCell(r.floorEmptyMs)} | ${floorCell(r.floorChainMs)} | ${r.addAll.length ? cell(median(r.addAll)) : '–'} | ${r.load} |`);
  }
  return out.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      sizes: { type: 'string', default: '100,1000,10000' },
      backends: { type: 'string', default: 'nf_tables,legacy' },
      endpoints: { type: 'string', default: '5' },
      changes: { type: 'string', default: '7' },
      'chunk-lines': { type: 'string' },
      timeout: { type: 'string', default: '600' },
      'no-noflush-ref': { type: 'boolean', default: false },
      adds: { type: 'string', default: '3' },
    },
  });
  const sizes = values.sizes!.split(',').map(Number);
  if (sizes.some((n) => !Number.isInteger(n) || n < 1)) throw new Error('KPROXY_BENCH_ARGS: --sizes wants positive integers');
  const backends = values.backends!.split(',') as Backend[];
  if (backends.some((b) => b !== 'nf_tables' && b !== 'legacy')) throw new Error('KPROXY_BENCH_ARGS: --backends is nf_tables and/or legacy');
  const rows = await iptablesScale(
    {
      sizes,
      backends,
      endpoints: Number(values.endpoints),
      changes: Number(values.changes),
      chunkLines: values['chunk-lines'] === undefined ? undefined : Number(values['chunk-lines']),
      timeoutS: Number(values.timeout),
      noflushRef: !values['no-noflush-ref'],
      adds: Number(values.adds),
    },
    (l) => process.stderr.write(l + '\n'),
  );
  for (const b of backends) process.stdout.write(`\n${b}:\n\n${scaleTable(rows, b)}\n`);
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
