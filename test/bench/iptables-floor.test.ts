// bench/iptables-restore-floor.ts: the smallest one-Service commit cut from a partial sync's
// payload, the arguments, and one small run on the real kernel (nf_tables and legacy) in
// namespaces the test creates and removes: the changes land, and the floor is the replay of
// the restore kproxy wrote.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { benchArgs } from '../../bench/index.ts';
import { floorVariant, oneChainPayload, parseFloorArgs } from '../../bench/iptables-restore-floor.ts';
import { Namespaces } from '../../bench/netns.ts';

const nss = new Namespaces();
after(async () => {
  await nss.deleteAll();
});

test('oneChainPayload: the KUBE-SEP chain with the fewest rules, declared and written again; none without one', () => {
  const payload = [
    '*filter', ':KUBE-SEP-FILTER - [0:0]', '-A KUBE-SEP-FILTER -j ACCEPT', 'COMMIT',
    '*nat',
    ':KUBE-SVC-AAAA - [0:0]', ':KUBE-SEP-ONE - [0:0]', ':KUBE-SEP-TWO - [0:0]',
    '-A KUBE-SVC-AAAA -m statistic --mode random --probability 0.5 -j KUBE-SEP-ONE',
    '-A KUBE-SVC-AAAA -j KUBE-SEP-TWO',
    '-A KUBE-SEP-ONE -s 10.180.0.1/32 -j KUBE-MARK-MASQ',
    '-A KUBE-SEP-ONE -p tcp -j DNAT --to-destination 10.180.0.1:8080',
    '-A KUBE-SEP-TWO -p tcp -j DNAT --to-destination 10.180.0.2:8080',
    'COMMIT', '',
  ].join('\n');
  assert.deepEqual(oneChainPayload(payload), {
    chain: 'KUBE-SEP-TWO',
    rules: 1,
    payload: '*nat\n:KUBE-SEP-TWO - [0:0]\n-A KUBE-SEP-TWO -p tcp -j DNAT --to-destination 10.180.0.2:8080\nCOMMIT\n',
  });
  assert.equal(oneChainPayload('*nat\n:KUBE-SVC-AAAA - [0:0]\n-A KUBE-SVC-AAAA -j KUBE-SEP-X\nCOMMIT\n'), undefined);
});

test('arguments: 100,000 by default, 1,000 with --quick, bad values refused with a code; registered in the suite', () => {
  assert.equal(parseFloorArgs([]).n, 100_000);
  assert.deepEqual(parseFloorArgs([]).variants, ['iptables', 'iptables-legacy']);
  assert.equal(parseFloorArgs(['--quick']).n, 1000);
  assert.equal(parseFloorArgs(['--quick', '--n', '10000', '--runs', '3']).n, 10_000);
  assert.throws(() => parseFloorArgs(['--variants', 'nftables']), /KPROXY_BENCH_ARGS: --variants/);
  assert.throws(() => parseFloorArgs(['--n', '0']), /KPROXY_BENCH_ARGS: --n/);
  assert.throws(() => parseFloorArgs(['--n', '200000']), /KPROXY_BENCH_ARGS: --n/);
  const q = benchArgs('iptables-floor', true, '/out', '/work');
  assert.equal(q.file, 'bench/iptables-restore-floor.ts');
  assert.deepEqual(q.args, ['--quick', '--json', '/out/iptables-floor-quick.json']);
  assert.deepEqual(benchArgs('iptables-floor', false, '/out', '/work').args, ['--json', '/out/iptables-floor-full.json']);
});

for (const variant of ['iptables', 'iptables-legacy'] as const) {
  test(`${variant} at 300 Services: each one-endpoint change lands, and its restore is replayed as the floor`, { timeout: 180_000 }, async () => {
    const lines: string[] = [];
    const r = await floorVariant(variant, nss, { n: 300, endpoints: 2, runs: 2, variants: [variant], timeoutMs: 120_000, log: (l) => lines.push(l) });
    assert.equal(r.error, undefined, r.error);
    assert.equal(r.changesPresent, true, 'the endpoints the changes added are in the kernel');
    assert.equal(r.runs.length, 2);
    assert.notEqual(r.runs[0].service, r.runs[1].service);
    for (const run of r.runs) {
      assert.ok(run.restores >= 1, 'the partial sync wrote a restore');
      // one Service's chains (its KUBE-SVC rewritten, one new KUBE-SEP), not the ruleset (~3,000 lines here)
      assert.ok(run.payloadBytes > 0 && run.payloadBytes < 3000, `a one-Service payload: ${run.payloadBytes} bytes`);
      assert.equal(run.kproxy.rulesWritten < 20, true, `rules written: ${run.kproxy.rulesWritten}`);
      assert.ok(run.floorMs > 0 && run.oneChainMs > 0);
      assert.ok(run.kproxy.wallMs >= run.kproxy.writeMs, 'the sync contains its restore');
    }
    const diffs = r.runs.map((x) => x.kproxy.wallMs - x.floorMs);
    assert.ok(Math.abs(r.overFloorMedianMs - (diffs[0] + diffs[1]) / 2) < 1e-9, 'kproxy − floor is the median of the per-run differences');
    assert.equal(nss.names.length, 0, 'the namespace is removed');
  });
}
