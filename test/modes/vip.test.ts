// Defence in depth: whatever validation let through, no planner turns a
// loopback, unspecified, link-local, multicast or broadcast address into a Service VIP
// (nftables and iptables have their own tests in test/nftables and test/iptables/isolation).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { plan as planIpvs } from '../../src/modes/ipvs/planner.ts';
import { planUserspace } from '../../src/modes/userspace/plan.ts';
import { safeServicePort, unsafeVIPReason } from '../../src/core/vip.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { endpoint, port, stateOf } from '../support/ports.ts';

const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };

test('unsafeVIPReason names special addresses and accepts ordinary ones', () => {
  for (const [ip, why] of [
    ['127.0.0.1', 'loopback address'],
    ['::1', 'loopback address'],
    ['0.0.0.0', 'unspecified ("this network") address'],
    ['::', 'unspecified address'],
    ['224.0.0.251', 'multicast address'],
    ['ff02::1', 'multicast address'],
    ['255.255.255.255', 'broadcast address'],
    ['169.254.169.254', 'link-local address'],
    ['fe80::1', 'link-local address'],
    ['nonsense', 'not an IP address'],
  ]) assert.equal(unsafeVIPReason(ip), why, ip);
  for (const ip of ['172.30.0.1', '1.2.3.4', '10.0.0.1', 'fd00::1', '2001:db8::1']) assert.equal(unsafeVIPReason(ip), null, ip);
});

test('safeServicePort returns the same object when nothing is dropped', () => {
  const sp = port('ns', 'ok', 'http', { externalIPs: ['1.2.3.4'] });
  assert.equal(safeServicePort(sp).sp, sp);
  assert.deepEqual(safeServicePort(sp).skipped, []);
  assert.equal(safeServicePort(sp).sp, sp, 'asked again (cached)');
  assert.ok(Object.isFrozen(safeServicePort(sp).skipped), 'nothing skipped: one shared frozen list');
  const bad = port('ns', 'bad', 'http', { externalIPs: ['0.0.0.0', '1.2.3.4'] });
  const first = safeServicePort(bad);
  assert.equal(safeServicePort(bad), first, 'a port with skipped VIPs: its cached object');
  assert.deepEqual(first.sp.externalIPs, ['1.2.3.4']);
  assert.deepEqual(first.skipped.map((s) => s.ip), ['0.0.0.0']);
});

const hostile = () =>
  stateOf([
    [port('ns', 'lo', 'http', { clusterIP: '127.0.0.1', externalIPs: ['0.0.0.0', '224.0.0.1', '1.2.3.4'], loadBalancerVIPs: ['255.255.255.255'] }), [endpoint('10.180.0.1')]],
  ]);

test('ipvs: no virtual server and no kube-ipvs0 address for a special VIP', () => {
  const config = resolveConfig({}, { mode: 'ipvs' });
  const input: PlanInput = { state: hostile(), config, node: NODE };
  const p = planIpvs(input);
  const text = JSON.stringify([...p.table.values()]) + JSON.stringify(p.boundAddresses) + JSON.stringify(p.sets);
  for (const bad of ['127.0.0.1', '0.0.0.0', '224.0.0.1', '255.255.255.255']) assert.ok(!text.includes(`"${bad}`) && !text.includes(`${bad},`), bad);
});

test('userspace: no listener or redirect on a special VIP, and a note says why (a loopback VIP is bound: the demo)', () => {
  const config = resolveConfig({}, { mode: 'userspace' });
  const input: PlanInput = { state: hostile(), config, node: NODE };
  const p = planUserspace(input, { redirect: true });
  // (a proxy listener binds 0.0.0.0 itself; what matters is what it serves and what is redirected)
  const frontends = p.listeners.flatMap((l) => l.frontends.map((f) => f.ip)).sort();
  const redirected = p.redirects.map((r) => r.dst);
  assert.deepEqual(frontends, ['1.2.3.4', '127.0.0.1']);
  assert.deepEqual(redirected, ['1.2.3.4/32']);
  assert.deepEqual(p.listeners.filter((l) => l.kind === 'vip').map((l) => l.host), ['127.0.0.1'], 'the loopback VIP is bound, not redirected');
  assert.ok(p.notes.some((n) => /ns\/lo:http externalIPs 0\.0\.0\.0: unspecified/.test(n)), p.notes.join('\n'));
  assert.ok(p.notes.some((n) => /loadBalancerVIPs 255\.255\.255\.255: broadcast/.test(n)), p.notes.join('\n'));
});

test('a planned trace to a left-out VIP says why (iptables and nftables)', async () => {
  const { mode: ipt } = await import('../../src/modes/iptables/index.ts');
  const { mode: nft } = await import('../../src/modes/nftables/index.ts');
  for (const m of [ipt, nft]) {
    const config = resolveConfig({}, { mode: m.name });
    const req = { from: '10.0.0.5', to: '127.0.0.1', port: 80, protocol: 'TCP' as const, live: false, input: { state: hostile(), config, node: NODE } };
    const r = await m.trace!(req, { runner: { run: async () => ({ code: 1, stdout: '', stderr: 'no host access in this test' }) } });
    assert.equal(r.output, '', m.name);
    assert.ok(r.notes?.some((n) => n.startsWith('ns/lo:http clusterIP 127.0.0.1: loopback address; never used as a Service VIP (the API server accepts it')), `${m.name}: ${r.notes}`);
  }
});
