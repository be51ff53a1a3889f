// One UDP listener of the userspace proxy. UDP has no connections, so a "session" is one
// client address (ip:port) on one listening socket: its own upstream socket to the endpoint
// the balancer chose, kept while traffic flows in either direction and closed after
// idleMs of silence (upstream's udpIdleTimeout, 250ms by default). Replies are sent back
// through the listening socket the request came in on, so the client sees them from the
// service address (directly, or after conntrack undoes the REDIRECT).
import dgram from 'node:dgram';
import { isIPv6 } from 'node:net';
import type { Logger } from '../../../log.ts';
import type { BalancedEndpoint, RoundRobinBalancer } from './balancer.ts';
import { plainAddress, type AdmitFn, type ForwardCounters } from './tcp.ts';

/** Bounds the sockets one listener may open for a flood of client addresses. */
export const MAX_UDP_SESSIONS = 4096;

/** A session as the shared budget sees it: who owns it, and how to end it. */
interface BudgetEntry {
  clientIP: string;
  end(): void;
}

/**
 * UDP sessions over every listener of a process: at most `max` in total and `perClient`
 * per client IP (beyond that a client's new session is refused). When the total is full, a
 * newcomer holding fewer sessions than the biggest holder takes that holder's oldest
 * session: one client cannot keep the others out.
 */
export class UdpSessionBudget {
  total = 0;
  private readonly byClient = new Map<string, Set<BudgetEntry>>();

  constructor(
    public max: number,
    public perClient: number,
  ) {}

  sessionsOf(clientIP: string): number {
    return this.byClient.get(clientIP)?.size ?? 0;
  }

  /** Makes room for one more session of clientIP; false when it must be refused. */
  admit(clientIP: string): boolean {
    const mine = this.sessionsOf(clientIP);
    if (mine >= this.perClient) return false;
    if (this.total < this.max) return true;
    let biggest: Set<BudgetEntry> | undefined;
    for (const set of this.byClient.values()) if (!biggest || set.size > biggest.size) biggest = set;
    if (!biggest || biggest.size <= mine + 1) return false;
    const oldest = biggest.values().next().value;
    oldest?.end();
    return this.total < this.max;
  }

  add(e: BudgetEntry): void {
    let set = this.byClient.get(e.clientIP);
    if (!set) this.byClient.set(e.clientIP, (set = new Set()));
    set.add(e);
    this.total++;
  }

  remove(e: BudgetEntry): void {
    const set = this.byClient.get(e.clientIP);
    if (!set?.delete(e)) return;
    this.total--;
    if (set.size === 0) this.byClient.delete(e.clientIP);
  }
}

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
  /** shared over the process's listeners; default: one of this listener's own */
  budget?: UdpSessionBudget;
}

/** newSession refused the datagram and counted why (denied or refused) */
const COUNTED = Symbol("counted");

interface Session extends BudgetEntry {
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
  readonly budget: UdpSessionBudget;
  admit: AdmitFn | undefined;

  constructor(private readonly opts: UdpForwarderOptions) {
    this.admit = opts.admit;
    this.budget = opts.budget ?? new UdpSessionBudget(opts.maxSessions ?? MAX_UDP_SESSIONS, opts.maxSessions ?? MAX_UDP_SESSIONS);
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
      if (created === COUNTED) return;
      if (!created) {
        this.counters.failed++;
        return;
      }
      s = created;
    }
    s.lastActiveMs = Date.now();
    s.upstream.send(msg, s.endpoint.port, s.endpoint.ip);
  }

  private newSession(index: number, key: string, rinfo: dgram.RemoteInfo): Session | typeof COUNTED | null {
    const clientIP = plainAddress(rinfo.address);
    if (this.admit && !this.admit(clientIP, rinfo.port)) {
      this.counters.denied++;
      return COUNTED;
    }
    if (this.sessions.size >= (this.opts.maxSessions ?? MAX_UDP_SESSIONS) || !this.budget.admit(clientIP)) {
      this.counters.refused++;
      return COUNTED;
    }
    const ep = this.balancer.next(clientIP);
    if (!ep) return null;
    let upstream: dgram.Socket;
    try {
      upstream = dgram.createSocket(isIPv6(ep.ip) ? 'udp6' : 'udp4');
    } catch (e) {
      // out of fds: this datagram is lost, kproxy is not
      this.log.debug({ err: (e as Error).message }, 'userspace UDP session socket failed');
      return null;
    }
    const s: Session = {
      key, clientIP, endpoint: ep, upstream, lastActiveMs: Date.now(),
      timer: setTimeout(() => this.checkIdle(s), this.idleMs),
      end: () => this.endSession(s),
    };
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
    this.budget.add(s);
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
    this.budget.remove(s);
    this.counters.active--;
    try {
      s.upstream.close();
    } catch {
      // already closed after an error
    }
  }
}
