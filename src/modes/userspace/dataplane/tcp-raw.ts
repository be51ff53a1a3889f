// The userspace TCP forwarder on Node's raw libuv stream handles (the `tcp_wrap` and
// `stream_wrap` bindings that node:net itself is built on) instead of net.Socket: the same
// contract as TcpForwarder (tcp.ts) — admission hook, ConnectionBudget and the shared cap,
// balancer picks with dial retry on the next endpoint at DIAL_TIMEOUTS_MS, affinity through
// the picker, counters, idle timeout sweep, half-close, reset when no endpoint, back-pressure,
// accept errors counted not thrown, close()/destroy() — without two Duplex streams, their
// states, event emitters, a dial timer and nextTick hops per connection.
//
// Per connection there is one plain object (Conn) and the two handles; the callbacks are
// shared functions that find the Conn on the handle or request (no closures per
// connection). Every handle reads into ONE buffer of the process (useUserBuffer, as net's
// `onread` option); each read is copied into a 64 KB copy buffer and written to the peer: a
// write the kernel took at once (the common case) leaves the copy buffer free for the next
// read, with no allocation; a write that went asynchronous keeps it until it completes (the
// next reads copy into another, from a free list) and, above HIGH_WATER bytes queued, stops
// reading the source until the peer drained (back-pressure). A FIN read on one side becomes
// a shutdown of the other once its writes are done (half-close); the pair is closed when
// both directions are shut, or when both FINs are read and no write is queued (close()
// sends the FINs), or at once on an error. Dial timeouts are one coarse
// timer per forwarder over FIFO queues (one per attempt: same timeout, so deadline order),
// not a timer per dial.
//
// The listening socket is still a net.Server (binding, IPv6-only, ephemeral ports, errors,
// and a worker receiving it over IPC stay as they are); only its handle's onconnection is
// replaced. The internals are feature-detected at start-up (rawSupport): when one is missing
// or the self-check fails, kproxy uses TcpForwarder (logged once at info).
// KPROXY_USERSPACE_TCP=net|raw|auto or `userspace.tcpPath` chooses (tcpPathChoice).
import net from 'node:net';
import { getSystemErrorName } from 'node:util';
import type { Logger } from '../../../log.ts';
import type { BalancedEndpoint } from './balancer.ts';
import { ListeningForwarder, TcpForwarder, plainAddress, type ForwardCounters, type TcpForwarderOptions } from './tcp.ts';

// ---- the internals, typed as this file uses them ----

interface StreamHandle {
  onread: ((this: StreamHandle) => void) | null;
  readonly writeQueueSize: number;
  readStart(): number;
  readStop(): number;
  useUserBuffer(b: Uint8Array): void;
  writeBuffer(req: WriteReq, b: Uint8Array): number;
  shutdown(req: ShutdownReq): number;
  close(cb?: () => void): void;
  setNoDelay(on: boolean): number;
  getpeername(out: { address?: string; port?: number; family?: string }): number;
  connect(req: ConnectReq, ip: string, port: number): number;
  connect6(req: ConnectReq, ip: string, port: number): number;
  reset?(cb?: () => void): number;
  /** this file's: the connection the handle belongs to */
  kp?: Conn;
}
interface ServerHandle {
  onconnection: ((this: ServerHandle, err: number, h: StreamHandle | undefined) => void) | null;
  setNoDelay?(on: boolean): number;
  kpFwd?: RawTcpForwarder;
}
interface WriteReq {
  oncomplete?: (this: WriteReq, status: number) => void;
  kp?: Conn;
  buf?: Buffer;
  toClient?: boolean;
}
interface ShutdownReq {
  oncomplete?: (this: ShutdownReq, status: number) => void;
  kp?: Conn;
  toClient?: boolean;
}
interface ConnectReq {
  oncomplete?: (this: ConnectReq, status: number, handle: StreamHandle) => void;
  kp?: Conn;
}

export interface RawBindings {
  TCP: new (type: number) => StreamHandle;
  TCPConnectWrap: new () => ConnectReq;
  WriteWrap: new () => WriteReq;
  ShutdownWrap: new () => ShutdownReq;
  SOCKET: number;
  state: Int32Array;
  kReadBytesOrError: number;
  kLastWriteWasAsync: number;
}

export type BindingLoader = (name: string) => unknown;

const UV_EOF = -4095;
const METHODS = ['readStart', 'readStop', 'useUserBuffer', 'writeBuffer', 'shutdown', 'close', 'setNoDelay', 'getpeername', 'connect', 'connect6'] as const;

/**
 * Finds the internals this path needs and checks them on a handle; `{ bindings }` or why
 * not. `load` is injectable so tests can take a binding away.
 */
export function rawSupport(load: BindingLoader = (n) => (process as unknown as { binding(n: string): unknown }).binding(n)): { bindings: RawBindings } | { missing: string } {
  try {
    const tcp = load('tcp_wrap') as Record<string, unknown> | undefined;
    const stream = load('stream_wrap') as Record<string, unknown> | undefined;
    if (!tcp || !stream) return { missing: 'the tcp_wrap or stream_wrap binding' };
    for (const [o, k] of [[tcp, 'TCP'], [tcp, 'TCPConnectWrap'], [stream, 'WriteWrap'], [stream, 'ShutdownWrap']] as const) {
      if (typeof o[k] !== 'function') return { missing: k };
    }
    const constants = tcp.constants as Record<string, number> | undefined;
    const state = stream.streamBaseState;
    if (typeof constants?.SOCKET !== 'number') return { missing: 'tcp_wrap constants.SOCKET' };
    if (!(state instanceof Int32Array)) return { missing: 'streamBaseState' };
    if (typeof stream.kReadBytesOrError !== 'number' || typeof stream.kLastWriteWasAsync !== 'number') return { missing: 'kReadBytesOrError/kLastWriteWasAsync' };
    if (getSystemErrorName(UV_EOF) !== 'EOF') return { missing: 'UV_EOF = -4095' };
    const b: RawBindings = {
      TCP: tcp.TCP as RawBindings['TCP'],
      TCPConnectWrap: tcp.TCPConnectWrap as RawBindings['TCPConnectWrap'],
      WriteWrap: stream.WriteWrap as RawBindings['WriteWrap'],
      ShutdownWrap: stream.ShutdownWrap as RawBindings['ShutdownWrap'],
      SOCKET: constants.SOCKET,
      state,
      kReadBytesOrError: stream.kReadBytesOrError,
      kLastWriteWasAsync: stream.kLastWriteWasAsync,
    };
    // Self-check: a socket handle has every method used here and takes the shared buffer.
    const h = new b.TCP(b.SOCKET);
    try {
      for (const m of METHODS) if (typeof (h as unknown as Record<string, unknown>)[m] !== 'function') return { missing: `TCP.${m}` };
      if (!('onread' in h) || typeof h.writeQueueSize !== 'number') return { missing: 'TCP.onread/writeQueueSize' };
      h.useUserBuffer(Buffer.alloc(16));
      if (h.setNoDelay(true) !== 0) return { missing: 'a working TCP.setNoDelay' };
    } finally {
      h.close();
    }
    return { bindings: b };
  } catch (e) {
    return { missing: `(${(e as Error).message})` };
  }
}

export type TcpPath = 'auto' | 'net' | 'raw';

/** The TCP path asked for: KPROXY_USERSPACE_TCP wins over the config's userspace.tcpPath. */
export function tcpPathChoice(configured: TcpPath = 'auto', env: string | undefined = process.env.KPROXY_USERSPACE_TCP): TcpPath {
  return env === 'net' || env === 'raw' || env === 'auto' ? env : configured;
}

let detected: ReturnType<typeof rawSupport> | null = null;
let fallbackLogged = false;
let B: RawBindings | null = null;

/** The path a forwarder of this process gets ('raw' only when the internals passed the check). */
export function resolveTcpPath(choice: TcpPath, log: Logger, load?: BindingLoader): 'net' | 'raw' {
  if (choice === 'net') return 'net';
  const d = load ? rawSupport(load) : (detected ??= rawSupport());
  if ('bindings' in d) {
    B = d.bindings;
    return 'raw';
  }
  if (!fallbackLogged || load) {
    fallbackLogged = true;
    log.info({ missing: d.missing, asked: choice }, 'userspace TCP: Node internals for the raw path are missing; using net.Socket');
  }
  return 'net';
}

export type AnyTcpForwarder = TcpForwarder | RawTcpForwarder;

/**
 * A TCP forwarder on the path chosen (`userspace.tcpPath` / KPROXY_USERSPACE_TCP): raw
 * handles when this Node has them, else net.Socket.
 */
export function createTcpForwarder(opts: TcpForwarderOptions, path: TcpPath = 'auto', load?: BindingLoader): AnyTcpForwarder {
  return resolveTcpPath(tcpPathChoice(path), opts.log, load) === 'raw' ? new RawTcpForwarder(opts) : new TcpForwarder(opts);
}

// ---- the forwarder ----

const READ_SIZE = 64 * 1024;
/** queued bytes to a peer above which the other side stops reading until they are written */
const HIGH_WATER = 64 * 1024;
/** idle 64 KB copy buffers kept for reuse (2 MiB) */
const POOL_MAX = 32;
const DIAL_TICK_MS = 50;

const READ_BUF = Buffer.allocUnsafeSlow(READ_SIZE);
const pool: Buffer[] = [];
/** a WriteWrap not consumed by a synchronous write, for the next one */
let spareWrite: WriteReq | null = null;
const peerOut: { address?: string; port?: number; family?: string } = {};
const stats = { forwarders: 0, accepted: 0, asyncWrites: 0, pauses: 0 };

/**
 * The raw path in this process so far: forwarders made, connections accepted, writes the
 * kernel did not take at once, readers stopped for back-pressure; and idle copy buffers.
 */
export function rawStats(): { forwarders: number; accepted: number; asyncWrites: number; pauses: number; pooled: number } {
  return { ...stats, pooled: pool.length };
}

export { POOL_MAX as RAW_POOL_MAX };

// Conn flags
const SPLICED = 1;
const CLOSED = 2;
/** the client sent its FIN / the upstream sent its FIN */
const C_EOF = 4;
const U_EOF = 8;
/** the shutdown of the client's / upstream's write side completed */
const C_SHUT = 16;
const U_SHUT = 32;
/** reading the client / the upstream is stopped for back-pressure */
const C_PAUSED = 64;
const U_PAUSED = 128;
/** counted in counters.active */
const ACTIVE = 256;

/** One client connection: its handle, its upstream's once dialled, and their state. */
class Conn {
  up: StreamHandle | null = null;
  flags = 0;
  attempt = 0;
  tried: Set<string> | undefined = undefined;
  ep: BalancedEndpoint | null = null;
  dialAt = 0;
  /** a byte moved since the last idle sweep */
  active = true;
  lastActiveMs = 0;
  constructor(
    readonly fwd: RawTcpForwarder,
    readonly client: StreamHandle,
    readonly clientIP: string,
    readonly counters: ForwardCounters,
  ) {}
}

export class RawTcpForwarder extends ListeningForwarder {
  readonly path = 'raw';
  /** every client connection of this listener, from accept to close */
  private readonly conns = new Set<Conn>();
  /** dials in flight, one FIFO per attempt (same timeout: deadline order) */
  private readonly dialing: Set<Conn>[];
  private dialTimer: NodeJS.Timeout | null = null;
  /** accepted sockets need their own TCP_NODELAY (not inherited from the listening socket) */
  private clientNoDelay = true;

  constructor(opts: TcpForwarderOptions) {
    if (!B) {
      const d = (detected ??= rawSupport());
      if (!('bindings' in d)) throw new Error(`the raw TCP path is not available: ${d.missing} is missing`);
      B = d.bindings;
    }
    super(opts);
    this.dialing = this.dialTimeouts.map(() => new Set<Conn>());
    stats.forwarders++;
    if (opts.server) this.takeOver();
  }

  protected createServer(): net.Server {
    return net.createServer();
  }

  /**
   * 'listening' is emitted on a nextTick after the handle listens: no connection can be
   * dispatched to node:net's onconnection before the take-over.
   */
  protected override onListening(): void {
    this.takeOver();
  }

  /** Accepting is ours: the server's handle calls onConnection instead of node:net's. */
  private takeOver(): void {
    const h = (this.server as unknown as { _handle?: ServerHandle | null })._handle;
    if (!h) {
      // Not listening yet (a server handed over before its 'listening'): take over then.
      this.server.once('listening', () => this.takeOver());
      return;
    }
    h.kpFwd = this;
    h.onconnection = onConnection;
    // Linux's accepted sockets inherit TCP_NODELAY from the listening socket (sk_clone_lock
    // copies the socket): one setsockopt per listener, not one per connection.
    if (process.platform === 'linux' && typeof h.setNoDelay === 'function' && h.setNoDelay(true) === 0) this.clientNoDelay = false;
  }

  /** Open client connections of this listener. */
  get openClients(): number {
    return this.conns.size;
  }

  /** Stops accepting and cuts every open connection. */
  destroy(): void {
    this.close();
    this.stopSweep();
    for (const c of [...this.conns]) this.closeConn(c);
    this.stopDialTimer();
  }

  /** @internal a connection accepted by the listening handle */
  accept(h: StreamHandle): void {
    if (this.overCap()) {
      h.close();
      return;
    }
    // The client's address only when admission or affinity needs it (a getpeername syscall).
    let clientIP = '';
    if (this.admit || (this.balancer as { usesClientIP?: boolean }).usesClientIP !== false) {
      peerOut.address = undefined;
      peerOut.port = 0;
      h.getpeername(peerOut);
      clientIP = plainAddress(peerOut.address);
    }
    if (this.denied(clientIP, peerOut.port ?? 0)) {
      h.close();
      return;
    }
    const budget = this.budget;
    const room = budget.shared?.take() ?? true;
    if (room === true) return this.start(h, clientIP);
    if (room === false) {
      this.counters.refused++;
      h.close();
      return;
    }
    // Nothing is read from the client while kproxy's process is asked for room.
    void room.then((ok) => {
      if (!ok) {
        this.counters.refused++;
        h.close();
      } else if (this.closed) {
        budget.shared!.release();
        h.close();
      } else this.start(h, clientIP);
    });
  }

  private start(h: StreamHandle, clientIP: string): void {
    this.budget.open++;
    this.counters.accepted++;
    stats.accepted++;
    const c = new Conn(this, h, clientIP, this.counters);
    h.kp = c;
    if (this.clientNoDelay) h.setNoDelay(true);
    this.conns.add(c);
    this.dial(c);
  }

  /**
   * One dial attempt to the endpoint the picker chooses (synchronously when it can); a
   * failure retries on a distinct endpoint at the next timeout step, forgetting affinity,
   * as upstream's tryConnect.
   */
  private dial(c: Conn): void {
    if (c.attempt >= this.dialTimeouts.length || c.flags & CLOSED) return this.dialFailed(c);
    let ep: BalancedEndpoint | null | Promise<BalancedEndpoint | null>;
    try {
      ep = this.balancer.next(c.clientIP, c.attempt > 0, c.tried);
    } catch (e) {
      this.log.error({ err: e }, 'userspace endpoint choice failed');
      ep = null;
    }
    if (ep instanceof Promise) {
      ep.then(
        (e) => this.dialTo(c, e),
        (e: unknown) => {
          this.log.error({ err: e }, 'userspace endpoint choice failed');
          this.dialFailed(c);
        },
      );
      return;
    }
    this.dialTo(c, ep);
  }

  private dialTo(c: Conn, ep: BalancedEndpoint | null): void {
    if (c.flags & CLOSED) return;
    if (!ep) return this.dialFailed(c);
    c.ep = ep;
    const up = new B!.TCP(B!.SOCKET);
    up.kp = c;
    up.setNoDelay(true);
    const req = new B!.TCPConnectWrap();
    req.kp = c;
    req.oncomplete = onConnect;
    // EMFILE surfaces here (the socket is made by the connect): a failed dial, not a crash.
    const err = ep.ip.includes(':') ? up.connect6(req, ep.ip, ep.port) : up.connect(req, ep.ip, ep.port);
    if (err !== 0) {
      up.close();
      return this.dialRetry(c, errName(err));
    }
    c.up = up;
    c.dialAt = Date.now();
    this.dialing[c.attempt].add(c);
    this.startDialTimer();
  }

  /** @internal the dial of c finished (status < 0: failed) */
  dialDone(c: Conn, status: number): void {
    this.dialing[c.attempt].delete(c);
    if (status < 0) {
      c.up!.close();
      c.up = null;
      return this.dialRetry(c, errName(status));
    }
    this.splice(c);
  }

  /** @internal a dial failed (refused, timed out): count it and try the next endpoint */
  private dialRetry(c: Conn, why: string): void {
    if (c.flags & CLOSED) return;
    this.counters.retries++;
    this.log.debug({ endpoint: c.ep?.key, err: why }, 'userspace dial failed, trying the next endpoint');
    if (c.ep) (c.tried ??= new Set()).add(c.ep.key);
    c.attempt++;
    this.dial(c);
  }

  private dialFailed(c: Conn): void {
    if (c.flags & CLOSED) return;
    this.counters.failed++;
    // A reset, as the kernel modes' REJECT: the client learns at once there is no endpoint.
    this.closeConn(c, true);
  }

  private startDialTimer(): void {
    if (this.dialTimer) return;
    this.dialTimer = setInterval(() => this.dialTick(), DIAL_TICK_MS);
    this.dialTimer.unref();
  }

  private stopDialTimer(): void {
    if (this.dialTimer) clearInterval(this.dialTimer);
    this.dialTimer = null;
  }

  /** Dials past their attempt's timeout are abandoned and retried (within DIAL_TICK_MS of it). */
  private dialTick(): void {
    const now = Date.now();
    let pending = 0;
    for (let i = 0; i < this.dialing.length; i++) {
      const q = this.dialing[i];
      const limit = this.dialTimeouts[i];
      for (const c of q) {
        if (now - c.dialAt < limit) break;
        q.delete(c);
        // Closing the handle cancels its connect: its oncomplete sees another handle (or none) and is ignored.
        c.up!.close();
        c.up = null;
        this.dialRetry(c, `dial ${c.ep?.key} timed out after ${limit}ms`);
      }
      pending += q.size;
    }
    if (pending === 0) this.stopDialTimer();
  }

  /** Both ends connected: read both into the shared buffer and forward as it arrives. */
  private splice(c: Conn): void {
    const up = c.up!;
    c.flags |= SPLICED | ACTIVE;
    c.counters.active++;
    c.lastActiveMs = coarseNow;
    const cl = c.client;
    cl.useUserBuffer(READ_BUF);
    cl.onread = onRead;
    up.useUserBuffer(READ_BUF);
    up.onread = onRead;
    if (cl.readStart() !== 0 || up.readStart() !== 0) return this.closeConn(c);
    if (this.idleMs > 0) this.startSweep();
  }

  /** @internal ends a connection: both handles closed (the client's reset when `reset`), counted once */
  closeConn(c: Conn, reset = false): void {
    if (c.flags & CLOSED) return;
    c.flags |= CLOSED;
    this.dialing[Math.min(c.attempt, this.dialing.length - 1)]?.delete(c);
    const cl = c.client;
    if (reset && cl.reset) {
      if (cl.reset() !== 0) cl.close();
    } else cl.close();
    c.up?.close();
    this.conns.delete(c);
    const budget = this.budget;
    budget.open--;
    budget.shared?.release();
    if (c.flags & ACTIVE) c.counters.active--;
  }

  protected hasSpliced(): boolean {
    return this.conns.size > 0;
  }

  protected sweepIdle(): void {
    coarseNow = Date.now();
    if (this.conns.size === 0 || this.idleMs <= 0) return this.stopSweep();
    for (const c of this.conns) {
      if (!(c.flags & SPLICED)) continue;
      if (c.active) {
        c.active = false;
        c.lastActiveMs = coarseNow;
      } else if (coarseNow - c.lastActiveMs >= this.idleMs) {
        this.counters.idleClosed++;
        this.closeConn(c);
      }
    }
  }
}

/** The clock of the idle sweeps. */
let coarseNow = Date.now();

function errName(status: number): string {
  try {
    return getSystemErrorName(status);
  } catch {
    return String(status);
  }
}

// ---- the shared callbacks (this = the handle or request) ----

function onConnection(this: ServerHandle, err: number, h: StreamHandle | undefined): void {
  const fwd = this.kpFwd!;
  if (err !== 0 || !h) return fwd.acceptError(errName(err));
  fwd.accept(h);
}

function onConnect(this: ConnectReq, status: number, handle: StreamHandle): void {
  const c = this.kp!;
  // A dial abandoned (timed out, the connection closed) has another handle now, or none.
  if (c.up !== handle || c.flags & CLOSED) return;
  c.fwd.dialDone(c, status);
}

/** A read into the shared buffer (nread in streamBaseState): copy, write to the peer. */
function onRead(this: StreamHandle): void {
  const c = this.kp!;
  if (c.flags & CLOSED) return;
  const n = B!.state[B!.kReadBytesOrError];
  const fromClient = this === c.client;
  if (n > 0) {
    c.active = true;
    return forward(c, fromClient, n);
  }
  if (n === 0) return;
  if (n !== UV_EOF) return c.fwd.closeConn(c);
  c.flags |= fromClient ? C_EOF : U_EOF;
  this.readStop();
  // Both FINs read: nothing more can come from either side. With no write queued to either,
  // closing both sends each its FIN at once (their receive queues are empty: close() sends a
  // FIN, not a reset), as the shutdowns would, without a shutdown request, its POLLOUT round
  // through epoll and its callback: the common end of a connection whose server closes first.
  if ((c.flags & (C_EOF | U_EOF)) === (C_EOF | U_EOF) && c.client.writeQueueSize === 0 && c.up!.writeQueueSize === 0) {
    return c.fwd.closeConn(c);
  }
  // FIN: shut the peer's write side once its queued writes are out (uv_shutdown waits for them).
  const dst = fromClient ? c.up! : c.client;
  const req = new B!.ShutdownWrap();
  req.kp = c;
  req.toClient = !fromClient;
  req.oncomplete = onShutdown;
  const err = dst.shutdown(req);
  if (err === 1) shutDone(c, !fromClient);
  else if (err !== 0) c.fwd.closeConn(c);
}

/** The copy buffer of the next forward: a write the kernel takes at once leaves it free. */
let out: Buffer = Buffer.allocUnsafeSlow(READ_SIZE);
/**
 * Views of READ_BUF and of `out` by length, so that a forward allocates nothing (Buffer#copy
 * of a part makes a Uint8Array, subarray a Buffer): bounded, those of `out` dropped with it.
 */
const readViews = new Map<number, Buffer>();
let outViews = new Map<number, Buffer>();
const VIEWS_MAX = 2048;

function forward(c: Conn, fromClient: boolean, n: number): void {
  const dst = fromClient ? c.up! : c.client;
  const buf = out;
  let view: Buffer | undefined;
  if (n === READ_SIZE) {
    buf.set(READ_BUF, 0);
    view = buf;
  } else {
    let from = readViews.get(n);
    if (from === undefined) {
      if (readViews.size >= VIEWS_MAX) readViews.clear();
      readViews.set(n, (from = READ_BUF.subarray(0, n)));
    }
    buf.set(from, 0);
    view = outViews.get(n);
    if (view === undefined) {
      if (outViews.size >= VIEWS_MAX) outViews.clear();
      outViews.set(n, (view = buf.subarray(0, n)));
    }
  }
  const req = spareWrite ?? new B!.WriteWrap();
  spareWrite = null;
  const err = dst.writeBuffer(req, view);
  if (err !== 0) return c.fwd.closeConn(c);
  if (B!.state[B!.kLastWriteWasAsync] === 0) {
    // Written at once: the buffer and the request are free again.
    spareWrite = req;
    return;
  }
  // The write holds `out` until it completes (onWritten returns it to the free list): the
  // next forward copies into another.
  out = pool.pop() ?? Buffer.allocUnsafeSlow(READ_SIZE);
  outViews = new Map();
  req.kp = c;
  req.buf = buf;
  req.toClient = !fromClient;
  req.oncomplete = onWritten;
  stats.asyncWrites++;
  if (dst.writeQueueSize >= HIGH_WATER) {
    stats.pauses++;
    const src = fromClient ? c.client : c.up!;
    src.readStop();
    c.flags |= fromClient ? C_PAUSED : U_PAUSED;
  }
}

function onWritten(this: WriteReq, status: number): void {
  const c = this.kp!;
  if (pool.length < POOL_MAX) pool.push(this.buf!);
  this.buf = undefined;
  this.kp = undefined;
  if (c.flags & CLOSED) return;
  if (status < 0) return c.fwd.closeConn(c);
  // Writes to the client drain what was read from the upstream, and the other way round.
  const paused = this.toClient ? U_PAUSED : C_PAUSED;
  if (!(c.flags & paused)) return;
  const dst = this.toClient ? c.client : c.up!;
  if (dst.writeQueueSize >= HIGH_WATER) return;
  c.flags &= ~paused;
  const src = this.toClient ? c.up! : c.client;
  if (src.readStart() !== 0) c.fwd.closeConn(c);
}

function onShutdown(this: ShutdownReq, status: number): void {
  const c = this.kp!;
  this.kp = undefined;
  if (c.flags & CLOSED) return;
  if (status < 0) return c.fwd.closeConn(c);
  shutDone(c, this.toClient!);
}

/** One direction is over (FIN forwarded); both over: the pair is done. */
function shutDone(c: Conn, toClient: boolean): void {
  c.flags |= toClient ? C_SHUT : U_SHUT;
  if ((c.flags & (C_SHUT | U_SHUT)) === (C_SHUT | U_SHUT)) c.fwd.closeConn(c);
}
