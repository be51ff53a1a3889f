// A UDP Service scaled to zero endpoints (kubernetes#139628, fixed by kubernetes#139629), on
// the real kernel, in namespaces this test creates:
//   client ns (203.0.113.2) ── veth ── node ns (kproxy) ── veth ── pod ns (10.180.0.1 "A")
// A UDP client keeps one socket (fixed source port) and sends to the ClusterIP every 200 ms;
// conntrack pins the flow to A. A keeps running and answering throughout: only the entry can
// send the client there. The Service then loses its endpoint, (1) while kproxy runs, and
// (2) while kproxy is stopped (its rules stay in place), kproxy starting again afterwards.
// Either way the entry DNATed to A must go (conntrack -L in the node namespace), the client
// must get no more answers from A, and a new packet to the ClusterIP must be rejected.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Netns, uniqueName, vethPair, waitFor, repoRoot } from '../support/netns.ts';

const CIP = '172.30.0.54';
const A = '10.180.0.1';

const manifest = (endpoints: string[]) => `apiVersion: v1
kind: Service
metadata: {name: stats, namespace: t}
spec:
  clusterIP: ${CIP}
  ports:
  - {name: stats, port: 8125, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: stats-1
  namespace: t
  labels: {kubernetes.io/service-name: stats}
addressType: IPv4
ports:
- {name: stats, port: 5353, protocol: UDP}
endpoints: [${endpoints.map((ip) => `{addresses: [${ip}], nodeName: other-node}`).join(', ')}]
`;

/** Datagrams from a connected socket (a fresh flow): the kernel reports the ICMP port unreachable of a reject as ECONNREFUSED on the next send; REPLY when an endpoint answers. */
const PROBE = `const s = require('node:dgram').createSocket('udp4');
s.on('error', (e) => { console.log('ERR ' + e.code); process.exit(0); });
s.on('message', (m) => { console.log('REPLY ' + m.toString().trim()); process.exit(0); });
s.connect(8125, '${CIP}', () => { s.send('probe'); setInterval(() => s.send('probe'), 300); });
setTimeout(() => { console.log('TIMEOUT'); process.exit(0); }, 5000);`;

const tag = uniqueName('kpt-ctz');
const node = new Netns(`${tag}-n`);
const pods = new Netns(`${tag}-p`);
const client = new Netns(`${tag}-c`);
const dir = mkdtempSync(join(tmpdir(), 'kp-ctz-'));
const manifestDir = join(dir, 'manifests');
const configFile = join(dir, 'config.yaml');

function writeManifest(endpoints: string[]): void {
  writeFileSync(join(dir, 'stats.tmp'), manifest(endpoints));
  renameSync(join(dir, 'stats.tmp'), join(manifestDir, 'stats.yaml'));
}

before(async () => {
  for (const ns of [node, pods, client]) Netns.create(ns.name);
  vethPair(node, 'to-pods', '10.180.0.254/16', pods, 'eth0', `${A}/16`);
  pods.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  vethPair(node, 'to-client', '203.0.113.1/24', client, 'eth0', '203.0.113.2/24');
  client.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.1']);
  node.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  // a default route (nobody on that link answers ARP for a ClusterIP: a sink): a packet to a
  // ClusterIP without endpoints is routed, so it reaches the forward hook where kproxy's
  // reject is, as on a real node
  node.exec('ip', ['route', 'add', 'default', 'dev', 'to-pods']);
  let out = '';
  pods.node('test/support/backend-main.ts', ['A', `udp:${A}:5353`], (d) => (out += d));
  await waitFor('backend A', () => out.includes('READY'), 20_000, 50);
  writeFileSync(configFile, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclusterCIDR: 10.0.0.0/8\nhealthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\n');
});

after(async () => {
  node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup'], { allowFail: true });
  for (const ns of [node, pods, client]) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

async function startKproxy(mode: string): Promise<{ proc: ChildProcess; log: () => string }> {
  let log = '';
  const proc = node.kproxy(['run', '--mode', mode, '--config', configFile, '--manifests', manifestDir, '--manifests-state', join(dir, 'state.json'), '--hostname-override', 'node-a'], (s) => (log += s));
  await waitFor(`kproxy ${mode} healthy`, () => node.exec('curl', ['-sf', '127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 30_000, 200)
    .catch((e) => assert.fail(`${e.message}\n${log}`));
  return { proc, log: () => log };
}

/** The node namespace's UDP conntrack entries of the client's source port. */
const entries = (srcPort: number) => node.exec('conntrack', ['-L', '-p', 'udp', '--orig-port-src', String(srcPort)], { allowFail: true });
const toA = new RegExp(`src=${A.replace(/\./g, '\\.')} `);

function pinnedClient(srcPort: number): { proc: ChildProcess; replies: string[]; sent: () => number } {
  const replies: string[] = [];
  let sent = 0;
  let out = '';
  const proc = client.node('test/support/udp-pinned-main.ts', [CIP, '8125', String(srcPort), '200', '120000'], (d) => {
    out += d;
    for (let i = out.indexOf('\n'); i >= 0; i = out.indexOf('\n')) {
      const line = out.slice(0, i);
      out = out.slice(i + 1);
      if (line.startsWith('REPLY ')) replies.push(line.slice(6));
      else if (line === 'SENT') sent++;
    }
  });
  return { proc, replies, sent: () => sent };
}

async function pinnedToA(c: { replies: string[] }, srcPort: number, log: () => string): Promise<void> {
  await waitFor('the client pinned to A', () => c.replies.filter((r) => r === 'A').length >= 3, 20_000, 100)
    .catch((e) => assert.fail(`${e.message}; replies ${JSON.stringify(c.replies)}\n${log()}`));
  assert.match(entries(srcPort), toA, 'the flow is DNATed to A');
}

/**
 * The entry to A is gone and stays gone while the client sends five more datagrams of the
 * same flow, A answers none of them, and a packet of a fresh flow is rejected (the client is
 * stopped first: the kernel rate-limits ICMP errors per destination, and the client's own
 * rejected datagrams would use them up).
 */
async function staleFlowCleared(c: { proc: ChildProcess; replies: string[]; sent: () => number }, srcPort: number, log: () => string): Promise<void> {
  await waitFor('the entry DNATed to A is deleted', () => !toA.test(entries(srcPort)), 10_000, 100)
    .catch((e) => assert.fail(`${e.message}:\n${entries(srcPort)}\n${log()}`));
  // a reply of A to a datagram sent just before the deletion may still be on its way: count
  // from two sends (400 ms) later
  const deletedAt = c.sent();
  await waitFor('two more datagrams', () => c.sent() >= deletedAt + 2, 20_000, 20);
  const mark = c.replies.length;
  const sentMark = c.sent();
  await waitFor('five more datagrams of the same flow', () => c.sent() >= sentMark + 5, 20_000, 50);
  assert.doesNotMatch(entries(srcPort), toA, 'no entry to A after more datagrams of the same flow');
  await client.kill(c.proc);
  assert.deepEqual(c.replies.slice(mark), [], 'no answer from A after the entry went');
  const probe = client.exec(process.execPath, ['-e', PROBE]).trim();
  assert.equal(probe, 'ERR ECONNREFUSED', `a new packet to the ClusterIP is rejected, not sent to A\n${log()}`);
}

for (const mode of ['iptables', 'nftables']) {
  test(`${mode}: a UDP Service scaled to zero while kproxy runs: the flow pinned to its endpoint is cleared, new packets rejected`, async () => {
    node.exec('conntrack', ['-F'], { allowFail: true });
    rmSync(manifestDir, { recursive: true, force: true });
    mkdirSync(manifestDir, { recursive: true });
    writeManifest([A]);
    const k = await startKproxy(mode);
    const srcPort = mode === 'iptables' ? 41125 : 42125;
    const c = pinnedClient(srcPort);
    try {
      await pinnedToA(c, srcPort, k.log);
      const syncsBefore = (k.log().match(/"msg":"synced"/g) ?? []).length;
      writeManifest([]);
      await waitFor('kproxy synced the empty endpoint set', () => (k.log().match(/"msg":"synced"/g) ?? []).length > syncsBefore, 20_000, 50)
        .catch((e) => assert.fail(`${e.message}\n${k.log()}`));
      await staleFlowCleared(c, srcPort, k.log);
    } finally {
      await client.kill(c.proc);
      await node.kill(k.proc);
    }
  });

  test(`${mode}: a UDP Service scaled to zero while kproxy is stopped: the first sync after the start clears the flow (kubernetes#139629)`, async () => {
    node.exec('conntrack', ['-F'], { allowFail: true });
    rmSync(manifestDir, { recursive: true, force: true });
    mkdirSync(manifestDir, { recursive: true });
    writeManifest([A]);
    let k = await startKproxy(mode);
    const srcPort = mode === 'iptables' ? 43125 : 44125;
    const c = pinnedClient(srcPort);
    try {
      await pinnedToA(c, srcPort, k.log);
      // stopped: the rules stay in place and keep the flow on A; the Service loses A meanwhile
      await node.kill(k.proc);
      writeManifest([]);
      const mark = c.replies.length;
      await waitFor('the flow stays on A while kproxy is down', () => c.replies.length >= mark + 3, 10_000, 100);
      assert.match(entries(srcPort), toA);
      k = await startKproxy(mode);
      await staleFlowCleared(c, srcPort, k.log);
    } finally {
      await client.kill(c.proc);
      await node.kill(k.proc);
    }
  });
}
