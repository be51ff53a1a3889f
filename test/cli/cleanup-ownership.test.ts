// Cleanup scope, on the real kernel, in a namespace this test creates:
// another program's chains (the kubelet's KUBE-KUBELET-CANARY in mangle, nat and filter,
// kube-router's KUBE-ROUTER-INPUT in filter with a jump from INPUT, both families), another
// program's ipset and nftables table survive a mode-switch start (iptables → nftables) and
// `kproxy cleanup`; everything of kproxy's (and kube-proxy's) is gone afterwards: its
// iptables and ip6tables chains and jumps, the `kube-proxy` nftables tables and the shards'
// `kube-proxy-<n>` (not an inet table or a look-alike name), the ipvs mode's ipsets and
// kube-ipvs0.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Netns, sh, uniqueName, vethPair, waitFor, repoRoot } from '../support/netns.ts';

const tag = uniqueName('kpt-own');
const node = new Netns(`${tag}-n`);
const peer = new Netns(`${tag}-p`);
const dir = mkdtempSync(join(tmpdir(), 'kp-own-'));

const MANIFESTS = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: 172.30.0.10
  type: NodePort
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: 30080}
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
endpoints:
- addresses: [10.180.0.1]
  nodeName: node-b
`;

/** Another program's state: the kubelet's canaries, kube-router's input chain, a CNI's ipset and nft table. */
function addForeignState(): void {
  for (const ipt of ['iptables', 'ip6tables']) {
    for (const table of ['mangle', 'nat', 'filter']) node.exec(ipt, ['-w', '5', '-t', table, '-N', 'KUBE-KUBELET-CANARY']);
    node.exec(ipt, ['-w', '5', '-t', 'filter', '-N', 'KUBE-ROUTER-INPUT']);
    node.exec(ipt, ['-w', '5', '-t', 'filter', '-A', 'KUBE-ROUTER-INPUT', '-p', 'tcp', '--dport', '179', '-j', 'ACCEPT']);
    node.exec(ipt, ['-w', '5', '-t', 'filter', '-I', 'INPUT', '-m', 'comment', '--comment', 'kube-router netpol', '-j', 'KUBE-ROUTER-INPUT']);
  }
  node.exec('ipset', ['create', 'kube-router-pod-subnets', 'hash:net']);
  node.exec('nft', ['add', 'table', 'ip', 'cni-other']);
  // names like the shards' that are not kube-proxy's (another family, a look-alike)
  node.exec('nft', ['add', 'table', 'inet', 'kube-proxy-1']);
  node.exec('nft', ['add', 'table', 'ip', 'kube-proxy-x']);
}

/** kube-proxy's nftables tables: `kube-proxy` and the shards' `kube-proxy-<n>`, of ip and ip6. */
const KUBE_PROXY_NFT = /^table ip6? kube-proxy(-\d+)?$/m;

/** The ipvs mode's leftovers as an earlier ipvs kproxy / kube-proxy leaves them (this kernel may lack IPVS: no virtual servers). */
function addIpvsLeftovers(): void {
  node.exec('ipset', ['create', 'KUBE-CLUSTER-IP', 'hash:ip,port']);
  node.exec('ipset', ['create', 'KUBE-6-CLUSTER-IP', 'hash:ip,port', 'family', 'inet6']);
  // a veth stands in for the dummy device: this host's kernel may have no dummy module, and
  // cleanup removes kube-ipvs0 by name whatever its type
  node.exec('ip', ['link', 'add', 'kube-ipvs0', 'type', 'veth', 'peer', 'name', 'kipvs0-peer']);
  // its iptables chains and jumps (upstream's ipvs iptablesJumpChain), both families
  for (const ipt of ['iptables', 'ip6tables']) {
    node.exec(ipt, ['-w', '5', '-t', 'nat', '-N', 'KUBE-LOAD-BALANCER']);
    node.exec(ipt, ['-w', '5', '-t', 'nat', '-N', 'KUBE-NODE-PORT']);
    node.exec(ipt, ['-w', '5', '-t', 'nat', '-A', 'KUBE-LOAD-BALANCER', '-j', 'KUBE-NODE-PORT']);
    node.exec(ipt, ['-w', '5', '-t', 'filter', '-N', 'KUBE-IPVS-FILTER']);
    node.exec(ipt, ['-w', '5', '-t', 'filter', '-I', 'INPUT', '-m', 'comment', '--comment', 'kubernetes ipvs access filter', '-j', 'KUBE-IPVS-FILTER']);
  }
}

function rules(): string {
  return node.exec('iptables-save', []) + node.exec('ip6tables-save', []);
}

/** What another program owns is all there, with its rules. */
function assertForeignIntact(when: string): void {
  for (const save of ['iptables-save', 'ip6tables-save']) {
    for (const table of ['mangle', 'nat', 'filter']) {
      assert.match(node.exec(save, ['-t', table]), /^:KUBE-KUBELET-CANARY /m, `${when}: ${save} ${table} KUBE-KUBELET-CANARY`);
    }
    const filter = node.exec(save, ['-t', 'filter']);
    assert.match(filter, /^:KUBE-ROUTER-INPUT /m, `${when}: ${save} KUBE-ROUTER-INPUT`);
    assert.match(filter, /^-A INPUT -m comment --comment "kube-router netpol" -j KUBE-ROUTER-INPUT$/m, `${when}: ${save} the jump from INPUT`);
    assert.match(filter, /^-A KUBE-ROUTER-INPUT -p tcp -m tcp --dport 179 -j ACCEPT$/m, `${when}: ${save} its rule`);
  }
  assert.match(node.exec('ipset', ['list', '-n']), /^kube-router-pod-subnets$/m, `${when}: the other ipset`);
  const nft = node.exec('nft', ['list', 'tables']);
  for (const t of ['ip cni-other', 'inet kube-proxy-1', 'ip kube-proxy-x']) assert.match(nft, new RegExp(`^table ${t}$`, 'm'), `${when}: the other nft table ${t}`);
}

/** kube-proxy's chains still in the rules (the kubelet's KUBE-FIREWALL is not one of them). */
function kproxyChains(): string[] {
  return rules().split('\n')
    .filter((l) => /^:(KUBE-|KPROXY-)/.test(l))
    .map((l) => l.slice(1).split(' ')[0])
    .filter((c) => !['KUBE-KUBELET-CANARY', 'KUBE-ROUTER-INPUT', 'KUBE-FIREWALL'].includes(c));
}

// last resort if the process dies without `after`: the namespaces (and all state in them) go
process.once('exit', () => {
  for (const ns of [node, peer]) sh('ip', ['netns', 'del', ns.name], { allowFail: true });
  rmSync(dir, { recursive: true, force: true });
});

before(() => {
  Netns.create(node.name);
  Netns.create(peer.name);
  vethPair(node, 'eth0', '192.168.0.2/24', peer, 'eth0', '192.168.0.3/24');
  writeFileSync(join(dir, 'web.yaml'), MANIFESTS);
});

after(async () => {
  await node.destroy();
  await peer.destroy();
  rmSync(dir, { recursive: true, force: true });
});

async function startKproxy(mode: string): Promise<{ proc: ChildProcess; log: () => string }> {
  let log = '';
  const proc = node.kproxy(
    ['run', '--mode', mode, '--manifests', dir, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
    (s) => (log += s),
  );
  await waitFor(`kproxy ${mode} healthy`, () => node.exec('curl', ['-sf', '127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 30_000, 200)
    .catch((e) => assert.fail(`${e.message}\n${log.slice(-4000)}`));
  return { proc, log: () => log };
}

test('another program\'s chains, ipset and nft table survive a mode switch and kproxy cleanup; kproxy\'s are gone', async () => {
  addForeignState();

  const ipt = await startKproxy('iptables');
  try {
    assert.match(node.exec('iptables-save', ['-t', 'nat']), /^:KUBE-SVC-/m, 'the iptables mode programmed the service');
    assert.match(node.exec('iptables-save', ['-t', 'mangle']), /^:KUBE-PROXY-CANARY /m);
  } finally {
    await node.kill(ipt.proc);
  }
  assertForeignIntact('after the iptables mode');
  addIpvsLeftovers();

  // the switch: the nftables mode removes the iptables and ipvs modes' leftovers at start
  const nft = await startKproxy('nftables');
  try {
    assertForeignIntact('after the switch to nftables');
    assert.deepEqual(kproxyChains(), [], `the iptables mode's chains are gone at the switch:\n${rules()}`);
    assert.doesNotMatch(rules(), /-j KUBE-(SERVICES|POSTROUTING|NODEPORTS|FORWARD|EXTERNAL-SERVICES|PROXY-FIREWALL|IPVS-FILTER)\b/, 'and the jumps to them');
    assert.doesNotMatch(node.exec('ipset', ['list', '-n']), /^KUBE-/m, 'the ipvs mode\'s ipsets are gone at the switch');
    assert.equal(node.exec('ip', ['link', 'show', 'kube-ipvs0'], { allowFail: true }), '', 'kube-ipvs0 is gone');
    assert.match(node.exec('nft', ['list', 'tables']), /^table ip kube-proxy$/m);
  } finally {
    await node.kill(nft.proc);
  }

  // leftovers of every mode at once, then cleanup; the shards' tables too
  node.exec('nft', ['add', 'table', 'ip', 'kube-proxy-3']);
  node.exec('nft', ['add', 'table', 'ip6', 'kube-proxy-11']);
  const again = await startKproxy('iptables');
  await node.kill(again.proc);
  assert.doesNotMatch(node.exec('nft', ['list', 'tables']), KUBE_PROXY_NFT, 'the iptables mode removed the nftables mode\'s tables (the shards\' too) at start');
  addIpvsLeftovers();
  node.exec('nft', ['add', 'table', 'ip', 'kube-proxy']);
  node.exec('nft', ['add', 'table', 'ip6', 'kube-proxy']);
  node.exec('nft', ['add', 'table', 'ip', 'kube-proxy-0']);
  node.exec('nft', ['add', 'table', 'ip6', 'kube-proxy-15']);
  node.exec('iptables', ['-w', '5', '-t', 'nat', '-N', 'KPROXY-USERSPACE-PORTALS']);
  node.exec('iptables', ['-w', '5', '-t', 'nat', '-I', 'OUTPUT', '-j', 'KPROXY-USERSPACE-PORTALS']);
  assert.ok(kproxyChains().length > 10, 'the iptables mode\'s chains are in place');

  const cleanup = () => node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup']);
  cleanup();
  assertForeignIntact('after kproxy cleanup');
  assert.deepEqual(kproxyChains(), [], `kproxy cleanup left chains:\n${rules()}`);
  assert.doesNotMatch(rules(), /-j (KUBE-(SERVICES|POSTROUTING|NODEPORTS|FORWARD|EXTERNAL-SERVICES|PROXY-FIREWALL|IPVS-FILTER)|KPROXY-USERSPACE-\S+)\b/, 'no jump to a removed chain');
  assert.doesNotMatch(node.exec('nft', ['list', 'tables']), KUBE_PROXY_NFT, 'every kube-proxy nft table (ip and ip6, the shards\' too) is gone');
  assert.doesNotMatch(node.exec('ipset', ['list', '-n']), /^KUBE-/m, 'the ipvs mode\'s ipsets are gone');
  assert.equal(node.exec('ip', ['link', 'show', 'kube-ipvs0'], { allowFail: true }), '', 'kube-ipvs0 is gone');
  // idempotent: a second cleanup finds nothing and succeeds
  cleanup();
  assertForeignIntact('after a second cleanup');
});
