// Real kernel: the nftables mode's cleanup (`kproxy cleanup`, and the other modes' start when
// switching away from nftables) removes every kube-proxy table of ip and ip6 — upstream's
// `kube-proxy` and the shards' `kube-proxy-<n>` — and nothing else: not an inet
// table of the same name, not a look-alike name, not another program's table; the tables are
// found by name (`nft -c` of `create table`), never by listing the family. The namespace
// comes from uniqueName() and is removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, runChecked, type CommandRunner } from '../../src/kernel/runner.ts';
import { NftExecutor } from '../../src/kernel/nft/exec.ts';
import { silentLogger } from '../../src/log.ts';
import { isKubeProxyTable, kubeProxyTableNames, shardTable } from '../../src/modes/nftables/names.ts';
import { mode } from '../../src/modes/nftables/index.ts';
import { uniqueName } from '../support/netns.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { resolveConfig } from '../../src/config/config.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { nodePortService, numberedSlice } from '../support/builders.ts';

const NS = uniqueName('kpt-nft-shc');
const runner: CommandRunner = { run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', NS, cmd, ...args], opts) };

const OURS = ['ip kube-proxy', 'ip kube-proxy-0', 'ip kube-proxy-7', 'ip kube-proxy-15', 'ip kube-proxy-63', 'ip6 kube-proxy', 'ip6 kube-proxy-2'];
const FOREIGN = ['ip cni-other', 'ip kube-proxy-x', 'ip kube-proxy-01', 'ip kube-proxy-64', 'ip kube-proxy-100', 'ip kube-proxyfoo', 'ip6 kube-proxy-', 'inet kube-proxy', 'inet kube-proxy-1', 'arp kube-proxy-3'];

async function tables(): Promise<string[]> {
  const r = await runChecked(runner, 'nft', ['list', 'tables'], { timeoutMs: 10_000 });
  return r.stdout.split('\n').filter(Boolean).map((l) => l.replace(/^table /, '')).sort();
}

/** The kube-proxy tables of ip and ip6 in the namespace (other tests' foreign tables left out). */
async function ours(): Promise<string[]> {
  return (await tables()).filter((t) => /^ip6? /.test(t) && isKubeProxyTable(t.split(' ')[1]));
}

before(async () => {
  await runChecked(hostRunner, 'ip', ['netns', 'add', NS], { timeoutMs: 10_000 });
});

after(async () => {
  await hostRunner.run('ip', ['netns', 'del', NS], { timeoutMs: 10_000 });
});

test('the shard table names', () => {
  assert.equal(shardTable(0), 'kube-proxy-0');
  assert.equal(shardTable(15), 'kube-proxy-15');
  for (const n of ['kube-proxy', 'kube-proxy-0', 'kube-proxy-9', 'kube-proxy-15', 'kube-proxy-63']) assert.ok(isKubeProxyTable(n), n);
  for (const n of ['kube-proxy-', 'kube-proxy-01', 'kube-proxy-x', 'kube-proxy-1a', 'kube-proxyfoo', 'xkube-proxy', 'kube-proxy-64', 'kube-proxy-1000', 'kube-proxy-10000', 'cni-other']) assert.ok(!isKubeProxyTable(n), n);
});

test('cleanup removes kube-proxy and every kube-proxy-<n> table of ip and ip6, and nothing else', async () => {
  const input = [...OURS, ...FOREIGN].map((t) => `add table ${t}\n`).join('') +
    // a table with content: deleting it takes its chains and sets with it
    'add chain ip kube-proxy-7 nat-output { type nat hook output priority -100 ; }\nadd set ip kube-proxy-7 cluster-ips { type ipv4_addr ; }\n';
  await runChecked(runner, 'nft', ['-f', '-'], { input, timeoutMs: 10_000 });
  assert.deepEqual(await tables(), [...OURS, ...FOREIGN].sort());
  // the probe by name finds exactly the kube-proxy tables of the family, and changes nothing
  const exec = new NftExecutor(runner);
  assert.deepEqual(await exec.existingTables('ip', kubeProxyTableNames()), ['kube-proxy', 'kube-proxy-0', 'kube-proxy-7', 'kube-proxy-15', 'kube-proxy-63']);
  assert.deepEqual(await exec.existingTables('ip6', kubeProxyTableNames()), ['kube-proxy', 'kube-proxy-2']);
  assert.deepEqual(await exec.existingTables('ip', ['kube-proxy-1', 'cni-other', 'kube-proxy-64']), ['cni-other', 'kube-proxy-64']);
  assert.deepEqual(await exec.existingTables('ip6', ['kube-proxy-0']), []);
  assert.deepEqual(await tables(), [...OURS, ...FOREIGN].sort(), 'the probe created nothing');
  assert.deepEqual(kubeProxyTableNames().filter(isKubeProxyTable), kubeProxyTableNames());
  assert.equal(kubeProxyTableNames().length, 65);

  await mode.cleanup(runner, silentLogger());
  assert.deepEqual(await tables(), [...FOREIGN].sort(), 'only kube-proxy tables were removed');
  // idempotent
  await mode.cleanup(runner, silentLogger());
  assert.deepEqual(await tables(), [...FOREIGN].sort());
});

test('a restart over sharded tables (one listing of the names), a live trace and cleanup find the tables by name, never by `nft list tables` or `list ruleset`', async () => {
  // `nft list tables` (nft 1.0.6) reads every table whole first: 31–55 s at 10,000 Services in
  // 16 tables (docs/benchmarks.md); the probe by name costs the same at any size.
  const calls: string[][] = [];
  const recording: CommandRunner = { run: (cmd, args, opts) => { calls.push([cmd, ...args]); return runner.run(cmd, args, opts); } };
  const tracker = new ProxyStateTracker(4, 'node-a');
  for (let i = 0; i < 8; i++) {
    tracker.services.update(null, nodePortService(i));
    tracker.endpoints.update(null, numberedSlice(i, 2, 'node-b'));
  }
  const keys = tracker.apply();
  const input: PlanInput = { state: tracker.state, config: resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' }), node: { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 } };
  const shards = { threshold: 4, perTable: 2, maxTables: 4 };
  // an earlier run's leftovers: upstream's single table and a shard index the new K does not use
  await runChecked(runner, 'nft', ['-f', '-'], { input: 'add table ip kube-proxy\nadd table ip kube-proxy-9\n', timeoutMs: 10_000 });
  const first = new NftProxier({ runner: recording, log: silentLogger(), shards });
  await first.sync(input, keys, true);
  assert.deepEqual(first.tables(), ['kube-proxy-0', 'kube-proxy-1', 'kube-proxy-2', 'kube-proxy-3']);
  assert.deepEqual(await ours(), ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2', 'ip kube-proxy-3'], 'the leftovers went with the first full sync');
  // a restarted kproxy over the tables already there, one Service fewer: its full sync learns
  // the tables' names from one listing of the family and deletes the gone Service's chains
  const gone = new ProxyStateTracker(4, 'node-a');
  for (let i = 0; i < 7; i++) {
    gone.services.update(null, nodePortService(i));
    gone.endpoints.update(null, numberedSlice(i, 2, 'node-b'));
  }
  const fewer: PlanInput = { ...input, state: gone.state };
  assert.match((await runChecked(runner, 'nft', ['list', 'chains', 'ip'], { timeoutMs: 10_000 })).stdout, /ns\/svc7\//, 'svc7 has chains before');
  calls.length = 0;
  const second = new NftProxier({ runner: recording, log: silentLogger(), shards });
  await second.sync(fewer, gone.apply(), true);
  assert.deepEqual(calls.filter((c) => c[0] === 'nft' && c.includes('list')).map((c) => c.slice(1).join(' ')), ['list chains ip', '-t list sets ip', '-t list maps ip'], 'one listing of the names for every table, no table listed whole');
  // the gone Service's chains are known from the listing: flushed now (deleted later, off the sync's path)
  assert.match(second.lastTransactionText(), /^flush chain ip kube-proxy-\d \S+ns\/svc7\/tcp\/http$/m, 'the gone Service\'s chains are flushed');
  const rules = (await runChecked(runner, 'nft', ['list', 'ruleset', 'ip'], { timeoutMs: 10_000 })).stdout;
  assert.doesNotMatch(rules, /dnat to 10\.180\.7\./, 'no rule sends to the gone Service\'s endpoints');
  assert.match(rules, /dnat to 10\.180\.6\./);
  const live = await mode.trace!({ from: '10.0.0.9', to: '172.30.0.1', port: 80, protocol: 'TCP', live: true }, { runner: recording });
  assert.match(live.output, /^10\.180\./, `live trace: ${live.output} ${live.notes?.join('; ')}`);
  await mode.cleanup(recording, silentLogger());
  assert.deepEqual(await ours(), [], 'cleanup removed the shard tables');
  const listings = calls.filter((c) => c[0] === 'nft' && c.includes('list') && (c.includes('tables') || c.includes('ruleset')));
  assert.deepEqual(listings, [], 'no whole-family listing');
  assert.ok(calls.filter((c) => c[0] === 'nft' && c[1] === '-c').length >= 4, 'the tables were probed by name (two syncs, the trace, the cleanup)');
});
