// Typed nftables objects of one table (knftables' model): the planner fills a Ruleset, and
// the same Ruleset renders to the golden "dump" text, to an `nft -f` transaction, and feeds
// the tracer. Pure.
import { kproxyError } from '../../errors.ts';

export type NftFamily = 'ip' | 'ip6';

export interface NftRule {
  /** rule text without the trailing comment */
  rule: string;
  comment?: string;
}

export interface NftChain {
  name: string;
  /** base chains only */
  type?: 'filter' | 'nat';
  hook?: 'prerouting' | 'input' | 'forward' | 'output' | 'postrouting';
  priority?: number;
  comment?: string;
  rules: NftRule[];
}

export interface NftElement {
  key: string[];
  /** verdict (maps only), e.g. ["goto", "service-..."] rendered joined by " " */
  value?: string;
  comment?: string;
}

export interface NftSet {
  kind: 'set' | 'map';
  name: string;
  /** "ipv4_addr" or "ipv4_addr . inet_proto . inet_service : verdict" */
  type: string;
  flags?: string[];
  timeoutSeconds?: number;
  comment?: string;
  /** by elementKey(key) */
  elements: Map<string, NftElement>;
}

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

export function elementKey(key: string[]): string {
  return key.join(' . ');
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

// ---- text ----

function quote(s: string): string {
  return `"${s}"`;
}

export function chainSpec(ch: NftChain): string {
  const parts: string[] = [];
  if (ch.type && ch.hook !== undefined) parts.push(`type ${ch.type} hook ${ch.hook} priority ${ch.priority ?? 0} ;`);
  if (ch.comment !== undefined) parts.push(`comment ${quote(ch.comment)} ;`);
  return parts.length ? ` { ${parts.join(' ')} }` : '';
}

export function setSpec(s: NftSet): string {
  const parts = [`type ${s.type} ;`];
  if (s.flags?.length) parts.push(`flags ${s.flags.join(',')} ;`);
  if (s.timeoutSeconds !== undefined) parts.push(`timeout ${s.timeoutSeconds}s ;`);
  if (s.comment !== undefined) parts.push(`comment ${quote(s.comment)} ;`);
  return ` { ${parts.join(' ')} }`;
}

export function elementText(el: NftElement): string {
  let t = el.key.join(' . ');
  if (el.comment !== undefined) t += ` comment ${quote(el.comment)}`;
  if (el.value !== undefined) t += ` : ${el.value}`;
  return `{ ${t} }`;
}

export function ruleText(r: NftRule): string {
  return r.comment === undefined ? r.rule : `${r.rule} comment ${quote(r.comment)}`;
}

export function tableRef(rs: Ruleset): string {
  return `${rs.family} ${rs.table}`;
}

export function addChainLine(rs: Ruleset, ch: NftChain): string {
  return `add chain ${tableRef(rs)} ${ch.name}${chainSpec(ch)}`;
}

export function addSetLine(rs: Ruleset, s: NftSet): string {
  return `add ${s.kind} ${tableRef(rs)} ${s.name}${setSpec(s)}`;
}

export function addRuleLine(rs: Ruleset, chain: string, r: NftRule): string {
  return `add rule ${tableRef(rs)} ${chain} ${ruleText(r)}`;
}

export function addElementLine(rs: Ruleset, set: string, el: NftElement): string {
  return `add element ${tableRef(rs)} ${set} ${elementText(el)}`;
}

/**
 * A chain's rules as one `add chain` command with a body: `add chain T NAME { RULE ; ... }`.
 * nft 1.0.6 lists every chain of every table before any `add rule` or `add element`
 * (src/cache.c: NFT_CACHE_CHAIN for CMD_OBJ_RULE and CMD_OBJ_ELEMENTS), 60,000 chains at
 * 10,000 Services, half a second or more per transaction; an `add chain` (and `add set`/
 * `add map`) needs only the table list, so partial syncs write rules and elements this way.
 * On an existing chain the body's rules are appended, as `add rule` would.
 */
export function chainWithRulesLine(rs: Ruleset, ch: NftChain): string {
  const parts: string[] = [];
  if (ch.type && ch.hook !== undefined) parts.push(`type ${ch.type} hook ${ch.hook} priority ${ch.priority ?? 0} ;`);
  if (ch.comment !== undefined) parts.push(`comment ${quote(ch.comment)} ;`);
  for (const r of ch.rules) parts.push(`${ruleText(r)} ;`);
  return `add chain ${tableRef(rs)} ${ch.name}${parts.length ? ` { ${parts.join(' ')} }` : ''}`;
}

/** One element of `elements = { ... }` in a set body: `KEY [comment "..."] [: VERDICT]`. */
export function elementBodyText(el: NftElement): string {
  let t = el.key.join(' . ');
  if (el.comment !== undefined) t += ` comment ${quote(el.comment)}`;
  if (el.value !== undefined) t += ` : ${el.value}`;
  return t;
}

/**
 * Elements added by re-declaring their set with the same specification and an `elements`
 * body: `add map T NAME { type ... ; elements = { E1 , E2 } ; }`. For nft 1.0.6 this is an
 * `add set` command (the table list is its only cache), where `add element` makes nft list
 * every chain first (chainWithRulesLine). The kernel accepts a re-declaration whose type and
 * flags match the live set and adds the elements.
 */
export function addElementsBySetLine(rs: Ruleset, s: NftSet, els: NftElement[]): string {
  const spec = setSpec(s).slice(0, -2);
  return `add ${s.kind} ${tableRef(rs)} ${s.name}${spec} elements = { ${els.map(elementBodyText).join(' , ')} } ; }`;
}

export function addTableLine(rs: Ruleset): string {
  return `add table ${tableRef(rs)}${rs.comment !== undefined ? ` { comment ${quote(rs.comment)} ; }` : ''}`;
}

/**
 * The whole table as knftables' Fake.Dump() prints it: what upstream's golden files hold.
 * Declarations come before uses, so the text is also a valid `nft -f` input for an empty
 * table.
 */
export function dumpRuleset(rs: Ruleset): string {
  const lines: string[] = [addTableLine(rs)];
  for (const s of rs.sets.values()) lines.push(addSetLine(rs, s));
  for (const ch of rs.chains.values()) lines.push(addChainLine(rs, ch));
  for (const ch of rs.chains.values()) for (const r of ch.rules) lines.push(addRuleLine(rs, ch.name, r));
  for (const s of rs.sets.values()) for (const el of s.elements.values()) lines.push(addElementLine(rs, s.name, el));
  return lines.join('\n') + '\n';
}

/** Number of objects (chains, rules, sets, elements) in a ruleset, for sync statistics. */
export function countObjects(rs: Ruleset): number {
  let n = rs.chains.size + rs.sets.size;
  for (const ch of rs.chains.values()) n += ch.rules.length;
  for (const s of rs.sets.values()) n += s.elements.size;
  return n;
}
