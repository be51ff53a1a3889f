// The manifests source's allocator (src/sources/service-alloc.ts) against upstream's rules:
// kube-apiserver's flags, ipallocator (network, broadcast and the `kubernetes` address never
// handed out; KEP-3070 bands), portallocator, the Service storage's initIPFamilyFields,
// initNodePorts, allocHealthCheckNodePort and patchAllocatedValues; collisions refused as the
// API server refuses them; stability under add, delete and edit in any order.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { ServiceAllocator, allocatorConfig, applyPatch, parseServiceClusterIPRange, parseServiceNodePortRange, type Outcome } from '../../src/sources/service-alloc.ts';
import type { K8sService } from '../../src/core/api.ts';
import { cidrContains, ipToBigInt } from '../../src/core/ip.ts';

type Spec = Record<string, unknown>;
const svc = (name: string, spec: Spec = {}, ns = 'ns'): K8sService =>
  ({ apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: ns }, spec: { ports: [{ name: 'http', port: 80 }], ...spec } }) as K8sService;

/** Applies a batch; the delivered Services (filled) and the refusals, by "ns/name". */
function apply(a: ServiceAllocator, changes: Array<[string, K8sService | null]>) {
  const byKey = new Map(changes);
  const outs = a.apply(changes);
  return outcomes(outs, (k) => byKey.get(k) ?? undefined);
}

function outcomes(outs: Outcome[], objectOf: (key: string) => K8sService | undefined) {
  const delivered = new Map<string, K8sService>();
  const refused = new Map<string, { field: string; reason: string }>();
  const deleted: string[] = [];
  for (const o of outs) {
    if (o.patch) delivered.set(o.key, applyPatch(objectOf(o.key)!, o.patch));
    else if (o.refusal) refused.set(o.key, o.refusal);
    else deleted.push(o.key);
  }
  return { delivered, refused, deleted };
}

const ipsOf = (s: K8sService | undefined) => s?.spec?.clusterIPs ?? (s?.spec?.clusterIP ? [s.spec.clusterIP] : []);
const one = (a: ServiceAllocator, name: string, spec: Spec = {}) => {
  const r = apply(a, [[`ns/${name}`, svc(name, spec)]]);
  return { svc: r.delivered.get(`ns/${name}`), refusal: r.refused.get(`ns/${name}`) };
};

// ---- the flags --------------------------------------------------------------------------------

test("--service-cluster-ip-range as kube-apiserver reads it: one CIDR or a dual-stack pair, host bits masked, IPv6 /64 or longer", () => {
  assert.deepEqual(parseServiceClusterIPRange('10.0.0.0/24').map((r) => [r.cidr, r.family]), [['10.0.0.0/24', 4]]);
  assert.deepEqual(parseServiceClusterIPRange(' fd00:10::/108 , 10.96.0.5/12').map((r) => [r.cidr, r.family]), [['fd00:10::/108', 6], ['10.96.0.0/12', 4]]);
  assert.deepEqual(parseServiceClusterIPRange('fd00::/64').map((r) => r.cidr), ['fd00::/64']);
  for (const [bad, why] of [
    ['', /at least one valid cidr/],
    ['10.0.0.0/24,10.1.0.0/24', /must be of different IP family/],
    ['10.0.0.0/24,fd00::/108,10.2.0.0/24', /not contain more than two entries/],
    ['fd00::/48', /shortest allowed prefix length for service CIDR is 64, got 48/],
    ['10.0.0.0', /not a valid CIDR/],
    ['10.0.0.0/33', /not a valid CIDR/],
  ] as const) {
    assert.throws(() => parseServiceClusterIPRange(bad), why, bad);
  }
});

test('--service-node-port-range as PortRange.Set: min-max, min+size, one port; errors as upstream', () => {
  assert.deepEqual(parseServiceNodePortRange('30000-32767'), { base: 30000, size: 2768, offset: 86, text: '30000-32767' });
  assert.deepEqual(parseServiceNodePortRange('30000+10'), { base: 30000, size: 11, offset: 0, text: '30000-30010' });
  assert.deepEqual(parseServiceNodePortRange(' 31000 '), { base: 31000, size: 1, offset: 0, text: '31000-31000' });
  assert.equal(parseServiceNodePortRange('20000-29999').offset, 128, 'KEP-3668: min(max(16, size/32), 128)');
  assert.equal(parseServiceNodePortRange('30000-30099').offset, 16);
  for (const [bad, why] of [
    ['32767-30000', /end port cannot be less than start port/],
    ['60000-70000', /cannot be greater than 65535/],
    ['a-b', /unable to parse port range/],
    ['1-2+3', /unable to parse port range/],
  ] as const) {
    assert.throws(() => parseServiceNodePortRange(bad), why, bad);
  }
});

// ---- addresses ----------------------------------------------------------------------------------

test('never the network address, the IPv4 broadcast, nor the first address (the kubernetes Service); a full range refuses with a clear reason', () => {
  const a = new ServiceAllocator(allocatorConfig('10.1.2.0/29'));
  const got: string[] = [];
  for (let i = 0; i < 5; i++) {
    const r = one(a, `s${i}`);
    assert.equal(r.refusal, undefined);
    got.push(...ipsOf(r.svc));
  }
  assert.deepEqual(got.sort(), ['10.1.2.2', '10.1.2.3', '10.1.2.4', '10.1.2.5', '10.1.2.6'], 'all of .2-.6, none of .0 .1 .7');
  const full = one(a, 'sixth');
  assert.equal(full.svc, undefined);
  assert.deepEqual(full.refusal, { field: 'spec.clusterIPs', reason: 'failed to allocate a serviceIP: range is full (10.1.2.0/29)' });
  // the kubernetes Service's address can still be given explicitly
  assert.deepEqual(ipsOf(one(a, 'kubernetes', { clusterIP: '10.1.2.1' }).svc), ['10.1.2.1']);

  // IPv6: no broadcast, so the last address is handed out; not the network, not ::1
  const b = new ServiceAllocator(allocatorConfig('fd00::/125'));
  const v6: string[] = [];
  for (let i = 0; i < 6; i++) v6.push(...ipsOf(one(b, `s${i}`).svc));
  assert.deepEqual(v6.sort(), ['fd00::2', 'fd00::3', 'fd00::4', 'fd00::5', 'fd00::6', 'fd00::7']);
  assert.match(one(b, 'full').refusal!.reason, /range is full/);
});

test('KEP-3070: dynamic addresses come from the upper band first, the lower band (which static choices use) only when it is full', () => {
  // a /27: 32 addresses, the lower band is the first 16 (min(max(16, 32/16), 256))
  const a = new ServiceAllocator(allocatorConfig('10.0.0.0/27'));
  const offset = (s: K8sService | undefined) => Number(ipToBigInt(ipsOf(s)[0]) - ipToBigInt('10.0.0.0'));
  const upper = Array.from({ length: 14 }, (_, i) => offset(one(a, `u${i}`).svc));
  assert.deepEqual([...upper].sort((x, y) => x - y), [17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30]);
  const lower = offset(one(a, 'next').svc);
  assert.ok(lower >= 2 && lower <= 16, `then the lower band, above the kubernetes address: .${lower}`);
});

test('families and policies as initIPFamilyFields: SingleStack by default on the first range, PreferDualStack and RequireDualStack get both when two ranges are configured', () => {
  const single = new ServiceAllocator(allocatorConfig('10.0.0.0/24'));
  const fam = (s: K8sService | undefined) => [s?.spec?.ipFamilies, (s?.spec as { ipFamilyPolicy?: string } | undefined)?.ipFamilyPolicy];
  let r = one(single, 'default');
  assert.deepEqual(fam(r.svc), [['IPv4'], 'SingleStack']);
  assert.ok(cidrContains('10.0.0.0/24', ipsOf(r.svc)[0]));
  assert.equal(r.svc!.spec!.clusterIP, ipsOf(r.svc)[0], 'clusterIP is clusterIPs[0]');
  assert.deepEqual(fam(one(single, 'prefer', { ipFamilyPolicy: 'PreferDualStack' }).svc), [['IPv4'], 'PreferDualStack'], 'PreferDualStack on one range: one address');
  assert.deepEqual(one(single, 'require', { ipFamilyPolicy: 'RequireDualStack' }).refusal?.field, 'spec.ipFamilyPolicy');
  assert.match(one(single, 'require2', { ipFamilyPolicy: 'RequireDualStack' }).refusal!.reason, /not configured for dual-stack/);
  assert.deepEqual(one(single, 'v6', { ipFamilies: ['IPv6'] }).refusal, { field: 'spec.ipFamilies[0]', reason: 'IPv6 not configured on this cluster (see --service-cluster-ip-range)' });
  // every address given: passed as it is, whatever the ranges (kproxy is never stricter than the API server)
  const given = svc('given', { clusterIPs: ['fd00::10', '172.30.0.10'], ipFamilies: ['IPv6', 'IPv4'] });
  const g = apply(single, [['ns/given', given]]);
  assert.equal(g.delivered.get('ns/given'), given, 'the very object, untouched');

  const dual = new ServiceAllocator(allocatorConfig('10.0.0.0/24,fd00:1::/112'));
  assert.deepEqual(fam(one(dual, 'd-default').svc), [['IPv4'], 'SingleStack']);
  r = one(dual, 'd-prefer', { ipFamilyPolicy: 'PreferDualStack' });
  assert.deepEqual(fam(r.svc), [['IPv4', 'IPv6'], 'PreferDualStack']);
  assert.ok(cidrContains('10.0.0.0/24', ipsOf(r.svc)[0]) && cidrContains('fd00:1::/112', ipsOf(r.svc)[1]));
  r = one(dual, 'd-require6', { ipFamilyPolicy: 'RequireDualStack', ipFamilies: ['IPv6'] });
  assert.deepEqual(fam(r.svc), [['IPv6', 'IPv4'], 'RequireDualStack'], 'the family asked for first');
  assert.ok(cidrContains('fd00:1::/112', ipsOf(r.svc)[0]) && cidrContains('10.0.0.0/24', ipsOf(r.svc)[1]));
  assert.deepEqual(fam(one(dual, 'd-single6', { ipFamilies: ['IPv6'] }).svc), [['IPv6'], 'SingleStack']);
  assert.deepEqual(one(dual, 'd-bad', { ipFamilies: ['IPv4', 'IPv6'] }).refusal?.field, 'spec.ipFamilyPolicy', 'SingleStack with two families');
  r = one(dual, 'd-upgrade', { clusterIP: '10.0.0.77', ipFamilyPolicy: 'PreferDualStack' });
  assert.equal(ipsOf(r.svc)[0], '10.0.0.77', 'the given address kept first');
  assert.ok(cidrContains('fd00:1::/112', ipsOf(r.svc)[1]), 'the other family allocated');

  const v6first = new ServiceAllocator(allocatorConfig('fd00:2::/112,10.0.0.0/24'));
  assert.deepEqual(fam(one(v6first, 'x').svc), [['IPv6'], 'SingleStack'], 'the first range is the default family');
});

test('headless and ExternalName Services get no address; a malformed one is passed on for validation to refuse', () => {
  const a = new ServiceAllocator(allocatorConfig());
  for (const spec of [{ clusterIP: 'None' }, { type: 'ExternalName', externalName: 'example.com' }, { clusterIP: 'not-an-ip' }, { ipFamilies: ['IPv5'] }]) {
    const s = svc('x', spec);
    const r = apply(a, [['ns/x', s]]);
    assert.equal(r.delivered.get('ns/x'), s, JSON.stringify(spec));
  }
  assert.deepEqual(a.report().allocated, []);
});

// ---- node ports -------------------------------------------------------------------------------

test('node ports as initNodePorts and allocHealthCheckNodePort: NodePort and LoadBalancer ports, one per port number, health check for eTP Local', () => {
  const a = new ServiceAllocator(allocatorConfig('10.0.0.0/24', '30000-30099'));
  const inRange = (p: unknown) => typeof p === 'number' && p >= 30000 && p <= 30099;
  const dns = one(a, 'dns', { type: 'NodePort', ports: [{ name: 'dns-udp', port: 53, protocol: 'UDP' }, { name: 'dns-tcp', port: 53, protocol: 'TCP' }, { name: 'metrics', port: 9153 }] }).svc!;
  const [u, t, m] = dns.spec!.ports!.map((p) => p.nodePort);
  assert.ok(inRange(u) && inRange(m) && u !== m);
  assert.equal(t, u, 'ports with the same port number share one node port');

  const lb = one(a, 'lb', { type: 'LoadBalancer', externalTrafficPolicy: 'Local', ports: [{ port: 443 }] }).svc!;
  assert.ok(inRange(lb.spec!.ports![0].nodePort));
  assert.ok(inRange(lb.spec!.healthCheckNodePort));
  assert.notEqual(lb.spec!.healthCheckNodePort, lb.spec!.ports![0].nodePort);

  const noAlloc = one(a, 'lb-noalloc', { type: 'LoadBalancer', allocateLoadBalancerNodePorts: false, externalTrafficPolicy: 'Local', ports: [{ name: 'a', port: 1 }, { name: 'b', port: 2, nodePort: 30050 }] }).svc!;
  assert.deepEqual(noAlloc.spec!.ports!.map((p) => p.nodePort), [undefined, 30050], 'allocateLoadBalancerNodePorts false: given ports respected, none allocated');
  assert.ok(inRange(noAlloc.spec!.healthCheckNodePort), 'the health check node port is still allocated');

  const cluster = one(a, 'cip', { type: 'ClusterIP', externalTrafficPolicy: 'Local', ports: [{ port: 80 }] }).svc!;
  assert.equal(cluster.spec!.ports![0].nodePort, undefined);
  assert.equal(cluster.spec!.healthCheckNodePort, undefined);

  const held = new Set([u, m, lb.spec!.ports![0].nodePort, lb.spec!.healthCheckNodePort, 30050]);
  assert.equal(held.size, 5, 'no port handed out twice');
  assert.deepEqual(a.report().allocated.find((x) => x.service === 'ns/lb-noalloc'), { service: 'ns/lb-noalloc', healthCheckNodePort: noAlloc.spec!.healthCheckNodePort, clusterIPs: ipsOf(noAlloc) });
});

test('a given address or port that another Service holds is refused as the API server refuses it, naming the field; freed, the Service gets in', () => {
  const a = new ServiceAllocator(allocatorConfig('10.0.0.0/24', '30000-30099'));
  one(a, 'owner', { clusterIP: '10.0.0.50', type: 'LoadBalancer', externalTrafficPolicy: 'Local', healthCheckNodePort: 30010, ports: [{ port: 80, nodePort: 30001 }] });
  const ip = one(a, 'ip', { clusterIP: '10.0.0.50' });
  assert.deepEqual(ip.refusal, { field: 'spec.clusterIPs', reason: 'failed to allocate IP 10.0.0.50: provided IP is already allocated (held by Service ns/owner)' });
  const port = one(a, 'port', { type: 'NodePort', ports: [{ name: 'a', port: 1 }, { name: 'b', port: 2, nodePort: 30001 }] });
  assert.deepEqual(port.refusal, { field: 'spec.ports[1].nodePort', reason: 'provided port is already allocated (held by Service ns/owner)' });
  const hc = one(a, 'hc', { type: 'NodePort', ports: [{ port: 1, nodePort: 30010 }] });
  assert.equal(hc.refusal?.field, 'spec.ports[0].nodePort', 'a node port and a health check node port share one pool');
  const hc2 = one(a, 'hc2', { type: 'LoadBalancer', externalTrafficPolicy: 'Local', healthCheckNodePort: 30001, ports: [{ port: 1 }] });
  assert.deepEqual(hc2.refusal, { field: 'spec.healthCheckNodePort', reason: 'failed to allocate requested HealthCheck NodePort 30001: provided port is already allocated (held by Service ns/owner)' });
  assert.deepEqual(a.report().refused.map((r) => r.service), ['ns/hc', 'ns/hc2', 'ns/ip', 'ns/port']);
  // what a refused Service claimed before its refusal is free again
  assert.equal(one(a, 'free', { type: 'NodePort', ports: [{ port: 1, nodePort: 30002 }] }).refusal, undefined);

  // the owner goes: the refused Services are tried again in the same batch, and get in
  const objects = new Map([['ns/ip', svc('ip', { clusterIP: '10.0.0.50' })]]);
  const b = new ServiceAllocator(allocatorConfig('10.0.0.0/24'), undefined, (k) => objects.get(k));
  one(b, 'owner', { clusterIP: '10.0.0.50' });
  assert.ok(apply(b, [['ns/ip', objects.get('ns/ip')!]]).refused.has('ns/ip'));
  const r = outcomes(b.apply([['ns/owner', null]]), (k) => objects.get(k));
  assert.deepEqual(r.deleted, ['ns/owner']);
  assert.equal(r.delivered.get('ns/ip'), objects.get('ns/ip'), 'delivered as it is (its address was given)');
  assert.deepEqual(b.report().refused, []);
});

test('a full node port range refuses the Service with a clear reason, and a freed port lets it in', () => {
  const objects = new Map<string, K8sService>();
  const a = new ServiceAllocator(allocatorConfig('10.0.0.0/24', '30000-30001'), undefined, (k) => objects.get(k));
  const np = (name: string) => {
    const s = svc(name, { type: 'NodePort' });
    objects.set(`ns/${name}`, s);
    return apply(a, [[`ns/${name}`, s]]);
  };
  np('a');
  np('b');
  const c = np('c');
  assert.deepEqual(c.refused.get('ns/c'), { field: 'spec.ports[0].nodePort', reason: 'failed to allocate a nodePort: range is full (30000-30001)' });
  const freed = outcomes(a.apply([['ns/a', null]]), (k) => objects.get(k));
  assert.ok([30000, 30001].includes(freed.delivered.get('ns/c')!.spec!.ports![0].nodePort!));
});

// ---- stability and determinism ----------------------------------------------------------------

test('a held value stays with its Service: across edits of it and of others, type changes release and take node ports, the state file keeps them across restarts', () => {
  const a = new ServiceAllocator(allocatorConfig('10.0.0.0/24', '30000-32767'));
  const web = one(a, 'web', { type: 'NodePort' }).svc!;
  const ip = ipsOf(web)[0];
  const port = web.spec!.ports![0].nodePort;
  for (let i = 0; i < 20; i++) one(a, `other${i}`);
  // an edit of web: another port, a label; the name-matched node port and the address stay
  const edited = one(a, 'web', { type: 'NodePort', ports: [{ name: 'http', port: 8080 }, { name: 'admin', port: 9000 }] }).svc!;
  assert.equal(ipsOf(edited)[0], ip);
  assert.equal(edited.spec!.ports![0].nodePort, port, 'patchAllocatedValues: node ports matched by port name');
  // NodePort -> ClusterIP releases the node ports (another Service may take them); the address stays
  const asCluster = one(a, 'web', { type: 'ClusterIP' }).svc!;
  assert.equal(ipsOf(asCluster)[0], ip);
  assert.equal(asCluster.spec!.ports![0].nodePort, undefined);
  assert.equal(a.snapshot().services['ns/web'].nodePorts, undefined);
  // others deleted: web keeps its address
  apply(a, Array.from({ length: 20 }, (_, i): [string, null] => [`ns/other${i}`, null]));
  assert.equal(ipsOf(one(a, 'web', { type: 'ClusterIP' }).svc)[0], ip);

  // restart: the persisted holder keeps its address, a newcomer asking for it is refused
  const state = JSON.parse(JSON.stringify(a.snapshot()));
  const restarted = new ServiceAllocator(allocatorConfig('10.0.0.0/24', '30000-32767'), state);
  const batch = apply(restarted, [['ns/web', svc('web', { type: 'ClusterIP' })], ['ns/aaa-squatter', svc('aaa-squatter', { clusterIP: ip })]]);
  assert.deepEqual(ipsOf(batch.delivered.get('ns/web')), [ip]);
  assert.match(batch.refused.get('ns/aaa-squatter')!.reason, /provided IP is already allocated \(held by Service ns\/web\)/);
  // without the state, a given address comes before a dynamic one: the squatter gets it
  const fresh = apply(new ServiceAllocator(allocatorConfig('10.0.0.0/24', '30000-32767')), [['ns/web', svc('web')], ['ns/aaa-squatter', svc('aaa-squatter', { clusterIP: ip })]]);
  assert.deepEqual(ipsOf(fresh.delivered.get('ns/aaa-squatter')), [ip]);
  assert.notDeepEqual(ipsOf(fresh.delivered.get('ns/web')), [ip]);
});

test('forgetAbsent releases the state file holdings of Services no longer there, and keeps the others', () => {
  const a = new ServiceAllocator(allocatorConfig('10.0.0.0/24'));
  const ipA = ipsOf(one(a, 'a').svc)[0];
  const ipB = ipsOf(one(a, 'b').svc)[0];
  const b = new ServiceAllocator(allocatorConfig('10.0.0.0/24'), a.snapshot());
  assert.equal(b.hasDormant, true);
  // before forgetAbsent, b's address is still held: a newcomer cannot have it
  assert.ok(one(b, 'c', { clusterIP: ipB }).refusal);
  const objects = new Map([['ns/c', svc('c', { clusterIP: ipB })]]);
  const c = new ServiceAllocator(allocatorConfig('10.0.0.0/24'), a.snapshot(), (k) => objects.get(k));
  assert.ok(apply(c, [['ns/c', objects.get('ns/c')!]]).refused.has('ns/c'));
  const admitted = outcomes(c.forgetAbsent(new Set(['ns/a', 'ns/c'])), (k) => objects.get(k));
  assert.deepEqual([...admitted.delivered.keys()], ['ns/c'], 'b was deleted while kproxy was down: its address is free');
  assert.equal(c.hasDormant, false);
  assert.deepEqual(ipsOf(one(c, 'a').svc), [ipA], 'a keeps its address');
});

test('a hand-edited state file holding a value twice: the first Service by name keeps it; junk is dropped', () => {
  const a = new ServiceAllocator(allocatorConfig('10.0.0.0/24'), {
    services: {
      'ns/b': { clusterIPs: ['10.0.0.9'] },
      'ns/a': { clusterIPs: ['10.0.0.9', 'junk'], nodePorts: { x: 99999 as number } },
      junk: { clusterIPs: ['10.0.0.10'] },
    },
  });
  assert.deepEqual(a.snapshot().services, { 'ns/a': { clusterIPs: ['10.0.0.9'] } });
});

test('the same directory allocates the same way whatever the order it is seen in (one batch)', () => {
  const names = Array.from({ length: 60 }, (_, i) => `svc-${i}`);
  const specs = names.map((n, i) => svc(n, i % 3 === 0 ? { type: 'NodePort' } : i % 7 === 0 ? { clusterIP: `10.0.0.${i + 1}` } : {}));
  const result = (order: number[]) => {
    const a = new ServiceAllocator(allocatorConfig('10.0.0.0/25', '30000-30063'));
    const r = apply(a, order.map((i): [string, K8sService] => [`ns/${names[i]}`, specs[i]]));
    return JSON.stringify([...r.delivered].sort(([x], [y]) => (x < y ? -1 : 1)).map(([k, s]) => [k, s.spec]));
  };
  const base = result(names.map((_, i) => i));
  fc.assert(fc.property(fc.shuffledSubarray(names.map((_, i) => i), { minLength: names.length }), (order) => result(order) === base), { numRuns: 30 });
});

test('property: under any sequence of adds, edits and deletes, values are unique, within range, never reserved, and stay with their Service', () => {
  const names = ['a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n', 'o', 'p', 'q'];
  const op = fc.oneof(
    fc.record({ t: fc.constant('put' as const), name: fc.constantFrom(...names), type: fc.constantFrom('ClusterIP', 'NodePort', 'LoadBalancer'), port: fc.integer({ min: 1, max: 3 }), ip: fc.option(fc.integer({ min: 0, max: 15 }), { nil: undefined }), local: fc.boolean() }),
    fc.record({ t: fc.constant('del' as const), name: fc.constantFrom(...names) }),
  );
  fc.assert(
    fc.property(fc.array(fc.array(op, { minLength: 1, maxLength: 3 }), { minLength: 1, maxLength: 40 }), (batches) => {
      // a /28 has 13 addresses to hand out (.2-.14); node ports 30000-30015
      const objects = new Map<string, K8sService>();
      const a = new ServiceAllocator(allocatorConfig('10.9.0.0/28', '30000-30015'), undefined, (k) => objects.get(k));
      const live = new Map<string, K8sService>();
      for (const batch of batches) {
        const changes: Array<[string, K8sService | null]> = [];
        for (const o of batch) {
          const key = `ns/${o.name}`;
          if (o.t === 'del') {
            objects.delete(key);
            changes.push([key, null]);
            continue;
          }
          const s = svc(o.name, {
            type: o.type,
            ports: [{ name: 'p', port: o.port }],
            ...(o.ip !== undefined ? { clusterIP: `10.9.0.${o.ip}` } : {}),
            ...(o.local ? { externalTrafficPolicy: 'Local' } : {}),
          });
          objects.set(key, s);
          changes.push([key, s]);
        }
        const before = new Map(live);
        const touched = new Set(changes.map(([k]) => k));
        const r = outcomes(a.apply(changes), (k) => objects.get(k));
        for (const k of [...r.deleted, ...r.refused.keys()]) live.delete(k);
        for (const [k, s] of r.delivered) live.set(k, s);
        // stability: a Service not in the batch keeps what it had
        for (const [k, s] of before) if (!touched.has(k) && live.has(k)) assert.deepEqual(live.get(k), s, `${k} moved`);
        // uniqueness and ranges
        const ips = new Map<string, string>();
        const ports = new Map<number, string>();
        for (const [k, s] of live) {
          for (const ip of s.spec!.clusterIPs ?? (s.spec!.clusterIP ? [s.spec!.clusterIP] : [])) {
            assert.ok(!ips.has(ip) || ips.get(ip) === k, `${ip} held by ${ips.get(ip)} and ${k}`);
            ips.set(ip, k);
            if (objects.get(k)!.spec!.clusterIP === undefined) {
              assert.ok(cidrContains('10.9.0.0/28', ip) && !['10.9.0.0', '10.9.0.1', '10.9.0.15'].includes(ip), `${k}: allocated ${ip}`);
            }
          }
          const own = new Set<number>();
          for (const p of [...(s.spec!.ports ?? []).map((x) => x.nodePort), s.spec!.healthCheckNodePort]) {
            if (p === undefined) continue;
            assert.ok(p >= 30000 && p <= 30015, `${k}: node port ${p}`);
            assert.ok(!ports.has(p) || ports.get(p) === k || own.has(p), `${p} held by ${ports.get(p)} and ${k}`);
            ports.set(p, k);
            own.add(p);
          }
        }
        // a Service refused for a full range is refused only while the range is full
        for (const [k, why] of [...a.report().refused].map((x): [string, string] => [x.service, x.reason])) {
          if (/serviceIP: range is full/.test(why)) assert.ok([...ips.keys()].filter((ip) => cidrContains('10.9.0.0/28', ip) && !['10.9.0.0', '10.9.0.1', '10.9.0.15'].includes(ip)).length === 13, `${k} refused with addresses free`);
        }
      }
    }),
    { numRuns: 200 },
  );
});
