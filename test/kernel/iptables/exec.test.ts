// The iptables executor (src/kernel/iptables/exec.ts) against a fake kernel that rejects what
// the kernel rejects, and the text helpers it reports with.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IptablesExecutor, RestoreError, extractLines } from '../../../src/kernel/iptables/exec.ts';
import { chainsFromSave } from '../../../src/kernel/iptables/save.ts';
import { splitRuleArgs } from '../../../src/kernel/iptables/tokenize.ts';
import { FakeIptables } from '../../../src/kernel/iptables/fake.ts';

test('a restore that jumps to a missing chain fails atomically, naming the line with context', async () => {
  const k = new FakeIptables();
  const exec = new IptablesExecutor(k, 4);
  await exec.restore('*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j RETURN\nCOMMIT\n');
  const bad = '*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-MISSING\n-A KUBE-B -j RETURN\nCOMMIT\n';
  await assert.rejects(exec.restore(bad), (e: unknown) => {
    assert.ok(e instanceof RestoreError);
    assert.equal(e.line, 4);
    assert.match(e.message, /^KPROXY_IPTABLES_RESTORE_FAILED: /);
    assert.match(e.message, />     4: -A KUBE-A -j KUBE-MISSING/);
    assert.match(e.message, /      3: :KUBE-B - \[0:0\]/, 'lines before');
    assert.match(e.message, /      5: -A KUBE-B -j RETURN/, 'lines after');
    return true;
  });
  assert.deepEqual(k.rules('nat', 'KUBE-A'), ['-j RETURN'], 'the old rules stay');
  assert.ok(!k.chains('nat').includes('KUBE-B'), 'nothing of the failed payload is applied');
  assert.deepEqual(k.calls.at(-1)!.args, ['-w', '5', '--noflush', '--counters']);
});

test('helpers: context lines, chain names from iptables-save, quoted rule arguments', () => {
  assert.equal(extractLines('a\nb\nc\nd', 2, 1), '      1: a\n>     2: b\n      3: c');
  const save = '*filter\n:INPUT ACCEPT [0:0]\n:KUBE-X - [0:0]\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-A - [0:0]\nCOMMIT\n';
  assert.deepEqual([...chainsFromSave(save, 'nat')], ['PREROUTING', 'KUBE-SVC-A']);
  assert.deepEqual(splitRuleArgs('-m comment --comment "a b" -j X'), ['-m', 'comment', '--comment', 'a b', '-j', 'X']);
});
