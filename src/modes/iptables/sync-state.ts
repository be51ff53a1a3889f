// What a proxier remembers between syncs, for partial syncs: which nat chains it believes
// are installed (refreshed from iptables-save at every full sync), whether the next sync
// must be full, and when stale chains were last cleaned. Pure: the caller does the I/O.
// With skipUnchangedChains (the production proxier; not the conformance adapter, whose
// goldens are upstream's payloads) it also keeps what was last applied: each service port's
// rendered block and a digest of each static and dispatch chain, replaced by a full sync and
// updated by each partial sync, so partial syncs leave out chains whose content did not
// change and, when only services' own chains change, plan in O(changed) (partial-fast.ts); and
// the stale chains whose deletion large-cluster mode defers, deleted when the cleanup is due.
import type { ProxyState } from '../../core/model.ts';
import type { IptablesOptions } from './options.ts';
import { BlockCache, updateApplied, type AppliedBlocks } from './blocks.ts';
import type { InstalledChains } from './canonical.ts';
import { hasServiceChain, type Plan } from './plan.ts';
import { planFullStreamed } from './full.ts';
import { planPartial } from './partial.ts';
import { planPartialFast } from './partial-fast.ts';
import { planRestart } from './restart.ts';

const NO_BLOCKS: AppliedBlocks = { blocks: new Map(), servicePorts: new Map(), nodePorts: 0, natRulesTotal: 0 };

export class IptablesSyncState {
  /** nat chains believed installed; null until the first full sync told us */
  installedNatChains: Set<string> | null = null;
  needFullSync = true;
  private lastCleanupMs = -Infinity;
  /** "table/chain" → digest of the content last applied; null until a full sync */
  chainDigests: Map<string, string> | null = null;
  readonly skipUnchangedChains: boolean;
  /** full syncs larger than this many nat lines are applied in chunks (0: never; see full.ts) */
  chunkLines = 0;
  /** the restart form's dispatch edits per restore (restart.ts); undefined: restart.ts dispatchBudget */
  dispatchChunkLines: number | undefined = undefined;
  /** with skipUnchangedChains: the blocks the last applied sync rendered; null until a full sync */
  private applied: AppliedBlocks | null = null;
  /**
   * kproxy's chains as the kernel holds them, read by the full sync about to be planned: when
   * they include a service chain (a restart over the rules a previous process left, or a full
   * sync over this one's), that sync takes the restart form (restart.ts). Used by the next
   * plan() only, then dropped.
   */
  installed: InstalledChains | null = null;
  /** every service port's last rendered block: the applied blocks are among them */
  readonly blocks = new BlockCache();
  /** installed stale service chains whose deletion is deferred (large-cluster mode) */
  private deferred: ReadonlySet<string> = new Set();

  constructor(o: { skipUnchangedChains?: boolean } = {}) {
    this.skipUnchangedChains = o.skipUnchangedChains ?? false;
  }

  /**
   * Plans one sync. `full` forces a full sync; one happens anyway after a failure or at
   * the start. In large-cluster mode stale chains are only deleted once per syncPeriod, as
   * upstream (they are harmless, unreferenced). `servicePorts`, each Service's port keys in
   * `state` (the node view's), lets a partial sync visit only the changed services' ports.
   */
  plan(
    state: ProxyState, opts: IptablesOptions, changed: Set<string>, full: boolean, nowMs = Date.now(), syncPeriodMs = 0,
    servicePorts?: ReadonlyMap<string, readonly string[]>,
  ): Plan & { full: boolean } {
    const doFull = full || this.needFullSync;
    const installed = doFull ? this.installed : null;
    this.installed = null;
    const skipCleanup = nowMs - this.lastCleanupMs <= syncPeriodMs;
    // O(changed) when only changed services' own chains differ (partial-fast.ts).
    if (!doFull && this.applied && this.chainDigests && this.installedNatChains) {
      const fast = planPartialFast({ state, opts, applied: this.applied, cache: this.blocks, changed, deferStale: skipCleanup, deferred: this.deferred, servicePorts });
      if (fast) {
        if (!fast.largeClusterMode || !skipCleanup) this.pendingCleanupMs = nowMs;
        return { ...fast, full: false };
      }
    }
    const strategy = (deleteStale: boolean): Plan => doFull ? this.planWhole(state, opts, installed, deleteStale) : this.planChanged(state, opts, changed, deleteStale);
    let plan = strategy(true);
    plan.deferredChains = [];
    if (plan.largeClusterMode && skipCleanup) {
      if (plan.deletedChains.length) {
        const deferred = plan.deletedChains;
        plan = strategy(false);
        plan.deferredChains = deferred;
      }
    } else if (this.installedNatChains) {
      this.pendingCleanupMs = nowMs;
    }
    return { ...plan, full: doFull };
  }

  /** A full sync: the restart form over installed service chains, else every chain written. */
  private planWhole(state: ProxyState, opts: IptablesOptions, installed: InstalledChains | null, deleteStale: boolean): Plan {
    const installedNatChains = this.installedNatChains ?? undefined;
    if (installed && hasServiceChain(installed.get('nat')?.keys() ?? [])) {
      return planRestart({ state, opts, installed, installedNatChains, deleteStale, chunkLines: this.chunkLines, dispatchChunkLines: this.dispatchChunkLines, cache: this.blocks });
    }
    return planFullStreamed({ state, opts, installedNatChains, deleteStale, chunkLines: this.chunkLines, cache: this.blocks });
  }

  /** A partial sync that visits every service (partial.ts). */
  private planChanged(state: ProxyState, opts: IptablesOptions, changed: Set<string>, deleteStale: boolean): Plan {
    // With skipUnchangedChains, what was last applied: unchanged chains are left out.
    const last = this.skipUnchangedChains ? { blocks: this.applied ?? NO_BLOCKS, chainDigests: this.chainDigests ?? undefined } : undefined;
    return planPartial({ state, opts, changed, installedNatChains: this.installedNatChains ?? undefined, deleteStale, last, cache: this.blocks });
  }

  private pendingCleanupMs: number | null = null;

  /** Records that `plan` was applied (a full plan: `full` true). */
  commit(plan: Plan & { full?: boolean }): void {
    if (this.skipUnchangedChains) {
      // A full sync wrote every chain: its digests replace the old ones wholesale.
      const d = plan.full || !this.chainDigests ? new Map<string, string>() : this.chainDigests;
      for (const c of plan.deletedChains) d.delete(`nat/${c}`);
      for (const [k, v] of plan.chainDigests) d.set(k, v);
      this.chainDigests = d;
      const a = plan.applied;
      if (a.kind === 'replace') this.applied = a.blocks;
      else if (this.applied) {
        for (const [key, b, svc] of a.updates) updateApplied(this.applied, key, b, svc);
        this.applied.natRulesTotal = a.natRulesTotal;
        this.applied.totalEndpoints = a.totalEndpoints;
      }
    }
    // Stale-chain deletion ran (every installed service chain that is not active was
    // deleted): what is installed is what is active. Otherwise (deferred in large-cluster
    // mode) the stale ones stay. Either way no copy of a set of 70k names per sync.
    if (plan.staleDeletion || !this.installedNatChains) {
      this.installedNatChains = plan.staleDeletion ? plan.activeNatChains : new Set(plan.activeNatChains);
    } else {
      const installed = this.installedNatChains;
      for (const c of plan.deletedChains) installed.delete(c);
      for (const c of plan.activeNatChains) installed.add(c);
    }
    if (plan.deferredChains) this.deferred = new Set(plan.deferredChains);
    this.needFullSync = false;
    if (this.pendingCleanupMs !== null) this.lastCleanupMs = this.pendingCleanupMs;
    this.pendingCleanupMs = null;
  }

  /** A failed apply loses the change history: the next sync must be full. */
  fail(): void {
    this.needFullSync = true;
    this.pendingCleanupMs = null;
    this.chainDigests = null;
    this.applied = null;
  }
}
