// Real kernel: a namespace programmed by NftProxier (one full sync, then partial syncs of
// one-service changes) holds the same `kube-proxy` table as a second namespace given the
// full render of the final state with `nft -f`. Both tables are read back with
// `nft list table`. Namespaces are named kpt-nft-inc-<pid>-*, removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { mode } from '../../src/modes/nftables/index.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { dropFlushedChains, dropLingering, dropRetiredAffinitySets, kernelTable, tableLines } from '../support/nft-retired.ts';
import { nsRunner } from './objects.ts';
import { clientIPAffinity, nodePortService, numberedSlice } from '../support/builders.ts';

const P = `kpt-nft-inc-${process.pid}`;
const NS = { partial: `${P}-a`, full: `${P}-b` };
const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };
const service = (i: number, sticky = false) => nodePortService(i, sticky ? clientIPAffinity(30) : {});
const slice = (i: number, n: number) => numberedSlice(i, n, 'node-b');

/** The kernel's table, sorted lines; `proxier`: leave out exactly its lingering elements (each checked present and harmless). */
async function table(ns: string, proxier?: NftProxier): Promise<string[]> {
  const t = await kernelTable(nsRunner(ns), 'ip', 'kube-proxy');
  if (proxier) assert.deepEqual(dropLingering(t, proxier.lingeringElements()), []);
  // Chains and affinity sets retired by a partial sync are flushed now and deleted later.
  dropFlushedChains(t);
  dropRetiredAffinitySets(t);
  return tableLines(t);
}

before(async () => {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
});

after(async () => {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
});

test('partial syncs leave the kernel table equal to a full render of the same state', async () => {
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < 20; i++) {
    tracker.services.update(null, service(i, i % 4 === 1));
    tracker.endpoints.update(null, slice(i, 3));
  }
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  const proxier = new NftProxier({ runner: nsRunner(NS.partial), log: silentLogger() });
  await proxier.sync(input, tracker.apply(), true);

  const changes = [
    () => tracker.endpoints.update(slice(2, 3), slice(2, 4)),
    () => tracker.endpoints.update(slice(5, 3), slice(5, 1)),
    () => tracker.endpoints.update(slice(9, 3), null),
    () => tracker.services.update(service(12), null),
    () => tracker.services.update(null, service(30, true)),
  ];
  for (const change of changes) {
    change();
    const stats = await proxier.sync(input, tracker.apply(), false);
    assert.ok(stats.rulesWritten > 0 && stats.rulesWritten < 40, `a small transaction (${stats.rulesWritten} objects)`);
  }
  await runChecked(nsRunner(NS.full), 'nft', ['-f', '-'], { input: mode.render(input), timeoutMs: 20_000 });
  assert.ok(proxier.lingeringElements().length > 0, 'the deleted Service\'s elements linger');
  assert.deepEqual(await table(NS.partial, proxier), await table(NS.full));
});
