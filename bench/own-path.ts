// kproxy's own per-sync work for a one-Service change, step by step, the way the
// controller's syncOnce runs it (src/sync/controller.ts): the trackers' apply, the node view
// (incremental: the previous view and the changed Services, as planInput builds it), the
// mode's Proxier.sync (planning, the transaction text, the mode's bookkeeping; its `nft` /
// `iptables-restore` calls timed apart), and what the controller does after it (the
// no-local-endpoints count, the stale flows). N Services × 5 endpoints (bench/nft-scale.ts's
// workload); one endpoint added to one Service per change, one change at a time.
//
// Side by side in one run: each --trees root (default: this tree) gets its own node view,
// proxier and namespace, fed the same changes in turn, so "before" (e.g. a worktree of the
// branch point) and "after" meet the same load. --no-kernel answers every command with
// success and no output instead (kproxy's own part only, no root needed).
//
//   node --import tsx bench/own-path.ts [--sizes 100,10000,50000] [--changes 7] [--mode nftables|iptables]
//        [--trees before=/path/to/base,after=.] [--no-kernel] [--timeout 400] [--profile DIR]
//
// --profile DIR: a CPU profile of the changes only (not the cold starts), one file per size,
// DIR/own-path-N.cpuprofile (Chrome DevTools / speedscope format), every tree in it.
//
// Prints per size and tree the medians of: tracker (update + apply), node view, Proxier.sync
// wall, of which commands, kproxy's own part of the sync (wall − commands), after-sync steps,
// and own total (everything but the commands), with the load average (1 min) beside them.
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import os from 'node:os';
import type { CommandRunner, RunOptions, RunResult } from '../src/kernel/runner.ts';
import type { ModeName } from '../src/config/config.ts';
import type { Proxier } from '../src/modes/types.ts';
import type { PlanInput } from '../src/core/nodeview.ts';
import { silentLogger } from '../src/log.ts';
import { execMs, Namespaces, TimedRunner, type ExecRecord } from './netns.ts';
import { ScaleWorkload } from './nft-scale.ts';
import { fmtMs, median } from './report.ts';

/** A runner that answers every command at once with success and no output (own part only). */
export class NullRunner implements CommandRunner {
  records: ExecRecord[] = [];
  async run(cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> {
    this.records.push({ cmd, args, ms: 0, code: 0, inputBytes: opts?.input?.length ?? 0 });
    // `nft list table`: no table yet (a full sync then flushes nothing it does not know)
    if (cmd === 'nft' && args[0] === 'list' && args[1] === 'table') return { code: 1, stdout: '', stderr: 'Error: No such file or directory' };
    return { code: 0, stdout: '', stderr: '' };
  }
  take(): ExecRecord[] {
    const out = this.records;
    this.records = [];
    return out;
  }
}

/** What one source tree provides for the path. */
interface Tree {
  name: string;
  buildNodeView: (input: PlanInput, previous?: unknown, changes?: unknown) => PlanInput['view'];
  countNoLocalEndpoints: (view: PlanInput['view']) => unknown;
  getMode: (m: ModeName) => { createProxier(d: unknown): Promise<Proxier> };
  benchConfig: (m: ModeName) => PlanInput['config'];
}

async function loadTree(name: string, root: string): Promise<Tree> {
  const url = (p: string) => pathToFileURL(resolve(root, p)).href;
  const nv = await import(url('src/core/nodeview.ts'));
  const ctrl = await import(url('src/sync/controller.ts'));
  const reg = await import(url('src/modes/registry.ts'));
  const wl = await import(url('bench/workload.ts'));
  return { name, buildNodeView: nv.buildNodeView, countNoLocalEndpoints: ctrl.countNoLocalEndpoints, getMode: reg.getMode, benchConfig: wl.benchConfig };
}

export interface Steps {
  tracker: number[];
  view: number[];
  syncWall: number[];
  commands: number[];
  syncOwn: number[];
  afterSync: number[];
  own: number[];
  whole: number[];
  load: number[];
}

const newSteps = (): Steps => ({ tracker: [], view: [], syncWall: [], commands: [], syncOwn: [], afterSync: [], own: [], whole: [], load: [] });

interface Options {
  sizes: number[];
  changes: number;
  mode: ModeName;
  trees: Array<[string, string]>;
  kernel: boolean;
  timeoutS: number;
  profileDir?: string;
}

export async function ownPath(o: Options, log: (l: string) => void): Promise<Map<string, Steps>> {
  if (o.kernel && process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces), or pass --no-kernel');
  const trees = await Promise.all(o.trees.map(([n, r]) => loadTree(n, r)));
  const nss = new Namespaces(`${process.pid}o`);
  const out = new Map<string, Steps>();
  try {
    for (const n of o.sizes) {
      const w = new ScaleWorkload(n, 5, o.changes + 1);
      const runs: Array<{ tree: Tree; runner: TimedRunner | NullRunner; proxier: Proxier; view: PlanInput['view']; steps: Steps }> = [];
      for (const tree of trees) {
        const runner = o.kernel ? new TimedRunner(await nss.create(`o${runs.length}`), {}, o.timeoutS * 1000) : new NullRunner();
        const proxier = await tree.getMode(o.mode).createProxier({ config: tree.benchConfig(o.mode), runner, log: silentLogger(), family: 4 });
        const input: PlanInput = { ...w.input(o.mode as 'nftables'), config: tree.benchConfig(o.mode) };
        const view = tree.buildNodeView(input);
        const t0 = performance.now();
        await proxier.sync({ ...input, view }, new Set(), true);
        log(`N=${n} ${tree.name}: cold start ${fmtMs(performance.now() - t0)} ms`);
        runner.take();
        const steps = newSteps();
        out.set(`${n} ${tree.name}`, steps);
        runs.push({ tree, runner, proxier, view, steps });
      }
      const session = o.profileDir ? new Session() : null;
      if (session) {
        session.connect();
        await session.post('Profiler.enable');
        await session.post('Profiler.start');
      }
      for (let c = 0; c < o.changes; c++) {
        const i = Math.floor((n * (c + 1)) / (o.changes + 1));
        // the trackers' part is the same code for every tree (one state): timed once
        const t0 = performance.now();
        const changed = w.addEndpoint(i);
        const trackerMs = performance.now() - t0;
        for (const r of runs) {
          const input: PlanInput = { ...w.input(o.mode as 'nftables'), config: r.tree.benchConfig(o.mode) };
          const t1 = performance.now();
          const changes = { services: changed, portKeysOf: (k: string) => w.tracker.services.portKeysOf(k) };
          const view = r.tree.buildNodeView(input, r.view, changes);
          const t2 = performance.now();
          await r.proxier.sync({ ...input, view }, new Set(changed), false);
          const t3 = performance.now();
          r.tree.countNoLocalEndpoints(view);
          void view?.staleFlows.length;
          const t4 = performance.now();
          r.view = view;
          const cmds = execMs(r.runner.take());
          const s = r.steps;
          s.tracker.push(trackerMs);
          s.view.push(t2 - t1);
          s.syncWall.push(t3 - t2);
          s.commands.push(cmds);
          s.syncOwn.push(t3 - t2 - cmds);
          s.afterSync.push(t4 - t3);
          s.own.push(trackerMs + (t4 - t1) - cmds);
          s.whole.push(trackerMs + (t4 - t1));
          s.load.push(os.loadavg()[0]);
        }
      }
      if (session) {
        const { profile } = await session.post('Profiler.stop');
        const file = join(o.profileDir!, `own-path-${n}.cpuprofile`);
        writeFileSync(file, JSON.stringify(profile));
        session.disconnect();
        log(`N=${n}: CPU profile of the changes in ${file}`);
      }
      for (const r of runs) {
        log(`N=${n} ${r.tree.name}: own median ${fmtMs(median(r.steps.own))} ms, whole ${fmtMs(median(r.steps.whole))} ms, load ${os.loadavg()[0].toFixed(1)}`);
        await r.proxier.stop();
        if (r.runner instanceof TimedRunner) await nss.delete(r.runner.ns);
      }
    }
  } finally {
    await nss.deleteAll();
  }
  return out;
}

export function ownPathTable(cells: Map<string, Steps>, sizes: number[], trees: string[], kernel: boolean): string {
  const m = (xs: number[]) => (xs.length ? fmtMs(median(xs)) : '–');
  const lines = [
    `| services × 5 endpoints | tree | tracker (ms) | node view (ms) | Proxier.sync (ms) | of which ${kernel ? 'commands' : 'commands (none run)'} (ms) | sync's own part (ms) | after the sync (ms) | kproxy's own part (ms) | whole change (ms) | load (1 min) |`,
    '|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
  ];
  for (const n of sizes) {
    for (const t of trees) {
      const s = cells.get(`${n} ${t}`);
      if (!s) continue;
      const load = `${Math.min(...s.load).toFixed(1)}–${Math.max(...s.load).toFixed(1)}`;
      lines.push(`| ${n.toLocaleString('en-US')} | ${t} | ${m(s.tracker)} | ${m(s.view)} | ${m(s.syncWall)} | ${m(s.commands)} | ${m(s.syncOwn)} | ${m(s.afterSync)} | **${m(s.own)}** | ${m(s.whole)} | ${load} |`);
    }
  }
  return lines.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      sizes: { type: 'string', default: '100,10000,50000' },
      changes: { type: 'string', default: '7' },
      mode: { type: 'string', default: 'nftables' },
      trees: { type: 'string', default: 'this=.' },
      'no-kernel': { type: 'boolean', default: false },
      timeout: { type: 'string', default: '400' },
      profile: { type: 'string' },
    },
  });
  const mode = values.mode as ModeName;
  if (mode !== 'nftables' && mode !== 'iptables') throw new Error('KPROXY_BENCH_ARGS: --mode is nftables or iptables');
  const trees = values.trees!.split(',').map((t) => {
    const [name, root] = t.split('=');
    if (!name || !root) throw new Error(`KPROXY_BENCH_ARGS: --trees wants name=dir[,name=dir], got ${t}`);
    return [name, root] as [string, string];
  });
  const o: Options = { sizes: values.sizes!.split(',').map(Number), changes: Number(values.changes), mode, trees, kernel: !values['no-kernel'], timeoutS: Number(values.timeout), profileDir: values.profile };
  if (o.sizes.some((n) => !Number.isInteger(n) || n < 1)) throw new Error('KPROXY_BENCH_ARGS: --sizes wants positive integers');
  if (!Number.isInteger(o.changes) || o.changes < 1 || o.changes > 50) throw new Error('KPROXY_BENCH_ARGS: --changes wants 1..50');
  const started = new Date().toISOString();
  const load = os.loadavg().map((x) => x.toFixed(1)).join(' ');
  const cells = await ownPath(o, (l) => process.stderr.write(l + '\n'));
  process.stdout.write(`own-path (${mode}${o.kernel ? '' : ', no kernel'}), ${started}, ${os.cpus().length} CPUs, load average at start ${load}, at end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}\n\n`);
  process.stdout.write(ownPathTable(cells, o.sizes, trees.map(([t]) => t), o.kernel) + '\n');
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.stack ?? e.message}\n`);
    process.exitCode = 1;
  });
}
