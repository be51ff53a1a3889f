// Rules compared by meaning, not by text (kproxy, not upstream): a restart reads the rules the
// previous process left (iptables-save) and leaves alone every chain whose content already is
// what the plan would write (restart.ts). iptables-save does not print a rule as
// kproxy wrote it: generic options first (`-d 172.30.0.1/32 -p tcp`, where the plan writes
// `-m tcp -p tcp -d 172.30.0.1`), host addresses with a prefix length, a statistic
// probability rounded to the kernel's 31-bit fixed point and printed with 11 decimals, a
// MARK target as `--set-xmark value/mask`, the recent match with its defaults and in its own
// option order, quoting of its own. canonicalRule maps both forms to one string:
//   - generic options (-s -d -p -i -o, negated or not) first, in a fixed order, addresses
//     with their prefix length and IPv6 compressed;
//   - each `-m module` with its options, in rule order (so a rule found equal is also found
//     by a later `-D` with kproxy's text), option groups sorted, known defaults dropped;
//   - the target last, with its options, MARK in --set-xmark form;
//   - words unquoted by the one tokenizer.
// A wrong "different" only costs a chain rewritten (the restart writes it, as before); a
// wrong "same" would keep a stale rule, so the mapping only merges forms iptables itself
// treats as one. Pure.
import { canonicalIP } from '../../core/ip.ts';
import { isServiceChainName } from './names.ts';
import { readSave, type SavedTable } from '../../kernel/iptables/save.ts';
import { splitRuleArgs } from '../../kernel/iptables/tokenize.ts';

const GENERIC: Record<string, string> = {
  '-s': 's', '--source': 's', '--src': 's',
  '-d': 'd', '--destination': 'd', '--dst': 'd',
  '-p': 'p', '--protocol': 'p',
  '-i': 'i', '--in-interface': 'i',
  '-o': 'o', '--out-interface': 'o',
};
const GENERIC_ORDER = ['s', 'd', 'i', 'o', 'p'];

const PLAIN_V4 = /^(?:[1-9]?\d|1\d\d|2[0-4]\d|25[0-5])(?:\.(?:[1-9]?\d|1\d\d|2[0-4]\d|25[0-5])){3}(\/(?:[12]?\d|3[0-2]))?$/;

function canonicalAddress(v: string): string {
  // the common case, cheaply: an IPv4 address without leading zeros, with or without a prefix length
  const m = PLAIN_V4.exec(v);
  if (m) return m[1] ? v : `${v}/32`;
  const slash = v.indexOf('/');
  const ip = canonicalIP(slash < 0 ? v : v.slice(0, slash));
  if (!ip) return v;
  const len = slash < 0 ? (ip.includes(':') ? '128' : '32') : v.slice(slash + 1);
  return `${ip}/${len}`;
}

/**
 * The words of a line, as the tokenizer splits them; faster for the lines iptables-save and
 * kproxy write (double-quoted words without escapes), which are most of a 200,000-rule restart.
 */
function splitWords(line: string): string[] {
  if (line.indexOf('\\') >= 0) return splitRuleArgs(line);
  if (line.indexOf('"') < 0) return line.split(/\s+/).filter((w) => w !== '');
  const parts = line.split('"');
  // an unterminated quote, or a quote inside a word: the tokenizer decides
  if (parts.length % 2 === 0) return splitRuleArgs(line);
  const words: string[] = [];
  for (let i = 0; i < parts.length; i++) {
    if (i % 2 === 1) {
      if ((parts[i - 1] !== '' && !/\s$/.test(parts[i - 1])) || (parts[i + 1] !== '' && !/^\s/.test(parts[i + 1]))) return splitRuleArgs(line);
      words.push(parts[i]);
      continue;
    }
    for (const w of parts[i].split(/\s+/)) if (w !== '') words.push(w);
  }
  return words;
}

/** One `--opt values...` group (with its `!`), as words. */
type Group = string[];

const ALL_ONES_V4 = '255.255.255.255';
const ALL_ONES_V6 = 'ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff';

function canonicalGroup(module: string, g: Group): Group | null {
  const opt = g[0] === '!' ? g[1] : g[0];
  if (module === 'recent') {
    // iptables-save prints the defaults kproxy leaves out
    if (opt === '--rsource') return null;
    if (opt === '--mask' && (g[1] === ALL_ONES_V4 || g[1] === ALL_ONES_V6)) return null;
  }
  if (module === 'statistic' && opt === '--probability') {
    // the kernel keeps lround(p · 2^31); iptables-save prints it back with 11 decimals
    const p = Number(g[g.length - 1]);
    if (Number.isFinite(p)) return [...g.slice(0, -1), String(Math.round(p * 0x80000000))];
  }
  if (module === '-j MARK') {
    if (opt === '--or-mark') return ['--set-xmark', `${hex(g[1])}/${hex(g[1])}`];
    if (opt === '--xor-mark') return ['--set-xmark', `${hex(g[1])}/0x0`];
    if (opt === '--and-mark') return ['--set-xmark', `0x0/${hex(String(~Number(g[1]) >>> 0))}`];
    if (opt === '--set-mark') {
      const [v, m] = g[1].split('/');
      return ['--set-xmark', `${hex(v)}/${m === undefined ? '0xffffffff' : hex(m)}`];
    }
    if (opt === '--set-xmark') {
      const [v, m] = g[1].split('/');
      return ['--set-xmark', `${hex(v)}/${m === undefined ? '0xffffffff' : hex(m)}`];
    }
  }
  // REJECT's default reply, which iptables-save prints
  if (module === '-j REJECT' && opt === '--reject-with' && (g[1] === 'icmp-port-unreachable' || g[1] === 'icmp6-port-unreachable')) return null;
  if (module === 'mark' && opt === '--mark') {
    const [v, m] = g[g.length - 1].split('/');
    return [...g.slice(0, -1), m === undefined ? hex(v) : `${hex(v)}/${hex(m)}`];
  }
  return g;
}

function hex(v: string): string {
  const n = Number(v);
  return Number.isInteger(n) && n >= 0 ? `0x${n.toString(16)}` : v;
}

/** Splits a module's words into option groups: each starts at `--opt` (or `!` before one). */
function groups(words: string[]): Group[] {
  const out: Group[] = [];
  let cur: Group | null = null;
  for (let i = 0; i < words.length; i++) {
    const w = words[i];
    if (w === '!' && words[i + 1]?.startsWith('-')) {
      cur = ['!'];
      out.push(cur);
      continue;
    }
    if (w.startsWith('--') || (w.startsWith('-') && w.length === 2 && !/^-\d/.test(w))) {
      if (cur && cur.length === 1 && cur[0] === '!') cur.push(w);
      else out.push((cur = [w]));
      continue;
    }
    if (!cur) out.push((cur = []));
    cur.push(w);
  }
  return out;
}

/** A module's (or target's) option groups, canonical, sorted, as one string. */
function sortedGroups(module: string, words: string[]): string {
  if (!words.length) return '';
  const keys: string[] = [];
  for (const g of groups(words)) {
    const c = canonicalGroup(module, g);
    if (c) keys.push(c.join(' '));
  }
  if (keys.length > 1) keys.sort();
  return keys.join(' ');
}

/**
 * The canonical form of a rule line (`-A CHAIN ...` / `-I CHAIN [n] ...`, as written or as
 * iptables-save prints it), without the chain: two lines with the same canonical form are
 * the same rule in the kernel.
 */
export function canonicalRule(line: string): string {
  const words = splitWords(line);
  let i = 0;
  if (words[0] === '-A' || words[0] === '-I' || words[0] === '-D') i = 2;
  if (words[0] === '-I' && /^\d+$/.test(words[2] ?? '')) i = 3;
  const generic = new Map<string, string>();
  const modules: Array<{ name: string; words: string[] }> = [];
  let target: { name: string; words: string[] } | null = null;
  let cur: string[] | null = null;
  for (; i < words.length; i++) {
    let w = words[i];
    let neg = false;
    if (w === '!' && GENERIC[words[i + 1]] !== undefined) {
      neg = true;
      w = words[++i];
    }
    const g = GENERIC[w];
    if (g !== undefined) {
      let v = words[++i] ?? '';
      if (g === 's' || g === 'd') v = canonicalAddress(v);
      if (g === 'p') v = v.toLowerCase();
      generic.set(g, `${neg ? '! ' : ''}${v}`);
      continue;
    }
    if ((w === '-m' || w === '--match') && !neg) {
      const m = { name: words[++i] ?? '', words: [] as string[] };
      modules.push(m);
      cur = m.words;
      continue;
    }
    if ((w === '-j' || w === '--jump' || w === '-g' || w === '--goto') && !neg) {
      target = { name: `${w === '-g' || w === '--goto' ? '-g' : '-j'} ${words[++i] ?? ''}`, words: [] };
      cur = target.words;
      continue;
    }
    (cur ??= []).push(w);
  }
  const out: string[] = [];
  for (const k of GENERIC_ORDER) if (generic.has(k)) out.push(`-${k} ${generic.get(k)}`);
  for (const m of modules) {
    out.push(`-m ${m.name} ${sortedGroups(m.name, m.words)}`.trimEnd());
  }
  if (target) {
    out.push(`${target.name} ${sortedGroups(target.name, target.words)}`.trimEnd());
  }
  return out.join(' ');
}

/**
 * One installed chain: its canonical rules as one string (chainDigest); for chains that are
 * not a service's own (dispatch, static, filter: the ones edited in place) also its rules as
 * iptables-save printed them and in canonical form. Service chains keep only the one string:
 * 200,000 rule strings at 10,000 Services would be seconds of garbage collection.
 */
export interface InstalledChain {
  digest: string;
  lines?: string[];
  canon?: string[];
}

/**
 * The digest of a chain's rules (`-A` lines, either form): their canonical forms, joined
 * (compared once per restart: a hash would cost more than it saves).
 */
export function chainDigest(lines: readonly string[]): string {
  let text = '';
  for (const l of lines) text += canonicalRule(l) + '\n';
  return text;
}

/** What the kernel holds of kproxy's chains (KUBE-*), per table, read from iptables-save. */
export type InstalledChains = Map<string, Map<string, InstalledChain>>;

export function installedChains(save: string | Map<string, SavedTable>, tables: readonly string[] = ['nat', 'filter']): InstalledChains {
  const out: InstalledChains = new Map();
  const saved = typeof save === 'string' ? readSave(save) : save;
  for (const name of tables) {
    const chains = new Map<string, InstalledChain>();
    out.set(name, chains);
    const t = saved.get(name);
    if (!t) continue;
    const rules = new Map<string, string[]>();
    for (const c of t.chains) if (c.startsWith('KUBE-')) rules.set(c, []);
    for (const r of t.rules) if (r.op === '-A') rules.get(r.chain)?.push(r.line);
    for (const [c, lines] of rules) {
      if (isServiceChainName(c)) chains.set(c, { digest: chainDigest(lines) });
      else {
        const canon = lines.map(canonicalRule);
        chains.set(c, { digest: canon.map((x) => x + '\n').join(''), lines, canon });
      }
    }
  }
  return out;
}
