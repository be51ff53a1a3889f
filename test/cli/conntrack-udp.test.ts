// Conntrack at run time, on the real kernel, in namespaces this test creates:
//   client ns (203.0.113.2) ── veth ── node ns (kproxy) ── veth ── pod ns (10.180.0.1 "A", 10.180.0.2 "B")
// A UDP client keeps one socket (fixed source port 40053) and sends to the ClusterIP every
// 200 ms; conntrack pins the flow to endpoint A. The manifest then swaps the endpoint to B
// (A keeps running and answering): the same socket must reach B within 5 s, which only
// happens because kproxy deletes the stale flow after the sync (without it the entry, kept
// alive by the traffic, would stay on A). Also: kproxy's oom_score_adj and a conntrack sysctl
// of its config applied in the node namespace. The config raises oom_score_adj (321) rather
// than the default -999: lowering it needs CAP_SYS_RESOURCE, which a test host may lack (the
// default's skip-with-one-warning is covered by test/kernel/conntrack.test.ts).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Netns, uniqueName, vethPair, waitFor, repoRoot } from '../support/netns.ts';

const CIP = '172.30.0.53';
const A = '10.180.0.1';
const B = '10.180.0.2';
const SRC_PORT = 40053;

const manifests = (ep: string) => `apiVersion: v1
kind: Service
metadata: {name: dns, namespace: t}
spec:
  clusterIP: ${CIP}
  ports:
  - {name: dns, port: 53, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: dns-1
  namespace: t
  labels: {kubernetes.io/service-name: dns}
addressType: IPv4
ports:
- {name: dns, port: 5353, protocol: UDP}
endpoints:
- addresses: [${ep}]
  nodeName: other-node
`;

const tag = uniqueName('kpt-ct');
const node = new Netns(`${tag}-n`);
const pods = new Netns(`${tag}-p`);
const client = new Netns(`${tag}-c`);
const dir = mkdtempSync(join(tmpdir(), 'kp-ct-'));
const manifestDir = join(dir, 'manifests');
const configFile = join(dir, 'config.yaml');

function writeManifest(ep: string): void {
  // atomic replace: the watcher never reads half a file
  writeFileSync(join(dir, 'dns.tmp'), manifests(ep));
  renameSync(join(dir, 'dns.tmp'), join(manifestDir, 'dns.yaml'));
}

before(async () => {
  for (const ns of [node, pods, client]) Netns.create(ns.name);
  vethPair(node, 'to-pods', '10.180.0.254/16', pods, 'eth0', `${A}/16`);
  pods.exec('ip', ['addr', 'add', `${B}/16`, 'dev', 'eth0']);
  pods.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  vethPair(node, 'to-client', '203.0.113.1/24', client, 'eth0', '203.0.113.2/24');
  client.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.1']);
  node.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  for (const [id, ip] of [['A', A], ['B', B]]) {
    let out = '';
    pods.node('test/support/backend-main.ts', [id, `udp:${ip}:5353`], (d) => (out += d));
    await waitFor(`backend ${id}`, () => out.includes('READY'), 20_000, 50);
  }
  writeFileSync(configFile, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\noomScoreAdj: 321\nclusterCIDR: 10.0.0.0/8\nhealthzBindAddress: 127.0.0.1:10256\nmetricsBindAddress: 127.0.0.1:10249\nconntrack:\n  udpTimeout: 47s\n');
});

after(async () => {
  node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup'], { allowFail: true });
  for (const ns of [node, pods, client]) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

async function startKproxy(mode: string): Promise<{ proc: ChildProcess; log: () => string }> {
  let log = '';
  const proc = node.kproxy(
    // as upstream, --config wins over the configuration flags: the CIDR and addresses are in the file
    ['run', '--mode', mode, '--config', configFile, '--manifests', manifestDir, '--hostname-override', 'node-a'],
    (s) => (log += s),
  );
  await waitFor(`kproxy ${mode} healthy`, () => node.exec('curl', ['-sf', '127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 30_000, 200)
    .catch((e) => assert.fail(`${e.message}\n${log}`));
  return { proc, log: () => log };
}

/** the backends' ids in the client's replies since `from` (an index into the reply list) */
const since = (replies: string[], from: number) => replies.slice(from);

for (const mode of ['iptables', 'nftables']) {
  test(`${mode}: a UDP client pinned to a removed endpoint reaches the new one within 5 s from the same source port`, async () => {
    // a fresh conntrack table per mode: the previous mode's flow must not help or hurt
    node.exec('conntrack', ['-F'], { allowFail: true });
    rmSync(manifestDir, { recursive: true, force: true });
    mkdirSync(manifestDir, { recursive: true });
    writeManifest(A);
    const k = await startKproxy(mode);
    let c: ChildProcess | null = null;
    try {
      // start settings: oom_score_adj of the kproxy process, a conntrack sysctl of the config
      const oom = node.exec('cat', [`/proc/${k.proc.pid}/oom_score_adj`]).trim();
      assert.equal(oom, '321', `oom_score_adj of kproxy (pid ${k.proc.pid})\n${k.log()}`);
      assert.equal(node.exec('sysctl', ['-n', 'net.netfilter.nf_conntrack_udp_timeout']).trim(), '47', 'udpTimeout applied in the node namespace');

      const replies: string[] = [];
      let out = '';
      c = client.node('test/support/udp-pinned-main.ts', [CIP, '53', String(SRC_PORT), '200', '120000'], (d) => {
        out += d;
        for (;;) {
          const i = out.indexOf('\n');
          if (i < 0) break;
          const line = out.slice(0, i);
          out = out.slice(i + 1);
          if (line.startsWith('REPLY ')) replies.push(line.slice(6));
        }
      });
      await waitFor('the client pinned to A', () => replies.filter((r) => r === 'A').length >= 3, 20_000, 100)
        .catch((e) => assert.fail(`${e.message}; replies ${JSON.stringify(replies)}\n${k.log()}`));
      const flows = node.exec('conntrack', ['-L', '-p', 'udp', '--orig-port-src', String(SRC_PORT)], { allowFail: true });
      assert.match(flows, new RegExp(`src=${A.replace(/\./g, '\\.')} `), `the flow is DNATed to A:\n${flows}`);

      // the switch: A leaves the Service (it keeps running and answering), B joins
      const mark = replies.length;
      const syncsBefore = (k.log().match(/"msg":"synced"/g) ?? []).length;
      writeManifest(B);
      await waitFor('kproxy synced the new endpoint', () => (k.log().match(/"msg":"synced"/g) ?? []).length > syncsBefore, 20_000, 50)
        .catch((e) => assert.fail(`${e.message}\n${k.log()}`));
      const synced = Date.now();
      await waitFor('the same socket reaches B', () => since(replies, mark).includes('B'), 5_000, 50)
        .catch((e) => assert.fail(`${e.message}; replies since the switch ${JSON.stringify(since(replies, mark))}\n${node.exec('conntrack', ['-L', '-p', 'udp'], { allowFail: true })}\n${k.log()}`));
      assert.ok(Date.now() - synced <= 5_000);
      // from then on only B: the stale flow is gone, the new one goes to B
      const mark2 = replies.length;
      await waitFor('three more replies', () => replies.length >= mark2 + 3, 10_000, 50);
      assert.deepEqual([...new Set(since(replies, mark2))], ['B'], JSON.stringify(since(replies, mark2)));
      const metrics = node.exec('curl', ['-sf', '127.0.0.1:10249/metrics']);
      const deleted = /^kubeproxy_conntrack_reconciler_deleted_entries_total\{ip_family="IPv4"\} (\d+)/m.exec(metrics);
      assert.ok(deleted && Number(deleted[1]) >= 1, `deleted entries counted:\n${metrics.split('\n').filter((l) => l.includes('conntrack')).join('\n')}`);
    } finally {
      if (c) await client.kill(c);
      await node.kill(k.proc);
    }
  });
}
