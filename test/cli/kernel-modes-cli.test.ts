// kproxy as a user runs it, on the real kernel, inside namespaces this test creates:
//   client ns (203.0.113.2) ── veth ── node ns (kproxy; 203.0.113.1, 10.180.0.254) ── veth ── pod ns (10.180.0.1, .2)
// 1. iptables mode: curl through the ClusterIP from the client reaches every endpoint,
//    `kproxy trace --live` agrees with where packets really go, and an edited manifest takes
//    effect within 5 s.
// 2. Mode switching iptables → nftables → userspace on one kernel, traffic verified after
//    each switch, and no residue of the previous mode; `kproxy cleanup` leaves nothing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Netns, uniqueName, vethPair, waitFor, repoRoot } from '../support/netns.ts';

const CLUSTER_IP = '172.30.0.10';
const EXTERNAL_IP = '198.51.100.10';
const LB_IP = '1.2.3.4';

function manifests(endpoints: string[]): string {
  return `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: ${CLUSTER_IP}
  type: LoadBalancer
  externalIPs: [${EXTERNAL_IP}]
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP, nodePort: 30053}
status:
  loadBalancer:
    ingress: [{ip: ${LB_IP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 5353, protocol: UDP}
endpoints:
${endpoints.map((e) => `- addresses: [${e}]\n  nodeName: other-node`).join('\n')}
---
# This node: its InternalIP is the address NodePorts are served on in the nftables mode,
# whose default nodePortAddresses is "primary" (upstream v1.31+).
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: 203.0.113.1}]
`;
}

const tag = uniqueName('kpt-cli');
const node = new Netns(`${tag}-n`);
const pods = new Netns(`${tag}-p`);
const client = new Netns(`${tag}-c`);
const dir = mkdtempSync(join(tmpdir(), 'kp-cli-'));

before(async () => {
  for (const ns of [node, pods, client]) Netns.create(ns.name);
  vethPair(node, 'to-pods', '10.180.0.254/16', pods, 'eth0', '10.180.0.1/16');
  pods.exec('ip', ['addr', 'add', '10.180.0.2/16', 'dev', 'eth0']);
  pods.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  vethPair(node, 'to-client', '203.0.113.1/24', client, 'eth0', '203.0.113.2/24');
  client.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.1']);
  // A real node has a default route; locally generated packets to a ClusterIP need one to
  // be routed at all before nat OUTPUT rewrites them.
  node.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.2']);
  node.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  for (const [id, ip] of [['pod-1', '10.180.0.1'], ['pod-2', '10.180.0.2']]) {
    const p = pods.node('test/support/backend-main.ts', [id, `tcp:${ip}:8080`, `udp:${ip}:5353`]);
    await waitFor(`backend ${id}`, () => new Promise<boolean>((r) => p.stdout!.once('data', () => r(true))), 15_000);
  }
});

after(async () => {
  for (const ns of [node, pods, client]) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

function send(from: Netns, proto: 'tcp' | 'udp', ip: string, port: number, n: number): { replies: Record<string, number>; errors: Record<string, number> } {
  const out = from.exec(process.execPath, ['--import', 'tsx', join(repoRoot, 'test/support/client-main.ts'), proto, ip, String(port), String(n), '2000']);
  return JSON.parse(out.trim().split('\n').at(-1)!);
}

async function startKproxy(mode: string): Promise<{ proc: ChildProcess; log: () => string }> {
  let log = '';
  const proc = node.kproxy(
    ['run', '--mode', mode, '--manifests', dir, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
    (s) => (log += s),
  );
  await waitFor(`kproxy ${mode} healthy`, () => node.exec('curl', ['-sf', '127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 30_000, 200)
    .catch((e) => assert.fail(`${e.message}\n${log}`));
  return { proc, log: () => log };
}

function assertReachesBoth(mode: string): void {
  const tcp = send(client, 'tcp', CLUSTER_IP, 80, 20);
  assert.deepEqual(tcp.errors, {}, `${mode}: ${JSON.stringify(tcp)}`);
  assert.ok(tcp.replies['pod-1'] > 0 && tcp.replies['pod-2'] > 0, `${mode}: TCP reaches both pods: ${JSON.stringify(tcp)}`);
  const udp = send(client, 'udp', CLUSTER_IP, 53, 20);
  assert.ok((udp.replies['pod-1'] ?? 0) + (udp.replies['pod-2'] ?? 0) >= 18, `${mode}: UDP answered: ${JSON.stringify(udp)}`);
  const fromNode = send(node, 'tcp', CLUSTER_IP, 80, 10);
  assert.deepEqual(fromNode.errors, {}, `${mode}: from the node itself: ${JSON.stringify(fromNode)}`);
  const nodePort = send(client, 'tcp', '203.0.113.1', 30080, 10);
  assert.deepEqual(nodePort.errors, {}, `${mode}: NodePort: ${JSON.stringify(nodePort)}`);
  const external = send(client, 'tcp', EXTERNAL_IP, 80, 10);
  assert.deepEqual(external.errors, {}, `${mode}: external IP: ${JSON.stringify(external)}`);
  const lb = send(client, 'tcp', LB_IP, 80, 10);
  assert.deepEqual(lb.errors, {}, `${mode}: load balancer IP: ${JSON.stringify(lb)}`);
}

const residue = {
  iptables: () => /^:KUBE-(SVC|SEP|SERVICES|NODEPORTS)/m.test(node.exec('iptables-save', [], { allowFail: true })),
  nftables: () => node.exec('nft', ['list', 'tables'], { allowFail: true }).includes('kube-proxy'),
  userspace: () => node.exec('iptables-save', [], { allowFail: true }).includes('KPROXY-USERSPACE'),
};

test('iptables mode via the CLI: traffic, trace --live agrees, manifest edits within 5 s', async () => {
  writeFileSync(join(dir, 'web.yaml'), manifests(['10.180.0.1', '10.180.0.2']));
  const k = await startKproxy('iptables');
  try {
    assertReachesBoth('iptables');
    // Localhost NodePorts (upstream iptables default): 127.0.0.1:NodePort from the node
    // reaches the pods, which needs route_localnet=1 in this namespace.
    assert.equal(node.exec('sysctl', ['-n', 'net.ipv4.conf.all.route_localnet']).trim(), '1');
    const localhost = send(node, 'tcp', '127.0.0.1', 30080, 6);
    assert.deepEqual(localhost.errors, {}, `localhost NodePort: ${JSON.stringify(localhost)}`);
    const trace = JSON.parse(node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'trace', '--mode', 'iptables', '--live',
      '--from', '203.0.113.2', '--to', `${CLUSTER_IP}:80`, '--json']));
    assert.equal(trace.output, '10.180.0.1:8080, 10.180.0.2:8080');
    assert.equal(trace.masq, true, 'traffic from outside the cluster CIDR is masqueraded');
    assert.ok(trace.rules.length > 2);

    writeFileSync(join(dir, 'web.yaml'), manifests(['10.180.0.2']));
    const t0 = Date.now();
    await waitFor('the removed endpoint stops getting traffic', () => {
      const r = send(client, 'tcp', CLUSTER_IP, 80, 6);
      return r.replies['pod-2'] === 6;
    }, 5_000, 100);
    assert.ok(Date.now() - t0 <= 5_000);
    const trace2 = JSON.parse(node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'trace', '--mode', 'iptables', '--live',
      '--from', '203.0.113.2', '--to', `${CLUSTER_IP}:80`, '--json']));
    assert.equal(trace2.output, '10.180.0.2:8080', 'trace --live follows the kernel');
  } finally {
    await node.kill(k.proc);
  }
});

test('mode switching iptables → nftables → userspace leaves no residue; cleanup removes all', async () => {
  writeFileSync(join(dir, 'web.yaml'), manifests(['10.180.0.1', '10.180.0.2']));
  let k = await startKproxy('iptables');
  assertReachesBoth('iptables');
  await node.kill(k.proc);
  assert.ok(residue.iptables(), 'iptables rules stay in place when kproxy stops');

  k = await startKproxy('nftables');
  try {
    assert.equal(residue.iptables(), false, 'the iptables mode\'s chains are gone');
    assert.ok(residue.nftables());
    assertReachesBoth('nftables');
  } finally {
    await node.kill(k.proc);
  }

  k = await startKproxy('userspace');
  try {
    assert.equal(residue.nftables(), false, 'the nftables table is gone');
    assertReachesBoth('userspace');
  } finally {
    await node.kill(k.proc);
  }

  node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup']);
  assert.equal(residue.iptables(), false);
  assert.equal(residue.nftables(), false);
  assert.equal(residue.userspace(), false);
});

for (const mode of ['iptables', 'nftables']) {
  test(`${mode}: kproxy restarted during traffic fails no connection`, async () => {
    writeFileSync(join(dir, 'web.yaml'), manifests(['10.180.0.1', '10.180.0.2']));
    let k = await startKproxy(mode);
    // A bounded connection loop in the background (3000 connections, 8 ms apart: 25-40 s), while kproxy restarts.
    let out = '';
    const loop = client.spawn(process.execPath, ['--import', 'tsx', join(repoRoot, 'test/support/client-main.ts'), 'tcp', CLUSTER_IP, '80', '3000', '2000', '', '8'],
      { onOutput: (d) => (out += d) });
    const finished = new Promise<void>((r) => loop.once('exit', () => r()));
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(loop.exitCode, null, 'the loop is running when kproxy stops');
    await node.kill(k.proc);
    k = await startKproxy(mode);
    assert.equal(loop.exitCode, null, 'the loop is still running when the new kproxy is up');
    await finished;
    await node.kill(k.proc);
    const res = JSON.parse(out.trim().split('\n').at(-1)!);
    const total = Object.values(res.replies as Record<string, number>).reduce((a, b) => a + b, 0);
    assert.equal(total, 3000, `every connection answered: ${out}`);
    assert.deepEqual(res.errors, {});
  });
}
