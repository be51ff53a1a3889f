// What any `iptables-restore --noflush` that edits the dispatch chains costs at N Services,
// however few lines it carries: why the restart's chunked dispatch edits cost more in total
// than one restore. In a namespace a cold start by
// IptablesProxier filled (N Services × 5 endpoints, NodePort), per repetition and in turn:
//   empty     one rule (`-A KPB-FLOOR -j RETURN`) into a chain of its own, in an EMPTY
//             namespace: the process start and the commit of a tiny table;
//   unrelated the same one rule into a chain of its own beside the N Services' rules: nothing
//             jumps to it, but nf_tables validates every chain the base chains reach on any
//             commit that adds a rule with a jump or an xtables match/target;
//   dispatch  one `-D KUBE-NODEPORTS 1` and the same rule appended again (`-A`): as a
//             dispatch restore, iptables-nft fetches the edited chain's rules (a `-D` by
//             position needs them) and the kernel validates the table.
// Medians of --reps, wall time of the restore command, load average. --legacy: the same with
// the legacy binaries (iptables-legacy-restore, which replaces the whole table per commit).
//
//   sudo node --import tsx bench/iptables-restore-floor.ts [--n 10000,20000] [--reps 5] [--legacy]
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { silentLogger } from '../src/log.ts';
import { IptablesProxier } from '../src/modes/iptables/proxier.ts';
import { LEGACY_IPTABLES, Namespaces, TimedRunner } from './netns.ts';
import { fmtMs, median } from './report.ts';
import { benchConfig, Workload } from './workload.ts';

let rename: Record<string, string> = {};

async function restoreMs(ns: string, input: string): Promise<number> {
  const t0 = performance.now();
  const r = await new TimedRunner(ns, rename, 120_000).run('iptables-restore', ['-w', '5', '--noflush'], { input });
  if (r.code !== 0) throw new Error(`iptables-restore failed: ${r.stderr.slice(0, 300)}`);
  return performance.now() - t0;
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { n: { type: 'string', default: '10000,20000' }, reps: { type: 'string', default: '5' }, legacy: { type: 'boolean', default: false } } });
  if (values.legacy) rename = LEGACY_IPTABLES;
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const reps = Number(values.reps);
  const nss = new Namespaces(`${process.pid}f`);
  const one = (decl: boolean) => `*nat\n${decl ? ':KPB-FLOOR - [0:0]\n' : ''}-A KPB-FLOOR -j RETURN\nCOMMIT\n`;
  const rows: string[] = [];
  try {
    for (const n of values.n!.split(',').map(Number)) {
      const empty = await nss.create('e');
      const ns = await nss.create('k');
      const w = new Workload(n, 5, benchConfig('iptables'));
      await new IptablesProxier({ runner: new TimedRunner(ns, rename, 600_000), log: silentLogger(), config: w.input().config }).sync(w.input(), w.serviceKeys, true);
      const save = await new TimedRunner(ns, rename).run('iptables-save', ['-t', 'nat']);
      const first = save.stdout.split('\n').find((l) => l.startsWith('-A KUBE-NODEPORTS '));
      if (!first) throw new Error('no KUBE-NODEPORTS rule');
      const chainRules = (c: string) => save.stdout.split('\n').filter((l) => l.startsWith(`-A ${c} `)).length;
      const ms = { empty: [] as number[], unrelated: [] as number[], dispatch: [] as number[] };
      const loads: number[] = [];
      for (let r = 0; r < reps; r++) {
        ms.empty.push(await restoreMs(empty, one(r === 0)));
        ms.unrelated.push(await restoreMs(ns, one(r === 0)));
        ms.dispatch.push(await restoreMs(ns, `*nat\n-D KUBE-NODEPORTS 1\n${first}\nCOMMIT\n`));
        loads.push(loadavg()[0]);
        process.stderr.write(`N=${n} rep ${r}: empty ${fmtMs(ms.empty.at(-1))}, unrelated ${fmtMs(ms.unrelated.at(-1))}, dispatch ${fmtMs(ms.dispatch.at(-1))}; load ${loadavg()[0].toFixed(1)}\n`);
      }
      const f = (xs: number[]) => `${fmtMs(median(xs))} (${xs.map((x) => fmtMs(x)).join(' / ')})`;
      rows.push(`| ${n} | ${chainRules('KUBE-SERVICES')} / ${chainRules('KUBE-NODEPORTS')} | ${f(ms.empty)} | ${f(ms.unrelated)} | ${f(ms.dispatch)} | ${Math.min(...loads).toFixed(1)}–${Math.max(...loads).toFixed(1)} |`);
      await nss.delete(ns);
      await nss.delete(empty);
    }
  } finally {
    await nss.deleteAll();
  }
  process.stdout.write(`\n${values.legacy ? 'iptables-legacy-restore' : 'iptables-restore (nf_tables)'}: medians of ${reps} (each run listed), ms\n\n| Services | KUBE-SERVICES / KUBE-NODEPORTS rules | one rule, empty namespace | one rule in an unrelated chain | -D + -A in KUBE-NODEPORTS | load (1 min) |\n|---:|---:|---:|---:|---:|---:|\n${rows.join('\n')}\n`);
}

main().catch((e: Error) => {
  process.stderr.write(`${e.stack ?? e.message}\n`);
  process.exitCode = 1;
});
