// The tracer on a live ruleset: load rules into a network namespace with iptables-restore,
// read them back with iptables-save (which reorders options, adds "/32", prints counters
// and builtin chains), and check that the tracer gives the same answers on both texts.
// Needs root; everything happens inside a namespace this test creates and deletes.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { getChain, parseIptablesSave, ruleCount } from '../../src/kernel/iptables/parse.ts';
import { traceIptables, type TracePacket } from '../../src/modes/iptables/trace.ts';
import { traceLiveChains, type ChainReader } from '../../src/modes/iptables/trace-live.ts';
import { indexSaveChains } from '../../src/kernel/iptables/save.ts';
import fc from 'fast-check';

const NS = `kpt-trc-${process.pid}`;
const NODE_IPS = ['192.168.0.2', '192.168.1.2', '192.168.99.11', '2001:db8::1', '2001:db8:1::2'];
const TIMEOUT = { timeoutMs: 30_000 };

/**
 * Upstream's TestOverallIPTablesRules golden, made loadable in a fresh namespace: the nfacct
 * matches need counter objects that only kube-proxy creates, and the PREROUTING jump is the
 * one the proxier adds outside its restore payload.
 */
function loadableGolden(): string {
  const golden = readFileSync('/work/shared/conformance/golden/iptables-overall/expected.txt', 'utf8');
  return golden
    .replace(/ -m nfacct --nfacct-name \S+/g, '')
    .replace('*nat\n', '*nat\n:PREROUTING ACCEPT [0:0]\n')
    .replace(/COMMIT\n$/, '-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES\nCOMMIT\n');
}

const FLOWS: Array<{ name: string; src: string; dst: string; port: number; proto?: TracePacket['protocol']; output: string; masq: boolean }> = [
  { name: 'pod to cluster IP', src: '10.0.0.2', dst: '172.30.0.41', port: 80, output: '10.180.0.1:80', masq: false },
  { name: 'hairpin', src: '10.180.0.1', dst: '172.30.0.41', port: 80, output: '10.180.0.1:80', masq: true },
  { name: 'UDP to a TCP service', src: '10.0.0.2', dst: '172.30.0.41', port: 80, proto: 'UDP', output: '', masq: false },
  { name: 'random choice', src: '10.0.0.2', dst: '172.30.0.44', port: 80, output: '10.180.0.4:80, 10.180.0.5:80', masq: false },
  { name: 'external IP, Local policy, pod source', src: '10.0.0.2', dst: '192.168.99.22', port: 80, output: '10.180.0.2:80', masq: false },
  { name: 'external IP, Local policy, node source', src: '192.168.0.2', dst: '192.168.99.22', port: 80, output: '10.180.0.2:80', masq: true },
  { name: 'external IP, no local endpoints: DROP', src: '203.0.113.2', dst: '192.168.99.22', port: 80, output: 'DROP', masq: false },
  { name: 'NodePort from outside', src: '203.0.113.2', dst: '192.168.0.2', port: 3003, output: '10.180.0.3:80', masq: true },
  { name: 'localhost NodePort', src: '127.0.0.1', dst: '127.0.0.1', port: 3001, output: '10.180.0.2:80', masq: true },
  { name: 'health check node port: ACCEPT', src: '192.168.0.2', dst: '192.168.0.2', port: 30000, output: 'ACCEPT', masq: false },
  { name: 'affinity', src: '10.0.0.2', dst: '172.30.0.45', port: 80, output: '10.180.0.3:80', masq: false },
  { name: 'LB source range allowed', src: '203.0.113.2', dst: '5.6.7.8', port: 80, output: '10.180.0.3:80', masq: true },
  { name: 'LB source range blocked: DROP', src: '203.0.113.200', dst: '5.6.7.8', port: 80, output: 'DROP', masq: false },
  { name: 'no endpoints: REJECT', src: '10.0.0.2', dst: '172.30.0.46', port: 80, output: 'REJECT', masq: false },
];

/** A small IPv6 ruleset in upstream's shapes (ip6tables-save prints "/128" and brackets). */
const IPV6 = `*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -m comment --comment "ns/none:http has no endpoints" -m tcp -p tcp -d fd00:30::20 --dport 80 -j REJECT
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-V6 - [0:0]
:KUBE-SEP-V61 - [0:0]
:KUBE-SEP-V62 - [0:0]
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -m comment --comment "ns/v6:http cluster IP" -m tcp -p tcp -d fd00:30::10 --dport 80 -j KUBE-SVC-V6
-A KUBE-SVC-V6 -m comment --comment "ns/v6:http cluster IP" -m tcp -p tcp -d fd00:30::10 --dport 80 ! -s fd00:10::/64 -j KUBE-MARK-MASQ
-A KUBE-SVC-V6 -m comment --comment "ns/v6:http -> [fd00:10::2]:8080" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-V61
-A KUBE-SVC-V6 -m comment --comment "ns/v6:http -> [fd00:10::1]:8080" -j KUBE-SEP-V62
-A KUBE-SEP-V61 -m comment --comment ns/v6:http -s fd00:10::2 -j KUBE-MARK-MASQ
-A KUBE-SEP-V61 -m comment --comment ns/v6:http -m tcp -p tcp -j DNAT --to-destination [fd00:10::2]:8080
-A KUBE-SEP-V62 -m comment --comment ns/v6:http -m tcp -p tcp -j DNAT --to-destination [fd00:10::1]:8080
COMMIT
`;

const FLOWS6: typeof FLOWS = [
  { name: 'IPv6 pod to cluster IP', src: 'fd00:10::5', dst: 'fd00:30::10', port: 80, output: '[fd00:10::1]:8080, [fd00:10::2]:8080', masq: false },
  { name: 'IPv6 hairpin', src: 'fd00:10::2', dst: 'fd00:30::10', port: 80, output: '[fd00:10::1]:8080, [fd00:10::2]:8080', masq: true },
  { name: 'IPv6 outside source', src: '2001:db8::99', dst: 'fd00:30::10', port: 80, output: '[fd00:10::1]:8080, [fd00:10::2]:8080', masq: true },
  { name: 'IPv6 no endpoints: REJECT', src: 'fd00:10::5', dst: 'fd00:30::20', port: 80, output: 'REJECT', masq: false },
];

describe('tracer on live iptables-save output', () => {
  const loaded = loadableGolden();
  let live = '';
  /** `iptables-save -c`: every rule prefixed by its counters */
  let liveCounters = '';
  let live6 = '';

  before(async () => {
    await runChecked(hostRunner, 'ip', ['netns', 'add', NS], TIMEOUT);
    try {
      await runChecked(hostRunner, 'ip', ['netns', 'exec', NS, 'iptables-restore'], { ...TIMEOUT, input: loaded });
      live = (await runChecked(hostRunner, 'ip', ['netns', 'exec', NS, 'iptables-save'], TIMEOUT)).stdout;
      liveCounters = (await runChecked(hostRunner, 'ip', ['netns', 'exec', NS, 'iptables-save', '-c'], TIMEOUT)).stdout;
      await runChecked(hostRunner, 'ip', ['netns', 'exec', NS, 'ip6tables-restore'], { ...TIMEOUT, input: IPV6 });
      live6 = (await runChecked(hostRunner, 'ip', ['netns', 'exec', NS, 'ip6tables-save'], TIMEOUT)).stdout;
    } catch (e) {
      await hostRunner.run('ip', ['netns', 'del', NS], TIMEOUT);
      throw e;
    }
  });

  after(async () => {
    await hostRunner.run('ip', ['netns', 'del', NS], TIMEOUT);
  });

  test('the live text is really rewritten by iptables-save, with the same rules', () => {
    assert.notEqual(live, loaded);
    assert.match(live, /-d 172\.30\.0\.41\/32 -p tcp/);
    assert.match(live, /^:PREROUTING ACCEPT \[\d+:\d+\]$/m);
    assert.match(liveCounters, /^\[\d+:\d+\] -A KUBE-SERVICES /m);
    const a = parseIptablesSave(loaded);
    const b = parseIptablesSave(live);
    assert.deepEqual(b.warnings, []);
    assert.equal(ruleCount(b), ruleCount(a));
    assert.equal(getChain(b, 'nat', 'KUBE-SERVICES')?.rules.length, getChain(a, 'nat', 'KUBE-SERVICES')?.rules.length);
  });

  for (const f of FLOWS) {
    test(`same answer on loaded and live text: ${f.name}`, () => {
      const pkt = { sourceIP: f.src, destIP: f.dst, destPort: f.port, protocol: f.proto ?? ('' as const) };
      const want = traceIptables(loaded, pkt, { localIPs: NODE_IPS });
      assert.equal(want.output, f.output);
      assert.equal(want.masq, f.masq);
      for (const text of [live, liveCounters]) {
        const got = traceIptables(text, pkt, { localIPs: NODE_IPS });
        const why = `live matched:\n  ${got.rules.join('\n  ')}\nnotes: ${got.notes.join('; ')}`;
        assert.equal(got.output, want.output, why);
        assert.equal(got.masq, want.masq, why);
        assert.equal(got.verdict, want.verdict, why);
        // The same path, rule for rule, even though each rule's text differs.
        assert.equal(got.rules.length, want.rules.length, why);
        assert.deepEqual(got.notes, [], why);
      }
    });
  }

  for (const f of FLOWS6) {
    test(`same answer on loaded and live IPv6 text: ${f.name}`, () => {
      assert.match(live6, /-d fd00:30::10\/128/);
      const pkt = { sourceIP: f.src, destIP: f.dst, destPort: f.port, protocol: f.proto ?? ('' as const) };
      const want = traceIptables(IPV6, pkt, { localIPs: NODE_IPS });
      const got = traceIptables(live6, pkt, { localIPs: NODE_IPS });
      assert.equal(want.output, f.output);
      assert.equal(want.masq, f.masq);
      assert.deepEqual([got.output, got.masq, got.rules.length], [want.output, want.masq, want.rules.length], got.rules.join('\n'));
    });
  }
});

// `kproxy trace --live` reads only the chains its walk reaches (src/modes/iptables/trace-live.ts):
// on the nf_tables backend each with `iptables -S CHAIN`, on legacy out of one iptables-save
// (indexSaveChains). Each flow must be answered as the walk over the whole loaded text answers it.
describe('the live trace over the chains its walk reaches', () => {
  const loaded = loadableGolden();
  const NS2 = `kpt-trc2-${process.pid}`;
  const inNs = (cmd: string, args: string[]) => hostRunner.run('ip', ['netns', 'exec', NS2, cmd, ...args], TIMEOUT);
  let legacySave = '';
  const listed: string[] = [];
  const perChain: ChainReader = async (table, chain) => {
    listed.push(`${table}/${chain}`);
    const r = await inNs('iptables', ['-t', table, '-S', chain]);
    return r.code === 0 ? r.stdout : null;
  };

  before(async () => {
    await runChecked(hostRunner, 'ip', ['netns', 'add', NS2], TIMEOUT);
    try {
      await runChecked(hostRunner, 'ip', ['netns', 'exec', NS2, 'iptables-restore'], { ...TIMEOUT, input: loaded });
      await runChecked(hostRunner, 'ip', ['netns', 'exec', NS2, 'iptables-legacy-restore'], { ...TIMEOUT, input: loaded });
      legacySave = (await runChecked(hostRunner, 'ip', ['netns', 'exec', NS2, 'iptables-legacy-save'], TIMEOUT)).stdout;
    } catch (e) {
      await hostRunner.run('ip', ['netns', 'del', NS2], TIMEOUT);
      throw e;
    }
  });

  after(async () => {
    await hostRunner.run('ip', ['netns', 'del', NS2], TIMEOUT);
  });

  test('indexSaveChains gives a chain\'s declaration and its rules, split runs joined, or null', () => {
    const read = indexSaveChains('*nat\n:PREROUTING ACCEPT [0:0]\n:A - [0:0]\n:B - [0:0]\n:EMPTY - [0:0]\n-A A -j B\n-A AB -j RETURN\n-A B -j RETURN\n-A A -j DNAT --to-destination 10.0.0.1:80\nCOMMIT\n*filter\n:A - [0:0]\n-A A -j ACCEPT\nCOMMIT\n');
    assert.equal(read('nat', 'A'), ':A - [0:0]\n-A A -j B\n-A A -j DNAT --to-destination 10.0.0.1:80\n');
    assert.equal(read('nat', 'AB'), '-A AB -j RETURN\n');
    assert.equal(read('nat', 'B'), ':B - [0:0]\n-A B -j RETURN\n');
    assert.equal(read('nat', 'EMPTY'), ':EMPTY - [0:0]\n');
    assert.equal(read('nat', 'PREROUTING'), ':PREROUTING ACCEPT [0:0]\n');
    assert.equal(read('filter', 'A'), ':A - [0:0]\n-A A -j ACCEPT\n');
    assert.equal(read('nat', 'NONE'), null);
    assert.equal(read('mangle', 'A'), null);
  });

  /**
   * What indexSaveChains gives, read the plain way: the text's lines one by one; in the
   * sections of the table (from a `*TABLE` line to the next `*` line), the last `:CHAIN`
   * declaration (its name the first word after the colon) and every `-A CHAIN` line (the name
   * up to the first space), in order, each with its newline.
   */
  function chainLines(text: string, table: string, chain: string): string | null {
    const lines = text.split('\n');
    let inTable = false;
    let decl: string | null = null;
    let rules = '';
    let found = false;
    lines.forEach((line, i) => {
      if (line.startsWith('*')) inTable = line.slice(1).trim() === table;
      else if (!inTable) return;
      else if (line.startsWith(':') && line.trim().slice(1).split(/\s+/)[0] === chain) [decl, found] = [line.trim(), true];
      else if (line.startsWith('-A ') && line.slice(3).split(' ')[0] === chain) [rules, found] = [rules + line + (i < lines.length - 1 ? '\n' : ''), true];
    });
    if (!found) return null;
    const out = (decl === null ? '' : `${decl}\n`) + rules;
    return out === '' || out.endsWith('\n') ? out : `${out}\n`;
  }

  test('indexSaveChains finds every chain as a line-by-line reading does, whatever the lines (tables twice, runs split, CRLF, odd spacing)', () => {
    const line = fc.oneof(
      fc.constantFrom('*nat', '*filter', '*nat ', ' *nat', '*mangle', 'COMMIT', '# comment', '', ':A - [0:0]', ':A', ':A\t-', ':A\u00a0-', ':B ACCEPT [1:2]', ': A', ':AB -'),
      fc.constantFrom('-A A -j B', '-A A', '-A A -j DNAT --to-destination 10.0.0.1:80', '-A AB -j X', '-A B -j RETURN', '-A  A -j Y', '-A A  -j C', '-I A -j Z', '[1:2] -A A -j B'),
      fc.string({ maxLength: 6, unit: fc.constantFrom('A', 'B', ' ', '\t', ':', '-', '*', '\u00a0', 'x') }),
    );
    fc.assert(
      fc.property(fc.array(line, { maxLength: 30 }), fc.boolean(), fc.boolean(), (lines, crlf, newlineAtEnd) => {
        const text = lines.join(crlf ? '\r\n' : '\n') + (newlineAtEnd ? '\n' : '');
        const read = indexSaveChains(text);
        for (const table of ['nat', 'filter', 'mangle']) {
          for (const chain of ['A', 'B', 'AB', 'A\r', 'X']) assert.equal(read(table, chain), chainLines(text, table, chain), `${table} ${chain} in ${JSON.stringify(text)}`);
        }
      }),
      { numRuns: 3000 },
    );
  });

  for (const f of FLOWS) {
    test(`per chain (nf_tables) and out of a legacy save: ${f.name}`, async () => {
      const pkt = { sourceIP: f.src, destIP: f.dst, destPort: f.port, protocol: f.proto ?? ('' as const) };
      const want = traceIptables(loaded, pkt, { localIPs: NODE_IPS });
      listed.length = 0;
      for (const [how, read] of [['iptables -S', perChain], ['legacy save', indexSaveChains(legacySave)]] as const) {
        const got = await traceLiveChains(read, pkt, { localIPs: NODE_IPS });
        const why = `${how}: matched:\n  ${got.rules.join('\n  ')}\nnotes: ${got.notes.join('; ')}`;
        assert.deepEqual([got.output, got.masq, got.verdict, got.rules.length], [want.output, want.masq, want.verdict, want.rules.length], why);
        assert.deepEqual(got.notes, [], why);
      }
      // the walk read only what it reached: never every chain of the ruleset
      const chains = (loaded.match(/^:/gm) ?? []).length;
      assert.ok(listed.length < chains, `${listed.length} of ${chains} chains read: ${listed.join(' ')}`);
    });
  }
});
