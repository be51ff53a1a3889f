// The userspace data plane's bounds, on real sockets over 127.0.0.0/8: userspace.maxConnections
// (the connection beyond the cap is closed at once and counted, the proxy keeps serving, fds
// return to baseline), userspace.idleTimeout (a silent connection is closed, a chatty one is
// not), and the UDP session bounds (per client, and fairness when the total is full).
import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import net from 'node:net';
import { parseConfigText, resolveConfig } from '../../src/config/config.ts';
import { RoundRobinBalancer } from '../../src/modes/userspace/dataplane/balancer.ts';
import { effectiveMaxConnections, fdLimit, processBudgets } from '../../src/modes/userspace/dataplane/limits.ts';
import { UserspaceProxier } from '../../src/modes/userspace/proxier.ts';
import { newBudget, newCounters } from '../../src/modes/userspace/dataplane/tcp.ts';
import { UdpForwarder, UdpSessionBudget } from '../../src/modes/userspace/dataplane/udp.ts';
import { silentLogger } from '../../src/log.ts';
import { startTcpBackend, startUdpBackend, tcpExchange } from '../support/backends.ts';
import { TCP_PATHS, firstLine, openFds, planInput, refusingRunner, slice, svc, testConfig } from './helpers.ts';
import { sleep, waitFor } from '../support/wait.ts';

const BP = 20000 + ((process.pid + 13) % 20000);
const VIP = '127.0.24.10';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function proxyTo(userspace: Record<string, unknown>): Promise<UserspaceProxier> {
  const backend = await startTcpBackend('127.0.24.1', BP, 'b1');
  cleanups.push(() => backend.close());
  const config = testConfig({ userspace: { tcpPath: 'raw', ...userspace } });
  const p = new UserspaceProxier({
    config, log: silentLogger(), runner: refusingRunner, redirect: false, localAddresses: () => [],
    // A budget of this test's own, so other tests' connections in this process do not count.
    budgets: { tcp: newBudget(effectiveMaxConnections(config.userspace.maxConnections, fdLimit())), udp: new UdpSessionBudget(8192, 1024) },
  });
  cleanups.push(() => p.stop());
  await p.sync(planInput([svc('web', { clusterIP: VIP, ports: [{ port: 80 }] }), slice('web', [{ ip: '127.0.24.1' }], [{ port: BP }])]), new Set(), true);
  return p;
}

for (const tcpPath of TCP_PATHS) test(`maxConnections (TCP on ${tcpPath}): the connection beyond the cap is closed at once and counted; the proxy keeps serving; fds return to baseline`, async () => {
  const p = await proxyTo({ maxConnections: 3, tcpPath });
  const baseline = openFds();
  const held: net.Socket[] = [];
  for (let i = 0; i < 3; i++) {
    const s = net.connect({ host: VIP, port: 80 });
    held.push(s);
    assert.equal(await firstLine(s), 'b1');
  }
  const beyond = net.connect({ host: VIP, port: 80 });
  const t0 = Date.now();
  assert.match(await firstLine(beyond), /^(closed |error )/);
  assert.ok(Date.now() - t0 < 5000, 'refused at once, not left to time out');
  const c = () => p.counters().find((x) => x.servicePort.startsWith('ns/web'))!;
  assert.equal(c().refused, 1);
  assert.equal(c().accepted, 3);
  assert.equal(c().active, 3);

  // Room again once one closes.
  held.pop()!.destroy();
  await waitFor('the closed connection released', () => c().active === 2, 5000);
  const again = await tcpExchange(VIP, 80, 'hi');
  assert.equal(again.id, 'b1');

  for (const s of held) s.destroy();
  await waitFor('every connection closed', () => c().active === 0, 5000);
  // Client sockets of this process were counted in the baseline's absence: back to it, or below.
  await waitFor(`fds back to baseline ${baseline} (now ${openFds()})`, () => openFds() <= baseline, 5000);
});

for (const tcpPath of TCP_PATHS) test(`idleTimeout (TCP on ${tcpPath}) closes a connection silent both ways and counts it; a connection with traffic stays`, async () => {
  const p = await proxyTo({ idleTimeout: '400ms', tcpPath });
  const idle = net.connect({ host: VIP, port: 80 });
  assert.equal(await firstLine(idle), 'b1');
  const busy = net.connect({ host: VIP, port: 80 });
  assert.equal(await firstLine(busy), 'b1');
  let busyClosed = false;
  busy.on('close', () => (busyClosed = true));
  let idleClosed = false;
  idle.on('close', () => (idleClosed = true));
  const t0 = Date.now();
  // The busy client sends a byte every 100ms (echoed back) for 1.5 s: never idle 400ms.
  for (let i = 0; i < 15 && !busyClosed; i++) {
    busy.write('.');
    await sleep(100);
  }
  await waitFor('the idle connection closed', () => idleClosed, 10_000);
  assert.ok(Date.now() - t0 >= 300, 'not before its timeout');
  assert.equal(busyClosed, false, 'the connection with traffic stays open');
  const c = p.counters().find((x) => x.servicePort.startsWith('ns/web'))!;
  assert.equal(c.idleClosed, 1);
  busy.destroy();
});

test('config: userspace block defaults, flags over the file, and bad values refused naming the field', () => {
  const d = resolveConfig({ mode: 'userspace' }).userspace;
  assert.deepEqual(d, { workers: 1, maxConnections: 0, idleTimeoutMs: 24 * 3600_000, udpMaxSessions: 8192, udpMaxSessionsPerClient: 1024, tcpPath: 'auto' });
  const f = resolveConfig({ mode: 'userspace', userspace: { workers: 2, maxConnections: 10, idleTimeout: '1m' } }, { userspaceWorkers: '4', userspaceIdleTimeout: '0s' }).userspace;
  assert.equal(f.workers, 4);
  assert.equal(f.maxConnections, 10);
  assert.equal(f.idleTimeoutMs, 0);
  assert.throws(() => resolveConfig({ userspace: { workers: 0 } }), /KPROXY_CONFIG_INVALID: userspace\.workers: want an integer from 1 to 64/);
  assert.throws(() => resolveConfig({ userspace: { udpMaxSessions: 10, udpMaxSessionsPerClient: 20 } }), /userspace\.udpMaxSessionsPerClient/);
  assert.throws(() => resolveConfig({}, { userspaceMaxConnections: 'lots' }), /userspace\.maxConnections/);
  assert.equal(resolveConfig({ userspace: { tcpPath: 'net' } }).userspace.tcpPath, 'net');
  assert.throws(() => resolveConfig({ userspace: { tcpPath: 'fast' } }), /KPROXY_CONFIG_INVALID: userspace\.tcpPath: want auto, net or raw/);
  // an unknown field is a warning naming its path, as kube-proxy's lenient decoding
  const warnings: string[] = [];
  resolveConfig(parseConfigText('apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: userspace\nuserspace:\n  bogus: 1\n'), {}, (w) => warnings.push(w));
  assert.ok(warnings.some((w) => /^userspace\.bogus: unknown field/.test(w)), warnings.join('\n'));
  assert.throws(() => resolveConfig(parseConfigText('apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nuserspace:\n  workers: "x"\n')), /KPROXY_CONFIG_INVALID: userspace\.workers: want an integer/);
  const fromFile = resolveConfig(parseConfigText('apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nuserspace:\n  workers: 3\n  udpMaxSessionsPerClient: 8\n'));
  assert.equal(fromFile.userspace.workers, 3);
  assert.equal(fromFile.userspace.udpMaxSessionsPerClient, 8);
});

test('automatic maxConnections: half of what the fd limit leaves after a reserve', () => {
  assert.equal(fdLimit('Max open files            1024                 4096                 files\n'), 1024);
  assert.equal(fdLimit('Max open files            unlimited            unlimited            files\n'), Number.MAX_SAFE_INTEGER);
  assert.equal(effectiveMaxConnections(0, 20_000), (20_000 - 512) / 2);
  assert.equal(effectiveMaxConnections(0, 600), 64);
  assert.equal(effectiveMaxConnections(1000, 20_000), 1000, 'an explicit cap is node-wide: the workers share it (worker-cap.ts)');
  const b = processBudgets(resolveConfig({ mode: 'userspace' }).userspace);
  assert.ok(b.tcp.max > 0, 'this process has a finite fd limit, so a finite cap');
});

test('UDP: one client cannot take every session; beyond its bound it is refused, others still get sessions', async () => {
  const backend = await startUdpBackend('127.0.24.1', 0, 'u1');
  cleanups.push(() => backend.close());
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  balancer.setEndpoints([{ key: `127.0.24.1:${backend.port}`, ip: '127.0.24.1', port: backend.port }]);
  const counters = newCounters();
  const budget = new UdpSessionBudget(6, 4);
  const fwd = new UdpForwarder({ hosts: [VIP], port: 0, balancer, counters, log: silentLogger(), idleMs: 10_000, budget });
  const port = await fwd.listen();
  cleanups.push(() => fwd.destroy());

  const replies = new Map<string, number>();
  async function clientSocket(ip: string): Promise<dgram.Socket> {
    const s = dgram.createSocket('udp4');
    await new Promise<void>((r) => s.bind({ address: ip, port: 0 }, () => r()));
    s.on('message', () => replies.set(ip, (replies.get(ip) ?? 0) + 1));
    cleanups.push(() => void s.close());
    return s;
  }
  // The flooder: 6 source ports, i.e. 6 sessions wanted; at most 4 are granted.
  const flood = await Promise.all(Array.from({ length: 6 }, () => clientSocket('127.0.24.100')));
  for (const s of flood) s.send('x', port, VIP);
  await waitFor('the flood handled', () => counters.accepted + counters.refused === 6, 5000);
  assert.equal(budget.sessionsOf('127.0.24.100'), 4);
  assert.equal(counters.refused, 2);
  await waitFor('the 4 granted sessions answered', () => replies.get('127.0.24.100') === 4, 5000);

  // Two more clients: the total (6) fills up; the third newcomer takes a session from the
  // biggest holder instead of being refused.
  for (const ip of ['127.0.24.101', '127.0.24.102', '127.0.24.103']) (await clientSocket(ip)).send('y', port, VIP);
  await waitFor('every other client answered', () => ['127.0.24.101', '127.0.24.102', '127.0.24.103'].every((ip) => replies.get(ip) === 1), 5000);
  assert.equal(budget.total, 6);
  assert.equal(budget.sessionsOf('127.0.24.100'), 3, 'the flooder gave up its oldest session');
  assert.equal(fwd.sessionCount, 6);
});
