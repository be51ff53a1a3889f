// Real kernel, the sharded nftables mode beyond test/nftables/sharded-kernel.test.ts:
// what only packets across several tables show. NftProxier with low thresholds writes
// `ip kube-proxy-0..2` (6 IPv4 Services) and `ip6 kube-proxy-0..1` (4 IPv6 Services) into a node
// namespace; the Services' names are picked so that each lands in the table the case needs
// (names.ts shardOf). Two pod namespaces (pod1 on this node, pod2 "on another node", both
// routed from the node namespace) run dual-stack TCP servers that answer with their name and
// the peer address they saw; an allowed client (203.0.113.2, fd00:203::2) and a denied one
// (198.51.100.2) connect from outside the cluster CIDR. Checked:
// - IPv6: ClusterIP and NodePort of Services in both ip6 tables reach both endpoints,
//   masqueraded; a Service without endpoints is REJECTed (ICMPv6) at both;
// - externalTrafficPolicy Local: from outside, the NodePort reaches only the local endpoint
//   with the client's address kept; a Service with no local endpoint drops external traffic
//   (a timeout, no ICMP) while its ClusterIP still reaches the remote endpoint;
// - a LoadBalancer IP with loadBalancerSourceRanges: the allowed client connects, the denied
//   one times out (drop), while the denied client reaches another table's open LB IP;
// - a Service without endpoints (REJECT, ClusterIP and NodePort) next to Services with them in
//   the other tables, and a port without endpoints next to one with them in one Service;
// - the unallocated-ClusterIP drop (planner option serviceCIDRs; plan.ts `sharded`): another
//   table's ClusterIP on a port it lacks is REJECTed, an unallocated one dropped; the single
//   table's inline drop, in each table, would drop the first (why the shards' shape differs); and `kproxy trace
//   --live` gives what the kernel did, also where only the order of two tables' chains of
//   equal priority decides (the kernel runs the table created last first).
// Every request is bounded (1.5 s); namespaces and processes are removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { shardOf } from '../../src/modes/nftables/names.ts';
import { optionsFromInput, planRuleset } from '../../src/modes/nftables/plan.ts';
import { dumpRuleset } from '../../src/modes/nftables/ruleset.ts';
import { planShards, splitState } from '../../src/modes/nftables/shards.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { mode } from '../../src/modes/nftables/index.ts';
import { uniqueName } from '../support/netns.ts';
import { nsRunner, startReadyServer } from './objects.ts';
import { lbStatus, makeService, makeSlice } from '../support/builders.ts';

const P = uniqueName('kpt-shp');
const NS = { node: `${P}-n`, pod1: `${P}-p1`, pod2: `${P}-p2`, client: `${P}-c`, denied: `${P}-d` };
const NODE_NAME = 'node-a';
const NODE_IP = { 4: '192.168.0.2', 6: 'fd00::2' };
const POD = { pod1: { 4: '10.180.1.1', 6: 'fd00:180:1::1' }, pod2: { 4: '10.180.2.1', 6: 'fd00:180:2::1' } };
/** the node's address on each pod's link: what a pod sees of a masqueraded connection */
const GW = { pod1: { 4: '10.180.1.254', 6: 'fd00:180:1::fe' }, pod2: { 4: '10.180.2.254', 6: 'fd00:180:2::fe' } };
const CLIENT = { 4: '203.0.113.2', 6: 'fd00:203::2' };
const DENIED = '198.51.100.2';
const K4 = 3;
const K6 = 2;
const SHARDS4 = { threshold: 3, perTable: 2, maxTables: K4 };
const SHARDS6 = { threshold: 2, perTable: 2, maxTables: K6 };

const dir = mkdtempSync(join(tmpdir(), 'kpt-shp-'));
const servers: ChildProcess[] = [];
const proxiers: NftProxier[] = [];

async function inNs(ns: string, args: string[]): Promise<void> {
  await runChecked(nsRunner(ns), args[0], args.slice(1), { timeoutMs: 10_000 });
}

// dual-stack: '::' takes IPv4 too (v4-mapped peers are shown as plain IPv4)
const SERVER = `
const net = require('node:net');
const [id, ...ports] = process.argv.slice(2);
let n = 0;
for (const port of ports) net.createServer((s) => { s.on('error', () => {}); s.end(id + ' ' + s.remoteAddress.replace(/^::ffff:/, '') + '\\n'); })
  .listen(Number(port), '::', () => { if (++n === ports.length) console.log('ready'); });
setTimeout(() => process.exit(0), 300000).unref();
`;

// Every request at once, each bounded (1.5 s): [{host, port}] → [{reply} | {err}] in order.
const CLIENT_JS = `
const net = require('node:net');
const reqs = JSON.parse(process.argv[2]);
function one(r) { return new Promise((res) => {
  const s = net.connect({ host: r.host, port: r.port }); let buf = '';
  const tm = setTimeout(() => { s.destroy(); res({ err: 'TIMEOUT' }); }, 1500);
  s.on('data', (d) => buf += d); s.on('end', () => { clearTimeout(tm); res({ reply: buf.trim() }); });
  s.on('error', (e) => { clearTimeout(tm); res({ err: e.code }); });
}); }
Promise.all(reqs.map(one)).then((out) => console.log(JSON.stringify(out)));
`;

interface Reply {
  reply?: string;
  err?: string;
}

interface Answers {
  who: Set<string>;
  peers: Set<string>;
  errors: string[];
}

/** n connections to each target from a client namespace, all at once; the answers per target. */
async function probe(from: string, targets: Array<[string, number]>, n: number): Promise<Answers[]> {
  const reqs = targets.flatMap(([host, port]) => Array.from({ length: n }, () => ({ host, port })));
  const r = await nsRunner(from).run('node', [join(dir, 'client.cjs'), JSON.stringify(reqs)], { timeoutMs: 60_000 });
  assert.equal(r.code, 0, r.stderr);
  const replies = JSON.parse(r.stdout) as Reply[];
  return targets.map((_, t) => {
    const out: Answers = { who: new Set(), peers: new Set(), errors: [] };
    for (const x of replies.slice(t * n, (t + 1) * n)) {
      if (!x.reply) out.errors.push(x.err ?? '?');
      else {
        const [who, peer] = x.reply.split(' ');
        out.who.add(who);
        out.peers.add(peer);
      }
    }
    return out;
  });
}

/** what a connect gets from nft's `reject` (ICMP / ICMPv6 port unreachable) */
const REJECTED = 'ECONNREFUSED';
/** what a connect gets from `drop`: nothing comes back (the ClusterIP routes lead to pod1, which does not forward) */
const DROPPED = 'TIMEOUT';

async function setupNetwork(): Promise<void> {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
  for (const ns of Object.values(NS)) await inNs(ns, ['ip', 'link', 'set', 'lo', 'up']);
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv4.ip_forward=1']);
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv6.conf.all.forwarding=1']);
  const links: Array<[string, string, string[], string[]]> = [
    [NS.pod1, 'vp1', [`${GW.pod1[4]}/24`, `${GW.pod1[6]}/64`], [`${POD.pod1[4]}/24`, `${POD.pod1[6]}/64`]],
    [NS.pod2, 'vp2', [`${GW.pod2[4]}/24`, `${GW.pod2[6]}/64`], [`${POD.pod2[4]}/24`, `${POD.pod2[6]}/64`]],
    [NS.client, 'vc', ['203.0.113.1/24', 'fd00:203::1/64'], [`${CLIENT[4]}/24`, `${CLIENT[6]}/64`]],
    [NS.denied, 'vd', ['198.51.100.1/24'], [`${DENIED}/24`]],
  ];
  for (const [ns, nodeSide, nodeAddrs, peerAddrs] of links) {
    await inNs(NS.node, ['ip', 'link', 'add', nodeSide, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    for (const a of nodeAddrs) await inNs(NS.node, ['ip', 'addr', 'add', a, 'dev', nodeSide, ...(a.includes(':') ? ['nodad'] : [])]);
    await inNs(NS.node, ['ip', 'link', 'set', nodeSide, 'up']);
    for (const a of peerAddrs) await inNs(ns, ['ip', 'addr', 'add', a, 'dev', 'eth0', ...(a.includes(':') ? ['nodad'] : [])]);
    await inNs(ns, ['ip', 'link', 'set', 'eth0', 'up']);
    await inNs(ns, ['ip', 'route', 'add', 'default', 'via', nodeAddrs[0].split('/')[0]]);
    if (nodeAddrs[1]) await inNs(ns, ['ip', '-6', 'route', 'add', 'default', 'via', nodeAddrs[1].split('/')[0]]);
  }
  await inNs(NS.node, ['ip', 'addr', 'add', `${NODE_IP[4]}/32`, 'dev', 'vc']);
  await inNs(NS.node, ['ip', 'addr', 'add', `${NODE_IP[6]}/128`, 'dev', 'vc', 'nodad']);
  // ClusterIPs and LB IPs are routed to pod1, which does not forward: a packet no rule DNATs
  // or rejects gets no answer (a timeout), so a refusal can only come from a `reject` rule.
  await inNs(NS.node, ['ip', 'route', 'add', '172.30.0.0/16', 'via', POD.pod1[4]]);
  await inNs(NS.node, ['ip', 'route', 'add', '1.2.3.0/24', 'via', POD.pod1[4]]);
  await inNs(NS.node, ['ip', '-6', 'route', 'add', 'fd00:172:30::/112', 'via', POD.pod1[6]]);
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv4.icmp_ratelimit=0']);
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv6.icmp.ratelimit=0']);
  // and the node's global ICMP budget (per namespace; 50 at once by default) must not either
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv4.icmp_msgs_per_sec=100000']);
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv4.icmp_msgs_burst=100000']);
  await inNs(NS.pod1, ['sysctl', '-qw', 'net.ipv4.ip_forward=0']);
  await inNs(NS.pod1, ['sysctl', '-qw', 'net.ipv6.conf.all.forwarding=0']);
}

type Pod = 'pod1' | 'pod2';

interface Svc {
  /** the table it must land in */
  table: number;
  type: 'ClusterIP' | 'NodePort' | 'LoadBalancer';
  /** port name → endpoints (none: no slice at all) */
  pods: Pod[] | null;
  etpLocal?: boolean;
  ranges?: string[];
  lbIP?: string;
  /** a second port (81) that has no endpoints */
  emptyPort?: boolean;
}

/** A name `<role>-<j>` whose Service ("shp/<name>") lands in `table` of k (names.ts shardOf). */
function nameIn(role: string, table: number, k: number): string {
  for (let j = 0; j < 1000; j++) if (shardOf(`shp/${role}-${j}`, k) === table) return `${role}-${j}`;
  throw new Error(`no name for ${role} in table ${table} of ${k}`);
}

function objects(family: 4 | 6, role: string, i: number, s: Svc, k: number): { name: string; svc: K8sService; slice: K8sEndpointSlice | null } {
  const name = nameIn(role, s.table, k);
  const clusterIP = family === 4 ? `172.30.0.${i + 1}` : `fd00:172:30::${i + 1}`;
  const ports = [{ name: 'p', port: 80, protocol: 'TCP', ...(s.type !== 'ClusterIP' ? { nodePort: 31000 + family * 100 + i } : {}) }];
  if (s.emptyPort) ports.push({ name: 'q', port: 81, protocol: 'TCP', ...(s.type !== 'ClusterIP' ? { nodePort: 31050 + family * 100 + i } : {}) });
  const svc = makeService('shp', name, {
    type: s.type,
    clusterIP,
    clusterIPs: [clusterIP],
    ipFamilies: [family === 4 ? 'IPv4' : 'IPv6'],
    ports,
    ...(s.etpLocal ? { externalTrafficPolicy: 'Local', healthCheckNodePort: 32000 + i } : {}),
    ...(s.ranges ? { loadBalancerSourceRanges: s.ranges } : {}),
  }, s.lbIP ? lbStatus(s.lbIP) : undefined);
  const slice = s.pods
    ? makeSlice('shp', name, {
        family,
        endpoints: s.pods.map((p) => ({ ip: POD[p][family], node: p === 'pod1' ? NODE_NAME : 'node-b', ready: true })),
        // only port p: port q (when there is one) has no endpoints
        ports: [{ name: 'p', port: 8080 }],
      })
    : null;
  return { name, svc, slice };
}

const SVC4: Record<string, Svc> = {
  // eTP Local, endpoints here and on another node
  local: { table: 0, type: 'NodePort', pods: ['pod1', 'pod2'], etpLocal: true },
  // eTP Local, only a remote endpoint
  remote: { table: 1, type: 'NodePort', pods: ['pod2'], etpLocal: true },
  fenced: { table: 2, type: 'LoadBalancer', pods: ['pod1', 'pod2'], ranges: ['203.0.113.0/24'], lbIP: '1.2.3.4' },
  open: { table: 0, type: 'LoadBalancer', pods: ['pod1', 'pod2'], lbIP: '1.2.3.5' },
  empty: { table: 1, type: 'NodePort', pods: null },
  full: { table: 2, type: 'NodePort', pods: ['pod1', 'pod2'], emptyPort: true },
};
const SVC6: Record<string, Svc> = {
  web: { table: 0, type: 'NodePort', pods: ['pod1', 'pod2'] },
  api: { table: 1, type: 'NodePort', pods: ['pod1', 'pod2'] },
  empty: { table: 0, type: 'NodePort', pods: null },
  gone: { table: 1, type: 'NodePort', pods: null },
};

const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8,fd00:10::/48' });

interface Planted {
  input: PlanInput;
  /** role → [ClusterIP, NodePort of port p, NodePort of port q] */
  at: Record<string, { clusterIP: string; nodePort: number; emptyNodePort?: number }>;
}

function plant(family: 4 | 6, svcs: Record<string, Svc>, k: number): Planted {
  const tracker = new ProxyStateTracker(family, NODE_NAME, (msg, obj) => {
    throw new Error(`refused ${obj}: ${msg}`);
  });
  const at: Planted['at'] = {};
  Object.entries(svcs).forEach(([role, s], i) => {
    const o = objects(family, role, i, s, k);
    tracker.services.update(null, o.svc);
    if (o.slice) tracker.endpoints.update(null, o.slice);
    const ports = o.svc.spec!.ports!;
    at[role] = { clusterIP: o.svc.spec!.clusterIP!, nodePort: ports[0].nodePort ?? 0, emptyNodePort: ports[1]?.nodePort };
  });
  tracker.apply();
  const node = { nodeName: NODE_NAME, nodeIPs: [NODE_IP[family], family === 4 ? '203.0.113.1' : 'fd00:203::1'], nodeLabels: {}, family };
  return { input: { state: tracker.state, config, node }, at };
}

async function tablesOf(family: 'ip' | 'ip6'): Promise<string[]> {
  const r = await runChecked(nsRunner(NS.node), 'nft', ['list', 'tables', family], { timeoutMs: 10_000 });
  return r.stdout.split('\n').filter(Boolean).map((l) => l.replace(/^table \S+ /, '')).sort();
}

/** The node's tables hold which Services: table → Service names (from the kernel's rules). */
async function servicesByTable(family: 'ip' | 'ip6'): Promise<Map<string, Set<string>>> {
  const out = new Map<string, Set<string>>();
  for (const t of await tablesOf(family)) {
    const r = await runChecked(nsRunner(NS.node), 'nft', ['list', 'table', family, t], { timeoutMs: 10_000 });
    out.set(t, new Set([...r.stdout.matchAll(/shp\/([a-z]+-\d+)[/:]/g)].map((m) => m[1].replace(/-\d+$/, ''))));
  }
  return out;
}

let v4: Planted;
let v6: Planted;

before(async () => {
  writeFileSync(join(dir, 'server.cjs'), SERVER);
  writeFileSync(join(dir, 'client.cjs'), CLIENT_JS);
  await setupNetwork();
  await startReadyServer(servers, NS.pod1, join(dir, 'server.cjs'), ['pod1', '8080'], 'server pod1');
  await startReadyServer(servers, NS.pod2, join(dir, 'server.cjs'), ['pod2', '8080'], 'server pod2');
  v4 = plant(4, SVC4, K4);
  v6 = plant(6, SVC6, K6);
  const p4 = new NftProxier({ runner: nsRunner(NS.node), log: silentLogger(), shards: SHARDS4 });
  const p6 = new NftProxier({ runner: nsRunner(NS.node), log: silentLogger(), shards: SHARDS6 });
  proxiers.push(p4, p6);
  await p4.sync(v4.input, new Set(), true);
  await p6.sync(v6.input, new Set(), true);
});

after(async () => {
  for (const p of proxiers) await p.stop().catch(() => {});
  for (const s of servers) s.kill('SIGKILL');
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
  rmSync(dir, { recursive: true, force: true });
});

test('the Services sit in the tables the cases need, in both families', async () => {
  assert.deepEqual(await tablesOf('ip'), ['kube-proxy-0', 'kube-proxy-1', 'kube-proxy-2']);
  assert.deepEqual(await tablesOf('ip6'), ['kube-proxy-0', 'kube-proxy-1']);
  for (const [family, svcs] of [['ip', SVC4], ['ip6', SVC6]] as const) {
    const got = await servicesByTable(family);
    for (const [role, s] of Object.entries(svcs)) {
      assert.ok(got.get(`kube-proxy-${s.table}`)?.has(role), `${family} ${role} in kube-proxy-${s.table}: ${JSON.stringify([...got].map(([t, x]) => [t, [...x]]))}`);
    }
  }
});

test('IPv6 across two ip6 tables: ClusterIP and NodePort reach both endpoints masqueraded; no endpoints: REJECT', async () => {
  const { at } = v6;
  const ok: Array<[string, number]> = [];
  for (const role of ['web', 'api']) ok.push([at[role].clusterIP, 80], [NODE_IP[6], at[role].nodePort]);
  const refused: Array<[string, number]> = [];
  for (const role of ['empty', 'gone']) refused.push([at[role].clusterIP, 80], [NODE_IP[6], at[role].nodePort]);
  // 24 connections per target: both of 2 random endpoints are reached but with probability 2^-23
  const res = await probe(NS.client, ok, 24);
  const no = await probe(NS.client, refused, 4);
  ok.forEach(([h, p], i) => {
    const a = res[i];
    assert.deepEqual(a.errors, [], `[${h}]:${p}`);
    assert.deepEqual([...a.who].sort(), ['pod1', 'pod2'], `[${h}]:${p}: both endpoints`);
    assert.deepEqual([...a.peers].sort(), [GW.pod1[6], GW.pod2[6]].sort(), `[${h}]:${p}: masqueraded`);
  });
  refused.forEach(([h, p], i) => {
    const a = no[i];
    assert.equal(a.who.size, 0, `[${h}]:${p}: nobody answers`);
    assert.deepEqual([...new Set(a.errors)], [REJECTED], `[${h}]:${p}: REJECT (ICMPv6 at once, not a timeout)`);
  });
});

test('externalTrafficPolicy Local across tables: only the local endpoint, client address kept; no local endpoint: external traffic dropped, ClusterIP still works', async () => {
  const { at } = v4;
  const [local, localCluster, remoteExt, remoteCluster] = await probe(NS.client, [
    [NODE_IP[4], at.local.nodePort],
    [at.local.clusterIP, 80],
    [NODE_IP[4], at.remote.nodePort],
    [at.remote.clusterIP, 80],
  ], 16);
  assert.deepEqual(local.errors, []);
  assert.deepEqual([...local.who], ['pod1'], 'NodePort from outside: the local endpoint only');
  assert.deepEqual([...local.peers], [CLIENT[4]], 'not masqueraded: the pod sees the client');
  assert.deepEqual(localCluster.errors, []);
  assert.deepEqual([...localCluster.who].sort(), ['pod1', 'pod2'], 'its ClusterIP: every endpoint');
  assert.deepEqual([...localCluster.peers].sort(), [GW.pod1[4], GW.pod2[4]], 'ClusterIP from off the cluster: masqueraded');
  assert.equal(remoteExt.who.size, 0, 'no local endpoint: nobody answers the NodePort');
  assert.deepEqual([...new Set(remoteExt.errors)], [DROPPED], 'dropped (no ICMP, no RST)');
  assert.deepEqual(remoteCluster.errors, []);
  assert.deepEqual([...remoteCluster.who], ['pod2'], 'its ClusterIP reaches the remote endpoint');
});

test('loadBalancerSourceRanges across tables: the allowed client connects, the denied one is dropped and still reaches an open LB IP', async () => {
  const [allowed, allowedOpen] = await probe(NS.client, [['1.2.3.4', 80], ['1.2.3.5', 80]], 12);
  const [denied, deniedOpen] = await probe(NS.denied, [['1.2.3.4', 80], ['1.2.3.5', 80]], 4);
  assert.deepEqual(allowed.errors, []);
  assert.deepEqual([...allowed.who].sort(), ['pod1', 'pod2']);
  assert.deepEqual(allowedOpen.errors, []);
  assert.equal(denied.who.size, 0, 'a source outside the ranges gets no answer');
  assert.deepEqual([...new Set(denied.errors)], [DROPPED], 'dropped by the firewall');
  assert.deepEqual(deniedOpen.errors, [], 'the denied source reaches the open LB IP in another table');
  assert.ok(deniedOpen.who.size >= 1);
});

test('no endpoints next to endpoints in another table: REJECT at the empty Service, the others answer', async () => {
  const { at } = v4;
  const targets: Array<[string, number]> = [
    [at.empty.clusterIP, 80], [NODE_IP[4], at.empty.nodePort], // table 1, no endpoints
    [at.full.clusterIP, 81], [NODE_IP[4], at.full.emptyNodePort!], // table 2, a port without endpoints
    [at.full.clusterIP, 80], [NODE_IP[4], at.full.nodePort], // table 2, the port with endpoints
    [at.open.clusterIP, 80], // table 0
  ];
  const res = await probe(NS.client, targets, 8);
  for (let i = 0; i < 4; i++) {
    assert.equal(res[i].who.size, 0, `${targets[i].join(':')}: nobody answers`);
    assert.deepEqual([...new Set(res[i].errors)], [REJECTED], `${targets[i].join(':')}: REJECT`);
  }
  for (let i = 4; i < targets.length; i++) {
    assert.deepEqual(res[i].errors, [], targets[i].join(':'));
    assert.ok(res[i].who.size >= 1);
  }
});

test('the unallocated-ClusterIP drop (serviceCIDRs) runs after every table\'s reject; the live tracer follows the kernel\'s order at equal priority', async () => {
  const o = { ...optionsFromInput(v4.input), serviceCIDRs: ['172.30.0.0/16'] };
  const apply = async (text: string) => {
    await runChecked(nsRunner(NS.node), 'nft', ['-f', '-'], { input: text, timeoutMs: 20_000 });
  };
  const clear = async () => {
    for (const t of await tablesOf('ip')) await runChecked(nsRunner(NS.node), 'nft', ['delete', 'table', 'ip', t], { timeoutMs: 10_000 });
  };
  /** the kernel's outcome (REJECT: ICMP at once; DROP: nothing) and `kproxy trace --live`'s, per target */
  const outcomes = async (targets: Array<[string, number]>) => {
    const res = await probe(NS.client, targets, 2);
    const out: Array<{ kernel: string; traced: string }> = [];
    for (const [i, [host, port]] of targets.entries()) {
      const errs = [...new Set(res[i].errors)];
      const kernel = res[i].who.size ? 'ANSWERED' : errs.length === 1 && errs[0] === REJECTED ? 'REJECT' : errs.length === 1 && errs[0] === DROPPED ? 'DROP' : errs.join('/');
      const t = await mode.trace!({ from: CLIENT[4], to: host, port, protocol: 'TCP', live: true }, { runner: nsRunner(NS.node) });
      out.push({ kernel, traced: t.output });
    }
    return out;
  };
  // `empty` (table 1) and `full` (table 2) at ports they lack, and an unallocated ClusterIP
  const targets: Array<[string, number]> = [[v4.at.empty.clusterIP, 81], [v4.at.full.clusterIP, 82], ['172.30.0.200', 80]];
  try {
    await clear();
    await apply(planShards(v4.input.state, o, K4).map(dumpRuleset).join(''));
    assert.deepEqual(await outcomes(targets), [
      { kernel: 'REJECT', traced: 'REJECT' },
      { kernel: 'REJECT', traced: 'REJECT' },
      { kernel: 'DROP', traced: 'DROP' },
    ]);
    // The single table's shape (each table's drop inline, at the reject's priority), over two
    // tables: `empty` alone in kube-proxy-1, created last, so the kernel runs it first. `open`'s
    // wrong port is dropped by kube-proxy-1 before its own table can reject it; `empty`'s is
    // rejected. A tracer taking equal priorities in table order would say the opposite.
    await clear();
    const spread2 = (key: string) => (key.includes('/empty-') ? 1 : 0);
    const split = splitState(v4.input.state, 2, spread2);
    await apply([...split].map(([i, st]) => dumpRuleset(planRuleset(st, { ...o, table: `kube-proxy-${i}` }))).join(''));
    assert.deepEqual(await tablesOf('ip'), ['kube-proxy-0', 'kube-proxy-1']);
    assert.deepEqual(await outcomes([[v4.at.open.clusterIP, 81], [v4.at.empty.clusterIP, 81]]), [
      { kernel: 'DROP', traced: 'DROP' },
      { kernel: 'REJECT', traced: 'REJECT' },
    ]);
  } finally {
    // back to what the proxier wrote
    await clear();
    await proxiers[0].sync(v4.input, new Set(), true);
  }
  assert.deepEqual(await tablesOf('ip'), ['kube-proxy-0', 'kube-proxy-1', 'kube-proxy-2']);
});
