// Partial syncs that leave out unchanged chains (skipUnchangedChains) must leave the kernel
// exactly as a full sync of the same state would; an endpoint-only change must write a
// constant number of rules whatever the number of services. Also the executor's time limit
// and the batched jump rules.
import { test, mock } from 'node:test';
import assert from 'node:assert/strict';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { IptablesExecutor, RestoreError, restoreTimeoutMs } from '../../src/kernel/iptables/exec.ts';
import type { CommandRunner, RunOptions } from '../../src/kernel/runner.ts';
import type { Sysctl } from '../../src/kernel/sysctl.ts';
import { buildNodeView, type NodeView } from '../../src/core/nodeview.ts';
import { IptablesProxier, JUMP_RULES, KUBELET_JUMP_RULES } from '../../src/modes/iptables/proxier.ts';
import { silentLogger } from '../../src/log.ts';
import { FakeIptables } from '../../src/kernel/iptables/fake.ts';
import { optionsFromConfig } from '../../src/modes/iptables/options.ts';
import { ownerOfPayloadLine } from '../../src/modes/iptables/blocks.ts';
import { planFull, withText } from '../../src/modes/iptables/full.ts';
import { planPartialFast } from '../../src/modes/iptables/partial-fast.ts';
import { IptablesSyncState } from '../../src/modes/iptables/sync-state.ts';
import { planInput, slice, svc, testConfig, tracker } from './helpers.ts';
import { kernelState, rng } from '../support/iptables-state.ts';

interface Model {
  exists: boolean;
  port: number;
  type: 'ClusterIP' | 'NodePort' | 'LoadBalancer';
  etp: 'Local' | 'Cluster';
  eps: string[];
  svcObj: K8sService | null;
  sliceObj: K8sEndpointSlice | null;
}

function svcOf(i: number, m: Model): K8sService {
  return svc(`ns${i}`, `svc${i}`, {
    clusterIP: `172.30.1.${i + 1}`,
    port: m.port,
    type: m.type,
    nodePort: m.type === 'ClusterIP' ? undefined : 30000 + i,
    etp: m.type === 'ClusterIP' ? undefined : m.etp,
    lbIPs: m.type === 'LoadBalancer' ? [`1.2.3.${i + 1}`] : undefined,
    sourceRanges: m.type === 'LoadBalancer' && i % 2 ? ['203.0.113.0/25'] : undefined,
  });
}

function sliceOf(i: number, m: Model): K8sEndpointSlice {
  // Every third endpoint is on this node, so Local policies have local endpoints sometimes.
  const eps = m.eps.map((ip) => ({ ip, nodeName: Number(ip.split('.')[3]) % 3 === 0 ? 'test-node' : 'other' }));
  return slice(`ns${i}`, `svc${i}`, `svc${i}-1`, eps, [{ port: 8080 }]);
}

test('60 seeded random changes with partial syncs leave the kernel as a fresh full sync would', async () => {
  const random = rng(20261202);
  const pick = <T>(xs: T[]): T => xs[Math.floor(random() * xs.length)];
  const config = testConfig();
  const k = new FakeIptables();
  const p = new IptablesProxier({ runner: k, log: silentLogger(), config });
  const t = tracker();
  const N = 12;
  const models: Model[] = [];
  let nextEp = 1;
  const newEp = () => `10.180.${nextEp >> 8}.${nextEp++ & 255}`;
  const put = (i: number) => {
    const m = models[i];
    const s = m.exists ? svcOf(i, m) : null;
    const e = m.exists && m.eps.length ? sliceOf(i, m) : null;
    if (m.svcObj || s) t.services.update(m.svcObj, s);
    if (m.sliceObj || e) t.endpoints.update(m.sliceObj, e);
    m.svcObj = s;
    m.sliceObj = e;
  };
  for (let i = 0; i < N; i++) {
    models.push({ exists: i < 8, port: 80, type: pick(['ClusterIP', 'NodePort', 'LoadBalancer']), etp: 'Cluster', eps: [newEp(), newEp()], svcObj: null, sliceObj: null });
    put(i);
  }
  await p.sync(planInput(t, config), t.apply(), true);

  const kinds = ['endpoint-add', 'endpoint-remove', 'service-add', 'service-remove', 'port', 'policy', 'type'] as const;
  const seen = new Map<string, number>();
  let partialWithoutTopChains = 0;
  for (let step = 0; step < 60; step++) {
    const kind = pick([...kinds]);
    const i = Math.floor(random() * N);
    const m = models[i];
    if (kind === 'endpoint-add') m.eps.push(newEp());
    else if (kind === 'endpoint-remove') m.eps.splice(Math.floor(random() * m.eps.length), 1);
    else if (kind === 'service-add') m.exists = true;
    else if (kind === 'service-remove') m.exists = false;
    else if (kind === 'port') m.port = m.port === 80 ? 81 : 80;
    else if (kind === 'policy') m.etp = m.etp === 'Local' ? 'Cluster' : 'Local';
    else m.type = pick(['ClusterIP', 'NodePort', 'LoadBalancer']);
    seen.set(kind, (seen.get(kind) ?? 0) + 1);
    put(i);
    // One injected failure (on a change that surely writes): the next sync must be full and
    // rebuild the digests.
    if (step === 30) {
      const j = models.findIndex((x) => x.exists);
      models[j].eps.push(newEp());
      put(j);
      k.failNextRestoreAtLine = 2;
      await assert.rejects(p.sync(planInput(t, config), t.apply(), false), /KPROXY_IPTABLES_RESTORE_FAILED/);
      continue;
    }
    const before = k.calls.length;
    const stats = await p.sync(planInput(t, config), t.apply(), false);
    const restores = k.calls.slice(before).filter((c) => c.cmd === 'iptables-restore');
    if (/^partial/.test(stats.diff ?? '') && !restores.some((c) => c.input?.includes(':KUBE-SERVICES '))) partialWithoutTopChains++;

    const fresh = new FakeIptables();
    await new IptablesProxier({ runner: fresh, log: silentLogger(), config }).sync(planInput(t, config), new Set(), true);
    assert.equal(kernelState(k), kernelState(fresh), `step ${step} (${kind} on svc${i})`);
  }
  for (const kind of kinds) assert.ok((seen.get(kind) ?? 0) > 0, `the sequence has ${kind} changes`);
  assert.ok(partialWithoutTopChains >= 10, `partial syncs left KUBE-SERVICES out ${partialWithoutTopChains} times`);
});

/** The asks of a sysctl that always reads 0: what a sync wants set, once per sync. */
function askedSysctls(): { sysctl: Sysctl; asked: string[] } {
  const asked: string[] = [];
  return { asked, sysctl: { get: async () => '0', set: async (name, value) => void asked.push(`${name}=${value}`) } };
}

/** Counts the walks over a Map (values, keys, entries, forEach, for...of) from now on. */
function countWalks(m: Map<string, unknown>): { n: number } {
  const count = { n: 0 };
  for (const name of ['values', 'keys', 'entries', 'forEach', Symbol.iterator] as const) {
    const own = Map.prototype[name] as (...a: unknown[]) => unknown;
    Object.defineProperty(m, name, { configurable: true, value: function (this: Map<string, unknown>, ...a: unknown[]) { count.n++; return own.apply(this, a); } });
  }
  return count;
}

for (const family of [4, 6] as const) {
  test(`IPv${family}: partial syncs planned from the node view's per-Service ports (endpoint change, port added, port removed, Services removed and added) leave the kernel as a fresh full sync`, async () => {
    const v6 = family === 6;
    const cluster = (i: number) => (v6 ? `fd00:172:30::7:${i + 1}` : `172.30.7.${i + 1}`);
    const epIP = (i: number, e: number) => (v6 ? `fd00:10:180::7:${i * 16 + e}` : `10.180.7.${i * 16 + e}`);
    const nodeIPs = [v6 ? 'fd00:192::2' : '192.168.0.2'];
    const config = testConfig();
    const k = new FakeIptables(family);
    const { sysctl, asked } = askedSysctls();
    const p = new IptablesProxier({ runner: k, log: silentLogger(), config, sysctl });
    const t = tracker(family);
    const svcs: Array<K8sService | null> = [];
    const slices: Array<K8sEndpointSlice | null> = [];
    const put = (i: number, s: K8sService | null, e: K8sEndpointSlice | null) => {
      if (svcs[i] || s) t.services.update(svcs[i] ?? null, s);
      if (slices[i] || e) t.endpoints.update(slices[i] ?? null, e);
      svcs[i] = s;
      slices[i] = e;
    };
    const p81 = [{ name: 'p81', port: 81, protocol: 'TCP' as const }];
    const service = (i: number, o: { nodePort?: boolean; twoPorts?: boolean } = {}) =>
      svc(`ns${i}`, `svc${i}`, { clusterIP: cluster(i), type: o.nodePort ? 'NodePort' : 'ClusterIP', nodePort: o.nodePort ? 30700 + i : undefined, extraPorts: o.twoPorts ? p81 : undefined });
    const endpoints = (i: number, n: number, twoPorts = false) =>
      slice(`ns${i}`, `svc${i}`, 's', Array.from({ length: n }, (_, e) => ({ ip: epIP(i, e + 1) })), [{ port: 8080 }, ...(twoPorts ? [{ name: 'p81', port: 8081 }] : [])], family);
    put(0, service(0), endpoints(0, 2));
    put(1, service(1, { nodePort: true }), endpoints(1, 1));
    put(2, service(2, { twoPorts: true }), endpoints(2, 2, true));
    put(3, service(3), endpoints(3, 3));
    // As the sync loop (src/sync/controller.ts planInput): the node view of a partial sync is
    // built from the last one for the changed services only.
    let view: NodeView | undefined;
    const sync = async (full: boolean) => {
      const changed = t.apply();
      const base = planInput(t, config, family, nodeIPs);
      const changes = full ? undefined : { services: changed, portKeysOf: (key: string) => t.services.portKeysOf(key) };
      view = buildNodeView(base, changes && view, changes);
      asked.length = 0;
      const before = k.calls.length;
      const stats = await p.sync({ ...base, view }, changed, full);
      return { stats, restores: k.calls.slice(before).filter((c) => c.cmd.endsWith('-restore')).map((c) => c.input ?? '') };
    };
    await sync(true);
    const walks = countWalks(t.state.services);
    const steps: Array<[string, () => void]> = [
      ['endpoint change', () => put(0, svcs[0], endpoints(0, 3))],
      ['port added', () => put(0, service(0, { twoPorts: true }), endpoints(0, 3, true))],
      ['port removed', () => put(2, service(2), endpoints(2, 2))],
      ['the only NodePort Service removed', () => put(1, null, null)],
      ['a NodePort Service added', () => put(4, service(4, { nodePort: true }), endpoints(4, 2))],
      ['a Service removed', () => put(3, null, null)],
      ['a Service added', () => put(5, service(5), endpoints(5, 1))],
      ['Services added and removed in one sync', () => {
        put(6, service(6, { nodePort: true }), endpoints(6, 1));
        put(7, service(7, { twoPorts: true }), endpoints(7, 2, true));
        put(2, null, null);
        put(8, service(8), endpoints(8, 1));
      }],
    ];
    const askedAt = new Map<string, string[]>();
    for (const [label, change] of steps) {
      change();
      walks.n = 0;
      const { stats, restores } = await sync(false);
      assert.match(stats.diff ?? '', /^partial sync/, label);
      // the fast path edits the dispatch chains in place: it never declares (rewrites) them
      assert.equal(restores.length, 1, label);
      assert.doesNotMatch(restores[0], /^:KUBE-(SERVICES|NODEPORTS) /m, label);
      // An endpoint change visits only that Service's ports: no walk over the Services (a
      // Service or port added or removed moves dispatch rules, which are placed by a walk).
      if (label === 'endpoint change') assert.equal(walks.n, 0, `${label}: walks over the state's Services`);
      const partialAsked = [...asked];
      askedAt.set(label, partialAsked);
      const fresh = new FakeIptables(family);
      const ref = askedSysctls();
      await new IptablesProxier({ runner: fresh, log: silentLogger(), config, sysctl: ref.sysctl }).sync({ ...planInput(t, config, family, nodeIPs) }, new Set(), true);
      assert.equal(kernelState(k), kernelState(fresh), label);
      assert.deepEqual(partialAsked, ref.asked, `${label}: route_localnet as a full sync asks it`);
    }
    // IPv4 (localhost NodePorts): route_localnet goes with the only NodePort Service and comes back with the next one
    const localnet = v6 ? [] : ['net.ipv4.conf.all.route_localnet=1'];
    assert.deepEqual(askedAt.get('port removed'), localnet);
    assert.deepEqual(askedAt.get('the only NodePort Service removed'), []);
    assert.deepEqual(askedAt.get('a NodePort Service added'), localnet);
  });
}

async function endpointChange(n: number) {
  const config = testConfig();
  const k = new FakeIptables();
  const p = new IptablesProxier({ runner: k, log: silentLogger(), config });
  const t = tracker();
  const slices: K8sEndpointSlice[] = [];
  for (let i = 0; i < n; i++) {
    t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.${i >> 8}.${i & 255}`, type: 'NodePort', nodePort: 30000 + i }));
    slices.push(slice(`ns${i}`, `svc${i}`, 's', [{ ip: `10.180.${i >> 8}.${i & 255}` }, { ip: `10.181.${i >> 8}.${i & 255}` }], [{ port: 8080 }]));
    t.endpoints.update(null, slices[i]);
  }
  await p.sync(planInput(t, config), t.apply(), true);
  const i = Math.floor(n / 2);
  t.endpoints.update(slices[i], slice(`ns${i}`, `svc${i}`, 's', [{ ip: `10.180.${i >> 8}.${i & 255}` }, { ip: `10.182.${i >> 8}.${i & 255}` }], [{ port: 8080 }]));
  const before = k.calls.length;
  const stats = await p.sync(planInput(t, config), t.apply(), false);
  const payloads = k.calls.slice(before).filter((c) => c.cmd === 'iptables-restore').map((c) => c.input ?? '');
  assert.equal(payloads.length, 1);
  return { stats, payload: payloads[0] };
}

test('an endpoint-only change writes only that service\'s chains: constant in N, no KUBE-SERVICES', async () => {
  const small = await endpointChange(100);
  const big = await endpointChange(2000);
  for (const { payload } of [small, big]) {
    assert.doesNotMatch(payload, /^:KUBE-(SERVICES|NODEPORTS|POSTROUTING|MARK-MASQ|FORWARD) /m, payload);
    assert.doesNotMatch(payload, /^\*filter/m, 'the filter table did not change');
    assert.match(payload, /^:KUBE-SVC-/m);
  }
  // (At 2000 services, 4000 endpoints, large-cluster mode defers stale-chain deletion.)
  assert.match(small.payload, /^-X KUBE-SEP-/m, 'the removed endpoint chain goes');
  // KUBE-SVC (1 masq + 2 endpoints) and the new KUBE-SEP (2); KUBE-EXT is unchanged.
  assert.equal(small.stats.rulesWritten, 5);
  assert.equal(big.stats.rulesWritten, small.stats.rulesWritten);
  assert.equal(big.stats.rulesTotal, 2000 * 11 + 5);
});

test('a restore killed at its time limit says so; the limit grows with the payload', async () => {
  assert.equal(restoreTimeoutMs(10), 63_000);
  assert.equal(restoreTimeoutMs(135_000), 465_000);
  assert.equal(restoreTimeoutMs(5_000_000), 600_000);
  let limit = 0;
  const killed: CommandRunner = {
    async run(_cmd: string, _args: string[], opts: RunOptions = {}) {
      limit = opts.timeoutMs ?? 0;
      // As if the limit passed: the runner's SIGKILL gives code 128 and no output.
      const now = Date.now();
      mock.method(Date, 'now', () => now + limit);
      return { code: 128, stdout: '', stderr: '' };
    },
  };
  const payload = '*nat\n' + ':KUBE-X - [0:0]\n'.repeat(3000) + 'COMMIT\n';
  try {
    await assert.rejects(new IptablesExecutor(killed, 4).restore(payload), (e: unknown) => {
      assert.ok(e instanceof RestoreError);
      assert.match(e.message, /^KPROXY_IPTABLES_RESTORE_TIMEOUT: iptables-restore did not finish within 72s \(payload of 3002 lines\); the previous rules stay in place; /);
      return true;
    });
  } finally {
    mock.restoreAll();
  }
  assert.equal(limit, 72_000);
  // An ordinary failure keeps its own message.
  const failing: CommandRunner = { run: async () => ({ code: 2, stdout: '', stderr: 'iptables-restore: line 2 failed' }) };
  await assert.rejects(new IptablesExecutor(failing, 4).restore(payload), /KPROXY_IPTABLES_RESTORE_FAILED: .*exit 2/);
});

test('jump rules: one iptables-save and at most one restore per full sync, same rules as one by one', async () => {
  const config = testConfig();
  const k = new FakeIptables();
  // Someone else's rule at the top of INPUT stays below ours, as with iptables -I.
  await k.run('iptables', ['-t', 'filter', '-I', 'INPUT', '-j', 'ACCEPT']);
  // One of our jumps already there (from a previous kproxy): not duplicated.
  const nat = JUMP_RULES.find((j) => j.table === 'nat' && j.src === 'PREROUTING')!;
  await k.run('iptables', ['-t', 'nat', '-N', nat.dst]);
  await k.run('iptables', ['-t', 'nat', '-I', 'PREROUTING', '-m', 'comment', '--comment', nat.comment, '-j', nat.dst]);
  const p = new IptablesProxier({ runner: k, log: silentLogger(), config });
  const t = tracker();
  t.services.update(null, svc('ns1', 'svc1', { clusterIP: '172.30.0.41' }));
  t.endpoints.update(null, slice('ns1', 'svc1', 's1', [{ ip: '10.180.0.1' }], [{ port: 80 }]));
  await p.sync(planInput(t, config), t.apply(), true);
  // (plus one `iptables --version`: the backend decides whether full syncs are chunked)
  const iptablesCalls = k.calls.filter((c) => c.cmd === 'iptables' && c.args[0] !== '--version');
  assert.equal(iptablesCalls.length, 3, 'only the three calls of this test itself: no iptables -N/-C/-I');
  assert.equal(k.calls.filter((c) => c.args[0] === '--version').length, 1);
  assert.deepEqual(k.rules('nat', 'PREROUTING'), [`-m comment --comment "${nat.comment}" -j ${nat.dst}`]);
  // Upstream's order: each rule inserted at the top, in JUMP_RULES order, kubelet's last.
  const input = k.rules('filter', 'INPUT');
  assert.deepEqual(input.map((r) => /(?:^| )-j (\S+)/.exec(r)?.[1]), ['KUBE-FIREWALL', 'KUBE-PROXY-FIREWALL', 'KUBE-NODEPORTS', 'KUBE-EXTERNAL-SERVICES', 'ACCEPT']);
  for (const j of [...JUMP_RULES, ...KUBELET_JUMP_RULES]) assert.equal(k.rules(j.table, j.src).filter((r) => r.endsWith(`-j ${j.dst}`)).length, 1, `${j.src} -> ${j.dst}`);
  for (const table of ['mangle', 'nat', 'filter']) assert.ok(k.chains(table).includes('KUBE-PROXY-CANARY'), table);

  // A second full sync finds everything: one save (it also tells the installed chains), no
  // jump restore, and no restore at all: every chain is installed as planned (restart form).
  const before = k.calls.length;
  await p.sync(planInput(t, config), new Set(), true);
  const calls = k.calls.slice(before);
  assert.deepEqual(calls.map((c) => `${c.cmd} ${c.args.filter((a) => a !== '-w' && a !== '5').join(' ')}`.trim()), [
    'iptables-save',
  ]);
});

test('the fast partial plan: an endpoint change writes no dispatch chain, a new Service inserts its dispatch rules in place', async () => {
  const config = testConfig();
  const t = tracker();
  const slices: K8sEndpointSlice[] = [];
  for (let i = 0; i < 20; i++) {
    t.services.update(null, svc(`ns${i}`, `svc${i}`, { clusterIP: `172.30.9.${i + 1}`, type: 'NodePort', nodePort: 30400 + i }));
    slices.push(slice(`ns${i}`, `svc${i}`, 's', [{ ip: `10.180.9.${i + 1}` }], [{ port: 8080 }]));
    t.endpoints.update(null, slices[i]);
  }
  const input = planInput(t, config);
  const opts = optionsFromConfig(config, input.node);
  const s = new IptablesSyncState({ skipUnchangedChains: true });
  s.installedNatChains = new Set();
  const full = withText(s.plan(t.state, opts, t.apply(), true));
  s.commit(full);
  // An endpoint replaced: only svc3's KUBE-SVC and the new KUBE-SEP, the old KUBE-SEP deleted.
  t.endpoints.update(slices[3], slice('ns3', 'svc3', 's', [{ ip: '10.180.9.99' }], [{ port: 8080 }]));
  const changed = t.apply();
  const partial = withText(s.plan(t.state, opts, changed, false));
  assert.equal(partial.applied.kind, 'update', 'the fast path planned it');
  assert.equal(partial.writtenServices, 1);
  assert.equal(partial.deletedChains.length, 1);
  assert.equal(partial.natRulesTotal, full.natRulesTotal);
  assert.doesNotMatch(partial.payload, /KUBE-SERVICES|KUBE-NODEPORTS|\*filter/);
  s.commit(partial);
  // A new service: its dispatch rules are inserted where a full sync puts them (sorted by
  // key: nsx/svcx after ns9/svc9, i.e. after the other 20 services' one rule each in nat
  // KUBE-SERVICES and KUBE-NODEPORTS), nothing else in those chains is rewritten.
  t.services.update(null, svc('nsx', 'svcx', { clusterIP: '172.30.9.200', type: 'NodePort', nodePort: 30499 }));
  t.endpoints.update(null, slice('nsx', 'svcx', 's', [{ ip: '10.180.9.200' }], [{ port: 8080 }]));
  const added = t.apply();
  const next = withText(s.plan(t.state, opts, added, false));
  assert.equal(next.applied.kind, 'update', 'the fast path planned it');
  assert.doesNotMatch(next.payload, /^:KUBE-(SERVICES|NODEPORTS) /m);
  assert.match(next.payload, /^-I KUBE-SERVICES 21 .*-d 172\.30\.9\.200 .*-j KUBE-SVC-/m);
  assert.match(next.payload, /^-I KUBE-NODEPORTS 21 .*--dport 30499 -j KUBE-EXT-/m);
  // A refused inserted line names its Service (isolation excludes it and retries at once).
  const inserted = next.payload.split('\n').find((l) => l.startsWith('-I KUBE-SERVICES '))!;
  assert.equal(ownerOfPayloadLine(t.state, opts, inserted, s.blocks)?.serviceKey, 'nsx/svcx');
  // 2 dispatch rules, KUBE-SVC (masquerade, 1 endpoint), KUBE-SEP (2), KUBE-EXT (2)
  assert.equal(next.natRulesTotal, full.natRulesTotal + 8);
  assert.equal(next.natRulesTotal, planFull({ state: t.state, opts }).natRulesTotal);
  s.commit(next);
  // Too many services' dispatch rules at once: the full scan rewrites the chains.
  for (let i = 0; i < 201; i++) t.services.update(null, svc(`nsy${i}`, 'svc', { clusterIP: `172.30.10.${i + 1}` }));
  const many = t.apply();
  const applied = (s as unknown as { applied: Parameters<typeof planPartialFast>[0]['applied'] }).applied;
  assert.equal(planPartialFast({ state: t.state, opts, applied, cache: s.blocks, deferStale: true, deferred: new Set() }), null);
  const rewrite = withText(s.plan(t.state, opts, many, false));
  assert.equal(rewrite.applied.kind, 'replace');
  assert.match(rewrite.payload, /^:KUBE-SERVICES /m);
});
