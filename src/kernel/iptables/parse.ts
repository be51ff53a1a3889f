// Parser for iptables-save / iptables-restore text of any origin: our own planner's payloads,
// upstream's golden files, and what a real `iptables-save` prints (counters, reordered
// options, "/32" suffixes, quoted comments). Pure: no I/O.
//
// The result keeps every rule's original text (for reporting) next to a typed reading of
// its matches, so the tracer never re-parses text. Chains are indexed by name: a 170k-rule
// dump parses in one pass with one Map lookup per line.
//
// Restore semantics that matter for partial payloads are honoured: `:CHAIN` (re)declares
// and flushes a user chain, `-X` deletes, `-F` flushes, `-N` creates, `-I`/`-D`/`-R`/`-P`/`-E`
// are applied. Anything not understood is kept in `warnings` (a line that cannot be read,
// such as one with an unterminated quote, is left out with a warning naming it), never
// thrown, except text that cannot be a ruleset at all (a rule outside a table).
import { KproxyError } from '../../errors.ts';
import { tokenize, type Tokens } from './tokenize.ts';
import { forEachSaveLine, type SaveLine } from './save.ts';

export { tokenize, type Tokens };

export class IptablesParseError extends KproxyError {
  declare readonly code: 'KPROXY_IPTABLES_PARSE';
  constructor(
    readonly line: number,
    detail: string,
  ) {
    super('KPROXY_IPTABLES_PARSE', `line ${line}: ${detail}; pass the output of iptables-save (or an iptables-restore payload)`);
  }
}

/** One condition of a rule; all of a rule's conditions must hold for it to match. */
export type Cond =
  | { kind: 'addr'; dir: 'src' | 'dst'; neg: boolean; values: string[] }
  | { kind: 'proto'; neg: boolean; value: string }
  /** `ranges` is null when a port was not numeric (a service name) */
  | { kind: 'port'; dir: 'src' | 'dst' | 'any'; neg: boolean; ranges: Array<[number, number]> | null; raw: string }
  | { kind: 'iface'; dir: 'in' | 'out'; neg: boolean; name: string }
  | { kind: 'addrtype'; dir: 'src' | 'dst'; neg: boolean; types: string[] }
  | { kind: 'iprange'; dir: 'src' | 'dst'; neg: boolean; from: string; to: string }
  | { kind: 'fragment'; neg: boolean }
  | { kind: 'tcpflags'; neg: boolean; mask: string[]; comp: string[] }
  /** looks at connection history (recent --rcheck, mark, ctstate): never true for a first packet */
  | { kind: 'history'; option: string; neg: boolean }
  /** understood and always true for a first packet (comment, recent --set, nfacct, limit, ...) */
  | { kind: 'always'; option: string; args: string[] }
  | { kind: 'unknown'; module: string | null; option: string; neg: boolean; args: string[] };

export interface Target {
  kind: 'jump' | 'goto';
  name: string;
  /** target options in order, e.g. [{opt: '--to-destination', args: ['10.180.0.1:80']}] */
  options: Array<{ opt: string; args: string[] }>;
}

export interface Rule {
  /** the rule as it appeared (trimmed; a leading `[packets:bytes]` counter is dropped) */
  readonly text: string;
  /** 1-based line in the parsed text */
  readonly line: number;
  readonly table: string;
  chain: string;
  readonly conds: Cond[];
  readonly target: Target | null;
  /** the (first) --comment, unquoted */
  readonly comment: string | null;
  /** `-m` modules in order */
  readonly modules: string[];
  /** -m statistic (random / nth): matches only sometimes, so it never ends a walk */
  readonly probabilistic: boolean;
  /** words the parser did not understand (kept for notes) */
  readonly stray: string[];
}

interface RuleBody {
  conds: Cond[];
  target: Target | null;
  comment: string | null;
  modules: string[];
  probabilistic: boolean;
  stray: string[];
}

/**
 * A rule whose options are read on first use: a big dump is mostly rules no trace ever
 * visits, so parsing stays one cheap pass over the lines (a 170k-rule dump in well under a
 * second) and each visited rule is tokenised once.
 */
class LazyRule implements Rule {
  private body: RuleBody | null = null;
  constructor(
    readonly text: string,
    readonly line: number,
    readonly table: string,
    public chain: string,
    /** where the rule's options start, in words of `text` */
    private readonly startAt: number,
  ) {}

  private parsed(): RuleBody {
    if (!this.body) {
      const toks = tokenize(this.text) ?? { words: [], quoted: [] };
      this.body = parseRuleBody(toks, this.startAt);
    }
    return this.body;
  }
  get conds(): Cond[] { return this.parsed().conds; }
  get target(): Target | null { return this.parsed().target; }
  get comment(): string | null { return this.parsed().comment; }
  get modules(): string[] { return this.parsed().modules; }
  get probabilistic(): boolean { return this.parsed().probabilistic; }
  get stray(): string[] { return this.parsed().stray; }
}

export interface Chain {
  name: string;
  /** ACCEPT/DROP for built-in chains, null for user chains ("-") */
  policy: string | null;
  rules: Rule[];
}

export interface Table {
  name: string;
  chains: Map<string, Chain>;
  /** chains removed by `-X` lines, in order */
  deleted: string[];
}

export interface Ruleset {
  tables: Map<string, Table>;
  warnings: string[];
}

const BUILTIN_CHAINS = new Set(['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING']);

export function getChain(rs: Ruleset, table: string, chain: string): Chain | undefined {
  return rs.tables.get(table)?.chains.get(chain);
}

/** Total number of rules, all tables. */
export function ruleCount(rs: Ruleset): number {
  let n = 0;
  for (const t of rs.tables.values()) for (const c of t.chains.values()) n += c.rules.length;
  return n;
}

// ---------------------------------------------------------------------------------------
// The whole text

interface ParseCtx {
  rs: Ruleset;
  table: Table | null;
  lineNo: number;
}

export function parseIptablesSave(text: string): Ruleset {
  const ctx: ParseCtx = { rs: { tables: new Map(), warnings: [] }, table: null, lineNo: 0 };
  forEachSaveLine(text, (l) => {
    ctx.lineNo = l.lineNo;
    parseLine(ctx, l);
  });
  if (ctx.table) ctx.rs.warnings.push(`table ${ctx.table.name} has no COMMIT line`);
  return ctx.rs;
}

function parseLine(ctx: ParseCtx, l: SaveLine): void {
  if (l.kind === 'table') {
    if (ctx.table) ctx.rs.warnings.push(`line ${ctx.lineNo}: table ${l.name} starts before COMMIT of ${ctx.table.name}`);
    ctx.table = tableFor(ctx.rs, l.name);
    return;
  }
  if (l.kind === 'commit') {
    if (!ctx.table) ctx.rs.warnings.push(`line ${ctx.lineNo}: COMMIT outside a table`);
    ctx.table = null;
    return;
  }
  const table = ctx.table;
  if (!table) throw new IptablesParseError(ctx.lineNo, `"${clip(l.line)}" is outside a table (no *filter / *nat line before it)`);
  if (l.kind === 'chain') {
    declareChain(ctx, table, l.line);
    return;
  }
  // forEachSaveLine dropped the counters `iptables-save -c` puts before each rule.
  const line = l.line;
  if (appendFast(ctx, table, line)) return;
  const toks = tokenize(line);
  if (!toks) return unparsed(ctx, line, 'unterminated quote');
  if (toks.words.length === 0) return;
  applyCommand(ctx, table, line, toks);
}

/** "-A CHAIN ..." with a plain chain name: no tokenising until a trace needs the rule. */
function appendFast(ctx: ParseCtx, table: Table, line: string): boolean {
  if (!line.startsWith('-A ')) return false;
  let end = 3;
  while (end < line.length && line[end] !== ' ' && line[end] !== '\t') end++;
  const name = line.slice(3, end);
  if (name === '' || /["\\]/.test(name)) return false;
  if (!quotesClosed(line)) {
    unparsed(ctx, line, 'unterminated quote');
    return true;
  }
  chainFor(ctx, table, name).rules.push(new LazyRule(line, ctx.lineNo, table.name, name, 2));
  return true;
}

/** The quote check of tokenize, without building words. */
function quotesClosed(line: string): boolean {
  if (line.indexOf('\\') < 0) {
    // The common case (iptables-save comments): no escapes, so count the quotes.
    let n = 0;
    for (let i = line.indexOf('"'); i >= 0; i = line.indexOf('"', i + 1)) n++;
    return n % 2 === 0;
  }
  let open = false;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (c === '\\') i++;
    else if (c === '"') open = !open;
  }
  return !open;
}

/**
 * A line the parser cannot read is left out, but never silently: the warning names the
 * line and its text, and the tracer passes it on in its notes.
 */
function unparsed(ctx: ParseCtx, line: string, why: string): void {
  ctx.rs.warnings.push(`line ${ctx.lineNo}: not parsed (${why}), left out: ${clip(line)}`);
}

function tableFor(rs: Ruleset, name: string): Table {
  let t = rs.tables.get(name);
  if (!t) {
    t = { name, chains: new Map(), deleted: [] };
    rs.tables.set(name, t);
  }
  return t;
}

function declareChain(ctx: ParseCtx, table: Table, line: string): void {
  // ":NAME POLICY [packets:bytes]"; the counters are optional in hand-written payloads.
  const parts = line.slice(1).trim().split(/\s+/);
  const name = parts[0];
  if (!name) {
    ctx.rs.warnings.push(`line ${ctx.lineNo}: empty chain declaration`);
    return;
  }
  const policy = parts[1] && parts[1] !== '-' ? parts[1] : null;
  const existing = table.chains.get(name);
  if (existing) {
    // A user chain's declaration flushes it (iptables-restore); a built-in keeps its rules.
    if (!BUILTIN_CHAINS.has(name)) existing.rules = [];
    if (policy) existing.policy = policy;
    return;
  }
  table.chains.set(name, { name, policy, rules: [] });
}

function chainFor(ctx: ParseCtx, table: Table, name: string): Chain {
  let c = table.chains.get(name);
  if (!c) {
    // iptables-restore --noflush payloads may append to chains declared elsewhere.
    if (!BUILTIN_CHAINS.has(name)) ctx.rs.warnings.push(`line ${ctx.lineNo}: chain ${table.name}/${name} used before it was declared`);
    c = { name, policy: null, rules: [] };
    table.chains.set(name, c);
  }
  return c;
}

function applyCommand(ctx: ParseCtx, table: Table, line: string, toks: Tokens): void {
  const cmd = toks.words[0];
  const arg = toks.words[1];
  switch (cmd) {
    case '-A':
    case '--append': {
      if (!arg) return warn(ctx, `"${clip(line)}" names no chain`);
      const chain = chainFor(ctx, table, arg);
      chain.rules.push(new LazyRule(line, ctx.lineNo, table.name, arg, 2));
      return;
    }
    case '-I':
    case '--insert': {
      if (!arg) return warn(ctx, `"${clip(line)}" names no chain`);
      const chain = chainFor(ctx, table, arg);
      const hasPos = /^\d+$/.test(toks.words[2] ?? '');
      const pos = hasPos ? Math.max(1, parseInt(toks.words[2], 10)) - 1 : 0;
      chain.rules.splice(Math.min(pos, chain.rules.length), 0, new LazyRule(line, ctx.lineNo, table.name, arg, hasPos ? 3 : 2));
      return;
    }
    case '-R':
    case '--replace': {
      const chain = arg ? table.chains.get(arg) : undefined;
      const pos = parseInt(toks.words[2] ?? '', 10);
      if (!chain || !(pos >= 1 && pos <= chain.rules.length)) return warn(ctx, `cannot replace: "${clip(line)}"`);
      chain.rules[pos - 1] = new LazyRule(line, ctx.lineNo, table.name, arg, 3);
      return;
    }
    case '-D':
    case '--delete':
      return deleteRule(ctx, table, line, toks);
    case '-N':
    case '--new-chain':
      if (arg && !table.chains.has(arg)) table.chains.set(arg, { name: arg, policy: null, rules: [] });
      return;
    case '-X':
    case '--delete-chain':
      return deleteChains(table, arg);
    case '-F':
    case '--flush':
      if (arg) {
        const c = table.chains.get(arg);
        if (c) c.rules = [];
      } else for (const c of table.chains.values()) c.rules = [];
      return;
    case '-P':
    case '--policy': {
      if (arg && toks.words[2]) chainFor(ctx, table, arg).policy = toks.words[2];
      return;
    }
    case '-E':
    case '--rename-chain':
      return renameChain(ctx, table, arg, toks.words[2]);
    case '-Z':
    case '--zero':
      return;
    default:
      return warn(ctx, `unknown command "${clip(line)}"`);
  }
}

function warn(ctx: ParseCtx, msg: string): void {
  ctx.rs.warnings.push(`line ${ctx.lineNo}: ${msg}`);
}

function deleteChains(table: Table, name: string | undefined): void {
  const names = name ? [name] : [...table.chains.keys()].filter((n) => !BUILTIN_CHAINS.has(n));
  for (const n of names) {
    table.chains.delete(n);
    table.deleted.push(n);
  }
}

function renameChain(ctx: ParseCtx, table: Table, from: string | undefined, to: string | undefined): void {
  const c = from ? table.chains.get(from) : undefined;
  if (!c || !to) return warn(ctx, `cannot rename chain ${from ?? ''}`);
  table.chains.delete(c.name);
  c.name = to;
  for (const r of c.rules) r.chain = to;
  table.chains.set(to, c);
}

function deleteRule(ctx: ParseCtx, table: Table, line: string, toks: Tokens): void {
  const chain = toks.words[1] ? table.chains.get(toks.words[1]) : undefined;
  if (!chain) return warn(ctx, `cannot delete from a missing chain: "${clip(line)}"`);
  if (toks.words.length === 3 && /^\d+$/.test(toks.words[2])) {
    const pos = parseInt(toks.words[2], 10);
    if (pos >= 1 && pos <= chain.rules.length) chain.rules.splice(pos - 1, 1);
    else warn(ctx, `no rule ${pos} in ${chain.name}`);
    return;
  }
  // Delete by specification: compare the words after the chain name.
  const spec = toks.words.slice(2).join('\u0000');
  const idx = chain.rules.findIndex((r) => {
    const t = tokenize(r.text);
    return t !== null && t.words.slice(2).join('\u0000') === spec;
  });
  if (idx >= 0) chain.rules.splice(idx, 1);
  else warn(ctx, `no rule to delete: "${clip(line)}"`);
}

function clip(s: string): string {
  return s.length > 120 ? `${s.slice(0, 117)}...` : s;
}

// ---------------------------------------------------------------------------------------
// One rule

/** Options every module may be followed by, with their number of arguments. */
const CORE_OPTIONS: Record<string, string> = {
  '-p': 'proto', '--protocol': 'proto',
  '-s': 'src', '--source': 'src', '--src': 'src',
  '-d': 'dst', '--destination': 'dst', '--dst': 'dst',
  '-i': 'in', '--in-interface': 'in',
  '-o': 'out', '--out-interface': 'out',
  '-f': 'frag', '--fragment': 'frag',
  '-m': 'match', '--match': 'match',
  '-j': 'jump', '--jump': 'jump',
  '-g': 'goto', '--goto': 'goto',
  '-c': 'counters', '--set-counters': 'counters',
  '-4': 'family', '--ipv4': 'family', '-6': 'family', '--ipv6': 'family',
};

/** Match options whose values are history: a tracer's first packet never matches them. */
const HISTORY_OPTIONS = new Set(['--rcheck', '--update', '--remove', '--mark', '--ctstate', '--state']);

/** Match options with no effect on a first packet, and how many arguments each takes. */
const ALWAYS_OPTIONS: Record<string, number> = {
  '--comment': 1,
  '--set': 0, '--name': 1, '--seconds': 1, '--reap': 0, '--hitcount': 1, '--rttl': 0,
  '--rsource': 0, '--rdest': 0, '--mask': 1,
  '--mode': 1, '--probability': 1, '--every': 1, '--packet': 1,
  '--limit-iface-in': 0, '--limit-iface-out': 0,
  '--nfacct-name': 1,
  '--limit': 1, '--limit-burst': 1,
};

/** Arguments of options whose meaning we do not evaluate but whose arity we know. */
const KNOWN_ARITY: Record<string, number> = {
  '--match-set': 2, '--tcp-flags': 2, '--ctstatus': 1, '--ctorigsrc': 1, '--ctorigdst': 1,
  '--ctreplsrc': 1, '--ctrepldst': 1, '--ctdir': 1, '--ctproto': 1, '--ctexpire': 1,
  '--uid-owner': 1, '--gid-owner': 1, '--physdev-in': 1, '--physdev-out': 1,
  '--pkt-type': 1, '--length': 1, '--ttl-eq': 1, '--ttl-gt': 1, '--ttl-lt': 1,
  '--icmp-type': 1, '--icmpv6-type': 1, '--string': 1, '--algo': 1, '--to': 1, '--from': 1,
  '--hashlimit': 1, '--hashlimit-upto': 1, '--hashlimit-above': 1, '--hashlimit-name': 1,
  '--hashlimit-mode': 1, '--hashlimit-burst': 1, '--u32': 1, '--bytecode': 1, '--connlimit-above': 1,
  '--connlimit-upto': 1, '--connlimit-mask': 1, '--src-range': 1, '--dst-range': 1,
  '--chunk-types': 2, '--tcp-option': 1, '--dscp': 1, '--tos': 1,
};

/** Target options and their number of arguments. */
const TARGET_ARITY: Record<string, number> = {
  '--to-destination': 1, '--to-source': 1, '--to-ports': 1, '--to': 1,
  '--or-mark': 1, '--and-mark': 1, '--xor-mark': 1, '--set-mark': 1, '--set-xmark': 1,
  '--reject-with': 1, '--random': 0, '--random-fully': 0, '--persistent': 0,
  '--log-prefix': 1, '--log-level': 1, '--log-uid': 0, '--log-tcp-options': 0,
  '--log-ip-options': 0, '--log-tcp-sequence': 0, '--nflog-group': 1, '--nflog-prefix': 1,
  '--queue-num': 1, '--queue-bypass': 0, '--notrack': 0, '--zone': 1, '--helper': 1,
  '--save-mark': 0, '--restore-mark': 0, '--nfmask': 1, '--ctmask': 1,
};

interface RuleBuilder {
  rule: RuleBody;
  module: string | null;
  inTarget: boolean;
}

/** Reads a rule's options (words from `startAt` on: after "-A CHAIN"). */
export function parseRuleBody(toks: Tokens, startAt: number): RuleBody {
  const rule: RuleBody = { conds: [], target: null, comment: null, modules: [], probabilistic: false, stray: [] };
  const b: RuleBuilder = { rule, module: null, inTarget: false };
  const { words, quoted } = toks;
  let neg = false;
  let i = startAt;
  while (i < words.length) {
    const w = words[i];
    if (w === '!' && !quoted[i]) {
      neg = !neg;
      i++;
      continue;
    }
    const isOption = w.length > 1 && w[0] === '-' && !quoted[i];
    if (!isOption) {
      rule.stray.push(w);
      i++;
      neg = false;
      continue;
    }
    const n = argCount(b, w, words, quoted, i);
    const args = words.slice(i + 1, i + 1 + n);
    // Old syntax "-s ! 10.0.0.0/8": the negation follows the option.
    if (n > 0 && args[0] === '!' && !quoted[i + 1]) {
      neg = !neg;
      args.shift();
      if (i + 1 + n < words.length) args.push(words[i + 1 + n]);
      i++;
    }
    applyOption(b, w, neg, args);
    i += 1 + n;
    neg = false;
  }
  return rule;
}

/** Options whose free text another tool may have written unquoted over several words. */
const FREE_TEXT_OPTIONS = new Set(['--comment', '--log-prefix', '--nflog-prefix']);
const OPTION_LIKE = /^--?[A-Za-z]/;

/**
 * Words of a free-text value: one when quoted (iptables-save always quotes text with
 * spaces); unquoted, every word up to the next option or "!" (as a dump written by another
 * tool may hold `--comment two words`, which upstream's parser reads too).
 */
function freeTextArity(words: string[], quoted: boolean[], i: number): number {
  if (i + 1 >= words.length) return 0;
  if (quoted[i + 1]) return 1;
  let n = 1;
  while (i + 1 + n < words.length) {
    const next = words[i + 1 + n];
    if (quoted[i + 1 + n] || next === '!' || OPTION_LIKE.test(next)) break;
    n++;
  }
  return n;
}

/** How many words after option `opt` are its arguments. */
function argCount(b: RuleBuilder, opt: string, words: string[], quoted: boolean[], i: number): number {
  if (FREE_TEXT_OPTIONS.has(opt)) return freeTextArity(words, quoted, i);
  const core = CORE_OPTIONS[opt];
  if (core) return core === 'frag' || core === 'family' ? 0 : core === 'counters' ? countersArity(words, i) : 1;
  if (b.inTarget && opt in TARGET_ARITY) return TARGET_ARITY[opt];
  if (!b.inTarget) {
    if (opt in ALWAYS_OPTIONS) return ALWAYS_OPTIONS[opt];
    if (HISTORY_OPTIONS.has(opt)) return opt === '--mark' || opt === '--ctstate' || opt === '--state' ? 1 : 0;
    if (opt in KNOWN_ARITY) return KNOWN_ARITY[opt];
    if (PORT_OPTIONS[opt] || opt === '--src-type' || opt === '--dst-type') return 1;
    if (opt === '--syn') return 0;
  }
  // Unknown option: its arguments run to the next option or negation.
  let n = 0;
  while (i + 1 + n < words.length) {
    const next = words[i + 1 + n];
    if (!quoted[i + 1 + n] && (next === '!' || (next.length > 1 && next[0] === '-' && !/^-\d/.test(next)))) break;
    n++;
  }
  return n;
}

function countersArity(words: string[], i: number): number {
  // "-c PKTS BYTES" or "-c [PKTS:BYTES]"
  return /^\[/.test(words[i + 1] ?? '') ? 1 : 2;
}

const PORT_OPTIONS: Record<string, 'src' | 'dst' | 'any'> = {
  '--dport': 'dst', '--destination-port': 'dst', '--dports': 'dst', '--destination-ports': 'dst',
  '--sport': 'src', '--source-port': 'src', '--sports': 'src', '--source-ports': 'src',
  '--ports': 'any',
};

function applyOption(b: RuleBuilder, opt: string, neg: boolean, args: string[]): void {
  const rule = b.rule;
  const core = CORE_OPTIONS[opt];
  if (core) return applyCore(b, core, neg, args);
  if (b.inTarget) {
    rule.target!.options.push({ opt, args });
    return;
  }
  const port = PORT_OPTIONS[opt];
  if (port) {
    rule.conds.push({ kind: 'port', dir: port, neg, ranges: parsePorts(args[0] ?? ''), raw: args[0] ?? '' });
    return;
  }
  switch (opt) {
    case '--src-type':
    case '--dst-type':
      rule.conds.push({ kind: 'addrtype', dir: opt === '--src-type' ? 'src' : 'dst', neg, types: (args[0] ?? '').split(',') });
      return;
    case '--src-range':
    case '--dst-range': {
      const [from, to] = (args[0] ?? '').split('-');
      rule.conds.push({ kind: 'iprange', dir: opt === '--src-range' ? 'src' : 'dst', neg, from: from ?? '', to: to ?? from ?? '' });
      return;
    }
    case '--syn':
      rule.conds.push({ kind: 'tcpflags', neg, mask: ['SYN', 'RST', 'ACK', 'FIN'], comp: ['SYN'] });
      return;
    case '--tcp-flags':
      rule.conds.push({ kind: 'tcpflags', neg, mask: flagList(args[0]), comp: flagList(args[1]) });
      return;
    case '--comment':
      if (rule.comment === null) rule.comment = args.join(' ');
      break;
    case '--probability':
    case '--every':
      rule.probabilistic = true;
      break;
  }
  if (HISTORY_OPTIONS.has(opt)) {
    rule.conds.push({ kind: 'history', option: opt, neg });
    return;
  }
  if (opt in ALWAYS_OPTIONS) {
    rule.conds.push({ kind: 'always', option: opt, args });
    return;
  }
  rule.conds.push({ kind: 'unknown', module: b.module, option: opt, neg, args });
}

function applyCore(b: RuleBuilder, core: string, neg: boolean, args: string[]): void {
  const rule = b.rule;
  const v = args[0] ?? '';
  switch (core) {
    case 'proto':
      rule.conds.push({ kind: 'proto', neg, value: v.toLowerCase() });
      return;
    case 'src':
    case 'dst':
      rule.conds.push({ kind: 'addr', dir: core, neg, values: v.split(',') });
      return;
    case 'in':
    case 'out':
      rule.conds.push({ kind: 'iface', dir: core, neg, name: v });
      return;
    case 'frag':
      rule.conds.push({ kind: 'fragment', neg });
      return;
    case 'match':
      b.module = v;
      b.inTarget = false;
      rule.modules.push(v);
      if (v === 'statistic') rule.probabilistic = true;
      return;
    case 'jump':
    case 'goto':
      rule.target = { kind: core === 'jump' ? 'jump' : 'goto', name: v, options: [] };
      b.inTarget = true;
      return;
    default:
      return; // counters, family: no effect on matching
  }
}

function flagList(s: string | undefined): string[] {
  if (!s || s === 'NONE') return [];
  if (s === 'ALL') return ['SYN', 'ACK', 'FIN', 'RST', 'URG', 'PSH'];
  return s.toUpperCase().split(',');
}

/** "80", "80:90", "80,443,1000:2000" → ranges; null if any port is not a number. */
export function parsePorts(s: string): Array<[number, number]> | null {
  const out: Array<[number, number]> = [];
  for (const part of s.split(',')) {
    const m = /^(\d*)(?::(\d*))?$/.exec(part);
    if (!m || (m[1] === '' && m[2] === undefined)) return null;
    const lo = m[1] === '' ? 0 : parseInt(m[1], 10);
    const hi = m[2] === undefined ? lo : m[2] === '' ? 65535 : parseInt(m[2], 10);
    out.push([lo, hi]);
  }
  return out;
}

/** Option value of a target, e.g. targetOption(rule.target, '--to-destination'). */
export function targetOption(t: Target | null, opt: string): string | undefined {
  return t?.options.find((o) => o.opt === opt)?.args[0];
}
