// A partial sync in O(changed services) rather than O(all services) (kproxy, not upstream):
// compares each changed service port's rendered block with the one last applied (by
// identity: the sync state's block cache returns the same object while the ServicePort, its endpoint list
// and the settings are the same, see blocks.ts) and writes only the changed services' own
// chains whose content changed (compared with the applied block), declaring only those;
// deletes the chains that became stale, or defers them (`deferStale`, large-cluster mode)
// and deletes the deferred ones when the cleanup is due. When no changed service's dispatch
// rules (nat KUBE-SERVICES / KUBE-NODEPORTS, every filter rule) differ, which is the case for
// an endpoint change, the restore leaves those chains and the filter table alone; when some
// do (a Service added or removed, a VIP, port or node port changed, endpoints appearing or
// all going), they are edited in place (dispatchEdits) rather than rewritten; placing them
// takes one pass over the applied blocks when some are inserted, the one step in O(all
// services), and only then.
// The changed services' ports are the node view's per-Service index (`servicePorts`); those
// they had, the applied blocks' own index.
//
// planPartialFast returns null when this shortcut does not apply (the sync state then plans
// with partial.ts): the render settings changed (large-cluster mode on or off included), or
// more than MAX_DISPATCH_EDITS services' dispatch rules changed. The kernel ends in the state
// partial.ts would leave it in, rule order included; the deferred stale chains are known
// (`deferred`), so no scan of the 70k installed chains is needed when their deletion comes due. Pure.
import type { ProxyState, ServicePort } from '../../core/model.ts';
import type { IptablesOptions } from './options.ts';
import { EMPTY, ruleCount, sameUnitIn, settingsKey, type AppliedBlocks, type BlockCache, type RenderContext } from './blocks.ts';
import { routeLocalnetWith, type Plan } from './plan.ts';
import type { ServiceBlock } from './service-block.ts';
import { chainLine, EMPTY_LINES, sameLines, type ChainUnit } from './units.ts';

export interface FastPlanRequest {
  state: ProxyState;
  opts: IptablesOptions;
  applied: AppliedBlocks;
  /** the cache the applied blocks came from: an unchanged port's block is the applied object */
  cache: BlockCache;
  /**
   * The services ("ns/name") changed since `applied` (the trackers' report). With it, only
   * their ports are looked at: every other port's block is the applied one (its ServicePort
   * and endpoint list are the same objects). Without it, every port's block is compared.
   */
  changed?: ReadonlySet<string>;
  /**
   * Large-cluster mode only: true defers the deletion of the chains that became stale (they
   * stay installed, unreferenced, until the cleanup is due); false deletes them and every
   * chain in `deferred`.
   */
  deferStale: boolean;
  /** the stale chains earlier syncs left installed (Plan.deferredChains of the last applied plan) */
  deferred: ReadonlySet<string>;
  /**
   * With `changed`: each Service's port keys in `state` (the node view's servicePorts, built
   * from the same state), so only the changed services' ports are visited. Without it, a walk
   * over every port finds them.
   */
  servicePorts?: ReadonlyMap<string, readonly string[]>;
}

/** More services whose dispatch rules change than this: partial.ts rewrites the chains. */
const MAX_DISPATCH_EDITS = 200;

/**
 * A service port whose block differs from the applied one: its key, the applied block, the
 * new one (undefined: gone), its Service ("ns/name").
 */
type Touched = [string, ServiceBlock | undefined, ServiceBlock | undefined, string];

const NO_KEYS: readonly string[] = [];
const NO_COUNTS: ReadonlyMap<string, number> = new Map();

/**
 * The ports whose block is not the applied one, and the endpoints of all blocks after this
 * sync. With `changed` and the applied endpoint count, only the changed services' ports are
 * visited (their keys from `servicePorts`, or, without it, a walk over every port that costs
 * one Set lookup per unchanged one); without them, every port.
 */
function touchedPorts(req: FastPlanRequest, ctx: RenderContext): { touched: Touched[]; totalEndpoints: number } {
  const changed = req.applied.totalEndpoints !== undefined ? req.changed : undefined;
  if (changed && req.servicePorts) return touchedOfServices(req, ctx, changed, req.servicePorts);
  return touchedByWalk(req, ctx, changed);
}

/** One port of the state: its block (checked against the applied one) and its endpoint count. */
function visitPort(req: FastPlanRequest, ctx: RenderContext, sp: ServicePort, touched: Touched[]): { endpoints: number; old: ServiceBlock | undefined } {
  const eps = req.state.endpoints.get(sp.key) ?? EMPTY;
  // Unchanged services' blocks are the applied ones, compacted or not: no chains needed.
  let b = req.cache.block(sp, eps, ctx, false);
  const old = req.applied.blocks.get(sp.key);
  if (old !== b) {
    if (b.compact) b = req.cache.block(sp, eps, ctx, true);
    touched.push([sp.key, old, b, sp.serviceKey]);
  }
  return { endpoints: eps.length, old };
}

/**
 * O(changed services): a changed Service's ports now are the node view's (`servicePorts`, built
 * from the same tracker state); those it had are the applied blocks' index. A port in the view
 * but not in the state (a Service left out of this sync, modes/isolation.ts) is gone.
 */
function touchedOfServices(req: FastPlanRequest, ctx: RenderContext, changed: ReadonlySet<string>, servicePorts: ReadonlyMap<string, readonly string[]>): { touched: Touched[]; totalEndpoints: number } {
  const { state, applied } = req;
  const touched: Touched[] = [];
  const gone: Touched[] = [];
  let totalEndpoints = applied.totalEndpoints!;
  for (const svc of changed) {
    for (const key of servicePorts.get(svc) ?? NO_KEYS) {
      const sp = state.services.get(key);
      if (!sp) continue;
      const { endpoints, old } = visitPort(req, ctx, sp, touched);
      totalEndpoints += endpoints - (old?.endpoints ?? 0);
    }
    for (const key of applied.servicePorts.get(svc) ?? NO_KEYS) {
      if (state.services.has(key)) continue;
      const old = applied.blocks.get(key)!;
      gone.push([key, old, undefined, svc]);
      totalEndpoints -= old.endpoints;
    }
  }
  for (const t of gone) touched.push(t);
  return { touched, totalEndpoints };
}

/**
 * Every port of the state, with `changed` one Set lookup per unchanged service's port (no map
 * lookups, no block check: at 10,000 services the three lookups per port were most of a
 * change's CPU), then the applied ports the state no longer has.
 */
function touchedByWalk(req: FastPlanRequest, ctx: RenderContext, changed: ReadonlySet<string> | undefined): { touched: Touched[]; totalEndpoints: number } {
  const { state, applied } = req;
  const touched: Touched[] = [];
  let matched = 0;
  let totalEndpoints = changed ? applied.totalEndpoints! : 0;
  for (const sp of state.services.values()) {
    if (changed && !changed.has(sp.serviceKey)) {
      matched++;
      continue;
    }
    const { endpoints, old } = visitPort(req, ctx, sp, touched);
    totalEndpoints += endpoints;
    if (old) matched++;
    if (changed && old) totalEndpoints -= old.endpoints;
  }
  if (matched < applied.blocks.size) {
    for (const [svc, keys] of applied.servicePorts) {
      for (const key of keys) {
        if (state.services.has(key)) continue;
        const old = applied.blocks.get(key)!;
        touched.push([key, old, undefined, svc]);
        if (changed) totalEndpoints -= old.endpoints;
      }
    }
  }
  return { touched, totalEndpoints };
}

/** How many of a block's dispatch rules each "table/chain" holds. */
type DispatchCounts = ReadonlyArray<readonly [string, number]>;

// Per block, its counts; blocks with the same counts share one array (a few shapes for 100,000 blocks).
const dispatchCounts = new WeakMap<ServiceBlock, DispatchCounts>();
const countShapes = new Map<string, DispatchCounts>();

function countsOf(b: ServiceBlock): DispatchCounts {
  const hit = dispatchCounts.get(b);
  if (hit) return hit;
  const m = new Map<string, number>();
  for (const [table, lines] of [['nat', b.natTop], ['filter', b.filter]] as const) {
    for (const l of lines) {
      const k = `${table}/${l.slice(3, l.indexOf(' ', 3))}`;
      m.set(k, (m.get(k) ?? 0) + 1);
    }
  }
  const shape = [...m].join(' ');
  let counts = countShapes.get(shape);
  if (!counts) {
    if (countShapes.size >= 1000) countShapes.clear();
    countShapes.set(shape, (counts = [...m]));
  }
  dispatchCounts.set(b, counts);
  return counts;
}

interface DispatchEditLines {
  nat: string[];
  filter: string[];
  natInserted: number;
  filterInserted: number;
  /** the "table/chain"s edited */
  chains: string[];
}

/** The first index of `keys` (sorted) whose key sorts after `k`. */
function firstAfter(keys: string[], k: string): number {
  let lo = 0;
  let hi = keys.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (keys[mid] > k) hi = mid;
    else lo = mid + 1;
  }
  return lo;
}

/**
 * For each of `sorted` (key order): the rules, per "table/chain", of the services whose key
 * sorts before it, with their content after this sync. One pass over the applied blocks,
 * whatever the number of services edited: a block that is not re-dispatched has the dispatch
 * rules it was applied with (an untouched port's block is the applied one; a touched one's
 * dispatch rules are the same lines).
 */
function rulesBeforeEach(sorted: Touched[], applied: AppliedBlocks): Array<Map<string, number>> {
  const keys = sorted.map(([k]) => k);
  const last = keys[keys.length - 1];
  // buckets[j]: rules of the services that sort after keys[j - 1] and before keys[j]
  const buckets = keys.map(() => new Map<string, number>());
  const add = (k: string, b: ServiceBlock) => {
    if (!(k < last)) return;
    const m = buckets[firstAfter(keys, k)];
    for (const [c, n] of countsOf(b)) m.set(c, (m.get(c) ?? 0) + n);
  };
  const redone = new Set(keys);
  for (const [k, b] of applied.blocks) if (!redone.has(k)) add(k, b);
  for (const [k, , b] of sorted) if (b) add(k, b);
  const out: Array<Map<string, number>> = [];
  let sum = new Map<string, number>();
  for (const m of buckets) {
    sum = new Map(sum);
    for (const [c, n] of m) sum.set(c, (sum.get(c) ?? 0) + n);
    out.push(sum);
  }
  return out;
}

/**
 * The restore lines that turn the dispatch chains (nat KUBE-SERVICES / KUBE-NODEPORTS, the
 * filter chains) from their applied content into what a full sync would write, editing only
 * the rules of `changed` services: each old rule deleted by its spec (`-D`: a wrong guess
 * fails the restore loudly, and the next sync is full), each new one inserted (`-I chain
 * pos`) where the full sync puts it. A chain holds the services' rules in service-port key
 * order (then, in nat KUBE-SERVICES, the NodePort catch-all), so a service's rules start
 * after the rules of every service whose key sorts before it. Services are edited in key
 * order, so when one is inserted all services before it already have their new rules.
 * Rewriting KUBE-SERVICES whole instead is one 20k-rule transaction at 10k services, which
 * iptables-nft commits in time quadratic in its size (docs/benchmarks.md).
 */
function dispatchEdits(changed: Touched[], applied: AppliedBlocks): DispatchEditLines {
  const out: DispatchEditLines = { nat: [], filter: [], natInserted: 0, filterInserted: 0, chains: [] };
  const chains = new Set<string>();
  const sorted = [...changed].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  // Only inserted rules need a place: removals alone are deletions by spec, in O(changed).
  const rulesBefore = sorted.some(([, , b]) => b) ? rulesBeforeEach(sorted, applied) : [];
  for (const [i, [, old, b]] of sorted.entries()) {
    const before = rulesBefore[i] ?? NO_COUNTS;
    for (const [table, oldLines, newLines] of [['nat', old?.natTop, b?.natTop], ['filter', old?.filter, b?.filter]] as const) {
      const lines = out[table];
      for (const l of oldLines ?? EMPTY_LINES) {
        lines.push(`-D${l.slice(2)}`);
        chains.add(`${table}/${l.slice(3, l.indexOf(' ', 3))}`);
      }
      const next = new Map<string, number>();
      for (const l of newLines ?? EMPTY_LINES) {
        const sp = l.indexOf(' ', 3);
        const chain = l.slice(3, sp);
        const k = `${table}/${chain}`;
        const pos = (before.get(k) ?? 0) + (next.get(k) ?? 0) + 1;
        next.set(k, (next.get(k) ?? 0) + 1);
        lines.push(`-I ${chain} ${pos}${l.slice(sp)}`);
        chains.add(k);
        if (table === 'nat') out.natInserted++;
        else out.filterInserted++;
      }
    }
  }
  out.chains = [...chains];
  return out;
}

/** The changed services' own chains that differ from their applied blocks, and the chains they use. */
function changedChains(touched: Touched[]): { units: ChainUnit[]; active: Set<string>; skippedChains: number; writtenServices: number } {
  const units: ChainUnit[] = [];
  const active = new Set<string>();
  let skippedChains = 0;
  let writtenServices = 0;
  for (const [, old, b] of touched) {
    if (!b) continue;
    writtenServices++;
    for (const c of b.active) active.add(c);
    for (const u of b.units) {
      if (old && u.declare && sameUnitIn(old, u)) {
        skippedChains++;
        continue;
      }
      units.push(u);
    }
  }
  return { units, active, skippedChains, writtenServices };
}

/** The chains the touched services used and use no more. */
function droppedChains(touched: Touched[]): string[] {
  const stale: string[] = [];
  for (const [, old, b] of touched) {
    if (!old) continue;
    const now = new Set(b?.active ?? EMPTY_LINES);
    for (const c of old.active) if (!now.has(c)) stale.push(c);
  }
  return stale;
}

/** Chains first, then the dispatch edits that jump to them, then the stale chains' deletion. */
function fastPayload(edits: DispatchEditLines, units: ChainUnit[], deletedChains: string[]): string {
  let payload = '';
  if (edits.filter.length) payload += ['*filter', ...edits.filter, 'COMMIT', ''].join('\n');
  if (!units.length && !deletedChains.length && !edits.nat.length) return payload;
  const out: string[] = ['*nat'];
  for (const u of units) if (u.declare) out.push(chainLine(u.name));
  for (const c of deletedChains) out.push(chainLine(c));
  for (const u of units) for (const r of u.rules) out.push(r);
  for (const l of edits.nat) out.push(l);
  for (const c of deletedChains) out.push(`-X ${c}`);
  out.push('COMMIT');
  return payload + out.join('\n') + '\n';
}

/** The nat rules the touched services add (negative: remove), dispatch rules included. */
function natRuleDelta(touched: Touched[]): number {
  let delta = 0;
  for (const [, old, b] of touched) delta += ruleCount(b) - ruleCount(old) + (b?.natTop.length ?? 0) - (old?.natTop.length ?? 0);
  return delta;
}

/** The ports with a NodePort after this sync: an untouched port's block is the applied one. */
function nodePortsAfter(applied: AppliedBlocks, touched: Touched[]): number {
  let n = applied.nodePorts;
  for (const [, old, b] of touched) n += (b?.nodePort ? 1 : 0) - (old?.nodePort ? 1 : 0);
  return n;
}

/** A partial sync in O(changed services), or null when it does not apply (see the top of this file). */
export function planPartialFast(req: FastPlanRequest): Plan | null {
  const { opts, applied } = req;
  // The applied settings, if the options are the same; large-cluster mode is checked after
  // the changed ports are visited, which counts the endpoints on the way.
  const ctx = applied.ctx;
  if (!ctx || settingsKey(opts, ctx.largeClusterMode) !== ctx.key) return null;
  const { touched, totalEndpoints } = touchedPorts(req, ctx);
  if (totalEndpoints > opts.largeClusterEndpointsThreshold !== ctx.largeClusterMode) return null;
  const redispatch = touched.filter(([, old, b]) => !sameLines(old?.natTop, b?.natTop) || !sameLines(old?.filter, b?.filter));
  // Many services' dispatch rules at once (a settings-like change): rewrite the chains whole.
  if (redispatch.length > MAX_DISPATCH_EDITS) return null;
  // Only when dispatch rules move (a Service added or removed...), one pass over the applied
  // blocks places them; an endpoint change, the common case, visits no other port.
  const edits = dispatchEdits(redispatch, applied);
  // Outside large-cluster mode nothing is ever deferred; inside, until the cleanup is due.
  const defer = ctx.largeClusterMode && req.deferStale;
  const written = changedChains(touched);
  // A deferred chain that a changed service uses again is no longer stale.
  const gone = [...req.deferred, ...droppedChains(touched)].filter((c) => !written.active.has(c));
  const deletedChains = defer ? [] : gone;
  let natRulesWritten = edits.natInserted;
  for (const u of written.units) natRulesWritten += u.rules.length;
  // The edited dispatch chains' digests are void: a later full-scan sync rewrites them.
  const chainDigests = new Map<string, string>();
  for (const c of edits.chains) chainDigests.set(c, '');
  const natRulesTotal = applied.natRulesTotal + natRuleDelta(touched);
  return {
    sysctls: routeLocalnetWith(opts, nodePortsAfter(applied, touched) > 0),
    payload: fastPayload(edits, written.units, deletedChains),
    natRulesWritten,
    natRulesTotal,
    filterRules: edits.filterInserted,
    activeNatChains: written.active,
    deletedChains,
    staleDeletion: false,
    writtenServices: written.writtenServices,
    largeClusterMode: ctx.largeClusterMode,
    chainDigests,
    skippedChains: written.skippedChains,
    applied: { kind: 'update', updates: touched.map(([key, , b, svc]) => [key, b, svc]), natRulesTotal, totalEndpoints },
    deferredChains: defer ? gone : [],
  };
}
