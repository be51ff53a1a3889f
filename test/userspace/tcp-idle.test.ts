// TcpForwarder's idle timeout is one coarse sweep per listener (not a timer per socket): a
// pair silent both ways is closed and counted, a pair with traffic in one direction only
// stays, and a timeout set on a running listener (a config change at sync) applies to the
// connections already open. Loopback only, ephemeral ports.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import { RoundRobinBalancer } from '../../src/modes/userspace/dataplane/balancer.ts';
import { newCounters } from '../../src/modes/userspace/dataplane/tcp.ts';
import { TCP_PATHS, tcpForwarder } from './helpers.ts';
import { waitFor } from '../support/wait.ts';
import { silentLogger } from '../../src/log.ts';

/** A backend that echoes what it reads and also writes 'tick' every 50 ms to sockets that asked ("T"). */
async function backend(): Promise<{ server: net.Server; port: number; timers: Set<NodeJS.Timeout> }> {
  const timers = new Set<NodeJS.Timeout>();
  const server = net.createServer((s) => {
    s.on('error', () => {});
    s.on('data', (d) => {
      if (String(d).includes('T')) {
        const t = setInterval(() => s.writable && s.write('tick'), 50);
        timers.add(t);
        s.once('close', () => {
          clearInterval(t);
          timers.delete(t);
        });
      } else s.write(d);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as net.AddressInfo).port, timers };
}

function connect(port: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const c = net.connect({ host: '127.0.0.1', port }, () => resolve(c));
    c.once('error', reject);
  });
}

for (const path of TCP_PATHS) test(`idle sweep (TCP on ${path}): silent pairs close and count, one-way traffic keeps a pair, a timeout set later applies to open pairs`, async () => {
  const be = await backend();
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  balancer.setEndpoints([{ key: `127.0.0.1:${be.port}`, ip: '127.0.0.1', port: be.port }]);
  const counters = newCounters();
  const fwd = tcpForwarder(path, { host: '127.0.0.1', port: 0, balancer, counters, log: silentLogger(), idleTimeoutMs: 0 });
  const port = await fwd.listen();
  const sockets: net.Socket[] = [];
  try {
    const silent = await connect(port);
    const oneWay = await connect(port);
    sockets.push(silent, oneWay);
    for (const s of sockets) s.on('error', () => {});
    // Both spliced: an echo comes back through each.
    for (const s of [silent, oneWay]) {
      const got = new Promise<string>((r) => s.once('data', (d) => r(String(d))));
      s.write('x');
      assert.equal(await got, 'x');
    }
    // The one-way pair: the backend writes every 50 ms, the client never writes again.
    oneWay.write('T');
    let silentClosed = false;
    let oneWayClosed = false;
    silent.on('close', () => (silentClosed = true));
    oneWay.on('close', () => (oneWayClosed = true));
    // No timeout yet: both live well past 300 ms.
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(silentClosed, false);
    assert.equal(counters.idleClosed, 0);
    // A timeout set on the running listener applies to the open pairs.
    fwd.idleTimeoutMs = 300;
    await waitFor('the silent pair to be closed', () => silentClosed, 10_000);
    assert.equal(counters.idleClosed, 1);
    // The one-way pair saw bytes all along: still open well after the timeout.
    await new Promise((r) => setTimeout(r, 800));
    assert.equal(oneWayClosed, false, 'traffic one way keeps the pair');
    assert.equal(counters.idleClosed, 1);
    await waitFor('one pair left active', () => counters.active === 1, 5000);
  } finally {
    for (const s of sockets) s.destroy();
    fwd.destroy();
    for (const t of be.timers) clearInterval(t);
    await new Promise((r) => be.server.close(r));
  }
});
