// What the nftables proxier keeps between syncs (incremental.ts): each port's inputs and an
// index of its tables by name, not the ports' rule text or the assembled tables; and what it
// keeps per line of a transaction (LineOwners), only while nft may still refuse it.
//   - the heap the proxier alone holds after its syncs stays under a bound per Service that
//     a proxier keeping its rule text (~5 KB a Service with 5 endpoints) exceeds;
//   - random sequences with what the index answers for (an element several ports add, one two
//     Services add with different verdicts, affinity sets, endpoint-only changes, refused
//     transactions, a node address change), in one table and several: after every sync each
//     table's dump is the table planned from scratch, the objects counted are its count, and
//     after an idle sync the fake kernel's tables are a fresh full sync's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { buildNodeView, type PlanInput } from '../../src/core/nodeview.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import type { CommandRunner, RunOptions } from '../../src/kernel/runner.ts';
import { optionsFromInput } from '../../src/modes/nftables/plan.ts';
import { countObjects, dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { planShards } from '../../src/modes/nftables/shards.ts';
import { LineOwners, NftProxier } from '../../src/modes/nftables/proxier.ts';
import { collectGarbage } from '../../src/sync/memory.ts';
import { silentLogger } from '../../src/log.ts';
import { tracker } from '../iptables/helpers.ts';
import type { ProxyStateTracker } from '../../src/core/tracker.ts';
import { clientIPAffinity, lbStatus, makeService, makeSlice } from '../support/builders.ts';

const NODE = 'test-node';
const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });

test('LineOwners: each line\'s writer and owner, kept as runs', () => {
  fc.assert(
    fc.property(fc.array(fc.record({ writer: fc.integer({ min: -1, max: 3 }), owner: fc.constantFrom(undefined, 'ns/a:p', 'ns/b:p', 'ns/c:q'), repeat: fc.integer({ min: 1, max: 5 }) }), { maxLength: 60 }), (runs) => {
      const lines = new LineOwners();
      const want: Array<{ writer: number; owner: string | undefined }> = [];
      for (const r of runs) {
        for (let i = 0; i < r.repeat; i++) {
          lines.push(r.writer, r.owner);
          want.push({ writer: r.writer, owner: r.owner });
        }
      }
      assert.equal(lines.count, want.length);
      want.forEach((w, i) => assert.deepEqual(lines.at(i + 1), w, `line ${i + 1}`));
      assert.equal(lines.at(0), undefined);
      assert.equal(lines.at(want.length + 1), undefined);
    }),
    { numRuns: 200, seed: 20261206 },
  );
});

function benchService(i: number): K8sService {
  return makeService('bench', `svc-${i}`, {
    type: 'ClusterIP',
    clusterIP: `172.30.${i >> 8}.${i & 255}`,
    ipFamilies: ['IPv4'],
    ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080 }],
  });
}

function benchSlice(i: number, n: number): K8sEndpointSlice {
  return makeSlice('bench', `svc-${i}`, {
    name: `svc-${i}-a`,
    endpoints: Array.from({ length: n }, (_, k) => ({ ip: `10.${180 + (i >> 16)}.${(i >> 8) & 255}.${((i & 255) * 8 + k) & 255}`, node: 'other', ready: true })),
    ports: [{ name: 'http', port: 8080 }],
  });
}

test('between syncs the proxier holds ~1 KB per Service (5 endpoints), not its rule text', async () => {
  const N = 2000;
  const t = tracker(4, NODE);
  for (let i = 0; i < N; i++) {
    t.services.update(null, benchService(i));
    t.endpoints.update(null, benchSlice(i, 5));
  }
  t.apply();
  const input: PlanInput = { state: t.state, config, node: { nodeName: NODE, nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 } };
  let view = buildNodeView(input);
  const runner = new FakeNft();
  let proxier: NftProxier | null = new NftProxier({ runner, log: silentLogger() });
  await proxier.sync({ ...input, view }, new Set(), true);
  // a few one-Service changes, as between two full syncs
  for (let i = 0; i < 20; i++) {
    t.endpoints.update(benchSlice(i * 97, 5), benchSlice(i * 97, 6));
    const changed = t.apply();
    view = buildNodeView(input, view, { services: changed, portKeysOf: (k) => t.services.portKeysOf(k) });
    await proxier.sync({ ...input, view }, changed, false);
  }
  assert.ok(proxier.shardCount > 1, `${proxier.shardCount} tables`);
  assert.equal(collectGarbage(), true);
  const withProxier = process.memoryUsage().heapUsed;
  proxier = null;
  assert.equal(collectGarbage(), true);
  // what only the proxier held (the state, the node view, the fake kernel and the caches
  // keyed by the ServicePorts stay)
  const kept = withProxier - process.memoryUsage().heapUsed;
  const perService = kept / N;
  assert.ok(perService < 2048, `the proxier holds ${(kept / 2 ** 20).toFixed(2)} MiB, ${perService.toFixed(0)} bytes per Service`);
  assert.ok(perService > 100, `${perService.toFixed(0)} bytes per Service: the measure sees the proxier`);
});

const SERVICES = 10;

interface Shape {
  ports: number;
  kind: 'ClusterIP' | 'NodePort' | 'LoadBalancer';
  /** the external IP and port every such Service adds, each with its own verdict */
  shared: boolean;
  sticky: boolean;
  etpLocal: boolean;
}

function service(i: number, s: Shape): K8sService {
  const ports = Array.from({ length: s.ports }, (_, p) => ({ name: `p${p}`, port: 80 + p, protocol: p === 1 ? 'UDP' : 'TCP', targetPort: 8080 + p, ...(s.kind !== 'ClusterIP' ? { nodePort: 30000 + i * 4 + p } : {}) }));
  return makeService(`ns${i % 3}`, `s${i}`, {
    type: s.kind, clusterIP: `172.30.0.${i + 1}`, ipFamilies: ['IPv4'], ports,
    ...(s.shared ? { externalIPs: ['1.2.3.9'] } : {}),
    ...(s.sticky ? clientIPAffinity(60) : {}),
    ...(s.kind !== 'ClusterIP' && s.etpLocal ? { externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 + i } : {}),
  }, s.kind === 'LoadBalancer' ? lbStatus(`203.0.113.${i + 1}`) : undefined);
}

function slice(i: number, eps: Array<{ local: boolean; ready: boolean }>): K8sEndpointSlice {
  return makeSlice(`ns${i % 3}`, `s${i}`, {
    name: `s${i}-a`,
    endpoints: eps.map((e, j) => ({ ip: `10.180.${i}.${j + 1}`, node: e.local ? NODE : 'other', ready: e.ready })),
    ports: [{ name: 'p0', port: 8080 }, { name: 'p1', port: 8081, protocol: 'UDP' }, { name: 'p2', port: 8082 }],
  });
}

const shape = fc.record({ ports: fc.integer({ min: 1, max: 3 }), kind: fc.constantFrom('ClusterIP' as const, 'NodePort' as const, 'LoadBalancer' as const), shared: fc.boolean(), sticky: fc.boolean(), etpLocal: fc.boolean() });
const endpoints = fc.array(fc.record({ local: fc.boolean(), ready: fc.boolean() }), { maxLength: 4 });
const op = fc.oneof(
  fc.record({ op: fc.constant('service' as const), i: fc.nat(SERVICES - 1), shape }),
  fc.record({ op: fc.constant('deleteService' as const), i: fc.nat(SERVICES - 1) }),
  fc.record({ op: fc.constant('slice' as const), i: fc.nat(SERVICES - 1), eps: endpoints }),
);
type Op = typeof op extends fc.Arbitrary<infer T> ? T : never;
const NONE: Shape = { ports: 1, kind: 'ClusterIP', shared: false, sticky: false, etpLocal: false };

function apply(t: ProxyStateTracker, o: Op): void {
  if (o.op === 'service') t.services.update(null, service(o.i, o.shape));
  else if (o.op === 'deleteService') t.services.update(service(o.i, NONE), null);
  else t.endpoints.update(null, slice(o.i, o.eps));
}

/** The fake kernel's tables, each object one line (a set's elements in any order, as the kernel keeps them), sorted. */
function kernelTables(fake: FakeNft, tables: string[]): string[] {
  const out: string[] = [];
  for (const name of tables) {
    const t = fake.tables.get(`ip ${name}`);
    assert.ok(t, `table ${name}`);
    for (const ch of t.chains.values()) out.push(`${name} chain ${ch.name} ${ch.base ?? ''} ${ch.comment ?? ''}: ${ch.rules.join(' ; ')}`);
    for (const set of t.sets.values()) {
      out.push(`${name} ${set.kind} ${set.name} ${set.spec.join(' ')}`);
      for (const [k, el] of set.elements) out.push(`${name} ${set.name} element ${k} ${el.value ?? ''} ${el.comment ?? ''}`);
    }
  }
  return out.sort();
}

/** The fake, refusing the next `nft -f` when asked to (a transaction the kernel refused). */
class Refusing implements CommandRunner {
  refuseNext = false;
  readonly fake = new FakeNft();
  async run(cmd: string, args: string[], opts?: RunOptions) {
    if (args[0] === '-f' && this.refuseNext) {
      this.refuseNext = false;
      return { code: 1, stdout: '', stderr: 'Error: Could not process rule: Cannot allocate memory' };
    }
    return this.fake.run(cmd, args, opts);
  }
}

for (const layout of [{ name: 'one table', shards: {} }, { name: 'three tables', shards: { tables: 3 } }]) {
  test(`random changes with shared and disputed elements, affinity, refusals and a node address change (${layout.name}): each table is the one planned from scratch`, async () => {
    let steps = 0;
    let refusals = 0;
    await fc.assert(
      fc.asyncProperty(fc.array(fc.record({ ops: fc.array(op, { maxLength: 3 }), refuse: fc.boolean(), node: fc.constantFrom(2, 2, 2, 3) }), { minLength: 1, maxLength: 12 }), async (seq) => {
        const t = tracker(4, NODE);
        const nodeAt = (ip: number) => ({ nodeName: NODE, nodeIPs: [`192.168.0.${ip}`], nodeLabels: {}, family: 4 as const });
        let input: PlanInput = { state: t.state, config, node: nodeAt(2) };
        const runner = new Refusing();
        let now = 0;
        const proxier = new NftProxier({ runner, log: silentLogger(), shards: layout.shards, now: () => now, staleChainDelayMs: 0, staleChainBatchMs: 0 });
        let view = buildNodeView(input);
        await proxier.sync({ ...input, view }, new Set(), true);
        for (const [s, step] of seq.entries()) {
          for (const o of step.ops) apply(t, o);
          const changed = t.apply();
          const moved = step.node !== Number(input.node.nodeIPs[0].split('.')[3]);
          if (moved) input = { ...input, node: nodeAt(step.node) };
          view = buildNodeView(input, view, { services: changed, portKeysOf: (k) => t.services.portKeysOf(k) });
          runner.refuseNext = step.refuse;
          if (step.refuse) refusals++;
          now += 1000;
          // a Node change makes the controller run a full sync (controller.ts onNode); with one
          // table a partial sync takes the whole-table diff
          const full = moved && proxier.shardCount > 1;
          let stats;
          try {
            stats = await proxier.sync({ ...input, view }, new Set(changed), full);
          } catch {
            // refused: the next sync is a full one
            stats = await proxier.sync({ ...input, view }, new Set(), false);
          }
          steps++;
          const want = planShards(t.state, optionsFromInput(input), proxier.shardCount);
          proxier.tableWriters().forEach((w, i) => assert.equal(w.dump(), dumpRuleset(want[i]), `step ${s}: ${w.table}`));
          assert.equal(stats.rulesTotal, want.reduce((n, rs) => n + countObjects(rs), 0), `step ${s}: objects counted`);
        }
        // an idle sync deletes what partial syncs left for later: then the kernel is a fresh full sync's
        now += 1000;
        await proxier.sync({ ...input, view }, new Set(), false);
        const fresh = new FakeNft();
        const other = new NftProxier({ runner: fresh, log: silentLogger(), shards: layout.shards });
        await other.sync({ ...input, view }, new Set(), true);
        assert.deepEqual(kernelTables(runner.fake, proxier.tables()), kernelTables(fresh, other.tables()));
      }),
      { numRuns: 60, seed: 20261206 },
    );
    assert.ok(steps > 200, `steps taken: ${steps}`);
    assert.ok(refusals > 50, `refusals: ${refusals}`);
  });
}
