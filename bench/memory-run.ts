// VmRSS / VmHWM of the real `kproxy run --manifests DIR` process at N Services × E endpoints,
// in each kernel mode, side by side in one run (the manifests of bench/kproxy-run.ts).
//
//   sudo node --import tsx bench/memory-run.ts [--services 10000] [--endpoints 5]
//        [--variants iptables,iptables-legacy,nftables] [--repeat 3] [--timeout 300]
//
// Per run: process start → the manifests loaded ("sources synced") → the first full sync
// logged; VmRSS (/proc/PID/status) right after the first sync and 2, 5 and 10 s later (V8
// returns the pages its collection emptied on a background thread: on a loaded machine that
// takes seconds), VmHWM, and kproxy's own heap figures after its collection. Prints medians
// over --repeat runs and the load average before and after.
// Run `npm run build` first to measure the bundle (what the DaemonSet runs), as bin/kproxy.js
// uses dist/ when it is fresh; otherwise the process also holds tsx's compiled sources.
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import { hotServices, killGroup, legacyShim, readMemory, writeManifests, type RunVariant } from './kproxy-run.ts';
import { Namespaces } from './netns.ts';
import { median, pollUntil, sleep } from './stats.ts';
import { NODE } from './workload.ts';

export interface MemoryRun {
  error?: string;
  /** process start → "sources synced" / → the first full sync logged */
  loadedMs?: number;
  firstSyncMs?: number;
  /** VmRSS (KiB) right after the first sync, then 2 s, 5 s and 10 s later; VmHWM at the end */
  rssKiB: number[];
  hwmKiB?: number;
  /** kproxy's own line after its collection (src/sync/memory.ts): heap figures in MiB */
  heap?: Record<string, number>;
  /** how long that collection blocked the event loop */
  gcMs?: number;
}

export interface MemoryRunRow {
  variant: RunVariant;
  n: number;
  runs: MemoryRun[];
}

const loadavg = () => readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' ');
const repoRoot = resolve(import.meta.dirname, '..');
export const SAMPLE_AFTER_S = [0, 2, 5, 10];


async function oneRun(nss: Namespaces, dir: string, work: string, variant: RunVariant, timeoutS: number): Promise<MemoryRun> {
  const ns = await nss.create(`mem${variant === 'iptables-legacy' ? 'leg' : variant.slice(0, 3)}`);
  const res: MemoryRun = { rssKiB: [] };
  let proc: ChildProcess | undefined;
  try {
    const env: NodeJS.ProcessEnv = { ...process.env, KPROXY_LOG_LEVEL: 'info' };
    if (variant === 'iptables-legacy') env.PATH = `${legacyShim(work)}:${env.PATH}`;
    const mode = variant === 'nftables' ? 'nftables' : 'iptables';
    const t0 = performance.now();
    proc = spawn('ip', ['netns', 'exec', ns, process.execPath, join(repoRoot, 'bin/kproxy.js'), 'run', '--mode', mode, '--manifests', dir,
      '--hostname-override', NODE.nodeName, '--cluster-cidr', '10.0.0.0/8', '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
    { stdio: ['ignore', 'pipe', 'ignore'], detached: true, env });
    let tail = '';
    let synced = false;
    proc.stdout!.on('data', (d: Buffer) => {
      const lines = (tail + d.toString()).split('\n');
      tail = lines.pop() ?? '';
      for (const l of lines) {
        let j: { msg?: string; full?: boolean; memoryMiB?: Record<string, number>; durationMs?: number };
        try {
          j = JSON.parse(l);
        } catch {
          continue;
        }
        if (j.msg === 'sources synced; starting the sync loop') res.loadedMs = performance.now() - t0;
        if (j.msg === 'synced' && j.full && !synced) {
          synced = true;
          res.firstSyncMs = performance.now() - t0;
        }
        if (j.memoryMiB && !res.heap) {
          res.heap = j.memoryMiB;
          res.gcMs = j.durationMs;
        }
      }
    });
    const ok = await pollUntil(async () => (synced ? true : proc!.exitCode !== null ? false : undefined), timeoutS * 1000, 50);
    if (!ok) throw new Error(`KPROXY_BENCH_RUN: no first sync within ${timeoutS} s${proc.exitCode !== null ? ' (kproxy exited)' : ''}`);
    const start = performance.now();
    for (const s of SAMPLE_AFTER_S) {
      const wait = start + s * 1000 - performance.now();
      if (wait > 0) await sleep(wait);
      const m = readMemory(proc.pid!);
      res.rssKiB.push(m?.vmRssKiB ?? NaN);
      res.hwmKiB = m?.vmHwmKiB;
    }
    return res;
  } catch (e) {
    return { ...res, error: (e as Error).message.slice(0, 300) };
  } finally {
    if (proc) await killGroup(proc);
    await nss.delete(ns);
  }
}

export async function memoryRuns(n: number, endpoints: number, variants: RunVariant[], repeat: number, timeoutS: number, log: (l: string) => void): Promise<MemoryRunRow[]> {
  const nss = new Namespaces();
  const work = mkdtempSync(join(tmpdir(), 'kpb-memrun-'));
  const rows: MemoryRunRow[] = variants.map((variant) => ({ variant, n, runs: [] }));
  const stop = () => void nss.deleteAll().finally(() => process.exit(130));
  process.once('SIGINT', stop);
  try {
    const dir = join(work, 'manifests');
    writeManifests(dir, n, endpoints, hotServices(n));
    // interleaved: variant A, B, C, A, B, C... so a change of the machine's load hits all alike
    for (let k = 0; k < repeat; k++) {
      for (const row of rows) {
        const r = await oneRun(nss, dir, work, row.variant, timeoutS);
        log(`  ${row.variant} #${k + 1}: ${r.error ?? `RSS ${r.rssKiB.map((x) => (x / 1024).toFixed(0)).join(' → ')} MiB, HWM ${((r.hwmKiB ?? 0) / 1024).toFixed(0)} MiB`}`);
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
  const mib = (kib: number) => (Number.isFinite(kib) ? `${(kib / 1024).toFixed(0)} MiB` : '–');
  const ms = (x: number) => (Number.isFinite(x) ? (x >= 1000 ? `${(x / 1000).toFixed(2)} s` : `${x.toFixed(0)} ms`) : '–');
  const med = (rs: MemoryRun[], f: (r: MemoryRun) => number | undefined) => {
    const xs = rs.map(f).filter((x): x is number => typeof x === 'number' && Number.isFinite(x));
    return xs.length ? median(xs) : NaN;
  };
  console.log(`kproxy run, ${values.services} Services × ${values.endpoints} endpoints, ${bundle}; medians of ${values.repeat}; load ${before} before, ${loadavg()} after\n`);
  console.log(`| mode | manifests loaded | first sync done | ${SAMPLE_AFTER_S.map((s) => `VmRSS +${s} s`).join(' | ')} | VmHWM | heap used / total after the GC | the GC's pause | runs ok |`);
  console.log(`|---|---:|---:|${SAMPLE_AFTER_S.map(() => '---:|').join('')}---:|---:|---:|---:|`);
  for (const r of rows) {
    const ok = r.runs.filter((x) => !x.error);
    const rss = SAMPLE_AFTER_S.map((_, k) => mib(med(ok, (x) => x.rssKiB[k])));
    const heap = `${med(ok, (x) => x.heap?.heapUsed).toFixed(0)} / ${med(ok, (x) => x.heap?.heapTotal).toFixed(0)} MiB`;
    console.log(`| ${r.variant} | ${ms(med(ok, (x) => x.loadedMs))} | ${ms(med(ok, (x) => x.firstSyncMs))} | ${rss.join(' | ')} | ${mib(med(ok, (x) => x.hwmKiB))} | ${heap} | ${ms(med(ok, (x) => x.gcMs))} | ${ok.length}/${r.runs.length} |`);
  }
}
