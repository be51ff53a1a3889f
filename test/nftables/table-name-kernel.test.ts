// The table's name is a parameter of the planner (a shard is upstream's table under another
// name, `kube-proxy-<n>`). Pure: the planned table under another name is the default table's
// text with only the name changed. Real kernel: a proxier spreading the Services over two
// tables writes only `kube-proxy-0` and `kube-proxy-1`, its full and partial syncs land there
// (the kernel tables equal a fresh full sync's), and its retired chains and lingering
// elements are deleted there. The namespace comes from uniqueName() and is removed
// in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { optionsFromInput, planRuleset } from '../../src/modes/nftables/plan.ts';
import { fullTransaction } from '../../src/modes/nftables/transaction.ts';
import { renderOps } from '../../src/kernel/nft/model.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { kernelTables } from '../support/nft-retired.ts';
import { uniqueName } from '../support/netns.ts';
import { nsRunner } from './objects.ts';
import { clientIPAffinity, nodePortService, numberedSlice } from '../support/builders.ts';

const NS = { a: uniqueName('kpt-nft-tn-a'), b: uniqueName('kpt-nft-tn-b') };
const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };
const service = (i: number, sticky = false) => nodePortService(i, sticky ? clientIPAffinity(60) : {});
const slice = (i: number, n: number) => numberedSlice(i, n, 'node-a');
const SHARD = 'kube-proxy-3';
const TWO = { threshold: 1, perTable: 100, maxTables: 2 };
const TWO_TABLES = ['ip kube-proxy-0', 'ip kube-proxy-1'];

/** Every table of the namespace as "family name" → sorted dump lines. */
function tables(ns: string): Promise<Map<string, string[]>> {
  return kernelTables(nsRunner(ns));
}

before(async () => {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
});

after(async () => {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
});

test('the planned table under another name is the default table with only the name changed', () => {
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < 4; i++) {
    tracker.services.update(null, service(i, i === 1));
    tracker.endpoints.update(null, slice(i, i === 2 ? 0 : 2));
  }
  tracker.apply();
  const input: PlanInput = { state: tracker.state, config: resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' }), node: NODE };
  const o = optionsFromInput(input);
  const plain = renderOps(fullTransaction(planRuleset(input.state, o), null).ops);
  const named = renderOps(fullTransaction(planRuleset(input.state, { ...o, table: SHARD }), null).ops);
  assert.match(plain, / ip kube-proxy /);
  assert.doesNotMatch(named, / ip kube-proxy /, 'no line names the default table');
  assert.equal(named.split(` ip ${SHARD} `).join(' ip kube-proxy '), plain);
});

test('a proxier with two tables syncs (full, partial, idle) only those tables', async () => {
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < 6; i++) {
    tracker.services.update(null, service(i, i === 1));
    tracker.endpoints.update(null, slice(i, 3));
  }
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  let clock = 1_000_000;
  const proxier = new NftProxier({ runner: nsRunner(NS.a), log: silentLogger(), shards: TWO, now: () => clock, staleChainDelayMs: 1000 });
  await proxier.sync(input, tracker.apply(), true);
  assert.deepEqual([...(await tables(NS.a)).keys()].sort(), TWO_TABLES);

  // Changes that add, retire chains and sets, and leave elements lingering.
  const changes: Array<[string, () => void]> = [
    ['endpoint added', () => tracker.endpoints.update(slice(0, 3), slice(0, 4))],
    ['endpoints of a sticky Service removed', () => tracker.endpoints.update(slice(1, 3), slice(1, 1))],
    ['Service deleted', () => (tracker.services.update(service(4), null), tracker.endpoints.update(slice(4, 3), null))],
  ];
  for (const [what, change] of changes) {
    change();
    await proxier.sync(input, tracker.apply(), false);
    const sent = proxier.lastTransactionText().split('\n').filter(Boolean);
    assert.ok(sent.length > 0, `${what}: a transaction was sent`);
    for (const l of sent) assert.match(l, /^\S+ \S+ ip kube-proxy-[01] /, `${what}: every line names one of the tables`);
  }
  assert.ok(proxier.lingeringElements().length > 0, 'the deleted Service left lingering elements');
  // the idle sync after the delay deletes them and the retired chains, in the named table
  clock += 120_000;
  await proxier.sync(input, new Set(), false);
  assert.deepEqual(proxier.lingeringElements(), []);
  assert.equal(proxier.partialFallbacks, 0, 'no partial transaction was refused');

  const fresh = new NftProxier({ runner: nsRunner(NS.b), log: silentLogger(), shards: TWO });
  await fresh.sync(input, new Set(), true);
  const got = await tables(NS.a);
  assert.deepEqual([...got.keys()].sort(), TWO_TABLES, 'no other table was created');
  assert.deepEqual(got, await tables(NS.b), 'the tables equal a fresh full sync\'s');
});
