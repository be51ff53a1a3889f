// What a proxier remembers between syncs, for partial syncs: which nat chains it believes
// are installed (refreshed from iptables-save at every full sync), whether the next sync
// must be full, and when stale chains were last cleaned. Pure: the caller does the I/O.
import type { ProxyState } from '../../core/model.ts';
import type { IptablesOptions } from './options.ts';
import { planIptables, type Plan } from './plan.ts';

export class IptablesSyncState {
  /** nat chains believed installed; null until the first full sync told us */
  installedNatChains: Set<string> | null = null;
  needFullSync = true;
  private lastCleanupMs = -Infinity;

  /**
   * Plans one sync. `full` forces a full sync; one happens anyway after a failure or at
   * the start. In large-cluster mode stale chains are only deleted once per syncPeriod, as
   * upstream (they are harmless, unreferenced).
   */
  plan(state: ProxyState, opts: IptablesOptions, changed: Set<string>, full: boolean, nowMs = Date.now(), syncPeriodMs = 0): Plan & { full: boolean } {
    const doFull = full || this.needFullSync;
    const skipCleanup = nowMs - this.lastCleanupMs <= syncPeriodMs;
    let plan = planIptables({ state, opts, full: doFull, changed, installedNatChains: this.installedNatChains ?? undefined, deleteStale: true });
    if (plan.largeClusterMode && skipCleanup) {
      if (plan.deletedChains.length) {
        plan = planIptables({ state, opts, full: doFull, changed, installedNatChains: this.installedNatChains ?? undefined, deleteStale: false });
      }
    } else if (this.installedNatChains) {
      this.pendingCleanupMs = nowMs;
    }
    return { ...plan, full: doFull };
  }

  private pendingCleanupMs: number | null = null;

  /** Records that `plan` was applied. */
  commit(plan: Plan): void {
    const installed = new Set(this.installedNatChains ?? []);
    for (const c of plan.deletedChains) installed.delete(c);
    for (const c of plan.activeNatChains) installed.add(c);
    this.installedNatChains = installed;
    this.needFullSync = false;
    if (this.pendingCleanupMs !== null) this.lastCleanupMs = this.pendingCleanupMs;
    this.pendingCleanupMs = null;
  }

  /** A failed apply loses the change history: the next sync must be full. */
  fail(): void {
    this.needFullSync = true;
    this.pendingCleanupMs = null;
  }
}
