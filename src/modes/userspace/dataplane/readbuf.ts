// The read path of the TCP forwarder without a fresh 64 KB malloc per read.
//
// By default Node reads each chunk into a newly malloc'd 64 KB buffer that V8 frees only
// when it collects, tens of MB at a time; glibc then trims the top of its heap and the next
// reads fault the pages in again (a profile under bench/userspace.ts's loads: 99.5 minor
// page faults per MB forwarded, the gap to the naive pipe on 1-stream throughput). Here
// every socket reads into ONE buffer of the process (Node's `onread` option; for accepted
// sockets, which node:net creates without options, the same fields set on the socket before
// its first read), and each read is copied out at once:
// - a small read (under 4 KB: requests, responses) into Node's pooled small-buffer slab;
// - a larger one into a 64 KB buffer of a free list that this module keeps (at most
//   POOL_MAX idle buffers), returned when the write that carries it completes.
// The copy is what makes one shared read buffer safe: a write the kernel does not take at
// once keeps a reference to its bytes until it completes, so they must not live in a buffer
// the next read of any socket overwrites. An idle connection holds no buffer at all (the 8
// KB bound per idle connection), and the memory the forwarder churns is a few long-lived
// buffers, not garbage for the GC and for glibc's trimming.
//
// KPROXY_USERSPACE_SHARED_READ=0 turns it off (the bench compares both paths); a Node whose
// sockets lack the fields falls back to the 'data' path on its own.
import net from 'node:net';

export const READ_SIZE = 64 * 1024;
/** reads below this are copied into Node's small-buffer slab (Buffer.allocUnsafe pools under 4 KB) */
const SMALL = 4096;
/** idle 64 KB copy buffers kept for reuse (2 MiB) */
export const POOL_MAX = 32;

/** Node's private fields behind `onread` (found by description on a probe socket), or null. */
function findFields(): { buffer: symbol; cb: symbol; gen: symbol } | null {
  try {
    // onread is in node:net's docs (net.connect) but not in the constructor's types.
    const probe = new net.Socket({ onread: { buffer: Buffer.alloc(1), callback: () => {} } } as net.SocketConstructorOpts);
    const syms = Object.getOwnPropertySymbols(probe);
    const by = (d: string) => syms.find((x) => x.description === d);
    const buffer = by('kBuffer');
    const cb = by('kBufferCb');
    const gen = by('kBufferGen');
    probe.destroy();
    return buffer && cb && gen ? { buffer, cb, gen } : null;
  } catch {
    return null;
  }
}

const fields = process.env.KPROXY_USERSPACE_SHARED_READ === '0' ? null : findFields();
/** true when the sockets of this process read into the shared buffer */
export const sharedRead = fields !== null;
const READ_BUF = Buffer.allocUnsafeSlow(READ_SIZE);
const pool: Buffer[] = [];
/** sockets set up to read into the shared buffer (accepted + dialled), for tests and /debug */
let sharedSockets = 0;

export type ReadCallback = (this: net.Socket, n: number, buf: Buffer) => void;

/**
 * The connect option that makes an upstream socket read into the shared buffer ({} when off).
 * One object may serve every dial; countSharedSocket() counts each socket dialled with it.
 */
export function upstreamReadOption(cb: ReadCallback): { onread?: { buffer: Buffer; callback: (n: number, buf: Buffer) => void } } {
  if (!sharedRead) return {};
  return { onread: { buffer: READ_BUF, callback: cb as (n: number, buf: Buffer) => void } };
}

/** Counts a socket dialled with upstreamReadOption's option. */
export function countSharedSocket(): void {
  if (sharedRead) sharedSockets++;
}

/**
 * Makes an accepted socket read into the shared buffer, as `onread` does for a socket kproxy
 * creates. Only before its first read (a paused socket: pauseOnConnect). False = not possible here.
 */
export function useSharedReadBuffer(s: net.Socket, cb: ReadCallback): boolean {
  const handle = (s as unknown as { _handle?: { useUserBuffer?: (b: Buffer) => void; reading?: boolean } })._handle;
  if (!fields || !handle?.useUserBuffer || handle.reading) return false;
  const t = s as unknown as Record<symbol, unknown>;
  t[fields.buffer] = READ_BUF;
  t[fields.cb] = cb;
  t[fields.gen] = null;
  handle.useUserBuffer(READ_BUF);
  sharedSockets++;
  return true;
}

const RELEASE = Symbol('kproxy.release');
const OUTQ = Symbol('kproxy.outq');
type Writer = net.Socket & { [RELEASE]?: () => void; [OUTQ]?: Buffer[] };

/** A copy buffer back to the free list, once its write is done (or failed: its bytes are no longer referenced). */
function releaser(w: Writer): () => void {
  const q: Buffer[] = (w[OUTQ] = []);
  // Writes to one socket complete in order: each completion frees the oldest pooled copy.
  return (w[RELEASE] = () => {
    const b = q.shift();
    if (b && pool.length < POOL_MAX) pool.push(b);
  });
}

/**
 * Copies bytes [0, n) of the shared read buffer out and writes them to `peer`; returns what
 * write() returned (false: the peer is full, pause the reader until it drains).
 */
export function writeCopy(peer: net.Socket, buf: Buffer, n: number): boolean {
  if (n < SMALL) {
    const c = Buffer.allocUnsafe(n);
    buf.copy(c, 0, 0, n);
    return peer.write(c);
  }
  const w = peer as Writer;
  const b = pool.pop() ?? Buffer.allocUnsafeSlow(READ_SIZE);
  buf.copy(b, 0, 0, n);
  const release = w[RELEASE] ?? releaser(w);
  w[OUTQ]!.push(b);
  return peer.write(n === READ_SIZE ? b : b.subarray(0, n), release);
}

/** Sockets set up to read into the shared buffer so far, and idle copy buffers held for reuse. */
export function readBufferStats(): { sharedSockets: number; pooled: number } {
  return { sharedSockets, pooled: pool.length };
}
