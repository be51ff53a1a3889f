// Profiles the userspace TCP data path: one TcpForwarder (bench/userspace-forwarder-main.ts)
// under `node --cpu-prof`, in a fresh network namespace with an nginx backend, loaded by
// wrk (new connections with Connection: close, then keep-alive c=32). Prints the top
// frames by self time as a markdown table (and keeps the .cpuprofile with --keep DIR, which
// Chrome DevTools or speedscope open as a flame graph).
//   sudo node --import tsx bench/userspace-profile.ts [--duration 5] [--keep DIR]
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, cpSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Netns, uniqueName } from '../test/support/netns.ts';
import { BACKEND, HTTP_PORT, inNs, nginxBackendConf, parseWrk, waitListening } from './userspace.ts';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
}

/** Self time per frame (function, file:line), in percent of all samples, largest first. */
export function topFrames(p: Profile, n = 25): { frame: string; selfPct: number }[] {
  const byId = new Map(p.nodes.map((x) => [x.id, x]));
  const self = new Map<string, number>();
  for (const id of p.samples) {
    const f = byId.get(id)!.callFrame;
    const file = f.url.replace(/^.*\/(node_modules|src|bench)\//, '$1/').replace(/^node:/, 'node:');
    const key = `${f.functionName || '(anonymous)'} ${file ? `${file}:${f.lineNumber + 1}` : ''}`.trim();
    self.set(key, (self.get(key) ?? 0) + 1);
  }
  const total = p.samples.length || 1;
  return [...self.entries()].map(([frame, c]) => ({ frame, selfPct: (100 * c) / total })).sort((a, b) => b.selfPct - a.selfPct).slice(0, n);
}

async function main(): Promise<void> {
  const { values } = parseArgs({ options: { duration: { type: 'string', default: '5' }, keep: { type: 'string' } } });
  const d = Number(values.duration);
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-prof-'));
  const ns = Netns.create(uniqueName('kpb-usprof'));
  const out: string[] = [];
  const onSignal = () => void ns.destroy().then(() => process.exit(130));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    writeFileSync(join(dir, 'nginx-backend.conf'), nginxBackendConf(dir));
    ns.spawn('nginx', ['-c', join(dir, 'nginx-backend.conf'), '-p', dir]);
    await waitListening(ns, BACKEND, HTTP_PORT);
    const fwd = ns.spawn(process.execPath, ['--cpu-prof', '--cpu-prof-dir', dir, '--import', 'tsx', 'bench/userspace-forwarder-main.ts', '127.0.0.8:80', `${BACKEND}:${HTTP_PORT}`]);
    await waitListening(ns, '127.0.0.8', 80);
    const url = 'http://127.0.0.8:80/';
    await inNs(ns, 'wrk', ['-t1', '-c32', '-d1s', url], 30_000);
    const close = parseWrk(await inNs(ns, 'wrk', ['-t1', '-c16', `-d${d}s`, '-H', 'Connection: close', url], (d + 30) * 1000));
    const ka = parseWrk(await inNs(ns, 'wrk', ['-t1', '-c32', `-d${d}s`, url], (d + 30) * 1000));
    const exited = new Promise((r) => fwd.once('exit', r));
    process.kill(fwd.pid!, 'SIGTERM');
    await Promise.race([exited, new Promise((r) => setTimeout(r, 10_000))]);
    const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
    if (!file) throw new Error('no .cpuprofile written');
    if (values.keep) cpSync(join(dir, file), join(values.keep, 'userspace-tcp.cpuprofile'));
    const prof = JSON.parse(readFileSync(join(dir, file), 'utf8')) as Profile;
    out.push(`conn/s ${close.rps.toFixed(0)}, keep-alive req/s ${ka.rps.toFixed(0)} (under the profiler)\n`);
    out.push('| self % | frame |\n|---:|---|');
    for (const t of topFrames(prof)) out.push(`| ${t.selfPct.toFixed(1)} | \`${t.frame}\` |`);
  } finally {
    await ns.destroy();
    rmSync(dir, { recursive: true, force: true });
  }
  // Printed after the clean-up: a reader that stops early (| head) cannot leave a namespace behind.
  process.stdout.on('error', () => {});
  console.log(out.join('\n'));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
