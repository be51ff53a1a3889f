// The userspace proxy as root inside network namespaces this test creates: the ClusterIP
// 172.30.0.10 is not a local address, so kproxy listens on proxy ports and steers traffic to
// them with iptables REDIRECT (KPROXY-USERSPACE-PORTALS from PREROUTING and OUTPUT,
// KPROXY-USERSPACE-NODEPORTS). Clients: another namespace over a veth, and the node itself.
//
//   kpt-us-<pid>-c (client 10.0.1.2) ──veth── kpt-us-<pid>-n (node: 10.0.1.1, eth0 192.168.0.2,
//                                                               the proxy process)
//                     kpt-us-<pid>-e1 (pod 10.180.1.2) ──veth──┤ 10.180.1.1
//                     kpt-us-<pid>-e2 (pod 10.180.2.2) ──veth──┘ 10.180.2.1
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { killChild, parseTcpReply, startBackendsInNetns, type NetnsBackends } from '../support/backends.ts';
import { slice, svc } from './helpers.ts';

const P = `kpt-us-${process.pid}`;
const NS = { node: `${P}-n`, client: `${P}-c`, e1: `${P}-e1`, e2: `${P}-e2` };
const REPO = fileURLToPath(new URL('../../', import.meta.url));
const FIXTURE = fileURLToPath(new URL('./fixtures/proxy-main.ts', import.meta.url));

const ip = (...args: string[]) => runChecked(hostRunner, 'ip', args, { timeoutMs: 10_000 });
const inNs = (ns: string, cmd: string, args: string[], input?: string, timeoutMs = 10_000) =>
  hostRunner.run('ip', ['netns', 'exec', ns, cmd, ...args], { input, timeoutMs });

async function setupTopology(): Promise<void> {
  for (const ns of Object.values(NS)) {
    await ip('netns', 'add', ns);
    await ip('-n', ns, 'link', 'set', 'lo', 'up');
  }
  // Links are created inside the node namespace, so nothing appears in the root namespace.
  await ip('-n', NS.node, 'link', 'add', 'nc', 'type', 'veth', 'peer', 'name', 'cn', 'netns', NS.client);
  await ip('-n', NS.node, 'link', 'add', 'ne1', 'type', 'veth', 'peer', 'name', 'e1n', 'netns', NS.e1);
  await ip('-n', NS.node, 'link', 'add', 'ne2', 'type', 'veth', 'peer', 'name', 'e2n', 'netns', NS.e2);
  const addrs: [string, string, string][] = [
    [NS.node, 'nc', '10.0.1.1/24'],
    [NS.client, 'cn', '10.0.1.2/24'],
    [NS.node, 'ne1', '10.180.1.1/24'],
    [NS.e1, 'e1n', '10.180.1.2/24'],
    [NS.node, 'ne2', '10.180.2.1/24'],
    [NS.e2, 'e2n', '10.180.2.2/24'],
  ];
  for (const [ns, dev, cidr] of addrs) {
    await ip('-n', ns, 'addr', 'add', cidr, 'dev', dev);
    await ip('-n', ns, 'link', 'set', dev, 'up');
  }
  await ip('-n', NS.client, 'route', 'add', 'default', 'via', '10.0.1.1');
  await ip('-n', NS.e1, 'route', 'add', 'default', 'via', '10.180.1.1');
  await ip('-n', NS.e2, 'route', 'add', 'default', 'via', '10.180.2.1');
  // The node's "real" interface and a default route, as on a node: without a route the
  // node's own connect() to a ClusterIP fails before OUTPUT's REDIRECT sees it.
  // (a veth pair with both ends in the node namespace: no dummy module needed).
  await ip('-n', NS.node, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0p');
  await ip('-n', NS.node, 'addr', 'add', '192.168.0.2/24', 'dev', 'eth0');
  await ip('-n', NS.node, 'link', 'set', 'eth0p', 'up');
  await ip('-n', NS.node, 'link', 'set', 'eth0', 'up');
  await ip('-n', NS.node, 'route', 'add', 'default', 'via', '192.168.0.1', 'dev', 'eth0');
}

async function teardownTopology(): Promise<void> {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
}

/** The proxy fixture in the node namespace, driven by JSON lines. */
class ProxyProcess {
  private readonly child: ChildProcess;
  private readonly waiting: ((o: Record<string, unknown>) => void)[] = [];
  private stderr = '';

  constructor() {
    this.child = spawn('ip', ['netns', 'exec', NS.node, process.execPath, '--import', 'tsx', FIXTURE, JSON.stringify({ udpIdleTimeout: '2s' })], {
      cwd: REPO,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    this.child.stderr!.on('data', (d: Buffer) => {
      this.stderr = (this.stderr + d.toString()).slice(-5000);
    });
    createInterface({ input: this.child.stdout! }).on('line', (l) => this.waiting.shift()?.(JSON.parse(l) as Record<string, unknown>));
  }

  next(timeoutMs = 20_000): Promise<Record<string, unknown>> {
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`proxy fixture: no answer after ${timeoutMs}ms; stderr: ${this.stderr}`)), timeoutMs);
      this.waiting.push((o) => {
        clearTimeout(t);
        resolve(o);
      });
    });
  }

  async request(req: Record<string, unknown>): Promise<Record<string, unknown>> {
    const p = this.next();
    this.child.stdin!.write(JSON.stringify(req) + '\n');
    const r = await p;
    assert.equal(r.ok, true, `fixture ${String(req.op)} failed: ${String(r.error)}`);
    return r;
  }

  close(): Promise<void> {
    return killChild(this.child);
  }
}

const OBJECTS = [
  svc('web', {
    type: 'NodePort',
    clusterIP: '172.30.0.10',
    ports: [
      { name: 'http', port: 80, nodePort: 30080 },
      { name: 'dns', port: 53, protocol: 'UDP', nodePort: 30053 },
    ],
  }),
  slice('web', [{ ip: '10.180.1.2' }, { ip: '10.180.2.2' }], [
    { name: 'http', port: 8080 },
    { name: 'dns', port: 5353, protocol: 'UDP' },
  ]),
];

async function tcpVia(ns: string, host: string, port: number, payload: string) {
  const r = await inNs(ns, 'socat', ['-t', '3', '-T', '5', '-', `TCP:${host}:${port},connect-timeout=3`], payload, 10_000);
  assert.equal(r.code, 0, `socat tcp ${host}:${port} from ${ns}: ${r.stderr}`);
  return parseTcpReply(Buffer.from(r.stdout, 'latin1'));
}

async function udpVia(ns: string, host: string, port: number, payload: string): Promise<string> {
  // A connected UDP socket: socat only accepts the reply if it comes from host:port.
  const r = await inNs(ns, 'socat', ['-t', '1.5', '-T', '3', '-', `UDP:${host}:${port}`], payload, 10_000);
  assert.equal(r.code, 0, `socat udp ${host}:${port} from ${ns}: ${r.stderr}`);
  return r.stdout;
}

async function natRules(): Promise<string> {
  const r = await inNs(NS.node, 'iptables-save', ['-t', 'nat']);
  assert.equal(r.code, 0, r.stderr);
  return r.stdout;
}

describe('userspace proxy with iptables REDIRECT in network namespaces', () => {
  let proxy: ProxyProcess | undefined;
  const backends: NetnsBackends[] = [];

  before(async () => {
    assert.equal(process.getuid?.(), 0, 'this kernel test needs root');
    await setupTopology();
    const [b1, b2] = await Promise.all([
      startBackendsInNetns(NS.e1, [
        { proto: 'tcp', host: '10.180.1.2', port: 8080, id: 'e1' },
        { proto: 'udp', host: '10.180.1.2', port: 5353, id: 'e1u' },
      ]),
      startBackendsInNetns(NS.e2, [
        { proto: 'tcp', host: '10.180.2.2', port: 8080, id: 'e2' },
        { proto: 'udp', host: '10.180.2.2', port: 5353, id: 'e2u' },
      ]),
    ]);
    backends.push(b1, b2);
    proxy = new ProxyProcess();
    const ready = await proxy.next();
    assert.equal(ready.ready, true, String(ready.error));
    assert.equal(ready.redirect, true, 'as root with iptables the proxier uses REDIRECT');
    await proxy.request({ op: 'sync', objects: OBJECTS, nodeIPs: ['192.168.0.2'], full: true });
  });

  after(async () => {
    await proxy?.close();
    for (const b of backends) await b.close();
    await teardownTopology();
  });

  test('the chains are installed (DNAT to the node IP), jumped from PREROUTING and OUTPUT', async () => {
    const rules = await natRules();
    assert.match(rules, /^:KPROXY-USERSPACE-PORTALS /m);
    assert.match(rules, /^:KPROXY-USERSPACE-NODEPORTS /m);
    assert.match(rules, /^-A PREROUTING .*-j KPROXY-USERSPACE-PORTALS$/m);
    assert.match(rules, /^-A OUTPUT .*-j KPROXY-USERSPACE-PORTALS$/m);
    assert.match(rules, /^-A KPROXY-USERSPACE-PORTALS .*-d 172\.30\.0\.10\/32 -p tcp .*--dport 80 -j DNAT --to-destination 192\.168\.0\.2:\d+$/m);
    assert.match(rules, /^-A KPROXY-USERSPACE-NODEPORTS .*-p tcp .*--dport 30080 -j DNAT --to-destination 192\.168\.0\.2:\d+$/m);
  });

  test('TCP from another namespace over veth reaches both backends, round robin', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const r = await tcpVia(NS.client, '172.30.0.10', 80, `hi${i}`);
      assert.equal(r.rest.toString(), `hi${i}`);
      assert.equal(r.bye, `bye ${r.id} 3`, 'half-close through the REDIRECT');
      ids.push(r.id);
    }
    assert.deepEqual(ids.sort(), ['e1', 'e1', 'e2', 'e2']);
  });

  test('TCP from the node namespace itself (OUTPUT) reaches the backends', async () => {
    const ids = new Set<string>();
    for (let i = 0; i < 4; i++) ids.add((await tcpVia(NS.node, '172.30.0.10', 80, 'local')).id);
    assert.deepEqual([...ids].sort(), ['e1', 'e2']);
  });

  test('UDP from another namespace and from the node: replies come back from the ClusterIP', async () => {
    const seen = new Set<string>();
    for (let i = 0; i < 2; i++) seen.add((await udpVia(NS.client, '172.30.0.10', 53, 'ping')).split(':')[0]);
    for (let i = 0; i < 2; i++) seen.add((await udpVia(NS.node, '172.30.0.10', 53, 'ping')).split(':')[0]);
    assert.deepEqual([...seen].sort(), ['e1u', 'e2u']);
  });

  test('NodePort: from another namespace to the node address, and from the node to localhost', async () => {
    assert.match((await tcpVia(NS.client, '192.168.0.2', 30080, 'np')).id, /^e[12]$/);
    assert.match((await tcpVia(NS.client, '10.0.1.1', 30080, 'np')).id, /^e[12]$/);
    assert.match((await tcpVia(NS.node, '127.0.0.1', 30080, 'np')).id, /^e[12]$/);
    assert.match(await udpVia(NS.client, '192.168.0.2', 30053, 'np'), /^e[12]u:np$/);
  });

  test('counters count accepted connections per service port', async () => {
    const r = await proxy!.request({ op: 'counters' });
    const http = (r.counters as { servicePort: string; accepted: number; failed: number }[]).find((c) => c.servicePort === 'ns/web:http');
    assert.ok(http && http.accepted >= 11, JSON.stringify(r.counters));
    assert.equal(http.failed, 0);
  });

  test('cleanup removes the chains and jumps; a full sync restores them; an empty state removes them', async () => {
    await proxy!.request({ op: 'cleanup' });
    assert.doesNotMatch(await natRules(), /KPROXY-USERSPACE/);
    await proxy!.request({ op: 'cleanup' }); // idempotent on a clean table
    await proxy!.request({ op: 'sync', objects: OBJECTS, nodeIPs: ['192.168.0.2'], full: true });
    assert.match(await natRules(), /^-A OUTPUT .*-j KPROXY-USERSPACE-PORTALS$/m);
    assert.match((await tcpVia(NS.client, '172.30.0.10', 80, 'back')).id, /^e[12]$/);
    await proxy!.request({ op: 'sync', objects: [], nodeIPs: ['192.168.0.2'], full: false });
    assert.doesNotMatch(await natRules(), /KPROXY-USERSPACE/);
  });
});
