import { test } from 'node:test';
import assert from 'node:assert/strict';
import { sectionLines, sectionParts, tableSection, type ChainUnit } from '../../src/modes/iptables/units.ts';

test('a table section is iptables-restore text; in parts it is the same text, in whole lines', () => {
  const units: ChainUnit[] = [
    { name: 'KUBE-SVC-A', declare: true, rules: ['-A KUBE-SVC-A -j KUBE-SEP-B'] },
    { name: 'KUBE-SERVICES', declare: false, rules: ['-A KUBE-SERVICES -d 10.0.0.1/32 -j KUBE-SVC-A'] },
  ];
  const nat = tableSection('nat', units, ['KUBE-SEP-OLD']);
  assert.equal(nat, [
    '*nat', ':KUBE-SVC-A - [0:0]', ':KUBE-SEP-OLD - [0:0]', '-A KUBE-SVC-A -j KUBE-SEP-B', '-A KUBE-SERVICES -d 10.0.0.1/32 -j KUBE-SVC-A',
    '-X KUBE-SEP-OLD', 'COMMIT', '',
  ].join('\n'));
  const filter = tableSection('filter', [], []);
  assert.equal(filter, '*filter\nCOMMIT\n');
  assert.equal([...sectionParts('nat', units, ['KUBE-SEP-OLD'])].join(''), nat);
  assert.equal(sectionLines(units, ['KUBE-SEP-OLD']), nat.split('\n').length - 1);
  // a long section: parts of whole lines, the same text
  const many: ChainUnit[] = [{ name: 'KUBE-SVC-A', declare: true, rules: Array.from({ length: 10_000 }, (_, i) => `-A KUBE-SVC-A -s 10.0.${i >> 8}.${i & 255} -j KUBE-SEP-B`) }];
  const parts = [...sectionParts('nat', many, [])];
  assert.ok(parts.length > 2 && parts.every((p) => p.endsWith('\n')), `${parts.length} parts`);
  assert.equal(parts.join(''), tableSection('nat', many, []));
  assert.equal(sectionLines(many, []), 10_003);
});
