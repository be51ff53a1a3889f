// BlockCache.compact (memory, kproxy not upstream): after a full sync the planner keeps
// only what partial syncs read of unchanged services. Every plan after it, full or partial,
// must be exactly the plan it would have been without it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BlockCache } from '../../src/modes/iptables/blocks.ts';
import { planFull, withText } from '../../src/modes/iptables/full.ts';
import { planPartial } from '../../src/modes/iptables/partial.ts';
import type { Plan } from '../../src/modes/iptables/plan.ts';
import { optionsFromConfig } from '../../src/modes/iptables/options.ts';
import { IptablesSyncState } from '../../src/modes/iptables/sync-state.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';

function cluster(n: number) {
  const t = tracker();
  for (let i = 1; i <= n; i++) {
    t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.0.${40 + i}`, type: 'NodePort', nodePort: 30000 + i }));
    t.endpoints.update(null, slice(`ns${i}`, `svc${i}`, `svc${i}-1`, [{ ip: `10.0.${i}.1` }, { ip: `10.0.${i}.2` }], [{ port: 80 }]));
  }
  t.apply();
  return t;
}

test('after compaction, full and partial plans are byte for byte what they were before it', () => {
  const t = cluster(6);
  const input = planInput(t, testConfig());
  const opts = optionsFromConfig(input.config, input.node);
  const cache = new BlockCache();
  const all = new Set([...t.state.services.values()].map((sp) => sp.serviceKey));
  // The applied blocks a plan hands to the sync state are the cached (compacted) blocks themselves.
  const plan = (p: Plan) => ({ ...p, applied: undefined });
  const full = plan(planFull({ state: t.state, opts, cache }));
  const partial = plan(planPartial({ state: t.state, opts, changed: new Set(['ns3/svc3']), cache }));
  const none = plan(planPartial({ state: t.state, opts, changed: new Set(), cache }));
  cache.compact(t.state);
  assert.deepEqual(plan(planPartial({ state: t.state, opts, changed: new Set(), cache })), none, 'nothing written: only the kept parts read');
  assert.deepEqual(plan(planPartial({ state: t.state, opts, changed: new Set(['ns3/svc3']), cache })), partial, 'a written service is rendered again');
  cache.compact(t.state);
  assert.deepEqual(plan(planFull({ state: t.state, opts, cache })), full);
  cache.compact(t.state);
  assert.deepEqual(planPartial({ state: t.state, opts, changed: all, cache }).payload, planFull({ state: t.state, opts, cache }).payload);
});

test('the sync state after a compacted full sync: an endpoint change writes the same payload as without compaction', () => {
  const run = (compact: boolean) => {
    const t = cluster(4);
    const input = planInput(t, testConfig());
    const opts = optionsFromConfig(input.config, input.node);
    const sync = new IptablesSyncState({ skipUnchangedChains: true });
    sync.installedNatChains = new Set();
    const first = withText(sync.plan(t.state, opts, new Set(), true));
    sync.commit(first);
    if (compact) sync.blocks.compact(t.state);
    t.endpoints.update(null, slice('ns2', 'svc2', 'svc2-1', [{ ip: '10.0.2.1' }, { ip: '10.0.2.9' }], [{ port: 80 }]));
    const second = withText(sync.plan(t.state, opts, t.apply(), false));
    return { first: first.payload, second: second.payload, written: second.natRulesWritten, total: second.natRulesTotal };
  };
  const plain = run(false);
  const compacted = run(true);
  assert.deepEqual(compacted, plain);
  assert.match(plain.second, /10\.0\.2\.9/);
  assert.ok(plain.written > 0 && plain.written < plain.total);
});
