// One UDP listener of the userspace proxy. UDP has no connections, so a "session" is one
// client address (ip:port) on one listening socket: its own upstream socket to the endpoint
// the balancer chose, kept while traffic flows in either direction and closed after
// idleMs of silence (upstream's udpIdleTimeout, 250ms by default). Replies are sent back
// through the listening socket the request came in on, so the client sees them from the
// service address (directly, or after conntrack undoes the REDIRECT).
import dgram from 'node:dgram';
import { isIPv6 } from 'node:net';
import type { Logger } from '../log.ts';
import type { BalancedEndpoint, RoundRobinBalancer } from './balancer.ts';
import { plainAddress, type AdmitFn, type ForwardCounters } from './tcp.ts';

/** Bounds the sockets one listener may open for a flood of client addresses. */
export const MAX_UDP_SESSIONS = 4096;

export interface UdpForwarderOptions {
  /** called once per new session (client ip:port); false drops the datagram */
  admit?: AdmitFn;
  /** first host gets `port` (0 = ephemeral); the rest bind the same port */
  hosts: string[];
  port: number;
  balancer: RoundRobinBalancer;
  counters: ForwardCounters;
  idleMs: number;
  log: Logger;
  maxSessions?: number;
}

const DENIED = Symbol('denied');

interface Session {
  key: string;
  endpoint: BalancedEndpoint;
  upstream: dgram.Socket;
  lastActiveMs: number;
  timer: NodeJS.Timeout;
}

export class UdpForwarder {
  balancer: RoundRobinBalancer;
  counters: ForwardCounters;
  idleMs: number;
  private readonly sockets: dgram.Socket[] = [];
  private readonly sessions = new Map<string, Session>();
  private readonly log: Logger;
  private boundPort = 0;
  private closed = false;

  constructor(private readonly opts: UdpForwarderOptions) {
    this.balancer = opts.balancer;
    this.counters = opts.counters;
    this.idleMs = opts.idleMs;
    this.log = opts.log;
  }

  get port(): number {
    return this.boundPort;
  }

  get sessionCount(): number {
    return this.sessions.size;
  }

  /** Binds every host on one port and resolves with it. */
  async listen(): Promise<number> {
    let port = this.opts.port;
    const shared = this.opts.hosts.length > 1;
    try {
      for (const host of this.opts.hosts) {
        const sock = dgram.createSocket({ type: isIPv6(host) ? 'udp6' : 'udp4', reuseAddr: shared, ipv6Only: host === '::' });
        await new Promise<void>((resolve, reject) => {
          sock.once('error', reject);
          sock.bind({ address: host, port, exclusive: true }, () => {
            sock.off('error', reject);
            resolve();
          });
        });
        port = sock.address().port;
        const index = this.sockets.length;
        this.sockets.push(sock);
        sock.on('message', (msg, rinfo) => this.onDatagram(index, msg, rinfo));
        sock.on('error', (e) => this.log.error({ err: e, host }, 'userspace UDP listener error'));
      }
    } catch (e) {
      this.destroy();
      throw e;
    }
    this.boundPort = port;
    return port;
  }

  /** Closes the listening sockets and every session (datagrams have nothing in flight to finish). */
  destroy(): void {
    if (this.closed) return;
    this.closed = true;
    for (const s of this.sessions.values()) this.endSession(s);
    for (const sock of this.sockets) sock.close();
  }

  close(): void {
    this.destroy();
  }

  private onDatagram(index: number, msg: Buffer, rinfo: dgram.RemoteInfo): void {
    const key = `${index}|${rinfo.address}|${rinfo.port}`;
    let s = this.sessions.get(key);
    if (!s) {
      const created = this.newSession(index, key, rinfo);
      if (created === DENIED) return;
      if (!created) {
        this.counters.failed++;
        return;
      }
      s = created;
    }
    s.lastActiveMs = Date.now();
    s.upstream.send(msg, s.endpoint.port, s.endpoint.ip);
  }

  private newSession(index: number, key: string, rinfo: dgram.RemoteInfo): Session | typeof DENIED | null {
    if (this.sessions.size >= (this.opts.maxSessions ?? MAX_UDP_SESSIONS)) return null;
    const clientIP = plainAddress(rinfo.address);
    if (this.opts.admit && !this.opts.admit(clientIP, rinfo.port)) {
      this.counters.denied++;
      return DENIED;
    }
    const ep = this.balancer.next(clientIP);
    if (!ep) return null;
    const upstream = dgram.createSocket(isIPv6(ep.ip) ? 'udp6' : 'udp4');
    const s: Session = { key, endpoint: ep, upstream, lastActiveMs: Date.now(), timer: setTimeout(() => this.checkIdle(s), this.idleMs) };
    upstream.on('message', (reply, from) => {
      if (from.address !== ep.ip || from.port !== ep.port) return;
      s.lastActiveMs = Date.now();
      this.sockets[index]?.send(reply, rinfo.port, rinfo.address);
    });
    upstream.on('error', (e) => {
      this.log.debug({ endpoint: ep.key, err: e.message }, 'userspace UDP session error');
      this.endSession(s);
    });
    this.sessions.set(key, s);
    this.counters.accepted++;
    this.counters.active++;
    return s;
  }

  /** One timer per session, re-armed for the remaining idle time instead of reset on every datagram. */
  private checkIdle(s: Session): void {
    const idleFor = Date.now() - s.lastActiveMs;
    if (idleFor >= this.idleMs) {
      this.endSession(s);
      return;
    }
    s.timer = setTimeout(() => this.checkIdle(s), this.idleMs - idleFor);
  }

  private endSession(s: Session): void {
    if (this.sessions.get(s.key) !== s) return;
    clearTimeout(s.timer);
    this.sessions.delete(s.key);
    this.counters.active--;
    try {
      s.upstream.close();
    } catch {
      // already closed after an error
    }
  }
}
