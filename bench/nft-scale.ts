// The nftables mode at scale, side by side with the raw references in one run, each apply
// into a fresh kpb-* namespace:
//   - raw `iptables-restore` (flushing, nf_tables backend) of the iptables mode's ruleset for
//     the same state: the reference for the cold start;
//   - raw `nft -f` of kproxy's nftables table (what the cold start writes), and of the same
//     table in upstream's shape (one anonymous numgen map per service) up to --upstream-max;
//   - kproxy's cold start: NftProxier.sync(full) wall time (planning + nft), and its nft part;
//   - one-Service change: one endpoint added to one Service, then NftProxier.sync(partial)
//     (the manifest → rules-in-the-kernel path minus the source), median of --changes.
//
//   node --import tsx bench/nft-scale.ts [--quick] [--sizes 100,1000,10000,50000] [--endpoints 5]
//        [--reps 3] [--changes 7] [--upstream-max 2000] [--iptables-max 20000] [--timeout 300]
//
// --quick: sizes 100,1000,10000, one cold start each, 5 changes, upstream shape up to 1000.
// Services past 35,535 have no NodePort (the port range is full). Prints a markdown table.
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { ProxyStateTracker } from '../src/core/tracker.ts';
import type { K8sService } from '../src/core/convert.ts';
import { silentLogger } from '../src/log.ts';
import type { PlanInput } from '../src/modes/types.ts';
import { getMode } from '../src/proxy/registry.ts';
import { dumpRuleset } from '../src/modes/nftables/ruleset.ts';
import { optionsFromInput, planRuleset } from '../src/modes/nftables/plan.ts';
import { expandSelection } from '../src/modes/nftables/selection.ts';
import { execMs, isWrite, Namespaces, TimedRunner } from './netns.ts';
import { benchConfig, MAX_NODE_PORT_SERVICES, NODE, serviceObject, sliceObject } from './workload.ts';
import { fmtMs, median } from './report.ts';

/** N services × E endpoints (room for `extra` more each), built through the tracker as a sync would see them. */
class ScaleWorkload {
  readonly tracker = new ProxyStateTracker(4, NODE.nodeName);
  private readonly counts: number[];
  private readonly stride: number;

  constructor(
    readonly n: number,
    e: number,
    extra: number,
  ) {
    this.stride = e + extra;
    // endpointIPOf() counts up from 10.180.0.1 inside the pod range 10.0.0.0/8
    if (n * this.stride > 75 * 65_536) throw new Error('KPROXY_BENCH_SIZE: too many endpoints for 10.180.0.0-10.255.255.255');
    if (n > 65_000) throw new Error('KPROXY_BENCH_SIZE: at most 65,000 services (ClusterIPs in 172.30.0.0/16)');
    this.counts = new Array<number>(n).fill(e);
    for (let i = 0; i < n; i++) {
      this.tracker.services.update(null, this.service(i));
      this.tracker.endpoints.update(null, sliceObject(i, e, this.stride));
    }
    this.tracker.apply();
  }

  private service(i: number): K8sService {
    const s = serviceObject(i);
    if (i < MAX_NODE_PORT_SERVICES) return s;
    return { ...s, spec: { ...s.spec!, type: 'ClusterIP', ports: s.spec!.ports!.map(({ nodePort: _, ...p }) => p) } };
  }

  input(mode: 'nftables' | 'iptables'): PlanInput {
    return { state: this.tracker.state, config: benchConfig(mode), node: NODE };
  }

  addEndpoint(i: number): Set<string> {
    const before = sliceObject(i, this.counts[i], this.stride);
    this.counts[i]++;
    if (this.counts[i] > this.stride) throw new Error('KPROXY_BENCH_WORKLOAD: service ran out of endpoint addresses');
    this.tracker.endpoints.update(before, sliceObject(i, this.counts[i], this.stride));
    return this.tracker.apply();
  }
}

interface Row {
  n: number;
  objects: number;
  rawIptablesMs: number[];
  rawNftMs: number[];
  rawUpstreamShapeMs: number[];
  coldMs: number[];
  coldNftMs: number[];
  changeMs: number[];
  changeNftMs: number[];
  changeCommands: number[];
  /** `nft -f` of one cluster-ips element into the table: the floor of any transaction */
  floorMs: number[];
}

async function timedApply(nss: Namespaces, cmd: string, args: string[], payload: string, timeoutS: number): Promise<number> {
  const ns = await nss.create('raw');
  try {
    const t0 = performance.now();
    const r = await new TimedRunner(ns).run(cmd, args, { input: payload, timeoutMs: timeoutS * 1000 }).catch(() => null);
    const ms = performance.now() - t0;
    // The runner throws (or nft exits non-zero) when killed at the limit.
    if (!r || r.code !== 0) return ms >= timeoutS * 1000 ? Number.POSITIVE_INFINITY : Number.NaN;
    return ms;
  } finally {
    await nss.delete(ns);
  }
}

export interface ScaleOptions {
  sizes: number[];
  endpoints: number;
  reps: number;
  changes: number;
  upstreamMax: number;
  /** raw iptables-restore only up to this many services (it takes minutes past 10,000 here) */
  iptablesMax: number;
  timeoutS: number;
}

export async function nftScale(o: ScaleOptions, log: (l: string) => void): Promise<Row[]> {
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const nss = new Namespaces(`${process.pid}n`);
  const rows: Row[] = [];
  try {
    for (const n of o.sizes) {
      const w = new ScaleWorkload(n, o.endpoints, o.changes + 1);
      const nftInput = w.input('nftables');
      const rs = planRuleset(nftInput.state, optionsFromInput(nftInput));
      const nftText = dumpRuleset(rs);
      const iptText = n <= o.iptablesMax ? getMode('iptables').render(w.input('iptables')) : null;
      const upstreamText = n <= o.upstreamMax ? dumpRuleset(expandSelection(rs)) : null;
      const row: Row = {
        n,
        objects: nftText.split('\n').length - 1,
        rawIptablesMs: [],
        rawNftMs: [],
        rawUpstreamShapeMs: [],
        coldMs: [],
        coldNftMs: [],
        changeMs: [],
        changeNftMs: [],
        changeCommands: [],
        floorMs: [],
      };
      const reps = n >= 50_000 ? 1 : o.reps;
      for (let rep = 0; rep < reps; rep++) {
        // Interleaved, so load on the shared machine hits every column alike.
        if (iptText !== null) {
          row.rawIptablesMs.push(await timedApply(nss, 'iptables-restore', ['-w', '5', '--counters'], iptText, o.timeoutS));
          log(`N=${n} rep ${rep}: raw iptables-restore ${fmtMs(row.rawIptablesMs.at(-1))} ms`);
        }
        row.rawNftMs.push(await timedApply(nss, 'nft', ['-f', '-'], nftText, o.timeoutS));
        log(`N=${n} rep ${rep}: raw nft -f (kproxy's table) ${fmtMs(row.rawNftMs.at(-1))} ms`);
        if (upstreamText) {
          row.rawUpstreamShapeMs.push(await timedApply(nss, 'nft', ['-f', '-'], upstreamText, o.timeoutS));
          log(`N=${n} rep ${rep}: raw nft -f (upstream's shape) ${fmtMs(row.rawUpstreamShapeMs.at(-1))} ms`);
        }
        const ns = await nss.create('kp');
        try {
          const runner = new TimedRunner(ns, {}, o.timeoutS * 1000);
          const proxier = await getMode('nftables').createProxier({ config: nftInput.config, runner, log: silentLogger(), family: 4 });
          runner.take();
          const t0 = performance.now();
          await proxier.sync(w.input('nftables'), new Set(), true);
          row.coldMs.push(performance.now() - t0);
          row.coldNftMs.push(execMs(runner.take(), isWrite));
          log(`N=${n} rep ${rep}: kproxy cold start ${fmtMs(row.coldMs.at(-1))} ms (nft ${fmtMs(row.coldNftMs.at(-1))} ms)`);
          if (rep === 0) {
            for (let c = 0; c < o.changes; c++) {
              const changed = w.addEndpoint(Math.floor((n * (c + 1)) / (o.changes + 1)));
              const t1 = performance.now();
              const stats = await proxier.sync(w.input('nftables'), changed, false);
              row.changeMs.push(performance.now() - t1);
              row.changeNftMs.push(execMs(runner.take(), isWrite));
              row.changeCommands.push(stats.rulesWritten);
            }
            for (let c = 0; c < o.changes; c++) {
              const t2 = performance.now();
              const verb = c % 2 === 0 ? 'add' : 'delete';
              const r = await runner.run('nft', ['-f', '-'], { input: `${verb} element ip kube-proxy cluster-ips { 172.31.255.1 }\n`, timeoutMs: 60_000 });
              if (r.code === 0) row.floorMs.push(performance.now() - t2);
            }
            runner.take();
            log(`N=${n}: one-Service change median ${fmtMs(median(row.changeMs))} ms (nft ${fmtMs(median(row.changeNftMs))} ms, ${median(row.changeCommands)} commands); one-element nft -f ${fmtMs(median(row.floorMs))} ms`);
          }
          await proxier.stop();
        } finally {
          await nss.delete(ns);
        }
      }
      rows.push(row);
    }
  } finally {
    await nss.deleteAll();
  }
  return rows;
}

export function scaleTable(rows: Row[]): string {
  const m = (xs: number[]) => (xs.length ? fmtMs(median(xs)) : '–');
  const lines = [
    '| services × 5 endpoints | nft objects | raw iptables-restore, flushing (ms) | raw nft -f, kproxy table (ms) | raw nft -f, upstream shape (ms) | kproxy cold start (ms) | of which nft (ms) | cold ÷ raw iptables | one-Service change (ms) | of which nft (ms) | commands | one-element nft -f (ms) |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) {
    const ratio = median(r.coldMs) / median(r.rawIptablesMs);
    lines.push(
      `| ${r.n.toLocaleString('en-US')} | ${r.objects.toLocaleString('en-US')} | ${m(r.rawIptablesMs)} | ${m(r.rawNftMs)} | ${m(r.rawUpstreamShapeMs)} | ${m(r.coldMs)} | ${m(r.coldNftMs)} | ${Number.isFinite(ratio) ? ratio.toFixed(2) : '–'} | ${m(r.changeMs)} | ${m(r.changeNftMs)} | ${r.changeCommands.length ? median(r.changeCommands) : '–'} | ${m(r.floorMs)} |`,
    );
  }
  return lines.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      sizes: { type: 'string' },
      endpoints: { type: 'string', default: '5' },
      reps: { type: 'string' },
      changes: { type: 'string' },
      'upstream-max': { type: 'string' },
      'iptables-max': { type: 'string', default: '20000' },
      timeout: { type: 'string', default: '300' },
    },
  });
  const q = values.quick!;
  const o: ScaleOptions = {
    sizes: (values.sizes ?? (q ? '100,1000,10000' : '100,1000,10000,50000')).split(',').map(Number),
    endpoints: Number(values.endpoints),
    reps: Number(values.reps ?? (q ? 1 : 3)),
    changes: Number(values.changes ?? (q ? 5 : 7)),
    upstreamMax: Number(values['upstream-max'] ?? (q ? 1000 : 2000)),
    iptablesMax: Number(values['iptables-max']),
    timeoutS: Number(values.timeout),
  };
  if (o.sizes.some((n) => !Number.isInteger(n) || n < 1)) throw new Error('KPROXY_BENCH_ARGS: --sizes wants positive integers');
  const started = new Date().toISOString();
  const load = os.loadavg().map((x) => x.toFixed(1)).join(' ');
  const rows = await nftScale(o, (l) => process.stderr.write(l + '\n'));
  process.stdout.write(`nft-scale, ${started}, ${os.cpus().length} CPUs, load average at start ${load}, at end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}\n\n`);
  process.stdout.write(scaleTable(rows) + '\n');
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
