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

/**
 * The lines of each chain of an iptables-save text, found in one scan that reads no rule:
 * per table and chain, its declaration and the spans of its `-A` lines (iptables-save writes
 * a chain's rules together: one span). What `iptables -S CHAIN` gives, for a caller that needs
 * a few chains of a large dump: the live trace on legacy iptables, where every read of the
 * kernel costs a whole table. Lines other than `*TABLE`, `:CHAIN ...` and `-A CHAIN ...`
 * (comments, counters, other commands) are not indexed: the caller parses what it reads.
 */
export function indexSaveChains(text: string): (table: string, chain: string) => string | null {
  const tables = new Map<string, Map<string, { decl: string | null; spans: number[] }>>();
  let chains: Map<string, { decl: string | null; spans: number[] }> | undefined;
  let last: { decl: string | null; spans: number[] } | undefined;
  let lastName = '';
  const entry = (name: string) => {
    let e = chains!.get(name);
    if (!e) chains!.set(name, (e = { decl: null, spans: [] }));
    return e;
  };
  for (let pos = 0; pos < text.length; ) {
    let end = text.indexOf('\n', pos);
    if (end < 0) end = text.length;
    const c = text.charCodeAt(pos);
    if (c === 0x2a /* * */) {
      const name = text.slice(pos + 1, end).trim();
      chains = tables.get(name) ?? new Map();
      tables.set(name, chains);
      last = undefined;
    } else if (chains && c === 0x3a /* : */) {
      const line = text.slice(pos, end).trim();
      entry(line.slice(1).split(/\s+/)[0]).decl = line;
    } else if (chains && text.startsWith('-A ', pos)) {
      // the same chain as the line before (the common case): compared in place
      if (last && text.startsWith(lastName, pos + 3) && text.charCodeAt(pos + 3 + lastName.length) === 0x20 && last.spans[last.spans.length - 1] === pos) {
        last.spans[last.spans.length - 1] = end + 1;
      } else {
        const nameEnd = text.indexOf(' ', pos + 3);
        lastName = text.slice(pos + 3, nameEnd < 0 || nameEnd > end ? end : nameEnd);
        last = entry(lastName);
        last.spans.push(pos, end + 1);
      }
    }
    pos = end + 1;
  }
  return (table, chain) => {
    const e = tables.get(table)?.get(chain);
    if (!e) return null;
    let out = e.decl === null ? '' : e.decl + '\n';
    for (let i = 0; i < e.spans.length; i += 2) out += text.slice(e.spans[i], e.spans[i + 1]);
    return out.endsWith('\n') || out === '' ? out : out + '\n';
  };
}
