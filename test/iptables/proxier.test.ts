// The iptables proxier (src/modes/iptables/proxier.ts) against a fake kernel that rejects what
// the kernel rejects: jumps, partial syncs, failures, a flushed iptables, route_localnet.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IptablesProxier, JUMP_RULES } from '../../src/modes/iptables/proxier.ts';
import { silentLogger } from '../../src/log.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import { planInput, slice, svc, testConfig, twoServices as world } from './helpers.ts';

test('proxier: full sync installs jumps idempotently, partial sync deletes stale chains, failure forces a full sync', async () => {
  const k = new FakeIptables();
  const config = testConfig();
  const p = new IptablesProxier({ runner: k, log: silentLogger(), config });
  const t = world();
  const first = await p.sync(planInput(t, config), t.apply(), false);
  assert.equal(first.rulesWritten, first.rulesTotal);
  for (const j of JUMP_RULES) assert.ok(k.rules(j.table, j.src).some((r) => r.endsWith(`-j ${j.dst}`)), `${j.src} -> ${j.dst}`);
  assert.equal(k.rules('nat', 'PREROUTING').length, 1);
  assert.ok(k.chains('mangle').includes('KUBE-PROXY-CANARY'));

  // A second full sync does not duplicate the jump rules.
  await p.sync(planInput(t, config), new Set(), true);
  assert.equal(k.rules('nat', 'PREROUTING').length, 1);

  // Delete svc2: its chains go away with a partial sync (no iptables-save needed).
  t.services.update(svc('ns2', 'svc2', { clusterIP: '172.30.0.42' }), null);
  t.endpoints.update(slice('ns2', 'svc2', 's2', [], [{ port: 80 }]), null);
  const saves = k.calls.filter((c) => c.cmd === 'iptables-save').length;
  const partial = await p.sync(planInput(t, config), t.apply(), false);
  assert.equal(k.calls.filter((c) => c.cmd === 'iptables-save').length, saves, 'partial syncs do not run iptables-save');
  assert.ok(partial.rulesWritten < partial.rulesTotal, 'unchanged svc1 chains are not rewritten');
  const svcChains = k.chains('nat').filter((c) => /^KUBE-(SVC|SEP)-/.test(c));
  assert.equal(svcChains.length, 2, `only svc1's chains remain: ${svcChains}`);
  assert.match(p.dump(), /ns1\/svc1:p80/);
  assert.doesNotMatch(p.dump(), /ns2\/svc2/);

  // A failing restore leaves the rules and makes the next sync full.
  t.services.update(null, svc('ns3', 'svc3', { clusterIP: '172.30.0.43' }));
  t.endpoints.update(null, slice('ns3', 'svc3', 's3', [{ ip: '10.0.3.1' }], [{ port: 80 }]));
  k.failNextRestoreAtLine = 3;
  const before = k.save();
  await assert.rejects(p.sync(planInput(t, config), t.apply(), false), /KPROXY_IPTABLES_RESTORE_FAILED.*line 3/s);
  assert.equal(k.save(), before);
  const retry = await p.sync(planInput(t, config), new Set(), false);
  assert.match(retry.diff ?? '', /^full sync/);
  assert.ok(k.chains('nat').some((c) => c.startsWith('KUBE-SVC-')) && k.save().includes('ns3/svc3:p80'));
});

test('proxier: a flushed iptables (canary gone) is noticed and repaired with a full sync', async () => {
  const k = new FakeIptables();
  const config = testConfig({ syncPeriodMs: 1000 });
  let now = 0;
  const p = new IptablesProxier({ runner: k, log: silentLogger(), config, now: () => now });
  const t = world();
  await p.sync(planInput(t, config), t.apply(), false);
  k.flushAll();
  now += 5000;
  const r = await p.sync(planInput(t, config), new Set(), false);
  assert.match(r.diff ?? '', /^full sync/);
  assert.equal(k.rules('nat', 'PREROUTING').length, 1);
  assert.ok(k.chains('nat').some((c) => c.startsWith('KUBE-SEP-')));
});

test('proxier: route_localnet=1 is set through the sysctl interface when, and only when, localhost NodePorts are in use', async () => {
  const sets: string[] = [];
  const values = new Map<string, string>([['net.ipv4.conf.all.route_localnet', '0']]);
  const sysctl = {
    async get(name: string) {
      return values.get(name) ?? null;
    },
    async set(name: string, value: string) {
      sets.push(`${name}=${value}`);
      values.set(name, value);
    },
  };
  const k = new FakeIptables();
  const config = testConfig();
  const p = new IptablesProxier({ runner: k, log: silentLogger(), config, sysctl });
  const t = world();
  await p.sync(planInput(t, config), t.apply(), true);
  assert.deepEqual(sets, [], 'ClusterIP services only: no localhost NodePort in use');
  t.services.update(null, svc('ns3', 'np', { type: 'NodePort', clusterIP: '172.30.0.43', port: 80, nodePort: 30043 }));
  await p.sync(planInput(t, config), t.apply(), false);
  assert.deepEqual(sets, ['net.ipv4.conf.all.route_localnet=1']);
  await p.sync(planInput(t, config), new Set(), true);
  assert.equal(sets.length, 1, 'set only when it differs');

  const off = testConfig({ localhostNodePorts: false });
  const sets2 = sets.length;
  values.set('net.ipv4.conf.all.route_localnet', '0');
  const p2 = new IptablesProxier({ runner: new FakeIptables(), log: silentLogger(), config: off, sysctl });
  await p2.sync(planInput(t, off), new Set(), true);
  assert.equal(sets.length, sets2, 'localhostNodePorts: false never sets it');
});
