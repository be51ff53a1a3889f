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
import { elementKey, ruleText, type NftOp, type NftTableRef } from '../../kernel/nft/model.ts';
import { rulesetLookup, tableOf, type NftChain, type NftElement, type NftFamily, type NftSet, type Ruleset, type TableLookup } from './ruleset.ts';
import { isAffinitySetName } from './names.ts';
import type { Owners, PreviousValues } from './incremental.ts';


export interface LiveNames {
  chains: Set<string>;
  /** name → kind */
  sets: Map<string, 'set' | 'map'>;
}

export const NO_OWNERS: Owners = { chain: () => undefined, set: () => undefined, element: () => undefined };

export interface Transaction {
  /** the operations, in order (model.ts renderOps writes them) */
  ops: NftOp[];
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

/** Builds the operations of one table, each with the service port that owns its object. */
class OpWriter {
  constructor(
    readonly t: NftTableRef,
    private readonly owners: Owners,
  ) {}

  private own<T extends NftOp>(op: T, owner: string | undefined): T {
    if (owner !== undefined) op.owner = owner;
    return op;
  }

  table(comment: string | undefined): NftOp {
    return { verb: 'add', in: this.t, kind: 'table', comment };
  }

  /** `add chain NAME` with its declaration (spec), and its rules as a body when `rules` */
  chain(verb: NftOp['verb'], name: string, spec?: NftChain, rules?: boolean): NftOp {
    return this.own({ verb, in: this.t, kind: 'chain', name, ...(spec ? { spec } : {}), ...(rules ? { rules } : {}) }, this.owners.chain(name));
  }

  rule(chain: string, rule: NftChain['rules'][number]): NftOp {
    // The owner in the literal: added afterwards it would cost each op a property array
    // (~40 bytes; a full sync at 10,000 Services holds ~180,000 rule ops at once).
    const owner = this.owners.chain(chain);
    return owner === undefined ? { verb: 'add', in: this.t, kind: 'rule', chain, rule } : { verb: 'add', in: this.t, kind: 'rule', chain, rule, owner };
  }

  set(verb: NftOp['verb'], setKind: 'set' | 'map', name: string, spec?: NftSet): NftOp {
    return this.own({ verb, in: this.t, kind: 'set', setKind, name, ...(spec ? { spec } : {}) }, this.owners.set(name));
  }

  /** one element; with `spec`, written as a re-declaration of its set (model.ts renderOp) */
  element(verb: 'add' | 'delete', set: string, el: NftElement, spec?: NftSet): NftOp {
    if (spec) return this.own({ verb, in: this.t, kind: 'element', set, elements: [el], spec }, this.owners.element(set, elementKey(el.key)));
    const owner = this.owners.element(set, elementKey(el.key));
    return owner === undefined ? { verb, in: this.t, kind: 'element', set, elements: [el] } : { verb, in: this.t, kind: 'element', set, elements: [el], owner };
  }
}

/**
 * Element bookkeeping shared by both partial diffs: an element to add that lingers in the
 * kernel with the same value is already there (revived, nothing written); with another value
 * the lingering one is deleted first. A removal is deferred when deferrable().
 */
class ElementDiff {
  readonly dels: NftOp[] = [];
  readonly adds: NftOp[] = [];
  readonly lingering: LingeringElement[] = [];
  readonly revived: LingeringElement[] = [];

  constructor(
    private readonly desired: TableLookup,
    private readonly w: OpWriter,
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
        this.dels.push(this.w.element('delete', setName, old));
      }
    } else this.dels.push(this.w.element('delete', setName, prev));
    this.adds.push(this.w.element('add', setName, el, this.desired.set(setName)!));
  }

  remove(setName: string, el: NftElement): void {
    if (this.defer && deferrable(setName, el, this.flushed)) this.lingering.push({ set: setName, el });
    else this.dels.push(this.w.element('delete', setName, el));
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
        if (target === undefined || !this.desired.hasChain(target)) continue;
        this.dels.push(this.w.element('delete', set, el));
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

/** `delete element` operations for lingering elements (a later cleanup). */
export function deleteElementsOps(t: NftTableRef, els: LingeringElement[]): NftOp[] {
  const w = new OpWriter(t, NO_OWNERS);
  return els.map(({ set, el }) => w.element('delete', set, el));
}

/** Deletes chains (and affinity sets) retired by earlier syncs. */
export function deleteRetiredOps(t: NftTableRef, chains: string[], sets: string[] = []): NftOp[] {
  const w = new OpWriter(t, NO_OWNERS);
  return [...chains.map((c) => w.chain('delete', c)), ...sets.map((s) => w.set('delete', 'set', s))];
}

export interface PartialOptions {
  /** elements earlier partial syncs left in the kernel (Transaction.lingering) */
  lingering?: Lingering;
  /** defer the removals deferrable() allows (default true) */
  deferRemovals?: boolean;
  /** who owns each object, so a refused operation names its Service (default: nobody) */
  owners?: Owners;
}

export interface TransactionOptions {
  /** add+delete base chains first so a changed hook or priority can be re-created (first sync) */
  recreateBaseChains?: boolean;
  owners?: Owners;
}

function sameChain(a: NftChain, b: NftChain): boolean {
  if (a.type !== b.type || a.hook !== b.hook || a.priority !== b.priority || a.comment !== b.comment) return false;
  if (a.rules.length !== b.rules.length) return false;
  return a.rules.every((r, i) => ruleText(r) === ruleText(b.rules[i]));
}

function sameElement(a: NftElement, b: NftElement): boolean {
  return a.value === b.value && a.comment === b.comment;
}

/**
 * Full sync: replaces the whole content of the table in one batch. Only what exists is
 * flushed: on a cold start that halves the transaction (a flush of a chain created in the
 * same batch is a no-op the kernel still has to process).
 */
export function fullTransaction(desired: Ruleset, live: LiveNames | null, opts: TransactionOptions = {}): Transaction {
  const w = new OpWriter(tableOf(desired), opts.owners ?? NO_OWNERS);
  const ops: NftOp[] = [w.table(desired.comment)];
  if (opts.recreateBaseChains) {
    for (const ch of desired.chains.values()) {
      if (ch.hook === undefined || !live?.chains.has(ch.name)) continue;
      ops.push(w.chain('add', ch.name), w.chain('delete', ch.name));
    }
  }
  for (const s of desired.sets.values()) {
    ops.push(w.set('add', s.kind, s.name, s));
    if (!isAffinitySetName(s.name) && (!live || live.sets.has(s.name))) ops.push(w.set('flush', s.kind, s.name));
  }
  for (const ch of desired.chains.values()) {
    ops.push(w.chain('add', ch.name, ch));
    if (!live || live.chains.has(ch.name)) ops.push(w.chain('flush', ch.name));
  }
  for (const ch of desired.chains.values()) for (const r of ch.rules) ops.push(w.rule(ch.name, r));
  for (const s of desired.sets.values()) {
    if (isAffinitySetName(s.name)) continue;
    for (const el of s.elements.values()) ops.push(w.element('add', s.name, el));
  }
  const staleChains = [...(live?.chains ?? [])].filter((c) => !desired.chains.has(c)).sort();
  for (const c of staleChains) ops.push(w.chain('flush', c));
  const staleSets = [...(live?.sets.keys() ?? [])].filter((s) => !desired.sets.has(s)).sort();
  for (const s of staleSets) ops.push(w.set('delete', live!.sets.get(s)!, s));
  return {
    ops,
    staleChains,
    staleSets: [],
    lingering: [],
    revived: [],
    summary: `full sync: ${desired.chains.size} chains, ${desired.sets.size} sets/maps; ${staleChains.length} stale chains flushed, ${staleSets.length} stale sets deleted`,
  };
}

/** What a partial diff collects before assemblePartial orders it. */
interface PartialParts {
  w: OpWriter;
  sets: NftOp[];
  /** names the sets' operations declare */
  declared: Set<string>;
  chains: NftOp[];
  rules: NftOp[];
  changedChains: string[];
}

function partialParts(desired: TableLookup, owners: Owners | undefined): PartialParts {
  return { w: new OpWriter(tableOf(desired), owners ?? NO_OWNERS), sets: [], declared: new Set(), chains: [], rules: [], changedChains: [] };
}

function declareSet(p: PartialParts, s: NftSet): void {
  p.declared.add(s.name);
  p.sets.push(p.w.set('add', s.kind, s.name, s));
}

/** A chain that differs from its old value (undefined: new): declared, flushed when it existed, its rules as a body. */
function rewriteChain(p: PartialParts, ch: NftChain, old: NftChain | undefined): void {
  p.changedChains.push(ch.name);
  p.chains.push(p.w.chain('add', ch.name, ch));
  if (old) p.chains.push(p.w.chain('flush', ch.name));
  if (ch.rules.length) p.rules.push(p.w.chain('add', ch.name, ch, true));
}

/** Partial sync: only the differences from `applied` (the table as kproxy last wrote it). */
export function partialTransaction(desired: Ruleset, applied: Ruleset, opts: PartialOptions = {}): Transaction {
  const lookup = rulesetLookup(desired);
  const p = partialParts(lookup, opts.owners);
  const staleChains = [...applied.chains.keys()].filter((c) => !desired.chains.has(c)).sort();
  const els = new ElementDiff(lookup, p.w, new Set(staleChains), opts.lingering ?? new Map(), opts.deferRemovals ?? true);

  for (const s of desired.sets.values()) {
    const old = applied.sets.get(s.name);
    if (!old) declareSet(p, s);
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
    rewriteChain(p, ch, old);
  }
  declareReferencedSets(lookup, p);

  const staleSets = [...applied.sets.values()].filter((s) => !desired.sets.has(s.name)).map((s) => [s.name, s.kind] as const).sort();
  return assemblePartial(p, els, staleChains, staleSets);
}

/**
 * nft resolves `@set` in a rule from its cache, and a partial transaction's cache holds only
 * the sets it declares itself (assemblePartial): re-declare, with their unchanged
 * specification, the sets the rewritten chains use. Re-declaring keeps a set's elements
 * (affinity entries survive).
 */
function declareReferencedSets(desired: TableLookup, p: PartialParts): void {
  for (const name of p.changedChains) {
    for (const r of desired.chain(name)!.rules) {
      for (const m of r.rule.matchAll(/@(\S+)/g)) {
        const s = desired.set(m[1]);
        if (s && !p.declared.has(s.name)) declareSet(p, s);
      }
    }
  }
}

/**
 * Partial sync when only some ports were replanned (IncrementalPlanner): the same operations
 * partialTransaction would write, found by comparing only the objects the replanned ports
 * name with their previous values, so its cost follows the change, not the table.
 */
export function partialTransactionFor(desired: TableLookup, previous: PreviousValues, opts: PartialOptions = {}): Transaction {
  const p = partialParts(desired, opts.owners);
  for (const [name, old] of previous.sets) {
    const s = desired.set(name);
    if (s && !old) declareSet(p, s);
  }
  const staleChains: string[] = [];
  for (const [name, old] of previous.chains) {
    const ch = desired.chain(name);
    if (!ch) {
      if (old) staleChains.push(name);
      continue;
    }
    if (old && (old === ch || sameChain(old, ch))) continue;
    rewriteChain(p, ch, old);
  }
  const els = new ElementDiff(desired, p.w, new Set(staleChains), opts.lingering ?? new Map(), opts.deferRemovals ?? true);
  for (const [setName, prevEls] of previous.elements) {
    for (const [k, prev] of prevEls) {
      const el = desired.element(setName, k);
      if (el && prev && (el === prev || sameElement(prev, el))) continue;
      if (el) els.add(setName, el, prev);
      else if (prev) els.remove(setName, prev);
    }
  }
  declareReferencedSets(desired, p);
  staleChains.sort();
  const staleSets = [...previous.sets].filter(([s, old]) => old && !desired.hasSet(s)).map(([s, old]) => [s, old!.kind] as const).sort();
  return assemblePartial(p, els, staleChains, staleSets);
}

/** The commands of a partial sync whose nft 1.0.6 cache is only the table list (see assemblePartial). */
export const PARTIAL_O1_COMMANDS = /^(?:add chain|flush chain|add set|add map|flush set) /;

/**
 * The partial transaction's operations, in the order nft needs: sets, chain declarations (and
 * flushes), chains' rules, elements, retirements. They use only commands whose nft cache is
 * the table list (nft 1.0.6, src/cache.c), so its cost follows the change, not the table:
 * no `add table` with a body (a full chain listing), rules as `add chain NAME { ... }`,
 * elements as `add set|map NAME { ... elements = { ... } }` (model.ts renderOp), `flush
 * chain`, `flush set` (a retired affinity set). Only `delete element` (and `delete set` of a
 * shared set) still makes nft 1.0.6 list every chain (CMD_DELETE; nft 1.0.6 has no
 * `destroy`, and deleting by handle lists the same). Without `add table` a table deleted
 * behind kproxy's back fails the transaction; the proxier then runs a full sync. Retired
 * chains are flushed now, deleted later; so are retired affinity sets (only their chain used
 * them); any other set that goes is deleted at once.
 */
function assemblePartial(p: PartialParts, els: ElementDiff, staleChains: string[], staleSets: ReadonlyArray<readonly [string, 'set' | 'map']>): Transaction {
  const retiredSets = staleSets.filter(([s]) => isAffinitySetName(s)).map(([s]) => s);
  const tail = staleChains.map((c) => p.w.chain('flush', c));
  for (const [s, kind] of staleSets) tail.push(p.w.set(isAffinitySetName(s) ? 'flush' : 'delete', kind, s));
  const { dels, adds, lingering, revived } = els.settle();
  const ops = [...p.sets, ...p.chains, ...p.rules, ...dels, ...adds, ...tail];
  if (ops.length === 0) return { ops, staleChains: [], staleSets: [], lingering, revived, summary: 'no changes' };
  return {
    ops,
    staleChains,
    staleSets: retiredSets,
    lingering,
    revived,
    summary:
      `partial sync: ${p.changedChains.length} chains rewritten, ${adds.length} elements added, ` +
      `${dels.length} elements deleted, ${lingering.length} left for later, ${staleChains.length} chains and ${retiredSets.length} affinity sets retired`,
  };
}
