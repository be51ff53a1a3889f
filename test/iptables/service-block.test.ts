// The per-Service block renderer (src/modes/iptables/service-block.ts): a Service port's
// chains and jump rules from its node view and the node's options alone.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { portOf } from '../../src/core/nodeview.ts';
import { BlockCache, renderContext, ruleCount } from '../../src/modes/iptables/blocks.ts';
import { planFull } from '../../src/modes/iptables/full.ts';
import { optionsFromConfig } from '../../src/modes/iptables/options.ts';
import { endpointChainName } from '../../src/modes/iptables/names.ts';
import { renderServiceBlock } from '../../src/modes/iptables/service-block.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';

function world() {
  const t = tracker();
  t.services.update(null, svc('ns1', 'lb', { clusterIP: '172.30.0.41', type: 'LoadBalancer', nodePort: 30041, etp: 'Local', lbIPs: ['1.2.3.4'], sourceRanges: ['203.0.113.0/25'] }));
  t.endpoints.update(null, slice('ns1', 'lb', 's1', [{ ip: '10.180.0.1', nodeName: 'test-node' }, { ip: '10.180.0.2', nodeName: 'other' }], [{ port: 80 }]));
  t.services.update(null, svc('ns2', 'other', { clusterIP: '172.30.0.42' }));
  t.endpoints.update(null, slice('ns2', 'other', 's2', [{ ip: '10.180.1.1' }], [{ port: 80 }]));
  t.apply();
  const input = planInput(t, testConfig());
  return { t, opts: optionsFromConfig(input.config, input.node) };
}

test('a Service block is rendered from its port view alone, and is that Service\'s part of the full payload', () => {
  const { t, opts } = world();
  const sp = [...t.state.services.values()].find((s) => s.serviceKey === 'ns1/lb')!;
  const block = renderServiceBlock(portOf(opts.node, sp, t.state.endpoints.get(sp.key)!), renderContext(t.state, opts));
  const payload = planFull({ state: t.state, opts }).payload.split('\n');
  for (const l of [...block.natTop, ...block.filter, ...block.chains, ...block.rules]) {
    assert.ok(payload.includes(l), `in the full payload: ${l}`);
    assert.doesNotMatch(l, /ns2\/other/, 'nothing of another Service');
  }
  // eTP Local with source ranges: external, firewall, cluster and local chains, then one KUBE-SEP per endpoint
  assert.deepEqual(block.active.map((c) => c.replace(/-[A-Z0-9]{16}$/, '')), ['KUBE-EXT', 'KUBE-FW', 'KUBE-SVC', 'KUBE-SVL', 'KUBE-SEP', 'KUBE-SEP']);
  const [ext, fw, svcChain] = block.active;
  assert.ok(block.natTop.some((l) => l.startsWith('-A KUBE-SERVICES ') && l.includes('-d 1.2.3.4 ') && l.endsWith(`-j ${fw}`)), 'the LB IP goes through the firewall');
  assert.ok(block.natTop.some((l) => l.startsWith('-A KUBE-SERVICES ') && l.includes('-d 172.30.0.41 ') && l.endsWith(`-j ${svcChain}`)), 'the cluster IP goes to the cluster-wide endpoints');
  assert.ok(block.natTop.some((l) => l.startsWith('-A KUBE-NODEPORTS ') && l.includes('--dport 30041 ') && l.endsWith(`-j ${ext}`)), 'the NodePort goes to the external chain');
  assert.ok(block.filter.some((l) => l.startsWith('-A KUBE-PROXY-FIREWALL ') && l.includes('-d 1.2.3.4 ') && l.endsWith('-j DROP')), 'what the firewall does not accept is dropped');
  assert.deepEqual(renderServiceBlock(portOf(opts.node, sp, t.state.endpoints.get(sp.key)!), renderContext(t.state, opts)), block, 'the same view renders the same block');
});

test('an endpoint object rendered for two ports gets each port\'s KUBE-SEP name (the per-endpoint name cache is keyed by the port)', () => {
  const { t, opts } = world();
  const lb = [...t.state.services.values()].find((s) => s.serviceKey === 'ns1/lb')!;
  const other = [...t.state.services.values()].find((s) => s.serviceKey === 'ns2/other')!;
  const eps = t.state.endpoints.get(other.key)!;
  const ctx = renderContext(t.state, opts);
  const seps = (sp: typeof lb) => renderServiceBlock(portOf(opts.node, sp, eps), ctx).active.filter((c) => c.startsWith('KUBE-SEP-'));
  assert.deepEqual(seps(other), [endpointChainName('ns2/other:p80', 'tcp', '10.180.1.1:80')]);
  assert.deepEqual(seps(lb), [endpointChainName('ns1/lb:p80', 'tcp', '10.180.1.1:80')]);
  assert.deepEqual(seps(other), [endpointChainName('ns2/other:p80', 'tcp', '10.180.1.1:80')]);
});

test('a block\'s chain declarations and rules are its chains\' (made from active and units), and read empty once compacted', () => {
  const { t, opts } = world();
  const sp = [...t.state.services.values()].find((s) => s.serviceKey === 'ns1/lb')!;
  const block = renderServiceBlock(portOf(opts.node, sp, t.state.endpoints.get(sp.key)!), renderContext(t.state, opts));
  assert.deepEqual(block.chains, block.active.map((c) => `:${c} - [0:0]`));
  assert.deepEqual([...block.rules].sort(), block.units.flatMap((u) => u.rules).sort());
  for (const r of block.rules) assert.ok(block.active.includes(r.split(' ')[1]), `a rule of an own chain: ${r}`);
  assert.equal(block.rules.length, 14);
  const cache = new BlockCache();
  const cached = cache.block(sp, t.state.endpoints.get(sp.key)!, renderContext(t.state, opts));
  cache.compact(t.state);
  assert.deepEqual([cached.chains, cached.rules, cached.units], [[], [], []]);
  assert.equal(ruleCount(cached), 14);
});
