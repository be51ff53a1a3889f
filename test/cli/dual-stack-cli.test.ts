// Dual-stack at run time, on the real kernel, in namespaces this test creates:
//   client ns (203.0.113.2, fd00:203::2) ── veth ── node ns (kproxy) ── veth ── pod ns (10.180.0.1, fd00:10:180::1)
// One dual-stack Service (clusterIPs 172.30.0.10 and fd00:172:30::10, one EndpointSlice per
// family) answers on both ClusterIPs through `kproxy run --mode M --manifests DIR` in the
// iptables, nftables and userspace modes, from the node itself and from the client; each
// family reaches its own family's endpoint; `kproxy trace --live` agrees for both families;
// /debug/rules shows both families' rules.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Netns, uniqueName, vethPair, waitFor, repoRoot } from '../support/netns.ts';

const CIP4 = '172.30.0.10';
const CIP6 = 'fd00:172:30::10';
const POD4 = '10.180.0.1';
const POD6 = 'fd00:10:180::1';

const MANIFESTS = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: ${CIP4}
  clusterIPs: [${CIP4}, "${CIP6}"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports:
  - {name: http, port: 80, protocol: TCP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-v4
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [${POD4}]
  nodeName: other-node
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-v6
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv6
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: ["${POD6}"]
  nodeName: other-node
`;

const tag = uniqueName('kpt-ds');
const node = new Netns(`${tag}-n`);
const pods = new Netns(`${tag}-p`);
const client = new Netns(`${tag}-c`);
const dir = mkdtempSync(join(tmpdir(), 'kp-ds-'));

function addr6(ns: Netns, dev: string, cidr: string): void {
  ns.exec('ip', ['-6', 'addr', 'add', cidr, 'dev', dev, 'nodad']);
}

before(async () => {
  for (const ns of [node, pods, client]) {
    Netns.create(ns.name);
    ns.exec('sysctl', ['-qw', 'net.ipv6.conf.all.disable_ipv6=0']);
    ns.exec('sysctl', ['-qw', 'net.ipv6.conf.default.disable_ipv6=0']);
  }
  vethPair(node, 'to-pods', '10.180.0.254/16', pods, 'eth0', `${POD4}/16`);
  addr6(node, 'to-pods', 'fd00:10:180::fe/64');
  addr6(pods, 'eth0', `${POD6}/64`);
  pods.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  pods.exec('ip', ['-6', 'route', 'add', 'default', 'via', 'fd00:10:180::fe']);
  vethPair(node, 'to-client', '203.0.113.1/24', client, 'eth0', '203.0.113.2/24');
  addr6(node, 'to-client', 'fd00:203::1/64');
  addr6(client, 'eth0', 'fd00:203::2/64');
  client.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.1']);
  client.exec('ip', ['-6', 'route', 'add', 'default', 'via', 'fd00:203::1']);
  // A real node has default routes; locally generated packets to a ClusterIP need one per
  // family to be routed at all before nat OUTPUT rewrites them.
  node.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.2']);
  node.exec('ip', ['-6', 'route', 'add', 'default', 'via', 'fd00:203::2']);
  node.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  node.exec('sysctl', ['-qw', 'net.ipv6.conf.all.forwarding=1']);
  // Each backend's output is collected from its start (a READY printed before a listener
  // is attached would otherwise be lost) and polled, so the wait is bounded.
  for (const [id, spec] of [['pod-v4', `tcp:${POD4}:8080`], ['pod-v6', `tcp:${POD6}:8080`]]) {
    let out = '';
    pods.node('test/support/backend-main.ts', [id, spec], (d) => (out += d));
    await waitFor(`backend ${id}`, () => out.includes('READY'), 20_000, 50);
  }
  writeFileSync(join(dir, 'web.yaml'), MANIFESTS);
});

after(async () => {
  node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup'], { allowFail: true });
  for (const ns of [node, pods, client]) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

function send(from: Netns, ip: string, port: number, n: number): { replies: Record<string, number>; errors: Record<string, number> } {
  const out = from.exec(process.execPath, ['--import', 'tsx', join(repoRoot, 'test/support/client-main.ts'), 'tcp', ip, String(port), String(n), '2000']);
  return JSON.parse(out.trim().split('\n').at(-1)!);
}

async function startKproxy(mode: string): Promise<{ proc: ChildProcess; log: () => string }> {
  let log = '';
  const proc = node.kproxy(
    ['run', '--mode', mode, '--manifests', dir, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8,fd00:10::/32',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
    (s) => (log += s),
  );
  await waitFor(`kproxy ${mode} healthy`, () => node.exec('curl', ['-sf', '127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 30_000, 200)
    .catch((e) => assert.fail(`${e.message}\n${log}`));
  return { proc, log: () => log };
}

function trace(mode: string, from: string, to: string): { output: string; masq: boolean; rules: string[] } {
  return JSON.parse(node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'trace', '--mode', mode, '--live', '--from', from, '--to', to, '--json']));
}

for (const mode of ['iptables', 'nftables', 'userspace']) {
  test(`${mode}: a dual-stack Service answers on both ClusterIPs, each family at its own endpoint`, async () => {
    const k = await startKproxy(mode);
    try {
      const log = k.log();
      assert.match(log, /"families":\["IPv4","IPv6"\]/, `both families served:\n${log}`);
      const clients: Array<[string, Netns]> = [['node', node], ['client', client]];
      for (const [who, from] of clients) {
        const v4 = send(from, CIP4, 80, 5);
        assert.deepEqual(v4, { replies: { 'pod-v4': 5 }, errors: {} }, `${mode}: ${who} → ${CIP4}:80\n${k.log()}`);
        const v6 = send(from, CIP6, 80, 5);
        assert.deepEqual(v6, { replies: { 'pod-v6': 5 }, errors: {} }, `${mode}: ${who} → [${CIP6}]:80\n${k.log()}`);
      }
      const rules = node.exec('curl', ['-sf', '127.0.0.1:10249/debug/rules']);
      const i4 = rules.indexOf('# ==== kproxy IPv4 ====');
      const i6 = rules.indexOf('# ==== kproxy IPv6 ====');
      assert.ok(i4 >= 0 && i6 > i4, `/debug/rules: a section per family, IPv4 first:\n${rules}`);
      assert.ok(rules.slice(i6).includes(CIP6) && rules.slice(i4, i6).includes(CIP4), rules);
      const state = JSON.parse(node.exec('curl', ['-sf', '127.0.0.1:10249/debug/state']));
      assert.deepEqual(state.families.map((f: { family: string }) => f.family), ['IPv4', 'IPv6']);
      if (mode === 'userspace') {
        // IPv6 Service IPs are steered with ip6tables REDIRECT, IPv4 ones with iptables.
        assert.match(node.exec('ip6tables-save', ['-t', 'nat']), /KPROXY-USERSPACE/);
        assert.match(node.exec('iptables-save', ['-t', 'nat']), /KPROXY-USERSPACE/);
      } else {
        const t4 = trace(mode, '203.0.113.2', `${CIP4}:80`);
        assert.equal(t4.output, `${POD4}:8080`, JSON.stringify(t4));
        const t6 = trace(mode, 'fd00:203::2', `[${CIP6}]:80`);
        assert.equal(t6.output, `[${POD6}]:8080`, JSON.stringify(t6));
        assert.ok(t6.rules.length > 0);
        if (mode === 'nftables') assert.match(node.exec('nft', ['list', 'tables']), /table ip6 kube-proxy/);
        else assert.match(node.exec('ip6tables-save', ['-t', 'nat']), /^:KUBE-SVC-/m);
      }
    } finally {
      await node.kill(k.proc);
    }
  });
}

test('cleanup removes both families\' state', () => {
  node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup']);
  assert.doesNotMatch(node.exec('ip6tables-save', [], { allowFail: true }), /KUBE-SVC|KPROXY-USERSPACE/);
  assert.doesNotMatch(node.exec('iptables-save', [], { allowFail: true }), /KUBE-SVC|KPROXY-USERSPACE/);
  assert.doesNotMatch(node.exec('nft', ['list', 'tables'], { allowFail: true }), /kube-proxy/);
});
