// Every upstream flow case of ../shared/conformance through the sharded table shape:
// K = 2 and K = 3 tables, each under every rotation of the Services over the tables and the
// mode's own hash spread (src/modes/nftables/conformance-sharded.ts says what each kind of case
// must give). The golden TEXT stays K = 1 (test/nftables/conformance.test.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { findCases, loadCase } from '../../src/conformance/load.ts';
import { stateOf } from '../../src/conformance/case.ts';
import { runShardedCase } from '../../src/modes/nftables/conformance-sharded.ts';
import { optionsFromCase, tracerLocalIPs } from '../../src/modes/nftables/conformance.ts';
import { planRuleset } from '../../src/modes/nftables/plan.ts';
import { planShards } from '../../src/modes/nftables/shards.ts';
import { traceTables } from '../../src/modes/nftables/trace.ts';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const casesRoot = resolve(repoRoot, '../shared/conformance');
const all = findCases([casesRoot]).map((d) => ({ dir: d, c: loadCase(d) }));
// every flows case (of any mode), and the nftables golden and steps cases
const cases = all.filter(({ c }) => c.kind === 'flows' || c.config.mode === 'nftables');

test('there are flow cases of both modes and an nftables golden case to shard', () => {
  assert.ok(cases.filter(({ c }) => c.kind === 'flows' && c.config.mode === 'nftables').length >= 2);
  assert.ok(cases.filter(({ c }) => c.kind === 'flows' && c.config.mode === 'iptables').length >= 3);
  assert.ok(cases.some(({ c }) => c.kind === 'golden' && c.config.mode === 'nftables'));
});

for (const { dir, c } of cases) {
  test(`sharded K=2,3: ${dir.slice(casesRoot.length + 1)}`, () => {
    const r = runShardedCase(c, [2, 3]);
    assert.equal(r.ok, true, r.detail);
    // 2 + 1 spreads for K = 2, 3 + 1 for K = 3; each packet of the case in each
    assert.equal(r.spreads, 7);
    assert.ok(r.packets >= 7 * 5, `only ${r.packets} packets traced`);
    const services = new Set([...stateOf(c.config, c.objects).services.values()].map((s) => s.serviceKey)).size;
    // the rotations put min(services, K) tables in use: a Service in every table position
    if (c.kind !== 'steps') assert.equal(r.maxTablesUsed, Math.min(services, 3), `${services} Services`);
  });
}

test('the golden case\'s Services fill all three tables in a rotation', () => {
  const { c } = all.find(({ c }) => c.kind === 'golden' && c.config.mode === 'nftables')!;
  assert.equal(runShardedCase(c, [3]).maxTablesUsed, 3);
});

test('a wrong expectation fails through the shards, naming the spread and the flow', () => {
  const { c } = cases.find(({ c }) => c.name === 'nftables-TestClusterIPGeneral')!;
  const bad = { ...c, flows: c.flows!.map((f) => (f.name === "svc1 does not accept svc2's ports" ? { ...f, output: 'DROP' } : f)) };
  const r = runShardedCase(bad, [2]);
  assert.equal(r.ok, false);
  assert.match(r.detail ?? '', /K=2 rotation 0: flow "svc1 does not accept svc2's ports" .* want "DROP" masq=false, got "REJECT"/);
});

// Why the shard tables drop unallocated ClusterIPs only after every table's filter chains
// (plan.ts, NftPlanOptions.sharded): with serviceCIDRs, the single table's inline
// cluster-ips-check in each table would drop traffic to any unallocated-looking ClusterIP, i.e.
// also to another table's ClusterIP on a port it lacks, before that table could REJECT it.
test('the unallocated-ClusterIP drop runs after every table\'s reject (the single table\'s inline drop would not)', () => {
  const { c } = cases.find(({ c }) => c.name === 'nftables-TestClusterIPGeneral')!;
  const o = optionsFromCase(c.config);
  assert.ok(o.serviceCIDRs.length > 0, 'the case sets serviceCIDRs');
  const state = stateOf(c.config, c.objects);
  const flow = c.flows!.find((f) => f.name === "svc1 does not accept svc2's ports")!;
  const wrong = c.flows!.find((f) => f.name === 'packet to unallocated cluster ip')!;
  assert.equal(flow.output, 'REJECT');
  assert.equal(wrong.output, 'DROP');
  const local = { localIPs: tracerLocalIPs(c.config) };
  // svc1 (the packet's ClusterIP) in the first table, svc2 in the second, which the kernel
  // runs first at the same priority (created last: trace.ts)
  const spread = (key: string) => (key.endsWith('/svc1') ? 0 : 1);
  const fixed = planShards(state, o, 2, spread);
  assert.equal(traceTables(fixed, flow, local).output, 'REJECT');
  assert.equal(traceTables(fixed, wrong, local).output, 'DROP');
  assert.ok(fixed.every((rs) => rs.chains.get('filter-forward-unallocated')?.priority === 10));
  // the same two tables planned with the single table's inline drop: svc2's table drops first
  const inline = fixed.map((rs) => {
    const st = { services: new Map([...state.services].filter(([, sp]) => spread(sp.serviceKey) === Number(rs.table.slice(-1)))), endpoints: state.endpoints };
    return planRuleset(st, { ...o, table: rs.table });
  });
  assert.equal(traceTables(inline, flow, local).output, 'DROP');
});
