// The userspace mode's service semantics from the node view, as root inside network
// namespaces this test creates (all named with uniqueName, all removed after):
// loadBalancerSourceRanges enforced at accept for an allowed and a denied client against the
// LB IP (the NodePort stays open, as upstream), internalTrafficPolicy Local without local
// endpoints dropped (the client times out, no reset), externalTrafficPolicy Local without
// local endpoints short-circuited for the node and a pod but dropped for an outside client,
// and no listener on the wildcard address (ss -ltnp / -lunp).
//
//   A (203.0.113.7, in the ranges)  ──┐
//   D (198.51.100.7, outside them)  ──┤  N: the node (eth0 192.168.0.2), the proxy process,
//   P (pod 10.0.0.5, clusterCIDR)   ──┤     ip_forward on
//   E1 (10.180.1.2, local endpoint) ──┤
//   E2 (10.180.2.2, "remote" one)   ──┘
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { hostRunner, runChecked } from '../../src/kernel/runner.ts';
import { killChild, parseTcpReply, startBackendsInNetns, type NetnsBackends } from '../support/backends.ts';
import { uniqueName } from '../support/netns.ts';
import { slice, svc } from './helpers.ts';

const P = uniqueName('kus');
const NS = { node: `${P}-n`, a: `${P}-a`, d: `${P}-d`, pod: `${P}-p`, e1: `${P}-e1`, e2: `${P}-e2` };
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
  const links: [string, string, string, string, string][] = [
    // [peer ns, node-side dev, node-side cidr, peer dev, peer cidr]
    [NS.a, 'na', '203.0.113.1/25', 'an', '203.0.113.7/25'],
    [NS.d, 'nd', '198.51.100.1/24', 'dn', '198.51.100.7/24'],
    [NS.pod, 'np', '10.0.0.1/24', 'pn', '10.0.0.5/24'],
    [NS.e1, 'ne1', '10.180.1.1/24', 'e1n', '10.180.1.2/24'],
    [NS.e2, 'ne2', '10.180.2.1/24', 'e2n', '10.180.2.2/24'],
  ];
  for (const [peer, nDev, nCidr, pDev, pCidr] of links) {
    await ip('-n', NS.node, 'link', 'add', nDev, 'type', 'veth', 'peer', 'name', pDev, 'netns', peer);
    await ip('-n', NS.node, 'addr', 'add', nCidr, 'dev', nDev);
    await ip('-n', NS.node, 'link', 'set', nDev, 'up');
    await ip('-n', peer, 'addr', 'add', pCidr, 'dev', pDev);
    await ip('-n', peer, 'link', 'set', pDev, 'up');
    await ip('-n', peer, 'route', 'add', 'default', 'via', nCidr.split('/')[0]);
  }
  // The node's own address and a default route (a veth pair with both ends in the node).
  await ip('-n', NS.node, 'link', 'add', 'eth0', 'type', 'veth', 'peer', 'name', 'eth0p');
  await ip('-n', NS.node, 'addr', 'add', '192.168.0.2/24', 'dev', 'eth0');
  await ip('-n', NS.node, 'link', 'set', 'eth0p', 'up');
  await ip('-n', NS.node, 'link', 'set', 'eth0', 'up');
  await ip('-n', NS.node, 'route', 'add', 'default', 'via', '192.168.0.1', 'dev', 'eth0');
  // A forwarding node: a packet to a VIP that is not DNATed would be routed on, so only the
  // filter DROP (not the absence of forwarding) can explain a timeout.
  const fwd = await inNs(NS.node, 'sysctl', ['-w', 'net.ipv4.ip_forward=1']);
  assert.equal(fwd.code, 0, fwd.stderr);
}

async function teardownTopology(): Promise<void> {
  for (const ns of Object.values(NS)) await hostRunner.run('ip', ['netns', 'del', ns], { timeoutMs: 10_000 });
}

/** The proxy fixture in the node namespace, driven by JSON lines. */
class ProxyProcess {
  private readonly child: ChildProcess;
  private readonly waiting: ((o: Record<string, unknown>) => void)[] = [];
  private stderr = '';

  constructor(config: Record<string, unknown>) {
    this.child = spawn('ip', ['netns', 'exec', NS.node, process.execPath, '--import', 'tsx', FIXTURE, JSON.stringify(config)], {
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

  get pid(): number | undefined {
    return this.child.pid;
  }

  close(): Promise<void> {
    return killChild(this.child);
  }
}

const REMOTE = 'node-b';
const OBJECTS = [
  svc('fw', {
    type: 'LoadBalancer',
    clusterIP: '172.30.0.20',
    lbIPs: ['1.2.3.4'],
    ports: [{ name: 'http', port: 80, nodePort: 30100 }, { name: 'dns', port: 53, protocol: 'UDP', nodePort: 30153 }],
    sourceRanges: ['203.0.113.0/25'],
  }),
  slice('fw', [{ ip: '10.180.1.2' }], [{ name: 'http', port: 8080 }, { name: 'dns', port: 5353, protocol: 'UDP' }]),
  svc('itp', { clusterIP: '172.30.0.21', ports: [{ port: 80 }], internalTrafficPolicy: 'Local' }),
  slice('itp', [{ ip: '10.180.2.2', node: REMOTE }], [{ port: 8080 }]),
  svc('etp', { type: 'LoadBalancer', clusterIP: '172.30.0.22', lbIPs: ['1.2.3.5'], ports: [{ port: 80, nodePort: 30101 }], externalTrafficPolicy: 'Local' }),
  slice('etp', [{ ip: '10.180.2.2', node: REMOTE }], [{ port: 8080 }]),
];

interface Attempt {
  code: number;
  stdout: string;
  stderr: string;
}

/** One TCP exchange with socat from `ns`: a 3 s connect timeout, the reply read to its end. */
async function tcpTry(ns: string, host: string, port: number, payload: string): Promise<Attempt> {
  const r = await inNs(ns, 'socat', ['-t', '3', '-T', '5', '-', `TCP:${host}:${port},connect-timeout=3`], payload, 15_000);
  return { code: r.code, stdout: r.stdout, stderr: r.stderr };
}

async function tcpVia(ns: string, host: string, port: number, payload: string) {
  const r = await tcpTry(ns, host, port, payload);
  assert.equal(r.code, 0, `socat tcp ${host}:${port} from ${ns}: ${r.stderr}`);
  return parseTcpReply(Buffer.from(r.stdout, 'latin1'));
}

async function udpTry(ns: string, host: string, port: number, payload: string): Promise<Attempt> {
  const r = await inNs(ns, 'socat', ['-t', '1.5', '-T', '3', '-', `UDP:${host}:${port}`], payload, 10_000);
  return { code: r.code, stdout: r.stdout, stderr: r.stderr };
}

/** Packets counted by the filter DROP whose comment contains `what`. */
async function dropCount(what: string): Promise<number> {
  const r = await inNs(NS.node, 'iptables', ['-w', '-t', 'filter', '-L', 'KPROXY-USERSPACE-FILTER', '-n', '-v', '-x']);
  assert.equal(r.code, 0, r.stderr);
  const line = r.stdout.split('\n').find((l) => l.includes(what));
  assert.ok(line, `no DROP rule for ${what} in:\n${r.stdout}`);
  return Number(line.trim().split(/\s+/)[0]);
}

describe('userspace semantics from the node view, in network namespaces', () => {
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
      startBackendsInNetns(NS.e2, [{ proto: 'tcp', host: '10.180.2.2', port: 8080, id: 'e2' }]),
    ]);
    backends.push(b1, b2);
    proxy = new ProxyProcess({ clusterCIDR: '10.0.0.0/8', udpIdleTimeout: '2s' });
    const ready = await proxy.next();
    assert.equal(ready.ready, true, String(ready.error));
    assert.equal(ready.redirect, true, 'as root with iptables the proxier programs rules');
    await proxy.request({ op: 'sync', objects: OBJECTS, nodeIPs: ['192.168.0.2'], full: true });
  });

  after(async () => {
    await proxy?.close();
    for (const b of backends) await b.close();
    await teardownTopology();
  });

  test('loadBalancerSourceRanges: a client inside the ranges reaches the LB IP, one outside is refused without reaching the endpoint', async () => {
    const ok = await tcpVia(NS.a, '1.2.3.4', 80, 'allowed');
    assert.equal(ok.id, 'e1');
    assert.equal(ok.rest.toString(), 'allowed');
    const before = (await backends[0].connections()).e1 ?? 0;
    for (let i = 0; i < 2; i++) {
      const denied = await tcpTry(NS.d, '1.2.3.4', 80, 'denied');
      assert.doesNotMatch(denied.stdout, /e1/, 'a denied client gets no byte from the endpoint');
    }
    assert.equal((await backends[0].connections()).e1 ?? 0, before, 'the endpoint was never contacted for the denied client');
    const c = (await proxy!.request({ op: 'counters' })).counters as { servicePort: string; protocol: string; denied: number }[];
    const http = c.find((x) => x.servicePort === 'ns/fw:http' && x.protocol === 'TCP');
    assert.ok(http && http.denied >= 2, JSON.stringify(c));
  });

  test('loadBalancerSourceRanges, UDP: the denied client\'s datagrams are dropped, the allowed one answered', async () => {
    const ok = await udpTry(NS.a, '1.2.3.4', 53, 'ping');
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal(ok.stdout, 'e1u:ping');
    const denied = await udpTry(NS.d, '1.2.3.4', 53, 'ping');
    assert.equal(denied.stdout, '', 'no reply for a denied client');
  });

  test('the NodePort of a firewalled service is not firewalled (as upstream)', async () => {
    assert.equal((await tcpVia(NS.d, '192.168.0.2', 30100, 'np')).id, 'e1');
  });

  test('internalTrafficPolicy Local without local endpoints: the client times out (DROP), it is not reset', async () => {
    const dropsBefore = await dropCount('ns/itp: cluster IP has no local endpoints');
    const started = Date.now();
    const r = await tcpTry(NS.a, '172.30.0.21', 80, 'x');
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /timed out/i, `a timeout, not a refusal or reset: ${r.stderr}`);
    assert.doesNotMatch(r.stderr, /refused|reset/i);
    assert.ok(Date.now() - started >= 2500, 'socat waited for its connect timeout');
    assert.ok((await dropCount('ns/itp: cluster IP has no local endpoints')) > dropsBefore, 'the filter DROP took the SYNs');
    assert.equal((await backends[1].connections()).e2 ?? 0, 0, 'the remote endpoint was never used');
  });

  test('externalTrafficPolicy Local without local endpoints: the node and a pod are short-circuited to the cluster endpoints, an outside client dropped', async () => {
    assert.equal((await tcpVia(NS.node, '1.2.3.5', 80, 'node')).id, 'e2', 'from the node itself');
    assert.equal((await tcpVia(NS.pod, '1.2.3.5', 80, 'pod')).id, 'e2', 'from a pod (clusterCIDR)');
    assert.equal((await tcpVia(NS.pod, '192.168.0.2', 30101, 'pod')).id, 'e2', 'a pod to the NodePort');
    const r = await tcpTry(NS.a, '1.2.3.5', 80, 'x');
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /timed out/i, `an outside client times out: ${r.stderr}`);
    const np = await tcpTry(NS.d, '192.168.0.2', 30101, 'x');
    assert.match(np.stderr, /timed out/i, `the NodePort from outside times out: ${np.stderr}`);
  });

  test('no listener of the proxy is bound to 0.0.0.0 or ::', async () => {
    for (const flags of ['-ltnp', '-lunp']) {
      const r = await inNs(NS.node, 'ss', ['-H', flags]);
      assert.equal(r.code, 0, r.stderr);
      const ours = r.stdout.split('\n').filter((l) => l.trim());
      assert.ok(ours.length > 0, `ss ${flags} lists the proxy's sockets`);
      for (const l of ours) {
        const local = l.trim().split(/\s+/)[3];
        assert.doesNotMatch(local, /^(0\.0\.0\.0|\*|\[::\]|::):/, `bound to the wildcard: ${l}`);
        assert.match(local, /^192\.168\.0\.2:\d+$/, `proxy ports listen on the node IP: ${l}`);
      }
    }
  });

  test('cleanup removes the nat and filter chains and every jump', async () => {
    await proxy!.request({ op: 'cleanup' });
    const r = await inNs(NS.node, 'iptables-save', []);
    assert.equal(r.code, 0, r.stderr);
    assert.doesNotMatch(r.stdout, /KPROXY-USERSPACE/);
  });
});
