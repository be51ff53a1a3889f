// The nftables mode at scale, side by side with the raw references in one run, each apply
// into a fresh kpb-* namespace:
//   - raw `iptables-restore` (flushing, nf_tables backend) of the iptables mode's ruleset for
//     the same state: the reference for the cold start;
//   - raw `nft -f` of kproxy's nftables table (what the cold start writes), and of the same
//     table in upstream's shape (one anonymous numgen map per service) up to --upstream-max;
//   - kproxy's cold start: NftProxier.sync(full) wall time (planning + nft), and its nft part;
//   - one-Service change: one endpoint added to one Service, then NftProxier.sync(partial)
//     (the manifest → rules-in-the-kernel path minus the source), median of --changes; split
//     into nft and kproxy's own part (plan + diff + text);
//   - beside each change, in the same namespace: raw `nft -f` of the very transaction the
//     proxier sent (idempotent: re-adding the chain and elements), and of the same change in
//     the plain command forms ("old forms" in the output: `add table` + `add rule` +
//     `add element`, which make nft 1.0.6 list every chain first);
//   - floors on a table of that size: one `add element` to cluster-ips (plain form), the same
//     element as an `add set ... { elements = { } }` (kproxy's form), and one rule with a jump
//     into an unreferenced chain (the kernel's table validation, which any rule with a
//     jump, goto or dnat triggers);
//   - a Service deleted (median of up to 3): its elements go with `delete element`;
//   - stream batches (--batches, --batch): --batch endpoint changes (half added, half removed)
//     over as many Services in one sync, beside the same changes one sync each, the retired
//     chains' `delete chain`, and one `nft list chain` poll.
//
//   node --import tsx bench/nft-scale.ts [--quick] [--sizes 100,1000,10000,50000] [--endpoints 5]
//        [--reps 3] [--changes 7] [--upstream-max 2000] [--iptables-max 20000] [--timeout 300]
//        [--batches 3] [--batch 10]
//
// --quick: sizes 100,1000,10000, one cold start each, 5 changes, upstream shape up to 1000.
// The proxier is the mode's with one table at every size (upstream's `kube-proxy`; the mode
// spreads the Services over several tables from 1,000: bench/nft-sharded.ts measures that).
// The load average (1 min) is printed per size, next to its changes.
// Services past 35,535 have no NodePort (the port range is full). Prints a markdown table.
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { ProxyStateTracker } from '../src/core/tracker.ts';
import type { K8sService } from '../src/core/api.ts';
import { silentLogger } from '../src/log.ts';
import type { PlanInput } from '../src/core/nodeview.ts';
import { getMode } from '../src/modes/registry.ts';
import { NftProxier } from '../src/modes/nftables/proxier.ts';
import { dumpRuleset } from '../src/modes/nftables/ruleset.ts';
import { optionsFromInput, planRuleset } from '../src/modes/nftables/plan.ts';
import { expandSelection } from '../src/modes/nftables/selection.ts';
import { splitTopLevel } from '../src/modes/nftables/parse.ts';
import { execMs, isWrite, Namespaces, TimedRunner } from './netns.ts';
import { benchConfig, MAX_NODE_PORT_SERVICES, NODE, serviceObject, sliceObject } from './workload.ts';
import { fmtMs, median } from './report.ts';

/** N services × E endpoints (room for `extra` more each), built through the tracker as a sync would see them. */
export class ScaleWorkload {
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

  /** One endpoint fewer on service i (its last one goes). */
  removeEndpoint(i: number): Set<string> {
    const before = sliceObject(i, this.counts[i], this.stride);
    if (this.counts[i] < 2) throw new Error('KPROXY_BENCH_WORKLOAD: service has no endpoint to spare');
    this.counts[i]--;
    this.tracker.endpoints.update(before, sliceObject(i, this.counts[i], this.stride));
    return this.tracker.apply();
  }

  /** Deletes service i and its slice. */
  deleteService(i: number): Set<string> {
    this.tracker.services.update(this.service(i), null);
    this.tracker.endpoints.update(sliceObject(i, this.counts[i], this.stride), null);
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
  /** kproxy's own part of a change: sync wall time minus every nft call */
  changeOwnMs: number[];
  /** raw `nft -f` of the transaction the proxier sent */
  rawChangeMs: number[];
  /** raw `nft -f` of the same change in the old forms (add table, add rule, add element) */
  oldFormChangeMs: number[];
  /** `nft -f` of one cluster-ips element (`add element`): the old floor */
  floorMs: number[];
  /** the same element as `add set cluster-ips { ... elements = { } }` */
  floorSetBodyMs: number[];
  /** one rule with a jump, in a chain nothing references: the kernel's validation walk */
  floorJumpMs: number[];
  /** floor: one jump rule, on the raw table of upstream's shape */
  upstreamFloorJumpMs: number[];
  /** one Service deleted (its map elements go: `delete element`, which nft 1.0.6 runs after listing every chain) */
  deleteMs: number[];
  /** 1-minute load average when the changes were measured */
  load: number;
  /** stream batches: `batch` endpoint changes (half added, half removed) across as many Services, one sync */
  batch: BatchMeasure[];
}

/** One stream batch (what one sync sees under a stream of endpoint changes, coalesced by minSyncPeriod). */
interface BatchMeasure {
  /** NftProxier.sync of the whole batch: wall, nft writes, kproxy's own part, commands */
  ms: number;
  nftMs: number;
  ownMs: number;
  commands: number;
  /** command kinds of the transaction sent ("add chain": 20, ...) */
  forms: Record<string, number>;
  /** raw `nft -f` of the same transaction again (idempotent) */
  rawMs: number;
  /** the same number of changes, one sync each (what the batch saves) */
  oneByOneMs: number;
  /** what the proxier does later for the endpoints removed: `delete chain` of the retired chains (raw nft -f) */
  retiredDeleteMs: number;
  retiredChains: number;
  /** one `nft list chain` of a new endpoint chain: what kproxy-run's stream poller pays per check */
  checkMs: number;
}

/** A partial transaction in the forms used before (and by upstream): add table, add rule, add element. */
export function oldForms(text: string): string {
  const out: string[] = [];
  let table = '';
  for (const line of text.split('\n').filter(Boolean)) {
    const chain = /^add chain (\S+ \S+) (\S+) \{ (.*) \}$/.exec(line);
    const set = /^add (?:set|map) (\S+ \S+) (\S+) \{ .*? elements = \{ (.*) \} ; \}$/.exec(line);
    if (chain && !/^type /.test(chain[3])) {
      table = chain[1];
      out.push(`add chain ${chain[1]} ${chain[2]}`);
      for (const r of splitTopLevel(chain[3], ';')) out.push(`add rule ${chain[1]} ${chain[2]} ${r}`);
    } else if (set) {
      table = set[1];
      for (const e of splitTopLevel(set[3], ',')) out.push(`add element ${set[1]} ${set[2]} { ${e} }`);
    } else out.push(line);
  }
  return [`add table ${table || 'ip kube-proxy'} { comment "rules for kube-proxy" ; }`, ...out].join('\n') + '\n';
}

async function timedNft(runner: TimedRunner, text: string): Promise<number | null> {
  const t0 = performance.now();
  const r = await runner.run('nft', ['-f', '-'], { input: text, timeoutMs: 120_000 });
  return r.code === 0 ? performance.now() - t0 : null;
}

async function timedApply(nss: Namespaces, cmd: string, args: string[], payload: string, timeoutS: number, then?: (r: TimedRunner) => Promise<void>): Promise<number> {
  const ns = await nss.create('raw');
  try {
    const t0 = performance.now();
    const runner = new TimedRunner(ns);
    const r = await runner.run(cmd, args, { input: payload, timeoutMs: timeoutS * 1000 }).catch(() => null);
    const ms = performance.now() - t0;
    // The runner throws (or nft exits non-zero) when killed at the limit.
    if (!r || r.code !== 0) return ms >= timeoutS * 1000 ? Number.POSITIVE_INFINITY : Number.NaN;
    await then?.(runner);
    return ms;
  } finally {
    await nss.delete(ns);
  }
}

/** The command kind of each line of a transaction ("add chain", "delete element", ...), counted. */
export function commandForms(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of text.split('\n')) {
    const m = /^(\w+) (\w+)/.exec(line);
    if (!m) continue;
    const k = `${m[1]} ${m[2]}`;
    out[k] = (out[k] ?? 0) + 1;
  }
  return out;
}

/**
 * Batch `b`: `size` endpoint changes over `size` Services (even ones: an endpoint added, odd
 * ones: one removed), synced at once, as the sync loop hands a 10/s stream to the proxier
 * once per minSyncPeriod; then the same number of changes one sync each; the retired
 * chains' deletion; one poll of the kernel as kproxy-run's stream makes it.
 */
async function streamBatch(
  w: ScaleWorkload,
  proxier: Awaited<ReturnType<ReturnType<typeof getMode>['createProxier']>>,
  runner: TimedRunner,
  size: number,
  b: number,
  log: (l: string) => void,
): Promise<BatchMeasure> {
  const p = proxier as unknown as { lastTransactionText(): string; staleChains: Map<string, number> };
  const pick = (k: number, round: number) => Math.floor((w.n * (2 * k + 1)) / (2 * size)) + 1 + b * 2 + round;
  const changed = new Set<string>();
  for (let k = 0; k < size; k++) for (const s of k % 2 ? w.removeEndpoint(pick(k, 0)) : w.addEndpoint(pick(k, 0))) changed.add(s);
  runner.take();
  const t0 = performance.now();
  const stats = await proxier.sync(w.input('nftables'), changed, false);
  const ms = performance.now() - t0;
  const recs = runner.take();
  const sent = p.lastTransactionText();
  const m: BatchMeasure = {
    ms,
    nftMs: execMs(recs, isWrite),
    ownMs: ms - execMs(recs),
    commands: stats.rulesWritten,
    forms: commandForms(sent),
    rawMs: (await timedNft(runner, sent)) ?? NaN,
    oneByOneMs: 0,
    retiredDeleteMs: NaN,
    retiredChains: 0,
    checkMs: NaN,
  };
  const newChain = /^add chain ip kube-proxy (endpoint-\S+) \{/m.exec(sent)?.[1];
  if (newChain) {
    const checks: number[] = [];
    for (let c = 0; c < 3; c++) {
      const t = performance.now();
      await runner.run('nft', ['list', 'chain', 'ip', 'kube-proxy', newChain], { timeoutMs: 60_000 });
      checks.push(performance.now() - t);
    }
    m.checkMs = median(checks);
  }
  // The proxier deletes retired chains later (after delayMs, at most every batchMs): time that
  // transaction here, as it would send it, and take them off its list.
  const retired = [...(p.staleChains?.keys() ?? [])];
  if (retired.length) {
    m.retiredChains = retired.length;
    m.retiredDeleteMs = (await timedNft(runner, retired.map((c) => `delete chain ip kube-proxy ${c}`).join('\n') + '\n')) ?? NaN;
    for (const c of retired) p.staleChains.delete(c);
  }
  for (let k = 0; k < size; k++) {
    const one = k % 2 ? w.removeEndpoint(pick(k, 1)) : w.addEndpoint(pick(k, 1));
    runner.take();
    const t = performance.now();
    await proxier.sync(w.input('nftables'), one, false);
    m.oneByOneMs += performance.now() - t;
  }
  for (const c of [...(p.staleChains?.keys() ?? [])]) {
    await timedNft(runner, `delete chain ip kube-proxy ${c}\n`);
    p.staleChains.delete(c);
  }
  runner.take();
  log(
    `N=${w.n} batch ${b}: ${size} changes in one sync ${fmtMs(m.ms)} ms (nft ${fmtMs(m.nftMs)}, own ${fmtMs(m.ownMs)}, ${m.commands} commands ${JSON.stringify(m.forms)}); ` +
      `raw same tx ${fmtMs(m.rawMs)} ms; one by one ${fmtMs(m.oneByOneMs)} ms; retired ${m.retiredChains} chains deleted in ${fmtMs(m.retiredDeleteMs)} ms; check ${fmtMs(m.checkMs)} ms; load ${os.loadavg()[0].toFixed(1)}`,
  );
  return m;
}

export interface ScaleOptions {
  /** stream batches per size (after the one-Service changes) and changes per batch */
  batches: number;
  batch: number;
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
      const w = new ScaleWorkload(n, o.endpoints, o.changes + 3);
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
        changeOwnMs: [],
        rawChangeMs: [],
        oldFormChangeMs: [],
        floorMs: [],
        floorSetBodyMs: [],
        floorJumpMs: [],
        deleteMs: [],
        upstreamFloorJumpMs: [],
        load: NaN,
        batch: [],
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
          // The kernel-validation floor on upstream's shape too (one jump rule, as below).
          const floor = async (r: TimedRunner) => {
            if (rep > 0) return;
            for (let c = 0; c < o.changes; c++) {
              const v = await timedNft(r, `add chain ip kube-proxy kpb-scratch-${c}\nadd chain ip kube-proxy kpb-scratch-${c} { jump mark-for-masquerade ; }\n`);
              if (v !== null) row.upstreamFloorJumpMs.push(v);
            }
          };
          row.rawUpstreamShapeMs.push(await timedApply(nss, 'nft', ['-f', '-'], upstreamText, o.timeoutS, floor));
          log(`N=${n} rep ${rep}: raw nft -f (upstream's shape) ${fmtMs(row.rawUpstreamShapeMs.at(-1))} ms`);
        }
        const ns = await nss.create('kp');
        try {
          const runner = new TimedRunner(ns, {}, o.timeoutS * 1000);
          // K forced to 1: this bench's floors and stream columns write into `ip kube-proxy`;
          // the sharded mode (from 1,000 Services) beside one table: bench/nft-sharded.ts
          const proxier = new NftProxier({ runner, log: silentLogger(), shards: { threshold: Number.MAX_SAFE_INTEGER } });
          runner.take();
          const t0 = performance.now();
          await proxier.sync(w.input('nftables'), new Set(), true);
          row.coldMs.push(performance.now() - t0);
          row.coldNftMs.push(execMs(runner.take(), isWrite));
          log(`N=${n} rep ${rep}: kproxy cold start ${fmtMs(row.coldMs.at(-1))} ms (nft ${fmtMs(row.coldNftMs.at(-1))} ms)`);
          if (rep === 0) {
            row.load = os.loadavg()[0];
            const nftProxier = proxier as unknown as { lastTransactionText(): string };
            const push = (xs: number[], v: number | null) => v !== null && xs.push(v);
            for (let c = 0; c < o.changes; c++) {
              const changed = w.addEndpoint(Math.floor((n * (c + 1)) / (o.changes + 1)));
              const t1 = performance.now();
              const stats = await proxier.sync(w.input('nftables'), changed, false);
              const wall = performance.now() - t1;
              const recs = runner.take();
              row.changeMs.push(wall);
              row.changeNftMs.push(execMs(recs, isWrite));
              row.changeOwnMs.push(wall - execMs(recs));
              row.changeCommands.push(stats.rulesWritten);
              // Interleaved with the change, so load hits every column alike.
              const sent = nftProxier.lastTransactionText();
              push(row.rawChangeMs, await timedNft(runner, sent));
              push(row.oldFormChangeMs, await timedNft(runner, oldForms(sent)));
              const ip = `172.31.255.${c + 1}`;
              push(row.floorMs, await timedNft(runner, `add element ip kube-proxy cluster-ips { ${ip} }\n`));
              push(row.floorSetBodyMs, await timedNft(runner, `add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; elements = { 172.31.254.${c + 1} } ; }\n`));
              push(row.floorJumpMs, await timedNft(runner, `add chain ip kube-proxy kpb-scratch-${c}\nadd chain ip kube-proxy kpb-scratch-${c} { jump mark-for-masquerade ; }\n`));
              runner.take();
            }
            for (let b = 0; b < o.batches; b++) row.batch.push(await streamBatch(w, proxier, runner, o.batch, b, log));
            for (let c = 0; c < Math.min(3, o.changes); c++) {
              const changed = w.deleteService(Math.floor((n * (2 * c + 1)) / (2 * o.changes + 2)));
              const t1 = performance.now();
              await proxier.sync(w.input('nftables'), changed, false);
              row.deleteMs.push(performance.now() - t1);
              runner.take();
            }
            log(
              `N=${n}: service deleted median ${fmtMs(median(row.deleteMs))} ms; one-Service change median ${fmtMs(median(row.changeMs))} ms (nft ${fmtMs(median(row.changeNftMs))} ms, own ${fmtMs(median(row.changeOwnMs))} ms, ${median(row.changeCommands)} commands); ` +
                `raw same tx ${fmtMs(median(row.rawChangeMs))} ms, old forms ${fmtMs(median(row.oldFormChangeMs))} ms; floors: add element ${fmtMs(median(row.floorMs))}, set body ${fmtMs(median(row.floorSetBodyMs))}, one jump ${fmtMs(median(row.floorJumpMs))} ms; load ${row.load.toFixed(1)}`,
            );
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
    '| services × 5 endpoints | nft objects | raw iptables-restore, flushing (ms) | raw nft -f, kproxy table (ms) | raw nft -f, upstream shape (ms) | kproxy cold start (ms) | of which nft (ms) | cold ÷ raw iptables |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) {
    const ratio = median(r.coldMs) / median(r.rawIptablesMs);
    lines.push(
      `| ${r.n.toLocaleString('en-US')} | ${r.objects.toLocaleString('en-US')} | ${m(r.rawIptablesMs)} | ${m(r.rawNftMs)} | ${m(r.rawUpstreamShapeMs)} | ${m(r.coldMs)} | ${m(r.coldNftMs)} | ${Number.isFinite(ratio) ? ratio.toFixed(2) : '–'} |`,
    );
  }
  lines.push('', changeTable(rows), '', batchTable(rows));
  return lines.join('\n');
}

/** The one-Service change, side by side with raw nft of the same change and the floors. */
export function changeTable(rows: Row[]): string {
  const m = (xs: number[]) => (xs.length ? fmtMs(median(xs)) : '–');
  const base = rows.find((r) => r.changeMs.length)?.changeMs;
  const lines = [
    '| services | load (1 min) | one-Service change (ms) | ÷ smallest size | of which nft (ms) | kproxy own (ms) | commands | raw nft -f, same transaction (ms) | raw nft -f, old forms (ms) | floor: add element (ms) | floor: set body (ms) | floor: one jump rule (ms) | same, upstream shape (ms) | Service deleted (ms) |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) {
    if (!r.changeMs.length) continue;
    const ratio = base ? median(r.changeMs) / median(base) : NaN;
    lines.push(
      `| ${r.n.toLocaleString('en-US')} | ${r.load.toFixed(1)} | ${m(r.changeMs)} | ${ratio.toFixed(1)}× | ${m(r.changeNftMs)} | ${m(r.changeOwnMs)} | ${median(r.changeCommands)} | ${m(r.rawChangeMs)} | ${m(r.oldFormChangeMs)} | ${m(r.floorMs)} | ${m(r.floorSetBodyMs)} | ${m(r.floorJumpMs)} | ${m(r.upstreamFloorJumpMs)} | ${m(r.deleteMs)} |`,
    );
  }
  return lines.join('\n');
}

/** Stream batches: one sync of `batch` endpoint changes, beside the same changes one sync each. */
export function batchTable(rows: Row[]): string {
  const m = (xs: number[]) => (xs.some(Number.isFinite) ? fmtMs(median(xs.filter(Number.isFinite))) : '–');
  const lines = [
    '| services | batches | batch sync (ms) | of which nft (ms) | kproxy own (ms) | commands | raw nft -f, same transaction (ms) | same changes, one sync each (ms, sum) | retired chains | their `delete chain` (ms) | one poll `nft list chain` (ms) |',
    '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const r of rows) {
    if (!r.batch.length) continue;
    const b = (f: (x: BatchMeasure) => number) => m(r.batch.map(f));
    lines.push(
      `| ${r.n.toLocaleString('en-US')} | ${r.batch.length} | ${b((x) => x.ms)} | ${b((x) => x.nftMs)} | ${b((x) => x.ownMs)} | ${median(r.batch.map((x) => x.commands))} | ${b((x) => x.rawMs)} | ${b((x) => x.oneByOneMs)} | ${median(r.batch.map((x) => x.retiredChains))} | ${b((x) => x.retiredDeleteMs)} | ${b((x) => x.checkMs)} |`,
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
      batches: { type: 'string' },
      batch: { type: 'string', default: '10' },
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
    batches: Number(values.batches ?? (q ? 1 : 3)),
    batch: Number(values.batch),
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
