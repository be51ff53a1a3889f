// The incremental node view (buildViewFrom with the previous view and the changed services):
// after any sequence of changes it is the view a full build gives (the same ports, the same
// PortView objects, the same stale flows, per-Service index, counts and health checks; the
// order of `ports` may differ: an incremental build adds new ports last), and it decides only
// the changed services' ports.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildNodeView, nodeViewWork, revertView, type NodeView, type ViewChanges, type PlanInput } from '../../src/core/nodeview.ts';
import { resolveConfig } from '../../src/config/config.ts';
import type { ProxyStateTracker } from '../../src/core/tracker.ts';
import { slice, svc, tracker } from '../iptables/helpers.ts';
import { rng } from '../support/rng.ts';


const config = resolveConfig({}, { mode: 'iptables', clusterCidr: '10.0.0.0/8' });
const inputOf = (t: ProxyStateTracker, labels: Record<string, string> = {}): PlanInput => ({
  state: t.state, config, node: { nodeName: 'test-node', nodeIPs: ['192.168.0.2'], nodeLabels: labels, family: 4 },
});
const changesOf = (t: ProxyStateTracker, services: Set<string>): ViewChanges => ({ services, portKeysOf: (k) => t.services.portKeysOf(k) });
const flows = (v: NodeView) => v.staleFlows.map((f) => JSON.stringify(f)).sort();

function assertSameView(inc: NodeView, full: NodeView, what: string): void {
  assert.deepEqual([...inc.ports.keys()].sort(), [...full.ports.keys()], `${what}: ports (a full build: in key order)`);
  for (const [k, v] of full.ports) assert.equal(inc.ports.get(k), v, `${what}: ${k} is the same PortView object`);
  assert.deepEqual(flows(inc), flows(full), `${what}: stale flows`);
  assert.deepEqual(new Map([...inc.servicePorts].sort()), full.servicePorts, `${what}: each Service's ports`);
  assert.deepEqual(inc.noLocalEndpoints, full.noLocalEndpoints, `${what}: no-local-endpoint counts`);
  assert.deepEqual(new Map([...inc.healthChecks].sort()), new Map([...full.healthChecks].sort()), `${what}: health checks`);
}

test('200 seeded random changes: the incremental view is the full view, step by step', () => {
  const r = rng(20261203);
  const t = tracker();
  const ports = (i: number) => (i % 3 === 0 ? [{ name: 'dns', port: 53, protocol: 'UDP' }] : []);
  const put = (i: number, extra: boolean) =>
    t.services.update(null, svc(`ns${i % 4}`, `s${i}`, { clusterIP: `172.30.1.${i + 1}`, protocol: i % 2 ? 'UDP' : 'TCP', extraPorts: extra ? ports(i).concat([{ name: 'x', port: 81, protocol: 'TCP' }]) : ports(i) }));
  const eps = (i: number) => Array.from({ length: Math.floor(r() * 4) }, (_, k) => ({ ip: `10.180.${i}.${k + 1}`, nodeName: r() < 0.3 ? 'test-node' : 'other' }));
  const putSlice = (i: number) =>
    t.endpoints.update(null, slice(`ns${i % 4}`, `s${i}`, `s${i}-a`, eps(i), [{ port: 8080, protocol: i % 2 ? 'UDP' : 'TCP' }, { name: 'dns', port: 53, protocol: 'UDP' }, { name: 'x', port: 81 }]));
  for (let i = 0; i < 20; i++) {
    put(i, false);
    putSlice(i);
  }
  t.apply();
  let prev = buildNodeView(inputOf(t));
  for (let step = 0; step < 200; step++) {
    const i = Math.floor(r() * 24);
    const op = r();
    if (op < 0.4) putSlice(i);
    else if (op < 0.55) put(i, r() < 0.5);
    else if (op < 0.65) t.services.update(svc(`ns${i % 4}`, `s${i}`, { clusterIP: `172.30.1.${i + 1}` }), null);
    else if (op < 0.75) t.endpoints.update(slice(`ns${i % 4}`, `s${i}`, `s${i}-a`, [], []), null);
    else {
      putSlice(i);
      put((i + 7) % 24, false);
    }
    const changed = t.apply();
    const full = buildNodeView(inputOf(t), prev);
    const before = nodeViewWork.incremental;
    const inc = buildNodeView(inputOf(t), prev, changesOf(t, changed));
    assert.equal(nodeViewWork.incremental, before + 1, 'the incremental path was taken');
    assertSameView(inc, full, `step ${step}`);
    prev = r() < 0.5 ? inc : full;
  }
});

test('only the changed services are decided again; new node settings rebuild the whole view', () => {
  const t = tracker();
  for (let i = 0; i < 300; i++) {
    t.services.update(null, svc('ns', `s${i}`, { clusterIP: `172.30.${(i + 1) >> 8}.${(i + 1) & 255}` }));
    t.endpoints.update(null, slice('ns', `s${i}`, `s${i}-a`, [{ ip: `10.180.${(i + 1) >> 8}.${(i + 1) & 255}` }], [{ port: 8080 }]));
  }
  t.apply();
  const first = buildNodeView(inputOf(t));
  t.endpoints.update(null, slice('ns', 's7', 's7-a', [{ ip: '10.180.9.9' }, { ip: '10.180.9.10' }], [{ port: 8080 }]));
  const changed = t.apply();
  const visited = nodeViewWork.portsVisited;
  const inc = buildNodeView(inputOf(t), first, changesOf(t, changed));
  assert.equal(nodeViewWork.portsVisited - visited, 1, 'one port decided again');
  assert.equal(inc.ports.get('ns/s7:p80')!.endpoints.length, 2);
  assert.equal(inc.ports.get('ns/s8:p80'), first.ports.get('ns/s8:p80'));
  // the node's labels changed: every port's topology decision may change
  const v2 = nodeViewWork.portsVisited;
  const relabelled = buildNodeView(inputOf(t, { 'topology.kubernetes.io/zone': 'z' }), inc, changesOf(t, new Set()));
  assert.equal(nodeViewWork.portsVisited - v2, 300, 'a full build');
  assert.equal(relabelled.ports.size, 300);
});

test('an incremental build supersedes its previous view: building from it again is refused (KPROXY_VIEW_INTERNAL); revertView gives it back', () => {
  const t = tracker();
  for (let i = 0; i < 5; i++) {
    t.services.update(null, svc('ns', `s${i}`, { clusterIP: `172.30.0.${i + 1}`, protocol: 'UDP' }));
    t.endpoints.update(null, slice('ns', `s${i}`, `s${i}-a`, [{ ip: `10.180.0.${i + 1}` }], [{ port: 8080, protocol: 'UDP' }]));
  }
  t.apply();
  const first = buildNodeView(inputOf(t));
  const s2 = first.ports.get('ns/s2:p80');
  // s2 loses its endpoint, s9 is new
  t.endpoints.update(null, slice('ns', 's2', 's2-a', [], [{ port: 8080, protocol: 'UDP' }]));
  t.services.update(null, svc('ns', 's9', { clusterIP: '172.30.0.99' }));
  const changed = t.apply();
  const inc = buildNodeView(inputOf(t), first, changesOf(t, changed));
  assert.equal(inc.ports.size, 6);
  assert.ok(inc.staleFlows.some((f) => f.kind === 'endpoint' && f.endpointIP === '10.180.0.3'), 'the UDP flows to the endpoint that left');
  assert.throws(() => buildNodeView(inputOf(t), first, changesOf(t, changed)), (e: Error & { code?: string }) => e.code === 'KPROXY_VIEW_INTERNAL');
  // the sync of `inc` failed: the first view is back as it was, and may be built from again
  revertView(inc);
  assert.equal(first.ports.size, 5);
  assert.equal(first.ports.get('ns/s2:p80'), s2);
  assert.equal(first.servicePorts.has('ns/s9'), false);
  const again = buildNodeView(inputOf(t), first, changesOf(t, changed));
  assert.equal(again.ports.size, 6);
  assert.deepEqual(flows(again), flows(inc));
  // a full build does not take the previous view's maps; nor does it start from a superseded one
  assert.throws(() => buildNodeView(inputOf(t), first), (e: Error & { code?: string }) => e.code === 'KPROXY_VIEW_INTERNAL');
  const full = buildNodeView(inputOf(t), again);
  assert.notEqual(full.ports, again.ports);
  assert.deepEqual([...again.ports.keys()].sort(), [...full.ports.keys()]);
  assert.deepEqual(full.staleFlows, [], 'nothing changed since `again`');
});

test('a view keeps no chain of the views before it alive: the superseded views of a run of incremental builds are collected', async () => {
  // Between full syncs (an hour apart) every sync builds from the last: a view that kept its
  // predecessor alive would keep every view since the last full build.
  const { collectGarbage } = await import('../../src/sync/memory.ts');
  const t = tracker();
  for (let i = 0; i < 20; i++) {
    t.services.update(null, svc('ns', `s${i}`, { clusterIP: `172.30.0.${i + 1}` }));
    t.endpoints.update(null, slice('ns', `s${i}`, `s${i}-a`, [{ ip: `10.180.0.${i + 1}` }], [{ port: 8080 }]));
  }
  t.apply();
  const refs: Array<WeakRef<NodeView>> = [];
  /** 30 incremental builds, each from the last, one endpoint change each; only the newest view is returned */
  const run = (): NodeView => {
    let view = buildNodeView(inputOf(t));
    refs.push(new WeakRef(view));
    for (let k = 0; k < 30; k++) {
      t.endpoints.update(null, slice('ns', 's3', 's3-a', [{ ip: `10.180.1.${k + 1}` }], [{ port: 8080 }]));
      view = buildNodeView(inputOf(t), view, changesOf(t, t.apply()));
      refs.push(new WeakRef(view));
    }
    return view;
  };
  const last = run();
  // a WeakRef holds its target until the job that made it ends; then up to 3 full collections
  for (let i = 0; i < 3 && refs.slice(0, -2).some((r) => r.deref()); i++) {
    await new Promise((r) => setImmediate(r));
    assert.ok(collectGarbage(), 'this runtime can collect on demand');
  }
  const alive = refs.slice(0, -2).filter((r) => r.deref() !== undefined).length;
  assert.equal(alive, 0, `views older than the last two still alive: ${alive} of ${refs.length - 2}`);
  assert.equal(last.ports.get('ns/s3:p80')!.endpoints[0].ip, '10.180.1.30');
});
