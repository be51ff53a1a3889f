// How the raw restore of the full iptables payload scales with N, per binary and flag, with
// kproxy out of the loop: iptables-restore (nf_tables backend) with and without --noflush,
// and iptables-legacy-restore --noflush. Each apply goes into a fresh kpb-* namespace.
//
//   node --import tsx bench/restore-scaling.ts [--sizes 500,1000,2000,3000] [--endpoints 5] [--timeout 120]
//
// Prints a markdown table; a cell that hit the time limit reads "> N s".
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { getMode } from '../src/modes/registry.ts';
import { Namespaces, TimedRunner } from './netns.ts';
import { benchConfig, Workload } from './workload.ts';
import { fmtMs } from './report.ts';

const VARIANTS: Array<[string, string, string[]]> = [
  ['iptables-restore --noflush (nf_tables)', 'iptables-restore', ['-w', '5', '--noflush', '--counters']],
  ['iptables-restore, flushing (nf_tables)', 'iptables-restore', ['-w', '5', '--counters']],
  ['iptables-legacy-restore --noflush', 'iptables-legacy-restore', ['-w', '5', '--noflush', '--counters']],
];

export async function restoreScaling(sizes: number[], endpoints: number, timeoutS: number, log: (l: string) => void): Promise<string> {
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const nss = new Namespaces(`${process.pid}s`);
  const rows: string[] = [];
  /** a variant that hit the limit is not tried at larger sizes */
  const gaveUp = new Set<string>();
  try {
    for (const n of sizes) {
      const payload = getMode('iptables').render(new Workload(n, endpoints, benchConfig('iptables')).input());
      const cells: string[] = [];
      for (const [label, cmd, args] of VARIANTS) {
        if (gaveUp.has(label)) {
          cells.push('not tried');
          continue;
        }
        const ns = await nss.create('rs');
        try {
          const t0 = performance.now();
          const r = await new TimedRunner(ns).run(cmd, args, { input: payload, timeoutMs: timeoutS * 1000 });
          const ms = performance.now() - t0;
          if (r.code !== 0 && ms >= timeoutS * 1000) {
            gaveUp.add(label);
            cells.push(`> ${timeoutS} s`);
          } else if (r.code !== 0) {
            cells.push(`failed (${r.stderr.trim().split('\n')[0].slice(0, 60)})`);
          } else cells.push(fmtMs(ms));
          log(`N=${n} ${label}: ${cells[cells.length - 1]}`);
        } finally {
          await nss.delete(ns);
        }
      }
      rows.push(`| ${n.toLocaleString('en-US')} | ${payload.split('\n').filter((l) => l.startsWith('-A')).length.toLocaleString('en-US')} | ${cells.join(' | ')} |`);
    }
  } finally {
    await nss.deleteAll();
  }
  return [
    `| services (N) | rules in payload | ${VARIANTS.map((v) => v[0]).join(' | ')} |`,
    `|---:|---:|${VARIANTS.map(() => '---:').join('|')}|`,
    ...rows,
  ].join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      sizes: { type: 'string', default: '500,1000,2000,3000' },
      endpoints: { type: 'string', default: '5' },
      timeout: { type: 'string', default: '120' },
    },
  });
  const sizes = values.sizes!.split(',').map(Number);
  if (sizes.some((n) => !Number.isInteger(n) || n < 1)) throw new Error('KPROXY_BENCH_ARGS: --sizes wants positive integers');
  const table = await restoreScaling(sizes, Number(values.endpoints), Number(values.timeout), (l) => process.stderr.write(l + '\n'));
  process.stdout.write(table + '\n');
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
