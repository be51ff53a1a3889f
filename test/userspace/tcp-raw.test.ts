// What is particular to the raw-handle TCP path (src/modes/userspace/dataplane/tcp-raw.ts); the forwarder
// behaviour both paths share is tested on both by proxy, caps, tcp-idle, admit, readbuf and
// workers-affinity tests. Here: the fallback to net.Socket when an internal is missing (a
// binding taken away by an injected loader), the path choice, writes the kernel does not
// take at once (the copy buffers stay byte-exact, readers stop and resume, the free list
// stays bounded, fds return to baseline), and the FIN of the upstream forwarded first; and
// on both paths, a dial that times out retried on the next endpoint.
// Loopback only, ephemeral ports.
import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import net from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { RoundRobinBalancer } from '../../src/modes/userspace/dataplane/balancer.ts';
import { TcpForwarder, newCounters } from '../../src/modes/userspace/dataplane/tcp.ts';
import { RAW_POOL_MAX, RawTcpForwarder, createTcpForwarder, rawStats, rawSupport, tcpPathChoice, type BindingLoader } from '../../src/modes/userspace/dataplane/tcp-raw.ts';
import { silentLogger } from '../../src/log.ts';
import { TCP_PATHS, openFds, tcpForwarder } from './helpers.ts';
import { waitFor } from '../support/wait.ts';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');
const realLoad: BindingLoader = (n) => (process as unknown as { binding(n: string): unknown }).binding(n);

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function server(onConn: (s: net.Socket) => void): Promise<number> {
  const srv = net.createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => s.destroy());
    onConn(s);
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  cleanups.push(() => new Promise<void>((r) => srv.close(() => r())));
  return (srv.address() as net.AddressInfo).port;
}

function balancerTo(port: number): RoundRobinBalancer {
  const b = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  b.setEndpoints([{ key: `127.0.0.1:${port}`, ip: '127.0.0.1', port }]);
  return b;
}

test('the raw path is found on this Node; a missing binding or method falls back to net.Socket, logged once at info, and still forwards', async () => {
  assert.ok('bindings' in rawSupport(), 'this Node has the internals (CI runs the raw path for real)');
  const noStream: BindingLoader = (n) => (n === 'stream_wrap' ? undefined : realLoad(n));
  assert.deepEqual(rawSupport(noStream), { missing: 'the tcp_wrap or stream_wrap binding' });
  const throwing: BindingLoader = () => {
    throw new Error('No such module: tcp_wrap');
  };
  assert.deepEqual(rawSupport(throwing), { missing: '(No such module: tcp_wrap)' });
  // A TCP class whose handles lack a method the path uses.
  const noReset: BindingLoader = (n) => {
    const b = realLoad(n) as Record<string, unknown>;
    if (n !== 'tcp_wrap') return b;
    const Real = b.TCP as new (t: number) => object;
    class Partial extends Real {}
    Object.defineProperty(Partial.prototype, 'useUserBuffer', { value: undefined });
    return { ...b, TCP: Partial };
  };
  assert.deepEqual(rawSupport(noReset), { missing: 'TCP.useUserBuffer' });

  const lines: { msg: string; missing?: string; level: number }[] = [];
  const log = pino({ level: 'info' }, new Writable({ write: (c, _e, cb) => (lines.push(JSON.parse(String(c))), cb()) }));
  const port = await server((s) => s.pipe(s));
  const fwd = createTcpForwarder({ host: '127.0.0.1', port: 0, balancer: balancerTo(port), counters: newCounters(), log }, 'raw', noStream);
  cleanups.push(() => fwd.destroy());
  assert.ok(fwd instanceof TcpForwarder, 'the net.Socket forwarder');
  assert.equal(lines.length, 1);
  assert.equal(lines[0].level, 30);
  assert.equal(lines[0].missing, 'the tcp_wrap or stream_wrap binding');
  assert.match(lines[0].msg, /using net\.Socket/);
  const lp = await fwd.listen();
  const echo = await new Promise<string>((resolve, reject) => {
    const c = net.connect({ host: '127.0.0.1', port: lp }, () => c.end('ping'));
    let got = '';
    c.on('data', (d) => (got += d));
    c.on('end', () => resolve(got));
    c.on('error', reject);
  });
  assert.equal(echo, 'ping');
  // With the internals there: the raw forwarder.
  const raw = createTcpForwarder({ host: '127.0.0.1', port: 0, balancer: balancerTo(port), counters: newCounters(), log: silentLogger() }, 'auto');
  cleanups.push(() => raw.destroy());
  assert.ok(raw instanceof RawTcpForwarder);
});

test('path choice: KPROXY_USERSPACE_TCP wins over userspace.tcpPath; anything else in it is ignored', () => {
  assert.equal(tcpPathChoice('raw', 'net'), 'net');
  assert.equal(tcpPathChoice('net', 'raw'), 'raw');
  assert.equal(tcpPathChoice('net', ''), 'net');
  assert.equal(tcpPathChoice('auto', 'fast'), 'auto');
  // The raw path skips getpeername unless admission or ClientIP affinity needs the address
  // (affinity through the raw path: proxy.test.ts, on both paths).
  assert.equal(new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 }).usesClientIP, false);
  assert.equal(new RoundRobinBalancer({ stickyMaxAgeSeconds: 10 }).usesClientIP, true);
  const net1 = createTcpForwarder({ host: '127.0.0.1', port: 0, balancer: balancerTo(1), counters: newCounters(), log: silentLogger() }, 'net');
  assert.ok(net1 instanceof TcpForwarder);
  net1.destroy();
});

test('raw: a slow reader makes writes queue; every byte arrives in order, readers stop and resume, the free list stays bounded, fds return to baseline', async () => {
  // The backend echoes; each client reads slowly (20 ms stalls), so the echo outruns it and
  // the forwarder's writes to the client go asynchronous and hold their copy buffers.
  const port = await server((s) => s.pipe(s));
  const counters = newCounters();
  const fwd = tcpForwarder('raw', { host: '127.0.0.1', port: 0, balancer: balancerTo(port), counters, log: silentLogger() });
  cleanups.push(() => fwd.destroy());
  const lp = await fwd.listen();
  const baseline = openFds();
  const before = rawStats();
  const payloads = Array.from({ length: 3 }, (_, i) => randomBytes(12 * 1024 * 1024 + i * 777));
  const echoes = await Promise.all(payloads.map((p) => new Promise<Buffer>((resolve, reject) => {
    const got: Buffer[] = [];
    const c = net.connect({ host: '127.0.0.1', port: lp, allowHalfOpen: true });
    const timer = setTimeout(() => {
      c.destroy();
      reject(new Error('slow exchange timed out'));
    }, 90_000);
    let reads = 0;
    c.on('data', (d: Buffer) => {
      got.push(d);
      if (++reads % 4 === 0) {
        c.pause();
        setTimeout(() => c.resume(), 20);
      }
    });
    c.on('end', () => {
      clearTimeout(timer);
      c.end();
      resolve(Buffer.concat(got));
    });
    c.on('error', reject);
    c.end(p);
  })));
  for (let i = 0; i < payloads.length; i++) {
    assert.equal(echoes[i].length, payloads[i].length, `connection ${i}: length`);
    assert.equal(sha(echoes[i]), sha(payloads[i]), `connection ${i}: bytes differ`);
  }
  const after = rawStats();
  assert.ok(after.asyncWrites > before.asyncWrites, 'some writes were queued');
  assert.ok(after.pauses > before.pauses, 'some readers were stopped for back-pressure');
  assert.ok(after.pooled <= RAW_POOL_MAX, `free list ${after.pooled} > ${RAW_POOL_MAX}`);
  await waitFor('every pair closed', () => counters.active === 0 && fwd.openClients === 0, 10_000);
  assert.ok(rawStats().pooled > 0, 'the copy buffers held by queued writes came back to the free list');
  await waitFor(`fds back to baseline ${baseline} (now ${openFds()})`, () => openFds() <= baseline, 10_000);
  assert.equal(counters.accepted, payloads.length);
  assert.equal(counters.failed, 0);
});

test('raw: the upstream\'s FIN first: the client still sends, the backend still receives, then both close', async () => {
  // The backend greets and shuts its write side at once, then counts what it reads.
  let received = '';
  let backendSawEnd = false;
  const port = await server((s) => {
    s.end('hello\n');
    s.on('data', (d) => (received += d));
    s.on('end', () => (backendSawEnd = true));
  });
  const counters = newCounters();
  const fwd = tcpForwarder('raw', { host: '127.0.0.1', port: 0, balancer: balancerTo(port), counters, log: silentLogger() });
  cleanups.push(() => fwd.destroy());
  const lp = await fwd.listen();
  const c = net.connect({ host: '127.0.0.1', port: lp, allowHalfOpen: true });
  cleanups.push(() => void c.destroy());
  let got = '';
  c.on('data', (d) => (got += d));
  await new Promise<void>((r) => c.once('end', () => r()));
  assert.equal(got, 'hello\n');
  // Half-open: our write side is still open through the proxy.
  c.write('after your FIN');
  await waitFor('the backend to receive after its FIN', () => received === 'after your FIN', 5000);
  assert.equal(counters.active, 1, 'the pair stays while one direction is open');
  c.end();
  await waitFor('both directions shut, the pair closed', () => backendSawEnd && counters.active === 0, 5000);
});

/** TCP_NODELAY of sockets of this process, read by python3 through pidfd_getfd (Linux ≥ 5.6, root). */
function noDelayOf(fds: number[]): number[] {
  const py = `import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
pidfd = os.pidfd_open(int(sys.argv[1]))
out = []
for fd in map(int, sys.argv[2:]):
    n = libc.syscall(438, pidfd, fd, 0)
    if n < 0: raise OSError(ctypes.get_errno(), 'pidfd_getfd')
    s = socket.socket(fileno=n)
    out.append(s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
    s.close()
print(' '.join(map(str, out)))`;
  return execFileSync('python3', ['-c', py, String(process.pid), ...fds.map(String)], { encoding: 'utf8', timeout: 10_000 }).trim().split(' ').map(Number);
}

test('raw: both sockets of a pair have TCP_NODELAY (the accepted one through the listening socket)', async () => {
  const port = await server((s) => s.pipe(s));
  const counters = newCounters();
  const fwd = new RawTcpForwarder({ host: '127.0.0.1', port: 0, balancer: balancerTo(port), counters, log: silentLogger() });
  cleanups.push(() => fwd.destroy());
  const lp = await fwd.listen();
  const c = net.connect({ host: '127.0.0.1', port: lp });
  cleanups.push(() => void c.destroy());
  await new Promise<void>((r) => c.once('connect', () => r()));
  await waitFor('the pair spliced', () => counters.active === 1, 5000);
  const conn = [...(fwd as unknown as { conns: Set<{ client: { fd: number }; up: { fd: number } }> }).conns][0];
  // The probe itself: a plain accepted socket has Nagle on (Linux's default).
  const plain = await new Promise<{ fd: number }>((resolve) => {
    const srv = net.createServer((s) => resolve((s as unknown as { _handle: { fd: number } })._handle));
    srv.listen(0, '127.0.0.1', () => {
      const p = net.connect((srv.address() as net.AddressInfo).port, '127.0.0.1');
      cleanups.push(() => void p.destroy(), () => void srv.close());
    });
  });
  assert.deepEqual(noDelayOf([conn.client.fd, conn.up.fd, plain.fd]), [1, 1, 0]);
});

/**
 * An endpoint whose handshakes never complete: a listener (backlog 1) in a child process
 * that stops itself (SIGSTOP) before it accepts anything, its accept queue filled by a few
 * connections, so the kernel drops the next SYNs and a dial to it hangs until its timeout.
 */
async function stalledEndpoint(): Promise<number> {
  const child = spawn(process.execPath, ['-e',
    "const s = require('net').createServer(() => {}); s.listen({ port: 0, host: '127.0.0.1', backlog: 1 }, () => { process.stdout.write(String(s.address().port) + '\\n'); process.kill(process.pid, 'SIGSTOP'); });"], { stdio: ['ignore', 'pipe', 'inherit'] });
  cleanups.push(() => void child.kill('SIGKILL'));
  const port = await new Promise<number>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error('the stalled endpoint did not start')), 10_000);
    child.stdout!.once('data', (d) => {
      clearTimeout(t);
      resolve(Number(String(d).trim()));
    });
  });
  for (let i = 0; i < 4; i++) {
    const f = net.connect({ host: '127.0.0.1', port });
    f.on('error', () => {});
    cleanups.push(() => void f.destroy());
  }
  // The queue is full once a probe's handshake does not complete within 300 ms (bounded).
  for (let i = 0; i < 20; i++) {
    const done = await new Promise<boolean>((resolve) => {
      const p = net.connect({ host: '127.0.0.1', port });
      p.on('error', () => {});
      const t = setTimeout(() => resolve(false), 300);
      p.once('connect', () => {
        clearTimeout(t);
        resolve(true);
      });
      cleanups.push(() => void p.destroy());
    });
    if (!done) return port;
  }
  throw new Error('could not fill the stalled endpoint\'s accept queue');
}

for (const path of TCP_PATHS) test(`TCP on ${path}: a dial that times out is retried on the next endpoint; the client is served`, async () => {
  const stalled = await stalledEndpoint();
  const good = await server((s) => s.pipe(s));
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  balancer.setEndpoints([{ key: `127.0.0.1:${stalled}`, ip: '127.0.0.1', port: stalled }, { key: `127.0.0.1:${good}`, ip: '127.0.0.1', port: good }]);
  const counters = newCounters();
  const fwd = tcpForwarder(path, { host: '127.0.0.1', port: 0, balancer, counters, log: silentLogger(), dialTimeoutsMs: [300, 300, 300, 300] });
  cleanups.push(() => fwd.destroy());
  const lp = await fwd.listen();
  const t0 = Date.now();
  const echo = await new Promise<string>((resolve, reject) => {
    const c = net.connect({ host: '127.0.0.1', port: lp }, () => c.end('ping'));
    let got = '';
    const t = setTimeout(() => reject(new Error(`no echo after 20 s (${JSON.stringify(counters)})`)), 20_000);
    c.on('data', (d) => (got += d));
    c.on('end', () => {
      clearTimeout(t);
      resolve(got);
    });
    c.on('error', reject);
  });
  assert.equal(echo, 'ping');
  assert.ok(Date.now() - t0 >= 250, 'the first dial waited for its timeout');
  assert.equal(counters.retries, 1);
  assert.equal(counters.failed, 0);
});
