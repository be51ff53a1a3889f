// Failure isolation for atomic transactions (`nft -f`, `iptables-restore`): the kernel
// takes all of a transaction or none of it, so one Service it refuses would otherwise stop
// every sync for good. The proxier maps the refused line back to the Service that wrote it,
// leaves that Service out, and retries at once, so every other Service converges in the same
// sync. An excluded Service gets another chance when it changes and at every full sync. Pure.
import type { ProxyState } from '../core/model.ts';
import { coded } from '../errors.ts';

/** Attempts per sync: the first one plus this many retries, each leaving out more Services. */
export const MAX_ISOLATION_RETRIES = 4;

// Errors that say nothing about the content (the kernel was short of memory or busy, the
// lock was held): excluding the Service on the refused line would take a healthy Service
// down until the next full sync, so these fail the sync and the loop retries with back-off.
const TRANSIENT = /Resource temporarily unavailable|Cannot allocate memory|No buffer space|Device or resource busy|Interrupted system call|holding the xtables lock|Message too long/i;

/** True when a refusal is about the moment, not about the line it names. */
export function isTransientRefusal(stderr: string): boolean {
  return TRANSIENT.test(stderr);
}

export class ServiceExclusions {
  /** "ns/name" → why the kernel refused it */
  private readonly excluded = new Map<string, string>();
  /** what was last reported per Service, so a Service refused again for the same reason is not logged again */
  private readonly reported = new Map<string, string>();

  /** At the start of a sync: changed Services (every one on a full sync) are tried again. */
  startSync(changed: ReadonlySet<string>, full: boolean): void {
    if (full) this.excluded.clear();
    else for (const k of changed) this.excluded.delete(k);
  }

  /** Leaves a Service out; true when this is news worth a warning (not the same refusal again). */
  exclude(serviceKey: string, reason: string): boolean {
    this.excluded.set(serviceKey, reason);
    if (this.reported.get(serviceKey) === reason) return false;
    if (this.reported.size >= 10_000) this.reported.clear();
    this.reported.set(serviceKey, reason);
    return true;
  }

  has(serviceKey: string): boolean {
    return this.excluded.has(serviceKey);
  }

  get size(): number {
    return this.excluded.size;
  }

  keys(): string[] {
    return [...this.excluded.keys()].sort();
  }

  /** The state without the excluded Services (all their ports and endpoints). */
  filter(state: ProxyState): ProxyState {
    if (this.excluded.size === 0) return state;
    const out: ProxyState = { services: new Map(), endpoints: new Map() };
    for (const [k, sp] of state.services) if (!this.excluded.has(sp.serviceKey)) out.services.set(k, sp);
    for (const [k, eps] of state.endpoints) if (out.services.has(k)) out.endpoints.set(k, eps);
    return out;
  }
}

/** The log line for a Service the kernel refused. */
export function exclusionMessage(serviceKey: string, tool: string, error: string): string {
  return (
    coded(
      'KPROXY_SYNC_SERVICE_EXCLUDED',
      `${tool} refused the rules of Service ${serviceKey} (${error}); ` +
        'it is left out until it changes (or the next full sync) and every other Service is programmed: fix or delete this Service',
    )
  );
}
