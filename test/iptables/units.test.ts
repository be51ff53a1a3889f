import { test } from 'node:test';
import assert from 'node:assert/strict';
import { tableSection, type ChainUnit } from '../../src/modes/iptables/units.ts';

test('a table section is iptables-restore text; another section ahead of it is written first, unchanged', () => {
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
  assert.equal(tableSection('nat', units, ['KUBE-SEP-OLD'], filter), filter + nat);
});
