// Real kernel, both families, one table and three: between syncs the nftables proxier keeps
// each port's inputs and an index of its tables by name (incremental.ts), and plans a port's
// previous fragment again when a diff needs it. The steps here take the paths where that
// index, not a port's own fragment, gives the previous table: an element several ports add
// (a two-port Service's ClusterIP), an element two Services add with different verdicts (one
// external IP and port), that disagreement ending and starting again, a change of endpoints
// only (the previous fragment planned from the previous Endpoint[] under the same
// ServicePort), affinity sets, and an option change (the node's address: the whole previous
// table planned again). After every step the kernel's tables equal the ones a fresh proxier
// writes with one full sync of the same state in a second namespace (read back with
// `nft -j list table`: the kernel's word); after an idle sync, exactly. Namespaces come from
// uniqueName() and are removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import type { ShardOptions } from '../../src/modes/nftables/shards.ts';
import { dropFlushedChains, dropLingering, dropRetiredAffinitySets, kernelTable, tableLines } from '../support/nft-retired.ts';
import { uniqueName } from '../support/netns.ts';
import { nsRunner } from './objects.ts';
import { clientIPAffinity, lbStatus, makeService, makeSlice } from '../support/builders.ts';

const NS = { partial: uniqueName('kpt-nft-keep-a'), full: uniqueName('kpt-nft-keep-b') };

before(async () => {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
});

after(async () => {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
});

function addr(family: 4 | 6, kind: 'vip' | 'ep' | 'ext' | 'lb' | 'node', i: number, k = 0): string {
  if (family === 4) return { vip: `172.30.0.${i + 1}`, ep: `10.180.${i}.${k + 1}`, ext: '1.2.3.9', lb: `1.2.3.${i + 1}`, node: `192.168.0.${i}` }[kind];
  const h = (n: number) => n.toString(16);
  return { vip: `fd00:172:30::${h(i + 1)}`, ep: `fd00:10:180::${h(i)}:${h(k + 1)}`, ext: 'fd00:1:2:3::9', lb: `fd00:1:2:3::${h(i + 1)}`, node: `fd00::${h(i)}` }[kind];
}

interface Svc {
  /** the second port (UDP 53) beside TCP 80: both ports add the ClusterIP to cluster-ips */
  dns: boolean;
  /** the external IP every such Service shares, on TCP 80: each adds it with its own verdict */
  shared: boolean;
  sticky: boolean;
  lb: boolean;
  eps: number[];
}

function serviceObject(family: 4 | 6, i: number, s: Svc): K8sService {
  const ports = [{ name: 'http', protocol: 'TCP', port: 80, nodePort: 30000 + i }, ...(s.dns ? [{ name: 'dns', protocol: 'UDP', port: 53, nodePort: 31000 + i }] : [])];
  return makeService('ns', `svc${i}`, {
    type: s.lb ? 'LoadBalancer' : 'NodePort',
    clusterIP: addr(family, 'vip', i),
    ipFamilies: [family === 6 ? 'IPv6' : 'IPv4'],
    ports,
    ...(s.shared ? { externalIPs: [addr(family, 'ext', i)] } : {}),
    ...(s.lb ? { loadBalancerSourceRanges: [family === 6 ? '2001:db8::/64' : '203.0.113.0/24'] } : {}),
    ...(s.sticky ? clientIPAffinity(60) : {}),
  }, s.lb ? lbStatus(addr(family, 'lb', i)) : undefined);
}

function sliceObject(family: 4 | 6, i: number, s: Svc): K8sEndpointSlice {
  return makeSlice('ns', `svc${i}`, {
    name: `svc${i}-x`,
    family,
    endpoints: s.eps.map((k) => ({ ip: addr(family, 'ep', i, k), node: k % 2 === 0 ? 'node-a' : 'node-b', ready: true })),
    ports: [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }],
  });
}

/** Every kube-proxy table of the family in the namespace, sorted lines; `proxier`: the partial side (its lingering elements checked and left out, retired chains and sets left out). */
async function tables(ns: string, family: 'ip' | 'ip6', names: string[], proxier?: NftProxier): Promise<Map<string, string[]>> {
  const out = new Map<string, string[]>();
  for (const name of names) {
    const t = await kernelTable(nsRunner(ns), family, name);
    if (proxier) {
      const own = proxier.tableWriters().find((w) => w.table === name)!.lingeringElements();
      assert.deepEqual(dropLingering(t, own), [], `${name}: lingering elements`);
      dropFlushedChains(t);
      dropRetiredAffinitySets(t);
    }
    out.set(name, tableLines(t));
  }
  return out;
}

const LAYOUTS: Array<{ name: string; shards?: ShardOptions }> = [
  { name: 'one table' },
  { name: 'three tables', shards: { tables: 3 } },
];

for (const family of [4, 6] as const) {
  for (const layout of LAYOUTS) {
    test(`IPv${family}, ${layout.name}: shared and disputed elements, endpoint-only changes, affinity and a node address change leave the kernel as a fresh full sync`, async () => {
      const nftFamily = family === 6 ? 'ip6' : 'ip';
      const config = resolveConfig({}, { mode: 'nftables', clusterCidr: family === 6 ? 'fd00:10::/32' : '10.0.0.0/8' });
      const tracker = new ProxyStateTracker(family, 'node-a');
      const nodeAt = (ip: number) => ({ nodeName: 'node-a', nodeIPs: [addr(family, 'node', ip)], nodeLabels: {}, family });
      let input: PlanInput = { state: tracker.state, config, node: nodeAt(2) };
      const svcs = new Map<number, Svc>([
        [0, { dns: true, shared: false, sticky: false, lb: false, eps: [0, 1] }],
        [1, { dns: false, shared: true, sticky: false, lb: false, eps: [0, 1] }],
        [2, { dns: false, shared: true, sticky: false, lb: false, eps: [0] }],
        [3, { dns: false, shared: false, sticky: true, lb: false, eps: [0, 1] }],
        [4, { dns: true, shared: false, sticky: false, lb: true, eps: [0, 1, 2] }],
        [5, { dns: false, shared: false, sticky: false, lb: false, eps: [0] }],
      ]);
      for (const [i, s] of svcs) {
        tracker.services.update(null, serviceObject(family, i, s));
        tracker.endpoints.update(null, sliceObject(family, i, s));
      }
      for (const ns of Object.values(NS)) await nsRunner(ns).run('nft', ['flush', 'ruleset'], { timeoutMs: 10_000 });
      const proxier = new NftProxier({ runner: nsRunner(NS.partial), log: silentLogger(), staleChainDelayMs: 0, staleChainBatchMs: 0, ...(layout.shards ? { shards: layout.shards } : {}) });
      await proxier.sync(input, tracker.apply(), true);
      const names = proxier.tables();
      assert.equal(names.length, layout.shards ? 3 : 1);

      const edit = (i: number, change: (s: Svc) => void, what: 'service' | 'slice' | 'both' = 'both') => {
        const s = svcs.get(i)!;
        const [oldSvc, oldSlice] = [serviceObject(family, i, s), sliceObject(family, i, s)];
        change(s);
        if (what !== 'slice') tracker.services.update(oldSvc, serviceObject(family, i, s));
        if (what !== 'service') tracker.endpoints.update(oldSlice, sliceObject(family, i, s));
      };
      const remove = (i: number) => {
        const s = svcs.get(i)!;
        svcs.delete(i);
        tracker.services.update(serviceObject(family, i, s), null);
        tracker.endpoints.update(sliceObject(family, i, s), null);
      };
      const create = (i: number, s: Svc) => {
        svcs.set(i, s);
        tracker.services.update(null, serviceObject(family, i, s));
        tracker.endpoints.update(null, sliceObject(family, i, s));
      };
      /** each step: what it is, the change, and whether the sync is a full one */
      const steps: Array<[string, () => void, boolean?]> = [
        ['the two-port Service loses its second port (their ClusterIP element stays)', () => edit(0, (s) => (s.dns = false), 'service')],
        ['its endpoints change under the same ServicePort', () => edit(0, (s) => (s.eps = [1, 2]), 'slice')],
        ['one of the two Services disputing the external IP goes', () => remove(2)],
        ['it comes back: the dispute again', () => create(2, { dns: true, shared: true, sticky: false, lb: false, eps: [0, 1] })],
        ['an affinity Service swaps an endpoint', () => edit(3, (s) => (s.eps = [1, 2]), 'slice')],
        // A Node change makes the controller run a full sync (controller.ts onNode); with one
        // table the partial sync's whole-table diff against the previous table is taken too.
        ['the node\'s address changes (every port planned afresh), with an endpoint change', () => {
          input = { ...input, node: nodeAt(3) };
          edit(5, (s) => (s.eps = [0, 1]), 'slice');
        }, layout.shards !== undefined],
        ['the other disputing Service goes', () => remove(1)],
        ['the LoadBalancer Service loses its endpoints and its second port', () => edit(4, (s) => ((s.eps = []), (s.dns = false)))],
      ];
      for (const [what, change, fullSync = false] of steps) {
        change();
        const changed = tracker.apply();
        const stats = await proxier.sync(input, changed, fullSync);
        assert.equal(proxier.partialFallbacks, 0, `${what}: the partial transaction was refused`);
        for (const ns of [NS.full]) await nsRunner(ns).run('nft', ['flush', 'ruleset'], { timeoutMs: 10_000 });
        const fresh = new NftProxier({ runner: nsRunner(NS.full), log: silentLogger(), ...(layout.shards ? { shards: layout.shards } : {}) });
        const full = await fresh.sync(input, new Set(), true);
        assert.deepEqual(await tables(NS.partial, nftFamily, names, proxier), await tables(NS.full, nftFamily, names), what);
        assert.equal(stats.rulesTotal, full.rulesTotal, `${what}: the objects counted`);
      }
      // An idle sync deletes what the steps left: then not even an empty chain differs.
      await proxier.sync(input, new Set(), false);
      assert.deepEqual(proxier.lingeringElements(), [], 'nothing lingers after the idle sync');
      assert.deepEqual(await tables(NS.partial, nftFamily, names), await tables(NS.full, nftFamily, names), 'after the idle sync');
    });
  }
}
