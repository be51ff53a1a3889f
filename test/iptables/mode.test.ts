// The iptables mode module (src/modes/iptables/index.ts): cleanup, a missing
// iptables-restore, the dry-run render and the planned trace.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { cleanup, mode } from '../../src/modes/iptables/index.ts';
import { silentLogger } from '../../src/log.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import { planInput, testConfig, twoServices as world } from './helpers.ts';

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
