// userspace.maxConnections is one node-wide cap, held across kproxy's process and its
// workers (userspace.workers > 1). The kernel, not kproxy, decides which process accepts a
// connection, so a fixed split (max/N each) would refuse a connection in a busy process
// while another has room. Instead kproxy's process owns the cap and lends it out:
//
// - a worker holds a lease of tokens; a connection takes one locally (no IPC) while the
//   lease has room, and gives it back to the lease when it closes;
// - a worker whose lease is used up asks kproxy's process for a batch (the connection waits,
//   paused, for the answer); a worker holding more than two batches unused returns the
//   excess, so idle tokens do not sit in one process;
// - when the cap looks full, kproxy's process first reclaims every worker's unused tokens,
//   then answers: a connection is refused only when the node really holds `max`.
//
// Safety: main's open + every lease ≤ max at all times (a grant never exceeds what is free),
// so the node never holds more than max connections. Exactness: the batch is small next to
// the cap (max / (4 × processes), at most 64), and the reclaim before any refusal makes the
// K+1-th connection the first refused in a quiet system. Cost: one IPC round trip per batch,
// not per connection. Pure logic, the transport is injected (workers.ts, worker-main.ts).

import type { ConnectionBudget, SharedCap } from './tcp.ts';

/** Tokens a worker asks for at once. */
export function leaseBatch(max: number, processes: number): number {
  return Math.max(1, Math.min(64, Math.floor(max / (4 * Math.max(1, processes)))));
}

/** A worker process's side: the lease. */
export class CapLease implements SharedCap {
  /** tokens held (open connections included) */
  lease = 0;
  /** tokens in use by open connections */
  open = 0;
  private waiters: ((ok: boolean) => void)[] = [];
  private asking: NodeJS.Timeout | null = null;

  constructor(
    private readonly batch: number,
    private readonly ask: (n: number) => void,
    private readonly giveBack: (n: number) => void,
    private readonly answerTimeoutMs = 2000,
  ) {}

  take(): boolean | Promise<boolean> {
    if (this.open < this.lease) {
      this.open++;
      return true;
    }
    return new Promise((resolve) => {
      this.waiters.push(resolve);
      this.request();
    });
  }

  release(): void {
    this.open--;
    const w = this.waiters.shift();
    if (w) {
      this.open++;
      w(true);
      return;
    }
    this.trim();
  }

  /** kproxy's process granted n tokens (n may be 0: the cap is full). */
  granted(n: number): void {
    if (this.asking) clearTimeout(this.asking);
    this.asking = null;
    this.lease += n;
    while (this.waiters.length && this.open < this.lease) {
      this.open++;
      this.waiters.shift()!(true);
    }
    if (this.waiters.length) {
      // n = 0 came after a reclaim over every process: the node is full.
      if (n === 0) this.refuseWaiting();
      else this.request();
      return;
    }
    this.trim();
  }

  /** kproxy's process reclaims the unused tokens; returns how many were given back. */
  reclaim(): number {
    const n = this.lease - this.open;
    this.lease = this.open;
    return n;
  }

  private request(): void {
    if (this.asking) return;
    // An unanswered question (kproxy's process stuck) must not hold connections forever; a
    // late grant still adds to the lease, as kproxy's process counted it.
    this.asking = setTimeout(() => {
      this.asking = null;
      this.refuseWaiting();
    }, this.answerTimeoutMs);
    this.asking.unref?.();
    this.ask(Math.max(this.batch, this.waiters.length));
  }

  private refuseWaiting(): void {
    for (const w of this.waiters.splice(0)) w(false);
  }

  private trim(): void {
    const spare = this.lease - this.open;
    if (spare <= 2 * this.batch) return;
    const n = spare - this.batch;
    this.lease -= n;
    this.giveBack(n);
  }
}

/** A worker as kproxy's process sees it: asked to give back its unused tokens. */
export interface LeaseHolder {
  /** sends the reclaim; resolves when the answer was applied (giveBack) or after a timeout */
  reclaim(): Promise<void>;
}

/** kproxy's process's side: the cap, its own connections, and every worker's lease. */
export class CapOwner {
  private readonly leases = new Map<string, number>();
  private readonly holders = new Map<string, LeaseHolder>();
  private mainOpen = 0;
  private reclaiming: Promise<void> | null = null;
  /** reclaim rounds run (tests, debug) */
  reclaims = 0;

  constructor(public max: number) {}

  /** Tokens neither used by kproxy's process nor lent to a worker. */
  get free(): number {
    let used = this.mainOpen;
    for (const n of this.leases.values()) used += n;
    return this.max - used;
  }

  /** Connections kproxy's own process holds, and tokens lent, per worker (tests, debug). */
  snapshot(): { main: number; leases: Record<string, number> } {
    return { main: this.mainOpen, leases: Object.fromEntries(this.leases) };
  }

  /** kproxy's own forwarders' side of the cap. */
  readonly local: SharedCap = {
    take: () => {
      if (this.free > 0) {
        this.mainOpen++;
        return true;
      }
      const joined = this.reclaiming !== null;
      const grant = () => {
        if (this.free <= 0) return false;
        this.mainOpen++;
        return true;
      };
      // decided in the same turn as the check: no grant can slip in between
      return this.reclaimAll().then(() => (joined && this.free <= 0 ? this.reclaimAll().then(grant) : grant()));
    },
    release: () => {
      this.mainOpen--;
    },
  };

  attach(id: string, holder: LeaseHolder): void {
    this.holders.set(id, holder);
    this.leases.set(id, 0);
  }

  /** A worker is gone: its connections died with it, its lease is free again. */
  detach(id: string): void {
    this.holders.delete(id);
    this.leases.delete(id);
  }

  /** A worker asks for n tokens; resolves with how many it got (0: the node is full). */
  async want(id: string, n: number): Promise<number> {
    if (this.free <= 0) {
      // see `joined` below; the grant is computed in the same turn as the last check
      const joined = this.reclaiming !== null;
      await this.reclaimAll();
      if (joined && this.free <= 0) await this.reclaimAll();
    }
    if (!this.leases.has(id)) return 0;
    const g = Math.max(0, Math.min(n, this.free));
    this.leases.set(id, this.leases.get(id)! + g);
    return g;
  }

  /** A worker gave tokens back (unasked, or answering a reclaim). */
  giveBack(id: string, n: number): void {
    const l = this.leases.get(id);
    if (l === undefined) return;
    this.leases.set(id, Math.max(0, l - n));
  }

  /**
   * One reclaim round at a time; a caller arriving during one waits for it. A round that began
   * before a caller arrived may have missed tokens granted since (a worker that asked for a
   * batch got more than it needed after answering that round), so a caller that `joined` a
   * running round and still finds nothing free runs one fresh round before a refusal: the
   * reclaim before any refusal covers every grant made before the caller asked.
   */
  private reclaimAll(): Promise<void> {
    if (!this.reclaiming) {
      this.reclaims++;
      this.reclaiming = Promise.all([...this.holders.values()].map((h) => h.reclaim()))
        .then(() => undefined)
        .finally(() => {
          this.reclaiming = null;
        });
    }
    return this.reclaiming;
  }
}

const owners = new WeakMap<ConnectionBudget, CapOwner>();

/**
 * The owner of a process budget's node-wide cap, made once per budget (both IP families'
 * proxiers share the process budget, so they share one cap): the budget's forwarders take
 * their tokens from it from then on.
 */
export function capOwnerFor(budget: ConnectionBudget, max: number): CapOwner {
  let o = owners.get(budget);
  if (!o) {
    o = new CapOwner(max);
    owners.set(budget, o);
    budget.shared = o.local;
  }
  o.max = max;
  return o;
}
