// The sync loop: the single writer. As upstream's proxiers (pkg/proxy/iptables and nftables
// proxier.go with their BoundedFrequencyRunner): bursts of changes are coalesced (no two syncs
// closer than minSyncPeriod); a sync runs at least every syncPeriod, and it is a partial one
// (the proxiers write only what changed: nothing when nothing did); a full sync is forced once
// an hour (upstream's proxyutil.FullSyncPeriod) and after any failure (the kernel may hold
// anything after a failed write). A failed sync is retried with exponential back-off (upstream
// waits a whole syncPeriod). Time is injected so tests can drive it.

export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const realClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => {
    const t = setTimeout(fn, ms);
    t.unref?.();
    return t;
  },
  clearTimeout: (h) => clearTimeout(h as NodeJS.Timeout),
};

/** Upstream's proxyutil.FullSyncPeriod: a full resync at least this often. */
export const FULL_SYNC_PERIOD_MS = 60 * 60 * 1000;

export interface SyncLoopOptions {
  minSyncPeriodMs: number;
  /** a (partial) sync runs at least this long after the previous one */
  syncPeriodMs: number;
  /** a full sync runs at least this long after the previous full one (default FULL_SYNC_PERIOD_MS) */
  fullSyncPeriodMs?: number;
  /** performs one sync; throws on failure */
  sync: (full: boolean) => Promise<void>;
  clock?: Clock;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  onError?: (err: unknown, attempt: number, retryInMs: number) => void;
}

export interface SyncLoopStatus {
  running: boolean;
  syncs: number;
  failures: number;
  consecutiveFailures: number;
  lastSyncAt: number;
  lastSuccessAt: number;
  lastFullSyncAt: number;
  lastError?: string;
  /** a change is waiting for a sync: since when (0 = none) */
  pendingSince: number;
}

export class SyncLoop {
  private readonly clock: Clock;
  private timer: unknown = null;
  private timerAt = 0;
  private inFlight: Promise<void> | null = null;
  private stopped = true;
  private needFull = true;
  private retryAt = 0;
  readonly status: SyncLoopStatus = {
    running: false,
    syncs: 0,
    failures: 0,
    consecutiveFailures: 0,
    lastSyncAt: 0,
    lastSuccessAt: 0,
    lastFullSyncAt: 0,
    pendingSince: 0,
  };

  constructor(private readonly opts: SyncLoopOptions) {
    this.clock = opts.clock ?? realClock;
  }

  /** Starts the loop with a full sync as soon as possible. */
  start(): void {
    this.stopped = false;
    this.status.running = true;
    this.needFull = true;
    this.status.pendingSince = this.status.pendingSince || this.clock.now();
    this.schedule(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.status.running = false;
    this.cancelTimer();
    if (this.inFlight) await this.inFlight.catch(() => {});
  }

  /** Something changed: sync soon, but not sooner than minSyncPeriod after the last sync. */
  request(): void {
    if (!this.status.pendingSince) this.status.pendingSince = this.clock.now();
    if (this.stopped) return;
    this.schedule(this.delayForChange());
  }

  /** Asks that the next sync be a full one. */
  requestFull(): void {
    this.needFull = true;
    this.request();
  }

  /** Resolves once no sync is running and none is pending (for tests and shutdown). */
  async idle(timeoutMs = 30_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (this.inFlight || (this.status.pendingSince && this.timer)) {
      if (Date.now() > deadline) throw new Error('sync loop did not become idle');
      if (this.inFlight) await this.inFlight.catch(() => {});
      else await new Promise((r) => setTimeout(r, 5));
    }
  }

  private delayForChange(): number {
    const now = this.clock.now();
    const sinceLast = now - this.status.lastSyncAt;
    let delay = Math.max(0, this.opts.minSyncPeriodMs - sinceLast);
    if (this.retryAt > now) delay = Math.max(delay, this.retryAt - now);
    return delay;
  }

  private schedule(delayMs: number): void {
    const at = this.clock.now() + delayMs;
    // Keep an earlier timer: coalescing means never postponing a sync already due.
    if (this.timer !== null && this.timerAt <= at) return;
    this.cancelTimer();
    this.timerAt = at;
    this.timer = this.clock.setTimeout(() => {
      this.timer = null;
      void this.runOnce();
    }, delayMs);
  }

  private cancelTimer(): void {
    if (this.timer !== null) this.clock.clearTimeout(this.timer);
    this.timer = null;
  }

  private async runOnce(): Promise<void> {
    if (this.stopped) return;
    // A sync is running: the change is marked pending (pendingSince), and the running sync
    // schedules the next one when it ends, so every change that arrived meanwhile goes into
    // that ONE next sync (no queue of one-change syncs, no waiter per change).
    if (this.inFlight) return;
    const now = this.clock.now();
    const full = this.needFull || now - this.status.lastFullSyncAt >= (this.opts.fullSyncPeriodMs ?? FULL_SYNC_PERIOD_MS);
    this.needFull = false;
    this.status.pendingSince = 0;
    this.status.lastSyncAt = now;
    this.status.syncs++;
    // A sync that throws before returning its promise is a failed sync like any other (and
    // must not escape as an unhandled rejection of runOnce, stalling the loop).
    try {
      this.inFlight = this.opts.sync(full);
    } catch (err) {
      this.inFlight = Promise.reject(err);
    }
    try {
      await this.inFlight;
      this.status.lastSuccessAt = this.clock.now();
      if (full) this.status.lastFullSyncAt = now;
      this.status.consecutiveFailures = 0;
      this.status.lastError = undefined;
      this.retryAt = 0;
    } catch (err) {
      this.status.failures++;
      this.status.consecutiveFailures++;
      this.status.lastError = err instanceof Error ? err.message : String(err);
      this.needFull = true;
      const initial = this.opts.backoffInitialMs ?? 1000;
      const max = this.opts.backoffMaxMs ?? 30_000;
      const wait = Math.min(max, initial * 2 ** (this.status.consecutiveFailures - 1));
      this.retryAt = this.clock.now() + wait;
      if (!this.status.pendingSince) this.status.pendingSince = now;
      this.opts.onError?.(err, this.status.consecutiveFailures, wait);
    } finally {
      this.inFlight = null;
    }
    if (this.stopped) return;
    if (this.status.pendingSince) this.schedule(this.delayForChange());
    // The periodic sync, syncPeriod after this one ended (upstream's BoundedFrequencyRunner
    // resets its maxInterval timer after each run, so a sync slower than syncPeriod is not
    // followed by another at once); after a failure not before the back-off ends. Whether it
    // is full is decided when it runs (hourly, or after a failure).
    const now2 = this.clock.now();
    this.schedule(Math.max(this.opts.syncPeriodMs, this.retryAt - now2));
  }
}
