// The partial sync, as upstream's (pkg/proxy/iptables/proxier.go, partial syncs): the changed
// services' own chains written, every other service's rules counted but not built, the
// static and dispatch chains rewritten. With what the last applied sync rendered (`last`, the
// production proxier's sync state), also every service whose block changed is written, and
// every chain whose content is what kproxy last wrote for it is left out (kproxy, not
// upstream): a one-endpoint change then writes a small constant instead of 2N + 26 nat rules.
// With --noflush an omitted chain keeps its kernel content, which is the content it would
// have been rewritten with, so the resulting tables are the same. partial-fast.ts plans the
// common partial sync without visiting the other services at all. Pure.
import type { ProxyState } from '../../core/model.ts';
import type { IptablesOptions } from './options.ts';
import { BlockCache, type AppliedBlocks } from './blocks.ts';
import {
  collectRuleset, rulesetPlan, staleChains, unchangedLeftOut, type Plan, type ServiceChoice,
} from './plan.ts';
import { ruleTotal, tableSection } from './units.ts';

/** What the sync state keeps of the last applied sync. */
export interface LastApplied {
  blocks: AppliedBlocks;
  /** "table/chain" → digest of the static and dispatch chains as last applied (undefined: unknown) */
  chainDigests?: ReadonlyMap<string, string>;
}

export interface PartialPlanRequest {
  state: ProxyState;
  opts: IptablesOptions;
  /** service keys ("ns/name") changed since the last successful sync */
  changed: ReadonlySet<string>;
  /** nat chains believed installed; the service chains among them that are not wanted are deleted */
  installedNatChains?: ReadonlySet<string>;
  /** false leaves the stale chains installed (large-cluster mode, within syncPeriod, as upstream) */
  deleteStale?: boolean;
  /** what the last applied sync rendered; none: upstream's payload */
  last?: LastApplied;
  /** the blocks rendered so far (the sync state's, which the applied blocks came from); none: rendered afresh */
  cache?: BlockCache;
}

/** The restore payload of a partial sync. */
export function planPartial(req: PartialPlanRequest): Plan {
  const { state, opts, changed, last } = req;
  const cache = req.cache ?? new BlockCache();
  const r = collectRuleset(state, opts, (sp, eps, ctx): ServiceChoice => {
    // The applied blocks, if rendered with these settings (otherwise every block differs).
    const prev = last && last.blocks.ctx?.key === ctx.key ? last.blocks.blocks.get(sp.key) : undefined;
    // With the applied digests, a written service's chains are compared with its applied block.
    const old = last?.chainDigests ? prev : undefined;
    // A service not written keeps its (possibly compacted) block: its chains are not needed.
    const write = changed.has(sp.serviceKey);
    const b = cache.block(sp, eps, ctx, write);
    if (write) return { block: b, write, old };
    // A block rendered differently from the applied one is written too.
    if (!last || prev === b) return { block: b, write: false };
    return { block: b.compact ? cache.block(sp, eps, ctx, true) : b, write: true, old };
  });
  const deletedChains = staleChains(req.installedNatChains, r.active, req.deleteStale !== false);
  const lastDigests = last?.chainDigests;
  const chainDigests = new Map<string, string>();
  const skipped = { n: r.written.skippedChains };
  const filterUnits = unchangedLeftOut('filter', r.filterUnits, chainDigests, lastDigests, skipped);
  const natUnits = [...unchangedLeftOut('nat', r.natStaticUnits, chainDigests, lastDigests, skipped), ...r.written.units];
  // Nothing left to write in a table: no section for it.
  const section = (table: string, units: typeof natUnits, deleted: string[]) =>
    !units.length && !deleted.length && lastDigests ? '' : tableSection(table, units, deleted);
  return rulesetPlan(r, req, {
    payload: section('filter', filterUnits, []) + section('nat', natUnits, deletedChains),
    natRulesWritten: ruleTotal(natUnits),
    filterRules: ruleTotal(filterUnits),
    deletedChains,
    chainDigests,
    skippedChains: skipped.n,
  });
}
