// Reads nftables text back into Rulesets: both the command form kproxy writes (`add rule
// ip kube-proxy CHAIN ...`, with flush/delete applied in order, as `nft -f` would) and the
// block form `nft list table` / `nft -s list ruleset` prints. The tracer works on either.
// Pure.
import { elementKey, newRuleset, type NftChain, type NftElement, type NftFamily, type NftSet, type Ruleset } from './ruleset.ts';
import { KproxyError } from '../../errors.ts';

export class NftParseError extends KproxyError {
  declare readonly code: 'KPROXY_NFT_PARSE';
  constructor(line: number, message: string) {
    super('KPROXY_NFT_PARSE', `line ${line}: ${message}`);
  }
}

/** true when the text holds a double quote or a brace: what splitTopLevel and braceDepth look at */
function hasQuoteOrBrace(text: string): boolean {
  return text.includes('"') || text.includes('{') || text.includes('}');
}

/** Splits on `sep` outside double quotes and outside nested braces. */
export function splitTopLevel(text: string, sep: string): string[] {
  // without quotes or braces every `sep` is at the top level: the same split, in native code
  // (a map of 10,000 Services' elements is 0.8 MB of text)
  if (!hasQuoteOrBrace(text)) return text.split(sep).map((s) => s.trim()).filter((s) => s !== '');
  const out: string[] = [];
  let depth = 0;
  let inQuote = false;
  let cur = '';
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (ch === '"') inQuote = !inQuote;
    else if (!inQuote && ch === '{') depth++;
    else if (!inQuote && ch === '}') depth--;
    if (!inQuote && depth === 0 && text.startsWith(sep, i)) {
      out.push(cur);
      cur = '';
      i += sep.length - 1;
      continue;
    }
    cur += ch;
  }
  out.push(cur);
  return out.map((s) => s.trim()).filter((s) => s !== '');
}

/** "KEY [timeout ..] [expires ..] [comment "x"] [: VALUE]" → element. */
export function parseElement(text: string): NftElement {
  let keyPart = text;
  let value: string | undefined;
  const colon = splitTopLevel(text, ' : ');
  if (colon.length >= 2) {
    keyPart = colon[0];
    value = colon.slice(1).join(' : ');
  }
  let comment: string | undefined;
  const cm = keyPart.includes('"') ? /\s*comment "([^"]*)"/.exec(keyPart) : null;
  if (cm) {
    comment = cm[1];
    keyPart = keyPart.replace(cm[0], '');
  }
  if (keyPart.includes('timeout') || keyPart.includes('expires')) keyPart = keyPart.replace(/\s+(timeout|expires)\s+\S+/g, '');
  keyPart = keyPart.trim();
  const el: NftElement = { key: keyPart.split(/\s*\.\s+|\s+\.\s*/).map((s) => s.trim()) };
  if (value !== undefined) el.value = value.trim();
  if (comment !== undefined) el.comment = comment;
  return el;
}

function innerBraces(text: string): string {
  const a = text.indexOf('{');
  const b = text.lastIndexOf('}');
  return a >= 0 && b > a ? text.slice(a + 1, b) : '';
}

function splitRuleComment(text: string): { rule: string; comment?: string } {
  const m = /^(.*?)\s+comment "([^"]*)"\s*$/.exec(text);
  return m ? { rule: m[1], comment: m[2] } : { rule: text.trim() };
}

/** Parses a chain spec such as "type filter hook prerouting priority -110 ;" into fields. */
function applyChainSpec(ch: NftChain, spec: string): void {
  const t = /type (filter|nat|route) hook (\w+)(?: device \S+)? priority ([^;]+?)\s*;/.exec(spec);
  if (t) {
    ch.type = t[1] === 'nat' ? 'nat' : 'filter';
    ch.hook = t[2] as NftChain['hook'];
    ch.priority = parsePriority(t[3]);
  }
  const c = /comment "([^"]*)"/.exec(spec);
  if (c) ch.comment = c[1];
}

const NAMED_PRIORITY: Record<string, number> = { raw: -300, mangle: -150, dstnat: -100, filter: 0, security: 50, srcnat: 100 };

export function parsePriority(text: string): number {
  const s = text.replace(/\s+/g, '');
  const m = /^([a-z]+)?([+-]?\d+)?$/.exec(s);
  if (!m) return 0;
  const base = m[1] ? (NAMED_PRIORITY[m[1]] ?? 0) : 0;
  return base + (m[2] ? parseInt(m[2], 10) : 0);
}

function applySetSpec(s: NftSet, spec: string): void {
  const type = /type ([^;]+?)\s*;/.exec(spec);
  if (type) s.type = type[1];
  const flags = /flags ([^;]+?)\s*;/.exec(spec);
  if (flags) s.flags = flags[1].split(/\s*,\s*/);
  const to = /timeout (\d+)s\s*;/.exec(spec);
  if (to) s.timeoutSeconds = parseInt(to[1], 10);
  const c = /comment "([^"]*)"/.exec(spec);
  if (c) s.comment = c[1];
}

interface Tables {
  tables: Map<string, Ruleset>;
}

function tableFor(ctx: Tables, family: string, name: string): Ruleset {
  const k = `${family} ${name}`;
  let rs = ctx.tables.get(k);
  if (!rs) {
    rs = newRuleset(family as NftFamily, name);
    ctx.tables.set(k, rs);
  }
  return rs;
}

function getChain(rs: Ruleset, name: string): NftChain {
  let ch = rs.chains.get(name);
  if (!ch) {
    ch = { name, rules: [] };
    rs.chains.set(name, ch);
  }
  return ch;
}

function getSet(rs: Ruleset, kind: 'set' | 'map', name: string): NftSet {
  let s = rs.sets.get(name);
  if (!s) {
    s = { kind, name, type: '', elements: new Map() };
    rs.sets.set(name, s);
  }
  return s;
}

function addElements(set: NftSet, body: string): void {
  for (const e of splitTopLevel(body, ',')) {
    const el = parseElement(e);
    set.elements.set(elementKey(el.key), el);
  }
}

/** `add chain T NAME { [type ... ;] [comment "..." ;] [RULE ; ...] }`: the rules are appended, as nft does. */
function applyChainBody(ch: NftChain, body: string): void {
  for (const part of splitTopLevel(body, ';')) {
    if (/^type\s+\w+\s+hook/.test(part)) applyChainSpec(ch, `${part} ;`);
    else if (/^comment "[^"]*"$/.test(part)) ch.comment = /"([^"]*)"/.exec(part)![1];
    else if (!/^policy \w+$/.test(part)) ch.rules.push(splitRuleComment(part));
  }
}

/** `add set|map T NAME { type ... ; [flags ...;] [comment ...;] [elements = { ... } ;] }`: elements are added. */
function applySetBody(set: NftSet, body: string): void {
  const spec: string[] = [];
  for (const part of splitTopLevel(body, ';')) {
    if (part.startsWith('elements = ')) addElements(set, innerBraces(part));
    else spec.push(`${part} ;`);
  }
  applySetSpec(set, spec.join(' '));
}

/** One command line of the `nft -f` form. */
function applyCommand(ctx: Tables, line: string, lineNo: number): void {
  const m = /^(add|create|insert|flush|delete|destroy)\s+(table|chain|rule|set|map|element)\s+(ip6?|inet|arp|bridge|netdev)\s+(\S+)\s*(.*)$/.exec(line);
  if (!m) throw new NftParseError(lineNo, `unrecognised command: ${line}`);
  const [, verb, obj, family, tableName, rest] = m;
  const key = `${family} ${tableName}`;
  if (obj === 'table') {
    if (verb === 'delete' || verb === 'destroy') ctx.tables.delete(key);
    else if (verb === 'flush') {
      const rs = ctx.tables.get(key);
      if (rs) {
        for (const ch of rs.chains.values()) ch.rules = [];
        for (const s of rs.sets.values()) s.elements.clear();
      }
    } else {
      const rs = tableFor(ctx, family, tableName);
      const c = /comment "([^"]*)"/.exec(rest);
      if (c) rs.comment = c[1];
    }
    return;
  }
  const rs = tableFor(ctx, family, tableName);
  const sp = rest.indexOf(' ');
  const name = sp < 0 ? rest : rest.slice(0, sp);
  const tail = sp < 0 ? '' : rest.slice(sp + 1).trim();
  switch (obj) {
    case 'chain':
      if (verb === 'delete' || verb === 'destroy') rs.chains.delete(name);
      else if (verb === 'flush') getChain(rs, name).rules = [];
      else applyChainBody(getChain(rs, name), innerBraces(tail));
      return;
    case 'rule': {
      const r = splitRuleComment(tail);
      if (verb === 'insert') getChain(rs, name).rules.unshift(r);
      else if (verb === 'add') getChain(rs, name).rules.push(r);
      return;
    }
    case 'set':
    case 'map':
      if (verb === 'delete' || verb === 'destroy') rs.sets.delete(name);
      else if (verb === 'flush') getSet(rs, obj, name).elements.clear();
      else applySetBody(getSet(rs, obj, name), innerBraces(tail));
      return;
    case 'element': {
      const set = rs.sets.get(name) ?? getSet(rs, 'set', name);
      if (verb === 'delete' || verb === 'destroy') {
        for (const e of splitTopLevel(innerBraces(tail), ',')) set.elements.delete(elementKey(parseElement(e).key));
      } else addElements(set, innerBraces(tail));
      return;
    }
  }
}

/** A line the reader could not use: its 1-based number and why. */
export type NftWarn = (lineNo: number, why: string) => void;

/** Parses the block form of `nft list`; `warn` hears of every line it does not understand. */
function parseListing(ctx: Tables, lines: string[], warn: NftWarn = () => {}): void {
  let rs: Ruleset | null = null;
  let chain: NftChain | null = null;
  let set: NftSet | null = null;
  // an `elements = { ... }` spread over lines: its parts, and the brace depth after them (kept
  // as it goes: re-counting the whole text at each line is quadratic in a big map's lines)
  let pendingElements: string[] | null = null;
  let pendingDepth = 0;
  let pendingFrom = 0;
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (line === '' || line.startsWith('#')) continue;
    if (pendingElements !== null && set) {
      pendingElements.push(line);
      pendingDepth += braceDepth(line);
      if (pendingDepth === 0) {
        addElements(set, innerBraces(pendingElements.join(' ')));
        pendingElements = null;
      }
      continue;
    }
    let m: RegExpExecArray | null;
    if ((m = /^table\s+(\S+)\s+(\S+)\s*\{$/.exec(line))) {
      rs = tableFor(ctx, m[1], m[2]);
    } else if (rs && (m = /^chain\s+(\S+)\s*\{$/.exec(line))) {
      chain = getChain(rs, m[1]);
    } else if (rs && (m = /^(set|map)\s+(\S+)\s*\{$/.exec(line))) {
      set = getSet(rs, m[1] as 'set' | 'map', m[2]);
    } else if (line === '}') {
      if (chain) chain = null;
      else if (set) set = null;
      else if (rs) rs = null;
      else warn(i + 1, `"}" closes nothing, left out`);
    } else if (chain) {
      if (/^type\s+\w+\s+hook/.test(line)) applyChainSpec(chain, line.replace(/;?\s*policy \w+;?/, ';').replace(/;?$/, ' ;'));
      else if (/^comment "[^"]*"$/.test(line)) chain.comment = /"([^"]*)"/.exec(line)![1];
      else chain.rules.push(splitRuleComment(line));
    } else if (set) {
      if (line.startsWith('elements = ')) {
        const body = line.slice('elements = '.length);
        if (balanced(body)) addElements(set, innerBraces(body));
        else {
          pendingElements = [body];
          pendingDepth = braceDepth(body);
          pendingFrom = i + 1;
        }
      } else if (/^(type|flags|timeout|comment|size|policy|auto-merge|gc-interval|counter)\b/.test(line)) applySetSpec(set, line.endsWith(';') ? line : `${line} ;`);
      else warn(i + 1, `not understood inside set ${set.name}, left out: ${clipLine(line)}`);
    } else if (rs && (m = /^comment "([^"]*)"$/.exec(line))) {
      rs.comment = m[1];
    } else if (rs && /^flags\s/.test(line)) {
      // table flags (dormant, owner): no effect on a trace
    } else if (rs && /^(chain|set|map|flowtable|counter|quota|limit|ct|secmark|synproxy)\s+\S+\s*\{/.test(line)) {
      // an object the tracer does not use (a flowtable, a named counter...): skip its block
      let depth = braceDepth(line);
      const from = i + 1;
      while (depth > 0 && i + 1 < lines.length) depth += braceDepth(lines[++i]);
      if (!/^(flowtable|counter|quota|limit|ct|secmark|synproxy)\s/.test(line)) warn(from, `not understood, block left out: ${clipLine(line)}`);
    } else {
      warn(i + 1, `not understood${rs ? ` in table ${rs.family} ${rs.table}` : ' outside a table'}, left out: ${clipLine(line)}`);
    }
  }
  if (pendingElements !== null) warn(pendingFrom, 'elements never closed with "}", left out');
  if (chain || set || rs) warn(lines.length, 'the text ends inside a block (a "}" is missing)');
}

function braceDepth(line: string): number {
  if (!hasQuoteOrBrace(line)) return 0;
  let d = 0;
  let q = false;
  for (const ch of line) {
    if (ch === '"') q = !q;
    else if (!q && ch === '{') d++;
    else if (!q && ch === '}') d--;
  }
  return d;
}

function clipLine(s: string): string {
  return s.length > 120 ? `${s.slice(0, 117)}...` : s;
}

function balanced(s: string): boolean {
  let d = 0;
  let q = false;
  for (const ch of s) {
    if (ch === '"') q = !q;
    else if (!q && ch === '{') d++;
    else if (!q && ch === '}') d--;
  }
  return d === 0 && s.includes('{');
}

/** Every table in the text, by "family name". */
export function parseNftText(text: string): Map<string, Ruleset> {
  const ctx: Tables = { tables: new Map() };
  const lines = text.split('\n');
  const isListing = lines.some((l) => /^\s*table\s+\S+\s+\S+\s*\{\s*$/.test(l));
  if (isListing) {
    parseListing(ctx, lines);
  } else {
    lines.forEach((raw, i) => {
      const line = raw.trim();
      if (line === '' || line.startsWith('#')) return;
      applyCommand(ctx, line, i + 1);
    });
  }
  return ctx.tables;
}

/** `nft -a` handles (" # handle 12") and a CRLF line end: no effect on what a line means. */
const HANDLE_SUFFIX = /\s+# handle \d+\s*$/;

/**
 * Reads nftables text of any origin without ever throwing on a line: `nft list ruleset`
 * (with `-a` handles, `-s`, counters, comments, other programs' tables), `nft -f` input or a
 * transaction as upstream's tests write it. A line it cannot use is left out and named in
 * `warnings` ("line N: why: text"), so that a trace over it never hides it.
 */
export function readNftDump(text: string): { tables: Map<string, Ruleset>; warnings: string[] } {
  const ctx: Tables = { tables: new Map() };
  const warnings: string[] = [];
  const warn: NftWarn = (lineNo, why) => {
    warnings.push(`line ${lineNo}: ${why}`);
  };
  const lines = text.split('\n').map((l) => l.replace(/\r$/, '').replace(HANDLE_SUFFIX, ''));
  const isListing = lines.some((l) => /^\s*table\s+\S+\s+\S+\s*\{\s*$/.test(l));
  if (isListing) {
    parseListing(ctx, lines, warn);
    return { tables: ctx.tables, warnings };
  }
  lines.forEach((raw, i) => {
    const line = raw.trim();
    if (line === '' || line.startsWith('#') || /^flush ruleset$/.test(line)) return;
    try {
      applyCommand(ctx, line, i + 1);
    } catch (e) {
      warn(i + 1, `not understood, left out: ${clipLine(line)}`);
      void e;
    }
  });
  return { tables: ctx.tables, warnings };
}

/** The kube-proxy table of the given family from the text (or the only table there is). */
export function parseKubeProxyTable(text: string, family: NftFamily): Ruleset {
  const tables = parseNftText(text);
  const exact = tables.get(`${family} kube-proxy`);
  if (exact) return exact;
  const any = [...tables.values()].find((t) => t.table === 'kube-proxy') ?? [...tables.values()][0];
  return any ?? newRuleset(family, 'kube-proxy');
}
