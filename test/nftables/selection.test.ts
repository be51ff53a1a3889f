// Endpoint selection without anonymous maps (src/modes/nftables/selection.ts): a run of
// `numgen random mod N-k 0 goto` picks chooses every endpoint with probability 1/N, expands
// back into upstream's anonymous-map rule, and the tracer follows every pick.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { expandSelection, parsePick, selectionAt, selectionRules } from '../../src/modes/nftables/selection.ts';
import { addRule, newRuleset } from '../../src/modes/nftables/ruleset.ts';
import { traceNft } from '../../src/modes/nftables/trace.ts';

/** Probability of each target, walking the rules as the kernel would (each pick an independent draw). */
function probabilities(rules: string[]): Map<string, number> {
  const out = new Map<string, number>();
  let rest = 1;
  for (const r of rules) {
    const pick = parsePick(r);
    const target = pick ? pick.chain : /^goto (\S+)$/.exec(r)![1];
    const p = pick ? rest / pick.mod : rest;
    out.set(target, (out.get(target) ?? 0) + p);
    rest -= p;
  }
  assert.ok(Math.abs(rest) < 1e-12, 'the run always ends in a choice');
  return out;
}

test('a selection run picks each endpoint with probability 1/N', () => {
  assert.deepEqual(selectionRules(['endpoint-a']), ['goto endpoint-a']);
  assert.deepEqual(selectionRules(['endpoint-a', 'endpoint-b', 'endpoint-c']), [
    'numgen random mod 3 0 goto endpoint-a',
    'numgen random mod 2 0 goto endpoint-b',
    'goto endpoint-c',
  ]);
  for (const n of [1, 2, 3, 5, 17, 100]) {
    const chains = Array.from({ length: n }, (_, i) => `endpoint-${i}`);
    const p = probabilities(selectionRules(chains));
    assert.equal(p.size, n);
    for (const v of p.values()) assert.ok(Math.abs(v - 1 / n) < 1e-12, `n=${n}: ${v}`);
  }
});

test('expandSelection gives upstream\'s anonymous-map rule; other rules are left alone', () => {
  const rs = newRuleset('ip', 'kube-proxy');
  addRule(rs, 'service-x', 'ip saddr @affinity-a goto endpoint-a');
  for (const r of selectionRules(['endpoint-a', 'endpoint-b'])) addRule(rs, 'service-x', r);
  addRule(rs, 'external-x', 'goto service-x');
  // Not a run: wrong modulus sequence, or a pick without its final goto.
  addRule(rs, 'odd', 'numgen random mod 3 0 goto endpoint-a');
  addRule(rs, 'odd', 'goto endpoint-b');
  addRule(rs, 'lonely', 'numgen random mod 2 0 goto endpoint-a');
  const ex = expandSelection(rs);
  assert.deepEqual(ex.chains.get('service-x')!.rules.map((r) => r.rule), [
    'ip saddr @affinity-a goto endpoint-a',
    'numgen random mod 2 vmap { 0 : goto endpoint-a , 1 : goto endpoint-b }',
  ]);
  assert.deepEqual(ex.chains.get('external-x')!.rules.map((r) => r.rule), ['goto service-x']);
  assert.equal(selectionAt(rs.chains.get('odd')!.rules, 0), null);
  assert.equal(selectionAt(rs.chains.get('lonely')!.rules, 0), null);
  assert.deepEqual(ex.chains.get('lonely')!.rules, rs.chains.get('lonely')!.rules);
  assert.equal(ex.chains.get('odd')!.rules[0].rule, 'numgen random mod 3 0 goto endpoint-a');
});

test('the tracer follows every pick of a run, as `nft list` prints it', () => {
  const listing = `table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 172.30.0.1 . tcp . 80 : goto service-x }
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain service-x {
		numgen random mod 3 0 goto endpoint-a
		numgen random mod 2 0 goto endpoint-b
		goto endpoint-c
	}
	chain endpoint-a {
		meta l4proto tcp dnat to 10.180.0.1:80
	}
	chain endpoint-b {
		meta l4proto tcp dnat to 10.180.0.2:80
	}
	chain endpoint-c {
		meta l4proto tcp dnat to 10.180.0.3:80
	}
}
`;
  const r = traceNft(listing, { sourceIP: '10.0.0.5', protocol: 'TCP', destIP: '172.30.0.1', destPort: 80 }, { localIPs: [] });
  assert.equal(r.output, '10.180.0.1:80, 10.180.0.2:80, 10.180.0.3:80');
  assert.deepEqual(r.notes, []);
});
