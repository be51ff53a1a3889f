// Pure: which removed elements a partial transaction leaves in the kernel (transaction.ts,
// deferrable), and how a later transaction treats an element that lingers: re-used as it is,
// replaced (deleted first), or deleted at once when its chain serves again. The kernel side
// is in deferred-delete-kernel.test.ts.
import { renderOps } from '../../src/kernel/nft/model.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { optionsFromInput, planRuleset } from '../../src/modes/nftables/plan.ts';
import { elementKey, type NftElement, type Ruleset } from '../../src/modes/nftables/ruleset.ts';
import { deferrable, partialTransaction, type LingeringElement } from '../../src/modes/nftables/transaction.ts';
import { nodePortService, numberedSlice } from '../support/builders.ts';

const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };
const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });

function world() {
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < 3; i++) {
    tracker.services.update(null, nodePortService(i));
    tracker.endpoints.update(null, numberedSlice(i, 2));
  }
  tracker.apply();
  const plan = (): Ruleset => planRuleset(tracker.state, optionsFromInput({ state: tracker.state, config, node: NODE }));
  return { tracker, plan };
}

function asMap(items: LingeringElement[]): Map<string, Map<string, NftElement>> {
  const m = new Map<string, Map<string, NftElement>>();
  for (const { set, el } of items) {
    if (!m.has(set)) m.set(set, new Map());
    m.get(set)!.set(elementKey(el.key), el);
  }
  return m;
}

test('deferrable: a ClusterIP, or a jump into a chain flushed in the same transaction; nothing else', () => {
  const flushed = new Set(['service-X']);
  assert.equal(deferrable('cluster-ips', { key: ['172.30.0.1'] }, flushed), true);
  assert.equal(deferrable('service-ips', { key: ['172.30.0.1', 'tcp', '80'], value: 'goto service-X' }, flushed), true);
  assert.equal(deferrable('service-ips', { key: ['172.30.0.1', 'tcp', '80'], value: 'goto service-Y' }, flushed), false, 'a live chain: it would still NAT');
  assert.equal(deferrable('no-endpoint-services', { key: ['172.30.0.1', 'tcp', '80'], value: 'goto reject-chain' }, flushed), false);
  assert.equal(deferrable('no-endpoint-nodeports', { key: ['tcp', '30001'], value: 'drop' }, flushed), false);
  assert.equal(deferrable('nodeport-ips', { key: ['192.168.0.2'] }, flushed), false);
});

test('a Service deleted: no delete element; re-created: its lingering elements re-used; moved to another VIP: the old one deleted at once', () => {
  const { tracker, plan } = world();
  const t0 = plan();
  tracker.services.update(nodePortService(1), null);
  tracker.endpoints.update(numberedSlice(1, 2), null);
  tracker.apply();
  const t1 = plan();
  const del = partialTransaction(t1, t0);
  assert.doesNotMatch(renderOps(del.ops), /^delete /m);
  assert.deepEqual(del.lingering.map(({ set, el }) => `${set} ${elementKey(el.key)}`).sort(), ['cluster-ips 172.30.0.2', 'service-ips 172.30.0.2 . tcp . 80', 'service-nodeports tcp . 30001']);
  for (const { el } of del.lingering.filter((l) => l.el.value)) assert.ok(del.staleChains.includes(el.value!.replace(/^goto /, '')), 'each jumps into a chain retired (flushed) here');
  // Without deferral (the proxier's option off) the same change deletes them.
  assert.equal(renderOps(partialTransaction(t1, t0, { deferRemovals: false }).ops).match(/^delete element /gm)?.length, 3);

  // Re-created as it was: the lingering elements are already right.
  tracker.services.update(null, nodePortService(1));
  tracker.endpoints.update(null, numberedSlice(1, 2));
  tracker.apply();
  const t2 = plan();
  const back = partialTransaction(t2, t1, { lingering: asMap(del.lingering) });
  assert.doesNotMatch(renderOps(back.ops), /^delete /m);
  assert.doesNotMatch(renderOps(back.ops), /172\.30\.0\.2 \. tcp \. 80 :|cluster-ips .*172\.30\.0\.2|tcp \. 30001 :/, 'not re-added');
  assert.equal(back.revived.length, 3);
  assert.match(renderOps(back.ops), /^add chain ip kube-proxy service-\S+-ns\/svc1\/tcp\/http \{/m, 'its chain is written again');

  // Re-created under the same name with another ClusterIP: the old VIP's element would lead
  // into the live chain again, so it goes in the same transaction.
  tracker.services.update(null, nodePortService(1, { clusterIP: '172.30.0.99' }));
  tracker.endpoints.update(null, numberedSlice(1, 2));
  tracker.apply();
  const t3 = plan();
  const moved = partialTransaction(t3, t1, { lingering: asMap(del.lingering) });
  assert.match(renderOps(moved.ops), /^delete element ip kube-proxy service-ips \{ 172\.30\.0\.2 \. tcp \. 80 \}$/m);
  assert.match(renderOps(moved.ops), /172\.30\.0\.99 \. tcp \. 80 : goto service-/);
  assert.doesNotMatch(renderOps(moved.ops), /^delete element ip kube-proxy cluster-ips/m, 'the old ClusterIP itself stays harmless until the cleanup');
  assert.deepEqual(moved.revived.map(({ set }) => set).sort(), ['service-ips', 'service-nodeports']);
});

test('a lingering element wanted with another value is deleted first, then added', () => {
  const { tracker, plan } = world();
  const t0 = plan();
  const kept = asMap([{ set: 'service-ips', el: { key: ['172.30.0.50', 'tcp', '80'], value: 'goto service-OLD' } }]);
  tracker.services.update(null, nodePortService(49));
  tracker.endpoints.update(null, numberedSlice(49, 1));
  tracker.apply();
  const tx = partialTransaction(plan(), t0, { lingering: kept });
  const lines = renderOps(tx.ops).split('\n');
  const del = lines.findIndex((l) => l === 'delete element ip kube-proxy service-ips { 172.30.0.50 . tcp . 80 }');
  const add = lines.findIndex((l) => /service-ips .*172\.30\.0\.50 \. tcp \. 80 : goto service-/.test(l));
  assert.ok(del >= 0 && add > del, renderOps(tx.ops));
  assert.equal(tx.revived.length, 1);
});
