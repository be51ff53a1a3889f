import { test } from 'node:test';
import assert from 'node:assert/strict';
import { BlockCache } from '../../src/modes/iptables/blocks.ts';
import { planFull, withText } from '../../src/modes/iptables/full.ts';
import { planPartial } from '../../src/modes/iptables/partial.ts';
import { optionsFromConfig } from '../../src/modes/iptables/options.ts';
import { IptablesSyncState } from '../../src/modes/iptables/sync-state.ts';
import { undeclaredJumps } from '../../src/modes/iptables/normalize.ts';
import { serviceChains, endpointChainName } from '../../src/modes/iptables/names.ts';
import { servicePortsOf } from '../../src/core/convert.ts';
import type { ProxyState } from '../../src/core/model.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';

function optsFor(t: ReturnType<typeof tracker>, over = {}, family: 4 | 6 = 4, nodeIPs = ['192.168.0.2']) {
  const input = planInput(t, testConfig(over), family, nodeIPs);
  return optionsFromConfig(input.config, input.node);
}

function lines(text: string, re: RegExp): string[] {
  return text.split('\n').filter((l) => re.test(l));
}

test('partial sync writes only changed services and deletes chains that became stale', () => {
  const t = tracker();
  const add = (n: number) => {
    t.services.update(null, svc(`ns${n}`, `svc${n}`, { clusterIP: `172.30.0.${40 + n}` }));
    t.endpoints.update(null, slice(`ns${n}`, `svc${n}`, `svc${n}-1`, [{ ip: `10.0.${n}.1` }, { ip: `10.0.${n}.2` }], [{ port: 80 }]));
  };
  add(1);
  add(2);
  add(3);
  const opts = optsFor(t);
  const sync = new IptablesSyncState();
  sync.installedNatChains = new Set();
  const first = withText(sync.plan(t.state, opts, t.apply(), false));
  assert.equal(first.full, true, 'the first sync is full');
  assert.deepEqual(undeclaredJumps(first.payload), []);
  sync.commit(first);

  const [sp2] = servicePortsOf(svc('ns2', 'svc2', { clusterIP: '172.30.0.42' }), 4);
  const svc2 = serviceChains(sp2).svc;
  const sep2 = endpointChainName('ns2/svc2:p80', 'tcp', '10.0.2.2:80');

  // Delete svc2 and drop one endpoint of svc3.
  t.services.update(svc('ns2', 'svc2', { clusterIP: '172.30.0.42' }), null);
  t.endpoints.update(null, slice('ns3', 'svc3', 'svc3-1', [{ ip: '10.0.3.1' }], [{ port: 80 }]));
  const changed = t.apply();
  assert.deepEqual([...changed].sort(), ['ns2/svc2', 'ns3/svc3']);
  const second = withText(sync.plan(t.state, opts, changed, false));
  assert.equal(second.full, false);
  const p = second.payload;
  // svc1 is unchanged: its KUBE-SERVICES rule is rewritten, its own chains are not.
  assert.equal(lines(p, /^:KUBE-SVC-/).length, 2, 'svc3 chain declared + svc2 chain flushed for deletion');
  assert.ok(p.includes(`-X ${svc2}`), 'svc2 chain deleted');
  assert.ok(p.includes(`-X ${sep2}`), 'svc2 endpoint chain deleted');
  assert.ok(p.includes(`:${svc2} - [0:0]`), 'a deleted chain is flushed first');
  const sep3gone = endpointChainName('ns3/svc3:p80', 'tcp', '10.0.3.2:80');
  assert.ok(p.includes(`-X ${sep3gone}`), 'the removed endpoint of svc3 is deleted');
  assert.equal(lines(p, /"ns1\/svc1:p80 cluster IP".*-j KUBE-SVC-/).length, 1, 'svc1 still captured in KUBE-SERVICES');
  assert.equal(lines(p, /^-A KUBE-SVC-.*ns1\/svc1/).length, 0, 'svc1 chain not rewritten');
  assert.deepEqual(second.deletedChains.sort(), [svc2, endpointChainName('ns2/svc2:p80', 'tcp', '10.0.2.1:80'), sep2, sep3gone].sort());
  // Totals: what kproxy believes is installed after the sync.
  const full = planFull({ state: t.state, opts });
  assert.equal(second.natRulesTotal, full.natRulesTotal);
  assert.ok(second.natRulesWritten < second.natRulesTotal);
  sync.commit(second);

  // Nothing changed: nothing is deleted again, only the top-level chains are written.
  const third = withText(sync.plan(t.state, opts, new Set(), false));
  assert.deepEqual(third.deletedChains, []);
  assert.equal(lines(third.payload, /^:KUBE-(SVC|SEP)-/).length, 0);
});

test('after a failure the next sync is full', () => {
  const t = tracker();
  t.services.update(null, svc('ns1', 'svc1', { clusterIP: '172.30.0.41' }));
  t.endpoints.update(null, slice('ns1', 'svc1', 's1', [{ ip: '10.0.1.1' }], [{ port: 80 }]));
  const sync = new IptablesSyncState();
  const opts = optsFor(t);
  sync.commit(sync.plan(t.state, opts, t.apply(), false));
  assert.equal(withText(sync.plan(t.state, opts, new Set(), false)).full, false);
  sync.fail();
  const again = withText(sync.plan(t.state, opts, new Set(), false));
  assert.equal(again.full, true);
  assert.ok(again.payload.includes(':KUBE-SVC-'), 'full sync writes every service chain');
});

test('services without endpoints REJECT; Local without local endpoints DROPs external traffic', () => {
  const t = tracker();
  t.services.update(null, svc('ns1', 'none', { clusterIP: '172.30.0.41', type: 'NodePort', nodePort: 30001 }));
  t.services.update(null, svc('ns2', 'local', { clusterIP: '172.30.0.42', type: 'LoadBalancer', nodePort: 30002, lbIPs: ['1.2.3.4'], etp: 'Local' }));
  t.endpoints.update(null, slice('ns2', 'local', 's', [{ ip: '10.180.0.2', nodeName: 'other' }], [{ port: 80 }]));
  t.apply();
  const p = planFull({ state: t.state, opts: optsFor(t) }).payload;
  assert.ok(p.includes('-A KUBE-SERVICES -m comment --comment "ns1/none:p80 has no endpoints" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j REJECT'));
  assert.ok(p.includes('-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns1/none:p80 has no endpoints" -m addrtype --dst-type LOCAL -m tcp -p tcp --dport 30001 -j REJECT'));
  assert.ok(p.includes('-A KUBE-EXTERNAL-SERVICES -m comment --comment "ns2/local:p80 has no local endpoints" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP'));
  assert.ok(!p.includes(':KUBE-SVL-'), 'no local endpoints: no SVL chain');
  assert.deepEqual(undeclaredJumps(p), []);
});

test('IPv6: ip6tables text, no localhost NodePorts, no anti-martian rule, bracketed endpoints', () => {
  const t = tracker(6);
  t.services.update(null, svc('ns1', 'svc1', { clusterIP: 'fd00:172:30::41', type: 'NodePort', nodePort: 3001 }));
  t.endpoints.update(null, slice('ns1', 'svc1', 's', [{ ip: 'fd00:10::1' }], [{ port: 80 }], 6));
  t.apply();
  const opts = optsFor(t, { clusterCIDRs: ['fd00:10::/64'] }, 6, ['2001:db8::1']);
  const p = planFull({ state: t.state, opts }).payload;
  assert.ok(p.includes('-m addrtype --dst-type LOCAL ! -d ::1/128 -j KUBE-NODEPORTS'));
  assert.ok(!p.includes('KUBE-FIREWALL'));
  assert.ok(!p.includes('127.0.0.0/8'));
  assert.ok(p.includes('-j DNAT --to-destination [fd00:10::1]:80'));
  assert.ok(p.includes('! -s fd00:10::/64 -j KUBE-MARK-MASQ'));
});

test('masqueradeAll, no local detector, nodePortAddresses and localhost NodePorts off', () => {
  const t = tracker();
  t.services.update(null, svc('ns1', 'svc1', { clusterIP: '172.30.0.41', type: 'NodePort', nodePort: 3001 }));
  t.endpoints.update(null, slice('ns1', 'svc1', 's', [{ ip: '10.180.0.1' }], [{ port: 80 }]));
  t.apply();
  const masqAll = planFull({ state: t.state, opts: optsFor(t, { masqueradeAll: true }) }).payload;
  assert.ok(masqAll.includes('-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-MARK-MASQ'));
  const noDetector = planFull({ state: t.state, opts: optsFor(t, { clusterCIDRs: [] }) }).payload;
  assert.equal(lines(noDetector, /cluster IP".*KUBE-MARK-MASQ/).length, 0, 'no masquerade rule without a detector');
  const npa = optsFor(t, { nodePortAddresses: ['192.168.0.0/24'], localhostNodePorts: true });
  assert.equal(npa.localhostNodePorts, false, 'loopback not a NodePort address: no localhost NodePorts');
  const p = planFull({ state: t.state, opts: npa }).payload;
  assert.ok(p.includes('-m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -d 192.168.0.2 -j KUBE-NODEPORTS'));
  assert.ok(!p.includes('--dst-type LOCAL -j KUBE-NODEPORTS'));
  assert.ok(!p.includes('KUBE-FIREWALL'));
  const off = planFull({ state: t.state, opts: optsFor(t, { localhostNodePorts: false }) }).payload;
  assert.ok(off.includes('-m addrtype --dst-type LOCAL ! -d 127.0.0.0/8 -j KUBE-NODEPORTS'));
  assert.ok(!off.includes('KUBE-FIREWALL'));
});

test('large-cluster mode drops per-endpoint comments past 1000 endpoints', () => {
  const t = tracker();
  t.services.update(null, svc('ns1', 'big', { clusterIP: '172.30.0.41' }));
  const eps = Array.from({ length: 1001 }, (_, i) => ({ ip: `10.${1 + (i >> 8)}.${i & 255}.1` }));
  // two slices: an EndpointSlice holds at most 1000 endpoints (upstream's validation)
  t.endpoints.update(null, slice('ns1', 'big', 's', eps.slice(0, 1000), [{ port: 80 }]));
  t.endpoints.update(null, slice('ns1', 'big', 's2', eps.slice(1000), [{ port: 80 }]));
  t.apply();
  const plan = planFull({ state: t.state, opts: optsFor(t) });
  assert.equal(plan.largeClusterMode, true);
  assert.equal(lines(plan.payload, /^-A KUBE-SEP-.*--comment/).length, 0);
  assert.equal(lines(plan.payload, /^-A KUBE-SVC-.*->/).length, 0);
  assert.equal(lines(plan.payload, /^-A KUBE-SEP-/).length, 2002);
});

test('ClientIP affinity uses recent --rcheck in the service chain and --set in the endpoint chain', () => {
  const t = tracker();
  t.services.update(null, svc('ns1', 'aff', { clusterIP: '172.30.0.41', affinitySeconds: 600 }));
  t.endpoints.update(null, slice('ns1', 'aff', 's', [{ ip: '10.180.0.1' }, { ip: '10.180.0.2' }], [{ port: 80 }]));
  t.apply();
  const p = planFull({ state: t.state, opts: optsFor(t) }).payload;
  assert.equal(lines(p, /--rcheck --seconds 600 --reap/).length, 2);
  assert.equal(lines(p, /-m recent --name KUBE-SEP-\S+ --set -m tcp -p tcp -j DNAT/).length, 2);
});

function bigState(n: number): ProxyState {
  const state: ProxyState = { services: new Map(), endpoints: new Map() };
  for (let i = 0; i < n; i++) {
    const [sp] = servicePortsOf(svc(`ns${i % 100}`, `svc${i}`, { clusterIP: `172.30.${i >> 8}.${i & 255}` }), 4);
    state.services.set(sp.key, sp);
    state.endpoints.set(sp.key, Array.from({ length: 5 }, (_, k) => {
      const ip = `10.${(i >> 8) & 255}.${i & 255}.${k + 1}`;
      return { ip, port: 80, key: `${ip}:80`, isLocal: false, ready: true, serving: true, terminating: false, zoneHints: [], nodeHints: [] };
    }));
  }
  return state;
}

// How fast these are is the bench's question (npm run bench, docs/benchmarks.md §1); this test
// holds what makes them fast at 10,000 Services: the reuse, not a time.
test('10k services x 5 endpoints: a steady-state full render reuses every unchanged block, a partial sync writes only the changed service', () => {
  const opts = optsFor(tracker());
  const state = bigState(10_000);
  // the sync state's cache: a steady-state render reuses the blocks of unchanged services
  const cache = new BlockCache();
  const plan = planFull({ state, opts, cache });
  assert.equal(plan.natRulesTotal, 10_000 * 17 + 5);
  assert.equal(plan.writtenServices, 10_000);
  const blocksOf = (p: typeof plan) => {
    assert.equal(p.applied.kind, 'replace');
    return p.applied.kind === 'replace' ? p.applied.blocks.blocks : new Map();
  };
  const first = blocksOf(plan);
  const again = blocksOf(planFull({ state, opts, cache }));
  assert.equal(again.size, 10_000);
  let reused = 0;
  for (const [k, b] of again) if (first.get(k) === b) reused++;
  assert.equal(reused, 10_000, 'every block of the second full render is the first one\'s object');
  // One service changed: the tracker replaced its objects.
  const key = [...state.services.keys()][42];
  state.endpoints.set(key, state.endpoints.get(key)!.slice(1));
  const partial = planPartial({ state, opts, changed: new Set([state.services.get(key)!.serviceKey]), installedNatChains: plan.activeNatChains, cache });
  assert.equal(partial.writtenServices, 1);
  assert.equal(partial.natRulesTotal, 10_000 * 17 + 5 - 3, 'one endpoint fewer: its KUBE-SVC jump and its KUBE-SEP chain\'s two rules');
  // this partial sync rewrites KUBE-SERVICES whole (one rule per service); planPartialFast edits it
  assert.ok(partial.natRulesWritten < 10_000 + 100, `a partial sync writes the dispatch chain and the changed service's chains, not every service's (${partial.natRulesWritten} rules)`);
  assert.match(partial.payload, /10\.0\.42\.5:80/, 'the changed service\'s remaining endpoints are written');
  assert.doesNotMatch(partial.payload, /10\.0\.41\.1:80/, 'an unchanged service is not');
});

test('a partial sync counts skipped services exactly as a full sync writes them', () => {
  const t = tracker();
  t.services.update(null, svc('ns1', 'lb', { clusterIP: '172.30.0.41', type: 'LoadBalancer', nodePort: 3001, lbIPs: ['1.2.3.4', '5.6.7.8'], sourceRanges: ['192.168.0.0/24', '203.0.113.0/25'], externalIPs: ['192.168.99.11'], affinitySeconds: 100 }));
  t.endpoints.update(null, slice('ns1', 'lb', 's', [{ ip: '10.180.0.1', nodeName: 'test-node' }, { ip: '10.180.0.2' }], [{ port: 80 }]));
  t.services.update(null, svc('ns2', 'local', { clusterIP: '172.30.0.42', type: 'NodePort', nodePort: 3002, etp: 'Local' }));
  t.endpoints.update(null, slice('ns2', 'local', 's', [{ ip: '10.180.0.3', nodeName: 'test-node' }, { ip: '10.180.0.4' }], [{ port: 80 }]));
  t.services.update(null, svc('ns3', 'nolocal', { clusterIP: '172.30.0.43', type: 'NodePort', nodePort: 3003, etp: 'Local' }));
  t.endpoints.update(null, slice('ns3', 'nolocal', 's', [{ ip: '10.180.0.5' }], [{ port: 80 }]));
  t.apply();
  for (const over of [{}, { masqueradeAll: true }, { clusterCIDRs: [] }]) {
    const opts = optsFor(t, over);
    const full = planFull({ state: t.state, opts });
    const partial = planPartial({ state: t.state, opts, changed: new Set() });
    assert.equal(partial.natRulesTotal, full.natRulesTotal, JSON.stringify(over));
    assert.deepEqual([...partial.activeNatChains].sort(), [...full.activeNatChains].sort());
    assert.equal(partial.writtenServices, 0);
  }
});

test('large-cluster mode defers stale-chain deletion to once per syncPeriod, as upstream', () => {
  const t = tracker();
  const eps = Array.from({ length: 1001 }, (_, i) => ({ ip: `10.${1 + (i >> 8)}.${i & 255}.1` }));
  t.services.update(null, svc('ns1', 'big', { clusterIP: '172.30.0.41' }));
  // two slices: an EndpointSlice holds at most 1000 endpoints (upstream's validation)
  t.endpoints.update(null, slice('ns1', 'big', 's', eps.slice(0, 1000), [{ port: 80 }]));
  t.endpoints.update(null, slice('ns1', 'big', 's2', eps.slice(1000), [{ port: 80 }]));
  t.services.update(null, svc('ns2', 'small', { clusterIP: '172.30.0.42' }));
  t.endpoints.update(null, slice('ns2', 'small', 's', [{ ip: '10.0.2.1' }], [{ port: 80 }]));
  const opts = optsFor(t);
  const sync = new IptablesSyncState();
  sync.installedNatChains = new Set();
  sync.commit(sync.plan(t.state, opts, t.apply(), true, 1_000, 30_000));
  t.services.update(svc('ns2', 'small', { clusterIP: '172.30.0.42' }), null);
  const changed = t.apply();
  const soon = withText(sync.plan(t.state, opts, changed, false, 2_000, 30_000));
  assert.equal(soon.largeClusterMode, true);
  assert.deepEqual(soon.deletedChains, [], 'within syncPeriod of the last cleanup: stale chains stay');
  sync.commit(soon);
  const later = withText(sync.plan(t.state, opts, new Set(), false, 40_000, 30_000));
  assert.equal(later.deletedChains.length, 2, 'svc2 SVC and SEP chains deleted once syncPeriod passed');
});
