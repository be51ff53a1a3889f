// A full sync over installed rules (kproxy, not upstream): the restart form. Upstream's first
// sync after a restart rewrites every chain in one transaction; at 10,000 Services that is
// 200,000 rules and, on the nf_tables backend, a commit held for seconds per chunk (tens of
// seconds in all). Here every chain whose installed content already is the planned one is
// adopted as is (the common restart: nothing changed while kproxy was down), and the rest is
// written in restores of about `chunkLines` lines (0: one restore), in this order:
// 1. leaf chunks: the static chains that differ, then, a group of whole services per chunk,
//    each service's own chains that differ or are missing (declared, so flushed, and written
//    whole); nothing new is reachable yet, and an installed chain is replaced at once;
// 2. the dispatch edits: the filter chains and nat KUBE-SERVICES / KUBE-NODEPORTS edited in
//    place (`-D` of rules no longer wanted, `-I` of new ones where they belong), so a Service
//    whose rules did not change stays reachable throughout and a changed one is switched in
//    one transaction. With a dispatch budget (nf_tables: dispatchBudget) in restores of about
//    that many lines, each Service's edits in one (dispatch-chunks.ts), then the stale service
//    chains flushed (with the last one when it fits); without (legacy, whose every commit
//    replaces the whole table: one restore) in one restore with the flushes (chainEdits per
//    chain, a chain rewritten whole when that is shorter);
// 3. the stale chains deleted (`-X`), nothing jumping to them any more.
// --noflush semantics are kept: only chains kproxy owns are declared, flushed or deleted.
// The sync state (sync-state.ts) takes this form when the installed chains include a service
// chain. Pure.
import type { ProxyState } from '../../core/model.ts';
import type { IptablesOptions } from './options.ts';
import { serviceChains } from './names.ts';
import { canonicalRule, chainDigest, type InstalledChain, type InstalledChains } from './canonical.ts';
import { chunkedDispatchEdits, keptRules, serviceChainKey, STATIC_GROUP, type DispatchChain } from './dispatch-chunks.ts';
import { BlockCache } from './blocks.ts';
import { fullRuleset } from './full.ts';
import { DISPATCH_CHAINS, rulesetPlan, staleChains, unchangedLeftOut, type Plan, type Ruleset } from './plan.ts';
import { chainLine, type ChainUnit } from './units.ts';

export interface RestartPlanRequest {
  state: ProxyState;
  opts: IptablesOptions;
  /** kproxy's chains as the kernel holds them (canonical.ts installedChains, from the sync's iptables-save) */
  installed: InstalledChains;
  /** nat chains installed; the service chains among them that are not wanted are deleted */
  installedNatChains?: ReadonlySet<string>;
  /** false leaves the stale chains installed (large-cluster mode, within syncPeriod, as upstream) */
  deleteStale?: boolean;
  /** lines per restore (0: one restore for the leaf chains and the dispatch edits) */
  chunkLines: number;
  /**
   * Lines per restore of the dispatch edits, each Service's edits in one restore. Unset:
   * dispatchBudget. 0: every dispatch edit in one restore (what legacy, whose every commit
   * replaces the whole table, does through chunkLines 0; bench/iptables-restart.ts compares
   * the two forms).
   */
  dispatchChunkLines?: number;
  /** the blocks rendered so far (the sync state's); none: rendered afresh */
  cache?: BlockCache;
}

/**
 * Lines per restore of a restart's dispatch edits by default (kproxy, not upstream; 0: one
 * restore): the chunk size, or a quarter of the planned nat dispatch rules (KUBE-SERVICES and
 * KUBE-NODEPORTS) when that is more, up to twice the chunk size. Every dispatch restore pays a
 * floor that grows with the ruleset, so a fixed budget would make the restores' total grow as
 * N²; this one keeps a rewrite of every dispatch rule at about 8 restores up to 20,000
 * Services (figures: docs/benchmarks.md §1, "Rule programming vs the number of Services").
 */
export function dispatchBudget(chunkLines: number, dispatchRules: number): number {
  if (!chunkLines) return 0;
  return Math.min(2 * chunkLines, Math.max(chunkLines, Math.floor(dispatchRules / 4)));
}

/**
 * The restore lines that turn an installed chain into `rules` (planned `-A` lines): null when
 * its rules already are those (canonical.ts); otherwise in-place edits, each installed rule
 * not kept deleted (`-D` by the line iptables-save printed, or by position for a duplicate;
 * last first) and each missing one inserted where it belongs (`-I chain pos`), keeping the
 * longest run of installed rules that is already in planned order (a longest increasing
 * subsequence); or the chain declared (flushed) and rewritten whole when that is shorter or
 * the chain is not installed.
 */
export function chainEdits(name: string, installed: InstalledChain | undefined, rules: readonly string[]): { decls: string[]; lines: string[]; written: number } | null {
  const whole = { decls: [chainLine(name)], lines: [...rules], written: rules.length };
  if (!installed || !installed.canon || !installed.lines) return whole;
  const want = rules.map(canonicalRule);
  const have = installed.canon;
  const haveLines = installed.lines;
  if (want.length === have.length && want.every((c, i) => c === have[i])) return null;
  const kept = keptRules(have, want);
  const keptPlanned = new Set<number>();
  const keptInstalled = new Set<number>();
  kept.keptPlanned.forEach((k, j) => {
    if (!k) return;
    keptPlanned.add(j);
    keptInstalled.add(kept.match[j]);
  });
  const edits = have.length - keptInstalled.size + want.length - keptPlanned.size;
  if (edits >= rules.length) return whole;
  const lines: string[] = [];
  // Last first, so each deletion leaves the positions before it as read. By spec when the rule
  // is unique in the chain; a duplicate by its position, or -D would take the first copy.
  const copies = new Map<string, number>();
  for (const c of have) copies.set(c, (copies.get(c) ?? 0) + 1);
  for (let i = have.length - 1; i >= 0; i--) {
    if (keptInstalled.has(i)) continue;
    lines.push(copies.get(have[i])! > 1 ? `-D ${name} ${i + 1}` : `-D${haveLines[i].slice(2)}`);
  }
  let written = 0;
  for (let j = 0; j < rules.length; j++) {
    if (keptPlanned.has(j)) continue;
    const r = rules[j];
    lines.push(`-I ${name} ${j + 1}${r.slice(r.indexOf(' ', 3))}`);
    written++;
  }
  return { decls: [], lines, written };
}

/** The restores being built, and what they write. */
class Restores {
  readonly chunks: string[] = [];
  decls: string[] = [];
  lines: string[] = [];
  natRules = 0;
  filterRules = 0;
  adopted = 0;

  get size(): number {
    return this.decls.length + this.lines.length;
  }

  /** Ends the nat restore being built, if it holds anything. */
  flush(): void {
    if (!this.decls.length && !this.lines.length) return;
    this.chunks.push(['*nat', ...this.decls, ...this.lines, 'COMMIT', ''].join('\n'));
    this.decls = [];
    this.lines = [];
  }

  /** A nat chain written whole (declared, so flushed). */
  add(u: ChainUnit): void {
    this.decls.push(chainLine(u.name));
    for (const r of u.rules) this.lines.push(r);
    this.natRules += u.rules.length;
  }
}

/** What the restart compares and writes. */
interface RestartInput {
  r: Ruleset;
  filterUnits: ChainUnit[];
  natStaticUnits: ChainUnit[];
  deleted: string[];
  nat: Map<string, InstalledChain>;
  filter: Map<string, InstalledChain>;
  maxLines: number;
}

/** Step 1: the static and service chains that differ from the installed ones; returns the dispatch chains. */
function leafRestores(w: Restores, o: RestartInput): ChainUnit[] {
  /** the unit, or null when installed as planned */
  const leaf = (u: ChainUnit): ChainUnit | null => {
    const inst = o.nat.get(u.name);
    if (inst && inst.digest === chainDigest(u.rules)) {
      w.adopted++;
      return null;
    }
    return u;
  };
  const dispatch: ChainUnit[] = [];
  for (const u of o.natStaticUnits) {
    if (DISPATCH_CHAINS.has(u.name)) dispatch.push(u);
    else if (leaf(u)) w.add(u);
  }
  const { units, starts } = o.r.written;
  for (let s = 0; s < starts.length; s++) {
    const end = s + 1 < starts.length ? starts[s + 1] : units.length;
    const write: ChainUnit[] = [];
    for (let i = starts[s]; i < end; i++) {
      const u = leaf(units[i]);
      if (u) write.push(u);
    }
    if (!write.length) continue;
    let n = 0;
    for (const u of write) n += 1 + u.rules.length;
    if (o.maxLines && w.size && w.size + n > o.maxLines) w.flush();
    for (const u of write) w.add(u);
  }
  if (o.maxLines) w.flush();
  return dispatch;
}

/** Each dispatch rule's Service (the others are static), and each service port's chains' Service. */
function dispatchOwners(r: Ruleset): { owners: Map<string, string>; chainOwners: Map<string, string> } {
  const owners = new Map<string, string>();
  const chainOwners = new Map<string, string>();
  for (const [sp, b] of r.blocks) {
    for (const l of b.filter) owners.set(l, sp.serviceKey);
    for (const l of b.natTop) owners.set(l, sp.serviceKey);
    chainOwners.set(serviceChainKey(serviceChains(sp).svc)!, sp.serviceKey);
  }
  return { owners, chainOwners };
}

/** Step 2 and 3, chunked: the dispatch edits in restores of about `dispatchLines` lines, each Service's in one. */
function chunkedDispatchRestores(w: Restores, o: RestartInput, dispatch: ChainUnit[], dispatchLines: number): void {
  w.flush();
  const { owners, chainOwners } = dispatchOwners(o.r);
  const chains: DispatchChain[] = [];
  const ownersOf = (u: ChainUnit) => u.rules.map((r) => owners.get(r) ?? STATIC_GROUP);
  for (const u of o.filterUnits) chains.push({ table: 'filter', name: u.name, rules: u.rules, owners: ownersOf(u), installed: o.filter.get(u.name) });
  for (const u of dispatch) chains.push({ table: 'nat', name: u.name, rules: u.rules, owners: ownersOf(u), installed: o.nat.get(u.name) });
  const d = chunkedDispatchEdits(chains, dispatchLines, chainOwners);
  w.adopted += d.adopted;
  w.natRules += d.written.nat;
  w.filterRules += d.written.filter;
  // The stale chains' flush after every edit: with the last restore when it fits.
  const stale = o.deleted.map(chainLine);
  const last = d.chunks.at(-1);
  if (last && last.filter.length + last.nat.length + stale.length <= dispatchLines) {
    last.nat.unshift(...stale);
    stale.length = 0;
  }
  for (const c of d.chunks) {
    let text = '';
    if (c.filter.length) text += ['*filter', ...c.filter, 'COMMIT', ''].join('\n');
    if (c.nat.length) text += ['*nat', ...c.nat, 'COMMIT', ''].join('\n');
    if (text) w.chunks.push(text);
  }
  const budget = o.maxLines || dispatchLines;
  for (const l of stale) {
    w.decls.push(l);
    if (w.decls.length >= budget) w.flush();
  }
  w.flush();
  // Then the stale chains deleted, nothing jumping to them any more.
  for (const c of o.deleted) {
    w.lines.push(`-X ${c}`);
    if (w.lines.length >= budget) w.flush();
  }
  w.flush();
}

/** Step 2 and 3 in one dispatch restore (with the leaf lines when not chunked): chainEdits per chain. */
function oneDispatchRestore(w: Restores, o: RestartInput, dispatch: ChainUnit[]): void {
  const filterOut = { decls: [] as string[], lines: [] as string[] };
  for (const u of o.filterUnits) {
    const e = chainEdits(u.name, o.filter.get(u.name), u.rules);
    if (!e) {
      w.adopted++;
      continue;
    }
    filterOut.decls.push(...e.decls);
    filterOut.lines.push(...e.lines);
    w.filterRules += e.written;
  }
  for (const u of dispatch) {
    const e = chainEdits(u.name, o.nat.get(u.name), u.rules);
    if (!e) {
      w.adopted++;
      continue;
    }
    w.decls.push(...e.decls);
    w.lines.push(...e.lines);
    w.natRules += e.written;
  }
  for (const c of o.deleted) w.decls.push(chainLine(c));
  let last = '';
  if (filterOut.decls.length || filterOut.lines.length) last += ['*filter', ...filterOut.decls, ...filterOut.lines, 'COMMIT', ''].join('\n');
  if (!o.maxLines) for (const c of o.deleted) w.lines.push(`-X ${c}`);
  if (w.decls.length || w.lines.length) last += ['*nat', ...w.decls, ...w.lines, 'COMMIT', ''].join('\n');
  w.decls = [];
  w.lines = [];
  if (last) w.chunks.push(last);
  // Chunked: the flushed stale chains deleted in restores of their own.
  if (o.maxLines) {
    for (const c of o.deleted) {
      w.lines.push(`-X ${c}`);
      if (w.lines.length >= o.maxLines) w.flush();
    }
    w.flush();
  }
}

/** The restores of a full sync over installed rules. */
export function planRestart(req: RestartPlanRequest): Plan {
  const { state, opts } = req;
  const r = fullRuleset(state, opts, req.cache ?? new BlockCache());
  const deleted = staleChains(req.installedNatChains, r.active, req.deleteStale !== false);
  const chainDigests = new Map<string, string>();
  const skipped = { n: 0 };
  const o: RestartInput = {
    r,
    filterUnits: unchangedLeftOut('filter', r.filterUnits, chainDigests, undefined, skipped),
    natStaticUnits: unchangedLeftOut('nat', r.natStaticUnits, chainDigests, undefined, skipped),
    deleted,
    nat: req.installed.get('nat') ?? new Map<string, InstalledChain>(),
    filter: req.installed.get('filter') ?? new Map<string, InstalledChain>(),
    maxLines: req.chunkLines,
  };
  const w = new Restores();
  const dispatch = leafRestores(w, o);
  let dispatchRules = 0;
  for (const u of dispatch) dispatchRules += u.rules.length;
  const dispatchLines = req.dispatchChunkLines ?? dispatchBudget(req.chunkLines, dispatchRules);
  if (dispatchLines) chunkedDispatchRestores(w, o, dispatch, dispatchLines);
  else oneDispatchRestore(w, o, dispatch);
  return rulesetPlan(r, req, {
    payload: '',
    natRulesWritten: w.natRules,
    filterRules: w.filterRules,
    deletedChains: deleted,
    chainDigests,
    skippedChains: 0,
    chunks: w.chunks,
    adoptedChains: w.adopted,
  });
}
