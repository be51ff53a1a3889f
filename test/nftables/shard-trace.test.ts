// The tracer over several kube-proxy tables (the Services spread over shard tables
// `kube-proxy-<n>`, each a complete copy of upstream's table holding only its Services). Pure:
// every probe packet (each dispatched address, from a pod, the node and an outside client)
// ends the same way — endpoints or verdict, masquerade — through the shards walked together
// as through upstream's single table for the whole state. Real kernel (`kproxy trace --live`):
// the tables two proxiers wrote into a namespace (uniqueName(), removed in `after`) are read
// back and walked together; `render` and the planned trace plan the shards from 1,000 Services.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import type { ProxyState } from '../../src/core/model.ts';
import { hostRunner, runChecked, type CommandRunner } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { probePackets } from '../../src/modes/nftables/conformance.ts';
import { shardOf, shardTable } from '../../src/modes/nftables/names.ts';
import { optionsFromInput, planRuleset } from '../../src/modes/nftables/plan.ts';
import { chooseTables, planShardedRulesets } from '../../src/modes/nftables/shards.ts';
import { fullTransaction } from '../../src/modes/nftables/transaction.ts';
import { kubeProxyTables, traceNft, traceRuleset } from '../../src/modes/nftables/trace.ts';
import { mode } from '../../src/modes/nftables/index.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { renderOps } from '../../src/kernel/nft/model.ts';
import { uniqueName } from '../support/netns.ts';
import { clientIPAffinity, lbStatus, makeService, makeSlice } from '../support/builders.ts';

const NS = uniqueName('kpt-nft-sht');
const NODE = { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 as const };
const K = 3;
const N = 15;

function service(i: number): K8sService {
  const kind = i % 5;
  return makeService('ns', `svc${i}`, {
    type: kind === 0 ? 'ClusterIP' : 'LoadBalancer',
    clusterIP: `172.30.0.${i + 1}`,
    ports: [{ name: 'http', protocol: i % 7 === 3 ? 'UDP' : 'TCP', port: 80, ...(kind === 0 ? {} : { nodePort: 30000 + i }) }],
    externalTrafficPolicy: kind === 2 ? 'Local' : 'Cluster',
    ...(kind === 3 ? clientIPAffinity(60) : {}),
    ...(kind === 4 ? { loadBalancerSourceRanges: ['203.0.113.0/24'] } : {}),
  }, kind === 0 ? undefined : lbStatus(`1.2.3.${i + 1}`));
}

function slice(i: number): K8sEndpointSlice {
  // every fourth Service has no endpoints (REJECT); the others 1–3, some on this node
  const n = i % 4 === 1 ? 0 : 1 + (i % 3);
  return makeSlice('ns', `svc${i}`, {
    name: `svc${i}-x`,
    endpoints: Array.from({ length: n }, (_, k) => ({ ip: `10.180.${i}.${k + 1}`, node: k % 2 === 0 ? 'node-a' : 'node-b', ready: true })),
    ports: [{ name: 'http', port: 8080, protocol: i % 7 === 3 ? 'UDP' : 'TCP' }],
  });
}

function fixture(): PlanInput {
  const tracker = new ProxyStateTracker(4, NODE.nodeName);
  for (let i = 0; i < N; i++) {
    tracker.services.update(null, service(i));
    tracker.endpoints.update(null, slice(i));
  }
  tracker.apply();
  return { state: tracker.state, config: resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' }), node: NODE };
}

/** The state restricted to shard s's Services. */
function shardState(state: ProxyState, s: number): ProxyState {
  const out: ProxyState = { services: new Map(), endpoints: new Map() };
  for (const [k, sp] of state.services) {
    if (shardOf(sp.serviceKey, K) !== s) continue;
    out.services.set(k, sp);
    const eps = state.endpoints.get(k);
    if (eps) out.endpoints.set(k, eps);
  }
  return out;
}

before(async () => {
  await runChecked(hostRunner, 'ip', ['netns', 'add', NS], { timeoutMs: 10_000 });
});

after(async () => {
  await hostRunner.run('ip', ['netns', 'del', NS], { timeoutMs: 10_000 });
});

test('every probe packet ends the same way through the shard tables walked together as through the single table', () => {
  const input = fixture();
  const o = optionsFromInput(input);
  const single = planRuleset(input.state, o);
  const shards = Array.from({ length: K }, (_, s) => planRuleset(shardState(input.state, s), { ...o, table: shardTable(s) }));
  for (const [s, rs] of shards.entries()) assert.ok(rs.sets.get('cluster-ips')!.elements.size > 0, `shard ${s} holds Services`);
  // the text as `nft -f` would get it (one transaction), read back as several tables
  const text = shards.map((rs) => renderOps(fullTransaction(rs, null).ops)).join('');
  assert.deepEqual(kubeProxyTables(text, 'ip').map((rs) => rs.table), ['kube-proxy-0', 'kube-proxy-1', 'kube-proxy-2']);
  const packets = probePackets([single], o);
  assert.ok(packets.length >= 3 * 2 * N, `${packets.length} probe packets`);
  const kinds = new Set<string>();
  for (const p of packets) {
    const want = traceRuleset(single, p, { localIPs: NODE.nodeIPs });
    const got = traceNft(text, p, { localIPs: NODE.nodeIPs });
    const what = `${p.sourceIP} -> ${p.destIP}:${p.destPort}/${p.protocol}`;
    assert.equal(got.output, want.output, `${what}: ${got.rules.join('\n')}`);
    assert.equal(got.masq, want.masq, `${what}: masquerade`);
    assert.deepEqual(got.notes, [], `${what}: nothing the tracer could not read`);
    kinds.add(want.output === 'REJECT' || want.output === 'DROP' || want.output === '' ? want.output || 'none' : 'endpoints');
    if (want.masq) kinds.add('masq');
    // the rules shown name the table of the Service's shard
    const owner = shardOf(`ns/svc${Number(/172\.30\.0\.(\d+)|1\.2\.3\.(\d+)/.exec(p.destIP)?.slice(1).find(Boolean) ?? 0) - 1}`, K);
    if (got.output && /^(172\.30|1\.2\.3)\./.test(p.destIP)) assert.ok(got.rules.some((r) => r.startsWith(`kube-proxy-${owner} `)), `${what}: a rule of kube-proxy-${owner}`);
  }
  for (const k of ['endpoints', 'REJECT', 'DROP', 'masq']) assert.ok(kinds.has(k), `the probes cover ${k}`);
});

test('kproxy trace --live walks every kube-proxy table in the kernel', async () => {
  const input = fixture();
  const runner: CommandRunner = { run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', NS, cmd, ...args], opts) };
  const p = new NftProxier({ runner, log: silentLogger(), shards: { threshold: 1, perTable: 1, maxTables: K } });
  await p.sync(input, new Set(), true);
  assert.equal(p.shardCount, K);
  const single = planRuleset(input.state, optionsFromInput(input));
  let checked = 0;
  for (let i = 0; i < N; i++) {
    const req = { from: '203.0.113.7', to: `172.30.0.${i + 1}`, port: 80, protocol: (i % 7 === 3 ? 'UDP' : 'TCP') as 'TCP' | 'UDP', live: true };
    const got = await mode.trace!(req, { runner });
    const want = traceRuleset(single, { sourceIP: req.from, protocol: req.protocol, destIP: req.to, destPort: 80 }, { localIPs: NODE.nodeIPs });
    assert.equal(got.output, want.output, `svc${i}`);
    assert.equal(got.masq, want.masq, `svc${i}: masquerade`);
    assert.ok(got.rules.some((r) => r.startsWith(`${shardTable(shardOf(`ns/svc${i}`, K))} `)), `svc${i}: walked in its table`);
    checked++;
  }
  assert.equal(checked, N);
});

test('render and the planned trace follow the mode: one table below 1,000 Services, the shards from 1,000', async () => {
  const big = (n: number): PlanInput => {
    const tracker = new ProxyStateTracker(4, NODE.nodeName);
    for (let i = 0; i < n; i++) {
      tracker.services.update(null, { ...service(0), metadata: { namespace: 'big', name: `s${i}` }, spec: { ...service(0).spec!, clusterIP: `172.31.${i >> 8}.${i & 255}` } });
      tracker.endpoints.update(null, { ...slice(0), metadata: { namespace: 'big', name: `s${i}-x`, labels: { 'kubernetes.io/service-name': `s${i}` } } });
    }
    tracker.apply();
    return { state: tracker.state, config: resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' }), node: NODE };
  };
  const small = big(999);
  assert.deepEqual(planShardedRulesets(small.state, optionsFromInput(small)).map((rs) => rs.table), ['kube-proxy']);
  assert.deepEqual(kubeProxyTables(mode.render(small), 'ip').map((rs) => rs.table), ['kube-proxy']);

  const input = big(1000);
  const o = optionsFromInput(input);
  const shards = planShardedRulesets(input.state, o);
  assert.deepEqual(shards.map((rs) => rs.table), ['kube-proxy-0', 'kube-proxy-1']);
  // every Service in exactly the table shardOf names
  for (const [s, rs] of shards.entries()) {
    const ips = [...rs.sets.get('cluster-ips')!.elements.values()].map((el) => el.key[0]);
    assert.ok(ips.length > 300, `kube-proxy-${s}: ${ips.length} ClusterIPs`);
    for (const ip of ips) {
      const [, , a, b] = ip.split('.').map(Number);
      assert.equal(shardOf(`big/s${a * 256 + b}`, 2), s, ip);
    }
  }
  assert.equal(shards.reduce((n, rs) => n + rs.sets.get('cluster-ips')!.elements.size, 0), 1000);
  assert.deepEqual(kubeProxyTables(mode.render(input), 'ip').map((rs) => rs.table), ['kube-proxy-0', 'kube-proxy-1']);
  // the planned trace walks the shards: the same endpoints as through one table
  const single = planRuleset(input.state, o);
  for (const i of [0, 1, 2, 500, 999]) {
    const to = `172.31.${i >> 8}.${i & 255}`;
    const got = await mode.trace!({ from: '10.0.0.5', to, port: 80, protocol: 'TCP', input, live: false }, { runner: hostRunner });
    const want = traceRuleset(single, { sourceIP: '10.0.0.5', protocol: 'TCP', destIP: to, destPort: 80 }, { localIPs: NODE.nodeIPs });
    assert.ok(want.output.includes(':8080'), `s${i}: ${want.output}`);
    assert.equal(got.output, want.output, `s${i}`);
    assert.ok(got.rules.some((r) => r.startsWith(`kube-proxy-${shardOf(`big/s${i}`, 2)} `)), `s${i}: in its table`);
  }
});

test('the number of tables never exceeds maxTables', () => {
  assert.equal(chooseTables(5000, 0, { threshold: 1000, perTable: 600, maxTables: 1 }), 1);
  assert.equal(chooseTables(5000, 4, { threshold: 1000, perTable: 600, maxTables: 1 }), 1);
  assert.equal(chooseTables(5000, 0, { threshold: 1000, perTable: 600, maxTables: 3 }), 3);
  assert.equal(chooseTables(50_000, 2, { threshold: 1000, perTable: 600, maxTables: 3 }), 3);
});

// The order the kernel runs base chains of several tables at one hook (checked against the
// kernel in sharded-policies-kernel.test.ts): by priority; at equal priority the chain
// registered last first (tables in creation order: the text's); the first DNAT binds.
test('across tables the tracer runs chains by priority, equal priorities last-created table first, the first DNAT binding', () => {
  const text = [
    'add table ip kube-proxy-0',
    'add chain ip kube-proxy-0 fwd { type filter hook forward priority 0 ; }',
    'add rule ip kube-proxy-0 fwd ip daddr 10.9.0.1 reject',
    'add rule ip kube-proxy-0 fwd ip daddr 10.9.0.2 reject',
    'add chain ip kube-proxy-0 late { type filter hook forward priority 10 ; }',
    'add rule ip kube-proxy-0 late ip daddr 10.9.0.3 drop',
    'add chain ip kube-proxy-0 nat { type nat hook prerouting priority -100 ; }',
    'add rule ip kube-proxy-0 nat ip daddr 10.9.1.1 dnat to 10.180.0.1:80',
    'add table ip kube-proxy-1',
    'add chain ip kube-proxy-1 fwd { type filter hook forward priority 0 ; }',
    'add rule ip kube-proxy-1 fwd ip daddr 10.9.0.1 drop',
    'add rule ip kube-proxy-1 fwd ip daddr 10.9.0.3 reject',
    'add chain ip kube-proxy-1 nat { type nat hook prerouting priority -100 ; }',
    'add rule ip kube-proxy-1 nat ip daddr 10.9.1.1 dnat to 10.180.0.2:80',
    'add rule ip kube-proxy-1 nat ip daddr 10.9.1.2 dnat to 10.180.0.3:80',
    '',
  ].join('\n');
  const at = (destIP: string) => traceNft(text, { sourceIP: '203.0.113.1', protocol: 'tcp', destIP, destPort: 80 }, { localIPs: [] });
  // equal priority: kube-proxy-1 (created last) first
  assert.equal(at('10.9.0.1').output, 'DROP');
  assert.match(at('10.9.0.1').rules[0], /^kube-proxy-1 fwd: /);
  // an accept-less fall-through goes on to the other table
  assert.equal(at('10.9.0.2').output, 'REJECT');
  // priority 0 before priority 10, whatever the table
  assert.equal(at('10.9.0.3').output, 'REJECT');
  // the first DNAT binds: kube-proxy-1's nat chain runs first, kube-proxy-0's is skipped
  assert.equal(at('10.9.1.1').output, '10.180.0.2:80');
  assert.equal(at('10.9.1.2').output, '10.180.0.3:80');
  // the same tables listed the other way round (kube-proxy-0 created last)
  const swapped = text.split('add table ip kube-proxy-1\n');
  const other = `add table ip kube-proxy-1\n${swapped[1]}${swapped[0]}`;
  const at2 = (destIP: string) => traceNft(other, { sourceIP: '203.0.113.1', protocol: 'tcp', destIP, destPort: 80 }, { localIPs: [] }).output;
  assert.equal(at2('10.9.0.1'), 'REJECT');
  assert.equal(at2('10.9.1.1'), '10.180.0.1:80');
});
