// bench/own-path.ts at a tiny size: each tree's steps are timed (the nft calls apart from
// kproxy's own part), the table has a row per size and tree, and no kpb-* namespace of this
// process is left behind. Not a timing test: it checks the bench measures what it says.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { ownPath, ownPathTable } from '../../bench/own-path.ts';

const ours = () => execFileSync('ip', ['netns', 'list'], { encoding: 'utf8', timeout: 10_000 }).split('\n').filter((l) => l.startsWith(`kpb-${process.pid}o-`));

test('own-path at 20 Services, real kernel: a change writes one nft transaction; own part and commands are split', { timeout: 60_000 }, async () => {
  try {
    const cells = await ownPath({ sizes: [20], changes: 2, mode: 'nftables', trees: [['a', '.'], ['b', '.']], kernel: true, timeoutS: 30 }, () => {});
    for (const t of ['a', 'b']) {
      const s = cells.get(`20 ${t}`)!;
      assert.equal(s.own.length, 2, `${t}: two changes`);
      for (let i = 0; i < 2; i++) {
        assert.ok(s.commands[i] > 0, `${t}: the change ran nft (${s.commands[i]} ms)`);
        assert.ok(s.own[i] > 0 && Number.isFinite(s.own[i]), `${t}: own part measured`);
        assert.ok(Math.abs(s.whole[i] - (s.own[i] + s.commands[i])) < 1e-6, `${t}: whole = own + commands`);
      }
    }
    const table = ownPathTable(cells, [20], ['a', 'b'], true);
    assert.equal(table.split('\n').filter((l) => l.startsWith('| 20 |')).length, 2);
  } finally {
    assert.deepEqual(ours(), [], 'no namespace left');
  }
});

test('own-path without a kernel: no command takes time, the steps are still timed', { timeout: 60_000 }, async () => {
  const cells = await ownPath({ sizes: [20], changes: 2, mode: 'iptables', trees: [['a', '.']], kernel: false, timeoutS: 30 }, () => {});
  const s = cells.get('20 a')!;
  assert.deepEqual(s.commands, [0, 0]);
  assert.ok(s.syncWall.every((x) => x > 0));
});
