// Where the iptables (nf_tables backend) cold start goes, side by side in one run:
// the full rendered ruleset of N services applied into fresh kpb-* namespaces as
//   raw        one flushing `iptables-restore -w 5 --counters` (the reference);
//   chunks:L   kproxy's chunked full sync form (full.ts chunkedPayloads, L lines per chunk),
//              each chunk a `--noflush` restore, timed one by one;
//   decl1st:L  the same chunks, but every chain declared in one first restore and the
//              later chunks carrying rules only;
//   cold:L     the cold-start form (no service chain installed): each chunk publishes its
//              own services' dispatch rules, the filter table first, the catch-all last;
//   coldj:L    the same with nat PREROUTING / OUTPUT already jumping to KUBE-SERVICES (as the
//              proxier's jump rules do before its chunks), so every chunk's commit makes the
//              kernel validate every service published before it;
// repeated --reps times in rotation (medians), with the load average. Per chunk form it
// prints the restores' count, total, first/last chunk time (growth = per-chunk cost that
// grows with the table), and kproxy's in-process planning time.
//
//   sudo node --import tsx bench/iptables-cold-profile.ts [--n 10000] [--endpoints 5] [--reps 3]
//        [--forms raw,chunks:5000,cold:5000,cold:10000,decl1st:5000]
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { optionsFromConfig } from '../src/modes/iptables/options.ts';
import { planFull } from '../src/modes/iptables/full.ts';
import { Namespaces, TimedRunner } from './netns.ts';
import { fmtMs } from './report.ts';
import { benchConfig, NODE, Workload } from './workload.ts';

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** Moves every `:CHAIN` line of the nat chunks into one first restore. */
function declarationsFirst(chunks: string[]): string[] {
  const decls: string[] = [];
  const rest = chunks.map((c) => {
    const out: string[] = [];
    let inNat = false;
    for (const l of c.split('\n')) {
      if (l === '*nat') inNat = true;
      else if (l.startsWith('*')) inNat = false;
      if (inNat && l.startsWith(':')) decls.push(l);
      else out.push(l);
    }
    return out.join('\n');
  });
  return [['*nat', ...decls, 'COMMIT', ''].join('\n'), ...rest];
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      n: { type: 'string', default: '10000' },
      endpoints: { type: 'string', default: '5' },
      reps: { type: 'string', default: '3' },
      forms: { type: 'string', default: 'raw,chunks:5000,cold:5000' },
      timeout: { type: 'string', default: '300' },
    },
  });
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const n = Number(values.n);
  const w = new Workload(n, Number(values.endpoints), benchConfig('iptables'));
  const input = w.input();
  const opts = optionsFromConfig(input.config, NODE);
  const timeoutMs = Number(values.timeout) * 1000;
  const forms = values.forms!.split(',');
  const payloads = new Map<string, { restores: string[]; planMs: number }>();
  for (const f of forms) {
    const [kind, lines] = f.split(':');
    const t0 = performance.now();
    if (kind === 'raw' || kind === 'rawj') payloads.set(f, { restores: [planFull({ state: input.state, opts }).payload], planMs: performance.now() - t0 });
    else {
      // cold: as on an empty node (no service chain installed), the form kproxy's first sync takes
      const installedNatChains = kind === 'cold' || kind === 'coldj' ? new Set<string>() : undefined;
      const plan = planFull({ state: input.state, opts, chunkLines: Number(lines), installedNatChains });
      const chunks = plan.chunks ?? [plan.payload];
      payloads.set(f, { restores: kind === 'decl1st' ? declarationsFirst(chunks) : chunks, planMs: performance.now() - t0 });
    }
  }
  const nss = new Namespaces(`${process.pid}p`);
  const results = new Map<string, { total: number[]; per: number[][] }>(forms.map((f) => [f, { total: [], per: [] }]));
  try {
    for (let rep = 0; rep < Number(values.reps); rep++) {
      for (const f of forms) {
        const { restores } = payloads.get(f)!;
        const ns = await nss.create('p');
        try {
          const runner = new TimedRunner(ns, {}, timeoutMs);
          const args = f.startsWith('raw') ? ['-w', '5', '--counters'] : ['-w', '5', '--noflush', '--counters'];
          if (f.endsWith('j') || f.includes('j:')) {
            // the base chains' jumps first, as IptablesProxier's ensureJumps writes them
            const jumps = '*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n-I OUTPUT -j KUBE-SERVICES\n-I PREROUTING -j KUBE-SERVICES\n-I POSTROUTING -j KUBE-POSTROUTING\nCOMMIT\n';
            await runner.run('iptables-restore', ['-w', '5', '--noflush'], { input: jumps, timeoutMs });
          }
          const per: number[] = [];
          const t0 = performance.now();
          for (const r of restores) {
            const t1 = performance.now();
            const res = await runner.run('iptables-restore', args, { input: r, timeoutMs });
            if (res.code !== 0) throw new Error(`${f}: iptables-restore failed: ${res.stderr.slice(0, 300)}`);
            per.push(performance.now() - t1);
          }
          const total = performance.now() - t0;
          results.get(f)!.total.push(total);
          results.get(f)!.per.push(per);
          process.stderr.write(`rep ${rep} ${f}: ${fmtMs(total)} in ${per.length} restores (chunk times at 0/25/50/75/100 %: ${[0, 0.25, 0.5, 0.75, 1].map((q) => fmtMs(per[Math.round(q * (per.length - 1))])).join(' ')}) load ${loadavg()[0].toFixed(1)}\n`);
        } finally {
          await nss.delete(ns);
        }
      }
    }
  } finally {
    await nss.deleteAll();
  }
  const raw = results.get('raw');
  const rawMed = raw?.total.length ? median(raw.total) : NaN;
  process.stdout.write(`\nN=${n} × ${values.endpoints}, medians of ${values.reps}; load ${loadavg().map((x) => x.toFixed(1)).join(' ')}\n\n`);
  process.stdout.write('| form | restores | lines | plan (in-process) | total (median) | ratio to raw | median chunk | second chunk | second-to-last chunk | last chunk |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n');
  for (const f of forms) {
    const { restores, planMs } = payloads.get(f)!;
    const r = results.get(f)!;
    const lines = restores.reduce((a, p) => a + p.split('\n').length - 1, 0);
    const col = (i: number) => (r.per.length && r.per[0].length > i && i >= 0 ? fmtMs(median(r.per.map((p) => p[i]))) : '–');
    const chunkMed = r.per.length ? fmtMs(median(r.per.flat())) : '–';
    const k = restores.length;
    process.stdout.write(`| ${f} | ${k} | ${lines} | ${fmtMs(planMs)} | ${fmtMs(median(r.total))} | ${(median(r.total) / rawMed).toFixed(2)}× | ${chunkMed} | ${col(1)} | ${col(k - 2)} | ${col(k - 1)} |\n`);
  }
}

main().catch((e: Error) => {
  process.stderr.write(`${e.message}\n`);
  process.exitCode = 1;
});
