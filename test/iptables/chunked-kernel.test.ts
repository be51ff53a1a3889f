// Real kernel (iptables-restore / ip6tables-restore, the machine's default backend), in two
// namespaces this test creates: a chunked full sync (a few lines per chunk: many restores)
// leaves exactly the nat and filter tables a one-payload full sync leaves, in both families,
// on a cold start and again after changes (a forced full sync over the old rules: stale
// chains deleted, services rewritten), with another program's chain in nat left alone
// (--noflush semantics).
// Both namespaces are removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, type CommandRunner } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { Netns, uniqueName } from '../support/netns.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';

let chunkedNs: Netns;
let plainNs: Netns;
const inNs = (ns: () => Netns): CommandRunner => ({
  run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', ns().name, cmd, ...args], { timeoutMs: 60_000, ...opts }),
});

before(() => {
  chunkedNs = Netns.create(uniqueName('kpck'));
  plainNs = Netns.create(uniqueName('kpcp'));
});
after(async () => {
  await chunkedNs?.destroy();
  await plainNs?.destroy();
});

/** nat + filter as iptables-save prints them, without counters and comments lines. */
function tables(ns: Netns, family: 4 | 6): string {
  const save = family === 6 ? 'ip6tables-save' : 'iptables-save';
  return ['nat', 'filter']
    .map((t) => ns.exec(save, ['-t', t]).split('\n').filter((l) => l && !l.startsWith('#')).map((l) => l.replace(/ \[\d+:\d+\]$/, '')).sort().join('\n'))
    .join('\n');
}

for (const family of [4, 6] as const) {
  test(`IPv${family}: chunked full syncs leave the kernel as one-payload full syncs`, async () => {
    const v6 = family === 6;
    const cluster = (i: number) => (v6 ? `fd00:172:30::${i + 1}` : `172.30.2.${i + 1}`);
    const ep = (i: number, e: number) => (v6 ? `fd00:10:180::${i}:${e}` : `10.180.${i}.${e}`);
    const config = testConfig();
    const t = tracker(family);
    const svcs: ReturnType<typeof svc>[] = [];
    const slices: ReturnType<typeof slice>[] = [];
    for (let i = 0; i < 12; i++) {
      svcs.push(svc(`ns${i}`, `svc${i}`, { clusterIP: cluster(i), type: i % 2 ? 'NodePort' : 'ClusterIP', nodePort: i % 2 ? 30100 + i : undefined }));
      slices.push(slice(`ns${i}`, `svc${i}`, 's', [1, 2, 3].map((e) => ({ ip: ep(i, e) })), [{ port: 8080 }], family));
      t.services.update(null, svcs[i]);
      t.endpoints.update(null, slices[i]);
    }
    // Another program's chain and rule in nat: --noflush must keep them.
    const iptables = v6 ? 'ip6tables' : 'iptables';
    for (const ns of [chunkedNs, plainNs]) {
      ns.exec(iptables, ['-w', '5', '-t', 'nat', '-N', 'OTHER-APP']);
      ns.exec(iptables, ['-w', '5', '-t', 'nat', '-A', 'OTHER-APP', '-j', 'RETURN']);
    }
    const nodeIPs = [v6 ? 'fd00:192::2' : '192.168.0.2'];
    const chunked = new IptablesProxier({ runner: inNs(() => chunkedNs), log: silentLogger(), config, chunkLines: 15 });
    const plain = new IptablesProxier({ runner: inNs(() => plainNs), log: silentLogger(), config, chunkLines: 0 });
    const keys = t.apply();
    const s1 = await chunked.sync(planInput(t, config, family, nodeIPs), keys, true);
    await plain.sync(planInput(t, config, family, nodeIPs), keys, true);
    assert.match(s1.diff ?? '', /in \d+ restores/);
    assert.equal(tables(chunkedNs, family), tables(plainNs, family), 'cold start');
    assert.match(tables(chunkedNs, family), /-A OTHER-APP -j RETURN/);

    // Changes, then a forced full sync over the old rules.
    t.services.update(svcs[3], null);
    t.endpoints.update(slices[3], null);
    t.endpoints.update(slices[4], slice('ns4', 'svc4', 's', [{ ip: ep(4, 9) }], [{ port: 8080 }], family));
    t.services.update(svcs[5], svc('ns5', 'svc5', { clusterIP: cluster(5), port: 81, type: 'LoadBalancer', nodePort: 30105, lbIPs: [v6 ? 'fd00:1:2:3::5' : '1.2.3.5'] }));
    const changed = t.apply();
    await chunked.sync(planInput(t, config, family, nodeIPs), changed, true);
    await plain.sync(planInput(t, config, family, nodeIPs), changed, true);
    const after = tables(chunkedNs, family);
    assert.equal(after, tables(plainNs, family), 'full sync over the old rules');
    assert.doesNotMatch(after, /ns3\/svc3/, 'the removed service is gone');
    assert.match(after, new RegExp(`--to-destination \\[?${ep(4, 9).replace(/\./g, '\\.')}\\]?:8080`));
    assert.match(after, /-A OTHER-APP -j RETURN/);
  });
}
