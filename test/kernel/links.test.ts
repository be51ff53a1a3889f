// The host's addresses as the controller probes them once (src/kernel/links.ts hostAddresses),
// read from a network namespace the test builds: loopback and a veth's addresses in, the
// addresses of the devices left out (kube-ipvs0's Service VIPs) out.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, type CommandRunner } from '../../src/kernel/runner.ts';
import { Links } from '../../src/kernel/links.ts';
import { Netns, sh, uniqueName } from '../support/netns.ts';

test('hostAddresses: every address of the namespace, loopback included, without the excluded devices', async (t) => {
  const ns = Netns.create(uniqueName('kp-links'));
  t.after(() => ns.destroy());
  const runner: CommandRunner = { run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', ns.name, cmd, ...args], opts) };
  // a veth pair inside the namespace: one end a node interface, the other named kube-ipvs0
  sh('ip', ['netns', 'exec', ns.name, 'ip', 'link', 'add', 'kp-node0', 'type', 'veth', 'peer', 'name', 'kube-ipvs0']);
  ns.exec('ip', ['addr', 'add', '10.77.0.2/24', 'dev', 'kp-node0']);
  ns.exec('ip', ['addr', 'add', 'fd00:77::2/64', 'dev', 'kp-node0', 'nodad']);
  ns.exec('ip', ['addr', 'add', '172.30.77.1/32', 'dev', 'kube-ipvs0']);

  const all = await new Links(runner).hostAddresses();
  assert.ok(all, 'ip runs in the namespace');
  for (const ip of ['127.0.0.1', '::1', '10.77.0.2', 'fd00:77::2', '172.30.77.1']) assert.ok(all.includes(ip), `${ip} in ${all.join(', ')}`);

  const nodeOnly = await new Links(runner).hostAddresses(['kube-ipvs0']);
  assert.ok(nodeOnly && !nodeOnly.includes('172.30.77.1'), 'kube-ipvs0 left out');
  assert.ok(nodeOnly.includes('10.77.0.2') && nodeOnly.includes('127.0.0.1'));
});

test('hostAddresses: null when ip cannot run, so the node view falls back to the node IPs and loopback', async () => {
  const failing: CommandRunner = { run: async () => ({ code: 1, stdout: '', stderr: 'Cannot open netlink socket' }) };
  assert.equal(await new Links(failing).hostAddresses(), null);
  const missing: CommandRunner = { run: async () => { throw new Error('spawn ip ENOENT'); } };
  assert.equal(await new Links(missing).hostAddresses(), null);
});
