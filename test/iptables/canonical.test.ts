// Rules compared by meaning (canonical.ts), and the in-place chain edits of the restart form
// (restart.ts chainEdits): the forms iptables-save prints (seen on this machine's iptables
// 1.8, nf_tables and legacy) equal the forms kproxy writes, rules that differ do not, and the
// edits of any installed chain turn it into the planned one.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { canonicalRule, chainDigest, installedChains } from '../../src/modes/iptables/canonical.ts';
import { chainEdits } from '../../src/modes/iptables/restart.ts';

const SAME: Array<[string, string]> = [
  // generic options first, host prefix length, quotes
  ['-A KUBE-SERVICES -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp -p tcp -d 172.30.0.41 --dport 80 -j KUBE-SVC-X',
    '-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m comment --comment "ns1/svc1:p80 cluster IP" -m tcp --dport 80 -j KUBE-SVC-X'],
  ['-A KUBE-SERVICES -m comment --comment "a b" -m tcp -p tcp -d fd00:172:30:0::15 --dport 80 -j REJECT',
    '-A KUBE-SERVICES -d fd00:172:30::15/128 -p tcp -m comment --comment "a b" -m tcp --dport 80 -j REJECT --reject-with icmp6-port-unreachable'],
  // statistic: the kernel's 31-bit fixed point, printed with 11 decimals
  ['-A KUBE-SVC-X -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.2000000000 -j KUBE-SEP-A',
    '-A KUBE-SVC-X -m comment --comment "ns1/svc1:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.20000000019 -j KUBE-SEP-A'],
  ['-A KUBE-SVC-X -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-A',
    '-A KUBE-SVC-X -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-A'],
  // recent: its defaults and its own option order
  ['-A KUBE-SVC-X -m comment --comment "x" -m recent --name KUBE-SEP-A --rcheck --seconds 10800 --reap -j KUBE-SEP-A',
    '-A KUBE-SVC-X -m comment --comment x -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SEP-A'],
  ['-A KUBE-SEP-A -m comment --comment x -m recent --name KUBE-SEP-A --set -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80',
    '-A KUBE-SEP-A -p tcp -m comment --comment x -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.180.0.1:80'],
  // MARK and mark
  ['-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000', '-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000'],
  ['-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000', '-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0'],
  ['-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN', '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN'],
  ['-A KUBE-SEP-A -m comment --comment x -s 10.180.0.1 -j KUBE-MARK-MASQ', '-A KUBE-SEP-A -s 10.180.0.1/32 -m comment --comment x -j KUBE-MARK-MASQ'],
  ['-A KUBE-SVC-X -m comment --comment "y" -m tcp -p tcp -d 172.30.0.1 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ',
    '-A KUBE-SVC-X ! -s 10.0.0.0/8 -d 172.30.0.1/32 -p tcp -m comment --comment y -m tcp --dport 80 -j KUBE-MARK-MASQ'],
];

const DIFFERENT: Array<[string, string]> = [
  ['-A C -m tcp -p tcp -d 172.30.0.1 --dport 80 -j X', '-A C -m tcp -p tcp -d 172.30.0.1 --dport 81 -j X'],
  ['-A C -s 10.0.0.0/8 -j X', '-A C ! -s 10.0.0.0/8 -j X'],
  ['-A C -m comment --comment "a" -j X', '-A C -m comment --comment "b" -j X'],
  ['-A C -m statistic --mode random --probability 0.5000000000 -j X', '-A C -m statistic --mode random --probability 0.3333333333 -j X'],
  ['-A C -j DNAT --to-destination 10.180.0.1:80', '-A C -j DNAT --to-destination 10.180.0.2:80'],
  ['-A C -j MARK --or-mark 0x4000', '-A C -j MARK --xor-mark 0x4000'],
  ['-A C -j REJECT', '-A C -j REJECT --reject-with icmp-host-unreachable'],
  ['-A C -d 172.30.0.1 -j X', '-A C -d 172.30.0.0/16 -j X'],
  // module order is kept (a later -D with kproxy's text must find the rule)
  ['-A C -m comment --comment a -m tcp -p tcp --dport 80 -j X', '-A C -p tcp -m tcp --dport 80 -m comment --comment a -j X'],
];

test('canonicalRule: the forms iptables-save prints equal the forms kproxy writes', () => {
  for (const [a, b] of SAME) assert.equal(canonicalRule(a), canonicalRule(b), `${a}\n${b}`);
});

test('canonicalRule: rules that differ stay different', () => {
  for (const [a, b] of DIFFERENT) assert.notEqual(canonicalRule(a), canonicalRule(b), `${a}\n${b}`);
});

test('installedChains: KUBE-* chains of nat and filter with their rules, others ignored', () => {
  const saved = [
    '*nat', ':PREROUTING ACCEPT [0:0]', ':KUBE-SERVICES - [0:0]', ':KUBE-SVC-X - [0:0]', ':OTHER - [0:0]',
    '-A PREROUTING -j KUBE-SERVICES', '-A OTHER -j RETURN',
    '-A KUBE-SERVICES -d 172.30.0.1/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-X', 'COMMIT',
    '*filter', ':KUBE-FORWARD - [0:0]', 'COMMIT', '',
  ].join('\n');
  const k = installedChains(saved);
  assert.deepEqual([...k.get('nat')!.keys()], ['KUBE-SERVICES', 'KUBE-SVC-X']);
  assert.deepEqual(k.get('nat')!.get('KUBE-SERVICES')!.canon, [canonicalRule('-A KUBE-SERVICES -m tcp -p tcp -d 172.30.0.1 --dport 80 -j KUBE-SVC-X')]);
  // a service's own chain keeps only the digest of its canonical rules
  assert.equal(k.get('nat')!.get('KUBE-SVC-X')!.lines, undefined);
  assert.equal(k.get('nat')!.get('KUBE-SVC-X')!.digest, chainDigest([]));
  assert.equal(chainDigest(['-A KUBE-SVC-X -m comment --comment "a b" -m tcp -p tcp -d 10.0.0.1 --dport 80 -j KUBE-SEP-Y']),
    chainDigest(['-A KUBE-SVC-X -d 10.0.0.1/32 -p tcp -m comment --comment "a b" -m tcp --dport 80 -j KUBE-SEP-Y']));
  assert.notEqual(chainDigest(['-A KUBE-SVC-X -j KUBE-SEP-Y', '-A KUBE-SVC-X -j KUBE-SEP-Z']), chainDigest(['-A KUBE-SVC-X -j KUBE-SEP-Z', '-A KUBE-SVC-X -j KUBE-SEP-Y']));
  assert.deepEqual([...k.get('filter')!.keys()], ['KUBE-FORWARD']);
});

/** Applies restore lines to one chain as iptables would (-D by spec: the first equal rule). */
function apply(chain: string[], decls: string[], lines: string[]): string[] {
  let out = decls.length ? [] : [...chain];
  for (const l of lines) {
    const m = /^-([AID]) \S+ (?:(\d+) ?)?/.exec(l)!;
    const rule = `-A C ${l.slice(m[0].length)}`;
    if (m[1] === 'A') out.push(rule);
    else if (m[1] === 'D' && m[2] && m[0].length === l.length) out.splice(Number(m[2]) - 1, 1);
    else if (m[1] === 'I') out.splice(Number(m[2]) - 1, 0, rule);
    else {
      const i = out.findIndex((r) => canonicalRule(r) === canonicalRule(rule));
      assert.ok(i >= 0, `-D of a missing rule: ${l}`);
      out = [...out.slice(0, i), ...out.slice(i + 1)];
    }
  }
  return out;
}

test('chainEdits: the edits turn any installed chain into the planned one; none when equal', () => {
  const rule = fc.integer({ min: 0, max: 7 }).map((n) => `-A C -m tcp -p tcp -d 172.30.0.${n} --dport 80 -j KUBE-SVC-${n}`);
  fc.assert(
    fc.property(fc.array(rule, { maxLength: 12 }), fc.array(rule, { maxLength: 12 }), (have, want) => {
      // installed as iptables-save prints them
      const lines = have.map((r) => r.replace(/-m tcp -p tcp -d (\S+)/, '-d $1/32 -p tcp -m tcp'));
      const e = chainEdits('C', { digest: '', lines, canon: lines.map(canonicalRule) }, want);
      if (have.join() === want.join()) return assert.equal(e, null);
      assert.ok(e);
      const result = apply(lines, e.decls, e.lines);
      assert.deepEqual(result.map(canonicalRule), want.map(canonicalRule));
      // never more rule lines than a rewrite
      assert.ok(e.lines.length <= Math.max(want.length, 2 * (have.length + want.length)));
    }),
    { numRuns: 300, seed: 20261203 },
  );
  // one rule replaced in a long chain: one deletion and one insertion, not a rewrite
  const long = Array.from({ length: 50 }, (_, i) => `-A C -d 172.30.1.${i}/32 -j KUBE-SVC-${i}`);
  const want = long.map((r, i) => (i === 20 ? '-A C -d 172.30.9.9/32 -j KUBE-SVC-NEW' : r));
  const e = chainEdits('C', { digest: '', lines: long, canon: long.map(canonicalRule) }, want)!;
  assert.deepEqual(e.decls, []);
  assert.deepEqual(e.lines, ['-D C -d 172.30.1.20/32 -j KUBE-SVC-20', '-I C 21 -d 172.30.9.9/32 -j KUBE-SVC-NEW']);
  // a chain that is not installed is declared and written whole
  assert.deepEqual(chainEdits('C', undefined, want.slice(0, 2)), { decls: [':C - [0:0]'], lines: want.slice(0, 2), written: 2 });
});
