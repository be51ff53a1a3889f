// The rendered service blocks a sync works from (service-block.ts renders one), cached per
// ServicePort in a BlockCache that the sync state owns: a block only changes when its
// ServicePort or endpoint list does (the trackers replace those objects on change) or the
// settings do, so unchanged services are not rebuilt, and an unchanged service's block is the
// same object from one sync to the next (what a fast partial sync compares, by identity). Pure.
import type { Endpoint, ProxyState, ServicePort } from '../../core/model.ts';
import { NO_ENDPOINTS, portOf } from '../../core/nodeview.ts';
import type { IptablesOptions } from './options.ts';
import { renderServiceBlock, type BlockSettings, type ServiceBlock } from './service-block.ts';
import { ruleTotal, sameLines, unitDigest, type ChainUnit } from './units.ts';

export const EMPTY: Endpoint[] = NO_ENDPOINTS;

/** The block settings of one sync, with a fingerprint of them for the cache. */
export interface RenderContext extends BlockSettings {
  /** fingerprint of the settings, for the block cache */
  key: string;
}

/**
 * The per-service-port blocks the last applied sync rendered, and the render settings they
 * were rendered with: the base of the next partial sync. Held by the sync state.
 */
export interface AppliedBlocks {
  /** the render settings the blocks were rendered with (undefined: none yet) */
  ctx?: RenderContext;
  /** sp.key → its block */
  blocks: Map<string, ServiceBlock>;
  /**
   * Each Service's ("ns/name") keys in `blocks`: a fast partial sync finds a changed Service's
   * ports that went without a walk over every block.
   */
  servicePorts: Map<string, Set<string>>;
  /** blocks of ports with a NodePort (plan.ts routeLocalnet), kept up to date by fast partial syncs */
  nodePorts: number;
  /** nat rules of all blocks plus the dispatch and static chains (Plan.natRulesTotal) */
  natRulesTotal: number;
  /** endpoints of all blocks (large-cluster mode), kept up to date by fast partial syncs */
  totalEndpoints?: number;
}

/** Applies one port's change to the applied blocks: its block now (undefined: gone), of Service `svc`. */
export function updateApplied(a: AppliedBlocks, key: string, b: ServiceBlock | undefined, svc: string): void {
  const old = a.blocks.get(key);
  if (old?.nodePort) a.nodePorts--;
  if (b?.nodePort) a.nodePorts++;
  let keys = a.servicePorts.get(svc);
  if (b) {
    a.blocks.set(key, b);
    if (!keys) a.servicePorts.set(svc, (keys = new Set()));
    keys.add(key);
  } else {
    a.blocks.delete(key);
    keys?.delete(key);
    if (keys?.size === 0) a.servicePorts.delete(svc);
  }
}

/** Each service port's last rendered block, by its ServicePort object. */
export class BlockCache {
  private readonly blocks = new WeakMap<ServicePort, { eps: Endpoint[]; key: string; block: ServiceBlock }>();

  /** The block of a service port; `needChains` false accepts a compacted one (its chains are not written). */
  block(sp: ServicePort, eps: Endpoint[], ctx: RenderContext, needChains = true): ServiceBlock {
    const hit = this.blocks.get(sp);
    if (hit && hit.eps === eps && hit.key === ctx.key && !(needChains && hit.block.compact)) return hit.block;
    // The port as the node view decides it (without the VIPs no rule may hold: src/core/vip.ts).
    const block = renderServiceBlock(portOf(ctx.opts.node, sp, eps), ctx);
    this.blocks.set(sp, { eps, key: ctx.key, block });
    return block;
  }

  /**
   * Memory (kproxy, not upstream): after a full sync the cached blocks of every service keep
   * only what a partial sync reads for a service it does not write (its KUBE-SERVICES /
   * KUBE-NODEPORTS and filter rules, its chain names, its rule count); the text of its own
   * chains, two thirds of the block and most of the planner's memory at 10,000 Services, is
   * dropped and rendered again when the service changes or a full sync writes it
   * (docs/benchmarks.md §1, "Rule programming vs the number of Services"). Blocks of services not in the state are left alone.
   */
  compact(state: ProxyState): void {
    for (const sp of state.services.values()) {
      const hit = this.blocks.get(sp);
      if (!hit || hit.block.compact) continue;
      // In place: the block is also the applied one (AppliedBlocks compares blocks by identity).
      const b = hit.block;
      const chains = new Map<string, string>();
      for (const u of b.units) if (u.declare) chains.set(u.name, unitDigest(u));
      b.compact = { ruleCount: ruleTotal(b.units), chains };
      b.units = [];
    }
  }
}

// The same settings give the same string object, so the block cache's key check (once per
// service per sync) compares pointers, not a kilobyte of JSON. A few entries: one per family
// (and a test's variations); cleared when full.
const keys = new Map<string, string>();
function internKey(key: string): string {
  const hit = keys.get(key);
  if (hit !== undefined) return hit;
  if (keys.size >= 16) keys.clear();
  keys.set(key, key);
  return key;
}

/** The cache fingerprint of these options in this large-cluster mode. */
export function settingsKey(opts: IptablesOptions, largeClusterMode: boolean): string {
  return internKey(JSON.stringify([opts, largeClusterMode]));
}

export function renderContext(state: ProxyState, opts: IptablesOptions): RenderContext {
  let totalEndpoints = 0;
  for (const sp of state.services.values()) totalEndpoints += state.endpoints.get(sp.key)?.length ?? 0;
  const largeClusterMode = totalEndpoints > opts.largeClusterEndpointsThreshold;
  return {
    opts,
    largeClusterMode,
    ifLocal: opts.localDetector ? opts.localDetector.ifLocal.join(' ') : '',
    ifNotLocal: opts.localDetector ? opts.localDetector.ifNotLocal.join(' ') : '',
    key: settingsKey(opts, largeClusterMode),
  };
}

/**
 * The service port whose rules or chain declarations include this payload line, or null
 * (the fixed rules, stale chain deletions). Names the Service whose line iptables-restore
 * refused; a linear scan over the (cached) blocks, only run after a failure.
 */
export function ownerOfPayloadLine(state: ProxyState, opts: IptablesOptions, text: string, cache = new BlockCache()): ServicePort | null {
  // A dispatch rule inserted in place (a partial or restart edit) is the block's `-A` line at a position.
  const ins = /^-I (\S+) \d+ (.*)$/.exec(text);
  const line = ins ? `-A ${ins[1]} ${ins[2]}` : text;
  const ctx = renderContext(state, opts);
  for (const sp of state.services.values()) {
    const b = cache.block(sp, state.endpoints.get(sp.key) ?? EMPTY, ctx);
    if (b.rules.includes(line) || b.natTop.includes(line) || b.filter.includes(line) || b.chains.includes(line)) return sp;
  }
  return null;
}

/** the rules of a block's own chains, also once compacted */
export function ruleCount(b: ServiceBlock | undefined): number {
  return b ? (b.compact?.ruleCount ?? ruleTotal(b.units)) : 0;
}

/** Whether `block` has a declared chain named as `u` with the same rules. */
export function sameUnitIn(block: ServiceBlock, u: ChainUnit): boolean {
  if (block.compact) {
    const d = block.compact.chains.get(u.name);
    return d !== undefined && d === unitDigest(u);
  }
  for (const o of block.units) if (o.name === u.name) return o.declare && sameLines(o.rules, u.rules);
  return false;
}

export function endpointsOf(blocks: Map<string, ServiceBlock>): number {
  let n = 0;
  for (const b of blocks.values()) n += b.endpoints;
  return n;
}
