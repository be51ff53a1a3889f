// kproxy's own time in an iptables partial sync (no kernel: a runner that accepts every
// command), at N services × 5 endpoints: what a one-service change costs before
// iptables-restore runs. `node --import tsx bench/iptables-inprocess.ts [--sizes 100,1000,10000] [--changes 20]`
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import type { CommandRunner } from '../src/kernel/runner.ts';
import { silentLogger } from '../src/log.ts';
import { IptablesProxier } from '../src/modes/iptables/proxier.ts';
import { benchConfig, Workload } from './workload.ts';

const accept: CommandRunner = { run: async () => ({ code: 0, stdout: '', stderr: '' }) };

export async function inProcess(n: number, changes: number): Promise<{ fullMs: number; changeMs: number[]; changeCpuMs: number[] }> {
  const w = new Workload(n, 5, benchConfig('iptables'));
  const p = new IptablesProxier({ runner: accept, log: silentLogger(), config: w.input().config });
  const t0 = performance.now();
  await p.sync(w.input(), w.serviceKeys, true);
  const fullMs = performance.now() - t0;
  const changeMs: number[] = [];
  // CPU time too: on the shared machine wall time is mostly waiting for a core
  const changeCpuMs: number[] = [];
  for (let k = 0; k < changes; k++) {
    const changed = w.addEndpoint(Math.floor(((k + 0.5) / changes) * n) % n);
    const c1 = process.cpuUsage();
    const t1 = performance.now();
    await p.sync(w.input(), changed, false);
    changeMs.push(performance.now() - t1);
    const c = process.cpuUsage(c1);
    changeCpuMs.push((c.user + c.system) / 1000);
  }
  return { fullMs, changeMs, changeCpuMs };
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { sizes: { type: 'string', default: '100,1000,10000' }, changes: { type: 'string', default: '20' } } });
  process.stdout.write('| services (N) | full sync, in-process | one-service change, in-process (median) | its CPU time (median) |\n|---:|---:|---:|---:|\n');
  for (const n of values.sizes!.split(',').map(Number)) {
    const r = await inProcess(n, Number(values.changes));
    const med = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    process.stdout.write(`| ${n.toLocaleString('en-US')} | ${r.fullMs.toFixed(0)} ms | ${med(r.changeMs).toFixed(1)} ms | ${med(r.changeCpuMs).toFixed(1)} ms |\n`);
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
