// The periodic sync every syncPeriod is a partial one: with nothing changed it writes nothing
// to the kernel in the iptables and nftables modes, so a large cluster is not rewritten every
// 30 s. The proxiers against the stateful fake iptables and a fake nft.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import { makeSlice, nodePortService, numberedSlice } from '../support/builders.ts';

const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };

function state(n: number) {
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < n; i++) {
    tracker.services.update(null, nodePortService(i));
    tracker.endpoints.update(null, numberedSlice(i, 1, 'node-b'));
  }
  return { tracker, changed: tracker.apply() };
}

test('iptables: a periodic partial sync with no change runs no iptables-restore', async () => {
  const { tracker, changed } = state(20);
  const fake = new FakeIptables(4);
  const config = { ...resolveConfig({ mode: 'iptables' }), clusterCIDRs: ['10.0.0.0/8'] };
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  let t = 1_000_000;
  const proxier = new IptablesProxier({ runner: fake, log: silentLogger(), config, now: () => t });
  const restores = () => fake.calls.filter((c) => c.cmd === 'iptables-restore').length;
  await proxier.sync(input, changed, true);
  assert.ok(restores() >= 1, 'the first full sync restores');
  const after = restores();
  for (let i = 0; i < 3; i++) {
    t += config.syncPeriodMs;
    const stats = await proxier.sync(input, new Set(), false);
    assert.equal(stats.rulesWritten, 0);
  }
  assert.equal(restores(), after, 'no restore for periodic syncs without changes');
  // a change is still written by the next partial sync
  tracker.endpoints.update(null, makeSlice('ns', 'svc3', { name: 'svc3-y', endpoints: [{ ip: '10.180.3.2', ready: true }], ports: [{ name: 'http', port: 8080 }] }));
  const stats = await proxier.sync(input, tracker.apply(), false);
  assert.equal(restores(), after + 1);
  assert.ok(stats.rulesWritten > 0);
});

test('nftables: a periodic partial sync with no change runs no nft -f', async () => {
  const { tracker, changed } = state(20);
  const nft = new FakeNft();
  const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  const proxier = new NftProxier({ runner: nft, log: silentLogger(), staleChainDelayMs: 0 });
  await proxier.sync(input, changed, true);
  assert.equal(nft.applied.length, 1);
  for (let i = 0; i < 3; i++) {
    const stats = await proxier.sync(input, new Set(), false);
    assert.equal(stats.rulesWritten, 0);
  }
  assert.equal(nft.applied.length, 1, 'no transaction for periodic syncs without changes');
});
