// Real kernel: the nftables mode's cleanup (`kproxy cleanup`, and the other modes' start when
// switching away from nftables) removes every kube-proxy table of ip and ip6 — upstream's
// `kube-proxy` and the shards' `kube-proxy-<n>` (issue 10) — and nothing else: not an inet
// table of the same name, not a look-alike name, not another program's table. The namespace
// comes from uniqueName() and is removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, runChecked, type CommandRunner } from '../../src/exec/runner.ts';
import { NftExecutor } from '../../src/exec/nft.ts';
import { silentLogger } from '../../src/log.ts';
import { isKubeProxyTable, shardTable } from '../../src/modes/nftables/names.ts';
import { mode } from '../../src/proxy/nftables/index.ts';
import { uniqueName } from '../support/netns.ts';

const NS = uniqueName('kpt-nft-shc');
const runner: CommandRunner = { run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', NS, cmd, ...args], opts) };

const OURS = ['ip kube-proxy', 'ip kube-proxy-0', 'ip kube-proxy-7', 'ip kube-proxy-15', 'ip6 kube-proxy', 'ip6 kube-proxy-2'];
const FOREIGN = ['ip cni-other', 'ip kube-proxy-x', 'ip kube-proxy-01', 'ip kube-proxyfoo', 'ip6 kube-proxy-', 'inet kube-proxy', 'inet kube-proxy-1', 'arp kube-proxy-3'];

async function tables(): Promise<string[]> {
  const r = await runChecked(runner, 'nft', ['list', 'tables'], { timeoutMs: 10_000 });
  return r.stdout.split('\n').filter(Boolean).map((l) => l.replace(/^table /, '')).sort();
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
  for (const n of ['kube-proxy', 'kube-proxy-0', 'kube-proxy-9', 'kube-proxy-15', 'kube-proxy-1000']) assert.ok(isKubeProxyTable(n), n);
  for (const n of ['kube-proxy-', 'kube-proxy-01', 'kube-proxy-x', 'kube-proxy-1a', 'kube-proxyfoo', 'xkube-proxy', 'kube-proxy-10000', 'cni-other']) assert.ok(!isKubeProxyTable(n), n);
});

test('cleanup removes kube-proxy and every kube-proxy-<n> table of ip and ip6, and nothing else', async () => {
  const input = [...OURS, ...FOREIGN].map((t) => `add table ${t}\n`).join('') +
    // a table with content: deleting it takes its chains and sets with it
    'add chain ip kube-proxy-7 nat-output { type nat hook output priority -100 ; }\nadd set ip kube-proxy-7 cluster-ips { type ipv4_addr ; }\n';
  await runChecked(runner, 'nft', ['-f', '-'], { input, timeoutMs: 10_000 });
  assert.deepEqual(await tables(), [...OURS, ...FOREIGN].sort());
  assert.deepEqual((await new NftExecutor(runner).listTables('ip')).filter(isKubeProxyTable).sort(), ['kube-proxy', 'kube-proxy-0', 'kube-proxy-15', 'kube-proxy-7']);

  await mode.cleanup(runner, silentLogger());
  assert.deepEqual(await tables(), [...FOREIGN].sort(), 'only kube-proxy tables were removed');
  // idempotent
  await mode.cleanup(runner, silentLogger());
  assert.deepEqual(await tables(), [...FOREIGN].sort());
});
