// Real kernel, in two namespaces this test creates: a partial sync that takes MANY changed
// Services at once (what the sync loop hands the proxier after coalescing a stream of
// changes: endpoints added and removed, Services added and removed, so stale chains to
// delete, a port changed) runs exactly ONE command, one iptables-restore (no iptables-save,
// no separate commit for the stale chains' deletion, no separate filter restore), and leaves
// nat and filter as a fresh proxier's full sync of the same state leaves them. Legacy
// (x_tables replaces the whole table at every commit: each extra commit costs ~1 s at 10k
// Services) and the machine's default backend, IPv4; both namespaces are removed in `after`,
// also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { hostRunner, type CommandRunner, type RunOptions, inputText } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { DEFAULT_FACTS } from '../../src/modes/iptables/options.ts';
import { IptablesProxier } from '../../src/modes/iptables/proxier.ts';
import { Netns, uniqueName } from '../support/netns.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';

let partNs: Netns;
let refNs: Netns;

before(() => {
  partNs = Netns.create(uniqueName('kpbp'));
  refNs = Netns.create(uniqueName('kpbr'));
});
after(async () => {
  await partNs?.destroy();
  await refNs?.destroy();
});

type Backend = 'default' | 'legacy';
const bin = (cmd: string, backend: Backend) => (backend === 'legacy' ? cmd.replace(/^(ip6?tables)/, '$1-legacy') : cmd);

/** Runs in a namespace and records every command (name and restore input). */
function nsRunner(ns: () => Netns, backend: Backend, calls: Array<{ cmd: string; input?: string }> = []): CommandRunner {
  return {
    run: (cmd: string, args: string[], opts?: RunOptions) => {
      calls.push({ cmd, input: opts?.input === undefined ? undefined : inputText(opts.input) });
      return hostRunner.run('ip', ['netns', 'exec', ns().name, bin(cmd, backend), ...args], { timeoutMs: 60_000, ...opts });
    },
  };
}

/** nat + filter without counters and comments, chains in name order, rules in chain order. */
function tableLines(ns: Netns, backend: Backend): string[] {
  const out: string[] = [];
  for (const t of ['nat', 'filter']) {
    for (const l of ns.exec(bin('iptables-save', backend), ['-t', t]).split('\n')) {
      if (l && !l.startsWith('#') && !l.startsWith('*') && l !== 'COMMIT') out.push(`${t} ${l.replace(/ \[\d+:\d+\]$/, '')}`);
    }
  }
  const chainOf = (l: string) => /^\S+ (?::|-A )(\S+)/.exec(l)?.[1] ?? '';
  const key = (l: string) => `${l.split(' ')[0]} ${chainOf(l)} ${l.split(' ')[1].startsWith(':') ? 0 : 1}`;
  return out.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0));
}

for (const backend of ['default', 'legacy'] as const) {
  for (const large of [false, true]) {
    test(`IPv4${backend === 'legacy' ? ' (legacy)' : ''}${large ? ', large-cluster mode' : ''}: a partial sync of 15 changed Services is one iptables-restore and leaves the kernel as a fresh full sync`, async () => {
      for (const ns of [partNs, refNs]) {
        for (const t of ['nat', 'filter']) {
          ns.exec(bin('iptables', backend), ['-w', '5', '-t', t, '-F'], { allowFail: true });
          ns.exec(bin('iptables', backend), ['-w', '5', '-t', t, '-X'], { allowFail: true });
        }
      }
      const config = testConfig({ syncPeriodMs: 10_000 });
      const facts = { 4: { ...DEFAULT_FACTS, largeClusterEndpointsThreshold: large ? 4 : 1000 } };
      let clock = 1_000_000;
      const now = () => clock;
      const calls: Array<{ cmd: string; input?: string }> = [];
      const p = new IptablesProxier({ runner: nsRunner(() => partNs, backend, calls), log: silentLogger(), config, facts, now });
      const t = tracker(4);
      const N = 30;
      const eps = new Map<number, number[]>();
      const svcObj = (i: number, port = 80) => svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.4.${i + 1}`, port, type: i % 3 ? 'ClusterIP' : 'NodePort', nodePort: i % 3 ? undefined : 30300 + i });
      const sliceObj = (i: number) => slice(`ns${i}`, `svc${i}`, 's', eps.get(i)!.map((e) => ({ ip: `10.180.${i}.${e}`, nodeName: e % 2 ? 'other' : 'test-node' })), [{ port: 8080 }]);
      const put = (i: number, change: (e: number[]) => void) => {
        const before = sliceObj(i);
        change(eps.get(i)!);
        t.endpoints.update(before, sliceObj(i));
      };
      for (let i = 0; i < N; i++) {
        eps.set(i, [1, 2, 3]);
        if (i >= N - 2) continue; // added by the batch below
        t.services.update(null, svcObj(i));
        t.endpoints.update(null, sliceObj(i));
      }
      await p.sync(planInput(t, config), t.apply(), true);

      // One batch: what a stream of changes leaves pending while a sync runs.
      for (let i = 0; i < 6; i++) put(i, (e) => e.push(4 + i)); // endpoint added
      for (let i = 6; i < 9; i++) put(i, (e) => e.splice(0, 1)); // endpoint removed
      put(9, (e) => e.splice(0, e.length)); // no endpoints left: REJECT
      for (const i of [10, 11]) { // Services removed: their chains become stale
        t.services.update(svcObj(i), null);
        t.endpoints.update(sliceObj(i), null);
      }
      t.services.update(svcObj(12), svcObj(12, 81)); // a port changed: new chains, old ones stale
      for (const i of [N - 2, N - 1]) { // Services added
        t.services.update(null, svcObj(i));
        t.endpoints.update(null, sliceObj(i));
      }
      const changed = t.apply();
      assert.equal(changed.size, 15);
      calls.length = 0;
      clock += 1_000; // within syncPeriod: no canary check
      const stats = await p.sync(planInput(t, config), changed, false);
      assert.match(stats.diff ?? '', /^partial sync/);
      assert.deepEqual(calls.map((c) => c.cmd), ['iptables-restore'], 'one command: one iptables-restore');
      assert.equal(calls[0].input!.match(/^COMMIT$/gm)?.length, calls[0].input!.includes('*filter') ? 2 : 1);
      if (!large) assert.match(calls[0].input!, /^-X KUBE-SVC-/m, 'the stale chains are deleted in the same restore');

      const compare = async (label: string, exact: boolean) => {
        const ref = new IptablesProxier({ runner: nsRunner(() => refNs, backend), log: silentLogger(), config, facts, now });
        await ref.sync(planInput(t, config), new Set(), true);
        const want = tableLines(refNs, backend);
        const got = tableLines(partNs, backend);
        if (exact) return assert.deepEqual(got, want, label);
        // large-cluster mode defers the stale chains' deletion: they are the only extra lines
        const wantSet = new Set(want);
        const extra = got.filter((l) => !wantSet.has(l));
        assert.ok(extra.every((l) => /^nat (:|-A )KUBE-(SVC|SEP|EXT|FW)-/.test(l)), `${label}: only stale service chains linger: ${extra.slice(0, 3).join(' | ')}`);
        assert.deepEqual(got.filter((l) => wantSet.has(l)), want, label);
        return extra.length;
      };
      const lingering = await compare('after the batch', !large);
      if (large) assert.ok(Number(lingering) > 0, 'large-cluster mode deferred the stale chains');
      if (large) {
        // the cleanup comes due: the next sync deletes the deferred chains, in one restore too
        clock += 11_000;
        t.services.update(svcObj(13), svcObj(13, 82));
        calls.length = 0;
        await p.sync(planInput(t, config), t.apply(), false);
        assert.deepEqual(calls.map((c) => c.cmd).filter((c) => c !== 'iptables'), ['iptables-restore'], 'one restore (and at most the canary check)');
        assert.match(calls.find((c) => c.cmd === 'iptables-restore')!.input!, /^-X KUBE-SVC-/m);
        await compare('after the cleanup', true);
      }
    });
  }
}
