// VmRSS / VmHWM of the real `kproxy run --manifests DIR` process at N Services × E endpoints,
// in each kernel mode, side by side in one run (bench/kproxy-run.ts's runPhase, no changes).
//
//   sudo node --import tsx bench/memory-run.ts [--services 10000] [--endpoints 5]
//        [--variants iptables,iptables-legacy,nftables] [--repeat 3] [--timeout 300]
//
// Per run: process start → the manifests loaded ("sources synced") → the first full sync
// logged; VmRSS and VmHWM (/proc/PID/status) right after the first sync, and again after
// 1.5 s idle. Prints medians over --repeat runs and the load average before and after.
// Run `npm run build` first to measure the bundle (what the DaemonSet runs), as bin/kproxy.js
// uses dist/ when it is fresh; otherwise the process also holds tsx's compiled sources.
import { mkdtempSync, readFileSync, rmSync, existsSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { runPhase, type RunPhaseResult, type RunVariant } from './kproxy-run.ts';
import { Namespaces } from './netns.ts';
import { median } from './stats.ts';

export interface MemoryRunRow {
  variant: RunVariant;
  n: number;
  runs: RunPhaseResult[];
}

const loadavg = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');

export async function memoryRuns(n: number, endpoints: number, variants: RunVariant[], repeat: number, timeoutS: number, log: (l: string) => void): Promise<MemoryRunRow[]> {
  const nss = new Namespaces();
  const work = mkdtempSync(join(tmpdir(), 'kpb-memrun-'));
  const rows: MemoryRunRow[] = variants.map((variant) => ({ variant, n, runs: [] }));
  const stop = () => void nss.deleteAll().finally(() => process.exit(130));
  process.once('SIGINT', stop);
  try {
    // interleaved: variant A, B, C, A, B, C... so a change of the machine's load hits all alike
    for (let k = 0; k < repeat; k++) {
      for (const row of rows) {
        const r = await runPhase(nss, {
          n, endpoints, variant: row.variant, changes: 0, streamRate: 0, streamSeconds: 0,
          startTimeoutMs: timeoutS * 1000, changeTimeoutMs: 30_000, workDir: work, log,
        });
        if (r.error) log(`  ${row.variant}: FAILED ${r.error}`);
        row.runs.push(r);
      }
    }
    return rows;
  } finally {
    process.removeListener('SIGINT', stop);
    await nss.deleteAll();
    rmSync(work, { recursive: true, force: true });
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  const { values } = parseArgs({
    options: {
      services: { type: 'string', default: '10000' }, endpoints: { type: 'string', default: '5' },
      variants: { type: 'string', default: 'iptables,iptables-legacy,nftables' }, repeat: { type: 'string', default: '3' },
      timeout: { type: 'string', default: '300' },
    },
  });
  const root = resolve(import.meta.dirname, '..');
  const bundle = existsSync(join(root, 'dist/kproxy.js')) ? `dist/ bundle of ${statSync(join(root, 'dist/kproxy.js')).mtime.toISOString()}` : 'no dist/: tsx loader';
  const before = loadavg();
  const rows = await memoryRuns(Number(values.services), Number(values.endpoints), values.variants!.split(',') as RunVariant[], Number(values.repeat), Number(values.timeout), (l) => console.error(l));
  const mib = (kib: number) => `${(kib / 1024).toFixed(0)} MiB`;
  const ms = (x: number) => (x >= 1000 ? `${(x / 1000).toFixed(2)} s` : `${x.toFixed(0)} ms`);
  const med = (rs: RunPhaseResult[], f: (r: RunPhaseResult) => number | undefined) => {
    const xs = rs.map(f).filter((x): x is number => typeof x === 'number' && Number.isFinite(x));
    return xs.length ? median(xs) : NaN;
  };
  console.log(`kproxy run, ${values.services} Services × ${values.endpoints} endpoints, ${bundle}; medians of ${values.repeat}; load ${before} before, ${loadavg()} after\n`);
  console.log('| mode | manifests loaded | first sync (logged) | VmRSS after first sync | VmHWM | VmRSS 1.5 s later | runs ok |');
  console.log('|---|---:|---:|---:|---:|---:|---:|');
  for (const r of rows) {
    const ok = r.runs.filter((x) => !x.error);
    console.log(`| ${r.variant} | ${ms(med(ok, (x) => x.sourceLoadMs))} | ${ms(med(ok, (x) => x.firstSyncMs))} | ${mib(med(ok, (x) => x.memAfterFirstSync?.vmRssKiB))} | ${mib(med(ok, (x) => x.memAfterFirstSync?.vmHwmKiB))} | ${mib(med(ok, (x) => x.memAfterStream?.vmRssKiB))} | ${ok.length}/${r.runs.length} |`);
  }
}
