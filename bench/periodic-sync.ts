// What the periodic sync (every syncPeriod, 30 s by default) costs with no change: it is a
// partial one, as upstream's, with a full sync (every rule rewritten) hourly. Side by side in
// one run, per size: a forced full sync and the no-change partial sync of the same proxier,
// medians of --repeat runs. The kernel is the
// stateful fake (src/kernel/iptables/fake.ts) or a fake nft that accepts every transaction: this
// measures kproxy's own work and what it would write (bytes, commands), not the kernel's time
// to apply it (docs/benchmarks.md has those). No root needed.
//
//   node --import tsx bench/periodic-sync.ts [--sizes 1000,10000] [--repeat 5]
import { parseArgs } from 'node:util';
import { resolveConfig } from '../src/config/config.ts';
import { ProxyStateTracker } from '../src/core/tracker.ts';
import type { CommandRunner, RunOptions, RunResult } from '../src/kernel/runner.ts';
import { FakeIptables } from '../src/kernel/iptables/fake.ts';
import { silentLogger } from '../src/log.ts';
import type { Proxier } from '../src/modes/types.ts';
import type { PlanInput } from '../src/core/nodeview.ts';
import { IptablesProxier } from '../src/modes/iptables/proxier.ts';
import { NftProxier } from '../src/modes/nftables/proxier.ts';

const { values } = parseArgs({ options: { sizes: { type: 'string', default: '1000,10000' }, repeat: { type: 'string', default: '5' } } });
const sizes = values.sizes!.split(',').map(Number);
const repeat = Math.max(1, Number(values.repeat));
const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };

function state(n: number) {
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < n; i++) {
    const ip = `172.30.${Math.floor(i / 250)}.${(i % 250) + 1}`;
    tracker.services.update(null, { metadata: { namespace: 'ns', name: `svc${i}` }, spec: { clusterIP: ip, ports: [{ name: 'http', protocol: 'TCP', port: 80 }] } });
    tracker.endpoints.update(null, {
      metadata: { namespace: 'ns', name: `svc${i}-x`, labels: { 'kubernetes.io/service-name': `svc${i}` } },
      addressType: 'IPv4',
      endpoints: [1, 2, 3, 4, 5].map((k) => ({ addresses: [`10.${180 + k}.${Math.floor(i / 250)}.${(i % 250) + 1}`], conditions: { ready: true }, nodeName: 'node-b' })),
      ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
    });
  }
  return { tracker, changed: tracker.apply() };
}

/** Counts the commands that write rules and the bytes they are given. */
class Counting implements CommandRunner {
  writes = 0;
  bytes = 0;
  constructor(private readonly inner: CommandRunner, private readonly isWrite: (cmd: string, args: string[]) => boolean) {}
  async run(cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
    if (this.isWrite(cmd, args)) {
      this.writes++;
      this.bytes += (opts.input ?? '').length;
    }
    return this.inner.run(cmd, args, opts);
  }
}

class AcceptingNft implements CommandRunner {
  private exists = false;
  async run(_cmd: string, args: string[]): Promise<RunResult> {
    if (args[0] === '-f') this.exists = true;
    if (args[0] === 'list' && !this.exists) return { code: 1, stdout: '', stderr: 'Error: No such file or directory' };
    return { code: 0, stdout: '', stderr: '' };
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function measure(mode: 'iptables' | 'nftables', n: number) {
  const { tracker, changed } = state(n);
  const config = { ...resolveConfig({}, { mode, clusterCidr: '10.0.0.0/8' }), clusterCIDRs: ['10.0.0.0/8'] };
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  let t = 1_000_000_000;
  const runner = mode === 'iptables'
    ? new Counting(new FakeIptables(4), (cmd) => cmd === 'iptables-restore')
    : new Counting(new AcceptingNft(), (_c, args) => args[0] === '-f');
  const proxier: Proxier = mode === 'iptables'
    ? new IptablesProxier({ runner, log: silentLogger(), config, now: () => t })
    : new NftProxier({ runner, log: silentLogger(), staleChainDelayMs: 0 });
  await proxier.sync(input, changed, true);
  const run = async (full: boolean) => {
    t += config.syncPeriodMs;
    const w0 = runner.writes;
    const b0 = runner.bytes;
    const s = performance.now();
    await proxier.sync(input, new Set(), full);
    return { ms: performance.now() - s, writes: runner.writes - w0, bytes: runner.bytes - b0 };
  };
  const fulls = [];
  const partials = [];
  for (let i = 0; i < repeat; i++) {
    fulls.push(await run(true));
    partials.push(await run(false));
  }
  await proxier.stop();
  return {
    full: { ms: median(fulls.map((x) => x.ms)), writes: median(fulls.map((x) => x.writes)), bytes: median(fulls.map((x) => x.bytes)) },
    partial: { ms: median(partials.map((x) => x.ms)), writes: median(partials.map((x) => x.writes)), bytes: median(partials.map((x) => x.bytes)) },
  };
}

console.log(`periodic sync with no change, medians of ${repeat} (node ${process.version}; fake kernel: kproxy's own work and what it writes)`);
console.log('| mode | services | full sync (old periodic) | partial sync (new periodic) |');
console.log('|---|---:|---:|---:|');
for (const mode of ['iptables', 'nftables'] as const) {
  for (const n of sizes) {
    const r = await measure(mode, n);
    const fmt = (x: { ms: number; writes: number; bytes: number }) => `${x.ms.toFixed(0)} ms, ${x.writes} write${x.writes === 1 ? '' : 's'}, ${(x.bytes / 1024).toFixed(0)} KiB`;
    console.log(`| ${mode} | ${n.toLocaleString('en')} | ${fmt(r.full)} | ${fmt(r.partial)} |`);
  }
}
