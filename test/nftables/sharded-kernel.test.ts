// Real kernel, the sharded nftables mode with a low threshold (6 Services; 3 per
// table; at most 4 tables): a node namespace holds the tables `kube-proxy-0..3` written by
// NftProxier through `ip netns exec`, two pod namespaces run TCP echo servers that
// answer with their name and the peer address they saw, a client namespace (203.0.113.2, off
// the cluster CIDR) connects. Checked across the tables: ClusterIP, NodePort, the
// no-endpoint REJECT, masquerade, ClientIP affinity; partial syncs write only the changed
// Services' tables, and after them (and an idle sync) the kernel equals a fresh full sync's;
// a reshard (1 → 4 → 1 tables) is one transaction and keeps an unchanged Service reachable
// throughout (bounded probes). Namespaces are named by uniqueName(); they and every process
// are removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hostRunner, runChecked, type CommandRunner, inputText } from '../../src/kernel/runner.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { shardOf } from '../../src/modes/nftables/names.ts';
import { FakeNft } from '../../src/kernel/nft/fake.ts';
import { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { kernelTables } from '../support/nft-retired.ts';
import { chooseTables, DEFAULT_SHARDS } from '../../src/modes/nftables/shards.ts';
import { uniqueName } from '../support/netns.ts';
import { nsRunner, startReadyServer } from './objects.ts';
import { clientIPAffinity, makeService, makeSlice } from '../support/builders.ts';

const P = uniqueName('kpt-shd');
const NS = { node: `${P}-n`, pod1: `${P}-p1`, pod2: `${P}-p2`, client: `${P}-c`, fresh: `${P}-f` };
const NODE_NAME = 'node-a';
const NODE_IP = '192.168.0.2';
const POD = { pod1: '10.180.1.1', pod2: '10.180.2.1' };
const SHARDS = { threshold: 6, perTable: 3, maxTables: 4 };

const dir = mkdtempSync(join(tmpdir(), 'kpt-shd-'));
const servers: ChildProcess[] = [];

async function inNs(ns: string, args: string[]): Promise<void> {
  await runChecked(nsRunner(ns), args[0], args.slice(1), { timeoutMs: 10_000 });
}

const SERVER = `
const net = require('node:net');
const [id, port] = process.argv.slice(2);
net.createServer((s) => { s.on('error', () => {}); s.end(id + ' ' + s.remoteAddress.replace(/^::ffff:/, '') + '\\n'); }).listen(Number(port), '0.0.0.0', () => console.log('ready'));
setTimeout(() => process.exit(0), 300000).unref();
`;

// Sequential TCP requests, each bounded (1.5 s); gapMs between them; with a stop file, the
// first request is repeated until the file exists (at most reqs.length times).
const CLIENT = `
const net = require('node:net'); const fs = require('node:fs');
const [reqs, gapMs, stop] = [JSON.parse(process.argv[2]), Number(process.argv[3] || 0), process.argv[4]];
function one(r) { return new Promise((res) => {
  const s = net.connect({ host: r.host, port: r.port }); let buf = '';
  const tm = setTimeout(() => { s.destroy(); res({ err: 'TIMEOUT' }); }, 1500);
  s.on('data', (d) => buf += d); s.on('end', () => { clearTimeout(tm); res({ reply: buf.trim() }); });
  s.on('error', (e) => { clearTimeout(tm); res({ err: e.code }); });
}); }
(async () => { const out = []; for (const r of reqs) { if (stop && fs.existsSync(stop)) break; out.push(await one(r)); if (gapMs) await new Promise((r) => setTimeout(r, gapMs)); } console.log(JSON.stringify(out)); })();
`;

interface Reply {
  reply?: string;
  err?: string;
}

async function request(host: string, port: number, n: number, gapMs = 0, stopFile = ''): Promise<Reply[]> {
  const reqs = Array.from({ length: n }, () => ({ host, port }));
  const r = await nsRunner(NS.client).run('node', [join(dir, 'client.cjs'), JSON.stringify(reqs), String(gapMs), ...(stopFile ? [stopFile] : [])], { timeoutMs: 120_000 });
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout) as Reply[];
}

/** who answered ("pod1"/"pod2") and from which source address it saw the client */
function answers(replies: Reply[]): { who: Set<string>; peers: Set<string>; errors: string[] } {
  const out = { who: new Set<string>(), peers: new Set<string>(), errors: [] as string[] };
  for (const r of replies) {
    if (!r.reply) out.errors.push(r.err ?? '?');
    else {
      const [who, peer] = r.reply.split(' ');
      out.who.add(who);
      out.peers.add(peer);
    }
  }
  return out;
}

async function startServer(ns: string, id: string): Promise<void> {
  await startReadyServer(servers, ns, join(dir, 'server.cjs'), [id, '8080'], `server ${id}`);
}

async function setupNetwork(): Promise<void> {
  for (const ns of Object.values(NS)) await runChecked(hostRunner, 'ip', ['netns', 'add', ns], { timeoutMs: 10_000 });
  for (const ns of Object.values(NS)) await inNs(ns, ['ip', 'link', 'set', 'lo', 'up']);
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv4.ip_forward=1']);
  const links: Array<[string, string, string, string]> = [
    [NS.pod1, 'vp1', '10.180.1.254/24', `${POD.pod1}/24`],
    [NS.pod2, 'vp2', '10.180.2.254/24', `${POD.pod2}/24`],
    [NS.client, 'vc', '203.0.113.1/24', '203.0.113.2/24'],
  ];
  for (const [ns, nodeSide, nodeAddr, peerAddr] of links) {
    await inNs(NS.node, ['ip', 'link', 'add', nodeSide, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    await inNs(NS.node, ['ip', 'addr', 'add', nodeAddr, 'dev', nodeSide]);
    await inNs(NS.node, ['ip', 'link', 'set', nodeSide, 'up']);
    await inNs(ns, ['ip', 'addr', 'add', peerAddr, 'dev', 'eth0']);
    await inNs(ns, ['ip', 'link', 'set', 'eth0', 'up']);
    await inNs(ns, ['ip', 'route', 'add', 'default', 'via', nodeAddr.split('/')[0]]);
  }
  await inNs(NS.node, ['ip', 'addr', 'add', `${NODE_IP}/32`, 'dev', 'vc']);
  // ClusterIPs are routed (to pod1, which does not forward: a packet no rule DNATs or
  // rejects is dropped there, a timeout), so a refusal can only come from a `reject` rule;
  // and the kernel's ICMP rate limit must not turn a refusal into a timeout.
  await inNs(NS.node, ['ip', 'route', 'add', '172.30.0.0/16', 'via', POD.pod1]);
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv4.icmp_ratelimit=0']);
  await inNs(NS.pod1, ['sysctl', '-qw', 'net.ipv4.ip_forward=0']);
}

const NAMES = ['web', 'api', 'db', 'cache', 'queue', 'auth', 'search', 'mail', 'logs', 'metrics', 'dns'];

function service(i: number, o: { sticky?: boolean } = {}): K8sService {
  return makeService('shd', NAMES[i], {
    type: 'NodePort',
    clusterIP: `172.30.0.${i + 1}`,
    ports: [{ name: 'p', port: 80, protocol: 'TCP', nodePort: 31000 + i }],
    ...(o.sticky ? clientIPAffinity(600) : {}),
  });
}

function slice(i: number, pods: Array<'pod1' | 'pod2'>): K8sEndpointSlice {
  return makeSlice('shd', NAMES[i], {
    endpoints: pods.map((p) => ({ ip: POD[p], node: p === 'pod1' ? NODE_NAME : 'node-b', ready: true })),
    ports: [{ name: 'p', port: 8080 }],
  });
}

/** what a connect gets from nft's `reject` (ICMP port unreachable); no rule: TIMEOUT (see the route in setupNetwork) */
const REJECTED = /^ECONNREFUSED$/;

/** Lines only in a or only in b, per table (for a readable failure). */
function tableDiff(a: Map<string, string[]>, b: Map<string, string[]>): string[] {
  const out: string[] = [];
  for (const t of new Set([...a.keys(), ...b.keys()])) {
    const x = new Set(a.get(t) ?? []);
    const y = new Set(b.get(t) ?? []);
    for (const l of x) if (!y.has(l)) out.push(`${t} only in the first: ${l}`);
    for (const l of y) if (!x.has(l)) out.push(`${t} only in the second: ${l}`);
  }
  return out.slice(0, 30);
}

const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
const NODE = { nodeName: NODE_NAME, nodeIPs: [NODE_IP, '203.0.113.1'], nodeLabels: {}, family: 4 as const };

async function tables(ns: string): Promise<string[]> {
  const r = await runChecked(nsRunner(ns), 'nft', ['list', 'tables'], { timeoutMs: 10_000 });
  return r.stdout.split('\n').filter(Boolean).map((l) => l.replace(/^table /, '')).sort();
}

/** Every table of the namespace: "family name" → sorted dump lines. */
function contents(ns: string): Promise<Map<string, string[]>> {
  return kernelTables(nsRunner(ns));
}

before(async () => {
  writeFileSync(join(dir, 'server.cjs'), SERVER);
  writeFileSync(join(dir, 'client.cjs'), CLIENT);
  await setupNetwork();
  await startServer(NS.pod1, 'pod1');
  await startServer(NS.pod2, 'pod2');
});

after(async () => {
  for (const s of servers) s.kill('SIGKILL');
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
  rmSync(dir, { recursive: true, force: true });
});

test('the number of tables: one below the threshold, about N / perTable above it, capped, with hysteresis', () => {
  const o = DEFAULT_SHARDS;
  assert.equal(chooseTables(0, 0, o), 1);
  assert.equal(chooseTables(999, 0, o), 1);
  assert.equal(chooseTables(1000, 0, o), 2);
  assert.equal(chooseTables(6000, 0, o), 10);
  assert.equal(chooseTables(10_000, 0, o), 16);
  assert.equal(chooseTables(50_000, 0, o), 16);
  // up at the threshold, back to one only below 80 % of it
  assert.equal(chooseTables(1000, 1, o), 2);
  assert.equal(chooseTables(900, 2, o), 2);
  assert.equal(chooseTables(799, 2, o), 1);
  // between: only a change of at least 1.5× or at most half
  assert.equal(chooseTables(10_000, 16, o), 16);
  assert.equal(chooseTables(7000, 16, o), 16);
  assert.equal(chooseTables(4800, 16, o), 8);
  assert.equal(chooseTables(1700, 2, o), 3);
  assert.equal(chooseTables(2300, 3, o), 3);
});

test('across the tables: ClusterIP, NodePort, the no-endpoint REJECT, masquerade and ClientIP affinity', async () => {
  const tracker = new ProxyStateTracker(4, NODE_NAME);
  for (let i = 0; i < 10; i++) {
    tracker.services.update(null, service(i, { sticky: i === 3 }));
    if (i !== 5) tracker.endpoints.update(null, slice(i, ['pod1', 'pod2']));
  }
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  // leftovers of an earlier run (one table; another K) go with the first sync
  await runChecked(nsRunner(NS.node), 'nft', ['-f', '-'], { input: 'add table ip kube-proxy\nadd table ip kube-proxy-9\nadd chain ip kube-proxy-9 nat-output { type nat hook output priority -100 ; }\n', timeoutMs: 10_000 });
  const proxier = new NftProxier({ runner: nsRunner(NS.node), log: silentLogger(), shards: SHARDS });
  await proxier.sync(input, tracker.apply(), true);
  assert.equal(proxier.shardCount, 4);
  assert.deepEqual(await tables(NS.node), ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2', 'ip kube-proxy-3']);
  const owner = (i: number) => shardOf(`shd/${NAMES[i]}`, 4);
  assert.ok(new Set(NAMES.map((_, i) => owner(i))).size >= 3, 'the Services are spread over the tables');

  for (let i = 0; i < 10; i++) {
    if (i === 5 || i === 3) continue;
    for (const [host, port] of [[`172.30.0.${i + 1}`, 80], [NODE_IP, 31000 + i]] as const) {
      // 30 connections: both of 2 random endpoints are reached but with probability 2^-29
      const a = answers(await request(host, port, 30));
      assert.deepEqual(a.errors, [], `${NAMES[i]} (kube-proxy-${owner(i)}) at ${host}:${port}`);
      assert.deepEqual([...a.who].sort(), ['pod1', 'pod2'], `${NAMES[i]} at ${host}:${port}: both endpoints`);
      // off-cluster client: masqueraded to the node's address on the pod's link
      assert.deepEqual([...a.peers].sort(), ['10.180.1.254', '10.180.2.254'].filter((_, k) => a.who.has(`pod${k + 1}`)), `${NAMES[i]} at ${host}:${port}: masqueraded`);
    }
  }
  // the control: a pod IP directly, not masqueraded (no Service)
  const direct = answers(await request(POD.pod1, 8080, 3));
  assert.deepEqual([...direct.peers], ['203.0.113.2'], 'pod traffic is not masqueraded');
  // no endpoints: REJECT from its own table, at the ClusterIP and the NodePort
  for (const [host, port] of [['172.30.0.6', 80], [NODE_IP, 31005]] as const) {
    const errs = answers(await request(host, port, 2)).errors;
    assert.equal(errs.length, 2, `${host}:${port}: refused`);
    for (const e of errs) assert.match(e, REJECTED, `${host}:${port}: REJECT (an ICMP error at once, not a timeout)`);
  }
  // an unknown port of a ClusterIP: REJECT
  const unknown = answers(await request('172.30.0.1', 81, 1)).errors;
  assert.equal(unknown.length, 1);
  assert.match(unknown[0], REJECTED);
  // ClientIP affinity: every connection to one endpoint
  const sticky = answers(await request('172.30.0.4', 80, 16));
  assert.deepEqual(sticky.errors, []);
  assert.equal(sticky.who.size, 1, `affinity: ${[...sticky.who]}`);
  await proxier.stop();
  await runChecked(nsRunner(NS.node), 'nft', ['flush', 'ruleset'], { timeoutMs: 10_000 });
});

test('partial syncs write only the changed Services\' tables; after them the kernel equals a fresh full sync\'s', async () => {
  const tracker = new ProxyStateTracker(4, NODE_NAME);
  for (let i = 0; i < 11; i++) { // 11, then 10: K = 4 (ceil(N / 3)) for this proxier and a fresh one
    tracker.services.update(null, service(i, { sticky: i === 3 }));
    tracker.endpoints.update(null, slice(i, ['pod1', 'pod2']));
  }
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  let clock = 1_000_000;
  const proxier = new NftProxier({ runner: nsRunner(NS.node), log: silentLogger(), shards: SHARDS, now: () => clock });
  await proxier.sync(input, tracker.apply(), true);
  const owner = (i: number) => `kube-proxy-${shardOf(`shd/${NAMES[i]}`, 4)}`;
  const changes: Array<[string, number[], () => void]> = [
    ['an endpoint removed', [0], () => tracker.endpoints.update(slice(0, ['pod1', 'pod2']), slice(0, ['pod2']))],
    ['endpoints of two Services changed', [1, 7], () => (tracker.endpoints.update(slice(1, ['pod1', 'pod2']), slice(1, ['pod1'])), tracker.endpoints.update(slice(7, ['pod1', 'pod2']), slice(7, [])))],
    ['a sticky Service\'s endpoint removed', [3], () => tracker.endpoints.update(slice(3, ['pod1', 'pod2']), slice(3, ['pod1']))],
    ['a Service deleted', [4], () => (tracker.services.update(service(4), null), tracker.endpoints.update(slice(4, ['pod1', 'pod2']), null))],
    ['endpoints back', [7], () => tracker.endpoints.update(slice(7, []), slice(7, ['pod2']))],
  ];
  for (const [what, idx, change] of changes) {
    change();
    await proxier.sync(input, tracker.apply(), false);
    const written = new Set(proxier.lastTransactionText().split('\n').filter(Boolean).map((l) => /^\S+ \S+ ip (\S+) /.exec(l)?.[1] ?? `?${l}`));
    assert.deepEqual([...written].sort(), [...new Set(idx.map(owner))].sort(), `${what}: only the changed Services' tables are written`);
  }
  assert.equal(proxier.partialFallbacks, 0);
  assert.equal(proxier.shardCount, 4);
  // an idle sync after the retirement delay deletes what lingers and the retired chains
  clock += 120_000;
  await proxier.sync(input, new Set(), false);
  for (const p of proxier.tableWriters()) assert.deepEqual(p.lingeringElements(), [], p.table);

  const fresh = new NftProxier({ runner: nsRunner(NS.fresh), log: silentLogger(), shards: SHARDS });
  await fresh.sync(input, new Set(), true);
  const got = await contents(NS.node);
  assert.deepEqual([...got.keys()].sort(), ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2', 'ip kube-proxy-3']);
  assert.deepEqual(tableDiff(got, await contents(NS.fresh)), [], 'the kernel equals a fresh full sync\'s');
  // the rule dump holds every table, each as a fresh full sync's (both applied to the nft fake)
  const dumped = new FakeNft();
  const freshDump = new FakeNft();
  assert.equal((await dumped.run('nft', ['-f', '-'], { input: proxier.dump() })).code, 0);
  assert.equal((await freshDump.run('nft', ['-f', '-'], { input: fresh.dump() })).code, 0);
  assert.deepEqual(dumped.tableNames(), ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2', 'ip kube-proxy-3']);
  for (const t of proxier.tables()) {
    const lines = (dumped.dump('ip', t) ?? '').split('\n').sort();
    assert.ok(lines.some((l) => /-shd\//.test(l)), `dump of ${t} holds Services`);
    assert.deepEqual(lines, (freshDump.dump('ip', t) ?? '').split('\n').sort(), `dump of ${t}`);
  }
  // and a full sync then changes nothing
  await proxier.sync(input, new Set(), true);
  assert.deepEqual(tableDiff(await contents(NS.node), got), []);
  await runChecked(nsRunner(NS.node), 'nft', ['flush', 'ruleset'], { timeoutMs: 10_000 });
});

test('a reshard (1 → 4 → 1 tables) is one transaction and keeps an unchanged Service reachable throughout', async () => {
  const tracker = new ProxyStateTracker(4, NODE_NAME);
  for (let i = 0; i < 3; i++) {
    tracker.services.update(null, service(i));
    tracker.endpoints.update(null, slice(i, ['pod1', 'pod2']));
  }
  const input: PlanInput = { state: tracker.state, config, node: NODE };
  const runner = nsRunner(NS.node);
  const sent: string[] = [];
  const recording: CommandRunner = { run: (cmd, args, opts) => (cmd === 'nft' && args[0] === '-f' && sent.push(inputText(opts?.input)), runner.run(cmd, args, opts)) };
  await runChecked(runner, 'nft', ['add', 'table', 'ip', 'kube-proxy-2'], { timeoutMs: 10_000 });
  const proxier = new NftProxier({ runner: recording, log: silentLogger(), shards: SHARDS });
  await proxier.sync(input, tracker.apply(), true);
  assert.equal(sent.length, 1, 'the first sync is one transaction');
  assert.match(sent[0], /^delete table ip kube-proxy-2$/m, 'which deletes the leftover table');
  assert.deepEqual(await tables(NS.node), ['ip kube-proxy'], 'below the threshold: upstream\'s single table');

  // probes to `web` (unchanged throughout), 5 ms apart, until the reshards are done (at most 3,000)
  const stop = join(dir, 'stop-probes');
  let probing = true;
  const probes = request('172.30.0.1', 80, 3000, 5, stop).finally(() => (probing = false));
  await new Promise((r) => setTimeout(r, 300));
  const steps: Array<[string, () => void, string[]]> = [
    ['grow to 10 Services', () => {
      for (let i = 3; i < 10; i++) {
        tracker.services.update(null, service(i));
        tracker.endpoints.update(null, slice(i, ['pod1', 'pod2']));
      }
    }, ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2', 'ip kube-proxy-3']],
    ['shrink to 4 Services', () => {
      for (let i = 4; i < 10; i++) {
        tracker.services.update(service(i), null);
        tracker.endpoints.update(slice(i, ['pod1', 'pod2']), null);
      }
    }, ['ip kube-proxy']],
    ['grow again', () => {
      for (let i = 4; i < 10; i++) {
        tracker.services.update(null, service(i));
        tracker.endpoints.update(null, slice(i, ['pod1', 'pod2']));
      }
    }, ['ip kube-proxy-0', 'ip kube-proxy-1', 'ip kube-proxy-2', 'ip kube-proxy-3']],
  ];
  for (const [what, change, want] of steps) {
    await new Promise((r) => setTimeout(r, 200));
    change();
    sent.length = 0;
    const reshards = proxier.reshards;
    await proxier.sync(input, tracker.apply(), false);
    assert.equal(proxier.reshards, reshards + 1, `${what}: resharded`);
    assert.equal(sent.length, 1, `${what}: one transaction`);
    assert.deepEqual(await tables(NS.node), want, `${what}: only the new tables are left`);
  }
  assert.ok(probing, 'the probes ran throughout the reshards');
  writeFileSync(stop, '');
  const replies = await probes;
  const a = answers(replies);
  assert.ok(replies.length >= 10, `${replies.length} probes`);
  assert.deepEqual(a.errors, [], 'every probe to the unchanged Service was answered');
  assert.deepEqual([...a.who].sort(), ['pod1', 'pod2']);
  await runChecked(runner, 'nft', ['flush', 'ruleset'], { timeoutMs: 10_000 });
});
