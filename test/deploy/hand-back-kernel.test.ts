// Real kernel: handing a node back to kube-proxy (docs/deploy.md "## 7. Going back to
// kube-proxy, or uninstalling") leaves nothing of kproxy.
//   node ns (kproxy; 10.180.0.254, default route via the pod) ── veth ── pod ns (backend 10.180.0.1:8080)
// For each kernel mode: kproxy runs (nftables: 1,201 Services, so its Services are spread over
// the sharded tables kube-proxy-<n>), stops (it leaves its rules, as kube-proxy does), upstream
// kube-proxy's cleanup is emulated (`upstreamCleanup` below), then the documented step
// (`kproxy cleanup`) runs; afterwards no kube-proxy table, KUBE-*/KPROXY-* chain or KUBE-*
// ipset is left, and a connection to the ClusterIP is DNAT-ed by nothing: it does not reach the
// backend (whose input counter stays still) and conntrack has no entry translated to it.
// IPVS is left out: the ipvs mode runs only in the IPVS VM (test/ipvs/vm*.ts).
// Namespaces come from uniqueName() and are removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Netns, repoRoot, uniqueName, vethPair, waitFor } from '../support/netns.ts';
import { bigManifest } from '../support/big-manifest.ts';

const CLUSTER_IP = '172.31.0.10';
const BACKEND = '10.180.0.1';
const KPROXY = join(repoRoot, 'bin/kproxy.js');

const realService = `apiVersion: v1
kind: Service
metadata: {name: real, namespace: handback}
spec:
  clusterIP: ${CLUSTER_IP}
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: real-1
  namespace: handback
  labels: {kubernetes.io/service-name: real}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [${BACKEND}]
  nodeName: other-node
`;

const tag = uniqueName('kpt-hb');
const node = new Netns(`${tag}-n`);
const pod = new Netns(`${tag}-p`);
const dir = mkdtempSync(join(tmpdir(), 'kp-handback-'));

before(async () => {
  for (const ns of [node, pod]) Netns.create(ns.name);
  vethPair(node, 'to-pod', '10.180.0.254/16', pod, 'eth0', `${BACKEND}/16`);
  // A real node has a default route; locally generated packets to a ClusterIP need one to be
  // routed before nat OUTPUT rewrites them. Through the pod namespace, which does not forward:
  // a packet to the ClusterIP that nothing DNAT-s is dropped there and reaches no socket.
  node.exec('ip', ['route', 'add', 'default', 'via', BACKEND]);
  pod.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  // what reaches the backend's port, counted by the pod's kernel
  pod.exec('nft', ['-f', '-'], { input: 'add table inet hbprobe\nadd chain inet hbprobe in { type filter hook input priority 0 ; }\nadd rule inet hbprobe in tcp dport 8080 counter\n' });
  const b = pod.node('test/support/backend-main.ts', ['pod-1', `tcp:${BACKEND}:8080`]);
  await waitFor('the backend', () => new Promise<boolean>((r) => b.stdout!.once('data', () => r(true))), 15_000);
});

after(async () => {
  for (const ns of [node, pod]) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

/** Packets the pod's kernel delivered to port 8080 so far. */
function backendPackets(): number {
  const m = /counter packets (\d+)/.exec(pod.exec('nft', ['list', 'chain', 'inet', 'hbprobe', 'in']));
  assert.ok(m, 'the probe counter is there');
  return Number(m[1]);
}

let nextPort = 41000;

/**
 * One TCP connection from the node namespace to the ClusterIP, from a source port of its own,
 * bounded to 2 s. Returns what the backend said (or the error) and the conntrack entries of
 * that source port.
 */
function probe(): { said: string | null; error: string | null; conntrack: string } {
  const sport = nextPort++;
  const code = `
const s = require('node:net').connect({ host: ${JSON.stringify(CLUSTER_IP)}, port: 80, localPort: ${sport} });
let data = '';
const t = setTimeout(() => { console.log(JSON.stringify({ said: null, error: 'ETIMEDOUT' })); process.exit(0); }, 2000);
s.on('data', (d) => (data += d));
s.on('end', () => { clearTimeout(t); console.log(JSON.stringify({ said: data.trim(), error: null })); process.exit(0); });
s.on('error', (e) => { clearTimeout(t); console.log(JSON.stringify({ said: null, error: e.code || e.message })); process.exit(0); });`;
  const r = JSON.parse(node.exec(process.execPath, ['-e', code]).trim().split('\n').at(-1)!) as { said: string | null; error: string | null };
  const conntrack = node.exec('conntrack', ['-L', '-p', 'tcp', '--sport', String(sport)], { allowFail: true });
  return { ...r, conntrack };
}

/** Every `family name` nftables table of the node namespace. */
function nftTables(): string[] {
  return node.exec('nft', ['list', 'tables']).split('\n').filter(Boolean).map((l) => l.replace(/^table /, ''));
}

/** The chains of an iptables-save text (":NAME POLICY [..]" lines). */
function chains(save: string): string[] {
  return [...save.matchAll(/^:(\S+)/gm)].map((m) => m[1]);
}

/**
 * Upstream kube-proxy's cleanup, as `kube-proxy --cleanup` runs it: platformCleanup
 * (cmd/kube-proxy/app/server_linux.go) with cleanupAndExit runs the iptables, ipvs and
 * nftables CleanupLeftovers, each family; at start it runs a subset (the iptables and ipvs
 * ones in nftables mode, the nftables one in the iptables and ipvs modes), so this is the most
 * kube-proxy ever removes. Exactly what each deletes:
 * - pkg/proxy/iptables/proxier.go CleanupLeftovers: the rules of iptablesJumpChains (by
 *   their exact arguments and comment), then one iptables-restore --noflush per table that
 *   flushes and deletes nat KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING and every
 *   KUBE-SVC-/SVL-/SEP-/FW-/EXT- chain, and filter KUBE-SERVICES, KUBE-EXTERNAL-SERVICES,
 *   KUBE-FORWARD, KUBE-NODEPORTS (the restore fails whole if a chain is still referenced);
 * - pkg/proxy/ipvs/proxier.go cleanupLeftovers: the IPVS table (none here), the kube-ipvs0
 *   device, cleanupIptablesLeftovers (the rules of iptablesJumpChain, then flush and delete
 *   of iptablesCleanupChains, one by one) and the ipsets of ipsetInfo;
 * - pkg/proxy/nftables/proxier.go CleanupLeftovers: the tables `ip kube-proxy` and
 *   `ip6 kube-proxy`.
 */
function upstreamCleanup(): void {
  const ctNew = ['-m', 'conntrack', '--ctstate', 'NEW'];
  const iptablesJumps: Array<[string, string, string, string, string[]]> = [
    ['filter', 'INPUT', 'KUBE-EXTERNAL-SERVICES', 'kubernetes externally-visible service portals', ctNew],
    ['filter', 'FORWARD', 'KUBE-EXTERNAL-SERVICES', 'kubernetes externally-visible service portals', ctNew],
    ['filter', 'INPUT', 'KUBE-NODEPORTS', 'kubernetes health check service ports', []],
    ['filter', 'FORWARD', 'KUBE-SERVICES', 'kubernetes service portals', ctNew],
    ['filter', 'OUTPUT', 'KUBE-SERVICES', 'kubernetes service portals', ctNew],
    ['filter', 'FORWARD', 'KUBE-FORWARD', 'kubernetes forwarding rules', []],
    ['filter', 'INPUT', 'KUBE-PROXY-FIREWALL', 'kubernetes load balancer firewall', ctNew],
    ['filter', 'OUTPUT', 'KUBE-PROXY-FIREWALL', 'kubernetes load balancer firewall', ctNew],
    ['filter', 'FORWARD', 'KUBE-PROXY-FIREWALL', 'kubernetes load balancer firewall', ctNew],
    ['nat', 'OUTPUT', 'KUBE-SERVICES', 'kubernetes service portals', []],
    ['nat', 'PREROUTING', 'KUBE-SERVICES', 'kubernetes service portals', []],
    ['nat', 'POSTROUTING', 'KUBE-POSTROUTING', 'kubernetes postrouting rules', []],
  ];
  const ipvsJumps: Array<[string, string, string, string]> = [
    ['nat', 'OUTPUT', 'KUBE-SERVICES', 'kubernetes service portals'],
    ['nat', 'PREROUTING', 'KUBE-SERVICES', 'kubernetes service portals'],
    ['nat', 'POSTROUTING', 'KUBE-POSTROUTING', 'kubernetes postrouting rules'],
    ['filter', 'FORWARD', 'KUBE-FORWARD', 'kubernetes forwarding rules'],
    ['filter', 'INPUT', 'KUBE-NODE-PORT', 'kubernetes health check rules'],
    ['filter', 'INPUT', 'KUBE-PROXY-FIREWALL', 'kube-proxy firewall rules'],
    ['filter', 'FORWARD', 'KUBE-PROXY-FIREWALL', 'kube-proxy firewall rules'],
    ['filter', 'INPUT', 'KUBE-IPVS-FILTER', 'kubernetes ipvs access filter'],
    ['filter', 'OUTPUT', 'KUBE-IPVS-OUT-FILTER', 'kubernetes ipvs access filter'],
  ];
  const ipvsChains: Array<[string, string]> = [
    ['nat', 'KUBE-SERVICES'], ['nat', 'KUBE-POSTROUTING'], ['nat', 'KUBE-NODE-PORT'], ['nat', 'KUBE-LOAD-BALANCER'], ['nat', 'KUBE-MARK-MASQ'],
    ['filter', 'KUBE-FORWARD'], ['filter', 'KUBE-NODE-PORT'], ['filter', 'KUBE-PROXY-FIREWALL'], ['filter', 'KUBE-SOURCE-RANGES-FIREWALL'],
    ['filter', 'KUBE-IPVS-FILTER'], ['filter', 'KUBE-IPVS-OUT-FILTER'],
  ];
  const ipsets = ['KUBE-LOOP-BACK', 'KUBE-CLUSTER-IP', 'KUBE-EXTERNAL-IP', 'KUBE-EXTERNAL-IP-LOCAL', 'KUBE-LOAD-BALANCER', 'KUBE-LOAD-BALANCER-FW',
    'KUBE-LOAD-BALANCER-LOCAL', 'KUBE-LOAD-BALANCER-SOURCE-IP', 'KUBE-LOAD-BALANCER-SOURCE-CIDR', 'KUBE-NODE-PORT-TCP', 'KUBE-NODE-PORT-LOCAL-TCP',
    'KUBE-NODE-PORT-UDP', 'KUBE-NODE-PORT-LOCAL-UDP', 'KUBE-NODE-PORT-SCTP-HASH', 'KUBE-NODE-PORT-LOCAL-SCTP-HASH', 'KUBE-HEALTH-CHECK-NODE-PORT', 'KUBE-IPVS-IPS'];
  const families: Array<[string, string, string]> = [['iptables', 'iptables-save', 'iptables-restore'], ['ip6tables', 'ip6tables-save', 'ip6tables-restore']];
  // iptables CleanupLeftovers (errors logged and ignored, as upstream goes on)
  for (const [ipt, save, restore] of families) {
    for (const [table, from, to, comment, extra] of iptablesJumps) {
      node.exec(ipt, ['-w', '-t', table, '-D', from, ...extra, '-m', 'comment', '--comment', comment, '-j', to], { allowFail: true });
    }
    const nat = chains(node.exec(save, ['-t', 'nat']));
    const natGone = [...['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING'].filter((c) => nat.includes(c)),
      ...nat.filter((c) => /^KUBE-(SVC|SVL|SEP|FW|EXT)-/.test(c))];
    node.exec(restore, ['-w', '--noflush'], { allowFail: true, input: `*nat\n${natGone.map((c) => `:${c} - [0:0]\n`).join('')}${natGone.map((c) => `-X ${c}\n`).join('')}COMMIT\n` });
    const filter = chains(node.exec(save, ['-t', 'filter']));
    const filterGone = ['KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-FORWARD', 'KUBE-NODEPORTS'].filter((c) => filter.includes(c));
    node.exec(restore, ['-w', '--noflush'], { allowFail: true, input: `*filter\n${filterGone.map((c) => `:${c} - [0:0]\n`).join('')}${filterGone.map((c) => `-X ${c}\n`).join('')}COMMIT\n` });
  }
  // ipvs cleanupLeftovers
  node.exec('ip', ['link', 'del', 'kube-ipvs0'], { allowFail: true });
  for (const [ipt] of families) {
    for (const [table, from, to, comment] of ipvsJumps) node.exec(ipt, ['-w', '-t', table, '-D', from, '-m', 'comment', '--comment', comment, '-j', to], { allowFail: true });
    for (const [table, chain] of ipvsChains) node.exec(ipt, ['-w', '-t', table, '-F', chain], { allowFail: true });
    for (const [table, chain] of ipvsChains) node.exec(ipt, ['-w', '-t', table, '-X', chain], { allowFail: true });
  }
  for (const set of ipsets) node.exec('ipset', ['destroy', set], { allowFail: true });
  // nftables CleanupLeftovers
  for (const family of ['ip', 'ip6']) node.exec('nft', ['delete', 'table', family, 'kube-proxy'], { allowFail: true });
}

/** What is left of kube-proxy and kproxy in the node namespace. */
function leftovers(): { tables: string[]; chains: string[]; ipsets: string[] } {
  const tables = nftTables().filter((t) => /^(ip|ip6) kube-proxy/.test(t));
  const all = [...chains(node.exec('iptables-save', [])), ...chains(node.exec('ip6tables-save', []))];
  const ipsets = node.exec('ipset', ['list', '-n']).split('\n').filter((s) => /^(KUBE-|kproxy|KPROXY)/i.test(s));
  return { tables, chains: all.filter((c) => /^(KUBE-|KPROXY-)/.test(c)).sort(), ipsets };
}

function assertNoDnat(where: string): void {
  const before = backendPackets();
  const p = probe();
  assert.equal(p.said, null, `${where}: the ClusterIP answers nothing: ${JSON.stringify(p)}`);
  assert.doesNotMatch(p.conntrack, new RegExp(`src=${BACKEND.replace(/\./g, '\\.')}(?!\\d)`), `${where}: no conntrack entry translated to the backend: ${p.conntrack}`);
  assert.equal(backendPackets(), before, `${where}: nothing reached the backend`);
}

async function startKproxy(mode: 'nftables' | 'iptables', manifests: string): Promise<{ proc: ChildProcess; log: () => string }> {
  let log = '';
  const proc = node.kproxy(['run', '--proxy-mode', mode, '--manifests', manifests, '--manifests-state', join(dir, `${mode}-state.json`),
    '--hostname-override', 'node-a', '--bind-address', '10.180.0.254', '--cluster-cidr', '10.180.0.0/16',
    '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'], (s) => (log += s));
  return { proc, log: () => log };
}

async function reachesBackend(what: string, k: { log: () => string }, timeoutMs: number): Promise<void> {
  await waitFor(what, () => {
    const p = probe();
    return p.said === 'pod-1' && new RegExp(`src=${BACKEND.replace(/\./g, '\\.')} dst=10\\.180\\.0\\.254`).test(p.conntrack);
  }, timeoutMs, 500).catch((e: Error) => assert.fail(`${e.message}\n${k.log().slice(-4000)}`));
}

test('nftables, sharded (1,201 Services): upstream\'s cleanup leaves the kube-proxy-<n> tables DNAT-ing; `kproxy cleanup` leaves nothing', async () => {
  const manifests = join(dir, 'nft');
  mkdirSync(manifests, { recursive: true });
  writeFileSync(join(manifests, 'big.yaml'), bigManifest(1200));
  writeFileSync(join(manifests, 'real.yaml'), realService);
  const k = await startKproxy('nftables', manifests);
  try {
    // 1,201 Services: K = ceil(1201 / 600) = 3 tables (src/modes/nftables/shards.ts chooseTables)
    const shards = await waitFor('kproxy\'s sharded tables', () => {
      const t = nftTables().filter((n) => /^ip kube-proxy-\d+$/.test(n));
      return t.length > 1 && t;
    }, 120_000, 1000).catch((e: Error) => assert.fail(`${e.message}\n${k.log().slice(-4000)}`));
    assert.ok(!nftTables().includes('ip kube-proxy'), 'sharded: no single ip kube-proxy table');
    await reachesBackend('the ClusterIP reaches the backend through kproxy', k, 60_000);
    await node.kill(k.proc);
    assert.notEqual(k.proc.exitCode ?? k.proc.signalCode, null, 'kproxy stopped');
    // kproxy leaves its rules when it stops; its last line may still be in the pipe when the exit is seen
    await waitFor('kproxy\'s last line', () => /kernel rules stay in place/.test(k.log()), 10_000).catch(() => assert.fail(k.log().slice(-4000)));

    upstreamCleanup();
    // the hazard: upstream's cleanup does not know the shards
    const after = nftTables().filter((n) => /^ip kube-proxy-\d+$/.test(n));
    assert.deepEqual(after.sort(), shards.sort(), 'every kube-proxy-<n> table is still there after upstream\'s cleanup');
    await reachesBackend('the ClusterIP is still DNAT-ed to the backend after upstream\'s cleanup alone', k, 10_000);

    // docs/deploy.md §7: `kproxy cleanup` on the node
    node.exec(process.execPath, [KPROXY, 'cleanup']);
    assert.deepEqual(leftovers(), { tables: [], chains: [], ipsets: [] });
    assertNoDnat('after kproxy cleanup');
  } finally {
    await node.kill(k.proc);
  }
});

test('iptables (one Service): upstream\'s cleanup unlinks every DNAT; `kproxy cleanup` leaves only the kubelet\'s KUBE-FIREWALL, which the documented commands remove', async () => {
  const manifests = join(dir, 'ipt');
  mkdirSync(manifests, { recursive: true });
  writeFileSync(join(manifests, 'real.yaml'), realService);
  const k = await startKproxy('iptables', manifests);
  try {
    await reachesBackend('the ClusterIP reaches the backend through kproxy', k, 60_000);
    assert.match(node.exec('iptables-save', ['-t', 'nat']), /^:KUBE-SVC-/m);
    await node.kill(k.proc);
    // kproxy leaves its rules when it stops; its last line may still be in the pipe when the exit is seen
    await waitFor('kproxy\'s last line', () => /kernel rules stay in place/.test(k.log()), 10_000).catch(() => assert.fail(k.log().slice(-4000)));

    upstreamCleanup();
    // kube-proxy's own chain names: upstream's cleanup unlinks and deletes them; what it leaves
    // holds no rule that rewrites a packet (the empty KUBE-PROXY-CANARY chains, and the kubelet's
    // KUBE-FIREWALL that the iptables mode duplicates, as upstream does)
    assert.deepEqual(leftovers(), { tables: [], chains: ['KUBE-FIREWALL', 'KUBE-PROXY-CANARY', 'KUBE-PROXY-CANARY', 'KUBE-PROXY-CANARY'], ipsets: [] });
    assertNoDnat('after upstream\'s cleanup alone');

    // docs/deploy.md §7: `kproxy cleanup` on the node
    node.exec(process.execPath, [KPROXY, 'cleanup']);
    assert.deepEqual(leftovers(), { tables: [], chains: ['KUBE-FIREWALL'], ipsets: [] }, 'the kubelet\'s KUBE-FIREWALL stays, as upstream leaves it');
    const firewall = node.exec('iptables-save', ['-t', 'filter']).split('\n').filter((l) => l.includes('KUBE-FIREWALL') && l.startsWith('-A'));
    assert.deepEqual(firewall.map((l) => l.replace(/ -m comment --comment "[^"]*"/, '')), [
      '-A INPUT -j KUBE-FIREWALL',
      '-A OUTPUT -j KUBE-FIREWALL',
      '-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP',
    ], 'KUBE-FIREWALL only drops martian packets to 127.0.0.0/8');
    assert.deepEqual(chains(node.exec('iptables-save', ['-t', 'nat'])).sort(), ['INPUT', 'OUTPUT', 'POSTROUTING', 'PREROUTING'], 'nat holds only its built-in chains');
    assertNoDnat('after kproxy cleanup');

    // docs/deploy.md "What stays after cleanup": KUBE-FIREWALL, removed by hand on uninstall
    for (const args of [['-D', 'INPUT', '-j', 'KUBE-FIREWALL'], ['-D', 'OUTPUT', '-j', 'KUBE-FIREWALL'], ['-F', 'KUBE-FIREWALL'], ['-X', 'KUBE-FIREWALL']]) node.exec('iptables', args);
    assert.deepEqual(leftovers(), { tables: [], chains: [], ipsets: [] });
    assertNoDnat('after the uninstall');
  } finally {
    await node.kill(k.proc);
  }
});
