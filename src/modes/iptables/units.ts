// Chains as the restore payload holds them: a declaration (`:chain - [0:0]`, which flushes
// it) and its `-A` rules. Every planner strategy assembles its payloads from these. Pure.
import { hash } from 'node:crypto';
import { flat } from '../../core/flat.ts';

export const chainLine = (c: string) => flat`:${c} - [0:0]`;

/** One chain of the payload: its declaration (flush) and rules; the digest is memoised. */
export interface ChainUnit {
  name: string;
  /** written with a `:name` declaration (false: rules appended to a chain declared elsewhere) */
  declare: boolean;
  rules: string[];
  digest?: string;
}

export function unitDigest(u: ChainUnit): string {
  // One-shot hash: a Hash object per chain costs more than the hashing at 70k chains.
  if (u.digest === undefined) u.digest = hash('sha1', `${u.name}\n${u.rules.join('\n')}`, 'base64');
  return u.digest;
}

/** Groups `-A chain ...` lines into units, declared chains first in `declared` order. */
export function groupByChain(declared: string[], rules: string[]): ChainUnit[] {
  const units = new Map<string, ChainUnit>();
  for (const name of declared) units.set(name, { name, declare: true, rules: [] });
  for (const r of rules) {
    const name = r.slice(3, r.indexOf(' ', 3));
    let u = units.get(name);
    if (!u) units.set(name, (u = { name, declare: false, rules: [] }));
    u.rules.push(r);
  }
  // Exact-size arrays (a pushed-to array reserves 17 slots; most chains have one to three rules).
  const out: ChainUnit[] = [];
  for (const u of units.values()) out.push({ name: u.name, declare: u.declare, rules: u.rules.slice() });
  return out.slice();
}

export const EMPTY_LINES: string[] = [];

export function sameLines(a: readonly string[] | undefined, b: readonly string[] | undefined): boolean {
  const x = a ?? EMPTY_LINES;
  const y = b ?? EMPTY_LINES;
  if (x.length !== y.length) return false;
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
}

/** The rule count of units. */
export function ruleTotal(units: readonly ChainUnit[]): number {
  let n = 0;
  for (const u of units) n += u.rules.length;
  return n;
}

/** Lines per part of a streamed section: about 300 KB of text at a time. */
const SECTION_PART_LINES = 4096;

/** One table's restore section, line by line: declarations, stale chains flushed, rules, stale chains deleted. */
function* sectionLineTexts(table: string, units: readonly ChainUnit[], deleted: readonly string[]): Generator<string> {
  yield `*${table}`;
  for (const u of units) if (u.declare) yield chainLine(u.name);
  for (const c of deleted) yield chainLine(c);
  for (const u of units) yield* u.rules;
  for (const c of deleted) yield `-X ${c}`;
  yield 'COMMIT';
}

/**
 * One table's restore section a part at a time, each part whole lines joined once (a text
 * built by `+` is a tree V8 copies whole when it is first read). A full sync's restore reads
 * it as it is made.
 */
export function* sectionParts(table: string, units: readonly ChainUnit[], deleted: readonly string[]): Generator<string> {
  let out: string[] = [];
  for (const line of sectionLineTexts(table, units, deleted)) {
    out.push(line);
    if (out.length < SECTION_PART_LINES) continue;
    out.push('');
    yield out.join('\n');
    out = [];
  }
  if (!out.length) return;
  out.push('');
  yield out.join('\n');
}

/** The lines of sectionParts(table, units, deleted). */
export function sectionLines(units: readonly ChainUnit[], deleted: readonly string[]): number {
  let n = 2 + deleted.length * 2;
  for (const u of units) n += (u.declare ? 1 : 0) + u.rules.length;
  return n;
}

/** One table's restore section as one text. */
export function tableSection(table: string, units: readonly ChainUnit[], deleted: readonly string[]): string {
  return [...sectionParts(table, units, deleted)].join('');
}
