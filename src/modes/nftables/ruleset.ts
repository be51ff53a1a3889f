// Typed nftables objects of one table (knftables' model): the planner fills a Ruleset, and
// the same Ruleset renders to the golden "dump" text, to an `nft -f` transaction, and feeds
// the tracer. Pure.
import { kproxyError } from '../../errors.ts';
import { elementKey, renderOp, type NftChain, type NftElement, type NftFamily, type NftOp, type NftSet, type NftTableRef } from '../../kernel/nft/model.ts';

export { elementKey, ruleText, type NftChain, type NftElement, type NftFamily, type NftRule, type NftSet } from '../../kernel/nft/model.ts';

export interface Ruleset {
  family: NftFamily;
  table: string;
  comment?: string;
  chains: Map<string, NftChain>;
  sets: Map<string, NftSet>;
}

export function newRuleset(family: NftFamily, table: string, comment?: string): Ruleset {
  return { family, table, comment, chains: new Map(), sets: new Map() };
}

export function ensureChain(rs: Ruleset, name: string, extra: Partial<NftChain> = {}): NftChain {
  let ch = rs.chains.get(name);
  if (!ch) {
    ch = { name, rules: [], ...extra };
    rs.chains.set(name, ch);
  }
  return ch;
}

export function addRule(rs: Ruleset, chain: string, rule: string, comment?: string): void {
  ensureChain(rs, chain).rules.push(comment === undefined ? { rule } : { rule, comment });
}

export function addSet(rs: Ruleset, s: Omit<NftSet, 'elements'>): NftSet {
  let set = rs.sets.get(s.name);
  if (!set) {
    set = { ...s, elements: new Map() };
    rs.sets.set(s.name, set);
  }
  return set;
}

export function addElement(rs: Ruleset, setName: string, el: NftElement): void {
  const set = rs.sets.get(setName);
  if (!set) throw kproxyError('KPROXY_NFT_INTERNAL', `element for undeclared set ${setName}`);
  set.elements.set(elementKey(el.key), el);
}

/** The table a ruleset's operations act in. */
export function tableOf(rs: { family: NftFamily; table: string }): NftTableRef {
  return { family: rs.family, table: rs.table };
}

/**
 * The whole table as knftables' Fake.Dump() prints it: what upstream's golden files hold.
 * Declarations come before uses, so the text is also a valid `nft -f` input for an empty
 * table.
 */
export function dumpRuleset(rs: Ruleset): string {
  return [...dumpRulesetParts(rs)].join('');
}

/** Lines per part of dumpRulesetParts: about half a megabyte of text. */
const DUMP_PART_LINES = 4096;

/**
 * dumpRuleset's text in parts, each made when it is read: a line's operation and pieces are
 * garbage before the next collection, and no table's text exists whole (render writes part
 * after part).
 */
export function* dumpRulesetParts(rs: Ruleset): Generator<string> {
  let lines: string[] = [];
  for (const op of rulesetOps(rs)) {
    lines.push(renderOp(op));
    if (lines.length === DUMP_PART_LINES) {
      lines.push('');
      yield lines.join('\n');
      lines = [];
    }
  }
  if (lines.length) {
    lines.push('');
    yield lines.join('\n');
  }
}

/** The operations that declare a ruleset, declarations before uses. */
function* rulesetOps(rs: Ruleset): Generator<NftOp> {
  const t = tableOf(rs);
  yield { verb: 'add', in: t, kind: 'table', comment: rs.comment };
  for (const s of rs.sets.values()) yield { verb: 'add', in: t, kind: 'set', setKind: s.kind, name: s.name, spec: s };
  for (const ch of rs.chains.values()) yield { verb: 'add', in: t, kind: 'chain', name: ch.name, spec: ch };
  for (const ch of rs.chains.values()) for (const rule of ch.rules) yield { verb: 'add', in: t, kind: 'rule', chain: ch.name, rule };
  for (const s of rs.sets.values()) for (const el of s.elements.values()) yield { verb: 'add', in: t, kind: 'element', set: s.name, elements: [el] };
}

/** Number of objects (chains, rules, sets, elements) in a ruleset, for sync statistics. */
export function countObjects(rs: Ruleset): number {
  let n = rs.chains.size + rs.sets.size;
  for (const ch of rs.chains.values()) n += ch.rules.length;
  for (const s of rs.sets.values()) n += s.elements.size;
  return n;
}

/**
 * The desired table as a partial diff reads it: by name, never whole. A partial sync's table
 * is not kept as objects between syncs (incremental.ts TableIndex answers from the ports'
 * fragments); a whole Ruleset answers through rulesetLookup.
 */
export interface TableLookup {
  readonly family: NftFamily;
  readonly table: string;
  hasChain(name: string): boolean;
  chain(name: string): NftChain | undefined;
  hasSet(name: string): boolean;
  /** the set's declaration (its elements are not necessarily all there: read them with element()) */
  set(name: string): NftSet | undefined;
  element(set: string, key: string): NftElement | undefined;
}

/** A whole Ruleset as a TableLookup. */
export function rulesetLookup(rs: Ruleset): TableLookup {
  return {
    family: rs.family,
    table: rs.table,
    hasChain: (name) => rs.chains.has(name),
    chain: (name) => rs.chains.get(name),
    hasSet: (name) => rs.sets.has(name),
    set: (name) => rs.sets.get(name),
    element: (set, key) => rs.sets.get(set)?.elements.get(key),
  };
}
