// The net.Socket TCP path's dial timeout (one sweep per listener, not a timer per socket) and
// what an idle spliced pair keeps: a blackholed endpoint (a listener that never accepts, its
// accept queue filled, so the kernel drops the dial's SYN) times out and the dial moves on to
// the next endpoint, or resets the client when there is none; an idle pair holds no timer and
// at most one listener per event on each socket. Loopback only, ephemeral ports.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import net from 'node:net';
import { RoundRobinBalancer } from '../../src/modes/userspace/dataplane/balancer.ts';
import { TcpForwarder, newCounters } from '../../src/modes/userspace/dataplane/tcp.ts';
import { createLogger } from '../../src/log.ts';
import { waitFor } from '../support/wait.ts';

const PYTHON = existsSync('/usr/bin/python3') ? '/usr/bin/python3' : 'python3';

/**
 * A listener that never accepts (backlog 0): node:net always accepts, so a Python one. Once
 * its accept queue holds a connection, the kernel drops further SYNs: a dial to it hangs.
 */
async function blackhole(): Promise<{ port: number; proc: ChildProcess; fillers: net.Socket[] }> {
  const proc = spawn(PYTHON, ['-c', [
    'import socket, sys, time',
    's = socket.socket()',
    "s.bind(('127.0.0.1', 0))",
    's.listen(0)',
    "print(s.getsockname()[1], flush=True)",
    'time.sleep(120)',
  ].join('\n')], { stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  proc.stdout!.on('data', (b: Buffer) => (out += b.toString()));
  await waitFor('the blackhole listener', () => /\d+\n/.test(out), 10_000);
  const port = Number(out.trim());
  // Fill the accept queue: connect until one connection does not complete (at most 8).
  const fillers: net.Socket[] = [];
  for (let i = 0; i < 8; i++) {
    const s = net.connect({ host: '127.0.0.1', port });
    s.on('error', () => {});
    fillers.push(s);
    const connected = await new Promise<boolean>((r) => {
      const t = setTimeout(() => r(false), 500);
      s.once('connect', () => {
        clearTimeout(t);
        r(true);
      });
    });
    if (!connected) return { port, proc, fillers };
  }
  throw new Error('the blackhole accept queue did not fill');
}

async function echoServer(): Promise<{ server: net.Server; port: number }> {
  const server = net.createServer((s) => {
    s.on('error', () => {});
    s.on('data', (d) => s.write(d));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as net.AddressInfo).port };
}

function logLines(): { lines: string[]; log: ReturnType<typeof createLogger> } {
  const lines: string[] = [];
  return { lines, log: createLogger({ level: 'debug', dest: { write: (s: string) => lines.push(s) } }) };
}

test('dial timeout: a blackholed endpoint times out (sweep) and the dial moves on to the next endpoint', async () => {
  const hole = await blackhole();
  const echo = await echoServer();
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  // Round robin starts with the blackhole.
  balancer.setEndpoints([
    { key: `127.0.0.1:${hole.port}`, ip: '127.0.0.1', port: hole.port },
    { key: `127.0.0.1:${echo.port}`, ip: '127.0.0.1', port: echo.port },
  ]);
  const counters = newCounters();
  const { lines, log } = logLines();
  const fwd = new TcpForwarder({ host: '127.0.0.1', port: 0, balancer, counters, log, dialTimeoutsMs: [300, 300, 300, 300] });
  const port = await fwd.listen();
  const client = net.connect({ host: '127.0.0.1', port });
  client.on('error', () => {});
  try {
    const t0 = Date.now();
    const got = new Promise<string>((r) => client.once('data', (d) => r(String(d))));
    client.write('ping');
    const reply = await Promise.race([got, new Promise<string>((r) => setTimeout(() => r('no reply'), 15_000))]);
    const elapsed = Date.now() - t0;
    assert.equal(reply, 'ping', 'the echo endpoint answered after the blackhole timed out');
    assert.equal(counters.retries, 1);
    assert.equal(counters.failed, 0);
    assert.ok(elapsed >= 280, `the retry waited for the dial timeout (${elapsed} ms)`);
    assert.ok(
      lines.some((l) => l.includes(`dial 127.0.0.1:${hole.port} timed out after 300ms`)),
      'the timeout was logged as a timed-out dial',
    );
    await waitFor('no dial pending', () => fwd.dialsPending === 0, 5000);
  } finally {
    client.destroy();
    fwd.destroy();
    for (const s of hole.fillers) s.destroy();
    hole.proc.kill('SIGKILL');
    await new Promise((r) => echo.server.close(r));
  }
});

test('dial timeout: with only a blackholed endpoint the client is reset once every endpoint timed out', async () => {
  const hole = await blackhole();
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  balancer.setEndpoints([{ key: `127.0.0.1:${hole.port}`, ip: '127.0.0.1', port: hole.port }]);
  const counters = newCounters();
  const fwd = new TcpForwarder({ host: '127.0.0.1', port: 0, balancer, counters, log: logLines().log, dialTimeoutsMs: [250, 250] });
  const port = await fwd.listen();
  const client = net.connect({ host: '127.0.0.1', port });
  try {
    const t0 = Date.now();
    const ended = await new Promise<string>((r) => {
      const t = setTimeout(() => r('still open'), 15_000);
      client.on('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(t);
        r(e.code ?? 'error');
      });
      client.on('close', () => {
        clearTimeout(t);
        r('closed');
      });
    });
    assert.equal(ended, 'ECONNRESET', 'no endpoint left: a reset, as REJECT');
    assert.ok(Date.now() - t0 >= 230, 'after the dial timeout, not at once');
    assert.equal(counters.failed, 1);
    assert.equal(counters.retries, 1, 'the one endpoint timed out once; the retry found none left');
    await waitFor('no dial pending', () => fwd.dialsPending === 0, 5000);
  } finally {
    client.destroy();
    fwd.destroy();
    for (const s of hole.fillers) s.destroy();
    hole.proc.kill('SIGKILL');
  }
});

/** The value of a socket's symbol-keyed field by its description (node:net's private fields). */
function bySymbol(s: net.Socket, description: string): unknown {
  const k = Object.getOwnPropertySymbols(s).find((x) => x.description === description);
  return k ? (s as unknown as Record<symbol, unknown>)[k] : undefined;
}

test('an idle spliced pair keeps no timer and at most one listener per event on each socket', async () => {
  const echo = await echoServer();
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  balancer.setEndpoints([{ key: `127.0.0.1:${echo.port}`, ip: '127.0.0.1', port: echo.port }]);
  const counters = newCounters();
  // An idle timeout, so the sweep runs, as in kproxy's default.
  const fwd = new TcpForwarder({ host: '127.0.0.1', port: 0, balancer, counters, log: logLines().log, idleTimeoutMs: 3_600_000 });
  const port = await fwd.listen();
  const clients: net.Socket[] = [];
  try {
    for (let i = 0; i < 20; i++) {
      const c = net.connect({ host: '127.0.0.1', port });
      c.on('error', () => {});
      clients.push(c);
    }
    await waitFor('20 spliced pairs', () => counters.active === 20, 10_000);
    // One byte each way through every pair: the read path has run too.
    for (const c of clients) {
      const got = new Promise<void>((r) => c.once('data', () => r()));
      c.write('x');
      await got;
    }
    const internals = fwd as unknown as { clients: Set<net.Socket> };
    const sockets: net.Socket[] = [];
    for (const c of internals.clients) sockets.push(c, bySymbol(c, 'kproxy.peer') as net.Socket);
    assert.equal(sockets.length, 40);
    for (const s of sockets) {
      assert.ok(s instanceof net.Socket, 'each client has its upstream peer');
      // socket.setTimeout leaves its Timeout here for the socket's life, even when cleared.
      assert.equal(bySymbol(s, 'timeout') ?? null, null, 'no per-socket timer');
      for (const e of s.eventNames()) assert.ok(s.listenerCount(e) <= 1, `one listener for '${String(e)}' (an array per socket otherwise)`);
      assert.equal(bySymbol(s, 'kproxy.dial'), undefined, 'the dial record is dropped once connected');
      assert.equal((s as unknown as { _peername?: unknown })._peername, undefined, 'no cached peer address object');
    }
    assert.equal(fwd.dialsPending, 0);
    assert.equal(fwd.openClients, 20);
    // With no dial pending the dial sweep stops (it would wake the process every 100 ms).
    const timers = fwd as unknown as { dialSweep: NodeJS.Timeout | null; sweep: NodeJS.Timeout | null };
    await waitFor('the dial sweep to stop', () => timers.dialSweep === null, 5000);
    assert.notEqual(timers.sweep, null, 'the idle sweep runs while pairs are open');
  } finally {
    for (const c of clients) c.destroy();
    fwd.destroy();
    await new Promise((r) => echo.server.close(r));
  }
});
