// Proxy health as upstream's ProxyHealthServer (pkg/proxy/healthcheck/proxy_health.go) defines
// it: the proxy is healthy unless an update has been queued for healthTimeout or longer
// without a successful sync. /livez is exactly that; /healthz also needs the node to be
// eligible (not being deleted, not tainted ToBeDeletedByClusterAutoscaler) and, unlike
// upstream, a first successful sync: until kproxy has written its rules once the node is not
// ready to receive traffic (upstream answers 200 from the start).
//
// Where kproxy is more exact than upstream: an update queued while a sync is running is not
// cleared by that sync's success (the sync read its state before the change came).
// kproxy's controller is single-family (IPv4), so there is one entry, not one per family.

/** Taint the Cluster Autoscaler puts on a node before deleting it. */
export const TO_BE_DELETED_TAINT = 'ToBeDeletedByClusterAutoscaler';

export interface ProxyHealthOptions {
  healthTimeoutMs: number;
  now?: () => number;
}

export interface HealthVerdict {
  /** /livez: no update has waited healthTimeout or longer */
  live: boolean;
  /** /healthz: live, a first sync succeeded, and the node is eligible */
  healthy: boolean;
  nodeEligible: boolean;
  /** ms since epoch of the last successful sync, 0 if never */
  lastUpdated: number;
  /** ms since epoch of the oldest update still waiting for a successful sync, 0 if none */
  oldestPendingQueued: number;
  currentTime: number;
}

export class ProxyHealth {
  readonly healthTimeoutMs: number;
  private readonly now: () => number;
  private lastUpdated = 0;
  /** queued since the running sync (if any) read its state */
  private oldestPending = 0;
  /** queued before the running sync started: cleared if it succeeds */
  private inFlightPending = 0;
  private nodeEligible = true;

  constructor(opts: ProxyHealthOptions) {
    this.healthTimeoutMs = opts.healthTimeoutMs;
    this.now = opts.now ?? Date.now;
  }

  /** A change needs a sync (upstream's QueuedUpdate): keeps the oldest such time. */
  queuedUpdate(): void {
    if (!this.oldestPending) this.oldestPending = this.now();
  }

  /** A sync starts reading state: what was queued so far is what it will cover. */
  syncStarted(): void {
    this.inFlightPending = minNonZero(this.inFlightPending, this.oldestPending);
    this.oldestPending = 0;
  }

  /** The sync succeeded (upstream's Updated). */
  updated(): void {
    this.inFlightPending = 0;
    this.lastUpdated = this.now();
  }

  /** The sync failed: what it was to cover is still waiting, since the time first queued. */
  syncFailed(): void {
    this.oldestPending = minNonZero(this.inFlightPending, this.oldestPending) || this.now();
    this.inFlightPending = 0;
  }

  /** Eligible unless the Node is being deleted or carries the autoscaler's deletion taint (upstream's SyncNode). */
  syncNode(node: unknown): void {
    const n = node as { metadata?: { deletionTimestamp?: unknown }; spec?: { taints?: unknown } } | null;
    if (!n || typeof n !== 'object') return; // no Node object: keep the last verdict, as upstream (it has no delete handler here)
    if (n.metadata && typeof n.metadata === 'object' && n.metadata.deletionTimestamp) {
      this.nodeEligible = false;
      return;
    }
    const taints = n.spec && typeof n.spec === 'object' && Array.isArray(n.spec.taints) ? n.spec.taints : [];
    this.nodeEligible = !taints.some((t) => !!t && typeof t === 'object' && (t as { key?: unknown }).key === TO_BE_DELETED_TAINT);
  }

  verdict(): HealthVerdict {
    const currentTime = this.now();
    const oldestPendingQueued = minNonZero(this.inFlightPending, this.oldestPending);
    const live = !oldestPendingQueued || currentTime - oldestPendingQueued < this.healthTimeoutMs;
    return {
      live,
      healthy: live && this.lastUpdated > 0 && this.nodeEligible,
      nodeEligible: this.nodeEligible,
      lastUpdated: this.lastUpdated,
      oldestPendingQueued,
      currentTime,
    };
  }
}

function minNonZero(a: number, b: number): number {
  if (!a) return b;
  if (!b) return a;
  return Math.min(a, b);
}
