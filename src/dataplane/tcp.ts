// One TCP listener of the userspace proxy: accepts client connections, dials an endpoint
// chosen by the balancer (retrying refused or timed-out dials on the next endpoint, as
// upstream's tryConnect), then splices the two sockets with pipe(): back-pressure through
// pause/resume, and each direction's FIN forwarded on its own (allowHalfOpen) so a client
// that shuts its write side still gets the whole reply.
//
// The hot path is kept cheap (bench/userspace-profile.ts: the time goes to the write and
// connect syscalls, not to JavaScript): no promise or closure per dial attempt beyond the
// socket's own listeners, counters are plain fields (the metrics server reads them), and
// pipe() moves each chunk as it was read (64 KB reads, no copy). Bounds: a connection
// beyond the shared ConnectionBudget is closed at once and counted in `refused`; an
// idle timeout closes a spliced pair whose both sides were silent that long; accept errors
// (EMFILE when the fd limit is reached) are counted and logged at most once per 10 s,
// never thrown.
import net from 'node:net';
import type { Logger } from '../log.ts';
import type { BalancedEndpoint } from './balancer.ts';
import type { SharedCap } from './worker-cap.ts';

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
 * Open client connections over every listener of a process, and the cap. Shared so that
 * maxConnections bounds the process, not each listener. max 0 = no cap.
 */
export interface ConnectionBudget {
  max: number;
  open: number;
  /**
   * A cap shared with other processes (userspace.workers > 1, src/dataplane/worker-cap.ts):
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

export class TcpForwarder {
  balancer: EndpointPicker;
  counters: ForwardCounters;
  admit: AdmitFn | undefined;
  idleTimeoutMs: number;
  readonly budget: ConnectionBudget;
  private readonly server: net.Server;
  private readonly open = new Set<net.Socket>();
  private readonly log: Logger;
  private readonly dialTimeouts: number[];
  private closed = false;
  private lastAcceptErrorLog = 0;
  acceptErrors = 0;

  constructor(private readonly opts: TcpForwarderOptions) {
    this.balancer = opts.balancer;
    this.counters = opts.counters;
    this.admit = opts.admit;
    this.log = opts.log;
    this.idleTimeoutMs = opts.idleTimeoutMs ?? 0;
    this.budget = opts.budget ?? newBudget();
    this.dialTimeouts = opts.dialTimeoutsMs ?? DIAL_TIMEOUTS_MS;
    const onClient = (c: net.Socket) => this.onClient(c);
    if (opts.server) {
      // A server received over IPC is created without options: the accepted sockets read
      // these two fields (node:net onconnection), so set them as the constructor would.
      this.server = opts.server;
      Object.assign(this.server, { allowHalfOpen: true, pauseOnConnect: true });
      this.server.on('connection', onClient);
      this.server.on('error', (e) => this.onServerError(e));
    } else {
      // pauseOnConnect: nothing is read from the client until an endpoint accepted.
      this.server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true, noDelay: true }, onClient);
    }
  }

  /** Binds and resolves with the bound port. */
  listen(): Promise<number> {
    if (this.opts.server) return Promise.resolve(this.port);
    return new Promise((resolve, reject) => {
      const onError = (e: Error) => reject(e);
      this.server.once('error', onError);
      this.server.listen({ host: this.opts.host, port: this.opts.port, ipv6Only: this.opts.host === '::', backlog: 4096 }, () => {
        this.server.off('error', onError);
        this.server.on('error', (e) => this.onServerError(e));
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

  /** Open client connections of this listener. */
  get openClients(): number {
    let n = 0;
    for (const s of this.open) if ((s as TaggedSocket)[CLIENT]) n++;
    return n;
  }

  /** Stops accepting; spliced connections carry on until their ends close them. */
  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.server.close();
  }

  /** Stops accepting and cuts every open connection. */
  destroy(): void {
    this.close();
    for (const s of this.open) s.destroy();
    this.open.clear();
  }

  private onServerError(e: NodeJS.ErrnoException): void {
    // EMFILE/ENFILE on accept: libuv already closed the connection it could not take.
    this.acceptErrors++;
    this.counters.refused++;
    const now = Date.now();
    if (now - this.lastAcceptErrorLog < ACCEPT_ERROR_LOG_MS) return;
    this.lastAcceptErrorLog = now;
    this.log.warn({ err: e.message, code: e.code, host: this.opts.host, errors: this.acceptErrors }, 'userspace TCP listener cannot accept (out of file descriptors?); connections are refused until some close');
  }

  private onClient(client: net.Socket): void {
    const budget = this.budget;
    if (!budget.shared && budget.max > 0 && budget.open >= budget.max) {
      this.counters.refused++;
      client.on('error', noop);
      client.destroy();
      return;
    }
    const clientIP = plainAddress(client.remoteAddress);
    if (this.admit && !this.admit(clientIP, client.remotePort ?? 0)) {
      this.counters.denied++;
      client.on('error', noop);
      client.destroy();
      return;
    }
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
    (client as TaggedSocket)[CLIENT] = true;
    this.open.add(client);
    client.on('error', destroySelf);
    client.once('close', () => {
      budget.open--;
      budget.shared?.release();
      this.open.delete(client);
    });
    void this.dial(clientIP, client);
  }

  /** Tries distinct endpoints, at most one per timeout step, forgetting affinity after a failure. */
  private async dial(clientIP: string, client: net.Socket): Promise<void> {
    let tried: Set<string> | undefined;
    for (let attempt = 0; attempt < this.dialTimeouts.length; attempt++) {
      let ep: BalancedEndpoint | null;
      try {
        ep = await this.balancer.next(clientIP, attempt > 0, tried);
      } catch (e) {
        this.log.error({ err: e }, 'userspace endpoint choice failed');
        ep = null;
      }
      if (!ep || client.destroyed) break;
      (tried ??= new Set()).add(ep.key);
      const upstream = await connectOnce(ep, this.dialTimeouts[attempt]);
      if (upstream instanceof net.Socket) {
        if (client.destroyed || this.closedAndDestroyed(client)) {
          upstream.destroy();
          return;
        }
        this.splice(client, upstream);
        return;
      }
      this.counters.retries++;
      this.log.debug({ endpoint: ep.key, err: upstream.message }, 'userspace dial failed, trying the next endpoint');
      if (client.destroyed) break;
    }
    this.counters.failed++;
    // A reset, as the kernel modes' REJECT: the client learns at once there is no endpoint.
    if (!client.destroyed) client.resetAndDestroy();
  }

  private closedAndDestroyed(client: net.Socket): boolean {
    return !this.open.has(client);
  }

  private splice(client: net.Socket, upstream: net.Socket): void {
    const counters = this.counters;
    counters.active++;
    this.open.add(upstream);
    upstream.setNoDelay(true);
    let closed = 0;
    const onClose = () => {
      if (++closed === 2) counters.active--;
    };
    // An error or reset on one side ends the other; a clean close leaves the peer to flush.
    client.on('close', (hadError: boolean) => {
      onClose();
      if (hadError) upstream.destroy();
    });
    upstream.on('close', (hadError: boolean) => {
      this.open.delete(upstream);
      onClose();
      if (hadError) client.destroy();
    });
    client.removeListener('error', destroySelf);
    client.on('error', () => {
      client.destroy();
      upstream.destroy();
    });
    upstream.on('error', () => {
      upstream.destroy();
      client.destroy();
    });
    if (this.idleTimeoutMs > 0) {
      // Each socket's timer is refreshed by its own reads and writes; the pair is idle when
      // one of them saw nothing either way, since every byte crosses both.
      const onIdle = () => {
        counters.idleClosed++;
        client.destroy();
        upstream.destroy();
      };
      client.setTimeout(this.idleTimeoutMs, onIdle);
      upstream.setTimeout(this.idleTimeoutMs, onIdle);
    }
    client.pipe(upstream);
    upstream.pipe(client);
  }
}

const CLIENT = Symbol('kproxy.client');
type TaggedSocket = net.Socket & { [CLIENT]?: boolean };

function noop(): void {}

function destroySelf(this: net.Socket): void {
  this.destroy();
}

/** One dial: the connected socket, or the error (a refused or timed-out endpoint). */
function connectOnce(ep: BalancedEndpoint, timeoutMs: number): Promise<net.Socket | Error> {
  return new Promise((resolve) => {
    let s: net.Socket;
    try {
      s = net.connect({ host: ep.ip, port: ep.port, allowHalfOpen: true, noDelay: true });
    } catch (e) {
      // EMFILE can surface synchronously: a failed dial, not a crash.
      resolve(e as Error);
      return;
    }
    const onTimeout = () => onError(Object.assign(new Error(`dial ${ep.key} timed out after ${timeoutMs}ms`), { code: 'ETIMEDOUT' }));
    const onError = (e: Error) => {
      s.setTimeout(0);
      s.removeListener('timeout', onTimeout);
      s.destroy();
      resolve(e);
    };
    s.setTimeout(timeoutMs, onTimeout);
    s.once('error', onError);
    s.once('connect', () => {
      s.setTimeout(0);
      s.removeListener('timeout', onTimeout);
      s.removeListener('error', onError);
      resolve(s);
    });
  });
}
