// The node view (src/core/nodeview.ts): its decisions as a small matrix (traffic policies ×
// endpoint sets), the node-wide resolution (NodePort addresses, detector, localhost
// NodePorts), firewall facts and the stale UDP flows; plus the rule that no planner under
// src/modes re-derives what the view decides.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { buildNodeView, buildViewFrom, nodeSettings, portOf, primaryNodeIP, resolveNodePortAddresses, type NodeContext, type PlanInput, type PortFacts } from '../../src/core/nodeview.ts';
import { resolveConfig, type RawConfig, type ConfigFlags } from '../../src/config/config.ts';
import type { Endpoint, ProxyState, ServicePort } from '../../src/core/model.ts';
import { planFull } from '../../src/modes/iptables/full.ts';
import { SYSCTL_ROUTE_LOCALNET } from '../../src/modes/iptables/plan.ts';
import { optionsFromConfig } from '../../src/modes/iptables/options.ts';
import { optionsFromInput } from '../../src/modes/nftables/plan.ts';
import { port } from '../support/ports.ts';
import { modes } from '../../src/modes/registry.ts';

const NODE = 'node1';

const sp = (name: string, o: Partial<ServicePort> = {}): ServicePort => port('ns', name, '', o);

function ep(ip: string, o: Partial<Endpoint> = {}): Endpoint {
  return { ip, port: 8080, key: `${ip}:8080`, isLocal: false, ready: true, serving: true, terminating: false, zoneHints: [], nodeHints: [], ...o };
}

const LOCAL = ep('10.180.0.1', { isLocal: true });
const REMOTE = ep('10.180.1.1');
const TERM_LOCAL = ep('10.180.0.2', { isLocal: true, ready: false, terminating: true });

const node: PortFacts = { nodeName: NODE, nodeLabels: {}, primaryNodeIP: '192.168.0.2', loopbackVIPs: false };

function stateOf(entries: Array<[ServicePort, Endpoint[]]>): ProxyState {
  return { services: new Map(entries.map(([s]) => [s.key, s])), endpoints: new Map(entries.map(([s, e]) => [s.key, e])) };
}

function input(state: ProxyState, raw: RawConfig = {}, flags: ConfigFlags = {}, n: Partial<NodeContext> = {}): PlanInput {
  return { state, config: resolveConfig(raw, flags), node: { nodeName: NODE, nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4, ...n } };
}

// ---- per-port decisions ----------------------------------------------------------------

test('decision matrix: traffic policies × endpoint sets on an externally accessible service', () => {
  type Row = [itp: boolean, etp: boolean, eps: Endpoint[], want: { cluster: boolean; local: boolean; int: boolean; ext: boolean; short: boolean; extPath: boolean }];
  const rows: Row[] = [
    // cluster policies: the cluster path carries everything
    [false, false, [LOCAL, REMOTE], { cluster: true, local: false, int: true, ext: true, short: false, extPath: true }],
    [false, false, [], { cluster: false, local: false, int: false, ext: false, short: false, extPath: false }],
    // eTP Local, remote endpoints only: external traffic has nothing local (DROP), but the
    // cluster path stays for pod/node short-circuit (upstream UsesClusterEndpoints)
    [false, true, [REMOTE], { cluster: true, local: false, int: true, ext: false, short: true, extPath: true }],
    [false, true, [LOCAL, REMOTE], { cluster: true, local: true, int: true, ext: true, short: true, extPath: true }],
    // iTP Local + eTP Local: still UsesClusterEndpoints because the service is externally accessible
    [true, true, [LOCAL, REMOTE], { cluster: true, local: true, int: true, ext: true, short: true, extPath: true }],
    [true, true, [REMOTE], { cluster: true, local: false, int: false, ext: false, short: true, extPath: true }],
    // terminating-only local endpoint: the serving+terminating fallback
    [true, true, [TERM_LOCAL], { cluster: true, local: true, int: true, ext: true, short: true, extPath: true }],
    [true, false, [REMOTE], { cluster: true, local: false, int: false, ext: true, short: false, extPath: true }],
  ];
  for (const [itp, etp, eps, want] of rows) {
    const s = sp(`m-${itp}-${etp}-${eps.length}`, { internalPolicyLocal: itp, externalPolicyLocal: etp, nodePort: 30001, loadBalancerVIPs: ['1.2.3.4'] });
    const v = portOf(node, s, eps);
    const got = { cluster: v.usesClusterPath, local: v.usesLocalPath, int: v.hasInternalEndpoints, ext: v.hasExternalEndpoints, short: v.shortCircuitToCluster, extPath: v.usesExternalPath };
    assert.deepEqual(got, want, `itp=${itp} etp=${etp} eps=${eps.map((e) => e.key)}`);
  }
});

test('iTP Local on a ClusterIP-only service does not use the cluster path', () => {
  const v = portOf(node, sp('internal', { internalPolicyLocal: true }), [LOCAL, REMOTE]);
  assert.equal(v.usesClusterPath, false);
  assert.deepEqual(v.localEndpoints.map((e) => e.ip), ['10.180.0.1']);
  assert.equal(v.externallyAccessible, false);
});

test('a port view is reused while its ServicePort and endpoint list are the same objects', () => {
  const s = sp('cache');
  const eps = [REMOTE];
  assert.equal(portOf(node, s, eps), portOf(node, s, eps));
  assert.notEqual(portOf(node, s, eps), portOf(node, s, [REMOTE]));
  assert.notEqual(portOf(node, s, eps), portOf({ ...node, nodeName: 'other' }, s, eps));
});

test('firewall: /0 allows all, the node IP inside the ranges lets the LB IPs through, other-family ranges are ignored', () => {
  const fw = (ranges: string[]) => portOf(node, sp(`fw-${ranges.join()}`, { loadBalancerVIPs: ['1.2.3.4'], loadBalancerSourceRanges: ranges }), [REMOTE]).firewall;
  assert.equal(fw(['0.0.0.0/0'])!.allowAll, true);
  assert.equal(fw(['10.0.0.0/8'])!.allowAll, false);
  assert.equal(fw(['10.0.0.0/8'])!.nodeInRanges, false);
  assert.equal(fw(['192.168.0.0/16'])!.nodeInRanges, true);
  assert.equal(fw(['2001:db8::/32']), null);
  const noEps = portOf(node, sp('fw-none', { loadBalancerVIPs: ['1.2.3.4'], loadBalancerSourceRanges: ['10.0.0.0/8'] }), []);
  assert.ok(noEps.firewall && !noEps.usesFirewallPath, 'without endpoints the firewall is known but not rendered (upstream usesFWChain)');
});

test('health check node port only for eTP Local', () => {
  assert.equal(portOf(node, sp('hc1', { healthCheckNodePort: 32000, externalPolicyLocal: true, nodePort: 30002 }), []).healthCheckNodePort, 32000);
  assert.equal(portOf(node, sp('hc2', { healthCheckNodePort: 32000, nodePort: 30002 }), []).healthCheckNodePort, 0);
});

// ---- node-wide decisions ---------------------------------------------------------------

test('primary node IP: the Node InternalIP of the family, else ExternalIP, else the host IP', () => {
  const n = (addresses: Array<{ type: string; address: string }>, family: 4 | 6 = 4): NodeContext => ({ nodeName: NODE, nodeIPs: ['192.168.0.9', 'fd00::9'], nodeLabels: {}, family, addresses });
  assert.equal(primaryNodeIP(n([{ type: 'ExternalIP', address: '5.6.7.8' }, { type: 'InternalIP', address: '192.168.0.2' }])), '192.168.0.2');
  assert.equal(primaryNodeIP(n([{ type: 'ExternalIP', address: '5.6.7.8' }, { type: 'InternalIP', address: 'fd00::2' }])), '5.6.7.8');
  assert.equal(primaryNodeIP(n([{ type: 'InternalIP', address: '192.168.0.2' }, { type: 'InternalIP', address: 'fd00::2' }], 6)), 'fd00::2');
  assert.equal(primaryNodeIP(n([{ type: 'Hostname', address: 'node1' }])), '192.168.0.9');
  assert.equal(primaryNodeIP(n([], 6)), 'fd00::9');
});

test('nodePortAddresses: CIDRs, primary, primary mixed with CIDRs, /0, other family', () => {
  const locals = ['192.168.0.2', '10.1.0.5', '127.0.0.1', 'fd00::2'];
  assert.deepEqual(resolveNodePortAddresses(4, [], locals, '192.168.0.2'), { matchAll: true, ips: [], cidrs: [] });
  assert.deepEqual(resolveNodePortAddresses(4, ['primary'], locals, '192.168.0.2'), { matchAll: false, ips: ['192.168.0.2'], cidrs: ['192.168.0.2/32'] });
  const mixed = resolveNodePortAddresses(4, ['primary', '10.0.0.0/8'], locals, '192.168.0.2');
  assert.deepEqual(mixed.ips, ['192.168.0.2', '10.1.0.5']);
  assert.equal(resolveNodePortAddresses(4, ['0.0.0.0/0'], locals, null).matchAll, true);
  assert.equal(resolveNodePortAddresses(4, ['fd00::/64'], locals, null).matchAll, true, 'only other-family CIDRs: all addresses of this family');
  assert.deepEqual(resolveNodePortAddresses(6, ['primary', '10.0.0.0/8'], locals, 'fd00::2').ips, ['fd00::2']);
  assert.deepEqual(resolveNodePortAddresses(4, ['127.0.0.0/8'], locals, null).ips, ['127.0.0.1']);
});

test('nodePortAddresses keywords (kubernetes#138427): localhost is the family\'s loopback address, all every address', () => {
  const locals = ['192.168.0.2', '10.1.0.5', '127.0.0.1', '::1', 'fd00::2'];
  assert.deepEqual(resolveNodePortAddresses(4, ['primary', 'localhost'], locals, '192.168.0.2'), { matchAll: false, ips: ['192.168.0.2', '127.0.0.1'], cidrs: ['192.168.0.2/32', '127.0.0.1/32'] });
  assert.deepEqual(resolveNodePortAddresses(6, ['primary', 'localhost'], locals, 'fd00::2').ips, ['fd00::2', '::1']);
  assert.equal(resolveNodePortAddresses(4, ['primary', 'all'], locals, '192.168.0.2').matchAll, true);
  assert.equal(resolveNodePortAddresses(6, ['10.0.0.0/8', 'all'], locals, null).matchAll, true);
  // the iptables mode serves 127.0.0.1 (route_localnet) when localhost is asked for; nftables and ipvs never serve loopback
  const cfg = (mode: string) => resolveConfig({ mode, nodePortAddresses: ['primary', 'localhost'] } as never);
  const node: NodeContext = { nodeName: NODE, nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4, addresses: [{ type: 'InternalIP', address: '192.168.0.2' }] };
  assert.deepEqual(nodeSettings(cfg('iptables'), node).nodePortIPs, ['192.168.0.2', '127.0.0.1']);
  assert.equal(nodeSettings(cfg('iptables'), node).localhostNodePorts, true);
  assert.deepEqual(nodeSettings(cfg('nftables'), node).nodePortIPs, ['192.168.0.2']);
  assert.deepEqual(nodeSettings(cfg('ipvs'), node).nodePortIPs, ['192.168.0.2']);
});

test('nodePortAddresses default per mode: all addresses for iptables and ipvs, the primary IP for nftables (v1.31+)', () => {
  const st = stateOf([]);
  const n = { addresses: [{ type: 'InternalIP', address: '192.168.0.2' }], nodeIPs: ['192.168.0.2', '10.1.0.5'] };
  for (const mode of ['iptables', 'ipvs', 'userspace']) {
    assert.equal(buildNodeView(input(st, { mode }, {}, n)).nodePorts.matchAll, true, mode);
  }
  const nft = buildNodeView(input(st, { mode: 'nftables' }, {}, n));
  assert.deepEqual(nft.nodePorts.ips, ['192.168.0.2']);
  assert.deepEqual(optionsFromInput(input(st, { mode: 'nftables' }, {}, n)).nodePortIPs, ['192.168.0.2']);
  // primary follows the Node object, not the host's first address
  const v = buildNodeView(input(st, { nodePortAddresses: ['primary'] }, {}, { addresses: [{ type: 'InternalIP', address: '10.1.0.5' }], nodeIPs: ['192.168.0.2', '10.1.0.5'] }));
  assert.deepEqual(v.nodePorts.ips, ['10.1.0.5']);
  assert.deepEqual(optionsFromConfig(resolveConfig({ nodePortAddresses: ['primary'] }), { nodeName: NODE, nodeIPs: ['192.168.0.2', '10.1.0.5'], nodeLabels: {}, family: 4, addresses: [{ type: 'InternalIP', address: '10.1.0.5' }] }).nodePorts, { matchAll: false, ips: ['10.1.0.5'] });
});

test('detectLocalMode resolves per family: ClusterCIDR, NodeCIDR from podCIDRs, BridgeInterface, InterfaceNamePrefix', () => {
  const st = stateOf([]);
  const dual = { clusterCIDR: '10.0.0.0/8,fd00:10::/48' };
  assert.deepEqual(buildNodeView(input(st, dual)).localDetector, { kind: 'cidr', cidr: '10.0.0.0/8' });
  assert.deepEqual(buildNodeView(input(st, dual, {}, { family: 6, nodeIPs: ['fd00::2'] })).localDetector, { kind: 'cidr', cidr: 'fd00:10::/48' });
  assert.equal(buildNodeView(input(st, {})).localDetector, null, 'ClusterCIDR without a CIDR detects nothing (upstream: warning, no-op detector)');
  const pod = { podCIDRs: ['10.244.1.0/24', 'fd00:244:1::/64'] };
  assert.deepEqual(buildNodeView(input(st, { detectLocalMode: 'NodeCIDR' }, {}, pod)).localDetector, { kind: 'cidr', cidr: '10.244.1.0/24' });
  assert.deepEqual(buildNodeView(input(st, { detectLocalMode: 'NodeCIDR' }, {}, { ...pod, family: 6, nodeIPs: ['fd00::2'] })).localDetector, { kind: 'cidr', cidr: 'fd00:244:1::/64' });
  assert.equal(buildNodeView(input(st, { detectLocalMode: 'NodeCIDR' })).localDetector, null, 'no podCIDRs yet: nothing detected');
  assert.deepEqual(buildNodeView(input(st, {}, { detectLocalMode: 'BridgeInterface', podBridgeInterface: 'cbr0' })).localDetector, { kind: 'interface', name: 'cbr0' });
  assert.deepEqual(buildNodeView(input(st, { detectLocalMode: 'InterfaceNamePrefix', detectLocal: { interfaceNamePrefix: 'veth' } })).localDetector, { kind: 'interface-prefix', prefix: 'veth' });
});

test('the detector is rendered in iptables (-i br0 / ! -i veth+) and nftables (iifname)', () => {
  const s = sp('det', { nodePort: 30010, externalPolicyLocal: true, loadBalancerVIPs: ['1.2.3.4'] });
  const st = stateOf([[s, [LOCAL, REMOTE]]]);
  const br = input(st, {}, { detectLocalMode: 'BridgeInterface', podBridgeInterface: 'cbr0' });
  const ipt = planFull({ state: st, opts: optionsFromConfig(br.config, br.node) }).payload;
  assert.match(ipt, /"pod traffic for ns\/det external destinations" -i cbr0 -j KUBE-SVC-/);
  assert.match(ipt, /cluster IP" -m tcp -p tcp -d 172\.30\.0\.1 --dport 80 ! -i cbr0 -j KUBE-MARK-MASQ/);
  const pre = input(st, {}, { detectLocalMode: 'InterfaceNamePrefix', podInterfaceNamePrefix: 'veth' });
  const ipt2 = planFull({ state: st, opts: optionsFromConfig(pre.config, pre.node) }).payload;
  assert.match(ipt2, /! -i veth\+ -j KUBE-MARK-MASQ/);
  assert.deepEqual(optionsFromInput(pre).localDetector, { kind: 'interface-prefix', prefix: 'veth' });
  const nft = modes.nftables.render(pre);
  assert.match(nft, /ip daddr 172\.30\.0\.1 iifname != veth\* jump mark-for-masquerade/);
  assert.match(nft, /iifname veth\* goto service-\S+ comment "short-circuit pod traffic"/);
  const ipvs = modes.ipvs.render(br);
  assert.match(ipvs, /KUBE-CLUSTER-IP dst,dst ! -i cbr0 -j KUBE-MARK-MASQ/);
});

test('ipvs trace with an interface detector says the input interface decides', async () => {
  const st = stateOf([[sp('ipvsdet'), [REMOTE]]]);
  const br = input(st, { mode: 'ipvs' }, { detectLocalMode: 'BridgeInterface', podBridgeInterface: 'cbr0' });
  const r = await modes.ipvs.trace!({ from: '10.0.0.5', to: '172.30.0.1', port: 80, protocol: 'TCP', input: br, live: false }, { runner: { run: () => { throw new Error('no commands'); } } });
  assert.equal(r.output, '10.180.1.1:8080');
  assert.ok(r.rules.some((l) => l.includes('! -i cbr0')), r.rules.join('\n'));
  assert.ok(r.notes?.some((n) => n.includes('input interface')));
  const { masqConfigFromIptables } = await import('../../src/modes/ipvs/trace.ts');
  assert.deepEqual(masqConfigFromIptables('*nat\n-A KUBE-SERVICES -m comment --comment "Kubernetes service cluster ip + port for masquerade purpose" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -i veth+ -j KUBE-MARK-MASQ\nCOMMIT\n', 4), { all: false, clusterCIDR: null, notLocalInterface: 'veth+' });
});

test('localhost NodePorts: IPv4 only, only with loopback among the NodePort addresses', () => {
  const st = stateOf([]);
  assert.equal(nodeSettings(resolveConfig({}), { nodeName: NODE, nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 }).localhostNodePorts, true);
  assert.equal(nodeSettings(resolveConfig({}), { nodeName: NODE, nodeIPs: ['fd00::2'], nodeLabels: {}, family: 6 }).localhostNodePorts, false);
  assert.equal(buildNodeView(input(st, { nodePortAddresses: ['192.168.0.0/16'] })).localhostNodePorts, false);
  assert.equal(buildNodeView(input(st, { nodePortAddresses: ['127.0.0.0/8'] })).localhostNodePorts, true);
  assert.equal(buildNodeView(input(st, { iptables: { localhostNodePorts: false } })).localhostNodePorts, false);
});

test('the iptables plan asks for route_localnet=1 iff localhost NodePorts are in use', () => {
  const np = sp('np', { nodePort: 30020 });
  const cip = sp('cip');
  const sysctls = (entries: Array<[ServicePort, Endpoint[]]>, raw: RawConfig = {}) => {
    const inp = input(stateOf(entries), raw);
    return planFull({ state: inp.state, opts: optionsFromConfig(inp.config, inp.node) }).sysctls;
  };
  assert.deepEqual(sysctls([[np, [REMOTE]]]), [{ name: SYSCTL_ROUTE_LOCALNET, value: '1' }]);
  assert.deepEqual(sysctls([[cip, [REMOTE]]]), [], 'no NodePort service');
  assert.deepEqual(sysctls([[np, [REMOTE]]], { iptables: { localhostNodePorts: false } }), []);
  assert.deepEqual(sysctls([[np, [REMOTE]]], { nodePortAddresses: ['192.168.0.0/16'] }), [], 'loopback is not a NodePort address');
  const payload = (raw: RawConfig) => {
    const inp = input(stateOf([[np, [REMOTE]]]), raw);
    return planFull({ state: inp.state, opts: optionsFromConfig(inp.config, inp.node) }).payload;
  };
  assert.match(payload({}), /-A KUBE-FIREWALL -m comment --comment "block incoming localnet connections" -d 127\.0\.0\.0\/8 ! -s 127\.0\.0\.0\/8/);
  assert.doesNotMatch(payload({ iptables: { localhostNodePorts: false } }), /block incoming localnet/);
});

// ---- stale flows -----------------------------------------------------------------------

test('stale flows: UDP endpoints that left, UDP services that went from no endpoints to some, never-DNATed TCP attempts', () => {
  const settings = nodeSettings(resolveConfig({}), { nodeName: NODE, nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 });
  const udp = sp('dns', { protocol: 'UDP', nodePort: 30053, externalIPs: ['192.168.99.1'] });
  const tcp = sp('web');
  const a = ep('10.180.1.1');
  const b = ep('10.180.1.2');
  const v1 = buildViewFrom(stateOf([[udp, [a, b]], [tcp, [a, b]]]), settings);
  assert.deepEqual(v1.staleFlows, [{ kind: 'unNATed', protocol: 'TCP', ip: '172.30.0.1', port: 80 }],
    'no previous view: no flow of a UDP port with endpoints; never-DNATed TCP attempts to every TCP port with endpoints');
  const v2 = buildViewFrom(stateOf([[udp, [a]], [tcp, [a]]]), settings, v1);
  assert.deepEqual(v2.staleFlows.filter((f) => f.kind === 'endpoint').map((f) => f.kind === 'endpoint' && `${f.serviceIP}:${f.port}->${f.endpointIP}`), [
    '172.30.0.1:80->10.180.1.2',
    '192.168.99.1:80->10.180.1.2',
    ':30053->10.180.1.2',
  ]);
  assert.ok(v2.staleFlows.every((f) => f.protocol === 'UDP'), 'a TCP port that keeps endpoints needs no conntrack cleanup');
  const v3 = buildViewFrom(stateOf([[udp, []]]), settings, v2);
  const v4 = buildViewFrom(stateOf([[udp, [b]]]), settings, v3);
  assert.deepEqual(v4.staleFlows, [
    { kind: 'service', protocol: 'UDP', ip: '172.30.0.1', port: 80 },
    { kind: 'service', protocol: 'UDP', ip: '192.168.99.1', port: 80 },
    { kind: 'nodePort', protocol: 'UDP', port: 30053 },
  ]);
  const v5 = buildViewFrom(stateOf([[udp, [b]]]), settings, v4);
  assert.deepEqual(v5.staleFlows, [], 'unchanged: nothing');
  // a TCP port that gets endpoints (new, or from none): its never-DNATed attempts, NodePort too
  const tcpNP = sp('web', { nodePort: 30080 });
  const v6 = buildViewFrom(stateOf([[udp, [b]], [tcpNP, []]]), settings, v5);
  assert.deepEqual(v6.staleFlows, [], 'a TCP port without endpoints: nothing');
  const v7 = buildViewFrom(stateOf([[udp, [b]], [tcpNP, [a]]]), settings, v6);
  assert.deepEqual(v7.staleFlows, [
    { kind: 'unNATed', protocol: 'TCP', ip: '172.30.0.1', port: 80 },
    { kind: 'unNATed', protocol: 'TCP', ip: null, port: 30080 },
  ]);
  const v8 = buildViewFrom(stateOf([[udp, [b]], [tcpNP, [a, b]]]), settings, v7);
  assert.deepEqual(v8.staleFlows, [], 'a TCP port that had endpoints already: nothing');
});

test('stale flows: a UDP service scaled to zero endpoints (kubernetes#139628): its DNATed flows go, within a run and at the first view', () => {
  const settings = nodeSettings(resolveConfig({}), { nodeName: NODE, nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 });
  const udp = sp('dns', { protocol: 'UDP', nodePort: 30053 });
  const tcp = sp('web');
  const a = ep('10.180.1.1');
  // within a run: from [a] to none, the flows DNATed to a (ClusterIP and NodePort)
  const v1 = buildViewFrom(stateOf([[udp, [a]]]), settings);
  const v2 = buildViewFrom(stateOf([[udp, []]]), settings, v1);
  assert.deepEqual(v2.staleFlows, [
    { kind: 'endpoint', protocol: 'UDP', serviceIP: '172.30.0.1', port: 80, endpointIP: '10.180.1.1', endpointPort: 8080 },
    { kind: 'endpoint', protocol: 'UDP', serviceIP: '', port: 30053, endpointIP: '10.180.1.1', endpointPort: 8080 },
  ]);
  // the first view (a start while the service already has none): every flow to its addresses
  // and NodePort, whatever endpoint it was DNATed to (upstream: an empty endpoint set, not skipped)
  const first = buildViewFrom(stateOf([[udp, []], [tcp, []]]), settings);
  assert.deepEqual(first.staleFlows, [
    { kind: 'service', protocol: 'UDP', ip: '172.30.0.1', port: 80 },
    { kind: 'nodePort', protocol: 'UDP', port: 30053 },
  ], 'a TCP port without endpoints has nothing to clear');
  assert.deepEqual(buildViewFrom(stateOf([[udp, [a]]]), settings).staleFlows, [], 'a UDP service with endpoints at the first view: nothing');
});

// ---- planners render, they do not decide --------------------------------------------------

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((e) => {
    const p = join(dir, e);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

test('no planner under src/modes categorises endpoints or re-derives a policy the node view decides', () => {
  const modesDir = resolve(import.meta.dirname, '../../src/modes');
  const forbidden: Array<[RegExp, string]> = [
    [/from ['"][^'"]*core\/categorize(\.ts)?['"]/, 'imports categorize.ts'],
    [/\bcategorizeEndpoints\s*\(/, 'calls categorizeEndpoints'],
    [/\busesClusterEndpoints\s*\(/, 'calls usesClusterEndpoints'],
    [/\busesLocalEndpoints\s*\(/, 'calls usesLocalEndpoints'],
    [/\bexternallyAccessible\s*\(/, 'calls externallyAccessible'],
    [/config\.nodePortAddresses/, 'reads nodePortAddresses (the view resolves them)'],
    [/config\.clusterCIDRs/, 'reads clusterCIDRs (the view resolves the detector)'],
    [/config\.detectLocal/, 'reads detectLocal (the view resolves the detector)'],
    [/\bsafeServicePort\s*\(/, 'drops unsafe VIPs itself (the view does)'],
  ];
  const problems: string[] = [];
  // the planners and tracers: a mode's host side (index, proxier, cleanup, the userspace data
  // plane) probes the host and is not a planner
  const host = /(^|\/)(index|proxier|sharded|cleanup|registry|types|skipped-vips)\.ts$|userspace\/dataplane\//;
  for (const f of files(modesDir)) {
    if (host.test(f.slice(modesDir.length + 1))) continue;
    const text = readFileSync(f, 'utf8');
    for (const [re, what] of forbidden) if (re.test(text)) problems.push(`${f.slice(modesDir.length + 1)} ${what}`);
  }
  assert.deepEqual(problems, []);
});

test('the view prints the masquerade mark as upstream does: %#08x of 1<<bit', () => {
  for (const [bit, mark] of [[0, '0x00000001'], [14, '0x00004000'], [15, '0x00008000'], [31, '0x80000000']] as const) {
    assert.equal(buildNodeView(input(stateOf([]), { iptables: { masqueradeBit: bit } })).masqueradeMark, mark, `bit ${bit}`);
  }
});
