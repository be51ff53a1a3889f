// Real kernel: a node namespace runs kproxy's nftables rules (applied by the mode's proxier, NftProxier with one table here,
// through `ip netns exec`), pod namespaces run TCP/UDP echo servers that answer with their
// name and the peer address they saw, and a client namespace (203.0.113.2) connects to
// ClusterIPs and NodePorts. Everything lives in namespaces named kpt-nft-<pid>-*; all of
// them and every process are removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { NftExecutor, NftApplyError } from '../../src/kernel/nft/exec.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { mode } from '../../src/modes/nftables/index.ts';
import type { NftProxier } from '../../src/modes/nftables/proxier.ts';
import { traceNft } from '../../src/modes/nftables/trace.ts';
import { nsRunner, startReadyServer } from './objects.ts';
import { makeService, makeSlice, type ServiceSpec } from '../support/builders.ts';

const P = `kpt-nft-${process.pid}`;
const NS = { node: `${P}-node`, pod1: `${P}-pod1`, pod2: `${P}-pod2`, client: `${P}-client` };
const NODE_NAME = 'node-a';
const CLIENT_IP = '203.0.113.2';
const NODE_IP = '192.168.0.2';
const POD = { pod1: '10.180.1.1', pod2: '10.180.2.1' };

const dir = mkdtempSync(join(tmpdir(), 'kpt-nft-'));
const servers: ChildProcess[] = [];

async function sh(args: string[]): Promise<void> {
  await runChecked(hostRunner, args[0], args.slice(1), { timeoutMs: 10_000 });
}

async function inNs(ns: string, args: string[]): Promise<void> {
  await runChecked(nsRunner(ns), args[0], args.slice(1), { timeoutMs: 10_000 });
}

const SERVER = `
const net = require('node:net'); const dgram = require('node:dgram');
const [id, tcpPort, udpPort] = process.argv.slice(2);
let ready = 0; const up = () => { if (++ready === 2) console.log('ready'); };
net.createServer((s) => { s.on('error', () => {}); s.end(id + ' ' + s.remoteAddress.replace(/^::ffff:/, '') + '\\n'); }).listen(Number(tcpPort), '0.0.0.0', up);
const u = dgram.createSocket('udp4'); u.on('message', (m, r) => u.send(id + ' ' + r.address + '\\n', r.port, r.address)); u.bind(Number(udpPort), '0.0.0.0', up);
setTimeout(() => process.exit(0), 300000).unref();
`;

const CLIENT = `
const net = require('node:net'); const dgram = require('node:dgram');
const reqs = JSON.parse(process.argv[2]);
function one(r) { return new Promise((res) => {
  const t0 = Date.now(); const done = (v) => res({ ...v, ms: Date.now() - t0 });
  if (r.proto === 'udp') {
    const s = dgram.createSocket('udp4'); const tm = setTimeout(() => { s.close(); done({ err: 'TIMEOUT' }); }, 1500);
    s.on('message', (m) => { clearTimeout(tm); s.close(); done({ reply: m.toString().trim() }); });
    s.on('error', (e) => { clearTimeout(tm); s.close(); done({ err: e.code }); });
    s.send('hi', r.port, r.host); return;
  }
  const s = net.connect({ host: r.host, port: r.port }); let buf = '';
  const tm = setTimeout(() => { s.destroy(); done({ err: 'TIMEOUT' }); }, 1500);
  s.on('data', (d) => buf += d); s.on('end', () => { clearTimeout(tm); done({ reply: buf.trim() }); });
  s.on('error', (e) => { clearTimeout(tm); done({ err: e.code }); });
}); }
(async () => { const out = []; for (const r of reqs) out.push(await one(r)); console.log(JSON.stringify(out)); })();
`;

interface Reply {
  reply?: string;
  err?: string;
  ms: number;
}

async function request(reqs: Array<{ proto: 'tcp' | 'udp'; host: string; port: number }>): Promise<Reply[]> {
  const r = await nsRunner(NS.client).run('node', [join(dir, 'client.cjs'), JSON.stringify(reqs)], { timeoutMs: 60_000 });
  assert.equal(r.code, 0, r.stderr);
  return JSON.parse(r.stdout) as Reply[];
}

function times(n: number, req: { proto: 'tcp' | 'udp'; host: string; port: number }) {
  return Array.from({ length: n }, () => req);
}

function who(replies: Reply[]): Set<string> {
  return new Set(replies.map((r) => (r.reply ? r.reply.split(' ')[0] : `ERR:${r.err}`)));
}

async function startServer(ns: string, id: string): Promise<void> {
  await startReadyServer(servers, ns, join(dir, 'server.cjs'), [id, '8080', '8081'], `server ${id}`);
}

async function setupNetwork(): Promise<void> {
  for (const ns of Object.values(NS)) await sh(['ip', 'netns', 'add', ns]);
  for (const ns of Object.values(NS)) await inNs(ns, ['ip', 'link', 'set', 'lo', 'up']);
  await inNs(NS.node, ['sysctl', '-qw', 'net.ipv4.ip_forward=1']);
  const links: Array<[string, string, string, string]> = [
    [NS.pod1, 'vp1', '10.180.1.254/24', `${POD.pod1}/24`],
    [NS.pod2, 'vp2', '10.180.2.254/24', `${POD.pod2}/24`],
    [NS.client, 'vc', '203.0.113.1/24', `${CLIENT_IP}/24`],
  ];
  for (const [ns, nodeSide, nodeAddr, peerAddr] of links) {
    await inNs(NS.node, ['ip', 'link', 'add', nodeSide, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    await inNs(NS.node, ['ip', 'addr', 'add', nodeAddr, 'dev', nodeSide]);
    await inNs(NS.node, ['ip', 'link', 'set', nodeSide, 'up']);
    await inNs(ns, ['ip', 'addr', 'add', peerAddr, 'dev', 'eth0']);
    await inNs(ns, ['ip', 'link', 'set', 'eth0', 'up']);
    await inNs(ns, ['ip', 'route', 'add', 'default', 'via', nodeAddr.split('/')[0]]);
  }
  // The node's "primary" address, reached by the client through its default route.
  await inNs(NS.node, ['ip', 'addr', 'add', `${NODE_IP}/32`, 'dev', 'vc']);
}

function service(name: string, spec: ServiceSpec): K8sService {
  return makeService('e2e', name, spec);
}

function endpoints(name: string, eps: Array<{ ip: string; node?: string }>, port: number, protocol = 'TCP'): K8sEndpointSlice {
  return makeSlice('e2e', name, { endpoints: eps, ports: [{ name: 'p', port, protocol }] });
}

const tracker = new ProxyStateTracker(4, NODE_NAME);
const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
function input(): PlanInput {
  return { state: tracker.state, config, node: { nodeName: NODE_NAME, nodeIPs: [NODE_IP, '203.0.113.1'], nodeLabels: {}, family: 4 } };
}

const both = [{ ip: POD.pod1, node: NODE_NAME }, { ip: POD.pod2, node: 'node-b' }];
const tcpSlice = endpoints('web', both, 8080);
const objects: Array<K8sService | K8sEndpointSlice> = [
  service('web', { type: 'NodePort', clusterIP: '172.30.0.41', ports: [{ name: 'p', port: 80, protocol: 'TCP', nodePort: 30080 }] }),
  tcpSlice,
  service('dns', { clusterIP: '172.30.0.42', ports: [{ name: 'p', port: 53, protocol: 'UDP' }] }),
  endpoints('dns', both, 8081, 'UDP'),
  service('empty', { clusterIP: '172.30.0.43', ports: [{ name: 'p', port: 80, protocol: 'TCP' }] }),
  service('local', { type: 'NodePort', externalTrafficPolicy: 'Local', clusterIP: '172.30.0.44', ports: [{ name: 'p', port: 80, protocol: 'TCP', nodePort: 30081 }] }),
  endpoints('local', both, 8080),
  service('sticky', { clusterIP: '172.30.0.45', sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds: 600 } }, ports: [{ name: 'p', port: 80, protocol: 'TCP' }] }),
  endpoints('sticky', both, 8080),
];

let proxier: NftProxier;

before(async () => {
  writeFileSync(join(dir, 'server.cjs'), SERVER);
  writeFileSync(join(dir, 'client.cjs'), CLIENT);
  await setupNetwork();
  await startServer(NS.pod1, 'pod1');
  await startServer(NS.pod2, 'pod2');
  for (const o of objects) {
    if (o.kind === 'EndpointSlice') tracker.endpoints.update(null, o as K8sEndpointSlice);
    else tracker.services.update(null, o as K8sService);
  }
  const changed = tracker.apply();
  proxier = (await mode.createProxier({ config, log: silentLogger(), runner: nsRunner(NS.node) })) as NftProxier;
  const stats = await proxier.sync(input(), changed, true);
  assert.ok(stats.rulesWritten > 0);
});

after(async () => {
  for (const s of servers) if (s.pid && s.exitCode === null) s.kill('SIGKILL');
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
  rmSync(dir, { recursive: true, force: true });
});

test('ClusterIP TCP reaches every endpoint, masqueraded from outside the cluster CIDR', async () => {
  const replies = await request(times(24, { proto: 'tcp', host: '172.30.0.41', port: 80 }));
  assert.deepEqual([...who(replies)].sort(), ['pod1', 'pod2']);
  // The client is outside 10.0.0.0/8, so the service chain marked it for masquerade.
  for (const r of replies) assert.match(r.reply!, /^pod[12] 10\.180\.[12]\.254$/);
});

test('ClusterIP UDP reaches every endpoint', async () => {
  const replies = await request(times(24, { proto: 'udp', host: '172.30.0.42', port: 53 }));
  assert.deepEqual([...who(replies)].sort(), ['pod1', 'pod2']);
});

test('NodePort from the client namespace', async () => {
  const replies = await request(times(24, { proto: 'tcp', host: NODE_IP, port: 30080 }));
  assert.deepEqual([...who(replies)].sort(), ['pod1', 'pod2']);
});

test('a service without endpoints is rejected at once', async () => {
  const [r] = await request([{ proto: 'tcp', host: '172.30.0.43', port: 80 }]);
  // The ICMP error of `reject` fails the connect immediately instead of a SYN timeout.
  assert.match(r.err ?? '', /^(ECONNREFUSED|ENETUNREACH|EHOSTUNREACH)$/);
  assert.ok(r.ms < 1000, `rejected after ${r.ms}ms`);
  const [wrongPort] = await request([{ proto: 'tcp', host: '172.30.0.41', port: 81 }]);
  assert.match(wrongPort.err ?? '', /^(ECONNREFUSED|ENETUNREACH|EHOSTUNREACH)$/, 'a ClusterIP port the service does not have is rejected too');
  assert.ok(wrongPort.ms < 1000);
});

test('externalTrafficPolicy Local: only the local endpoint, client source preserved', async () => {
  const replies = await request(times(12, { proto: 'tcp', host: NODE_IP, port: 30081 }));
  assert.deepEqual([...who(replies)], ['pod1']);
  for (const r of replies) assert.equal(r.reply, `pod1 ${CLIENT_IP}`);
});

test('session affinity holds', async () => {
  const replies = await request(times(12, { proto: 'tcp', host: '172.30.0.45', port: 80 }));
  assert.equal(who(replies).size, 1, JSON.stringify(replies));
});

test('the live table traces like the plan', async () => {
  const live = await new NftExecutor(nsRunner(NS.node)).listTable('ip');
  assert.ok(live);
  const t = traceNft(live, { sourceIP: CLIENT_IP, protocol: 'TCP', destIP: '172.30.0.41', destPort: 80 }, { localIPs: [NODE_IP, '203.0.113.1'] });
  assert.equal(t.output, `${POD.pod1}:8080, ${POD.pod2}:8080`);
  assert.equal(t.masq, true);
  const local = traceNft(live, { sourceIP: CLIENT_IP, protocol: 'TCP', destIP: NODE_IP, destPort: 30081 }, { localIPs: [NODE_IP, '203.0.113.1'] });
  assert.equal(local.output, `${POD.pod1}:8080`);
  assert.equal(local.masq, false);
});

test('an update applies atomically; a rejected transaction leaves the old rules', async () => {
  const exec = new NftExecutor(nsRunner(NS.node));
  // Affinity entries count down; everything else must be byte-identical.
  const listing = async () => (await exec.listTable('ip'))?.replace(/ expires \S+/g, '');
  const beforeText = await listing();
  // A transaction nft rejects half way: nothing of it may be applied.
  await assert.rejects(
    exec.apply('add table ip kube-proxy\nflush map ip kube-proxy service-ips\nadd rule ip kube-proxy services jump no-such-chain\n'),
    (e: unknown) => e instanceof NftApplyError && e.lineNo === 3 && /KPROXY_NFT_APPLY: .*line 3: add rule ip kube-proxy services jump no-such-chain/.test(e.message),
  );
  assert.equal(await listing(), beforeText);
  assert.deepEqual([...who(await request(times(16, { proto: 'tcp', host: '172.30.0.41', port: 80 })))].sort(), ['pod1', 'pod2']);

  // Endpoint pod2 removed: a partial sync rewrites only what changed.
  tracker.endpoints.update(tcpSlice, endpoints('web', [both[0]], 8080));
  const changed = tracker.apply();
  const stats = await proxier.sync(input(), changed, false);
  assert.match(stats.diff ?? '', /^partial sync/);
  assert.ok(!/flush map ip kube-proxy service-ips/.test(proxier.lastTransactionText()), 'partial, not a full rewrite');
  const replies = await request(times(16, { proto: 'tcp', host: '172.30.0.41', port: 80 }));
  assert.deepEqual([...who(replies)], ['pod1']);
  // Other services are untouched.
  assert.deepEqual([...who(await request(times(16, { proto: 'udp', host: '172.30.0.42', port: 53 })))].sort(), ['pod1', 'pod2']);

  // The retired endpoint chain stays (flushed) for a second, then a later sync deletes it.
  const retired = /chain endpoint-\S+-e2e\/web\/tcp\/p__10\.180\.2\.1\/8080 \{\s*\}/;
  assert.match((await exec.listTable('ip'))!, retired);
  await new Promise((r) => setTimeout(r, 1100));
  const idle = await proxier.sync(input(), new Set(), false);
  assert.equal(idle.rulesWritten, 0, 'nothing changed, nothing written');
  assert.doesNotMatch((await exec.listTable('ip'))!, /e2e\/web\/tcp\/p__10\.180\.2\.1/);
});

test('cleanup removes the table and ignores its absence', async () => {
  const runner = nsRunner(NS.node);
  await mode.cleanup(runner, silentLogger());
  assert.equal(await new NftExecutor(runner).listTable('ip'), null);
  await mode.cleanup(runner, silentLogger());
});
