// Localhost NodePorts in the nftables mode (KEP-6032, kubernetes#138427): the node view's
// opt-in, the listeners a view asks for, and the listener set on the real loopback
// (127.0.0.0/8 only; the namespace test is localhost-nodeports-kernel.test.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, connect, type Server } from 'node:net';
import { buildNodeView, nodeSettings, type NodeContext, type PlanInput } from '../../src/core/nodeview.ts';
import { resolveConfig, type RawConfig } from '../../src/config/config.ts';
import type { Endpoint, ServicePort } from '../../src/core/model.ts';
import { LocalhostNodePortListeners, localhostNodePorts, NftWithLocalhostNodePorts, type LocalhostNodePort } from '../../src/modes/nftables/localhost-nodeports.ts';
import type { Proxier, SyncStats } from '../../src/modes/types.ts';
import { endpoint, port, stateOf } from '../support/ports.ts';
import { silentLogger } from '../../src/log.ts';

const NODE = 'node1';
const node4: NodeContext = { nodeName: NODE, nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4, addresses: [{ type: 'InternalIP', address: '192.168.0.2' }] };
const node6: NodeContext = { nodeName: NODE, nodeIPs: ['fd00::2'], nodeLabels: {}, family: 6, addresses: [{ type: 'InternalIP', address: 'fd00::2' }] };

function optIn(raw: RawConfig, n: NodeContext = node4): boolean {
  return nodeSettings(resolveConfig(raw), n).localhostNodePortProxy;
}

test('opt-in: nftables mode, NodePort addresses not matching all, and a CIDR holding the family\'s loopback address itself', () => {
  const rows: Array<[RawConfig, NodeContext, boolean, string]> = [
    [{ mode: 'nftables', nodePortAddresses: ['primary', 'localhost'] }, node4, true, 'primary,localhost'],
    [{ mode: 'nftables', nodePortAddresses: ['192.168.0.0/24', '127.0.0.1/32'] }, node4, true, 'CIDR 127.0.0.1/32'],
    [{ mode: 'nftables', nodePortAddresses: ['127.0.0.0/8'] }, node4, true, '127.0.0.0/8 holds 127.0.0.1'],
    [{ mode: 'nftables', nodePortAddresses: ['127.0.0.2/32'] }, node4, false, 'a 127/8 address that is not 127.0.0.1 (kubernetes#142129)'],
    [{ mode: 'nftables', nodePortAddresses: ['all', 'localhost'] }, node4, false, 'all matches every address'],
    [{ mode: 'nftables', nodePortAddresses: ['0.0.0.0/0', 'localhost'] }, node4, false, 'a /0 matches every address'],
    [{ mode: 'nftables' }, node4, false, 'default (primary)'],
    [{ mode: 'nftables', nodePortAddresses: ['primary'] }, node4, false, 'primary alone'],
    [{ mode: 'nftables', nodePortAddresses: ['primary', 'localhost'] }, node6, true, 'IPv6 primary,localhost: ::1'],
    [{ mode: 'nftables', nodePortAddresses: ['fd00::/64', '::1/128'] }, node6, true, 'IPv6 CIDR ::1/128'],
    [{ mode: 'nftables', nodePortAddresses: ['fd00::/64', '127.0.0.1/32'] }, node6, false, 'IPv6 without ::1'],
    [{ mode: 'nftables', nodePortAddresses: ['127.0.0.1/32'] }, node6, false, 'IPv6 with no CIDR of its family matches all'],
    [{ mode: 'nftables', nodePortAddresses: ['primary', 'localhost'], featureGates: { KubeProxyNFTablesLocalhostNodePorts: false } }, node4, false, 'gate false'],
    [{ mode: 'nftables', nodePortAddresses: ['primary', 'localhost'], featureGates: { KubeProxyNFTablesLocalhostNodePorts: true } }, node4, true, 'gate true'],
    [{ mode: 'iptables', nodePortAddresses: ['primary', 'localhost'] }, node4, false, 'iptables (route_localnet instead)'],
    [{ mode: 'ipvs', nodePortAddresses: ['primary', 'localhost'] }, node4, false, 'ipvs'],
    [{ mode: 'userspace', nodePortAddresses: ['primary', 'localhost'] }, node4, false, 'userspace'],
  ];
  for (const [raw, n, want, why] of rows) assert.equal(optIn(raw, n), want, why);
});

test('the feature gate is known, and the config warning says what an explicit false does', () => {
  const warnings: string[] = [];
  resolveConfig({ mode: 'nftables', featureGates: { KubeProxyNFTablesLocalhostNodePorts: false, NFTablesProxyMode: true } }, {}, (w) => warnings.push(w));
  assert.ok(warnings.some((w) => /KubeProxyNFTablesLocalhostNodePorts=false turns off/.test(w)), warnings.join('\n'));
  assert.ok(warnings.some((w) => /NFTablesProxyMode ignored/.test(w)), warnings.join('\n'));
  assert.ok(!warnings.some((w) => /KubeProxyNFTablesLocalhostNodePorts.*ignored/.test(w)), warnings.join('\n'));
});

// ---- the listeners a view asks for ---------------------------------------------------------

const local = (ip: string): Endpoint => ({ ...endpoint(ip), isLocal: true, nodeName: NODE });
const np = (name: string, nodePort: number, o: Partial<ServicePort> = {}) => port('ns', name, 'p', { nodePort, ...o });

function viewFor(entries: Array<[ServicePort, Endpoint[]]>, raw: RawConfig = { mode: 'nftables', nodePortAddresses: ['primary', 'localhost'] }) {
  const input: PlanInput = { state: stateOf(entries), config: resolveConfig(raw), node: node4 };
  return buildNodeView(input);
}

test('listeners: TCP NodePorts with external endpoints; eTP Local keeps the node-local ones and none means no listener', () => {
  const view = viewFor([
    [np('cluster', 30001, { stickyMaxAgeSeconds: 600 }), [endpoint('10.180.1.1'), local('10.180.0.1')]],
    [np('udp', 30002, { protocol: 'UDP' }), [endpoint('10.180.1.2')]],
    [np('sctp', 30003, { protocol: 'SCTP' }), [endpoint('10.180.1.3')]],
    [np('empty', 30004), []],
    [np('local-remote-only', 30005, { externalPolicyLocal: true }), [endpoint('10.180.1.5')]],
    [np('local-mixed', 30006, { externalPolicyLocal: true }), [endpoint('10.180.1.6'), local('10.180.0.6')]],
    [port('ns', 'clusterip', 'p'), [endpoint('10.180.1.7')]],
  ]);
  const got = localhostNodePorts(view);
  assert.deepEqual(got.map((l) => [l.key, l.endpoints.map((e) => e.key).sort(), l.affinitySeconds]), [
    ['TCP/30001', ['10.180.0.1:8080', '10.180.1.1:8080'], 600],
    ['TCP/30006', ['10.180.0.6:8080'], 0],
  ]);
  // not opted in: nothing
  const off = viewFor([[np('cluster', 30001), [endpoint('10.180.1.1')]]], { mode: 'nftables', nodePortAddresses: ['primary'] });
  assert.deepEqual(localhostNodePorts(off), []);
});

// ---- the listener set on the real loopback --------------------------------------------------

/** A backend that writes its name and closes. */
async function backend(name: string): Promise<{ server: Server; port: number }> {
  const server = createServer((s) => s.end(name));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as { port: number }).port };
}

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const p = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return p;
}

/** What 127.0.0.1:port answers: the backend's name, or the error code. */
function ask(p: number): Promise<string> {
  return new Promise((resolve) => {
    const c = connect({ host: '127.0.0.1', port: p });
    let data = '';
    const timer = setTimeout(() => { c.destroy(); resolve('TIMEOUT'); }, 5000);
    c.on('data', (d) => (data += d));
    c.on('end', () => { clearTimeout(timer); resolve(data); });
    c.on('error', (e: NodeJS.ErrnoException) => { clearTimeout(timer); resolve(e.code ?? 'ERROR'); });
  });
}

const spec = (key: string, nodePort: number, ports: number[], affinitySeconds = 0): LocalhostNodePort => ({
  key, servicePortKey: `ns/${key}:p`, nodePort, affinitySeconds,
  endpoints: ports.map((p) => ({ key: `127.0.0.1:${p}`, ip: '127.0.0.1', port: p })),
});

test('listener set on 127.0.0.1: forwards, follows endpoint changes, pins with ClientIP affinity, survives a taken port, closes', async (t) => {
  const a = await backend('a');
  const b = await backend('b');
  const log = silentLogger();
  const warned: string[] = [];
  log.warn = ((o: { code?: string }) => void warned.push(o.code ?? '')) as never;
  const listeners = new LocalhostNodePortListeners({ config: resolveConfig({ mode: 'nftables' }), log, family: 4 });
  t.after(() => { listeners.stop(); a.server.close(); b.server.close(); });
  const p1 = await freePort();
  const taken = createServer();
  await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
  t.after(() => taken.close());
  const pTaken = (taken.address() as { port: number }).port;

  const c1 = await listeners.reconcile([spec('TCP/1', p1, [a.port]), spec('TCP/2', pTaken, [a.port])]);
  assert.deepEqual(c1.opened, ['TCP/1']);
  assert.deepEqual(c1.failed, ['TCP/2']);
  assert.equal(listeners.size, 1);
  assert.equal(listeners.creationFailures, 1);
  assert.equal(await ask(p1), 'a');
  assert.deepEqual(warned, ['KPROXY_LOCALHOST_NODEPORT_BIND']);
  // retried every sync, logged once while it keeps failing
  assert.deepEqual((await listeners.reconcile([spec('TCP/1', p1, [a.port]), spec('TCP/2', pTaken, [a.port])])).failed, ['TCP/2']);
  assert.equal(listeners.creationFailures, 2);
  assert.deepEqual(warned, ['KPROXY_LOCALHOST_NODEPORT_BIND']);

  // endpoints swap under the same listener
  await listeners.reconcile([spec('TCP/1', p1, [b.port])]);
  assert.equal(await ask(p1), 'b');

  // round robin over two endpoints reaches both; ClientIP affinity pins every loopback client to one
  await listeners.reconcile([spec('TCP/1', p1, [a.port, b.port])]);
  const seen = new Set<string>();
  for (let i = 0; i < 6; i++) seen.add(await ask(p1));
  assert.deepEqual([...seen].sort(), ['a', 'b']);
  await listeners.reconcile([spec('TCP/1', p1, [a.port, b.port], 10800)]);
  const pinned = new Set<string>();
  for (let i = 0; i < 6; i++) pinned.add(await ask(p1));
  assert.equal(pinned.size, 1, [...pinned].join(','));

  // gone from the view: the port is closed
  const c2 = await listeners.reconcile([]);
  assert.deepEqual(c2.closed, ['TCP/1']);
  assert.equal(listeners.size, 0);
  assert.equal(await ask(p1), 'ECONNREFUSED');
});

test('the wrapper syncs the ruleset first: a failed ruleset sync leaves the listeners as they were', async (t) => {
  let fail = false;
  const syncs: boolean[] = [];
  const inner: Proxier = {
    async sync(): Promise<SyncStats> {
      syncs.push(fail);
      if (fail) throw new Error('nft refused');
      return { rulesWritten: 1, rulesTotal: 1 };
    },
    dump: () => 'table ip kube-proxy {}\n',
    async stop() {},
  };
  const a = await backend('a');
  const nodePort = await freePort();
  const raw: RawConfig = { mode: 'nftables', nodePortAddresses: ['primary', 'localhost'] };
  const config = resolveConfig(raw);
  const p = new NftWithLocalhostNodePorts(inner, { config, log: silentLogger(), family: 4 });
  t.after(async () => { await p.stop(); a.server.close(); });
  const input = (eps: Endpoint[]): PlanInput => ({ state: stateOf([[np('svc', nodePort), eps]]), config, node: node4 });
  const be = { ...endpoint('127.0.0.1', a.port) };
  const s1 = await p.sync(input([be]), new Set(), true);
  assert.match(s1.diff ?? '', new RegExp(`\\+ localhost TCP/${nodePort}`));
  assert.equal(await ask(nodePort), 'a');
  assert.deepEqual(p.localhostNodePorts(), { listeners: 1, creationFailures: 0 });
  assert.match(p.dump(), new RegExp(`# 127\\.0\\.0\\.1:${nodePort} tcp -> 127\\.0\\.0\\.1:${a.port}`));
  fail = true;
  await assert.rejects(p.sync(input([]), new Set(), false), /nft refused/);
  assert.equal(await ask(nodePort), 'a', 'the listener stays while the ruleset failed');
  fail = false;
  await p.sync(input([]), new Set(), true);
  assert.equal(await ask(nodePort), 'ECONNREFUSED');
  assert.deepEqual(syncs, [false, true, false]);
});
