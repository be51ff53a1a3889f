// `kproxy trace --rules` as a command: the options it refuses, each with a message that says
// what to give instead (KPROXY_TRACE_INPUT), and a format forced with --rules-format.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from '../support/netns.ts';

function run(args: string[]): { code: number; out: string; err: string } {
  try {
    const out = execFileSync(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'trace', ...args], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'], timeout: 60_000 });
    return { code: 0, out, err: '' };
  } catch (e) {
    const x = e as { status: number; stdout: string; stderr: string };
    return { code: x.status, out: x.stdout, err: x.stderr };
  }
}

test('trace --rules: refused combinations and inputs, and a forced format', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpt-trc-'));
  try {
    const rules = join(dir, 'part.txt');
    // a fragment without its *nat line: only --rules-format says what it is
    writeFileSync(rules, ':KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.180.0.1:80\n');
    const pkt = ['--from', '10.0.0.2', '--to', '172.30.0.41:80'];
    const refused: Array<[string[], RegExp]> = [
      [['--rules', rules, ...pkt], /KPROXY_TRACE_INPUT: .*part\.txt: not the output of iptables-save, nft list ruleset, ipvsadm -Ln\/-Sn or ipset save .*--rules-format/],
      [['--rules', rules, '--live', ...pkt], /KPROXY_TRACE_INPUT: --rules traces saved rules: give it without --live and --manifests/],
      [['--rules', join(dir, 'missing.txt'), ...pkt], /KPROXY_TRACE_INPUT: --rules .*missing\.txt: ENOENT/],
      [['--rules', rules, '--rules', rules, '--rules-format', 'nft,ipset,ipvs', ...pkt], /KPROXY_TRACE_INPUT: --rules-format names 3 formats for 2 --rules files/],
      [['--rules', rules, '--rules-format', 'pf', ...pkt], /KPROXY_TRACE_INPUT: --rules-format "pf": one of iptables-save, nft, ipvsadm, ipset/],
      [['--rules', rules, '--family', '6', ...pkt], /KPROXY_TRACE_INPUT: --family 6 but the packet's addresses are IPv4/],
    ];
    for (const [args, want] of refused) {
      const r = run(args);
      assert.notEqual(r.code, 0, args.join(' '));
      assert.match(r.err, want, args.join(' '));
    }
    // forced: the lines outside a *TABLE block are named, so the answer is honest about them
    const j = JSON.parse(run(['--rules', rules, '--rules-format', 'iptables', '--json', ...pkt]).out);
    assert.equal(j.output, '');
    assert.equal(j.warnings.length, 2);
    assert.match(j.warnings[1], /part\.txt line 2: outside a \*TABLE \.\.\. COMMIT block, left out: -A KUBE-SERVICES/);
    writeFileSync(rules, `*nat\n${'-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.180.0.1:80'}\nCOMMIT\n`);
    const ok = JSON.parse(run(['--rules', rules, '--json', ...pkt]).out);
    assert.equal(ok.output, '10.180.0.1:80');
    assert.match(ok.warnings.join('\n'), /line 2: chain nat\/KUBE-SERVICES used before it was declared/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
