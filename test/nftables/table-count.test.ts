// How many tables the nftables mode writes comes from one rule (shards.ts chooseTables):
// `kproxy render` and a freshly started proxier agree at every Service count, around the
// thresholds too; `nftables.tables: n` is always n tables (1: upstream's one `kube-proxy`
// table, even at 1,500 Services), and the sync reports the count for kproxy_nftables_tables.
// render in parts is the same text, a table at a time. In-process: the kernel is the nft
// fake, which also reads render's text.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig, type NftablesTables } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import { silentLogger } from '../../src/log.ts';
import { dumpRuleset, mode, optionsFromInput } from '../../src/modes/nftables/index.ts';
import { planShardedRulesets } from '../../src/modes/nftables/shards.ts';
import { nodePortService, numberedSlice } from '../support/builders.ts';

const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };

function inputOf(n: number, tables: NftablesTables = 'auto'): { input: PlanInput; changed: Set<string> } {
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < n; i++) {
    tracker.services.update(null, nodePortService(i, { clusterIP: `172.30.${i >> 7}.${(i & 127) + 1}` }));
    tracker.endpoints.update(null, numberedSlice(i, 1, 'node-b'));
  }
  const changed = tracker.apply();
  const config = resolveConfig({ nftables: { tables } }, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  return { input: { state: tracker.state, config, node: NODE }, changed };
}

/** The tables `kproxy render`'s text makes in an empty kernel. */
async function renderedTables(input: PlanInput): Promise<string[]> {
  const kernel = new FakeNft();
  const r = await kernel.run('nft', ['-f', '-'], { input: mode.render(input) });
  assert.equal(r.code, 0, r.stderr);
  return kernel.tableNames();
}

/** The tables a freshly started proxier writes with one full sync, and the count it reports. */
async function proxierTables(input: PlanInput, changed: Set<string>): Promise<{ tables: string[]; reported?: number }> {
  const kernel = new FakeNft();
  const proxier = await mode.createProxier({ config: input.config, log: silentLogger(), runner: kernel, family: 4 });
  const stats = await proxier.sync(input, changed, true);
  return { tables: kernel.tableNames(), reported: stats.tables };
}

test('render and a freshly started proxier write the same tables at every Service count', async () => {
  const seen = new Set<number>();
  for (const n of [1, 799, 800, 999, 1000, 1001]) {
    const { input, changed } = inputOf(n);
    const rendered = await renderedTables(input);
    const synced = await proxierTables(input, changed);
    assert.deepEqual(synced.tables, rendered, `${n} Services`);
    assert.equal(synced.reported, rendered.length, `${n} Services: the count reported`);
    seen.add(rendered.length);
  }
  assert.deepEqual([...seen].sort(), [1, 2], 'the counts cross the threshold');
});

test('nftables.tables: 1 keeps upstream\'s one kube-proxy table at 1,500 Services; n is always n tables', async () => {
  const one = inputOf(1500, 1);
  assert.deepEqual(await renderedTables(one.input), ['ip kube-proxy']);
  assert.deepEqual(await proxierTables(one.input, one.changed), { tables: ['ip kube-proxy'], reported: 1 });
  const auto = inputOf(1500);
  assert.deepEqual(await renderedTables(auto.input), ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2'], 'auto: 1,500 / 600 per table');
  const three = inputOf(10, 3);
  assert.deepEqual(await renderedTables(three.input), ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2']);
  assert.deepEqual(await proxierTables(three.input, three.changed), { tables: ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2'], reported: 3 });
});

test('render in parts is render a table at a time, each table in parts of whole lines', async () => {
  for (const n of [10, 1_500]) {
    const { input } = inputOf(n);
    const parts = [...mode.renderParts!(input)];
    const tables = planShardedRulesets(input.state, optionsFromInput(input)).map(dumpRuleset);
    assert.equal(parts.join(''), tables.join(''));
    // no part spans two tables, and every part ends a line
    let t = 0;
    let rest = tables[0];
    for (const part of parts) {
      assert.ok(part.endsWith('\n'), `${n} Services: a part ends a line`);
      assert.ok(rest.startsWith(part), `${n} Services: a part within table ${t}`);
      rest = rest.slice(part.length);
      if (rest === '') rest = tables[++t] ?? '';
    }
    assert.equal(t, tables.length);
    assert.equal(tables.length, (await renderedTables(input)).length, `${n} Services`);
  }
  // one table of 1,500 Services is written in more than one part
  const one = inputOf(1500, 1);
  const oneParts = [...mode.renderParts!(one.input)];
  assert.ok(oneParts.length > 1, `${oneParts.length} parts`);
  assert.equal(oneParts.join(''), mode.render(one.input));
  assert.equal((await renderedTables(one.input)).length, 1);
});
