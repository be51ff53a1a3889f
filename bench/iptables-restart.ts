// A kproxy restart over an existing ruleset (a first sync must not hold the xtables or
// netlink lock for tens of seconds): a NEW IptablesProxier (a new process: fresh
// Workload objects, no state carried over) runs its first sync into a namespace that still
// holds the full KUBE-* ruleset the previous one left, side by side in one run with a raw
// flushing `iptables-restore` of the same ruleset into an empty namespace.
// Per backend (nf_tables: iptables-restore; legacy: iptables-legacy-restore) and repetition:
//   cold      the previous process's first sync into the empty namespace (for reference);
//   same      a restart with the same Services and endpoints;
//   changed   a restart after 1% of the Services gained an endpoint;
//   older     a restart over an older version's rules: every dispatch rule's comment other
//             (KUBE-SERVICES, KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, KUBE-PROXY-FIREWALL; set
//             untimed, by one `--noflush` restore per table that flushes and refills the
//             dispatch chains), so every dispatch rule differs; twice per repetition, in an
//             order that turns from one repetition to the next: the dispatch edits in one
//             restore (`dispatchChunkLines: 0`, the one-restore form, which rewrites the
//             chains whole), and in the default form (an insertion past the chain's last rule
//             an `-A`; lines per restore: restart.ts dispatchBudget, 5,000 at 10,000 Services,
//             10,000 at 20,000);
// each timed as: total wall time, number of restores, the longest single restore (how long
// the xtables lock / the nf_tables commit is held), and the rule lines it wrote (`-A`/`-I`/
// `-D` lines and chain declarations of the restore inputs). Medians of --reps, load average.
//
//   sudo node --import tsx bench/iptables-restart.ts [--n 10000] [--endpoints 5] [--reps 3]
//        [--backends nft,legacy] [--timeout 300] [--scenarios same,changed,older] [--dispatch-lines N]
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import type { CommandRunner, RunOptions, RunResult } from '../src/kernel/runner.ts';
import { silentLogger } from '../src/log.ts';
import { getMode } from '../src/modes/registry.ts';
import { IptablesProxier } from '../src/modes/iptables/proxier.ts';
import { LEGACY_IPTABLES, Namespaces, TimedRunner } from './netns.ts';
import { fmtMs, median } from './report.ts';
import { benchConfig, Workload } from './workload.ts';

/** What one sync sent to iptables-restore. */
interface SyncFigures {
  totalMs: number;
  restores: number;
  longestMs: number;
  /** all restores together */
  restoreMs: number;
  /** rule lines (-A/-I/-D) and chain declarations written */
  rules: number;
  decls: number;
  /** time in iptables-save */
  saveMs: number;
  /** wall time outside every command: kproxy's planning (render, reading the save, comparing) */
  inProcessMs: number;
}

/** Runs in a namespace (TimedRunner) and keeps every restore's input and time. */
class RestoreRecorder implements CommandRunner {
  restores: Array<{ ms: number; input: string }> = [];
  constructor(private readonly inner: TimedRunner) {}
  async run(cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> {
    const t0 = performance.now();
    const r = await this.inner.run(cmd, args, opts);
    if (cmd.endsWith('-restore') && opts?.input) this.restores.push({ ms: performance.now() - t0, input: opts.input });
    if (cmd.endsWith('-restore') && r.code !== 0) throw new Error(`${cmd} failed: ${r.stderr.slice(0, 300)}`);
    return r;
  }
}

/** The Services that gain an endpoint in the "changed" restart: 1%, spread over the key range. */
function changedIndices(n: number): number[] {
  const k = Math.max(1, Math.round(n / 100));
  return Array.from({ length: k }, (_, j) => Math.floor(((j + 0.5) / k) * n));
}

function workload(n: number, endpoints: number, changed: boolean): Workload {
  const w = new Workload(n, endpoints, benchConfig('iptables'));
  if (changed) for (const i of changedIndices(n)) w.addEndpoint(i);
  return w;
}

async function timedSync(ns: string, rename: Record<string, string>, w: Workload, timeoutMs: number, dispatchChunkLines?: number): Promise<SyncFigures> {
  const timed = new TimedRunner(ns, rename, timeoutMs);
  const rec = new RestoreRecorder(timed);
  const p = new IptablesProxier({ runner: rec, log: silentLogger(), config: w.input().config, dispatchChunkLines });
  const t0 = performance.now();
  await p.sync(w.input(), w.serviceKeys, true);
  const totalMs = performance.now() - t0;
  let rules = 0;
  let decls = 0;
  for (const { input } of rec.restores) {
    for (const l of input.split('\n')) {
      if (l.startsWith('-A ') || l.startsWith('-I ') || l.startsWith('-D ')) rules++;
      else if (l.startsWith(':')) decls++;
    }
  }
  const saveMs = timed.records.filter((r) => r.cmd.endsWith('-save')).reduce((a, r) => a + r.ms, 0);
  const execMs = timed.records.reduce((a, r) => a + r.ms, 0);
  return { totalMs, restores: rec.restores.length, longestMs: Math.max(0, ...rec.restores.map((r) => r.ms)), restoreMs: rec.restores.reduce((a, r) => a + r.ms, 0), rules, decls, saveMs, inProcessMs: totalMs - execMs };
}

const DISPATCH_CHAINS = ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-EXTERNAL-SERVICES', 'KUBE-PROXY-FIREWALL'];

/**
 * An older version's rules (untimed): every dispatch rule's comment other, the dispatch chains
 * flushed and refilled by one `--noflush` restore per table (the service chains stay as kproxy
 * made them: a flushing restore of the whole save would recreate 70,000 chains in another
 * order, after which iptables-save alone takes 37 s instead of 5–15). Returns how many rules changed.
 */
async function olderComments(ns: string, rename: Record<string, string>, timeoutMs: number): Promise<number> {
  const r = new TimedRunner(ns, rename, timeoutMs);
  let changed = 0;
  for (const table of ['filter', 'nat']) {
    const save = await r.run('iptables-save', ['-t', table]);
    if (save.code !== 0) throw new Error(`iptables-save failed: ${save.stderr.slice(0, 300)}`);
    const out = [`*${table}`];
    const rules: string[] = [];
    for (const l of save.stdout.split('\n')) {
      const decl = /^:(\S+) /.exec(l);
      if (decl && DISPATCH_CHAINS.includes(decl[1])) out.push(`:${decl[1]} - [0:0]`);
      const chain = /^-A (\S+) /.exec(l)?.[1];
      if (!chain || !DISPATCH_CHAINS.includes(chain)) continue;
      if (l.includes('--comment')) changed++;
      rules.push(l.replace(/--comment (?:"([^"]*)"|(\S+))/, (_m, q: string | undefined, w: string | undefined) => `--comment "${q ?? w} (v0)"`));
    }
    const res = await r.run('iptables-restore', ['-w', '5', '--noflush'], { input: [...out, ...rules, 'COMMIT', ''].join('\n') });
    if (res.code !== 0) throw new Error(`iptables-restore of the older rules failed: ${res.stderr.slice(0, 300)}`);
  }
  return changed;
}

async function rawFlush(nss: Namespaces, rename: Record<string, string>, payload: string, timeoutMs: number): Promise<number> {
  const ns = await nss.create('raw');
  try {
    const t0 = performance.now();
    const r = await new TimedRunner(ns, rename, timeoutMs).run('iptables-restore', ['-w', '5'], { input: payload, timeoutMs });
    if (r.code !== 0) throw new Error(`raw iptables-restore failed: ${r.stderr.slice(0, 300)}`);
    return performance.now() - t0;
  } finally {
    await nss.delete(ns);
  }
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      n: { type: 'string', default: '10000' },
      endpoints: { type: 'string', default: '5' },
      reps: { type: 'string', default: '3' },
      backends: { type: 'string', default: 'nft,legacy' },
      timeout: { type: 'string', default: '300' },
      scenarios: { type: 'string', default: 'same,changed' },
      // the default form's lines per dispatch restore (unset: the proxier's default, the chunk size)
      'dispatch-lines': { type: 'string' },
    },
  });
  const scenarios = new Set(values.scenarios!.split(','));
  const dispatchLines = values['dispatch-lines'] === undefined ? undefined : Number(values['dispatch-lines']);
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const n = Number(values.n);
  const endpoints = Number(values.endpoints);
  const timeoutMs = Number(values.timeout) * 1000;
  const deadline = Date.now() + 3 * 3600_000;
  const backends = values.backends!.split(',');
  const payload = getMode('iptables').render(workload(n, endpoints, false).input());
  const nss = new Namespaces(`${process.pid}r`);
  type Row = { raw: number[]; cold: SyncFigures[]; same: SyncFigures[]; changed: SyncFigures[]; olderOne: SyncFigures[]; olderChunked: SyncFigures[]; loads: number[] };
  const rows = new Map<string, Row>(backends.map((b) => [b, { raw: [], cold: [], same: [], changed: [], olderOne: [], olderChunked: [], loads: [] }]));
  try {
    for (let rep = 0; rep < Number(values.reps) && Date.now() < deadline; rep++) {
      for (const b of backends) {
        const rename = b === 'legacy' ? LEGACY_IPTABLES : {};
        const row = rows.get(b)!;
        row.raw.push(await rawFlush(nss, rename, payload, timeoutMs));
        const ns = await nss.create('k');
        try {
          // each sync by a new proxier over fresh objects: a new process
          row.cold.push(await timedSync(ns, rename, workload(n, endpoints, false), timeoutMs));
          if (scenarios.has('same')) row.same.push(await timedSync(ns, rename, workload(n, endpoints, false), timeoutMs));
          if (scenarios.has('changed')) row.changed.push(await timedSync(ns, rename, workload(n, endpoints, true), timeoutMs));
          if (scenarios.has('older')) {
            // the two forms over the same older rules, in an order that turns each
            // repetition; the last sync left the current rules, so the older ones are made
            // again before each
            const forms = [
              { name: 'in one restore', lines: 0, into: row.olderOne },
              { name: 'in the default form', lines: dispatchLines, into: row.olderChunked },
            ];
            for (let k = 0; k < forms.length; k++) {
              const form = forms[(k + rep) % forms.length];
              const c = await olderComments(ns, rename, timeoutMs);
              const f = await timedSync(ns, rename, workload(n, endpoints, scenarios.has('changed')), timeoutMs, form.lines);
              process.stderr.write(`rep ${rep} ${b}: older rules (${c} dispatch rules other), dispatch ${form.name}: ${fmtMs(f.totalMs)}, ${f.restores} restores, longest ${fmtMs(f.longestMs)}, all restores ${fmtMs(f.restoreMs)}, ${f.rules} rule lines, in-process ${fmtMs(f.inProcessMs)}; load ${loadavg()[0].toFixed(1)}\n`);
              form.into.push(f);
            }
          }
        } finally {
          await nss.delete(ns);
        }
        row.loads.push(loadavg()[0]);
        const f = (s: SyncFigures) => `${fmtMs(s.totalMs)} (${s.restores} restores, longest ${fmtMs(s.longestMs)}, ${s.rules} rules; iptables-save ${fmtMs(s.saveMs)}, in-process ${fmtMs(s.inProcessMs)})`;
        const g = (xs: SyncFigures[]) => (xs.length ? f(xs.at(-1)!) : '-');
        process.stderr.write(`rep ${rep} ${b}: raw ${fmtMs(row.raw.at(-1))}; cold ${f(row.cold.at(-1)!)}; restart same ${g(row.same)}; changed ${g(row.changed)}; load ${loadavg()[0].toFixed(1)}\n`);
      }
    }
  } finally {
    await nss.deleteAll();
  }
  process.stdout.write(`\nN=${n} Services × ${endpoints} endpoints, medians of ${Number(values.reps)}; payload ${payload.split('\n').length} lines; load at the end ${loadavg().map((x) => x.toFixed(1)).join(' ')}\n\n`);
  process.stdout.write('| backend | sync | total (median) | ratio to raw flushing restore | restores | longest restore (median) | all restores (median) | rule lines written | chains declared | iptables-save | in-process | load (1 min, median) |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n');
  for (const [b, row] of rows) {
    if (!row.raw.length) continue;
    const raw = median(row.raw);
    process.stdout.write(`| ${b} | raw flushing iptables-restore (empty namespace) | ${fmtMs(raw)} | 1.00× | 1 | ${fmtMs(raw)} | ${fmtMs(raw)} | ${payload.split('\n').filter((l) => l.startsWith('-A ')).length} | ${payload.split('\n').filter((l) => l.startsWith(':')).length} | – | – | ${median(row.loads).toFixed(1)} |\n`);
    for (const [name, xs] of [['cold start (empty nat table)', row.cold], ['restart, same state', row.same], ['restart, 1% of Services changed', row.changed],
      ['restart over older rules (every dispatch rule differs), dispatch in one restore (the chains rewritten whole)', row.olderOne],
      ['restart over older rules (every dispatch rule differs), dispatch in the default form (chunked, -A past the last rule, on nf_tables; one restore on legacy)', row.olderChunked]] as const) {
      if (!xs.length) continue;
      const tot = median(xs.map((x) => x.totalMs));
      process.stdout.write(`| ${b} | ${name} | ${fmtMs(tot)} | ${(tot / raw).toFixed(2)}× | ${median(xs.map((x) => x.restores))} | ${fmtMs(median(xs.map((x) => x.longestMs)))} | ${fmtMs(median(xs.map((x) => x.restoreMs)))} | ${median(xs.map((x) => x.rules))} | ${median(xs.map((x) => x.decls))} | ${fmtMs(median(xs.map((x) => x.saveMs)))} | ${fmtMs(median(xs.map((x) => x.inProcessMs)))} | ${median(row.loads).toFixed(1)} |\n`);
    }
  }
}

main().catch((e: Error) => {
  process.stderr.write(`${e.stack ?? e.message}\n`);
  process.exitCode = 1;
});
