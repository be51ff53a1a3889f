// Names at the API server's limits, on the real kernel, with real traffic: a Service whose
// namespace, name and first port name are 63 characters each (DNS-1123 labels, the most the API
// server accepts) and whose second port is named "8443" (all digits: a valid DNS-1123 label),
// with a 15-character named targetPort, ClientIP affinity, an external IP and a load-balancer IP
// with loadBalancerSourceRanges, is programmed by `kproxy run` in the userspace, iptables and
// nftables modes, and by the nftables mode spread over 2 tables (NftProxier), inside
// namespaces this test creates:
//   client ns (203.0.113.2) ── veth ── node ns (kproxy; 203.0.113.1, 10.180.0.254) ── veth ── pod ns (10.180.0.1, .2)
// TCP from the client reaches a pod through the ClusterIP (both ports), the NodePort, the
// external IP and the load-balancer IP. Every name the mode derived is in the kernel whole or as
// upstream shortens it: iptables chains are KUBE-SVC-/KUBE-SEP- + 16 characters of upstream's
// hash (servicePortChainName) with the full "ns/name:port" in the comments (under
// XT_MAX_COMMENT_LEN); nftables chains are "service-" + upstream's servicePortChainNameBase with
// the full names (under NFT_NAME_MAXLEN). The ipvs mode's counterpart runs in the IPVS VM
// (test/ipvs/fixtures/vm-checks.ts, check long-names-traffic).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { stringify } from 'yaml';
import { Netns, uniqueName, vethPair, waitFor, repoRoot } from '../support/netns.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { silentLogger } from '../../src/log.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { mode as nftMode } from '../../src/modes/nftables/index.ts';
import { nsRunner } from '../nftables/objects.ts';
import { DIGIT_PORT_NAME, LONG_NAME, LONG_NS, LONG_PORT_NAME, longNamedService } from '../support/long-names.ts';

const NS = LONG_NS;
const NAME = LONG_NAME;
const PORT_NAME = LONG_PORT_NAME;
const CLUSTER_IP = '172.30.0.10';
const EXTERNAL_IP = '198.51.100.10';
const LB_IP = '1.2.3.4';
const NODE_IP = '203.0.113.1';

const objects = longNamedService({
  clusterIP: CLUSTER_IP,
  endpoints: ['10.180.0.1', '10.180.0.2'],
  endpointPorts: { long: 8080, digits: 8443 },
  nodePorts: { long: 30080, digits: 30443 },
  externalIPs: [EXTERNAL_IP],
  loadBalancer: { ip: LB_IP, sourceRanges: ['203.0.113.0/24'] },
  affinity: true,
});
// This node: its InternalIP is the address NodePorts are served on in the nftables mode,
// whose default nodePortAddresses is "primary" (upstream v1.31+).
const NODE = { apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-a' }, status: { addresses: [{ type: 'InternalIP', address: NODE_IP }] } };

const tag = uniqueName('kpt-long');
const node = new Netns(`${tag}-n`);
const pods = new Netns(`${tag}-p`);
const client = new Netns(`${tag}-c`);
const dir = mkdtempSync(join(tmpdir(), 'kp-long-'));

before(async () => {
  for (const ns of [node, pods, client]) Netns.create(ns.name);
  vethPair(node, 'to-pods', '10.180.0.254/16', pods, 'eth0', '10.180.0.1/16');
  pods.exec('ip', ['addr', 'add', '10.180.0.2/16', 'dev', 'eth0']);
  pods.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  vethPair(node, 'to-client', `${NODE_IP}/24`, client, 'eth0', '203.0.113.2/24');
  client.exec('ip', ['route', 'add', 'default', 'via', NODE_IP]);
  node.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.2']);
  node.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  // each pod answers with which of its servers it is: "<pod>-web" on 8080 (the long-named port's
  // targetPort), "<pod>-8443" on 8443
  for (const [pod, ip] of [['pod-1', '10.180.0.1'], ['pod-2', '10.180.0.2']]) {
    for (const [suffix, port] of [['web', 8080], ['8443', 8443]] as const) {
      const p = pods.node('test/support/backend-main.ts', [`${pod}-${suffix}`, `tcp:${ip}:${port}`]);
      await waitFor(`backend ${pod}-${suffix}`, () => new Promise<boolean>((r) => p.stdout!.once('data', () => r(true))), 15_000);
    }
  }
  writeFileSync(join(dir, 'svc.yaml'), [...objects, NODE].map((o) => stringify(o)).join('---\n'));
});

after(async () => {
  for (const ns of [node, pods, client]) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

function send(ip: string, port: number, n: number): { replies: Record<string, number>; errors: Record<string, number> } {
  const out = client.exec(process.execPath, ['--import', 'tsx', join(repoRoot, 'test/support/client-main.ts'), 'tcp', ip, String(port), String(n), '2000']);
  return JSON.parse(out.trim().split('\n').at(-1)!);
}

/** n connections to ip:port all answered, each by one of the pods' servers for `suffix`. */
function assertReaches(what: string, ip: string, port: number, suffix: 'web' | '8443'): void {
  const r = send(ip, port, 6);
  assert.deepEqual(r.errors, {}, `${what} ${ip}:${port}: ${JSON.stringify(r)}`);
  const total = Object.values(r.replies).reduce((a, b) => a + b, 0);
  assert.equal(total, 6, `${what} ${ip}:${port}: ${JSON.stringify(r)}`);
  for (const id of Object.keys(r.replies)) assert.match(id, new RegExp(`^pod-[12]-${suffix}$`), `${what} ${ip}:${port} answered by ${id}`);
}

function assertAllFrontends(what: string): void {
  assertReaches(`${what} ClusterIP`, CLUSTER_IP, 80, 'web');
  assertReaches(`${what} ClusterIP, port "8443"`, CLUSTER_IP, 8443, '8443');
  assertReaches(`${what} NodePort`, NODE_IP, 30080, 'web');
  assertReaches(`${what} NodePort, port "8443"`, NODE_IP, 30443, '8443');
  assertReaches(`${what} external IP`, EXTERNAL_IP, 80, 'web');
  assertReaches(`${what} load-balancer IP`, LB_IP, 8443, '8443');
}

async function startKproxy(mode: string): Promise<ChildProcess> {
  let log = '';
  const proc = node.kproxy(
    ['run', '--mode', mode, '--manifests', dir, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
    (s) => (log += s),
  );
  try {
    await waitFor(`kproxy ${mode} healthy`, () => node.exec('curl', ['-sf', '127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 30_000, 200)
      .catch((e) => assert.fail(`${e.message}\n${log}`));
    // validation refused nothing: kproxy_invalid_objects_total has no sample above 0
    const metrics = node.exec('curl', ['-sf', '127.0.0.1:10249/metrics']);
    const invalid = metrics.split('\n').filter((l) => l.startsWith('kproxy_invalid_objects_total') && !/ 0$/.test(l));
    assert.deepEqual(invalid, [], `${mode}: objects refused`);
    // no warning or error but the namespace's own (oom_score_adj cannot be set in it)
    const bad = log.split('\n').filter((l) => /"level":(40|50|60)/.test(l) && !l.includes('"code":"KPROXY_SYSCTL_FAILED"'));
    assert.deepEqual(bad, [], `${mode}: warnings or errors in the log`);
  } catch (e) {
    await node.kill(proc);
    throw e;
  }
  return proc;
}

function traceLive(mode: string, port: number): { output: string } {
  return JSON.parse(node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'trace', '--mode', mode, '--live',
    '--from', '203.0.113.2', '--to', `${CLUSTER_IP}:${port}`, '--json']));
}

const B32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';
/** base32 (RFC 4648) of sha256(text), first n characters: upstream's portProtoHash / hashAndTruncate prefix. */
function upstreamHash(text: string, n: number): string {
  const bytes = createHash('sha256').update(text).digest();
  let bits = '';
  for (const b of bytes) bits += b.toString(2).padStart(8, '0');
  let out = '';
  for (let i = 0; i < n; i++) out += B32[parseInt(bits.slice(i * 5, i * 5 + 5), 2)];
  return out;
}

test('userspace mode: a Service with 63-character names and an all-digit port name is reachable', async () => {
  const k = await startKproxy('userspace');
  try {
    assertAllFrontends('userspace');
    const nat = node.exec('iptables-save', ['-t', 'nat']);
    assert.ok(nat.includes(`"${NS}/${NAME}:${PORT_NAME} cluster IP"`), 'the full service port name in the DNAT comment');
    assert.ok(nat.includes(`"${NS}/${NAME}:${DIGIT_PORT_NAME} cluster IP"`));
  } finally {
    await node.kill(k);
  }
});

test('iptables mode: reachable; chains are upstream\'s hashes, comments hold the whole names', async () => {
  const k = await startKproxy('iptables');
  try {
    assertAllFrontends('iptables');
    const nat = node.exec('iptables-save', ['-t', 'nat']);
    for (const port of [PORT_NAME, DIGIT_PORT_NAME]) {
      // servicePortChainName: "KUBE-SVC-" + portProtoHash(servicePortName.String(), "tcp")
      const svc = `KUBE-SVC-${upstreamHash(`${NS}/${NAME}:${port}tcp`, 16)}`;
      assert.ok(nat.includes(`\n:${svc} `), `${svc} in the kernel:\n${nat}`);
      for (const chain of ['KUBE-EXT', 'KUBE-FW']) assert.ok(nat.includes(`\n:${chain}-${upstreamHash(`${NS}/${NAME}:${port}tcp`, 16)} `), chain);
      assert.ok(nat.includes(`--comment "${NS}/${NAME}:${port} cluster IP"`), `the whole name in the comment of ${port}`);
      // an endpoint chain per endpoint: "KUBE-SEP-" + portProtoHash(name + protocol + endpoint)
      for (const ep of ['10.180.0.1', '10.180.0.2']) {
        const sep = `KUBE-SEP-${upstreamHash(`${NS}/${NAME}:${port}tcp${ep}:${port === PORT_NAME ? 8080 : 8443}`, 16)}`;
        assert.ok(nat.includes(`\n:${sep} `), `${sep} (${port} → ${ep})`);
      }
    }
    for (const line of nat.split('\n').filter((l) => l.startsWith(':'))) assert.ok(line.split(' ')[0].length - 1 <= 28, line);
    assert.equal(traceLive('iptables', 8443).output, '10.180.0.1:8443, 10.180.0.2:8443');
    assert.equal(traceLive('iptables', 80).output, '10.180.0.1:8080, 10.180.0.2:8080');
  } finally {
    await node.kill(k);
  }
});

test('nftables mode: reachable; chain and set names are upstream\'s, whole, within NFT_NAME_MAXLEN', async () => {
  const k = await startKproxy('nftables');
  try {
    assertAllFrontends('nftables');
    const table = node.exec('nft', ['list', 'table', 'ip', 'kube-proxy']);
    for (const port of [PORT_NAME, DIGIT_PORT_NAME]) {
      // servicePortChainNameBase: hashAndTruncate("ns/name/proto/port"), not cut at this length
      const base = `${upstreamHash(`${NS}/${NAME}/tcp/${port}`, 8)}-${NS}/${NAME}/tcp/${port}`;
      for (const prefix of ['service', 'external', 'firewall']) assert.ok(table.includes(`chain ${prefix}-${base} {`), `chain ${prefix}-${base}`);
      const epPort = port === PORT_NAME ? 8080 : 8443;
      for (const ep of ['10.180.0.1', '10.180.0.2']) {
        const epBase = `${upstreamHash(`${NS}/${NAME}/tcp/${port}__${ep}/${epPort}`, 8)}-${NS}/${NAME}/tcp/${port}__${ep}/${epPort}`;
        assert.ok(table.includes(`chain endpoint-${epBase} {`), `chain endpoint-${epBase}`);
        assert.ok(table.includes(`set affinity-${epBase} {`), `set affinity-${epBase}`);
      }
    }
    for (const m of table.matchAll(/^\s*(?:chain|set|map) (\S+) \{/gm)) assert.ok(Buffer.byteLength(m[1]) < 256, m[1]);
    assert.equal(traceLive('nftables', 8443).output, '10.180.0.1:8443, 10.180.0.2:8443');
  } finally {
    await node.kill(k);
  }
  node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup']);
});

test('nftables mode over 2 tables (sharded): the long-named Service is reachable from its shard', async () => {
  // a second Service with short names, so that 2 tables hold one Service each
  const short: K8sService = { apiVersion: 'v1', kind: 'Service', metadata: { name: 'short', namespace: 'ns' },
    spec: { type: 'ClusterIP', clusterIP: '172.30.0.20', ports: [{ name: 'p', port: 80, protocol: 'TCP', targetPort: 8080 }] } };
  const shortSlice: K8sEndpointSlice = { apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', metadata: { name: 'short-1', namespace: 'ns', labels: { 'kubernetes.io/service-name': 'short' } },
    addressType: 'IPv4', ports: [{ name: 'p', port: 8080, protocol: 'TCP' }], endpoints: [{ addresses: ['10.180.0.2'], conditions: { ready: true } }] };
  let invalid = 0;
  const t = new ProxyStateTracker(4, 'node-a', () => {}, { onInvalid: () => invalid++ });
  for (const svc of [objects[0], short]) t.services.update(null, svc);
  for (const slice of [objects[1], shortSlice]) t.endpoints.update(null, slice);
  t.apply();
  assert.equal(invalid, 0);
  const input = {
    state: t.state,
    config: resolveConfig({ mode: 'nftables', clusterCIDR: '10.0.0.0/8' }),
    node: { nodeName: 'node-a', nodeIPs: [NODE_IP], nodeLabels: {}, family: 4 as const, addresses: [{ type: 'InternalIP', address: NODE_IP }] },
  };
  const runner = nsRunner(node.name);
  const px = new NftProxier({ runner, log: silentLogger(), shards: { threshold: 2, perTable: 1, maxTables: 2 } });
  try {
    await px.sync(input, new Set(), true);
    assert.deepEqual(px.tables(), ['kube-proxy-0', 'kube-proxy-1']);
    const tables = node.exec('nft', ['list', 'tables']);
    assert.ok(tables.includes('table ip kube-proxy-0') && tables.includes('table ip kube-proxy-1'), tables);
    assertAllFrontends('nftables, 2 tables');
    const r = send('172.30.0.20', 80, 3);
    assert.deepEqual(r, { replies: { 'pod-2-web': 3 }, errors: {} }, 'the other table\'s Service');
  } finally {
    await px.stop();
    await nftMode.cleanup(runner, silentLogger());
  }
  assert.ok(!node.exec('nft', ['list', 'tables']).includes('kube-proxy'), 'cleanup removed both tables');
});
