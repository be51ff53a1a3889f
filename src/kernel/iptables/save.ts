// The one reader of iptables-save text (and iptables-restore payloads): tables, the chains
// each declares, and its rule lines, split with the one tokenizer only when a caller asks
// for arguments. The proxiers (which chains exist, which jumps are missing), the IPVS mode
// (its jumps and masquerade settings), the userspace mode (its redirect chains) and the
// cleanup paths all read dumps through it. The tracer's full parser (parse.ts) reads the
// same lines with the same rules. Pure.
import { splitRuleArgs } from './tokenize.ts';

export type Family = 4 | 6;
export type Table = 'filter' | 'nat' | 'mangle';

/** One command line of a table: `-A CHAIN rest`, `-I CHAIN rest`, `-X CHAIN`, ... */
export interface SavedRule {
  /** the option that starts the line: "-A", "-I", "-D", "-X", "-F", "-N", ... */
  op: string;
  chain: string;
  /** the line after the chain name (trimmed), e.g. `-m comment --comment "x" -j KUBE-SERVICES` */
  rest: string;
  /** the whole line, trimmed, without `iptables-save -c` counters */
  line: string;
  /** 1-based line number in the text */
  lineNo: number;
}

export interface SavedTable {
  name: string;
  /** declared chains (`:NAME POLICY [p:b]`) in order */
  chains: string[];
  /** the same, for lookups */
  declared: Set<string>;
  /** policies of built-in chains ("-" for user chains) */
  policies: Map<string, string>;
  rules: SavedRule[];
  /** the table ended with COMMIT */
  committed: boolean;
}

/** The lines of a save text that matter, in order, each visited once. */
export type SaveLine =
  | { kind: 'table'; name: string; lineNo: number }
  | { kind: 'commit'; lineNo: number }
  | { kind: 'chain'; name: string; policy: string; line: string; lineNo: number }
  /** any other non-blank, non-comment line, counters stripped */
  | { kind: 'command'; line: string; lineNo: number };

/**
 * Walks a save text line by line: blank lines and `#` comments are skipped, each line is
 * trimmed (so CRLF text reads the same), and `iptables-save -c` counters (`[p:b] -A ...`)
 * are dropped from commands.
 */
export function forEachSaveLine(text: string, visit: (l: SaveLine) => void): void {
  let start = 0;
  let lineNo = 0;
  while (start <= text.length) {
    let end = text.indexOf('\n', start);
    if (end < 0) end = text.length;
    lineNo++;
    const line = text.slice(start, end).trim();
    start = end + 1;
    if (line === '' || line[0] === '#') continue;
    if (line[0] === '*') visit({ kind: 'table', name: line.slice(1).trim(), lineNo });
    else if (line === 'COMMIT') visit({ kind: 'commit', lineNo });
    else if (line[0] === ':') {
      const [name = '', policy = '-'] = line.slice(1).split(/\s+/);
      visit({ kind: 'chain', name, policy, line, lineNo });
    } else visit({ kind: 'command', line: line[0] === '[' ? line.replace(/^\[\d+:\d+\]\s*/, '') : line, lineNo });
  }
}

/** `-A CHAIN rest` → its parts; null for a line that is not `-X CHAIN ...`. */
function splitCommand(line: string, lineNo: number): SavedRule | null {
  const m = /^(-[A-Za-z]|--[a-z-]+)\s+(\S+)\s*(.*)$/.exec(line);
  if (!m) return null;
  return { op: m[1], chain: m[2], rest: m[3], line, lineNo };
}

/**
 * Tables of a save text by name. A table that appears twice (a payload with two `*nat`
 * sections) collects both; lines outside any table are ignored.
 */
export function readSave(text: string): Map<string, SavedTable> {
  const tables = new Map<string, SavedTable>();
  let cur: SavedTable | null = null;
  forEachSaveLine(text, (l) => {
    if (l.kind === 'table') {
      cur = tables.get(l.name) ?? null;
      if (!cur) tables.set(l.name, (cur = { name: l.name, chains: [], declared: new Set(), policies: new Map(), rules: [], committed: false }));
      cur.committed = false;
    } else if (!cur) return;
    else if (l.kind === 'commit') {
      cur.committed = true;
      cur = null;
    } else if (l.kind === 'chain') {
      if (!cur.declared.has(l.name)) cur.chains.push(l.name);
      cur.declared.add(l.name);
      cur.policies.set(l.name, l.policy);
    } else {
      const r = splitCommand(l.line, l.lineNo);
      if (r) cur.rules.push(r);
    }
  });
  return tables;
}

/** Chain names declared in one table of a save text (upstream's GetChainsFromTable). */
export function chainsFromSave(text: string, table: Table = 'nat'): Set<string> {
  return new Set(readSave(text).get(table)?.chains ?? []);
}

/** The `-A` rules of a table, per declared chain, as argument arrays (after the chain name). */
export function appendedArgs(t: SavedTable | undefined): Map<string, string[][]> {
  const chains = new Map<string, string[][]>();
  if (!t) return chains;
  for (const c of t.chains) chains.set(c, []);
  for (const r of t.rules) if (r.op === '-A') chains.get(r.chain)?.push(splitRuleArgs(r.rest));
  return chains;
}

/** The `-A` lines of a table as iptables-save prints them (`-A CHAIN ...`). */
export function appendedLines(t: SavedTable | undefined): string[] {
  return t ? t.rules.filter((r) => r.op === '-A').map((r) => r.line) : [];
}

/** One `*TABLE` section of a save text: where its declarations and its runs of `-A` lines are. */
interface SaveSection {
  name: string;
  /** where each `:CHAIN ...` line starts */
  decls: number[];
  /** the hash (nameHash) of each declaration's chain name */
  declHashes: number[];
  /** [start, end) of each run of consecutive `-A` lines of one chain, two numbers a run */
  runs: number[];
  /** the hash of each run's chain name */
  runHashes: number[];
}

/** what `split(/\s+/)` splits at */
const WHITESPACE = /\s/;
const isSpace = (c: number) => c === 0x20 || c === 0x0a || (c < 0x80 ? c >= 0x09 && c <= 0x0d : WHITESPACE.test(String.fromCharCode(c)));

/**
 * A hash of the name at `from` in `text`, up to `to` or to the first character `ends` says
 * ends it (the whole string when `from` and `to` span it): the lookup compares these numbers,
 * then the names of equal ones.
 */
function nameHash(text: string, from: number, to: number, ends: (c: number) => boolean): number {
  let h = 0;
  for (let i = from; i < to; i++) {
    const c = text.charCodeAt(i);
    if (ends(c)) break;
    h = (Math.imul(h, 31) + c) | 0;
  }
  return h;
}

/** after a declaration's name: whitespace (a line's end included) */
const endsDeclName = isSpace;
/** after a rule's chain name: a space, or the line's end */
const endsRuleName = (c: number) => c === 0x20 || c === 0x0a;

/** Whether the name at `at` in `text` is `name`, ending where `ends` says (or at the end of the text). */
function nameAt(text: string, at: number, name: string, ends: (c: number) => boolean): boolean {
  const after = at + name.length;
  if (after < text.length && !ends(text.charCodeAt(after))) return false;
  return text.startsWith(name, at);
}

/**
 * The lines of each chain of an iptables-save text, found in one scan that reads no rule:
 * per table and chain, its declaration and its `-A` lines (iptables-save writes a chain's
 * rules together: one run). What `iptables -S CHAIN` gives, for a caller that needs a few
 * chains of a large dump: the live trace on legacy iptables, where every read of the kernel
 * costs a whole table. The scan keeps positions and hashes of names, no map of names: at
 * 10,000 Services the dump is 21 MB in 70,000 chains, of which a trace reads about ten. Lines
 * other than `*TABLE`, `:CHAIN ...` and `-A CHAIN ...` (comments, counters, other commands)
 * are not indexed: the caller parses what it reads. A table that appears twice is read as one.
 */
export function indexSaveChains(text: string): (table: string, chain: string) => string | null {
  const sections: SaveSection[] = [];
  let cur: SaveSection | undefined;
  // where the run of the line before ends, and its chain's name
  let runEnd = -1;
  let runName = '';
  for (let pos = 0; pos < text.length; ) {
    let end = text.indexOf('\n', pos);
    if (end < 0) end = text.length;
    const c = text.charCodeAt(pos);
    if (c === 0x2a /* * */) {
      sections.push((cur = { name: text.slice(pos + 1, end).trim(), decls: [], declHashes: [], runs: [], runHashes: [] }));
      runEnd = -1;
    } else if (cur && c === 0x3a /* : */) {
      cur.decls.push(pos);
      cur.declHashes.push(nameHash(text, pos + 1, end, endsDeclName));
    } else if (cur && text.startsWith('-A ', pos)) {
      // the same chain as the line before (the common case): compared in place
      if (runEnd === pos && text.startsWith(runName, pos + 3) && text.charCodeAt(pos + 3 + runName.length) === 0x20) {
        cur.runs[cur.runs.length - 1] = runEnd = end + 1;
      } else {
        const nameEnd = text.indexOf(' ', pos + 3);
        runName = text.slice(pos + 3, nameEnd < 0 || nameEnd > end ? end : nameEnd);
        cur.runs.push(pos, (runEnd = end + 1));
        cur.runHashes.push(nameHash(runName, 0, runName.length, () => false));
      }
    }
    pos = end + 1;
  }
  return (table, chain) => {
    // a declaration's name holds no whitespace (the line is split at it), a rule's chain name no space
    const declared = !WHITESPACE.test(chain);
    const ruled = !chain.includes(' ') && !chain.includes('\n');
    const hash = nameHash(chain, 0, chain.length, () => false);
    let decl: string | null = null;
    let rules = '';
    let found = false;
    for (const s of sections) {
      if (s.name !== table) continue;
      for (let i = 0; declared && i < s.decls.length; i++) {
        if (s.declHashes[i] !== hash || !nameAt(text, s.decls[i] + 1, chain, endsDeclName)) continue;
        let end = text.indexOf('\n', s.decls[i]);
        if (end < 0) end = text.length;
        decl = text.slice(s.decls[i], end).trim();
        found = true;
      }
      for (let i = 0; ruled && i < s.runHashes.length; i++) {
        if (s.runHashes[i] !== hash || !nameAt(text, s.runs[2 * i] + 3, chain, endsRuleName)) continue;
        rules += text.slice(s.runs[2 * i], s.runs[2 * i + 1]);
        found = true;
      }
    }
    if (!found) return null;
    const out = (decl === null ? '' : decl + '\n') + rules;
    return out.endsWith('\n') || out === '' ? out : out + '\n';
  };
}
