// Real kernel (iptables-restore / ip6tables-restore, the machine's default backend): the
// chunked cold start (full.ts chunkedPayloads, cold form: each chunk publishes its own
// services' dispatch rules, the filter table first, the NodePort catch-all last) leaves
// kproxy's chains exactly as ONE flushing iptables-restore of the same full ruleset leaves
// them (rule order within every chain compared), in both families, while another program's
// nat chain and its jump from PREROUTING survive (--noflush semantics); a forced full sync
// over those rules afterwards (the classic form: dispatch chains replaced at once in the
// last chunk) equals a flushing restore of the new ruleset too.
// The three namespaces are removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, inputText, type CommandRunner, type RunOptions } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { getMode } from '../../src/modes/registry.ts';
import { IptablesProxier, jumpsPayload } from '../../src/modes/iptables/proxier.ts';
import { Netns, uniqueName } from '../support/netns.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';
import { kproxyChains } from './kernel-compare.ts';

let kproxyNs: Netns;
let rawNs: Netns;
before(() => {
  kproxyNs = Netns.create(uniqueName('kpcold'));
  rawNs = Netns.create(uniqueName('kpcraw'));
});
after(async () => {
  await kproxyNs?.destroy();
  await rawNs?.destroy();
});

/** Runs in kproxyNs and keeps every restore input. */
class Recording implements CommandRunner {
  restores: string[] = [];
  async run(cmd: string, args: string[], opts?: RunOptions) {
    if (cmd.endsWith('-restore') && opts?.input) this.restores.push(inputText(opts.input));
    return hostRunner.run('ip', ['netns', 'exec', kproxyNs.name, cmd, ...args], { timeoutMs: 60_000, ...opts });
  }
}

for (const family of [4, 6] as const) {
  test(`IPv${family}: the chunked cold start equals one flushing restore of the same ruleset; another program's chain survives`, async () => {
    const v6 = family === 6;
    const iptables = v6 ? 'ip6tables' : 'iptables';
    const restore = v6 ? 'ip6tables-restore' : 'iptables-restore';
    const cluster = (i: number) => (v6 ? `fd00:172:30::${i + 1}` : `172.30.3.${i + 1}`);
    const ep = (i: number, e: number) => (v6 ? `fd00:10:180::${i}:${e}` : `10.180.${i}.${e}`);
    const lb = (i: number) => (v6 ? `fd00:1:2:3::${i + 1}` : `1.2.3.${i + 1}`);
    const config = testConfig();
    const t = tracker(family);
    const svcs: ReturnType<typeof svc>[] = [];
    const slices: ReturnType<typeof slice>[] = [];
    for (let i = 0; i < 16; i++) {
      const type = (['ClusterIP', 'NodePort', 'LoadBalancer'] as const)[i % 3];
      svcs.push(svc(`ns${i}`, `svc${i}`, {
        clusterIP: cluster(i),
        type,
        nodePort: type === 'ClusterIP' ? undefined : 30200 + i,
        etp: type === 'ClusterIP' ? undefined : i % 4 === 1 ? 'Local' : 'Cluster',
        lbIPs: type === 'LoadBalancer' ? [lb(i)] : undefined,
        sourceRanges: type === 'LoadBalancer' && i % 2 ? [v6 ? 'fd00:203::/64' : '203.0.113.0/25'] : undefined,
        affinitySeconds: i % 7 === 0 ? 60 : undefined,
      }));
      // every fifth service has no endpoints (filter REJECT rules), some endpoints are local
      const eps = i % 5 === 4 ? [] : [1, 2, 3].map((e) => ({ ip: ep(i, e), nodeName: e === 1 && i % 2 ? 'test-node' : 'other' }));
      slices.push(slice(`ns${i}`, `svc${i}`, 's', eps, [{ port: 8080 }], family));
      t.services.update(null, svcs[i]);
      t.endpoints.update(null, slices[i]);
    }
    const nodeIPs = [v6 ? 'fd00:192::2' : '192.168.0.2'];
    // Another program's chain, with a jump from PREROUTING, in kproxy's namespace.
    kproxyNs.exec(iptables, ['-w', '5', '-t', 'nat', '-N', 'OTHER-APP']);
    kproxyNs.exec(iptables, ['-w', '5', '-t', 'nat', '-A', 'OTHER-APP', '-s', v6 ? 'fd00:99::/64' : '10.99.0.0/16', '-j', 'RETURN']);
    kproxyNs.exec(iptables, ['-w', '5', '-t', 'nat', '-A', 'PREROUTING', '-j', 'OTHER-APP']);

    const runner = new Recording();
    const p = new IptablesProxier({ runner, log: silentLogger(), config, chunkLines: 30 });
    const keys = t.apply();
    const input = planInput(t, config, family, nodeIPs);
    await p.sync(input, keys, true);
    // The cold form ran: several chunks, dispatch rules before the last one, filter first.
    const chunks = runner.restores.filter((r) => /KUBE-SVC-|KUBE-NODEPORTS/.test(r));
    assert.ok(chunks.length >= 4, `${chunks.length} chunks`);
    assert.ok(chunks.slice(0, -1).some((c) => /^-A KUBE-SERVICES .* -j KUBE-SVC-/m.test(c)), 'dispatch rules published with their chunk');
    assert.match(chunks[0], /^\*filter/m);
    assert.match(chunks.at(-1)!, /must be the last rule in this chain/);

    // The reference: one flushing restore of the same ruleset into an empty namespace.
    rawNs.exec(restore, ['-w', '5'], { input: getMode('iptables').render(input) });
    // plus the jumps from the built-in chains (and the chains they need) that kproxy adds first
    rawNs.exec(restore, ['-w', '5', '--noflush'], { input: jumpsPayload(rawNs.exec(v6 ? 'ip6tables-save' : 'iptables-save', [])) });
    const kernel = kproxyChains(kproxyNs, family);
    assert.equal(kernel, kproxyChains(rawNs, family), 'cold start');
    assert.match(kernel, /KUBE-SVC-/);
    const nat = kproxyNs.exec(v6 ? 'ip6tables-save' : 'iptables-save', ['-t', 'nat']);
    assert.match(nat, /^-A OTHER-APP -s \S+ -j RETURN$/m, 'the other program\'s rule is kept');
    assert.match(nat, /^-A PREROUTING -j OTHER-APP$/m, 'and its jump');
    assert.match(nat, /^-A PREROUTING .*-j KUBE-SERVICES$/m, 'kproxy\'s jump is there too');

    // Changes, then a forced full sync over the old rules (the classic chunked form).
    t.services.update(svcs[3], null);
    t.endpoints.update(slices[3], null);
    t.endpoints.update(slices[4], slice('ns4', 'svc4', 's', [{ ip: ep(4, 9) }], [{ port: 8080 }], family));
    t.services.update(svcs[5], svc('ns5', 'svc5', { clusterIP: cluster(5), port: 81, type: 'NodePort', nodePort: 30205 }));
    const changed = t.apply();
    const input2 = planInput(t, config, family, nodeIPs);
    runner.restores = [];
    await p.sync(input2, changed, true);
    const warm = runner.restores.filter((r) => /KUBE-SVC-|KUBE-NODEPORTS/.test(r));
    assert.ok(warm.length >= 2, `${warm.length} chunks`);
    for (const c of warm.slice(0, -1)) assert.doesNotMatch(c, /^-A KUBE-(SERVICES|NODEPORTS) /m, 'over old rules the dispatch chains are replaced at once, last');
    rawNs.exec(restore, ['-w', '5'], { input: getMode('iptables').render(input2) });
    rawNs.exec(restore, ['-w', '5', '--noflush'], { input: jumpsPayload(rawNs.exec(v6 ? 'ip6tables-save' : 'iptables-save', [])) });
    assert.equal(kproxyChains(kproxyNs, family), kproxyChains(rawNs, family), 'full sync over the old rules');
    assert.doesNotMatch(kproxyChains(kproxyNs, family), /ns3\/svc3/);
    assert.match(kproxyNs.exec(v6 ? 'ip6tables-save' : 'iptables-save', ['-t', 'nat']), /^-A OTHER-APP -s \S+ -j RETURN$/m);
  });
}
