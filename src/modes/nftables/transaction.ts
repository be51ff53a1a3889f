// Turns a desired Ruleset into one `nft -f` transaction. A full sync re-declares and
// flushes everything kproxy owns (affinity sets excepted: re-adding keeps their entries, so
// session affinity survives syncs); a partial sync writes only what differs from the
// table last applied: changed chains are flushed and rewritten, set and map elements are
// added and deleted one by one, in command forms nft 1.0.6 runs without listing every chain
// of the table first (assemblePartial). Chains that fall out of use are flushed now and deleted in
// a later transaction: a kernel older than 6.2 still sees them referenced by a map element
// deleted in the same batch, and `delete chain` makes nft 1.0.6 list every chain (~1 s at
// 10,000 Services), so the proxier deletes them when idle. Affinity sets that fall out of use
// go the same way (`flush set` now, `delete set` later). Pure.
import {
  addChainLine,
  addElementLine,
  addElementsBySetLine,
  addRuleLine,
  addSetLine,
  addTableLine,
  chainWithRulesLine,
  elementKey,
  ruleText,
  tableRef,
  type NftChain,
  type NftElement,
  type Ruleset,
} from './ruleset.ts';
import { isAffinitySetName } from './names.ts';
import type { PreviousValues } from './incremental.ts';

export interface LiveNames {
  chains: Set<string>;
  /** name → kind */
  sets: Map<string, 'set' | 'map'>;
}

export interface Transaction {
  text: string;
  /** number of commands */
  ops: number;
  /** chains flushed here because they fell out of use; delete them in a later sync */
  staleChains: string[];
  /**
   * affinity sets flushed here because their endpoint went (`delete set` makes nft 1.0.6 list
   * every chain; `flush set` does not); delete them in a later sync, with the chains
   */
  staleSets: string[];
  /**
   * elements that went from the desired table but stay in the kernel for now (a partial
   * sync's `delete element` makes nft 1.0.6 list every chain: 1.4 s at 10,000 Services):
   * each jumps to a chain this transaction flushes, so a packet that finds it is not NATed,
   * or is a ClusterIP no Service uses any more (see deferrable); the proxier deletes them
   * later, with the retired chains
   */
  lingering: LingeringElement[];
  /** lingering elements (from earlier syncs) this transaction took back into use or deleted */
  revived: LingeringElement[];
  /** short description of what changed */
  summary: string;
}

export interface LingeringElement {
  set: string;
  el: NftElement;
}

/** set name → element key → element, of elements left in the kernel by earlier partial syncs */
export type Lingering = ReadonlyMap<string, ReadonlyMap<string, NftElement>>;

/** the plain set whose removed elements may linger: a ClusterIP there is only rejected on ports no Service has */
const CLUSTER_IPS_SET = 'cluster-ips';

/**
 * Whether a removed element may stay in the kernel until a later cleanup instead of being
 * deleted now: a `goto`/`jump` into a chain the same transaction flushes (a packet that
 * finds it runs an empty chain and comes back un-NATed, as if nothing matched), or a
 * ClusterIP in cluster-ips (packets to it on any port are rejected at once instead of
 * routed on, until the cleanup). Any other removal (a verdict into a live chain such as a
 * port moved to another number, a no-endpoint reject or drop) is deleted at once.
 */
export function deferrable(set: string, el: NftElement, flushed: ReadonlySet<string>): boolean {
  if (set === CLUSTER_IPS_SET) return true;
  const target = lingeringTarget(el);
  return target !== undefined && flushed.has(target);
}

/**
 * Element bookkeeping shared by both partial diffs: an element to add that lingers in the
 * kernel with the same value is already there (revived, nothing written); with another value
 * the lingering one is deleted first. A removal is deferred when deferrable().
 */
class ElementDiff {
  readonly delLines: string[] = [];
  readonly addLines: string[] = [];
  readonly lingering: LingeringElement[] = [];
  readonly revived: LingeringElement[] = [];

  constructor(
    private readonly desired: Ruleset,
    private readonly flushed: ReadonlySet<string>,
    private readonly kept: Lingering,
    private readonly defer: boolean,
  ) {}

  add(setName: string, el: NftElement, prev: NftElement | undefined | null): void {
    if (!prev) {
      const k = elementKey(el.key);
      const old = this.kept.get(setName)?.get(k);
      if (old) {
        this.revived.push({ set: setName, el: old });
        if (sameElement(old, el)) return;
        this.delLines.push(deleteElementLine(this.desired, setName, old));
      }
    } else this.delLines.push(deleteElementLine(this.desired, setName, prev));
    this.addLines.push(addElementsBySetLine(this.desired, this.desired.sets.get(setName)!, [el]));
  }

  remove(setName: string, el: NftElement): void {
    if (this.defer && deferrable(setName, el, this.flushed)) this.lingering.push({ set: setName, el });
    else this.delLines.push(deleteElementLine(this.desired, setName, el));
  }

  /**
   * A lingering element whose target chain is in use again (a Service re-created under the
   * same name, another address) would NAT packets to its old address: it goes now.
   */
  settle(): this {
    const taken = new Set(this.revived.map((r) => `${r.set} ${elementKey(r.el.key)}`));
    for (const [set, els] of this.kept) {
      for (const [k, el] of els) {
        if (taken.has(`${set} ${k}`)) continue;
        const target = lingeringTarget(el);
        if (target === undefined || !this.desired.chains.has(target)) continue;
        this.delLines.push(deleteElementLine(this.desired, set, el));
        this.revived.push({ set, el });
      }
    }
    return this;
  }
}

/** The chain a lingering element jumps to, if any (the proxier deletes that chain only after the element). */
export function lingeringTarget(el: NftElement): string | undefined {
  return /^(?:goto|jump) (\S+)$/.exec(el.value ?? '')?.[1];
}

/** `delete element` lines for lingering elements (a later cleanup). */
export function deleteElementsText(rs: { family: Ruleset['family']; table: string }, els: LingeringElement[]): string {
  return els.map(({ set, el }) => `delete element ${rs.family} ${rs.table} ${set} { ${elementKey(el.key)} }`).join('\n') + (els.length ? '\n' : '');
}

export interface PartialOptions {
  /** elements earlier partial syncs left in the kernel (Transaction.lingering) */
  lingering?: Lingering;
  /** defer the removals deferrable() allows (default true) */
  deferRemovals?: boolean;
}

export interface TransactionOptions {
  /** add+delete base chains first so a changed hook or priority can be re-created (first sync) */
  recreateBaseChains?: boolean;
}

function sameChain(a: NftChain, b: NftChain): boolean {
  if (a.type !== b.type || a.hook !== b.hook || a.priority !== b.priority || a.comment !== b.comment) return false;
  if (a.rules.length !== b.rules.length) return false;
  return a.rules.every((r, i) => ruleText(r) === ruleText(b.rules[i]));
}

function sameElement(a: NftElement, b: NftElement): boolean {
  return a.value === b.value && a.comment === b.comment;
}

function deleteElementLine(rs: Ruleset, set: string, el: NftElement): string {
  return `delete element ${tableRef(rs)} ${set} { ${elementKey(el.key)} }`;
}

/** Full sync: replaces the whole content of the table in one batch. */
export function fullTransaction(desired: Ruleset, live: LiveNames | null, opts: TransactionOptions = {}): Transaction {
  const t = tableRef(desired);
  const lines: string[] = [addTableLine(desired)];
  if (opts.recreateBaseChains) {
    for (const ch of desired.chains.values()) {
      if (ch.hook === undefined || !live?.chains.has(ch.name)) continue;
      lines.push(`add chain ${t} ${ch.name}`, `delete chain ${t} ${ch.name}`);
    }
  }
  // Only what exists is flushed: on a cold start that halves the transaction (a flush of a
  // chain created in the same batch is a no-op the kernel still has to process).
  for (const s of desired.sets.values()) {
    lines.push(addSetLine(desired, s));
    if (!isAffinitySetName(s.name) && (!live || live.sets.has(s.name))) lines.push(`flush ${s.kind} ${t} ${s.name}`);
  }
  for (const ch of desired.chains.values()) {
    lines.push(addChainLine(desired, ch));
    if (!live || live.chains.has(ch.name)) lines.push(`flush chain ${t} ${ch.name}`);
  }
  for (const ch of desired.chains.values()) for (const r of ch.rules) lines.push(addRuleLine(desired, ch.name, r));
  for (const s of desired.sets.values()) {
    if (isAffinitySetName(s.name)) continue;
    for (const el of s.elements.values()) lines.push(addElementLine(desired, s.name, el));
  }
  const staleChains = [...(live?.chains ?? [])].filter((c) => !desired.chains.has(c)).sort();
  for (const c of staleChains) lines.push(`flush chain ${t} ${c}`);
  const staleSets = [...(live?.sets.keys() ?? [])].filter((s) => !desired.sets.has(s)).sort();
  for (const s of staleSets) lines.push(`delete ${live!.sets.get(s)} ${t} ${s}`);
  return {
    text: lines.join('\n') + '\n',
    ops: lines.length,
    staleChains,
    staleSets: [],
    lingering: [],
    revived: [],
    summary: `full sync: ${desired.chains.size} chains, ${desired.sets.size} sets/maps; ${staleChains.length} stale chains flushed, ${staleSets.length} stale sets deleted`,
  };
}

/** Partial sync: only the differences from `applied` (the table as kproxy last wrote it). */
export function partialTransaction(desired: Ruleset, applied: Ruleset, opts: PartialOptions = {}): Transaction {
  const t = tableRef(desired);
  const setLines: string[] = [];
  const chainLines: string[] = [];
  const ruleLines: string[] = [];
  const changedChains: string[] = [];
  const staleChains = [...applied.chains.keys()].filter((c) => !desired.chains.has(c)).sort();
  const els = new ElementDiff(desired, new Set(staleChains), opts.lingering ?? new Map(), opts.deferRemovals ?? true);

  for (const s of desired.sets.values()) {
    const old = applied.sets.get(s.name);
    if (!old) setLines.push(addSetLine(desired, s));
    if (isAffinitySetName(s.name)) continue;
    const oldEls: Map<string, NftElement> = old?.elements ?? new Map();
    for (const [k, el] of s.elements) {
      const prev = oldEls.get(k);
      if (prev && sameElement(prev, el)) continue;
      els.add(s.name, el, prev);
    }
    for (const [k, el] of oldEls) if (!s.elements.has(k)) els.remove(s.name, el);
  }

  for (const ch of desired.chains.values()) {
    const old = applied.chains.get(ch.name);
    if (old && sameChain(old, ch)) continue;
    changedChains.push(ch.name);
    chainLines.push(addChainLine(desired, ch));
    if (old) chainLines.push(`flush chain ${t} ${ch.name}`);
    if (ch.rules.length) ruleLines.push(chainWithRulesLine(desired, ch));
  }
  declareReferencedSets(desired, changedChains, setLines);

  const staleSets = [...applied.sets.values()].filter((s) => !desired.sets.has(s.name)).map((s) => [s.name, s.kind] as const).sort();
  return assemblePartial(desired, { setLines, chainLines, ruleLines, els, tail: [] }, changedChains.length, staleChains, staleSets);
}

/**
 * nft resolves `@set` in a rule from its cache, and a partial transaction's cache holds only
 * the sets it declares itself (assemblePartial): re-declare, with their unchanged
 * specification, the sets the rewritten chains use. Re-declaring keeps a set's elements
 * (affinity entries survive).
 */
function declareReferencedSets(desired: Ruleset, chains: string[], setLines: string[]): void {
  const declared = new Set(setLines.map((l) => / (?:set|map) \S+ \S+ (\S+)/.exec(l)?.[1]));
  for (const name of chains) {
    for (const r of desired.chains.get(name)!.rules) {
      for (const m of r.rule.matchAll(/@(\S+)/g)) {
        const s = desired.sets.get(m[1]);
        if (!s || declared.has(s.name)) continue;
        declared.add(s.name);
        setLines.push(addSetLine(desired, s));
      }
    }
  }
}

/** Deletes chains retired by earlier syncs. */
export function deleteChainsTransaction(rs: { family: Ruleset['family']; table: string }, chains: string[], sets: string[] = []): string {
  return [...chains.map((c) => `delete chain ${rs.family} ${rs.table} ${c}`), ...sets.map((s) => `delete set ${rs.family} ${rs.table} ${s}`)].join('\n') + '\n';
}

/**
 * Partial sync when only some ports were replanned (IncrementalPlanner): the same commands
 * partialTransaction would write, found by comparing only the objects the replanned ports
 * name with their previous values, so its cost follows the change, not the table.
 */
export function partialTransactionFor(desired: Ruleset, previous: PreviousValues, opts: PartialOptions = {}): Transaction {
  const t = tableRef(desired);
  const setLines: string[] = [];
  const chainLines: string[] = [];
  const ruleLines: string[] = [];
  const changedChains: string[] = [];

  for (const [name, old] of previous.sets) {
    const s = desired.sets.get(name);
    if (s && !old) setLines.push(addSetLine(desired, s));
  }
  const staleChains: string[] = [];
  for (const [name, old] of previous.chains) {
    const ch = desired.chains.get(name);
    if (!ch) {
      if (old) staleChains.push(name);
      continue;
    }
    if (old && (old === ch || sameChain(old, ch))) continue;
    changedChains.push(name);
    chainLines.push(addChainLine(desired, ch));
    if (old) chainLines.push(`flush chain ${t} ${name}`);
    if (ch.rules.length) ruleLines.push(chainWithRulesLine(desired, ch));
  }
  const els = new ElementDiff(desired, new Set(staleChains), opts.lingering ?? new Map(), opts.deferRemovals ?? true);
  for (const [setName, prevEls] of previous.elements) {
    const want = desired.sets.get(setName)?.elements;
    for (const [k, prev] of prevEls) {
      const el = want?.get(k);
      if (el && prev && (el === prev || sameElement(prev, el))) continue;
      if (el) els.add(setName, el, prev);
      else if (prev) els.remove(setName, prev);
    }
  }
  declareReferencedSets(desired, changedChains, setLines);
  staleChains.sort();
  const staleSets = [...previous.sets].filter(([s, old]) => old && !desired.sets.has(s)).map(([s, old]) => [s, old!.kind] as const).sort();
  return assemblePartial(desired, { setLines, chainLines, ruleLines, els, tail: [] }, changedChains.length, staleChains, staleSets);
}

/** The commands of a partial sync whose nft 1.0.6 cache is only the table list (see assemblePartial). */
export const PARTIAL_O1_COMMANDS = /^(?:add chain|flush chain|add set|add map|flush set) /;

/**
 * The partial transaction's text, in the order nft needs: sets, chain declarations (and
 * flushes), chains' rules, elements, retirements. It uses only commands whose nft cache is
 * the table list (nft 1.0.6, src/cache.c), so its cost follows the change, not the table:
 * no `add table` with a body (a full chain listing), rules as `add chain NAME { ... }`
 * (chainWithRulesLine), elements as `add set|map NAME { ... elements = { ... } }`
 * (addElementsBySetLine), `flush chain`, `flush set` (a retired affinity set). Only
 * `delete element` (and `delete set` of a shared set) still makes nft 1.0.6 list every chain
 * (CMD_DELETE; nft 1.0.6 has no `destroy`, and deleting by handle lists the same). Without `add table` a table deleted
 * behind kproxy's back fails the transaction; the proxier then runs a full sync.
 */
function assemblePartial(
  desired: Ruleset,
  p: { setLines: string[]; chainLines: string[]; ruleLines: string[]; els: ElementDiff; tail: string[] },
  changedChains: number,
  staleChains: string[],
  staleSets: ReadonlyArray<readonly [string, 'set' | 'map']>,
): Transaction {
  // Retired chains are flushed now, deleted later; so are retired affinity sets (only their
  // chain used them); any other set that goes is deleted at once.
  const t = tableRef(desired);
  const retiredSets = staleSets.filter(([s]) => isAffinitySetName(s)).map(([s]) => s);
  p.tail.push(...staleChains.map((c) => `flush chain ${t} ${c}`));
  for (const [s, kind] of staleSets) p.tail.push(isAffinitySetName(s) ? `flush ${kind} ${t} ${s}` : `delete ${kind} ${t} ${s}`);
  const { delLines, addLines, lingering, revived } = p.els.settle();
  const body = [...p.setLines, ...p.chainLines, ...p.ruleLines, ...delLines, ...addLines, ...p.tail];
  if (body.length === 0) return { text: '', ops: 0, staleChains: [], staleSets: [], lingering, revived, summary: 'no changes' };
  return {
    text: body.join('\n') + '\n',
    ops: body.length,
    staleChains,
    staleSets: retiredSets,
    lingering,
    revived,
    summary:
      `partial sync: ${changedChains} chains rewritten, ${addLines.length} elements added, ` +
      `${delLines.length} elements deleted, ${lingering.length} left for later, ${staleChains.length} chains and ${retiredSets.length} affinity sets retired`,
  };
}
