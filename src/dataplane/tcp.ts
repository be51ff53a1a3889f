// One TCP listener of the userspace proxy: accepts client connections, dials an endpoint
// chosen by the balancer (retrying refused or timed-out dials on the next endpoint, as
// upstream's tryConnect), then splices the two sockets with pipe(): back-pressure through
// pause/resume, and each direction's FIN forwarded on its own (allowHalfOpen) so a client
// that shuts its write side still gets the whole reply.
import net from 'node:net';
import type { Logger } from '../log.ts';
import type { BalancedEndpoint, RoundRobinBalancer } from './balancer.ts';

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
}

export function newCounters(): ForwardCounters {
  return { accepted: 0, failed: 0, retries: 0, active: 0, denied: 0 };
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

export interface TcpForwarderOptions {
  admit?: AdmitFn;
  host: string;
  port: number;
  balancer: RoundRobinBalancer;
  counters: ForwardCounters;
  log: Logger;
  dialTimeoutsMs?: number[];
}

/** "::ffff:1.2.3.4" → "1.2.3.4": affinity keys on the client's own address form. */
export function plainAddress(a: string | undefined): string {
  if (!a) return '';
  return a.startsWith('::ffff:') && a.includes('.') ? a.slice(7) : a;
}

function dialOnce(ep: BalancedEndpoint, timeoutMs: number): Promise<net.Socket> {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: ep.ip, port: ep.port, allowHalfOpen: true });
    const timer = setTimeout(() => {
      s.destroy();
      reject(Object.assign(new Error(`dial ${ep.key} timed out after ${timeoutMs}ms`), { code: 'ETIMEDOUT' }));
    }, timeoutMs);
    s.once('connect', () => {
      clearTimeout(timer);
      s.removeAllListeners('error');
      resolve(s);
    });
    s.once('error', (e) => {
      clearTimeout(timer);
      s.destroy();
      reject(e);
    });
  });
}

export class TcpForwarder {
  balancer: RoundRobinBalancer;
  counters: ForwardCounters;
  private readonly server: net.Server;
  private readonly open = new Set<net.Socket>();
  private readonly log: Logger;
  private readonly dialTimeouts: number[];
  private closed = false;

  constructor(private readonly opts: TcpForwarderOptions) {
    this.balancer = opts.balancer;
    this.counters = opts.counters;
    this.log = opts.log;
    this.dialTimeouts = opts.dialTimeoutsMs ?? DIAL_TIMEOUTS_MS;
    // pauseOnConnect: nothing is read from the client until an endpoint accepted.
    this.server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true }, (c) => this.onClient(c));
  }

  /** Binds and resolves with the bound port. */
  listen(): Promise<number> {
    return new Promise((resolve, reject) => {
      const onError = (e: Error) => reject(e);
      this.server.once('error', onError);
      this.server.listen({ host: this.opts.host, port: this.opts.port, ipv6Only: this.opts.host === '::' }, () => {
        this.server.off('error', onError);
        this.server.on('error', (e) => this.log.error({ err: e, host: this.opts.host }, 'userspace TCP listener error'));
        resolve((this.server.address() as net.AddressInfo).port);
      });
    });
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

  /** Stops accepting and cuts every open connection. */
  destroy(): void {
    this.close();
    for (const s of this.open) s.destroy();
    this.open.clear();
  }

  private onClient(client: net.Socket): void {
    const clientIP = plainAddress(client.remoteAddress);
    if (this.opts.admit && !this.opts.admit(clientIP, client.remotePort ?? 0)) {
      this.counters.denied++;
      client.on('error', () => {});
      client.destroy();
      return;
    }
    this.counters.accepted++;
    client.on('error', () => client.destroy());
    this.open.add(client);
    client.once('close', () => this.open.delete(client));
    this.dial(clientIP, client).then(
      (upstream) => {
        if (!upstream) {
          this.counters.failed++;
          // A reset, as the kernel modes' REJECT: the client learns at once there is no endpoint.
          if (!client.destroyed) client.resetAndDestroy();
          return;
        }
        if (client.destroyed || this.closedAndDestroyed(client)) {
          upstream.destroy();
          return;
        }
        this.splice(client, upstream);
      },
      (e) => {
        this.counters.failed++;
        this.log.error({ err: e }, 'userspace TCP dial failed unexpectedly');
        client.destroy();
      },
    );
  }

  private closedAndDestroyed(client: net.Socket): boolean {
    return !this.open.has(client);
  }

  /** Tries distinct endpoints, at most one per timeout step, forgetting affinity after a failure. */
  private async dial(clientIP: string, client: net.Socket): Promise<net.Socket | null> {
    const tried = new Set<string>();
    for (let attempt = 0; attempt < this.dialTimeouts.length; attempt++) {
      const ep = this.balancer.next(clientIP, attempt > 0, tried);
      if (!ep) return null;
      tried.add(ep.key);
      try {
        return await dialOnce(ep, this.dialTimeouts[attempt]);
      } catch (e) {
        this.counters.retries++;
        this.log.debug({ endpoint: ep.key, err: (e as Error).message }, 'userspace dial failed, trying the next endpoint');
      }
      if (client.destroyed) return null;
    }
    return null;
  }

  private splice(client: net.Socket, upstream: net.Socket): void {
    this.counters.active++;
    this.open.add(upstream);
    client.setNoDelay(true);
    upstream.setNoDelay(true);
    let closed = 0;
    const onClose = (peer: net.Socket, self: net.Socket) => (hadError: boolean) => {
      this.open.delete(self);
      // An error or reset on one side ends the other; a clean close leaves the peer to flush.
      if (hadError) peer.destroy();
      if (++closed === 2) this.counters.active--;
    };
    client.on('close', onClose(upstream, client));
    upstream.on('error', () => upstream.destroy());
    upstream.on('close', onClose(client, upstream));
    client.on('error', () => upstream.destroy());
    upstream.on('error', () => client.destroy());
    client.pipe(upstream);
    upstream.pipe(client);
  }
}
