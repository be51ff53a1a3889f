// The tracer on dumps kproxy did not write: unquoted multi-word
// comments, escaped quotes, single quotes as plain characters, "!" in both positions,
// unknown matches and targets are read as iptables-restore and upstream's parser read them;
// what still cannot be read is named in the trace's notes (and in `trace --json`), never a
// silent "no match". The kernel part writes rules with iptables / iptables-restore inside a
// namespace this test creates (kpd2-trc-PID) and traces what iptables-save prints.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { getChain, parseIptablesSave } from '../../src/kernel/iptables/parse.ts';
import { traceIptables } from '../../src/modes/iptables/trace.ts';
import { traceJson } from '../../src/cli/trace.ts';
import { sh } from '../support/netns.ts';

const tcp = (src: string, dst: string, port = 80) => ({ sourceIP: src, destIP: dst, destPort: port, protocol: 'TCP' as const });
const opts = { localIPs: [] };

const HEAD = '*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-A - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n';
const SVC = '-A KUBE-SVC-A -m comment --comment "ns/a:http -> 10.180.0.1:8080" -p tcp -j DNAT --to-destination 10.180.0.1:8080\n';
const dump = (rules: string) => HEAD + rules + SVC + 'COMMIT\n';

describe('dumps written by other tools', () => {
  test('an unquoted multi-word --comment is one comment, not stray words', () => {
    const text = dump('-A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m comment --comment ns/a:http cluster IP -m tcp --dport 80 -j KUBE-SVC-A\n');
    const rule = getChain(parseIptablesSave(text), 'nat', 'KUBE-SERVICES')!.rules[0];
    assert.equal(rule.comment, 'ns/a:http cluster IP');
    assert.deepEqual(rule.stray, []);
    const r = traceIptables(text, tcp('10.0.0.2', '172.30.0.10'), opts);
    assert.equal(r.output, '10.180.0.1:8080');
    assert.deepEqual(r.notes, []);
  });

  test("a single quote is a plain character (--comment it's mine), as for iptables-restore", () => {
    const text = dump("-A KUBE-SERVICES -d 172.30.0.11/32 -p tcp -m comment --comment it's mine -m tcp --dport 80 -j KUBE-SVC-A\n");
    const r = traceIptables(text, tcp('10.0.0.2', '172.30.0.11'), opts);
    assert.equal(r.output, '10.180.0.1:8080');
    assert.equal(getChain(parseIptablesSave(text), 'nat', 'KUBE-SERVICES')!.rules[0].comment, "it's mine");
  });

  test('escaped quotes and an option-like text inside a quoted comment stay in the comment', () => {
    const text = dump('-A KUBE-SERVICES -d 172.30.0.12/32 -p tcp -m comment --comment "it\\\'s \\"quoted\\" -j DROP" -m tcp --dport 80 -j KUBE-SVC-A\n');
    const rule = getChain(parseIptablesSave(text), 'nat', 'KUBE-SERVICES')!.rules[0];
    assert.equal(rule.comment, 'it\'s "quoted" -j DROP');
    assert.equal(rule.target?.name, 'KUBE-SVC-A');
    assert.equal(traceIptables(text, tcp('10.0.0.2', '172.30.0.12'), opts).output, '10.180.0.1:8080');
  });

  test('"!" before the option and after it mean the same', () => {
    for (const neg of ['! -s 10.0.0.0/8 -p tcp -m tcp ! --dport 81', '-s ! 10.0.0.0/8 -p tcp -m tcp --dport ! 81']) {
      const text = dump(`-A KUBE-SERVICES ${neg} -d 172.30.0.15/32 -j KUBE-SVC-A\n`);
      assert.equal(traceIptables(text, tcp('203.0.113.2', '172.30.0.15'), opts).output, '10.180.0.1:8080', neg);
      assert.equal(traceIptables(text, tcp('10.0.0.2', '172.30.0.15'), opts).output, '', neg);
      assert.equal(traceIptables(text, tcp('203.0.113.2', '172.30.0.15', 81), opts).output, '', neg);
    }
  });

  test('unknown matches and targets are opaque, assumed to match, and said so', () => {
    const text = dump('-A KUBE-SERVICES -d 172.30.0.16/32 -p tcp -m frobnicate --frob-level 3 --frob-mode fast -j KUBE-SVC-A\n-A KUBE-SERVICES -d 172.30.0.17/32 -j FROBTARGET --frob x\n');
    const r = traceIptables(text, tcp('10.0.0.2', '172.30.0.16'), opts);
    assert.equal(r.output, '10.180.0.1:8080');
    assert.match(r.notes.join('\n'), /line 6: assumed to match \(-m frobnicate --frob-level 3 not evaluated\)/);
    assert.doesNotThrow(() => traceIptables(text, tcp('10.0.0.2', '172.30.0.17'), opts));
  });

  test('a line that cannot be read is named in the notes, and the rest is still traced', () => {
    const text = dump('-A KUBE-SERVICES -d 172.30.0.18/32 -p tcp -m comment --comment "unterminated -j KUBE-SVC-A\n-A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -j KUBE-SVC-A\n');
    const miss = traceIptables(text, tcp('10.0.0.2', '172.30.0.18'), opts);
    assert.equal(miss.output, '');
    assert.match(miss.notes[0], /^parse: line 6: not parsed \(unterminated quote\), left out: -A KUBE-SERVICES -d 172\.30\.0\.18\/32/);
    assert.equal(traceIptables(text, tcp('10.0.0.2', '172.30.0.10'), opts).output, '10.180.0.1:8080');
  });

  test('words the parser ignores are reported even when the rule does not match', () => {
    const text = dump('-A KUBE-SERVICES -d 172.30.0.19/32 -p tcp "quoted stray" -j KUBE-SVC-A\n');
    const r = traceIptables(text, tcp('10.0.0.2', '172.30.0.99'), opts);
    assert.equal(r.output, '');
    assert.match(r.notes.join('\n'), /line 6: words "quoted stray" not understood, ignored/);
  });

  test('a flood of unreadable lines gives a bounded number of notes', () => {
    const bad = Array.from({ length: 500 }, (_, i) => `-A KUBE-SERVICES -d 172.31.${i >> 8}.${i & 255}/32 --comment "x\n`).join('');
    const r = traceIptables(dump(bad), tcp('10.0.0.2', '172.30.0.10'), opts);
    assert.ok(r.notes.length <= 21, String(r.notes.length));
    assert.match(r.notes.at(-1)!, /480 more warnings not shown/);
  });

  test('trace --json carries the notes', () => {
    const j = JSON.parse(traceJson({ output: '', masq: false, rules: [], notes: ['parse: line 3: not parsed (unterminated quote), left out: x'] }));
    assert.deepEqual(Object.keys(j), ['output', 'masq', 'rules', 'notes']);
    assert.equal(j.notes[0], 'parse: line 3: not parsed (unterminated quote), left out: x');
  });
});

// ---------------------------------------------------------------------------------------
const NS = `kpd2-trc-${process.pid}`;
// Kernel tests never skip (CI runs as root with the tools installed by scripts/setup-system.sh):
// a missing tool fails the test with the tool's own error.
describe('real iptables-save output', () => {
  let saved = '';
  const ipt = (args: string[], input?: string) => sh('ip', ['netns', 'exec', NS, ...args], { input });
  before(() => {
    sh('ip', ['netns', 'del', NS], { allowFail: true });
    sh('ip', ['netns', 'add', NS]);
    try {
      ipt(['iptables', '-t', 'nat', '-N', 'KUBE-SERVICES']);
      ipt(['iptables', '-t', 'nat', '-N', 'KUBE-SVC-A']);
      ipt(['iptables', '-t', 'nat', '-A', 'PREROUTING', '-m', 'comment', '--comment', 'kubernetes service portals', '-j', 'KUBE-SERVICES']);
      const svc = (ip: string, comment: string) => ['iptables', '-t', 'nat', '-A', 'KUBE-SERVICES', '-d', ip, '-p', 'tcp', '-m', 'comment', '--comment', comment, '-m', 'tcp', '--dport', '80', '-j', 'KUBE-SVC-A'];
      ipt(svc('172.30.0.10', 'two words'));
      ipt(svc('172.30.0.11', 'it\'s "quoted" -j DROP'));
      ipt(['iptables', '-t', 'nat', '-A', 'KUBE-SVC-A', '-p', 'tcp', '-m', 'comment', '--comment', 'ns/a:http -> 10.180.0.1:8080', '-j', 'DNAT', '--to-destination', '10.180.0.1:8080']);
      ipt(['iptables-restore', '--noflush'], [
        '*nat',
        '-A KUBE-SERVICES -d 172.30.0.13/32 -p tcp -m comment --comment "esc \\"q\\" and \\\\ back" -m tcp --dport 80 -j KUBE-SVC-A',
        // a quote opening inside a word, as iptables-restore allows
        '-A KUBE-SERVICES -d 172.30.0.14/32 -p tcp -m comment --comment un"quoted escaped" -m tcp --dport 80 -j KUBE-SVC-A',
        '-A KUBE-SERVICES ! -s 10.0.0.0/8 -d 172.30.0.15/32 -p tcp -m tcp ! --dport 81 -m comment --comment "neg both" -j KUBE-SVC-A',
        'COMMIT',
        '',
      ].join('\n'));
      saved = ipt(['iptables-save', '-t', 'nat']);
    } catch (e) {
      sh('ip', ['netns', 'del', NS], { allowFail: true });
      throw e;
    }
  });
  after(() => {
    sh('ip', ['netns', 'del', NS], { allowFail: true });
  });

  const FLOWS = [
    { src: '203.0.113.2', dst: '172.30.0.10', port: 80, output: '10.180.0.1:8080' },
    { src: '203.0.113.2', dst: '172.30.0.11', port: 80, output: '10.180.0.1:8080' },
    { src: '203.0.113.2', dst: '172.30.0.13', port: 80, output: '10.180.0.1:8080' },
    { src: '203.0.113.2', dst: '172.30.0.14', port: 80, output: '10.180.0.1:8080' },
    { src: '203.0.113.2', dst: '172.30.0.15', port: 80, output: '10.180.0.1:8080' },
    { src: '10.0.0.2', dst: '172.30.0.15', port: 80, output: '' },
    { src: '203.0.113.2', dst: '172.30.0.15', port: 81, output: '' },
  ];

  test('every rule written by iptables and iptables-restore reads back, with no parse notes', () => {
    assert.match(saved, /--comment "two words"/);
    assert.match(saved, /--comment "it\\'s \\"quoted\\" -j DROP"/, saved);
    const rs = parseIptablesSave(saved);
    assert.deepEqual(rs.warnings, []);
    const comments = getChain(rs, 'nat', 'KUBE-SERVICES')!.rules.map((r) => r.comment);
    assert.deepEqual(comments, ['two words', 'it\'s "quoted" -j DROP', 'esc "q" and \\ back', 'unquoted escaped', 'neg both']);
    for (const f of FLOWS) {
      const r = traceIptables(saved, tcp(f.src, f.dst, f.port), opts);
      assert.equal(r.output, f.output, `${f.src} -> ${f.dst}:${f.port}`);
      assert.deepEqual(r.notes, [], `${f.src} -> ${f.dst}:${f.port}`);
    }
  });

  test('the same dump rewritten by a tool that does not quote comments gives the same answers', () => {
    const unquoted = saved.replace(/--comment "((?:[^"\\]|\\.)*)"/g, (_m, c: string) => `--comment ${c.replace(/\\(.)/g, '$1').replace(/"/g, '\\"')}`);
    assert.match(unquoted, /--comment two words -m tcp/);
    for (const f of FLOWS) {
      const r = traceIptables(unquoted, tcp(f.src, f.dst, f.port), opts);
      assert.equal(r.output, f.output, `${f.src} -> ${f.dst}:${f.port}\n${unquoted}`);
    }
    const broken = unquoted.replace('COMMIT', '-A KUBE-SERVICES -d 172.30.0.20/32 --comment "half\nCOMMIT');
    const r = traceIptables(broken, tcp('203.0.113.2', '172.30.0.20'), opts);
    assert.equal(r.output, '');
    assert.match(r.notes.join('\n'), /parse: line \d+: not parsed \(unterminated quote\), left out: -A KUBE-SERVICES -d 172\.30\.0\.20\/32/);
  });
});
