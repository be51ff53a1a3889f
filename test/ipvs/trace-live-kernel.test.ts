// The reads of `kproxy trace --mode ipvs --live` against the real `ipset` and `ip` binaries and
// kernel, inside a network namespace this test creates (the host kernel has ipset and addresses
// without IPVS): one `ipset -` session answers every question the walk asks as the plan's sets
// hold them (tableLookup) and as the fake host answers them, and `ip -o addr show dev DEV to
// IP/32` finds one address among many.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, type CommandRunner } from '../../src/kernel/runner.ts';
import { IPSetExec } from '../../src/kernel/ipset/exec.ts';
import { formatIPSets } from '../../src/kernel/ipset/model.ts';
import { Links } from '../../src/kernel/links.ts';
import { plan } from '../../src/modes/ipvs/planner.ts';
import { setQuestions, tableLookup, type SetQuestion } from '../../src/modes/ipvs/trace.ts';
import type { Protocol } from '../../src/core/model.ts';
import { Netns, sh } from '../support/netns.ts';
import { FakeHost } from './fake.ts';
import { ep, input, svc } from './support.ts';

const NS = `kp-ipvstrace-${process.pid}`;
after(() => {
  sh('ip', ['netns', 'del', NS], { allowFail: true });
});

const inNs: CommandRunner = {
  run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', NS, cmd, ...args], opts),
};

test('one ipset - session answers the walk as the kernel sets hold the plan, and as the fake does', async () => {
  Netns.create(NS);
  const inp = input(
    [
      [svc('web', '172.30.0.10', 80, { nodePort: 30080 }), [ep('10.180.0.1', 8080), ep('10.180.0.2', 8080, { isLocal: true })]],
      [svc('lb', '172.30.0.20', 80, { nodePort: 30081, loadBalancerVIPs: ['1.2.3.4'], loadBalancerSourceRanges: ['203.0.113.0/25', '198.51.100.9/32'] }), [ep('10.180.0.3', 80)]],
      [svc('dns', '172.30.0.53', 53, { protocol: 'UDP', nodePort: 30053 }), [ep('10.180.0.6', 5353)]],
      [svc('sctp', '172.30.0.60', 9999, { protocol: 'SCTP', nodePort: 30060 }), [ep('10.180.0.7', 9999)]],
    ],
    { clusterCIDR: '10.0.0.0/8' },
  );
  const p = plan(inp);
  const script = formatIPSets(p.sets);
  const restored = await inNs.run('ipset', ['restore'], { input: script, timeoutMs: 20_000 });
  assert.equal(restored.code, 0, restored.stderr);
  const fake = new FakeHost();
  assert.equal((await fake.run('ipset', ['restore'], { input: script })).code, 0);

  const flows: Array<[string, string, number, Protocol]> = [];
  for (const from of ['10.180.0.9', '10.180.0.2', '203.0.113.5', '203.0.113.200', '198.51.100.9', '172.30.0.20', '0.0.0.0']) {
    for (const [to, port, proto] of [['172.30.0.10', 80, 'TCP'], ['1.2.3.4', 80, 'TCP'], ['192.168.0.2', 30081, 'TCP'], ['172.30.0.53', 53, 'UDP'], ['192.168.0.2', 30060, 'SCTP'], ['172.30.0.99', 80, 'TCP']] as const) {
      flows.push([from, to, port, proto]);
    }
  }
  const seen = new Map<string, SetQuestion>();
  for (const [from, to, port, protocol] of flows) {
    for (const q of setQuestions({ family: 4, table: p.table, masq: p.masq, nodeIPs: inp.node.nodeIPs }, { from, to, port, protocol })) seen.set(`${q.set} ${q.entry}`, q);
  }
  const qs = [...seen.values()];
  const kernel = await new IPSetExec(inNs).test(qs);
  const byFake = await new IPSetExec(fake).test(qs);
  const byPlan = qs.map((q) => tableLookup(p.sets).has(q.set, q.entry));
  const show = (a: boolean[]) => qs.map((q, i) => `${q.set} ${q.entry}: ${a[i]}`).join('\n');
  assert.equal(show(byPlan), show(kernel), 'the plan\'s sets as the walk reads them vs the kernel');
  assert.equal(show(byFake), show(kernel), 'the fake vs the kernel');
  // both answers occur, among them a net match (a source inside a LoadBalancer source range)
  assert.ok(kernel.includes(true) && kernel.includes(false));
  assert.equal(kernel[qs.findIndex((q) => q.set === 'KUBE-LOAD-BALANCER-SOURCE-CIDR' && q.entry === '1.2.3.4,tcp:80,203.0.113.5')], true);
  assert.equal(kernel[qs.findIndex((q) => q.set === 'KUBE-LOAD-BALANCER-SOURCE-CIDR' && q.entry === '1.2.3.4,tcp:80,203.0.113.200')], false);
  // a set that does not exist holds nothing
  assert.deepEqual(await new IPSetExec(inNs).test([{ set: 'KUBE-NO-SUCH-SET', entry: '1.2.3.4' }, { set: 'KUBE-CLUSTER-IP', entry: '172.30.0.10,tcp:80' }]), [false, true]);
});

test('ip -o addr show dev DEV to IP/32|128 finds the one address among many, and nothing for an absent one', async () => {
  Netns.create(NS);
  const batch = Array.from({ length: 200 }, (_, i) => `addr add 172.30.${i >> 8}.${(i & 255) + 1}/32 dev lo`).concat(['addr add fd00:30::10/128 dev lo']).join('\n') + '\n';
  const r = await inNs.run('ip', ['-batch', '-'], { input: batch, timeoutMs: 20_000 });
  assert.equal(r.code, 0, r.stderr);
  const links = new Links(inNs);
  assert.deepEqual(await links.addressesTo('lo', '172.30.0.77'), ['172.30.0.77']);
  assert.deepEqual(await links.addressesTo('lo', '172.30.9.9'), []);
  assert.deepEqual(await links.addressesTo('lo', 'fd00:30::10'), ['fd00:30::10']);
  assert.deepEqual(await links.addressesTo('kube-ipvs0', '172.30.0.77'), [], 'no such device');
});
