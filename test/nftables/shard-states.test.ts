// The per-sync bookkeeping kept across syncs (so that a one-Service change is O(changed)
// at 50,000 Services) equals a from-scratch computation after every step of random
// sequences of Service and EndpointSlice adds, updates and deletes, across reshards:
//   - the incremental node view (in place, with revertView after a "failed" sync) = a full
//     build: ports, PortView objects, each Service's ports, the Service count, the
//     no-local-endpoint counts, the health checks, the stale flows;
//   - the sharded proxier's per-table states (ShardStates, updated per changed Service) =
//     splitState of the whole state, and each table it plans = planShards of the state from
//     scratch (the mode's tables for that K) (the kernel: the nft fake).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { buildNodeView, revertView, type NodeView, type PlanInput } from '../../src/core/nodeview.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import { optionsFromInput } from '../../src/modes/nftables/plan.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { planShards, serviceCount, ShardStates, splitState } from '../../src/modes/nftables/shards.ts';
import { shardOf } from '../../src/modes/nftables/names.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { silentLogger } from '../../src/log.ts';
import { tracker } from '../iptables/helpers.ts';
import type { ProxyStateTracker } from '../../src/core/tracker.ts';
import { lbStatus, makeService, makeSlice } from '../support/builders.ts';

const NODE = 'test-node';
const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
const inputOf = (t: ProxyStateTracker): PlanInput => ({ state: t.state, config, node: { nodeName: NODE, nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 } });
const SHARDS = { threshold: 6, perTable: 3, maxTables: 4 };
const SERVICES = 14;

interface SvcShape {
  ports: number;
  udp: boolean;
  kind: 'ClusterIP' | 'NodePort' | 'LoadBalancer';
  etpLocal: boolean;
  itpLocal: boolean;
}

function service(i: number, s: SvcShape): K8sService {
  const ports = Array.from({ length: s.ports }, (_, p) => ({
    name: `p${p}`, port: 80 + p, protocol: s.udp && p === 0 ? 'UDP' : 'TCP', targetPort: 8080 + p,
    ...(s.kind !== 'ClusterIP' ? { nodePort: 30000 + i * 4 + p } : {}),
  }));
  const external = s.kind !== 'ClusterIP';
  return makeService(`ns${i % 3}`, `s${i}`, {
    type: s.kind, clusterIP: `172.30.0.${i + 1}`, clusterIPs: [`172.30.0.${i + 1}`], ipFamilies: ['IPv4'], ports,
    ...(external && s.etpLocal ? { externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 + i } : {}),
    ...(s.itpLocal ? { internalTrafficPolicy: 'Local' } : {}),
  }, s.kind === 'LoadBalancer' ? lbStatus(`203.0.113.${i + 1}`) : undefined);
}

function slice(i: number, eps: Array<{ local: boolean; ready: boolean }>, ports: number): K8sEndpointSlice {
  return makeSlice(`ns${i % 3}`, `s${i}`, {
    name: `s${i}-a`,
    endpoints: eps.map((e, j) => ({ ip: `10.180.${i}.${j + 1}`, node: e.local ? NODE : 'other', ready: e.ready })),
    ports: Array.from({ length: ports }, (_, p) => ({ name: `p${p}`, port: 8080 + p })),
  });
}

const shape = fc.record({
  ports: fc.integer({ min: 1, max: 2 }),
  udp: fc.boolean(),
  kind: fc.constantFrom('ClusterIP' as const, 'NodePort' as const, 'LoadBalancer' as const),
  etpLocal: fc.boolean(),
  itpLocal: fc.boolean(),
});
const endpoints = fc.array(fc.record({ local: fc.boolean(), ready: fc.boolean() }), { maxLength: 3 });
const op = fc.oneof(
  fc.record({ op: fc.constant('service' as const), i: fc.nat(SERVICES - 1), shape }),
  fc.record({ op: fc.constant('deleteService' as const), i: fc.nat(SERVICES - 1) }),
  fc.record({ op: fc.constant('slice' as const), i: fc.nat(SERVICES - 1), eps: endpoints, ports: fc.integer({ min: 1, max: 2 }) }),
  fc.record({ op: fc.constant('deleteSlice' as const), i: fc.nat(SERVICES - 1) }),
  // several Services at once (a burst between syncs): enough to cross the shard thresholds
  fc.record({ op: fc.constant('many' as const), from: fc.nat(SERVICES - 1), count: fc.integer({ min: 2, max: 8 }), del: fc.boolean(), shape }),
);
type Op = typeof op extends fc.Arbitrary<infer T> ? T : never;

function apply(t: ProxyStateTracker, o: Op): void {
  const none = { ports: 1, udp: false, kind: 'ClusterIP' as const, etpLocal: false, itpLocal: false };
  switch (o.op) {
    case 'service': t.services.update(null, service(o.i, o.shape)); break;
    case 'deleteService': t.services.update(service(o.i, none), null); break;
    case 'slice': t.endpoints.update(null, slice(o.i, o.eps, o.ports)); break;
    case 'deleteSlice': t.endpoints.update(slice(o.i, [], 1), null); break;
    case 'many':
      for (let j = 0; j < o.count; j++) {
        const i = (o.from + j) % SERVICES;
        if (o.del) t.services.update(service(i, none), null);
        else {
          t.services.update(null, service(i, o.shape));
          t.endpoints.update(null, slice(i, [{ local: j % 2 === 0, ready: true }], o.shape.ports));
        }
      }
      break;
  }
}

const sorted = <V>(m: Map<string, V>) => new Map([...m].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
const flows = (v: NodeView) => v.staleFlows.map((f) => JSON.stringify(f)).sort();

function assertSameView(inc: NodeView, full: NodeView, what: string): void {
  assert.deepEqual([...inc.ports.keys()].sort(), [...full.ports.keys()], `${what}: ports`);
  for (const [k, v] of full.ports) assert.equal(inc.ports.get(k), v, `${what}: ${k} is the same PortView object`);
  assert.deepEqual(sorted(inc.servicePorts), full.servicePorts, `${what}: each Service's ports`);
  assert.deepEqual(inc.noLocalEndpoints, full.noLocalEndpoints, `${what}: no-local-endpoint counts`);
  assert.deepEqual(sorted(inc.healthChecks), sorted(full.healthChecks), `${what}: health checks`);
  assert.deepEqual(flows(inc), flows(full), `${what}: stale flows`);
}

function snapshot(v: NodeView) {
  return { ports: sorted(v.ports), servicePorts: sorted(new Map([...v.servicePorts].map(([k, l]) => [k, [...l]]))), noLocal: { ...v.noLocalEndpoints }, health: sorted(v.healthChecks) };
}

test('random changes, reshards included: the incremental view and the tables\' states equal a from-scratch computation after every step', async () => {
  let steps = 0;
  let reshards = 0;
  let reverts = 0;
  await fc.assert(
    fc.asyncProperty(fc.array(fc.record({ ops: fc.array(op, { minLength: 1, maxLength: 3 }), fail: fc.boolean() }), { minLength: 1, maxLength: 25 }), async (seq) => {
      const t = tracker(4, NODE);
      const runner = new FakeNft();
      const proxier = new NftProxier({ runner, log: silentLogger(), shards: SHARDS });
      let view = buildNodeView(inputOf(t));
      await proxier.sync({ ...inputOf(t), view }, new Set(), true);
      let pending = new Set<string>();
      for (const [s, step] of seq.entries()) {
        for (const o of step.ops) apply(t, o);
        for (const k of t.apply()) pending.add(k);
        const changes = { services: pending, portKeysOf: (k: string) => t.services.portKeysOf(k) };
        const full = buildNodeView(inputOf(t), view);
        if (step.fail) {
          // a sync that failed after its view was built: reverted, the previous view is as it was
          const before = snapshot(view);
          const failed = buildNodeView(inputOf(t), view, changes);
          revertView(failed);
          assert.deepEqual(snapshot(view), before, `step ${s}: the reverted view`);
          reverts++;
        }
        const inc = buildNodeView(inputOf(t), view, changes);
        assertSameView(inc, full, `step ${s}`);
        assert.equal(inc.servicePorts.size, serviceCount(t.state, 4), `step ${s}: Service count`);
        const k0 = proxier.shardCount;
        await proxier.sync({ ...inputOf(t), view: inc }, new Set(pending), false);
        if (proxier.shardCount !== k0) reshards++;
        view = inc;
        pending = new Set();
        steps++;
        // each table the proxier keeps = the table planned from scratch for its share of the state
        const k = proxier.shardCount;
        const want = planShards(t.state, optionsFromInput(inputOf(t)), k).map(dumpRuleset);
        assert.equal(proxier.tableWriters().length, want.length);
        proxier.tableWriters().forEach((p, i) => assert.equal(p.dump(), want[i], `step ${s}: table ${p.table} (K=${k})`));
      }
    }),
    { numRuns: 100, seed: 20261204 },
  );
  assert.ok(steps > 200, `steps taken: ${steps}`);
  assert.ok(reshards > 0, `reshards seen: ${reshards}`);
  assert.ok(reverts > 0, `reverts seen: ${reverts}`);
});

test('ShardStates: updated per changed Service it is splitState of the state, for every K', async () => {
  await fc.assert(
    fc.property(fc.integer({ min: 2, max: 5 }), fc.array(fc.array(op, { minLength: 1, maxLength: 3 }), { minLength: 1, maxLength: 30 }), (k, seq) => {
      const t = tracker(4, NODE);
      const states = new ShardStates(k);
      states.reset(t.state, 4);
      for (const ops of seq) {
        for (const o of ops) apply(t, o);
        const changed = t.apply();
        states.update(t.state, 4, changed, (svc) => t.services.portKeysOf(svc));
        const want = splitState(t.state, k, (key) => shardOf(key, k));
        for (let i = 0; i < k; i++) {
          assert.deepEqual(sorted(states.state(i).services), sorted(want.get(i)!.services), `table ${i}: ports`);
          assert.deepEqual(sorted(states.state(i).endpoints), sorted(want.get(i)!.endpoints), `table ${i}: endpoints`);
        }
        assert.equal(states.serviceCount, serviceCount(t.state, 4));
      }
    }),
    { numRuns: 100, seed: 20261205 },
  );
});
