// Real kernel, in two namespaces this test creates (the machine's default iptables backend
// in both families, and legacy for IPv4): a seeded random sequence of changes applied with
// partial syncs (the production proxier: unchanged chains left out, the O(changed) fast
// path, dispatch rules edited in place, stale chains deleted at once or, in large-cluster
// mode, deferred until the cleanup is due) leaves the nat and filter tables as a fresh
// proxier's full sync of the same state leaves them, rule order within each chain included.
// While deletions are deferred, the only difference allowed is the deferred chains
// themselves: service chains only other deferred chains jump to. Once the cleanup is due
// they are gone and the tables are identical. An endpoint-only change's restore input writes
// neither KUBE-SERVICES nor KUBE-NODEPORTS nor the filter table. Both namespaces are removed
// in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { hostRunner, type CommandRunner, type RunOptions, inputText } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { isServiceChainName } from '../../src/modes/iptables/names.ts';
import { DEFAULT_FACTS } from '../../src/modes/iptables/options.ts';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { Netns, uniqueName } from '../support/netns.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';
import { rng } from '../support/rng.ts';

let partNs: Netns;
let refNs: Netns;

before(() => {
  partNs = Netns.create(uniqueName('kpps'));
  refNs = Netns.create(uniqueName('kppr'));
});
after(async () => {
  await partNs?.destroy();
  await refNs?.destroy();
});

type Backend = 'default' | 'legacy';

/** The binary for a backend: the legacy ones by name, as update-alternatives would switch them. */
const bin = (cmd: string, backend: Backend) => (backend === 'legacy' ? cmd.replace(/^(ip6?tables)/, '$1-legacy') : cmd);

/** Runs in a namespace and keeps every restore input. */
function nsRunner(ns: () => Netns, backend: Backend, inputs: string[] = []): CommandRunner {
  return {
    run: (cmd: string, args: string[], opts?: RunOptions) => {
      if (cmd.endsWith('-restore') && opts?.input) inputs.push(inputText(opts.input));
      return hostRunner.run('ip', ['netns', 'exec', ns().name, bin(cmd, backend), ...args], { timeoutMs: 60_000, ...opts });
    },
  };
}

/**
 * nat + filter as iptables-save prints them, without counters and comment lines: chains in
 * name order (their order in the save is creation order), rules in their order in the chain.
 */
function tableLines(ns: Netns, family: 4 | 6, backend: Backend): string[] {
  const save = bin(family === 6 ? 'ip6tables-save' : 'iptables-save', backend);
  const out: string[] = [];
  for (const t of ['nat', 'filter']) {
    for (const l of ns.exec(save, ['-t', t]).split('\n')) {
      if (l && !l.startsWith('#') && !l.startsWith('*') && l !== 'COMMIT') out.push(`${t} ${l.replace(/ \[\d+:\d+\]$/, '')}`);
    }
  }
  // Stable: declarations (":") before rules ("-A"), each chain's rules keep their order.
  const key = (l: string) => `${l.split(' ')[0]} ${chainOf(l)} ${l.split(' ')[1].startsWith(':') ? 0 : 1}`;
  return out.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
}

/** Chain of a `:CHAIN` or `-A CHAIN` line (after the table prefix). */
const chainOf = (l: string): string | undefined => /^\S+ (?::|-A )(\S+)/.exec(l)?.[1];


interface Model {
  exists: boolean;
  port: number;
  type: 'ClusterIP' | 'NodePort';
  etp: 'Local' | 'Cluster';
  eps: number[];
  svcObj: K8sService | null;
  sliceObj: K8sEndpointSlice | null;
}

const KINDS = ['endpoint-add', 'endpoint-add', 'endpoint-remove', 'service-add', 'service-remove', 'port', 'policy', 'type', 'tick'] as const;

// The machine's default backend (nf_tables on Debian) in both families; legacy (x_tables,
// whole-table commits) for IPv4.
const VARIANTS: Array<{ family: 4 | 6; large: boolean; backend: Backend }> = [
  { family: 4, large: false, backend: 'default' },
  { family: 4, large: true, backend: 'default' },
  { family: 6, large: false, backend: 'default' },
  { family: 6, large: true, backend: 'default' },
  { family: 4, large: false, backend: 'legacy' },
  { family: 4, large: true, backend: 'legacy' },
];

for (const { family, large, backend } of VARIANTS) {
  {
    test(`IPv${family}${backend === 'legacy' ? ' (legacy)' : ''}${large ? ', large-cluster mode (deferred deletions)' : ''}: random partial syncs leave the kernel as a fresh full sync`, async () => {
      const v6 = family === 6;
      const random = rng(large ? 20261203 : 20261204);
      const pick = <T>(xs: readonly T[]): T => xs[Math.floor(random() * xs.length)];
      const cluster = (i: number) => (v6 ? `fd00:172:30::${i + 1}` : `172.30.3.${i + 1}`);
      const epIP = (i: number, e: number) => (v6 ? `fd00:10:180::${i}:${e}` : `10.180.${i}.${e}`);
      const nodeIPs = [v6 ? 'fd00:192::2' : '192.168.0.2'];
      const config = testConfig({ syncPeriodMs: 10_000 });
      // Large-cluster mode from 4 endpoints on: the same code path as 1000+ in production.
      const facts = { [family]: { ...DEFAULT_FACTS, largeClusterEndpointsThreshold: large ? 4 : 1000 } };
      let clock = 1_000_000;
      const now = () => clock;
      const inputs: string[] = [];
      for (const ns of [partNs, refNs]) {
        for (const t of ['nat', 'filter']) {
          ns.exec(bin(v6 ? 'ip6tables' : 'iptables', backend), ['-w', '5', '-t', t, '-F'], { allowFail: true });
          ns.exec(bin(v6 ? 'ip6tables' : 'iptables', backend), ['-w', '5', '-t', t, '-X'], { allowFail: true });
        }
      }
      const p = new IptablesProxier({ runner: nsRunner(() => partNs, backend, inputs), log: silentLogger(), config, facts, now });
      const t = tracker(family);
      const N = 8;
      const models: Model[] = [];
      let nextEp = 1;
      const put = (i: number) => {
        const m = models[i];
        const s = m.exists
          ? svc(`ns${i}`, `svc${i}`, { clusterIP: cluster(i), port: m.port, type: m.type, nodePort: m.type === 'NodePort' ? 30200 + i : undefined, etp: m.type === 'NodePort' ? m.etp : undefined })
          : null;
        // Every third endpoint is on this node, so Local policies have local endpoints sometimes.
        const e = m.exists && m.eps.length
          ? slice(`ns${i}`, `svc${i}`, 's', m.eps.map((x) => ({ ip: epIP(i, x), nodeName: x % 3 === 0 ? 'test-node' : 'other' })), [{ port: 8080 }], family)
          : null;
        if (m.svcObj || s) t.services.update(m.svcObj, s);
        if (m.sliceObj || e) t.endpoints.update(m.sliceObj, e);
        m.svcObj = s;
        m.sliceObj = e;
      };
      for (let i = 0; i < N; i++) {
        models.push({ exists: i < 6, port: 80, type: i % 2 ? 'NodePort' : 'ClusterIP', etp: 'Cluster', eps: [nextEp++, nextEp++], svcObj: null, sliceObj: null });
        put(i);
      }
      await p.sync(planInput(t, config, family, nodeIPs), t.apply(), true);

      const compare = async (label: string, exact: boolean): Promise<number> => {
        const ref = new IptablesProxier({ runner: nsRunner(() => refNs, backend), log: silentLogger(), config, facts, now });
        await ref.sync(planInput(t, config, family, nodeIPs), new Set(), true);
        const want = tableLines(refNs, family, backend);
        const got = tableLines(partNs, family, backend);
        const wantChains = new Set(want.map(chainOf));
        const extra = new Set(got.map(chainOf).filter((c): c is string => c !== undefined && !wantChains.has(c)));
        for (const c of extra) {
          assert.ok(!exact, `${label}: ${c} should have been deleted`);
          assert.ok(isServiceChainName(c), `${label}: only service chains may linger (${c})`);
          const from = got.filter((l) => l.endsWith(` -j ${c}`)).map(chainOf);
          assert.ok(from.every((x) => extra.has(x ?? '')), `${label}: only deferred chains jump to the deferred chain ${c}`);
        }
        assert.deepEqual(got.filter((l) => !extra.has(chainOf(l) ?? '')), want, label);
        return extra.size;
      };

      let deferredSeen = 0;
      let endpointOnly = 0;
      for (let step = 0; step < 24; step++) {
        // An endpoint added to a service that has endpoints and no Local policy changes only
        // that service's own chains (its dispatch rules stay the same): every third step.
        const plain = models.map((x, j) => j).filter((j) => models[j].exists && models[j].eps.length > 0 && (models[j].type === 'ClusterIP' || models[j].etp === 'Cluster'));
        const kind = step % 3 === 2 && plain.length ? 'endpoint-add' : pick(KINDS);
        const i = step % 3 === 2 && plain.length ? pick(plain) : Math.floor(random() * N);
        const m = models[i];
        const dispatchSame = kind === 'endpoint-add' && plain.includes(i);
        if (kind === 'endpoint-add') m.eps.push(nextEp++);
        else if (kind === 'endpoint-remove') m.eps.splice(Math.floor(random() * m.eps.length), 1);
        else if (kind === 'service-add') m.exists = true;
        else if (kind === 'service-remove') m.exists = false;
        else if (kind === 'port') m.port = m.port === 80 ? 81 : 80;
        else if (kind === 'policy') m.etp = m.etp === 'Local' ? 'Cluster' : 'Local';
        else if (kind === 'type') m.type = m.type === 'NodePort' ? 'ClusterIP' : 'NodePort';
        else clock += 11_000; // the stale-chain cleanup is due at the next sync
        put(i);
        inputs.length = 0;
        const stats = await p.sync(planInput(t, config, family, nodeIPs), t.apply(), false);
        assert.match(stats.diff ?? '', /^partial sync/, `step ${step}`);
        if (dispatchSame) {
          endpointOnly++;
          assert.equal(inputs.length, 1, `step ${step}: one restore`);
          assert.doesNotMatch(inputs[0], /KUBE-SERVICES|KUBE-NODEPORTS|\*filter/, `step ${step}: an endpoint-only change leaves the dispatch chains and filter alone`);
          assert.match(inputs[0], /^:KUBE-SVC-/m);
        }
        const lingering = await compare(`IPv${family} step ${step} (${kind} on svc${i})`, !large);
        if (lingering) deferredSeen++;
      }
      assert.ok(endpointOnly >= 3, `the sequence has endpoint-only changes (${endpointOnly})`);
      if (large) {
        assert.ok(deferredSeen > 0, 'large-cluster mode deferred some deletions');
        // The cleanup comes due: the next sync (no change at all) deletes every deferred chain.
        clock += 11_000;
        await p.sync(planInput(t, config, family, nodeIPs), t.apply(), false);
        await compare(`IPv${family} after the cleanup`, true);
      }
    });
  }
}
