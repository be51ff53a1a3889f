// The admission hook of the TCP and UDP forwarders: called once per new connection/session
// with the client's plain address; a refused client is counted in `denied` and never reaches
// an endpoint, an admitted one is forwarded as usual.
import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import net from 'node:net';
import { RoundRobinBalancer } from '../../src/modes/userspace/dataplane/balancer.ts';
import { newCounters } from '../../src/modes/userspace/dataplane/tcp.ts';
import { UdpForwarder } from '../../src/modes/userspace/dataplane/udp.ts';
import { silentLogger } from '../../src/log.ts';
import { startTcpBackend, startUdpBackend, tcpExchange, udpExchange } from '../support/backends.ts';
import { TCP_PATHS, tcpForwarder } from './helpers.ts';
import { waitFor } from '../support/wait.ts';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function balancerTo(ip: string, port: number): RoundRobinBalancer {
  const b = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  b.setEndpoints([{ key: `${ip}:${port}`, ip, port }]);
  return b;
}

for (const path of TCP_PATHS) test(`TCP on ${path}: the admit hook sees each client once and a refused client never reaches the endpoint`, async () => {
  const backend = await startTcpBackend('127.0.21.1', 0, 'b1');
  cleanups.push(() => backend.close());
  const seen: string[] = [];
  const counters = newCounters();
  const fwd = tcpForwarder(path, {
    host: '127.0.21.10', port: 0, balancer: balancerTo('127.0.21.1', backend.port), counters, log: silentLogger(),
    admit: (ip, port) => {
      seen.push(`${ip}:${port > 0}`);
      return ip === '127.0.21.100';
    },
  });
  const port = await fwd.listen();
  cleanups.push(() => fwd.destroy());

  const ok = await tcpExchange('127.0.21.10', port, 'hello', { localAddress: '127.0.21.100' });
  assert.equal(ok.id, 'b1');
  assert.equal(ok.bye, 'bye b1 5');

  const refused = await new Promise<string>((resolve) => {
    const s = net.connect({ host: '127.0.21.10', port, localAddress: '127.0.21.101' });
    let got = '';
    s.on('data', (d) => (got += d.toString()));
    s.on('error', () => resolve(`error ${got}`));
    s.on('close', () => resolve(`closed ${got}`));
  });
  assert.match(refused, /^(closed|error) $/, 'a refused client gets no byte from a backend');
  await waitFor('denied counted', () => counters.denied === 1, 5000);
  assert.deepEqual(seen, ['127.0.21.100:true', '127.0.21.101:true']);
  assert.equal(backend.connections, 1);
  assert.equal(counters.accepted, 1);
  assert.equal(counters.failed, 0);
});

test('UDP: the admit hook runs per new session; refused datagrams are dropped and counted, not failed', async () => {
  const backend = await startUdpBackend('127.0.21.1', 0, 'u1');
  cleanups.push(() => backend.close());
  let calls = 0;
  const counters = newCounters();
  const fwd = new UdpForwarder({
    hosts: ['127.0.21.10'], port: 0, balancer: balancerTo('127.0.21.1', backend.port), counters, log: silentLogger(), idleMs: 5000,
    admit: (ip) => {
      calls++;
      return ip === '127.0.21.100';
    },
  });
  const port = await fwd.listen();
  cleanups.push(() => fwd.destroy());

  // One admitted client, three datagrams: one session, one admit call.
  const sock = dgram.createSocket('udp4');
  await new Promise<void>((r) => sock.bind({ address: '127.0.21.100', port: 0 }, () => r()));
  cleanups.push(() => void sock.close());
  const replies: string[] = [];
  sock.on('message', (m) => replies.push(m.toString()));
  for (let i = 0; i < 3; i++) sock.send(`m${i}`, port, '127.0.21.10');
  await waitFor('three replies', () => replies.length === 3, 5000);
  assert.deepEqual(replies.sort(), ['u1:m0', 'u1:m1', 'u1:m2']);
  assert.equal(calls, 1);

  await assert.rejects(udpExchange('127.0.21.10', port, 'x', { localAddress: '127.0.21.101', timeoutMs: 300 }));
  assert.equal(counters.denied >= 1, true);
  assert.equal(counters.failed, 0);
  assert.equal(fwd.sessionCount, 1);
});
