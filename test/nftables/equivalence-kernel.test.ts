// Real kernel, both families: random sequences of changes applied by one NftProxier as
// partial syncs leave its namespace's `kube-proxy` table equal, after every step, to the
// table a fresh proxier writes with one full sync of the same state into a second
// namespace (as test/iptables/skip-unchanged.test.ts does for iptables). Both are read back
// with `nft list table`. Namespaces come from uniqueName() and are removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { dropFlushedChains, dropLingering, dropRetiredAffinitySets, kernelTable, tableLines } from '../support/nft-retired.ts';
import { uniqueName } from '../support/netns.ts';
import { rng } from '../support/rng.ts';
import { nsRunner } from './objects.ts';
import { clientIPAffinity, lbStatus, makeService, makeSlice } from '../support/builders.ts';

const NS = { partial: uniqueName('kpt-nft-eq-a'), full: uniqueName('kpt-nft-eq-b') };
const SERVICES = 12;
const STEPS = 14;
const SEEDS = [1, 2];


interface Svc {
  sticky: boolean;
  local: boolean;
  port: number;
  eps: number[];
}

function addr(family: 4 | 6, kind: 'vip' | 'ep' | 'lb', i: number, k = 0): string {
  if (family === 4) return kind === 'vip' ? `172.30.0.${i + 1}` : kind === 'lb' ? `1.2.3.${i + 1}` : `10.180.${i}.${k + 1}`;
  return kind === 'vip' ? `fd00:172:30::${(i + 1).toString(16)}` : kind === 'lb' ? `fd00:1:2:3::${(i + 1).toString(16)}` : `fd00:10:180::${i.toString(16)}:${(k + 1).toString(16)}`;
}

function serviceObject(family: 4 | 6, i: number, s: Svc): K8sService {
  return makeService('ns', `svc${i}`, {
    type: 'LoadBalancer',
    clusterIP: addr(family, 'vip', i),
    ipFamilies: [family === 6 ? 'IPv6' : 'IPv4'],
    ports: [{ name: 'http', protocol: 'TCP', port: s.port, nodePort: 30000 + i }],
    externalTrafficPolicy: s.local ? 'Local' : 'Cluster',
    ...(s.sticky ? clientIPAffinity(60) : {}),
  }, lbStatus(addr(family, 'lb', i)));
}

function sliceObject(family: 4 | 6, i: number, s: Svc): K8sEndpointSlice {
  return makeSlice('ns', `svc${i}`, {
    name: `svc${i}-x`,
    family,
    // Every third endpoint is on this node, so Local policies have some.
    endpoints: s.eps.map((k) => ({ ip: addr(family, 'ep', i, k), node: k % 3 === 0 ? 'node-a' : 'node-b', ready: true })),
    ports: [{ name: 'http', port: 8080 }],
  });
}

/**
 * The kernel's table, sorted lines. `proxier`: the partial side, whose lingering elements
 * (harmless, deleted later) are checked and left out, exactly those.
 */
async function table(ns: string, family: 'ip' | 'ip6', proxier?: NftProxier): Promise<string[]> {
  const t = await kernelTable(nsRunner(ns), family, 'kube-proxy');
  if (proxier) assert.deepEqual(dropLingering(t, proxier.lingeringElements()), []);
  // Chains retired by a partial sync are flushed now and deleted a second later.
  dropFlushedChains(t);
  dropRetiredAffinitySets(t);
  return tableLines(t);
}

before(async () => {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
});

after(async () => {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
});

for (const family of [4, 6] as const) {
  for (const seed of SEEDS) {
    test(`IPv${family}, seed ${seed}: after every partial sync the kernel table equals a fresh full sync's`, async () => {
      const nftFamily = family === 6 ? 'ip6' : 'ip';
      const node = { nodeName: 'node-a', nodeIPs: [family === 6 ? 'fd00::2' : '192.168.0.2'], nodeLabels: {}, family };
      const config = resolveConfig({}, { mode: 'nftables', clusterCidr: family === 6 ? 'fd00:10::/32' : '10.0.0.0/8' });
      const tracker = new ProxyStateTracker(family, node.nodeName);
      const input: PlanInput = { state: tracker.state, config, node };
      const random = rng(seed * 10 + family);
      const pick = (n: number) => Math.floor(random() * n);
      const svcs = new Map<number, Svc>();
      for (let i = 0; i < SERVICES; i++) {
        const s: Svc = { sticky: i % 4 === 1, local: i % 3 === 2, port: 80, eps: Array.from({ length: 1 + (i % 4) }, (_, k) => k) };
        svcs.set(i, s);
        tracker.services.update(null, serviceObject(family, i, s));
        tracker.endpoints.update(null, sliceObject(family, i, s));
      }
      for (const ns of Object.values(NS)) await nsRunner(ns).run('nft', ['delete', 'table', nftFamily, 'kube-proxy'], { timeoutMs: 10_000 });
      const proxier = new NftProxier({ runner: nsRunner(NS.partial), log: silentLogger(), staleChainDelayMs: 0, staleChainBatchMs: 0 });
      await proxier.sync(input, tracker.apply(), true);

      /** one random change to service i: what it did, for the failure message */
      const change = (i: number): string => {
        const s = svcs.get(i);
        if (!s) {
          const n: Svc = { sticky: random() < 0.5, local: random() < 0.5, port: 80, eps: [0, 1] };
          svcs.set(i, n);
          tracker.services.update(null, serviceObject(family, i, n));
          tracker.endpoints.update(null, sliceObject(family, i, n));
          return `svc${i} created`;
        }
        const oldSvc = serviceObject(family, i, s);
        const oldSlice = sliceObject(family, i, s);
        const what = pick(7);
        if (what === 0) s.eps = [...s.eps, Math.max(-1, ...s.eps) + 1];
        else if (what === 1) s.eps = s.eps.filter((_, k) => k !== pick(s.eps.length));
        else if (what === 2) s.eps = [];
        else if (what === 3) s.sticky = !s.sticky;
        else if (what === 4) s.local = !s.local;
        else if (what === 5) s.port = s.port === 80 ? 81 : 80;
        else {
          svcs.delete(i);
          tracker.services.update(oldSvc, null);
          tracker.endpoints.update(oldSlice, null);
          return `svc${i} deleted`;
        }
        if (what <= 2) tracker.endpoints.update(oldSlice, sliceObject(family, i, s));
        else tracker.services.update(oldSvc, serviceObject(family, i, s));
        return `svc${i} ${['endpoint added', 'endpoint removed', 'endpoints emptied', 'affinity toggled', 'traffic policy toggled', 'port changed'][what]}`;
      };

      const history: string[] = [];
      for (let step = 0; step < STEPS; step++) {
        // One or two services change per sync, as a coalesced burst would.
        const count = 1 + pick(2);
        for (let c = 0; c < count; c++) history.push(change(pick(SERVICES + 2)));
        const changed = tracker.apply();
        const lingeredBefore = new Set(proxier.lingeringElements().map(({ set, el }) => `delete element ${nftFamily} kube-proxy ${set} { ${el.key.join(' . ')} }`));
        const stats = await proxier.sync(input, changed, false);
        assert.ok(stats.rulesWritten < 80, `step ${step}: a small transaction (${stats.rulesWritten} commands) after ${history.join(', ')}`);
        assert.equal(proxier.partialFallbacks, 0, `step ${step}: the partial transaction was refused`);
        // Only commands nft 1.0.6 runs without listing every chain, and deletes of what went.
        const sent = proxier.lastTransactionText().split('\n').filter(Boolean);
        for (const l of sent) assert.match(l, /^(add chain|flush chain|add set|add map|flush set|delete element|delete set|delete chain) /, `step ${step}`);
        // A Service deleted alone deletes none of its dispatch elements: they linger, harmless.
        const gone = /^svc\d+ deleted$/.test(history.at(-1)!) && count === 1;
        if (gone) assert.deepEqual(sent.filter((l) => /^delete element \S+ kube-proxy (service-ips|service-nodeports|firewall-ips|cluster-ips) /.test(l) && !lingeredBefore.has(l)), [], `step ${step}: ${history.at(-1)}`);


        await nsRunner(NS.full).run('nft', ['delete', 'table', nftFamily, 'kube-proxy'], { timeoutMs: 10_000 });
        const fresh = new NftProxier({ runner: nsRunner(NS.full), log: silentLogger() });
        await fresh.sync(input, new Set(), true);
        assert.deepEqual(await table(NS.partial, nftFamily, proxier), await table(NS.full, nftFamily), `step ${step} after ${history.join(', ')}`);
      }
      // An idle sync deletes the elements and chains the steps left: then not even an empty chain differs.
      await proxier.sync(input, new Set(), false);
      assert.deepEqual(proxier.lingeringElements(), [], 'nothing lingers after the idle sync');
      const strict = async (ns: string) => tableLines(await kernelTable(nsRunner(ns), nftFamily, 'kube-proxy'));
      assert.deepEqual(await strict(NS.partial), await strict(NS.full), `after the idle sync, following ${history.join(', ')}`);
      // The sequence covered more than endpoint churn.
      assert.ok(new Set(history.map((h) => h.replace(/^svc\d+ /, ''))).size >= 4, history.join(', '));
    });
  }
}
