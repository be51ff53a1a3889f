// Unit tests for src/core/tracker.ts: {previous, current} change tracking, no-op dropping,
// changed service keys, slices moving between services, node name changes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { makeService, makeSlice, type EndpointOpts } from '../support/builders.ts';

function svc(name: string, clusterIP = '172.30.0.41', ports = [{ name: 'p80', port: 80 }], ns = 'ns1'): K8sService {
  return makeService(ns, name, { clusterIP, ports });
}

function slice(name: string, service: string, endpoints: EndpointOpts[], ns = 'ns1'): K8sEndpointSlice {
  return makeSlice(ns, service, { name, endpoints, ports: [{ name: 'p80', port: 80 }] });
}

const ep = (ip: string, node?: string): EndpointOpts => ({ ip, node });
const keys = (s: Set<string>) => [...s].sort();
const epKeys = (t: ProxyStateTracker, port: string) => t.state.endpoints.get(port)?.map((e) => e.key);

test('service add, update, delete', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  assert.equal(t.hasPending(), false);
  assert.equal(t.services.update(null, svc('svc1')), true);
  assert.equal(t.services.update(null, svc('svc2', '172.30.0.42')), true);
  assert.equal(t.hasPending(), true);
  assert.deepEqual(keys(t.apply()), ['ns1/svc1', 'ns1/svc2']);
  assert.equal(t.hasPending(), false);
  assert.deepEqual([...t.state.services.keys()].sort(), ['ns1/svc1:p80', 'ns1/svc2:p80']);

  // update: a port renamed replaces the old port key
  t.services.update(svc('svc1'), svc('svc1', '172.30.0.41', [{ name: 'http', port: 80 }]));
  assert.deepEqual(keys(t.apply()), ['ns1/svc1']);
  assert.deepEqual([...t.state.services.keys()].sort(), ['ns1/svc1:http', 'ns1/svc2:p80']);

  t.services.update(svc('svc2'), null);
  assert.deepEqual(keys(t.apply()), ['ns1/svc2']);
  assert.deepEqual([...t.state.services.keys()], ['ns1/svc1:http']);
  assert.deepEqual(keys(t.apply()), [], 'nothing pending after apply');
});

test('a no-op service update is dropped', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  t.services.update(null, svc('svc1'));
  t.apply();
  const same = svc('svc1');
  same.metadata!.resourceVersion = '2'; // metadata changes that do not change rules
  assert.equal(t.services.update(svc('svc1'), same), false);
  assert.equal(t.hasPending(), false);
  assert.deepEqual(keys(t.apply()), []);
});

test('update then revert before a sync leaves nothing pending', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  t.services.update(null, svc('svc1'));
  t.apply();
  assert.equal(t.services.update(svc('svc1'), svc('svc1', '172.30.0.99')), true);
  assert.equal(t.services.update(svc('svc1', '172.30.0.99'), svc('svc1')), false);
  assert.equal(t.hasPending(), false);
  assert.deepEqual(keys(t.apply()), []);
  assert.equal(t.state.services.get('ns1/svc1:p80')?.clusterIP, '172.30.0.41');
});

test('add then delete before a sync leaves nothing pending', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  t.services.update(null, svc('svc1'));
  t.services.update(svc('svc1'), null);
  t.endpoints.update(null, slice('s1', 'svc1', [ep('10.180.0.1')]));
  t.endpoints.update(slice('s1', 'svc1', [ep('10.180.0.1')]), null);
  assert.equal(t.hasPending(), false);
  assert.deepEqual(keys(t.apply()), []);
  assert.equal(t.state.services.size, 0);
  assert.equal(t.state.endpoints.size, 0);
});

test('a service that becomes invalid loses its ports (reported), others stay', () => {
  const reports: string[] = [];
  const t = new ProxyStateTracker(4, 'node-a', (m, o) => reports.push(`${o}: ${m}`));
  t.services.update(null, svc('svc1'));
  t.services.update(null, svc('svc2', '172.30.0.42'));
  t.apply();
  t.services.update(svc('svc1'), svc('svc1', 'garbage'));
  assert.deepEqual(keys(t.apply()), ['ns1/svc1']);
  assert.deepEqual([...t.state.services.keys()], ['ns1/svc2:p80']);
  assert.equal(reports.length, 1);
  assert.match(reports[0], /ns1\/svc1/);
});

test('endpoint slices: add, update, delete, merged per service', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  t.endpoints.update(null, slice('svc1-a', 'svc1', [ep('10.180.0.1')]));
  t.endpoints.update(null, slice('svc1-b', 'svc1', [ep('10.180.0.2')]));
  t.endpoints.update(null, slice('svc2-a', 'svc2', [ep('10.180.1.1')]));
  assert.deepEqual(keys(t.apply()), ['ns1/svc1', 'ns1/svc2']);
  assert.deepEqual(epKeys(t, 'ns1/svc1:p80'), ['10.180.0.1:80', '10.180.0.2:80']);
  assert.deepEqual(epKeys(t, 'ns1/svc2:p80'), ['10.180.1.1:80']);

  t.endpoints.update(slice('svc1-b', 'svc1', [ep('10.180.0.2')]), slice('svc1-b', 'svc1', [ep('10.180.0.3')]));
  assert.deepEqual(keys(t.apply()), ['ns1/svc1']);
  assert.deepEqual(epKeys(t, 'ns1/svc1:p80'), ['10.180.0.1:80', '10.180.0.3:80']);

  t.endpoints.update(slice('svc1-a', 'svc1', [ep('10.180.0.1')]), null);
  assert.deepEqual(keys(t.apply()), ['ns1/svc1']);
  assert.deepEqual(epKeys(t, 'ns1/svc1:p80'), ['10.180.0.3:80']);

  t.endpoints.update(slice('svc1-b', 'svc1', [ep('10.180.0.3')]), null);
  assert.deepEqual(keys(t.apply()), ['ns1/svc1']);
  assert.equal(t.state.endpoints.has('ns1/svc1:p80'), false);
  assert.deepEqual(epKeys(t, 'ns1/svc2:p80'), ['10.180.1.1:80']);
});

test('a no-op slice update (or one that only moves an endpoint between slices) is dropped', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  t.endpoints.update(null, slice('a', 'svc1', [ep('10.180.0.1'), ep('10.180.0.2')]));
  t.endpoints.update(null, slice('b', 'svc1', []));
  t.apply();
  const again = slice('a', 'svc1', [ep('10.180.0.2'), ep('10.180.0.1')]); // same set, other order
  again.metadata!.resourceVersion = '7';
  assert.equal(t.endpoints.update(slice('a', 'svc1', [ep('10.180.0.1'), ep('10.180.0.2')]), again), false);
  // 10.180.0.2 moves from slice a to slice b: the service's endpoints are unchanged
  t.endpoints.update(again, slice('a', 'svc1', [ep('10.180.0.1')]));
  t.endpoints.update(slice('b', 'svc1', []), slice('b', 'svc1', [ep('10.180.0.2')]));
  assert.equal(t.hasPending(), false);
  assert.deepEqual(keys(t.apply()), []);
});

test('endpoint update then revert leaves nothing pending', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  const s1 = slice('a', 'svc1', [ep('10.180.0.1')]);
  t.endpoints.update(null, s1);
  t.apply();
  const s2 = slice('a', 'svc1', [ep('10.180.0.9')]);
  assert.equal(t.endpoints.update(s1, s2), true);
  assert.equal(t.endpoints.update(s2, s1), false);
  assert.equal(t.hasPending(), false);
  assert.deepEqual(keys(t.apply()), []);
});

test('a slice moving to another service changes both services', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  const before = slice('moving', 'svc1', [ep('10.180.0.1')]);
  t.endpoints.update(null, before);
  t.endpoints.update(null, slice('stay', 'svc1', [ep('10.180.0.2')]));
  t.apply();
  const after = slice('moving', 'svc2', [ep('10.180.0.1')]);
  assert.equal(t.endpoints.update(before, after), true);
  assert.deepEqual(keys(t.apply()), ['ns1/svc1', 'ns1/svc2']);
  assert.deepEqual(epKeys(t, 'ns1/svc1:p80'), ['10.180.0.2:80']);
  assert.deepEqual(epKeys(t, 'ns1/svc2:p80'), ['10.180.0.1:80']);
  // deleting it later removes it from svc2, not svc1
  t.endpoints.update(after, null);
  assert.deepEqual(keys(t.apply()), ['ns1/svc2']);
  assert.equal(t.state.endpoints.has('ns1/svc2:p80'), false);
  assert.deepEqual(epKeys(t, 'ns1/svc1:p80'), ['10.180.0.2:80']);
});

test('a slice relabelled to an invalid service name leaves its old service', () => {
  const reports: string[] = [];
  const t = new ProxyStateTracker(4, 'node-a', (m) => reports.push(m));
  const before = slice('moving', 'svc1', [ep('10.180.0.1')]);
  t.endpoints.update(null, before);
  t.apply();
  const after = slice('moving', 'Not Valid', [ep('10.180.0.1')]);
  t.endpoints.update(before, after);
  assert.deepEqual(keys(t.apply()), ['ns1/svc1']);
  assert.equal(t.state.endpoints.has('ns1/svc1:p80'), false);
  assert.ok(reports.length >= 1);
});

test('slices without a service-name label are valid, belong to no Service, and are ignored', () => {
  // The API server accepts them (ValidateObjectMeta: labels are optional); upstream kube-proxy's
  // EndpointSliceCache files them nowhere (endpointSliceCacheKeys). Not an invalid object.
  const reports: string[] = [];
  const invalid: string[] = [];
  const t = new ProxyStateTracker(4, 'node-a', (m, o) => reports.push(`${o}: ${m}`), { onInvalid: (k, o) => invalid.push(`${k} ${o}`) });
  const s = slice('orphan', 'svc1', [ep('10.180.0.1')]);
  s.metadata!.labels = {};
  assert.equal(t.endpoints.update(null, s), false);
  const unlabelled = slice('unlabelled', 'svc1', [ep('10.180.0.2')]);
  delete unlabelled.metadata!.labels;
  assert.equal(t.endpoints.update(null, unlabelled), false);
  assert.equal(t.hasPending(), false);
  assert.equal(t.state.endpoints.size, 0);
  assert.deepEqual(invalid, []);
  assert.deepEqual(reports, []);
  // labelled later, the slice joins its Service
  t.endpoints.update(s, slice('orphan', 'svc1', [ep('10.180.0.1')]));
  assert.deepEqual(keys(t.apply()), ['ns1/svc1']);
  assert.deepEqual(epKeys(t, 'ns1/svc1:p80'), ['10.180.0.1:80']);
});

test('setNodeName recomputes isLocal and reports the services whose endpoints changed', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  t.endpoints.update(null, slice('a', 'svc1', [ep('10.180.0.1', 'node-a'), ep('10.180.0.2', 'node-b')]));
  t.endpoints.update(null, slice('b', 'svc2', [ep('10.180.1.1', 'node-c')]));
  t.apply();
  const local = (port: string) => t.state.endpoints.get(port)!.filter((e) => e.isLocal).map((e) => e.ip);
  assert.deepEqual(local('ns1/svc1:p80'), ['10.180.0.1']);

  t.endpoints.setNodeName('node-a'); // same name: nothing to do
  assert.equal(t.hasPending(), false);

  t.endpoints.setNodeName('node-b');
  assert.deepEqual(keys(t.apply()), ['ns1/svc1'], 'svc2 has no endpoint on either node');
  assert.deepEqual(local('ns1/svc1:p80'), ['10.180.0.2']);
  assert.deepEqual(local('ns1/svc2:p80'), []);

  // later slices use the new name too
  t.endpoints.update(null, slice('c', 'svc3', [ep('10.180.2.1', 'node-b')]));
  t.apply();
  assert.deepEqual(local('ns1/svc3:p80'), ['10.180.2.1']);
});

test('services and endpoints are tracked independently; apply returns the union', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  t.services.update(null, svc('svc1'));
  t.endpoints.update(null, slice('a', 'svc2', [ep('10.180.0.1')]));
  assert.deepEqual(keys(t.apply()), ['ns1/svc1', 'ns1/svc2']);
  // endpoints for a service that does not exist (yet) are kept, ready for when it arrives
  assert.deepEqual(epKeys(t, 'ns1/svc2:p80'), ['10.180.0.1:80']);
  t.services.update(null, svc('svc2', '172.30.0.42'));
  assert.deepEqual(keys(t.apply()), ['ns1/svc2']);
  assert.ok(t.state.services.has('ns1/svc2:p80'));
});

test('an IPv6 tracker ignores IPv4-only services and slices', () => {
  const t = new ProxyStateTracker(6, 'node-a');
  assert.equal(t.services.update(null, svc('svc1')), false);
  assert.equal(t.endpoints.update(null, slice('a', 'svc1', [ep('10.180.0.1')])), false);
  assert.equal(t.hasPending(), false);
});

test('a Service whose ports only change order is a no-op; a changed port among them is not', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  const two = [{ name: 'p80', port: 80 }, { name: 'dns', port: 53 }];
  t.services.update(null, svc('svc1', '172.30.0.41', two));
  t.apply();
  assert.equal(t.services.update(svc('svc1', '172.30.0.41', two), svc('svc1', '172.30.0.41', [...two].reverse())), false);
  assert.equal(t.hasPending(), false);
  assert.equal(t.services.update(svc('svc1', '172.30.0.41', two), svc('svc1', '172.30.0.41', [{ name: 'dns', port: 54 }, { name: 'p80', port: 80 }])), true);
  assert.deepEqual(keys(t.apply()), ['ns1/svc1']);
  assert.equal(t.state.services.get('ns1/svc1:dns')?.port, 54);
  assert.deepEqual([...t.services.portKeysOf('ns1/svc1')], ['ns1/svc1:dns', 'ns1/svc1:p80'], 'in spec order');
});

test('a slice whose ports only change order is a no-op; the state keeps every port of it', () => {
  const t = new ProxyStateTracker(4, 'node-a');
  const ports = [{ name: 'p80', port: 80 }, { name: 'dns', port: 53, protocol: 'UDP' as const }];
  const a = makeSlice('ns1', 'svc1', { name: 'a', endpoints: [ep('10.180.0.1')], ports });
  t.endpoints.update(null, a);
  t.apply();
  assert.deepEqual(epKeys(t, 'ns1/svc1:p80'), ['10.180.0.1:80']);
  assert.deepEqual(epKeys(t, 'ns1/svc1:dns'), ['10.180.0.1:53']);
  const reordered = makeSlice('ns1', 'svc1', { name: 'a', endpoints: [ep('10.180.0.1')], ports: [...ports].reverse() });
  assert.equal(t.endpoints.update(a, reordered), false);
  // one port dropped: its list leaves the state, the other stays
  assert.equal(t.endpoints.update(reordered, makeSlice('ns1', 'svc1', { name: 'a', endpoints: [ep('10.180.0.1')], ports: [ports[1]] })), true);
  t.apply();
  assert.equal(t.state.endpoints.has('ns1/svc1:p80'), false);
  assert.deepEqual(epKeys(t, 'ns1/svc1:dns'), ['10.180.0.1:53']);
});
