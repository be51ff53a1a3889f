// Which other modes' leftovers the controller removes at start, as
// upstream's server does on a mode switch (cmd/kube-proxy/app/server_linux.go platformCleanup):
// the nftables mode removes the iptables and ipvs modes' state, the iptables and ipvs modes the
// nftables mode's; the iptables and ipvs modes share chain names, so each removes the other's
// only when that mode's own traces are there (kube-ipvs0; KUBE-SVC-/KUBE-SEP- chains). No
// kernel: fake modes that record their cleanup, a fake runner for the traces.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import pino from 'pino';
import { resolveConfig, type ModeName } from '../../src/config/config.ts';
import { ProxyController } from '../../src/sync/controller.ts';
import type { ModeModule, Proxier } from '../../src/modes/types.ts';
import type { Source } from '../../src/sources/types.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';

const NAMES: ModeName[] = ['userspace', 'iptables', 'ipvs', 'nftables'];

async function cleanedAtStart(mode: ModeName, traces: { kubeIpvs0: boolean; serviceChains: boolean }): Promise<string[]> {
  const cleaned: string[] = [];
  const proxier = { sync: async () => ({ rulesWritten: 0, rulesTotal: 0 }), dump: () => '', stop: async () => {} } as unknown as Proxier;
  const allModes = Object.fromEntries(NAMES.map((name) => [name, {
    name, render: () => '', createProxier: async () => proxier, cleanup: async () => void cleaned.push(name),
  } as unknown as ModeModule])) as Record<ModeName, ModeModule>;
  const nat = `*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n${traces.serviceChains ? ':KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n' : ''}COMMIT\n`;
  const runner: CommandRunner = {
    async run(cmd, args) {
      if (cmd === 'ip' && args.includes('kube-ipvs0')) return { code: traces.kubeIpvs0 ? 0 : 1, stdout: '', stderr: '' };
      if (cmd === 'iptables-save') return { code: 0, stdout: nat, stderr: '' };
      return { code: 0, stdout: '', stderr: '' };
    },
  };
  const source: Source = { start: async () => {}, stop: async () => {}, health: () => ({ synced: false, connected: true, lastContactMs: Date.now() }) };
  const ctrl = new ProxyController({
    config: resolveConfig({ mode }), nodeName: 'node-a', mode: allModes[mode], allModes, source, runner, log: pino({ level: 'silent' }),
    nodeIPs: () => ['192.168.0.2'], families: [4],
  });
  await ctrl.start();
  await ctrl.stop();
  return cleaned.sort();
}

test('nftables start removes the iptables and ipvs modes\' state (and the userspace redirects), whatever is there', async () => {
  assert.deepEqual(await cleanedAtStart('nftables', { kubeIpvs0: false, serviceChains: false }), ['iptables', 'ipvs', 'userspace']);
});

test('iptables start removes the nftables table, and the ipvs mode\'s state only when kube-ipvs0 exists', async () => {
  assert.deepEqual(await cleanedAtStart('iptables', { kubeIpvs0: false, serviceChains: true }), ['nftables', 'userspace']);
  assert.deepEqual(await cleanedAtStart('iptables', { kubeIpvs0: true, serviceChains: true }), ['ipvs', 'nftables', 'userspace']);
});

test('ipvs start removes the nftables table, and the iptables mode\'s chains only when KUBE-SVC-/KUBE-SEP- chains exist', async () => {
  assert.deepEqual(await cleanedAtStart('ipvs', { kubeIpvs0: true, serviceChains: false }), ['nftables', 'userspace']);
  assert.deepEqual(await cleanedAtStart('ipvs', { kubeIpvs0: true, serviceChains: true }), ['iptables', 'nftables', 'userspace']);
});
