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

/**
 * One table's restore section a part at a time (each part whole lines): declarations, stale
 * chains flushed, rules, stale chains deleted. A full sync's restore reads it as it is made.
 */
export function* sectionParts(table: string, units: readonly ChainUnit[], deleted: readonly string[]): Generator<string> {
  let out: string[] = [`*${table}`];
  const take = (l: string) => {
    out.push(l);
    if (out.length < SECTION_PART_LINES) return undefined;
    out.push('');
    const part = out.join('\n');
    out = [];
    return part;
  };
  let part: string | undefined;
  for (const u of units) if (u.declare && (part = take(chainLine(u.name)))) yield part;
  for (const c of deleted) if ((part = take(chainLine(c)))) yield part;
  for (const u of units) for (const r of u.rules) if ((part = take(r))) yield part;
  for (const c of deleted) if ((part = take(`-X ${c}`))) yield part;
  out.push('COMMIT', '');
  yield out.join('\n');
}

/** The lines of sectionParts(table, units, deleted). */
export function sectionLines(units: readonly ChainUnit[], deleted: readonly string[]): number {
  let n = 2 + deleted.length * 2;
  for (const u of units) n += (u.declare ? 1 : 0) + u.rules.length;
  return n;
}

/**
 * One table's restore section as one text: declarations, stale chains flushed, rules, stale
 * chains deleted. One join: a text built by `+` is a tree V8 copies whole when it is first read.
 */
export function tableSection(table: string, units: readonly ChainUnit[], deleted: readonly string[]): string {
  const out: string[] = [`*${table}`];
  for (const u of units) if (u.declare) out.push(chainLine(u.name));
  for (const c of deleted) out.push(chainLine(c));
  for (const u of units) for (const r of u.rules) out.push(r);
  for (const c of deleted) out.push(`-X ${c}`);
  out.push('COMMIT', '');
  return out.join('\n');
}
