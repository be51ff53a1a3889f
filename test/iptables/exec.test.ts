// The executor and the proxier against a fake kernel that rejects what the kernel rejects.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IptablesExecutor, RestoreError, extractLines } from '../../src/kernel/iptables/exec.ts';
import { chainsFromSave } from '../../src/kernel/iptables/save.ts';
import { splitRuleArgs } from '../../src/kernel/iptables/tokenize.ts';
import { IptablesProxier, JUMP_RULES } from '../../src/modes/iptables/proxier.ts';
import { cleanup, mode } from '../../src/modes/iptables/index.ts';
import { silentLogger } from '../../src/log.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';

test('a restore that jumps to a missing chain fails atomically, naming the line with context', async () => {
  const k = new FakeIptables();
  const exec = new IptablesExecutor(k, 4);
  await exec.restore('*nat\n:KUBE-A - [0:0]\n-A KUBE-A -j RETURN\nCOMMIT\n');
  const bad = '*nat\n:KUBE-A - [0:0]\n:KUBE-B - [0:0]\n-A KUBE-A -j KUBE-MISSING\n-A KUBE-B -j RETURN\nCOMMIT\n';
  await assert.rejects(exec.restore(bad), (e: unknown) => {
    assert.ok(e instanceof RestoreError);
    assert.equal(e.line, 4);
    assert.match(e.message, /^KPROXY_IPTABLES_RESTORE_FAILED: /);
    assert.match(e.message, />     4: -A KUBE-A -j KUBE-MISSING/);
    assert.match(e.message, /      3: :KUBE-B - \[0:0\]/, 'lines before');
    assert.match(e.message, /      5: -A KUBE-B -j RETURN/, 'lines after');
    return true;
  });
  assert.deepEqual(k.rules('nat', 'KUBE-A'), ['-j RETURN'], 'the old rules stay');
  assert.ok(!k.chains('nat').includes('KUBE-B'), 'nothing of the failed payload is applied');
  assert.deepEqual(k.calls.at(-1)!.args, ['-w', '5', '--noflush', '--counters']);
});

test('helpers: context lines, chain names from iptables-save, quoted rule arguments', () => {
  assert.equal(extractLines('a\nb\nc\nd', 2, 1), '      1: a\n>     2: b\n      3: c');
  const save = '*filter\n:INPUT ACCEPT [0:0]\n:KUBE-X - [0:0]\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-A - [0:0]\nCOMMIT\n';
  assert.deepEqual([...chainsFromSave(save, 'nat')], ['PREROUTING', 'KUBE-SVC-A']);
  assert.deepEqual(splitRuleArgs('-m comment --comment "a b" -j X'), ['-m', 'comment', '--comment', 'a b', '-j', 'X']);
});

function world() {
  const t = tracker();
  t.services.update(null, svc('ns1', 'svc1', { clusterIP: '172.30.0.41' }));
  t.endpoints.update(null, slice('ns1', 'svc1', 's1', [{ ip: '10.0.1.1' }], [{ port: 80 }]));
  t.services.update(null, svc('ns2', 'svc2', { clusterIP: '172.30.0.42' }));
  t.endpoints.update(null, slice('ns2', 'svc2', 's2', [{ ip: '10.0.2.1' }, { ip: '10.0.2.2' }], [{ port: 80 }]));
  return t;
}

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

test('cleanup removes every chain of kube-proxy\'s and the jumps into them, and is idempotent', async () => {
  const k = new FakeIptables();
  const config = testConfig();
  const p = new IptablesProxier({ runner: k, log: silentLogger(), config });
  const t = world();
  await p.sync(planInput(t, config), t.apply(), true);
  await k.run('iptables', ['-t', 'nat', '-N', 'OTHER']);
  await k.run('iptables', ['-t', 'nat', '-N', 'KUBE-KUBELET-CANARY']);
  await cleanup(k, silentLogger());
  // KUBE-FIREWALL is the kubelet's chain, which the iptables mode only duplicates: it stays, as upstream
  const kept = (c: string) => c === 'KUBE-FIREWALL' || c === 'KUBE-KUBELET-CANARY';
  for (const table of ['nat', 'filter', 'mangle']) {
    assert.deepEqual(k.chains(table).filter((c) => c.startsWith('KUBE-') && !kept(c)), [], table);
    for (const c of k.chains(table)) assert.ok(!k.rules(table, c).some((r) => /KUBE-/.test(r.replace(/KUBE-FIREWALL/g, ''))), `${table} ${c}`);
  }
  assert.ok(k.chains('nat').includes('OTHER'), 'other chains are left alone');
  assert.ok(k.chains('nat').includes('KUBE-KUBELET-CANARY'), 'another program\'s KUBE- chain too');
  await cleanup(k, silentLogger());
});

test('createProxier reports a missing iptables-restore with KPROXY_EXEC_MISSING', async () => {
  const { ExecError } = await import('../../src/kernel/runner.ts');
  const missing = { run: async (cmd: string) => { if (cmd.includes('restore')) throw new ExecError('KPROXY_EXEC_MISSING', `${cmd} not found`); return { code: 0, stdout: '', stderr: '' }; } };
  await assert.rejects(mode.createProxier({ runner: missing, log: silentLogger(), config: testConfig() }), /KPROXY_EXEC_MISSING: iptables-restore not found; install the iptables package/);
});

test('render is the full restore payload; planned trace goes through it', async () => {
  const t = world();
  t.apply();
  const input = planInput(t);
  const text = mode.render(input);
  assert.match(text, /^\*filter\n/);
  assert.match(text, /-A KUBE-SERVICES -m comment --comment "ns2\/svc2:p80 cluster IP"/);
  const r = await mode.trace!({ from: '10.0.9.9', to: '172.30.0.42', port: 80, protocol: 'TCP', input, live: false }, { runner: new FakeIptables() });
  assert.equal(r.output, '10.0.2.1:80, 10.0.2.2:80');
  assert.equal(r.masq, false);
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
