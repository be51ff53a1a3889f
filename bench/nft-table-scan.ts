// Which kube-proxy tables exist, at scale: `nft list tables` (what kproxy's cleanup,
// `kproxy trace --live` and the sharded proxier's scan for unused tables ran) beside the probe by
// name that replaced it (NftExecutor.existingTables: one `nft -c -f -` of `create table` lines),
// in one namespace holding the nftables mode's tables for N Services (16 tables at 10,000). Also
// the paths that use the probe, timed whole: a restarted kproxy's first full sync over the
// existing tables, `kproxy trace --live`, and cleanup.
//
//   sudo node --import tsx bench/nft-table-scan.ts [--sizes 1000,10000] [--repeat 5] [--list-timeout 120]
//
// Every namespace (kpb-*) is removed at the end, also on failure and Ctrl-C; each command has a
// time limit (--list-timeout for `nft list tables`).
import { loadavg } from 'node:os';
import { parseArgs } from 'node:util';
import { NftExecutor } from '../src/kernel/nft/exec.ts';
import { runChecked } from '../src/kernel/runner.ts';
import { silentLogger } from '../src/log.ts';
import { kubeProxyTableNames } from '../src/modes/nftables/names.ts';
import { mode } from '../src/modes/nftables/index.ts';
import { NftProxier } from '../src/modes/nftables/proxier.ts';
import { Namespaces, TimedRunner } from './netns.ts';
import { fmtMs, median } from './stats.ts';
import { benchConfig, clusterIPOf, Workload } from './workload.ts';

const { values } = parseArgs({
  options: {
    sizes: { type: 'string', default: '1000,10000' },
    repeat: { type: 'string', default: '5' },
    'list-timeout': { type: 'string', default: '120' },
  },
});
const sizes = values.sizes!.split(',').map(Number);
const repeat = Math.max(1, Number(values.repeat));
const listTimeoutMs = Number(values['list-timeout']) * 1000;
const nss = new Namespaces();
const load = () => loadavg()[0].toFixed(1);
process.on('SIGINT', () => void nss.deleteAll().finally(() => process.exit(130)));

interface Row {
  n: number;
  tables: number;
  listMs: number | string;
  probeMs: number;
  restartSyncMs: number;
  restartScanMs: number;
  traceMs: number;
  cleanupMs: number;
  load: string[];
}

async function measure(n: number): Promise<Row> {
  const ns = await nss.create(`scan${n}`);
  try {
    const w = new Workload(n, 5, benchConfig('nftables'));
    const runner = new TimedRunner(ns);
    const loadStart = load();
    await runChecked(runner, 'nft', ['-f', '-'], { input: mode.render(w.input()), timeoutMs: 600_000 });
    const exec = new NftExecutor(runner);
    const tables = await exec.existingTables('ip', kubeProxyTableNames());

    // before: `nft list tables ip`, once (it is the slow one), bounded
    const t0 = performance.now();
    const r = await runner.run('nft', ['list', 'tables', 'ip'], { timeoutMs: listTimeoutMs });
    const listMs: number | string = r.code === 0 ? performance.now() - t0 : `> ${listTimeoutMs / 1000} s (killed)`;
    if (r.code === 0) {
      const listed = [...r.stdout.matchAll(/^table ip (\S+)$/gm)].map((m) => m[1]).filter((t) => tables.includes(t));
      if (listed.length !== tables.length) throw new Error(`nft list tables found ${listed.length} kube-proxy tables, the probe ${tables.length}`);
    }
    // after: the probe by name, median of `repeat`
    const probes: number[] = [];
    for (let i = 0; i < repeat; i++) {
      const t = performance.now();
      const got = await exec.existingTables('ip', kubeProxyTableNames());
      probes.push(performance.now() - t);
      if (got.length !== tables.length) throw new Error(`probe ${i}: ${got.length} tables, expected ${tables.length}`);
    }
    // a restarted kproxy: a new proxier's first full sync over the tables already there
    runner.take();
    const proxier = new NftProxier({ runner, log: silentLogger() });
    const t1 = performance.now();
    await proxier.sync(w.input(), w.serviceKeys, true);
    const restartSyncMs = performance.now() - t1;
    const restartScanMs = runner.take().filter((x) => x.cmd === 'nft' && x.args[0] === '-c').reduce((s, x) => s + x.ms, 0);
    if (proxier.tables().length !== tables.length) throw new Error(`restart: ${proxier.tables().length} tables, ${tables.length} before`);
    // kproxy trace --live to the last Service
    const t2 = performance.now();
    const tr = await mode.trace!({ from: '10.0.0.9', to: clusterIPOf(n - 1), port: 80, protocol: 'TCP', live: true }, { runner });
    const traceMs = performance.now() - t2;
    if (!tr.output.includes(':8080')) throw new Error(`trace --live to the last Service: ${tr.output || tr.notes?.join('; ')}`);
    // cleanup (a switch to another mode)
    const t3 = performance.now();
    await mode.cleanup(runner, silentLogger());
    const cleanupMs = performance.now() - t3;
    if ((await exec.existingTables('ip', kubeProxyTableNames())).length) throw new Error('cleanup left kube-proxy tables');
    return { n, tables: tables.length, listMs, probeMs: median(probes), restartSyncMs, restartScanMs, traceMs, cleanupMs, load: [loadStart, load()] };
  } finally {
    await nss.delete(ns);
  }
}

try {
  const started = new Date().toISOString();
  const rows: Row[] = [];
  for (const n of sizes) {
    rows.push(await measure(n));
    process.stderr.write(`N=${n} done, load ${load()}\n`);
  }
  const f = (x: number | string) => (typeof x === 'number' ? fmtMs(x) : x);
  process.stdout.write(`nft-table-scan, ${started}, repeat ${repeat}\n\n`);
  process.stdout.write('| Services | kube-proxy tables | `nft list tables ip` | probe by name (median) | restart: first full sync (its probe) | `trace --live` | cleanup | load |\n|---:|---:|---:|---:|---:|---:|---:|---|\n');
  for (const r of rows) {
    process.stdout.write(`| ${r.n.toLocaleString('en-US')} | ${r.tables} | ${f(r.listMs)} | ${f(r.probeMs)} | ${f(r.restartSyncMs)} (${f(r.restartScanMs)}) | ${f(r.traceMs)} | ${f(r.cleanupMs)} | ${r.load.join(' → ')} |\n`);
  }
} finally {
  await nss.deleteAll();
}
