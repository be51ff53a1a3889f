// The TCP forwarder's read path (src/modes/userspace/dataplane/readbuf.ts): every socket reads into one
// shared buffer and each read is copied out before it is written, so a write the kernel does
// not take at once never holds bytes the next read overwrites. What could go wrong and is
// checked here: bytes of one connection showing up in another, or a chunk overwritten while
// its write waited (many connections at once, each with its own random bytes, readers that
// stall so writes queue), the accepted and the dialled sockets not using the shared buffer
// at all (the fallback path), and the free list of copy buffers growing without bound.
// Loopback only, ephemeral ports.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import net from 'node:net';
import { RoundRobinBalancer } from '../../src/modes/userspace/dataplane/balancer.ts';
import { POOL_MAX, READ_SIZE, readBufferStats, sharedRead } from '../../src/modes/userspace/dataplane/readbuf.ts';
import { newCounters } from '../../src/modes/userspace/dataplane/tcp.ts';
import { RAW_POOL_MAX, rawStats } from '../../src/modes/userspace/dataplane/tcp-raw.ts';
import { TCP_PATHS, tcpForwarder } from './helpers.ts';
import { waitFor } from '../support/wait.ts';
import { silentLogger } from '../../src/log.ts';

const sha = (b: Buffer) => createHash('sha256').update(b).digest('hex');

/** An echo backend that stops reading for a moment now and then, so the forwarder's writes to it queue. */
async function stallingEcho(): Promise<{ server: net.Server; port: number }> {
  const server = net.createServer({ allowHalfOpen: true }, (s) => {
    s.on('error', () => s.destroy());
    let n = 0;
    s.on('data', (d: Buffer) => {
      const full = !s.write(d);
      if (full || ++n % 7 === 0) {
        s.pause();
        const go = () => setTimeout(() => s.resume(), 5);
        if (full) s.once('drain', go);
        else go();
      }
    });
    s.on('end', () => s.end());
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return { server, port: (server.address() as net.AddressInfo).port };
}

/** Sends `payload` in chunks of varied sizes (small and large reads), reads the echo back slowly; resolves with it. */
function exchange(port: number, payload: Buffer, timeoutMs: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const got: Buffer[] = [];
    const sock = net.connect({ host: '127.0.0.1', port, allowHalfOpen: true });
    const timer = setTimeout(() => {
      sock.destroy();
      reject(new Error(`exchange timed out after ${timeoutMs} ms (${got.reduce((a, b) => a + b.length, 0)} of ${payload.length} bytes back)`));
    }, timeoutMs);
    sock.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    let reads = 0;
    sock.on('data', (d: Buffer) => {
      got.push(d);
      // The client stalls too: the forwarder's writes to it queue while it reads the backend.
      if (++reads % 5 === 0) {
        sock.pause();
        setTimeout(() => sock.resume(), 3);
      }
    });
    sock.on('end', () => {
      clearTimeout(timer);
      sock.end();
      resolve(Buffer.concat(got));
    });
    const sizes = [100, 3000, 5000, READ_SIZE, 200_000, 1];
    let off = 0;
    let i = 0;
    const pump = () => {
      while (off < payload.length) {
        const n = Math.min(sizes[i++ % sizes.length], payload.length - off);
        const ok = sock.write(payload.subarray(off, off + n));
        off += n;
        if (!ok) return void sock.once('drain', pump);
      }
      sock.end();
    };
    sock.once('connect', pump);
  });
}

for (const path of TCP_PATHS) test(`TCP on ${path}: many connections at once, each its own random bytes through stalling peers: every echo is byte-exact; the shared buffer is used; the copy buffers stay bounded`, async () => {
  if (path === 'net') assert.ok(sharedRead, 'this Node exposes onread for accepted sockets (else the forwarder falls back to the data path)');
  const be = await stallingEcho();
  const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
  balancer.setEndpoints([{ key: 'b', ip: '127.0.0.1', port: be.port }]);
  const counters = newCounters();
  const fwd = tcpForwarder(path, { host: '127.0.0.1', port: 0, balancer, counters, log: silentLogger() });
  const port = await fwd.listen();
  const before = readBufferStats().sharedSockets;
  const rawBefore = rawStats();
  try {
    const payloads = Array.from({ length: 12 }, (_, i) => randomBytes(2 * 1024 * 1024 + i * 4099));
    const echoes = await Promise.all(payloads.map((p) => exchange(port, p, 60_000)));
    for (let i = 0; i < payloads.length; i++) {
      assert.equal(echoes[i].length, payloads[i].length, `connection ${i}: length`);
      assert.equal(sha(echoes[i]), sha(payloads[i]), `connection ${i}: bytes differ (a chunk overwritten or crossed)`);
    }
    // Both sockets of each pair (accepted and dialled) were set up on the shared buffer
    // (net); the raw path reads every handle into its one buffer (test/userspace/tcp-raw.test.ts
    // makes its writes queue and its readers stop).
    if (path === 'net') assert.equal(readBufferStats().sharedSockets - before, 2 * payloads.length);
    else assert.equal(rawStats().accepted - rawBefore.accepted, payloads.length);
    assert.equal(counters.accepted, payloads.length);
    assert.equal(counters.failed, 0);
    await waitFor('every pair closed', () => counters.active === 0, 10_000);
    const pooled = path === 'net' ? readBufferStats().pooled : rawStats().pooled;
    const max = path === 'net' ? POOL_MAX : RAW_POOL_MAX;
    assert.ok(pooled <= max, `free list ${pooled} > ${max}`);
    // net: every large read goes through the free list. raw: a copy buffer goes to the free
    // list only when a write holding it went asynchronous (tcp-raw.test.ts makes them).
    if (path === 'net') assert.ok(pooled > 0, 'large reads were copied into (and returned to) the free list');
  } finally {
    fwd.destroy();
    await new Promise<void>((r) => be.server.close(() => r()));
  }
});
