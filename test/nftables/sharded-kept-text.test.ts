// The nftables proxier does not keep a big transaction's text between syncs (at 10,000
// Services it would be a large share of the mode's RSS): after a
// successful one over MAX_KEPT_TRANSACTION_CHARS lastTransactionText() is '', as NftProxier's;
// a small one is kept for /debug. A line refused in a big one is named from nft's error, and
// its Service left out. In-process only: the kernel is the nft fake (the kernel
// tests apply the same texts for real).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { MAX_KEPT_TRANSACTION_CHARS } from '../../src/modes/nftables/proxier.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { nodePortService, numberedSlice } from '../support/builders.ts';

function input(n: number): { input: PlanInput; keys: Set<string> } {
  const tracker = new ProxyStateTracker(4, 'node-a');
  for (let i = 0; i < n; i++) {
    tracker.services.update(null, nodePortService(i, { clusterIP: `172.30.${i >> 8}.${(i & 255) + 1}` }));
    tracker.endpoints.update(null, numberedSlice(i % 250, 2, 'node-b'));
  }
  const keys = tracker.apply();
  return { input: { state: tracker.state, config: resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' }), node: { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 } }, keys };
}

test('a big successful transaction is not kept; a small one is', async () => {
  const shards = { threshold: 100, perTable: 100, maxTables: 4 };
  const big = input(3000);
  const kernel = new FakeNft();
  const applied = kernel.applied;
  const p = new NftProxier({ runner: kernel, log: silentLogger(), shards });
  await p.sync(big.input, big.keys, true);
  assert.equal(p.tables().length, 4);
  assert.equal(applied.length, 1, 'one transaction');
  assert.ok(applied[0].length > MAX_KEPT_TRANSACTION_CHARS, `the full sync's text is big (${applied[0].length} chars)`);
  assert.equal(p.lastTransactionText(), '', 'not kept after success');
  const small = input(2);
  const q = new NftProxier({ runner: new FakeNft(), log: silentLogger(), shards });
  await q.sync(small.input, small.keys, true);
  assert.match(q.lastTransactionText(), /^add table ip kube-proxy /m, 'a small one is kept');
});

test('a line refused in a big full transaction still excludes its Service: the line is named from nft\'s error, the operations are not kept', async () => {
  const shards = { threshold: 100, perTable: 100, maxTables: 4 };
  const big = input(3000);
  // the kernel refuses svc1234's cluster IP, as nft refuses an address it cannot take
  const kernel = new FakeNft({ refuse: (line) => (line.includes('172.30.4.211 ') ? 'Could not process rule: Invalid argument' : null) });
  const p = new NftProxier({ runner: kernel, log: silentLogger(), shards });
  const stats = await p.sync(big.input, big.keys, true);
  assert.deepEqual(stats.excludedServices, ['ns/svc1234']);
  assert.ok(kernel.applied.at(-1)!.length > MAX_KEPT_TRANSACTION_CHARS, 'the repaired transaction is big too');
  assert.doesNotMatch(kernel.applied.at(-1)!, /172\.30\.4\.211 /);
  assert.match(kernel.applied.at(-1)!, /172\.30\.4\.212 /, 'the next Service is programmed');
});
