import { test } from 'node:test';
import assert from 'node:assert/strict';
import { addElement, addRule, addSet, newRuleset } from '../../src/modes/nftables/ruleset.ts';
import { fullTransaction, partialTransaction } from '../../src/modes/nftables/transaction.ts';
import type { Owners } from '../../src/modes/nftables/incremental.ts';

// Chains and elements named after a port belong to it; the fixed ones belong to no port.
const owners: Owners = {
  chain: (name) => (name.startsWith('service-') ? 'ns/svc:p80' : undefined),
  set: () => undefined,
  element: (set, key) => (set === 'service-ips' && key.includes('172.30.0.1') ? 'ns/svc:p80' : undefined),
};

function ruleset(rules: string[]) {
  const rs = newRuleset('ip', 'kube-proxy');
  for (const r of rules) addRule(rs, 'service-ABC-ns/svc/tcp/p80', r);
  addRule(rs, 'services', 'ip daddr . meta l4proto . th dport vmap @service-ips');
  addSet(rs, { kind: 'map', name: 'service-ips', type: 'ipv4_addr . inet_proto . inet_service : verdict' });
  addElement(rs, 'service-ips', { key: ['172.30.0.1', 'tcp', '80'], value: 'goto service-ABC-ns/svc/tcp/p80' });
  addElement(rs, 'service-ips', { key: ['172.30.0.2', 'tcp', '80'], value: 'goto service-DEF-ns/other/tcp/p80' });
  return rs;
}

test('each rule and element operation names the port that owns it, and only those owned name one', () => {
  for (const tx of [fullTransaction(ruleset(['goto endpoint-1']), null, { owners }), partialTransaction(ruleset(['goto endpoint-2']), ruleset(['goto endpoint-1']), { owners })]) {
    const rules = tx.ops.filter((op) => op.kind === 'rule' || (op.kind === 'chain' && op.rules));
    const owned = rules.filter((op) => op.owner !== undefined);
    assert.ok(owned.length > 0, 'the service chain\'s rules are owned');
    for (const op of owned) assert.equal(op.owner, 'ns/svc:p80');
    for (const op of rules.filter((op) => op.kind === 'rule' && op.chain === 'services')) assert.ok(!('owner' in op), 'a fixed chain\'s rule has no owner key');
  }
  const els = fullTransaction(ruleset([]), null, { owners }).ops.filter((op) => op.kind === 'element');
  assert.deepEqual(els.map((op) => op.owner), ['ns/svc:p80', undefined]);
  assert.ok(!('owner' in els[1]), 'an element of no port has no owner key');
});
