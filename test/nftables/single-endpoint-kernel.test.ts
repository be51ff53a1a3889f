// A Service port with one endpoint (kubernetes PR #140723: no random selection for a single
// endpoint) on the real kernel: kproxy's service chain goes straight to the one endpoint
// chain (no numgen), and traffic to the ClusterIP and the NodePort reaches the endpoint, TCP
// and UDP; scaled to two endpoints the chain picks at random again, and back to one it is a
// plain goto again. Namespaces kpt-nft1-<pid>-*, removed in `after`, also on failure.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { NftExecutor } from '../../src/kernel/nft/exec.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { silentLogger } from '../../src/log.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { mode } from '../../src/modes/nftables/index.ts';
import type { Proxier } from '../../src/modes/types.ts';
import { nsRunner, startReadyServer } from './objects.ts';
import { makeService, makeSlice } from '../support/builders.ts';

const P = `kpt-nft1-${process.pid}`;
const NS = { node: `${P}-node`, pod1: `${P}-pod1`, pod2: `${P}-pod2`, client: `${P}-client` };
const NODE_NAME = 'node-a';
const NODE_IP = '192.168.0.2';
const POD = { pod1: '10.180.1.1', pod2: '10.180.2.1' };
const dir = mkdtempSync(join(tmpdir(), 'kpt-nft1-'));
const servers: ChildProcess[] = [];

const SERVER = `
const net = require('node:net'); const dgram = require('node:dgram');
const [id] = process.argv.slice(2); let ready = 0; const up = () => { if (++ready === 2) console.log('ready'); };
net.createServer((s) => { s.on('error', () => {}); s.end(id + '\\n'); }).listen(8080, '0.0.0.0', up);
const u = dgram.createSocket('udp4'); u.on('message', (m, r) => u.send(id, r.port, r.address)); u.bind(8081, '0.0.0.0', up);
setTimeout(() => process.exit(0), 300000).unref();`;

const CLIENT = `
const net = require('node:net'); const dgram = require('node:dgram');
const [proto, host, port, count] = process.argv.slice(2);
function one() { return new Promise((res) => {
  if (proto === 'udp') {
    const s = dgram.createSocket('udp4'); const t = setTimeout(() => { s.close(); res('TIMEOUT'); }, 1500);
    s.on('message', (m) => { clearTimeout(t); s.close(); res(m.toString().trim()); }); s.send('hi', Number(port), host); return;
  }
  const s = net.connect({ host, port: Number(port) }); let b = ''; const t = setTimeout(() => { s.destroy(); res('TIMEOUT'); }, 1500);
  s.on('data', (d) => (b += d)); s.on('end', () => { clearTimeout(t); res(b.trim()); }); s.on('error', (e) => { clearTimeout(t); res(e.code); });
}); }
(async () => { const out = []; for (let i = 0; i < Number(count); i++) out.push(await one()); console.log(JSON.stringify(out)); })();`;

async function inNs(ns: string, args: string[]): Promise<void> {
  await runChecked(nsRunner(ns), args[0], args.slice(1), { timeoutMs: 10_000 });
}

async function answers(proto: 'tcp' | 'udp', host: string, port: number, count = 12): Promise<string[]> {
  const r = await nsRunner(NS.client).run('node', [join(dir, 'client.cjs'), proto, host, String(port), String(count)], { timeoutMs: 60_000 });
  assert.equal(r.code, 0, r.stderr);
  return [...new Set(JSON.parse(r.stdout) as string[])].sort();
}

const tracker = new ProxyStateTracker(4, NODE_NAME);
const config = resolveConfig({}, { mode: 'nftables', clusterCidr: '10.0.0.0/8' });
const input = (): PlanInput => ({ state: tracker.state, config, node: { nodeName: NODE_NAME, nodeIPs: [NODE_IP, '203.0.113.1'], nodeLabels: {}, family: 4 } });
const slice = (ips: string[]) => makeSlice('one', 'web', {
  endpoints: ips.map((ip) => ({ ip, node: 'node-b' })),
  ports: [{ name: 'tcp', port: 8080, protocol: 'TCP' }, { name: 'udp', port: 8081, protocol: 'UDP' }],
});
const svc: K8sService = makeService('one', 'web', {
  type: 'NodePort',
  clusterIP: '172.30.0.61',
  ports: [{ name: 'tcp', port: 80, protocol: 'TCP', nodePort: 30061 }, { name: 'udp', port: 53, protocol: 'UDP', nodePort: 30062 }],
});
let current: K8sEndpointSlice = slice([POD.pod1]);
let proxier: Proxier;

async function scaleTo(ips: string[]): Promise<void> {
  const next = slice(ips);
  tracker.endpoints.update(current, next);
  current = next;
  await proxier.sync(input(), tracker.apply(), false);
}

/** The live rules of the TCP port's service chain, as `nft list` prints them. */
async function serviceChainRules(): Promise<string[]> {
  const table = (await new NftExecutor(nsRunner(NS.node)).listTable('ip'))!;
  const m = /\n\tchain (service-\S+-one\/web\/tcp\/tcp) \{\n([\s\S]*?)\n\t\}/.exec(table);
  assert.ok(m, `no service chain for one/web:tcp in\n${table}`);
  return m[2].split('\n').map((l) => l.trim()).filter(Boolean);
}

before(async () => {
  writeFileSync(join(dir, 'server.cjs'), SERVER);
  writeFileSync(join(dir, 'client.cjs'), CLIENT);
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
  await startReadyServer(servers, NS.pod1, join(dir, 'server.cjs'), ['pod1'], 'server pod1');
  await startReadyServer(servers, NS.pod2, join(dir, 'server.cjs'), ['pod2'], 'server pod2');
  tracker.services.update(null, svc);
  tracker.endpoints.update(null, current);
  proxier = await mode.createProxier({ config, log: silentLogger(), runner: nsRunner(NS.node) });
  await proxier.sync(input(), tracker.apply(), true);
});

after(async () => {
  for (const s of servers) if (s.pid && s.exitCode === null) s.kill('SIGKILL');
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
  rmSync(dir, { recursive: true, force: true });
});

test('one endpoint: the service chain goes straight to its endpoint chain, no random selection', async () => {
  const rules = await serviceChainRules();
  assert.ok(rules.every((r) => !/numgen|vmap/.test(r)), rules.join('\n'));
  assert.match(rules.at(-1)!, /^goto endpoint-\S+-one\/web\/tcp\/tcp__10\.180\.1\.1\/8080$/);
  assert.equal(rules.filter((r) => r.startsWith('goto ')).length, 1);
});

test('one endpoint: ClusterIP and NodePort traffic reaches it, TCP and UDP', async () => {
  assert.deepEqual(await answers('tcp', '172.30.0.61', 80), ['pod1']);
  assert.deepEqual(await answers('udp', '172.30.0.61', 53), ['pod1']);
  assert.deepEqual(await answers('tcp', NODE_IP, 30061), ['pod1']);
  assert.deepEqual(await answers('udp', NODE_IP, 30062), ['pod1']);
});

test('two endpoints pick at random; back to one, a plain goto again', async () => {
  await scaleTo([POD.pod1, POD.pod2]);
  const two = await serviceChainRules();
  assert.ok(two.some((r) => /^numgen random mod 2 (== )?0 goto endpoint-/.test(r)), two.join('\n'));
  assert.deepEqual(await answers('tcp', '172.30.0.61', 80, 40), ['pod1', 'pod2']);
  await scaleTo([POD.pod2]);
  const one = await serviceChainRules();
  assert.ok(one.every((r) => !/numgen/.test(r)), one.join('\n'));
  assert.match(one.at(-1)!, /^goto endpoint-\S+__10\.180\.2\.1\/8080$/);
  assert.deepEqual(await answers('tcp', '172.30.0.61', 80), ['pod2']);
  assert.deepEqual(await answers('udp', NODE_IP, 30062), ['pod2']);
});
