// One TCP listener of the userspace proxy: accepts client connections, dials an endpoint
// chosen by the balancer (retrying refused or timed-out dials on the next endpoint, as
// upstream's tryConnect), then forwards both directions: back-pressure through
// pause/resume, and each direction's FIN forwarded on its own (allowHalfOpen) so a client
// that shuts its write side still gets the whole reply.
//
// The hot path is kept cheap (a CPU profile of the data path under bench/userspace.ts's loads:
// the time goes to the write and connect syscalls, not to JavaScript): each
// direction is a 'data' handler that writes the chunk as it was read (no pipe() machinery,
// no copy), the socket handlers are shared functions reading their state off the socket (no
// closures per connection), the dial is synchronous when the picker answers at once (no
// promise per connection), a 128 KB high-water mark keeps a full 64 KB read from reporting
// back-pressure, and the idle timeout is one coarse sweep per listener (a flag set per
// chunk) instead of a timer per socket refreshed on every read and write; the dial timeout
// likewise (a sweep while dials are pending, not socket.setTimeout, whose Timeout stays on
// the socket for its life). An idle spliced pair holds node:net's two sockets, one Pair, one
// Set entry and one listener per event on each socket (5,458 B per idle connection on this
// path: docs/benchmarks.md, "The userspace data plane vs nginx and haproxy"). Counters are plain
// fields (the metrics server reads them). Bounds: a connection beyond the shared
// ConnectionBudget is closed at once and counted in `refused`; an idle timeout closes a
// spliced pair whose both sides were silent that long; accept errors (EMFILE when the fd
// limit is reached) are counted and logged at most once per 10 s, never thrown.
import net from 'node:net';
import type { Logger } from '../../../log.ts';
import type { BalancedEndpoint } from './balancer.ts';
import { countSharedSocket, sharedRead, upstreamReadOption, useSharedReadBuffer, writeCopy } from './readbuf.ts';

export interface ForwardCounters {
  /** client connections (TCP) or sessions (UDP) accepted */
  accepted: number;
  /** client connections or datagrams that could not reach any endpoint */
  failed: number;
  /** dials that failed and were retried on another endpoint */
  retries: number;
  /** currently open spliced connections or UDP sessions */
  active: number;
  /** connections or sessions the admission hook refused (source ranges, traffic policy) */
  denied: number;
  /** connections or sessions refused because a cap was reached (maxConnections, UDP session limits, fds) */
  refused: number;
  /** connections closed by the idle timeout */
  idleClosed: number;
}

export function newCounters(): ForwardCounters {
  return { accepted: 0, failed: 0, retries: 0, active: 0, denied: 0, refused: 0, idleClosed: 0 };
}

/** Upstream's endpointDialTimeouts, a little longer: a busy node still dials local endpoints in time. */
export const DIAL_TIMEOUTS_MS = [500, 1000, 2000, 4000];

/**
 * Admission at accept time: called once per new TCP connection or UDP session with the
 * client's address (plain form, "1.2.3.4" not "::ffff:1.2.3.4") and port; false refuses it
 * (TCP: the connection is closed at once; UDP: the datagram is dropped, no session made).
 * Must be cheap and synchronous: it runs on the accept path.
 */
export type AdmitFn = (remoteAddress: string, remotePort: number) => boolean;

/**
 * Chooses the endpoint of a new connection (RoundRobinBalancer.next, or in a worker process
 * a question to the main process that owns the ClientIP affinity table).
 */
export interface EndpointPicker {
  next(clientIP: string, reset?: boolean, exclude?: ReadonlySet<string>): BalancedEndpoint | null | Promise<BalancedEndpoint | null>;
}

/**
 * A cap shared with other processes, asked by a forwarder's budget (its implementations, the
 * lease and the owner, are in src/modes/userspace/dataplane/worker-cap.ts).
 */
export interface SharedCap {
  /** a token for a new connection: true/false now, or later when kproxy's process must be asked */
  take(): boolean | Promise<boolean>;
  /** the connection that held a token closed */
  release(): void;
}

/**
 * Open client connections over every listener of a process, and the cap. Shared so that
 * maxConnections bounds the process, not each listener. max 0 = no cap.
 */
export interface ConnectionBudget {
  max: number;
  open: number;
  /**
   * A cap shared with other processes (userspace.workers > 1, src/modes/userspace/dataplane/worker-cap.ts):
   * when set it decides instead of `max`, and may answer later (after asking kproxy's process).
   */
  shared?: SharedCap;
}

export function newBudget(max = 0): ConnectionBudget {
  return { max, open: 0 };
}

export interface TcpForwarderOptions {
  host: string;
  port: number;
  balancer: EndpointPicker;
  counters: ForwardCounters;
  log: Logger;
  admit?: AdmitFn;
  dialTimeoutsMs?: number[];
  budget?: ConnectionBudget;
  /** close a spliced pair after this long without a byte either way; 0 = never */
  idleTimeoutMs?: number;
  /** an already listening server (a worker's copy of the main process's listener) */
  server?: net.Server;
}

/** "::ffff:1.2.3.4" → "1.2.3.4": affinity keys on the client's own address form. */
export function plainAddress(a: string | undefined): string {
  if (!a) return '';
  return a.startsWith('::ffff:') && a.includes('.') ? a.slice(7) : a;
}

const ACCEPT_ERROR_LOG_MS = 10_000;

/**
 * The streams' high-water mark: above the 64 KB a read returns, so a chunk the kernel takes
 * at once does not report back-pressure (with Node's 16 KB default every full read would
 * pause the reader and resume it on 'drain', a round of stream bookkeeping per chunk). It costs
 * nothing while idle: only a peer that does not keep up makes a direction buffer up to it.
 */
const HIGH_WATER_MARK = 128 * 1024;

/**
 * What both TCP forwarders (this file's on net.Socket, tcp-raw.ts's on raw handles) share:
 * the listening net.Server (bind, a worker's handed-over copy, the bound port), accept
 * errors counted and logged at most once per 10 s, and the per-connection gates in their
 * order: the process's cap, then admission (source ranges, traffic policy).
 */
export abstract class ListeningForwarder {
  balancer: EndpointPicker;
  counters: ForwardCounters;
  admit: AdmitFn | undefined;
  readonly budget: ConnectionBudget;
  acceptErrors = 0;
  protected idleMs: number;
  protected readonly server: net.Server;
  protected readonly log: Logger;
  protected readonly dialTimeouts: number[];
  protected closed = false;
  private lastAcceptErrorLog = 0;
  private sweep: NodeJS.Timeout | null = null;

  constructor(protected readonly opts: TcpForwarderOptions) {
    this.balancer = opts.balancer;
    this.counters = opts.counters;
    this.admit = opts.admit;
    this.log = opts.log;
    this.idleMs = opts.idleTimeoutMs ?? 0;
    this.budget = opts.budget ?? newBudget();
    this.dialTimeouts = opts.dialTimeoutsMs ?? DIAL_TIMEOUTS_MS;
    this.server = opts.server ?? this.createServer();
    if (opts.server) this.server.on('error', (e) => this.onServerError(e));
  }

  /** A new listening server (not called for a worker's handed-over one). */
  protected abstract createServer(): net.Server;

  /** Called once the server listens (after listen(); a handed-over server is already listening). */
  protected onListening(): void {}

  /** Binds and resolves with the bound port. */
  listen(): Promise<number> {
    if (this.opts.server) return Promise.resolve(this.port);
    return new Promise((resolve, reject) => {
      const onError = (e: Error) => reject(e);
      this.server.once('error', onError);
      this.server.listen({ host: this.opts.host, port: this.opts.port, ipv6Only: this.opts.host === '::', backlog: 4096 }, () => {
        this.server.off('error', onError);
        this.server.on('error', (e) => this.onServerError(e));
        this.onListening();
        resolve((this.server.address() as net.AddressInfo).port);
      });
    });
  }

  /** The listening server (the main process hands it to its workers). */
  get listener(): net.Server {
    return this.server;
  }

  get port(): number {
    const a = this.server.address();
    return a && typeof a === 'object' ? a.port : 0;
  }

  /** Stops accepting; spliced connections carry on until their ends close them. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.server.close();
  }

  private onServerError(e: NodeJS.ErrnoException): void {
    this.acceptError(e.code ?? e.message);
  }

  /** @internal EMFILE/ENFILE on accept: libuv already closed the connection it could not take. */
  acceptError(code: string): void {
    this.acceptErrors++;
    this.counters.refused++;
    const now = Date.now();
    if (now - this.lastAcceptErrorLog < ACCEPT_ERROR_LOG_MS) return;
    this.lastAcceptErrorLog = now;
    this.log.warn({ code, host: this.opts.host, errors: this.acceptErrors }, 'userspace TCP listener cannot accept (out of file descriptors?); connections are refused until some close');
  }

  /** closes a spliced pair whose both sides were silent idleTimeoutMs */
  get idleTimeoutMs(): number {
    return this.idleMs;
  }

  set idleTimeoutMs(ms: number) {
    if (ms === this.idleMs) return;
    this.idleMs = ms;
    this.stopSweep();
    if (ms > 0 && this.hasSpliced()) this.startSweep();
  }

  /** Some spliced pair of this listener is not over yet. */
  protected abstract hasSpliced(): boolean;

  /** One idle sweep over the spliced pairs (stops the sweep when none is left). */
  protected abstract sweepIdle(): void;

  /**
   * One coarse timer per listener instead of a timer per socket refreshed on every chunk:
   * every idleTimeout/4 (25 ms … 30 s) a pair that moved a byte since the last sweep is
   * stamped, one that did not for idleTimeout is closed (so it closes between 1 and 1.25 ×
   * idleTimeout after its last byte).
   */
  protected startSweep(): void {
    if (this.sweep) return;
    const every = Math.min(30_000, Math.max(25, Math.floor(this.idleMs / 4)));
    this.sweep = setInterval(() => this.sweepIdle(), every);
    this.sweep.unref();
  }

  protected stopSweep(): void {
    if (this.sweep) clearInterval(this.sweep);
    this.sweep = null;
  }

  /** The process's cap (when not shared with workers) is reached: the new connection is refused (counted). */
  protected overCap(): boolean {
    const b = this.budget;
    if (b.shared || b.max <= 0 || b.open < b.max) return false;
    this.counters.refused++;
    return true;
  }

  /** The admission hook refuses this client (counted). */
  protected denied(clientIP: string, port: number): boolean {
    if (!this.admit || this.admit(clientIP, port)) return false;
    this.counters.denied++;
    return true;
  }
}

export class TcpForwarder extends ListeningForwarder {
  /** spliced pairs of this listener not yet over (both ends closed) */
  private spliced = 0;
  /**
   * Client sockets from admission until they closed and, when spliced, their pair is over:
   * the one set per connection (the pair and its upstream hang off the client socket).
   */
  private readonly clients = new Set<Tagged>();
  /** upstream sockets still dialling, each with its deadline in its DIAL record */
  private readonly dialing = new Set<Tagged>();
  private dialSweep: NodeJS.Timeout | null = null;
  private readonly dialSweepMs: number;

  constructor(opts: TcpForwarderOptions) {
    super(opts);
    // A dial times out between 1 and 1.2 × its step (the sweep's period is a fifth of the shortest step).
    this.dialSweepMs = Math.min(500, Math.max(10, Math.floor(Math.min(...this.dialTimeouts) / 5)));
    if (opts.server) {
      // A server received over IPC is created without options: the accepted sockets read
      // these two fields (node:net onconnection), so set them as the constructor would.
      Object.assign(this.server, { allowHalfOpen: true, pauseOnConnect: true, highWaterMark: HIGH_WATER_MARK });
      this.server.on('connection', (c: net.Socket) => this.onClient(c));
    }
  }

  protected createServer(): net.Server {
    // pauseOnConnect: nothing is read from the client until an endpoint accepted.
    return net.createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true, highWaterMark: HIGH_WATER_MARK }, (c) => this.onClient(c));
  }

  /** Open client connections of this listener. */
  get openClients(): number {
    let n = 0;
    for (const s of this.clients) if (!s.closed) n++;
    return n;
  }

  /** Upstream sockets still dialling (for tests: the dial sweep). */
  get dialsPending(): number {
    return this.dialing.size;
  }

  /** Stops accepting and cuts every open connection. */
  destroy(): void {
    this.close();
    this.stopSweep();
    this.stopDialSweep();
    for (const c of this.clients) {
      c.destroy();
      c[PAIR]?.upstream.destroy();
    }
    for (const u of this.dialing) u.destroy();
    this.clients.clear();
    this.dialing.clear();
  }

  /** @internal a client socket that was never spliced closed */
  forget(c: Tagged): void {
    this.clients.delete(c);
  }

  private onClient(client: net.Socket): void {
    if (this.overCap()) {
      client.on('error', noop);
      client.destroy();
      return;
    }
    // The peer address straight from the handle: client.remoteAddress would keep a _peername
    // object (and its strings) on every socket for its whole life.
    let address: string | undefined;
    let remotePort = 0;
    const h = (client as unknown as { _handle?: { getpeername?: (out: PeerName) => number } })._handle;
    if (h?.getpeername && h.getpeername(PEER_NAME) === 0) {
      address = PEER_NAME.address;
      remotePort = PEER_NAME.port ?? 0;
    } else {
      address = client.remoteAddress;
      remotePort = client.remotePort ?? 0;
    }
    const clientIP = plainAddress(address);
    if (this.denied(clientIP, remotePort)) {
      client.on('error', noop);
      client.destroy();
      return;
    }
    const budget = this.budget;
    const room = budget.shared?.take() ?? true;
    if (room === true) return this.start(clientIP, client);
    client.on('error', noop);
    if (room === false) return this.refuseShared(client);
    // The client stays paused (pauseOnConnect) while kproxy's process is asked for room.
    void room.then((ok) => {
      if (!ok) this.refuseShared(client);
      else if (client.destroyed) budget.shared!.release();
      else this.start(clientIP, client);
    });
  }

  private refuseShared(client: net.Socket): void {
    this.counters.refused++;
    client.destroy();
  }

  private start(clientIP: string, client: net.Socket): void {
    const budget = this.budget;
    budget.open++;
    this.counters.accepted++;
    const c = client as Tagged;
    c[OWNER] = this;
    this.clients.add(c);
    client.on('error', onSocketError);
    client.on('close', onClientClose);
    this.dial(c, clientIP, 0, undefined);
  }

  /**
   * One dial attempt to the endpoint the picker chooses (synchronously when it can: no
   * promise per connection unless the picker is remote); a failure retries on a distinct
   * endpoint at the next timeout step, forgetting affinity, as upstream's tryConnect.
   */
  private dial(client: Tagged, clientIP: string, attempt: number, tried: Set<string> | undefined): void {
    if (attempt >= this.dialTimeouts.length || client.destroyed) return this.dialFailed(client);
    let ep: BalancedEndpoint | null | Promise<BalancedEndpoint | null>;
    try {
      ep = this.balancer.next(clientIP, attempt > 0, tried);
    } catch (e) {
      this.log.error({ err: e }, 'userspace endpoint choice failed');
      ep = null;
    }
    if (ep instanceof Promise) {
      ep.then(
        (e) => this.dialTo(client, clientIP, e, attempt, tried),
        (e: unknown) => {
          this.log.error({ err: e }, 'userspace endpoint choice failed');
          this.dialFailed(client);
        },
      );
      return;
    }
    this.dialTo(client, clientIP, ep, attempt, tried);
  }

  private dialTo(client: Tagged, clientIP: string, ep: BalancedEndpoint | null, attempt: number, tried: Set<string> | undefined): void {
    if (!ep || client.destroyed) return this.dialFailed(client);
    let up: Tagged;
    try {
      // One options object for every dial (node:net copies what it keeps).
      UPSTREAM.host = ep.ip;
      UPSTREAM.port = ep.port;
      up = net.connect(UPSTREAM) as Tagged;
    } catch (e) {
      // EMFILE can surface synchronously: a failed dial, not a crash.
      return this.dialRetry(client, clientIP, ep, attempt, tried, e as Error);
    }
    countSharedSocket();
    // The dial timeout is the listener's dial sweep, not socket.setTimeout: that would leave
    // a Timeout and a bound function on every upstream socket for its whole life.
    up[DIAL] = { client, clientIP, ep, attempt, tried, deadline: Date.now() + this.dialTimeouts[attempt] };
    up[OWNER] = this;
    this.dialing.add(up);
    if (!this.dialSweep) this.startDialSweep();
    // Plain on(), not once(): no wrapper per registration; each fires once in a dial anyway.
    up.on('error', onUpstreamError);
    up.on('connect', onDialConnect);
  }

  /** @internal a dial settled (connected or failed): no longer the sweep's */
  dialSettled(up: Tagged): void {
    this.dialing.delete(up);
  }

  /** One timer per listener while dials are pending, stopped by the first sweep that finds none. */
  private startDialSweep(): void {
    this.dialSweep = setInterval(() => this.sweepDials(), this.dialSweepMs);
    this.dialSweep.unref();
  }

  private stopDialSweep(): void {
    if (this.dialSweep) clearInterval(this.dialSweep);
    this.dialSweep = null;
  }

  private sweepDials(): void {
    if (this.dialing.size === 0) return this.stopDialSweep();
    const now = Date.now();
    // A retry adds its new socket to the set while this loop runs: its deadline is ahead.
    for (const up of this.dialing) {
      const d = up[DIAL];
      if (!d) {
        this.dialing.delete(up);
        continue;
      }
      if (now < d.deadline) continue;
      const ms = this.dialTimeouts[d.attempt];
      dialFailedOn(up, d, Object.assign(new Error(`dial ${d.ep.key} timed out after ${ms}ms`), { code: 'ETIMEDOUT' }));
    }
  }

  /** @internal a dial failed (refused, timed out): count it and try the next endpoint */
  dialRetry(client: Tagged, clientIP: string, ep: BalancedEndpoint, attempt: number, tried: Set<string> | undefined, err: Error): void {
    this.counters.retries++;
    this.log.debug({ endpoint: ep.key, err: err.message }, 'userspace dial failed, trying the next endpoint');
    (tried ??= new Set()).add(ep.key);
    this.dial(client, clientIP, attempt + 1, tried);
  }

  private dialFailed(client: Tagged): void {
    this.counters.failed++;
    // A reset, as the kernel modes' REJECT: the client learns at once there is no endpoint.
    if (!client.destroyed) client.resetAndDestroy();
  }

  /** @internal both ends connected: forward each direction as it arrives */
  splice(client: Tagged, upstream: Tagged): void {
    if (client.destroyed || !this.clients.has(client)) {
      upstream.destroy();
      return;
    }
    this.counters.active++;
    this.spliced++;
    const pair: Pair = { client, upstream, counters: this.counters, ends: 0, active: true, lastActiveMs: coarseNow };
    client[PAIR] = pair;
    upstream[PAIR] = pair;
    client[PEER] = upstream;
    upstream[PEER] = client;
    upstream.on('close', onUpstreamClose);
    // Each direction by hand rather than pipe(): a chunk is written as it was read, and a
    // write the peer cannot take at once pauses the reader until the peer drains. No
    // per-chunk work beyond that and one field store for the idle sweep.
    // Both sides read into the process's one shared read buffer (no 64 KB malloc per read,
    // see readbuf.ts); where this Node cannot, the 'data' path.
    if (!useSharedReadBuffer(client, onRead)) client.on('data', onData);
    if (!sharedRead) upstream.on('data', onData);
    client.on('drain', onDrain);
    upstream.on('drain', onDrain);
    onEndOnly(client);
    onEndOnly(upstream);
    if (this.idleMs > 0) this.startSweep();
    client.resume();
  }

  /** @internal one end of a spliced pair closed */
  pairEnded(pair: Pair): void {
    if (++pair.ends !== 2) return;
    // The counters the pair was counted in, even if a sync gave the listener new ones since.
    pair.counters.active--;
    this.spliced--;
    this.clients.delete(pair.client);
  }

  protected hasSpliced(): boolean {
    return this.spliced > 0;
  }

  protected sweepIdle(): void {
    coarseNow = Date.now() - CLOCK_ZERO;
    if (this.spliced === 0 || this.idleMs <= 0) return this.stopSweep();
    for (const c of this.clients) {
      const p = c[PAIR];
      // Not spliced yet, or over (both ends closed: it leaves the set in pairEnded).
      if (!p || p.ends === 2) continue;
      if (p.active) {
        p.active = false;
        p.lastActiveMs = coarseNow;
      } else if (coarseNow - p.lastActiveMs >= this.idleMs) {
        this.counters.idleClosed++;
        p.client.destroy();
        p.upstream.destroy();
      }
    }
  }
}

/** A spliced client and upstream connection. */
interface Pair {
  client: Tagged;
  upstream: Tagged;
  counters: ForwardCounters;
  /** sides closed (2: the pair is over) */
  ends: number;
  /** a byte moved since the last idle sweep */
  active: boolean;
  lastActiveMs: number;
}

interface Dial {
  client: Tagged;
  clientIP: string;
  ep: BalancedEndpoint;
  attempt: number;
  tried: Set<string> | undefined;
  /** Date.now() after which the dial sweep gives up on this attempt */
  deadline: number;
}

/** What a handle's getpeername() fills in (reused: one object for every accept). */
interface PeerName {
  address?: string;
  port?: number;
  family?: string;
}
const PEER_NAME: PeerName = {};

/**
 * The options of every upstream dial (host and port set per dial). highWaterMark reaches the
 * socket's Duplex options (the types of connect() omit it); onread, where this Node has it,
 * makes the socket read into the shared buffer (readbuf.ts).
 */
const UPSTREAM = {
  host: '',
  port: 0,
  allowHalfOpen: true,
  noDelay: true,
  highWaterMark: HIGH_WATER_MARK,
  ...upstreamReadOption(onRead),
} as net.TcpNetConnectOpts;

/**
 * The clock of the idle sweeps (a pair's stamps need no more precision than a sweep), in ms
 * since this module loaded: a small integer that V8 keeps in the pair itself, where a
 * Date.now() value would be a 16-byte heap number per pair.
 */
const CLOCK_ZERO = Date.now();
let coarseNow = 0;

const OWNER = Symbol('kproxy.forwarder');
const PAIR = Symbol('kproxy.pair');
const PEER = Symbol('kproxy.peer');
const DIAL = Symbol('kproxy.dial');
type Tagged = net.Socket & { [OWNER]?: TcpForwarder; [PAIR]?: Pair; [PEER]?: Tagged; [DIAL]?: Dial };

// The socket handlers are shared functions reading their state off the socket: no closures
// per connection.

/** A read into the shared buffer: its bytes are copied out (readbuf.ts) and written to the peer. */
function onRead(this: Tagged, n: number, buf: Buffer): void {
  const peer = this[PEER];
  if (!peer) {
    // Reading starts only once spliced; anything else is a bug, not a byte to lose silently.
    this.destroy(new Error('read before the pair was spliced'));
    return;
  }
  this[PAIR]!.active = true;
  if (!writeCopy(peer, buf, n)) this.pause();
}

function onData(this: Tagged, chunk: Buffer): void {
  this[PAIR]!.active = true;
  if (!this[PEER]!.write(chunk)) this.pause();
}

function onDrain(this: Tagged): void {
  this[PEER]!.resume();
}

/** Each direction's FIN on its own (allowHalfOpen): a client that shut its write side still gets the reply. */
function onEnd(this: Tagged): void {
  this[PEER]!.end();
}

/** An error on one side ends both. */
function onSocketError(this: Tagged): void {
  this.destroy();
  this[PEER]?.destroy();
}

function onClientClose(this: Tagged, hadError: boolean): void {
  const fwd = this[OWNER]!;
  fwd.budget.open--;
  fwd.budget.shared?.release();
  const pair = this[PAIR];
  if (!pair) return fwd.forget(this);
  // A reset ends the other side; a clean close leaves the peer to flush.
  if (hadError) pair.upstream.destroy();
  fwd.pairEnded(pair);
}

function onUpstreamClose(this: Tagged, hadError: boolean): void {
  const fwd = this[OWNER]!;
  const pair = this[PAIR]!;
  if (hadError) pair.client.destroy();
  fwd.pairEnded(pair);
}

function onDialConnect(this: Tagged): void {
  const d = this[DIAL];
  if (!d) return;
  this[DIAL] = undefined;
  const fwd = this[OWNER]!;
  fwd.dialSettled(this);
  fwd.splice(d.client, this);
}

/** An upstream socket's one error handler: while dialling a failed dial, once spliced the end of both sides. */
function onUpstreamError(this: Tagged, e: Error): void {
  const d = this[DIAL];
  if (d) dialFailedOn(this, d, e);
  else onSocketError.call(this);
}

/** A dial attempt failed (error or timeout): its socket goes, the next endpoint is tried. */
function dialFailedOn(up: Tagged, d: Dial, e: Error): void {
  up[DIAL] = undefined;
  const fwd = up[OWNER]!;
  fwd.dialSettled(up);
  up.destroy();
  fwd.dialRetry(d.client, d.clientIP, d.ep, d.attempt, d.tried, e);
}

/**
 * Listens for 'end' with onEnd as the only listener: node:net's own (onReadableStreamEnd)
 * does nothing on an allowHalfOpen socket, and two listeners would cost an array per socket.
 */
function onEndOnly(s: Tagged): void {
  const own = (s as unknown as { _events?: Record<string, unknown> })._events?.end;
  if (s.allowHalfOpen && typeof own === 'function' && own.name === 'onReadableStreamEnd') s.removeListener('end', own as () => void);
  s.on('end', onEnd);
}


function noop(): void {}

