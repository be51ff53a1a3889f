// Unit tests: names, planner scenarios from upstream's nftables proxier_test.go traced as
// packet flows, the tracer on `nft list` output, and the transaction builder.
import { renderOps } from '../../src/kernel/nft/model.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { stateOf, type CaseConfig } from '../../src/conformance/case.ts';
import { loadCase } from '../../src/conformance/load.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { optionsFromCase, tracerLocalIPs } from '../../src/modes/nftables/conformance.ts';
import { servicePortChainNameBase, servicePortEndpointChainNameBase } from '../../src/modes/nftables/names.ts';
import { planRuleset } from '../../src/modes/nftables/plan.ts';
import { parseKubeProxyTable } from '../../src/modes/nftables/parse.ts';
import { dumpRuleset, type Ruleset } from '../../src/modes/nftables/ruleset.ts';
import { traceNft, traceRuleset } from '../../src/modes/nftables/trace.ts';
import { fullTransaction, partialTransaction } from '../../src/modes/nftables/transaction.ts';
import { makeService, makeSlice, type EndpointOpts } from '../support/builders.ts';

const here = dirname(fileURLToPath(import.meta.url));
const casesRoot = resolve(here, '../..', '../shared/conformance');

interface Flow {
  name: string;
  sourceIP: string;
  protocol?: string;
  destIP: string;
  destPort: number;
  output: string;
  masq?: boolean;
}

function cfg(extra: Partial<CaseConfig> = {}): CaseConfig {
  return { mode: 'nftables', ipFamily: 'IPv4', nodeName: 'test-node', ...extra };
}

function slice(ns: string, svcName: string, family: 'IPv4' | 'IPv6', eps: EndpointOpts[], ports: Array<{ name: string; port: number; protocol?: string }>): K8sEndpointSlice {
  return makeSlice(ns, svcName, { family: family === 'IPv6' ? 6 : 4, endpoints: eps, ports });
}

function plan(config: CaseConfig, objects: Array<K8sService | K8sEndpointSlice>): Ruleset {
  return planRuleset(stateOf(config, objects), optionsFromCase(config));
}

function checkFlows(config: CaseConfig, rs: Ruleset, flows: Flow[]): void {
  for (const f of flows) {
    const r = traceRuleset(rs, { sourceIP: f.sourceIP, protocol: f.protocol ?? '', destIP: f.destIP, destPort: f.destPort }, { localIPs: tracerLocalIPs(config) });
    assert.deepEqual({ output: r.output, masq: r.masq }, { output: f.output, masq: f.masq ?? false }, `${f.name}\n${r.rules.join('\n')}\n${r.notes.join('\n')}`);
    assert.deepEqual(r.notes, [], `${f.name}: tracer notes`);
  }
}

test('chain names match upstream test vectors', () => {
  const t = { namespace: 'testing', name: 'service', port: 'http' };
  assert.equal(servicePortChainNameBase(t, 'tcp'), 'P4ZYZVCF-testing/service/tcp/http');
  assert.equal(servicePortChainNameBase({ ...t, port: 'https' }, 'tcp'), 'LZBRENCP-testing/service/tcp/https');
  assert.equal(servicePortEndpointChainNameBase(t, 'tcp', '10.180.0.1:80'), 'JO2XBXZR-testing/service/tcp/http__10.180.0.1/80');
  assert.equal(servicePortEndpointChainNameBase(t, 'tcp', '10.180.0.2:80'), '5S6H3H22-testing/service/tcp/http__10.180.0.2/80');
  assert.equal(
    servicePortEndpointChainNameBase(t, 'tcp', '[fd80:abcd:12::a1b2:c3d4:e5f6:9999]:80'),
    'U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80',
  );
  const long = {
    namespace: 'very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx',
    name: 'very-long-service-name-why-would-you-even-do-this-i-mean-really',
    port: 'port-443-providing-the-hypertext-transmission-protocol-with-tls',
  };
  const truncated = servicePortEndpointChainNameBase(long, 'sctp', '[1234:5678:9abc:def0::abcd:1234:5678]:443');
  assert.ok(truncated.startsWith('CI6C53Q3-') && truncated.endsWith('__1234.5678.9abc.def0..abcd.1234...'));
  assert.equal(truncated.length, 240);
});

test('TestNoEndpointsReject: every address of a service without endpoints rejects', () => {
  const c = cfg();
  const rs = plan(c, [
    makeService('ns1', 'svc1', { type: 'LoadBalancer', clusterIP: '172.30.0.41', externalIPs: ['192.168.99.11'], ports: [{ name: 'p80', port: 80, protocol: 'TCP', nodePort: 3001 }] }, { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } }),
  ]);
  checkFlows(c, rs, [
    { name: 'pod to cluster IP', sourceIP: '10.0.0.2', destIP: '172.30.0.41', destPort: 80, output: 'REJECT' },
    { name: 'external to external IP', sourceIP: '203.0.113.2', destIP: '192.168.99.11', destPort: 80, output: 'REJECT' },
    { name: 'pod to NodePort', sourceIP: '10.0.0.2', destIP: '192.168.0.2', destPort: 3001, output: 'REJECT' },
    { name: 'external to NodePort', sourceIP: '203.0.113.2', destIP: '192.168.0.2', destPort: 3001, output: 'REJECT' },
    { name: 'pod to LB IP', sourceIP: '10.0.0.2', destIP: '1.2.3.4', destPort: 80, output: 'REJECT' },
    { name: 'external to LB IP', sourceIP: '203.0.113.2', destIP: '1.2.3.4', destPort: 80, output: 'REJECT' },
  ]);
});

function nodePortCase(family: 'IPv4' | 'IPv6', nodePortAddresses?: string[] | null): { c: CaseConfig; rs: Ruleset } {
  const v4 = family === 'IPv4';
  const c = cfg({ ipFamily: family, ...(nodePortAddresses !== undefined ? { nodePortAddresses } : {}) });
  const rs = plan(c, [
    makeService('ns1', 'svc1', { type: 'NodePort', clusterIP: v4 ? '172.30.0.41' : 'fd00:172:30::41', ports: [{ name: 'p80', port: 80, protocol: 'TCP', nodePort: 3001 }] }),
    slice('ns1', 'svc1', family, [{ ip: v4 ? '10.180.0.1' : 'fd00:10:180::1' }, { ip: v4 ? '10.180.2.1' : 'fd00:10:180::2:1', node: 'test-node' }], [{ name: 'p80', port: 80 }]),
  ]);
  return { c, rs };
}

for (const [name, family, npa, allowAlt] of [
  ['ipv4', 'IPv4', undefined, false],
  ['ipv4, multiple nodeport-addresses', 'IPv4', ['192.168.0.0/24', '192.168.1.0/24', '2001:db8::/64'], true],
  ['ipv6', 'IPv6', undefined, false],
  ['ipv6, multiple nodeport-addresses', 'IPv6', ['192.168.0.0/24', '192.168.1.0/24', '2001:db8::/64', '2001:db8:1::2/128'], true],
] as const) {
  test(`TestNodePorts ${name}`, () => {
    const { c, rs } = nodePortCase(family, npa ? [...npa] : undefined);
    const v4 = family === 'IPv4';
    const out = v4 ? '10.180.0.1:80, 10.180.2.1:80' : '[fd00:10:180::1]:80, [fd00:10:180::2:1]:80';
    const nodeIP = v4 ? '192.168.0.2' : '2001:db8::1';
    const alt = v4 ? '192.168.1.2' : '2001:db8:1::2';
    const ext = v4 ? '203.0.113.2' : '2600:5200::1';
    checkFlows(c, rs, [
      { name: 'pod to cluster IP', sourceIP: v4 ? '10.0.0.2' : 'fd00:10::2', destIP: v4 ? '172.30.0.41' : 'fd00:172:30::41', destPort: 80, output: out },
      { name: 'external to nodePort', sourceIP: ext, destIP: nodeIP, destPort: 3001, output: out, masq: true },
      { name: 'node to nodePort', sourceIP: nodeIP, destIP: nodeIP, destPort: 3001, output: out, masq: true },
      { name: 'secondary node IP', sourceIP: ext, destIP: alt, destPort: 3001, output: allowAlt ? out : '', masq: allowAlt },
    ]);
    if (!v4) assert.match(dumpRuleset(rs), /^add table ip6 kube-proxy/);
  });
}

test('nodePortAddresses null: every local address but loopback accepts NodePorts', () => {
  const { c, rs } = nodePortCase('IPv4', null);
  const text = dumpRuleset(rs);
  assert.match(text, /add rule ip kube-proxy services fib daddr type local ip daddr != 127\.0\.0\.0\/8 meta l4proto \. th dport vmap @service-nodeports/);
  assert.doesNotMatch(text, /nodeport-ips/);
  checkFlows(c, rs, [
    { name: 'alt node IP', sourceIP: '203.0.113.2', destIP: '192.168.1.2', destPort: 3001, output: '10.180.0.1:80, 10.180.2.1:80', masq: true },
    { name: 'localhost', sourceIP: '127.0.0.1', destIP: '127.0.0.1', destPort: 3001, output: '' },
  ]);
});

function trafficPolicyCase(local: boolean): { c: CaseConfig; rs: Ruleset } {
  const c = cfg();
  const rs = plan(c, [
    makeService('ns1', 'svc1', { type: 'LoadBalancer', externalTrafficPolicy: local ? 'Local' : 'Cluster', clusterIP: '172.30.0.41', externalIPs: ['192.168.99.11'], healthCheckNodePort: 30000, ports: [{ name: 'p80', port: 80, protocol: 'TCP', nodePort: 3001, targetPort: 80 }] }, { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } }),
    slice('ns1', 'svc1', 'IPv4', [{ ip: '10.180.0.1' }, { ip: '10.180.2.1', node: 'test-node' }], [{ name: 'p80', port: 80 }]),
  ]);
  return { c, rs };
}

test('TestExternalTrafficPolicyLocal', () => {
  const { c, rs } = trafficPolicyCase(true);
  const both = '10.180.0.1:80, 10.180.2.1:80';
  checkFlows(c, rs, [
    { name: 'pod to cluster IP', sourceIP: '10.0.0.2', destIP: '172.30.0.41', destPort: 80, output: both },
    { name: 'pod to external IP', sourceIP: '10.0.0.2', destIP: '192.168.99.11', destPort: 80, output: both },
    { name: 'external to external IP', sourceIP: '203.0.113.2', destIP: '192.168.99.11', destPort: 80, output: '10.180.2.1:80' },
    { name: 'pod to LB IP', sourceIP: '10.0.0.2', destIP: '1.2.3.4', destPort: 80, output: both },
    { name: 'external to LB IP', sourceIP: '203.0.113.2', destIP: '1.2.3.4', destPort: 80, output: '10.180.2.1:80' },
    { name: 'pod to NodePort', sourceIP: '10.0.0.2', destIP: '192.168.0.2', destPort: 3001, output: both },
    { name: 'external to NodePort', sourceIP: '203.0.113.2', destIP: '192.168.0.2', destPort: 3001, output: '10.180.2.1:80' },
  ]);
});

test('TestExternalTrafficPolicyCluster', () => {
  const { c, rs } = trafficPolicyCase(false);
  const both = '10.180.0.1:80, 10.180.2.1:80';
  checkFlows(c, rs, [
    { name: 'pod to cluster IP', sourceIP: '10.0.0.2', destIP: '172.30.0.41', destPort: 80, output: both },
    { name: 'pod to external IP', sourceIP: '10.0.0.2', destIP: '192.168.99.11', destPort: 80, output: both, masq: true },
    { name: 'external to external IP', sourceIP: '203.0.113.2', destIP: '192.168.99.11', destPort: 80, output: both, masq: true },
    { name: 'pod to LB IP', sourceIP: '10.0.0.2', destIP: '1.2.3.4', destPort: 80, output: both, masq: true },
    { name: 'external to NodePort', sourceIP: '203.0.113.2', destIP: '192.168.0.2', destPort: 3001, output: both, masq: true },
  ]);
});

test('ETP Local without local endpoints drops external traffic but serves pods', () => {
  const c = cfg();
  const rs = plan(c, [
    makeService('ns1', 'svc1', { type: 'LoadBalancer', externalTrafficPolicy: 'Local', clusterIP: '172.30.1.1', ports: [{ name: '', port: 80, protocol: 'TCP', targetPort: 80 }] }, { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } }),
    slice('ns1', 'svc1', 'IPv4', [{ ip: '10.0.1.5', node: 'node-1', ready: false, serving: true, terminating: true }], [{ name: '', port: 80 }]),
  ]);
  checkFlows(c, rs, [
    { name: 'pod to clusterIP', sourceIP: '10.0.0.2', destIP: '172.30.1.1', destPort: 80, output: '10.0.1.5:80' },
    { name: 'external to LB', sourceIP: '203.0.113.2', destIP: '1.2.3.4', destPort: 80, output: 'DROP' },
  ]);
});

test('internalTrafficPolicy Local without local endpoints drops', () => {
  const c = cfg();
  const rs = plan(c, [
    makeService('ns1', 'svc1', { clusterIP: '172.30.1.1', internalTrafficPolicy: 'Local', ports: [{ name: '', port: 80, protocol: 'TCP' }] }),
    slice('ns1', 'svc1', 'IPv4', [{ ip: '10.0.1.1', node: 'node0' }, { ip: '10.0.1.2', node: 'node1' }], [{ name: '', port: 80 }]),
  ]);
  checkFlows(c, rs, [{ name: 'no local endpoints', sourceIP: '10.0.0.2', destIP: '172.30.1.1', destPort: 80, output: 'DROP' }]);
});

test('masqueradeAll and no local detector', () => {
  const objs = [
    makeService('ns1', 'svc1', { clusterIP: '172.30.0.41', ports: [{ name: 'p80', port: 80, protocol: 'TCP' }] }),
    slice('ns1', 'svc1', 'IPv4', [{ ip: '10.180.0.1' }], [{ name: 'p80', port: 80 }]),
  ];
  const all = plan(cfg({ masqueradeAll: true }), objs);
  assert.match(dumpRuleset(all), /service-ULMVA6XW-ns1\/svc1\/tcp\/p80 ip daddr 172\.30\.0\.41 jump mark-for-masquerade/);
  checkFlows(cfg(), all, [{ name: 'pod masqueraded', sourceIP: '10.180.0.2', destIP: '172.30.0.41', destPort: 80, output: '10.180.0.1:80', masq: true }]);
  const none = plan(cfg({ localDetector: null }), objs);
  assert.doesNotMatch(dumpRuleset(none), /ip daddr 172\.30\.0\.41 .*jump mark-for-masquerade/);
  checkFlows(cfg(), none, [{ name: 'external not masqueraded', sourceIP: '203.0.113.2', destIP: '172.30.0.41', destPort: 80, output: '10.180.0.1:80' }]);
});

test('the tracer reads `nft list table` output the same as the rendered text', () => {
  const c = loadCase(join(casesRoot, 'golden/nftables-overall'));
  const rendered = dumpRuleset(planRuleset(stateOf(c.config, c.objects), optionsFromCase(c.config)));
  const listing = readFileSync(join(here, 'fixtures/overall.nft-list.txt'), 'utf8');
  const local = tracerLocalIPs(c.config);
  const flows: Flow[] = [
    { name: 'svc1', sourceIP: '10.180.0.2', destIP: '172.30.0.41', destPort: 80, output: '10.180.0.1:80' },
    { name: 'svc1 hairpin', sourceIP: '10.180.0.1', destIP: '172.30.0.41', destPort: 80, output: '10.180.0.1:80', masq: true },
    { name: 'svc1 wrong port', sourceIP: '10.180.0.2', destIP: '172.30.0.41', destPort: 81, output: 'REJECT' },
    { name: 'unallocated', sourceIP: '10.180.0.2', destIP: '172.30.0.99', destPort: 80, output: 'DROP' },
    { name: 'svc2 external, no local endpoints', sourceIP: '203.0.113.2', destIP: '1.2.3.4', destPort: 80, output: 'DROP' },
    { name: 'svc2 pod to LB short-circuits', sourceIP: '10.0.0.2', destIP: '1.2.3.4', destPort: 80, output: '10.180.0.2:80' },
    { name: 'svc4 two endpoints', sourceIP: '10.0.0.2', destIP: '172.30.0.44', destPort: 80, output: '10.180.0.4:80, 10.180.0.5:80' },
    { name: 'svc3 nodeport', sourceIP: '203.0.113.2', destIP: '192.168.0.2', destPort: 3003, output: '10.180.0.3:80', masq: true },
    { name: 'svc5 LB allowed', sourceIP: '203.0.113.2', destIP: '5.6.7.8', destPort: 80, output: '10.180.0.3:80', masq: true },
    { name: 'svc5 LB blocked', sourceIP: '203.0.113.200', destIP: '5.6.7.8', destPort: 80, output: 'DROP' },
    { name: 'svc6 no endpoints', sourceIP: '10.0.0.2', destIP: '172.30.0.46', destPort: 80, output: 'REJECT' },
  ];
  for (const f of flows) {
    const pkt = { sourceIP: f.sourceIP, protocol: 'TCP', destIP: f.destIP, destPort: f.destPort };
    const a = traceNft(rendered, pkt, { localIPs: local });
    const b = traceNft(listing, pkt, { localIPs: local });
    assert.deepEqual({ output: a.output, masq: a.masq }, { output: f.output, masq: f.masq ?? false }, `rendered: ${f.name}`);
    assert.deepEqual({ output: b.output, masq: b.masq }, { output: f.output, masq: f.masq ?? false }, `listing: ${f.name}\n${b.notes.join('\n')}`);
    assert.deepEqual(b.notes, []);
  }
  const parsed = parseKubeProxyTable(listing, 'ip');
  assert.equal(parsed.chains.get('filter-prerouting-pre-dnat')?.priority, -110);
  assert.equal(parsed.sets.get('service-ips')?.elements.size, 9);
});

/** Applies `text` to the fake kernel; it must take it. */
async function applyText(kernel: FakeNft, text: string): Promise<void> {
  const r = await kernel.run('nft', ['-f', '-'], { input: text });
  assert.equal(r.code, 0, r.stderr);
}

/** The kube-proxy table the fake kernel lists after applying `text` to an empty one. */
async function tableOf(text: string): Promise<string | null> {
  const kernel = new FakeNft();
  await applyText(kernel, text);
  return kernel.dump('ip', 'kube-proxy');
}

test('transactions: full flushes and replaces, partial writes only differences', async () => {
  const c = cfg();
  const base = [
    makeService('ns1', 'svc1', { clusterIP: '172.30.0.41', ports: [{ name: 'p80', port: 80, protocol: 'TCP' }] }),
    slice('ns1', 'svc1', 'IPv4', [{ ip: '10.180.0.1' }, { ip: '10.180.0.2' }], [{ name: 'p80', port: 80 }]),
    makeService('ns2', 'svc2', { clusterIP: '172.30.0.42', ports: [{ name: 'p80', port: 80, protocol: 'TCP' }] }),
  ];
  const before = plan(c, base);
  const live = { chains: new Set(['service-OLD-ns9/x/tcp/p', 'services']), sets: new Map([['affinity-OLD', 'set' as const], ['service-ips', 'map' as const]]) };
  const full = fullTransaction(before, live);
  assert.match(renderOps(full.ops), /^add table ip kube-proxy/);
  assert.match(renderOps(full.ops), /flush map ip kube-proxy service-ips/);
  assert.match(renderOps(full.ops), /flush chain ip kube-proxy services\n/);
  // What does not exist yet is only added: a cold start does not flush 10^5 new chains.
  assert.doesNotMatch(renderOps(full.ops), /flush (map|set) ip kube-proxy cluster-ips/);
  assert.doesNotMatch(renderOps(full.ops), /flush chain ip kube-proxy service-ULMVA6XW/);
  assert.match(renderOps(fullTransaction(before, null).ops), /flush chain ip kube-proxy service-ULMVA6XW/, 'unknown live state: flush everything');
  assert.match(renderOps(full.ops), /flush chain ip kube-proxy service-OLD-ns9\/x\/tcp\/p\n/);
  assert.match(renderOps(full.ops), /delete set ip kube-proxy affinity-OLD\n/);
  assert.deepEqual(full.staleChains, ['service-OLD-ns9/x/tcp/p']);
  // The full transaction, applied to an empty kernel (the nft fake), gives the planned table
  // (its golden dump applied to another).
  const kernel = new FakeNft();
  await applyText(kernel, renderOps(fullTransaction(before, null).ops));
  assert.equal(kernel.dump('ip', 'kube-proxy'), await tableOf(dumpRuleset(before)));

  assert.equal(partialTransaction(before, before).ops.length, 0);

  const after = plan(c, [
    base[0],
    slice('ns1', 'svc1', 'IPv4', [{ ip: '10.180.0.1' }], [{ name: 'p80', port: 80 }]),
    base[2],
    slice('ns2', 'svc2', 'IPv4', [{ ip: '10.180.1.1' }], [{ name: 'p80', port: 80 }]),
  ]);
  const part = partialTransaction(after, before);
  assert.match(renderOps(part.ops), /delete element ip kube-proxy no-endpoint-services \{ 172\.30\.0\.42 \. tcp \. 80 \}/);
  // Elements and rules in the forms nft 1.0.6 adds without listing every chain first.
  assert.match(renderOps(part.ops), /add map ip kube-proxy service-ips \{ type [^}]* elements = \{ 172\.30\.0\.42 \. tcp \. 80 : goto service-/);
  assert.match(renderOps(part.ops), /add chain ip kube-proxy service-[A-Z0-9]+-ns2\/svc2\/tcp\/p80 \{ ip daddr 172\.30\.0\.42 .* ; goto endpoint-/);
  assert.doesNotMatch(renderOps(part.ops), /^(add table|add rule|add element|insert|replace) /m);
  assert.match(renderOps(part.ops), /flush chain ip kube-proxy endpoint-[A-Z0-9]+-ns1\/svc1\/tcp\/p80__10\.180\.0\.2\/80\n/);
  assert.doesNotMatch(renderOps(part.ops), /add rule ip kube-proxy services /, 'unchanged chains are not rewritten');
  assert.equal(part.staleChains.length, 1);
  // Applying the partial transaction on top of the old table, then deleting the chain it
  // flushed (nothing refers to it any more), gives the new one.
  await applyText(kernel, renderOps(part.ops));
  await applyText(kernel, part.staleChains.map((ch) => `delete chain ip kube-proxy ${ch}\n`).join(''));
  assert.equal(kernel.dump('ip', 'kube-proxy'), await tableOf(dumpRuleset(after)));
});

test('createProxier without nft fails with KPROXY_EXEC_MISSING', async () => {
  const { mode } = await import('../../src/modes/nftables/index.ts');
  const { hostRunner } = await import('../../src/kernel/runner.ts');
  const { silentLogger } = await import('../../src/log.ts');
  const { resolveConfig } = await import('../../src/config/config.ts');
  const missing = { run: (cmd: string, args: string[], o?: { input?: string; timeoutMs?: number }) => hostRunner.run(`/nonexistent-kpt-nft/${cmd}`, args, o) };
  await assert.rejects(mode.createProxier({ config: resolveConfig({}, { mode: 'nftables' }), log: silentLogger(), runner: missing }), /KPROXY_EXEC_MISSING/);
  // cleanup ignores a host without nft
  await mode.cleanup(missing, silentLogger());
});

test('nft errors name the failing line of the transaction', async () => {
  const { failingLine } = await import('../../src/kernel/nft/exec.ts');
  assert.equal(failingLine('/dev/stdin:3:24-30: Error: Could not process rule: No such file or directory'), 3);
  assert.equal(failingLine('Error: something without a position'), null);
});
