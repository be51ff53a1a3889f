// Real kernel, both families: a full sync whose iptables-restore / nft -f input spans many of
// hostRunner's stdin slices (writeInput, INPUT_CHUNK) leaves the kernel exactly as the same
// input handed over in one write does (spawnSync in a second namespace: no slicing). The
// inputs kproxy wrote are recorded and replayed there; both kernels are read back with
// iptables-save / nft list ruleset. Namespaces come from uniqueName() and are removed in
// `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, INPUT_CHUNK, type CommandRunner, type RunOptions, inputText } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { Netns, uniqueName } from '../support/netns.ts';
import { planInput, slice, svc, testConfig, tracker } from '../iptables/helpers.ts';
import { kproxyChains } from '../iptables/kernel-compare.ts';

/** Services in the test: enough for inputs of several hundred KB (many slices). */
const SERVICES = 700;

let kproxyNs: Netns;
let replayNs: Netns;
before(() => {
  kproxyNs = Netns.create(uniqueName('kpslice'));
  replayNs = Netns.create(uniqueName('kprepl'));
});
after(async () => {
  await kproxyNs?.destroy();
  await replayNs?.destroy();
});

/** hostRunner in kproxyNs, keeping every payload written to a rule-writing tool. */
class Recording implements CommandRunner {
  inputs: Array<{ cmd: string; args: string[]; input: string }> = [];
  async run(cmd: string, args: string[], opts: RunOptions = {}) {
    // read once, as the tool reads it, and the same text written
    const input = opts.input === undefined ? undefined : inputText(opts.input);
    if (input && (cmd.endsWith('-restore') || (cmd === 'nft' && args.includes('-f')))) this.inputs.push({ cmd, args, input });
    return hostRunner.run('ip', ['netns', 'exec', kproxyNs.name, cmd, ...args], { ...opts, input, timeoutMs: 120_000 });
  }
}

function state(family: 4 | 6) {
  const t = tracker(family);
  for (let i = 0; i < SERVICES; i++) {
    const cluster = family === 6 ? `fd00:172:30::${(i + 1).toString(16)}` : `172.30.${Math.floor(i / 250)}.${(i % 250) + 1}`;
    const ep = (e: number) => (family === 6 ? `fd00:10:180::${i.toString(16)}:${e}` : `10.${180 + e}.${Math.floor(i / 250)}.${(i % 250) + 1}`);
    const type = i % 2 ? 'NodePort' : 'ClusterIP';
    t.services.update(null, svc(`ns${i % 7}`, `svc${i}`, { clusterIP: cluster, type, nodePort: type === 'NodePort' ? 30000 + i : undefined }));
    const eps = [1, 2, 3].map((e) => ({ ip: ep(e), nodeName: 'other' }));
    t.endpoints.update(null, slice(`ns${i % 7}`, `svc${i}`, `s${i}`, eps, [{ port: 8080 }], family));
  }
  return t;
}

for (const family of [4, 6] as const) {
  test(`IPv${family} iptables: a restore input of many stdin slices programs what one write of it does`, async () => {
    const config = testConfig();
    const t = state(family);
    const keys = t.apply();
    const runner = new Recording();
    // chunkLines 0: one restore for the whole ruleset, the largest input the runner writes
    const p = new IptablesProxier({ runner, log: silentLogger(), config, chunkLines: 0 });
    await p.sync(planInput(t, config, family, [family === 6 ? 'fd00:192::2' : '192.168.0.2']), keys, true);
    const largest = Math.max(...runner.inputs.map((x) => x.input.length));
    assert.ok(largest > 2 * INPUT_CHUNK, `the largest input (${largest} characters) spans several slices`);
    for (const x of runner.inputs) replayNs.exec(x.cmd, x.args, { input: x.input });
    const kernel = kproxyChains(kproxyNs, family);
    assert.match(kernel, /KUBE-SVC-/);
    assert.equal(kernel, kproxyChains(replayNs, family));
    assert.equal((kernel.match(/-j DNAT --to-destination/g) ?? []).length, SERVICES * 3, 'every endpoint is programmed');
  });

  test(`IPv${family} nftables: an nft -f input of many stdin slices programs what one write of it does`, async () => {
    const nftFamily = family === 6 ? 'ip6' : 'ip';
    const config = resolveConfig({}, { mode: 'nftables', clusterCidr: family === 6 ? 'fd00:10::/32' : '10.0.0.0/8' });
    const t = state(family);
    const keys = t.apply();
    const runner = new Recording();
    const p = new NftProxier({ runner, log: silentLogger() });
    await p.sync({ state: t.state, config, node: { nodeName: 'test-node', nodeIPs: [family === 6 ? 'fd00:192::2' : '192.168.0.2'], nodeLabels: {}, family } }, keys, true);
    await p.stop();
    const largest = Math.max(...runner.inputs.map((x) => x.input.length));
    assert.ok(largest > 2 * INPUT_CHUNK, `the largest input (${largest} characters) spans several slices`);
    for (const x of runner.inputs) replayNs.exec(x.cmd, x.args, { input: x.input });
    const list = (ns: Netns) => ns.exec('nft', ['list', 'table', nftFamily, 'kube-proxy']);
    const kernel = list(kproxyNs);
    assert.match(kernel, /endpoint-/);
    assert.equal(kernel, list(replayNs));
  });
}
