// Round-robin endpoint choice with optional ClientIP session affinity, as upstream's
// userspace LoadBalancerRR (pkg/proxy/userspace/roundrobin.go): one balancer per service
// port and traffic policy, affinity keyed by client IP with a sliding timeout, and a
// "reset" that forgets the affinity after a failed dial so the retry goes elsewhere.
// No sockets here; the clock is injected so tests can move time.

export interface BalancedEndpoint {
  /** "ip:port" / "[ip]:port" */
  key: string;
  ip: string;
  port: number;
}

interface Affinity {
  endpointKey: string;
  lastUsedMs: number;
}

export interface BalancerOptions {
  /** ClientIP affinity timeout in seconds; 0 = no affinity */
  stickyMaxAgeSeconds: number;
  now?: () => number;
}

/** Upper bound on remembered clients so a scan of source addresses cannot grow memory forever. */
const MAX_AFFINITY_ENTRIES = 65536;

export class RoundRobinBalancer {
  private endpoints: BalancedEndpoint[] = [];
  private index = 0;
  private readonly affinity = new Map<string, Affinity>();
  private stickyMs: number;
  private readonly now: () => number;

  constructor(opts: BalancerOptions) {
    this.stickyMs = opts.stickyMaxAgeSeconds * 1000;
    this.now = opts.now ?? Date.now;
  }

  get size(): number {
    return this.endpoints.length;
  }

  /** false: next() ignores the client's address (no ClientIP affinity), so it need not be looked up */
  get usesClientIP(): boolean {
    return this.stickyMs > 0;
  }

  list(): BalancedEndpoint[] {
    return [...this.endpoints];
  }

  setStickyMaxAge(seconds: number): void {
    const ms = seconds * 1000;
    if (ms !== this.stickyMs) this.affinity.clear();
    this.stickyMs = ms;
  }

  /**
   * Replaces the endpoint list. Affinity to an endpoint that is gone is forgotten (its open
   * connections are not ours to touch); the round-robin position is kept when possible so
   * an unrelated update does not send the next client back to the first endpoint.
   */
  setEndpoints(list: BalancedEndpoint[]): void {
    const keys = new Set(list.map((e) => e.key));
    for (const [client, a] of this.affinity) if (!keys.has(a.endpointKey)) this.affinity.delete(client);
    const same = list.length === this.endpoints.length && list.every((e, i) => e.key === this.endpoints[i].key);
    if (same) return;
    const current = this.endpoints[this.index % Math.max(1, this.endpoints.length)]?.key;
    this.endpoints = [...list];
    const at = current === undefined ? -1 : this.endpoints.findIndex((e) => e.key === current);
    this.index = at >= 0 ? at : 0;
  }

  /**
   * The endpoint for a new connection from `clientIP`. `reset` drops the client's affinity
   * (the previous choice failed); `exclude` skips endpoints already tried for this connection.
   * Null when no endpoint is available.
   */
  next(clientIP: string, reset = false, exclude?: ReadonlySet<string>): BalancedEndpoint | null {
    const n = this.endpoints.length;
    if (n === 0) return null;
    const now = this.now();
    if (this.stickyMs > 0 && !reset) {
      const a = this.affinity.get(clientIP);
      if (a && now - a.lastUsedMs < this.stickyMs && !exclude?.has(a.endpointKey)) {
        const ep = this.endpoints.find((e) => e.key === a.endpointKey);
        if (ep) {
          a.lastUsedMs = now;
          return ep;
        }
      }
    }
    for (let i = 0; i < n; i++) {
      const ep = this.endpoints[this.index % n];
      this.index = (this.index + 1) % n;
      if (exclude?.has(ep.key)) continue;
      if (this.stickyMs > 0) this.remember(clientIP, ep.key, now);
      return ep;
    }
    return null;
  }

  private remember(clientIP: string, endpointKey: string, now: number): void {
    if (!this.affinity.has(clientIP) && this.affinity.size >= MAX_AFFINITY_ENTRIES) this.expire(now);
    if (!this.affinity.has(clientIP) && this.affinity.size >= MAX_AFFINITY_ENTRIES) {
      const oldest = this.affinity.keys().next().value;
      if (oldest !== undefined) this.affinity.delete(oldest);
    }
    this.affinity.delete(clientIP);
    this.affinity.set(clientIP, { endpointKey, lastUsedMs: now });
  }

  /** Drops expired affinity entries (called on growth; cheap enough to call from a timer too). */
  expire(now = this.now()): void {
    for (const [client, a] of this.affinity) if (now - a.lastUsedMs >= this.stickyMs) this.affinity.delete(client);
  }

  /** client IP → endpoint key of live affinity entries, for dumps and tests */
  affinities(now = this.now()): Map<string, string> {
    const out = new Map<string, string>();
    for (const [client, a] of this.affinity) if (now - a.lastUsedMs < this.stickyMs) out.set(client, a.endpointKey);
    return out;
  }
}
