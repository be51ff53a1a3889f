// The one stateful fake of the kernel's nftables, behind a CommandRunner, for every test of
// the nftables mode: `nft -f -` (atomic: a refused transaction changes nothing; `-c` checks
// only), `nft list table|chains|ruleset`, `nft -t list sets|maps`, `nft delete table`,
// `nft --version`. It holds tables, chains, rules, sets, maps and elements per family, reads
// the `nft -f` text with its own small reader (one command a line, as kproxy writes them),
// and refuses what the kernel refuses: anything in a missing table; a jump, goto or verdict
// into a missing chain; `@set` of a missing set; an element of a missing set or one whose
// key is there with another verdict; `create` of what exists; a set re-declared with
// another type; deleting what does not exist, or a chain or set still referenced. Listings
// come in `nft list` block form. Used by tests only; pure (no I/O).
import type { CommandRunner, RunOptions, RunResult } from '../runner.ts';
import { inputText } from '../runner.ts';

interface FakeChain {
  name: string;
  /** "type nat hook prerouting priority -100" for base chains */
  base?: string;
  comment?: string;
  rules: string[];
}

interface FakeElement {
  value?: string;
  comment?: string;
}

interface FakeSet {
  kind: 'set' | 'map';
  name: string;
  /** the declaration's lines: type, flags, timeout, comment (as written) */
  spec: string[];
  type: string;
  elements: Map<string, FakeElement>;
}

interface FakeTable {
  family: string;
  name: string;
  handle: number;
  comment?: string;
  chains: Map<string, FakeChain>;
  sets: Map<string, FakeSet>;
}

/** A refusal: the message nft prints after "Error: ". */
class Refused extends Error {}

const ok = (stdout = ''): RunResult => ({ code: 0, stdout, stderr: '' });
const fail = (stderr: string): RunResult => ({ code: 1, stdout: '', stderr });
const ENOENT = 'Could not process rule: No such file or directory';
const EEXIST = 'Could not process rule: File exists';
const EBUSY = 'Could not process rule: Device or resource busy';

/** Words of one command: whitespace-separated, a quoted string one word, `;` `{` `}` `,` on their own. */
export function nftWords(line: string): string[] {
  const out: string[] = [];
  for (const m of line.matchAll(/"[^"]*"|[{};,]|[^\s{};,"]+/g)) out.push(m[0]);
  return out;
}

/** The words between the `{` at `start` and its matching `}`, split at top-level `sep`. */
function bodyItems(words: string[], start: number, sep: string): string[][] {
  const items: string[][] = [[]];
  let depth = 0;
  for (let i = start; i < words.length; i++) {
    const w = words[i];
    if (w === '{' && depth++ === 0) continue;
    if (w === '}' && --depth === 0) break;
    if (depth === 1 && w === sep) items.push([]);
    else items[items.length - 1].push(w);
  }
  return items.filter((it) => it.length > 0);
}

function unquote(w: string): string {
  return w.startsWith('"') ? w.slice(1, -1) : w;
}

/** The chains a rule or verdict jumps or goes to. */
function targets(words: string[]): string[] {
  return words.flatMap((w, i) => ((w === 'jump' || w === 'goto') && words[i + 1] ? [words[i + 1]] : []));
}

function cloneTables(t: Map<string, FakeTable>): Map<string, FakeTable> {
  const out = new Map<string, FakeTable>();
  for (const [k, tb] of t) {
    const chains = new Map([...tb.chains].map(([n, c]) => [n, { ...c, rules: [...c.rules] }]));
    const sets = new Map([...tb.sets].map(([n, s]) => [n, { ...s, elements: new Map(s.elements) }]));
    out.set(k, { ...tb, chains, sets });
  }
  return out;
}

export interface FakeNftOptions {
  /** more refusals: the message for a line the kernel would refuse (e.g. an address it cannot take) */
  refuse?: (line: string) => string | null;
  /** report at most this many refused lines per transaction (as iptables-restore, which stops at the first) */
  maxErrors?: number;
  /** the families the kernel's nf_tables supports (default ip, ip6, inet); another is "Operation not supported" */
  families?: string[];
}

export class FakeNft implements CommandRunner {
  /** "family name" → table */
  tables = new Map<string, FakeTable>();
  readonly calls: Array<{ args: string[]; input?: string }> = [];
  /** the transactions applied (not the refused or checked ones) */
  readonly applied: string[] = [];
  private nextHandle = 1;

  constructor(private readonly opts: FakeNftOptions = {}) {}

  async run(cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
    if (cmd !== 'nft') return fail(`fake nft: unexpected command ${cmd}`);
    // read once, as nft reads its stdin
    const input = opts.input === undefined ? undefined : inputText(opts.input);
    this.calls.push({ args, input });
    const a = args.filter((x) => x !== '-a' && x !== '-t');
    if (a[0] === '--version') return ok('nftables v1.0.6 (Lester Gooch #5)\n');
    if (a[0] === '-f' || (a[0] === '-c' && a[1] === '-f')) return this.transaction(input ?? '', a[0] === '-c');
    if (a[0] === 'list') return this.list(a.slice(1), args.includes('-a'));
    if (a[0] === 'delete' && a[1] === 'table') return this.transaction(`delete table ${a[2]} ${a[3]}\n`, false);
    return fail(`fake nft: unexpected arguments ${args.join(' ')}`);
  }

  /**
   * Applies `text` on a copy; the copy replaces the state only when every line was accepted.
   * As nft does with the kernel's answers to a batch, every refused line is reported.
   */
  private transaction(text: string, checkOnly: boolean): RunResult {
    const lines = text.split('\n');
    const work = cloneTables(this.tables);
    const handle = this.nextHandle;
    const errors: string[] = [];
    lines.forEach((line, i) => {
      const words = nftWords(line);
      if (words.length === 0 || words[0].startsWith('#')) return;
      try {
        const refusal = this.opts.refuse?.(line);
        if (refusal) throw new Refused(refusal);
        this.command(work, words);
      } catch (e) {
        if (!(e instanceof Refused)) throw e;
        errors.push(`/dev/stdin:${i + 1}:1-${line.length}: Error: ${e.message}\n${line}\n`);
      }
    });
    if (errors.length || checkOnly) {
      this.nextHandle = handle;
      return errors.length ? fail(errors.slice(0, this.opts.maxErrors ?? errors.length).join('')) : ok();
    }
    this.tables = work;
    this.applied.push(text);
    return ok();
  }

  /** One command: VERB OBJECT FAMILY TABLE [NAME] [...]. */
  private command(t: Map<string, FakeTable>, w: string[]): void {
    const [verb, obj, family, name] = w;
    if (!['add', 'create', 'flush', 'delete'].includes(verb) || !family || !name) throw new Refused(`syntax error, unexpected ${w.slice(0, 2).join(' ')}`);
    if (!(this.opts.families ?? ['ip', 'ip6', 'inet']).includes(family)) throw new Refused('Could not process rule: Operation not supported');
    if (obj === 'table') return this.tableCommand(t, verb, family, name, w);
    const tb = t.get(`${family} ${name}`);
    if (!tb) throw new Refused(ENOENT);
    const rest = w.slice(4);
    if (obj === 'chain') return chainCommand(tb, verb, rest);
    if (obj === 'rule' && verb === 'add') return addRule(tb, rest[0], rest.slice(1));
    if (obj === 'set' || obj === 'map') return setCommand(tb, verb, obj, rest);
    if (obj === 'element') return elementCommand(tb, verb, rest);
    throw new Refused(`syntax error, unexpected ${verb} ${obj}`);
  }

  private tableCommand(t: Map<string, FakeTable>, verb: string, family: string, name: string, w: string[]): void {
    const key = `${family} ${name}`;
    const have = t.get(key);
    if (verb === 'delete') {
      if (!have) throw new Refused(ENOENT);
      t.delete(key);
      return;
    }
    if (verb === 'flush') {
      if (!have) throw new Refused(ENOENT);
      for (const c of have.chains.values()) c.rules = [];
      for (const s of have.sets.values()) s.elements.clear();
      return;
    }
    if (have && verb === 'create') throw new Refused(EEXIST);
    const tb: FakeTable = have ?? { family, name, handle: this.nextHandle++, chains: new Map(), sets: new Map() };
    for (const item of w[4] === '{' ? bodyItems(w, 4, ';') : []) if (item[0] === 'comment') tb.comment = unquote(item[1]);
    t.set(key, tb);
  }

  private list(a: string[], handles: boolean): RunResult {
    const [what, family, name] = a;
    if (what === 'table') {
      const tb = this.tables.get(`${family} ${name}`);
      return tb ? ok(listTable(tb, { rules: true, elements: true, handles })) : fail(`Error: ${ENOENT}\n`);
    }
    const of = [...this.tables.values()].filter((tb) => family === undefined || tb.family === family);
    if (what === 'ruleset') return ok(of.map((tb) => listTable(tb, { rules: true, elements: true, handles })).join(''));
    if (what === 'chains') return ok(of.map((tb) => listTable(tb, { only: 'chains' })).join(''));
    if (what === 'sets' || what === 'maps') return ok(of.map((tb) => listTable(tb, { only: what === 'sets' ? 'set' : 'map' })).join(''));
    return fail(`fake nft: unexpected list ${a.join(' ')}`);
  }

  /** The table as `nft list table` prints it (tests' golden comparisons). */
  dump(family: string, name: string): string | null {
    const tb = this.tables.get(`${family} ${name}`);
    return tb ? listTable(tb, { rules: true, elements: true }) : null;
  }

  /** The tables' names, "family name", in creation order. */
  tableNames(): string[] {
    return [...this.tables.values()].sort((x, y) => x.handle - y.handle).map((tb) => `${tb.family} ${tb.name}`);
  }
}

function chainCommand(tb: FakeTable, verb: string, rest: string[]): void {
  const name = rest[0];
  const have = tb.chains.get(name);
  if (verb === 'delete') {
    if (!have) throw new Refused(ENOENT);
    if (chainReferenced(tb, name)) throw new Refused(EBUSY);
    tb.chains.delete(name);
    return;
  }
  if (verb === 'flush') {
    if (!have) throw new Refused(ENOENT);
    have.rules = [];
    return;
  }
  if (have && verb === 'create') throw new Refused(EEXIST);
  const ch = have ?? { name, rules: [] };
  tb.chains.set(name, ch);
  for (const item of rest[1] === '{' ? bodyItems(rest, 1, ';') : []) {
    if (item[0] === 'type' && item.includes('hook')) {
      const base = item.join(' ');
      if (have?.base !== undefined && have.base !== base) throw new Refused(EBUSY);
      ch.base = base;
    } else if (item[0] === 'comment' && item.length === 2) ch.comment = unquote(item[1]);
    else if (item[0] !== 'policy') addRule(tb, name, item);
  }
}

function addRule(tb: FakeTable, chain: string, words: string[]): void {
  const ch = tb.chains.get(chain);
  if (!ch || words.length === 0) throw new Refused(ENOENT);
  for (const c of targets(words)) if (!tb.chains.has(c)) throw new Refused(ENOENT);
  for (const w of words) if (w.startsWith('@') && !tb.sets.has(w.slice(1))) throw new Refused(`No such file or directory; did you mean set ${w.slice(1)}?`);
  ch.rules.push(words.join(' '));
}

function chainReferenced(tb: FakeTable, name: string): boolean {
  for (const ch of tb.chains.values()) for (const r of ch.rules) if (targets(nftWords(r)).includes(name)) return true;
  for (const s of tb.sets.values()) for (const el of s.elements.values()) if (el.value && targets(el.value.split(' ')).includes(name)) return true;
  return false;
}

function setCommand(tb: FakeTable, verb: string, kind: 'set' | 'map', rest: string[]): void {
  const name = rest[0];
  const have = tb.sets.get(name);
  if (verb === 'delete' || verb === 'flush') {
    if (!have || have.kind !== kind) throw new Refused(ENOENT);
    if (verb === 'flush') have.elements.clear();
    else if ([...tb.chains.values()].some((c) => c.rules.some((r) => nftWords(r).includes(`@${name}`)))) throw new Refused(EBUSY);
    else tb.sets.delete(name);
    return;
  }
  if (have && verb === 'create') throw new Refused(EEXIST);
  const items = rest[1] === '{' ? bodyItems(rest, 1, ';') : [];
  const spec = items.filter((it) => it[0] !== 'elements').map((it) => it.join(' '));
  const type = spec.find((s) => s.startsWith('type ')) ?? '';
  if (have && (have.kind !== kind || have.type !== type)) throw new Refused(EEXIST);
  if (!have && !type) throw new Refused('set needs a type');
  const set = have ?? { kind, name, spec, type, elements: new Map() };
  tb.sets.set(name, set);
  const els = items.find((it) => it[0] === 'elements');
  if (els) addElements(tb, set, els, els.indexOf('{'));
}

function elementCommand(tb: FakeTable, verb: string, rest: string[]): void {
  const set = tb.sets.get(rest[0]);
  if (!set) throw new Refused(ENOENT);
  if (verb === 'add' || verb === 'create') return addElements(tb, set, rest, 1);
  if (verb !== 'delete') throw new Refused(`syntax error, unexpected ${verb} element`);
  for (const item of bodyItems(rest, 1, ',')) {
    const key = elementParts(item).key;
    if (!set.elements.delete(key)) throw new Refused(ENOENT);
  }
}

/** "KEY [timeout T] [comment "C"] [: VALUE]" → its parts. */
function elementParts(words: string[]): { key: string; el: FakeElement } {
  const colon = words.indexOf(':');
  const head = colon >= 0 ? words.slice(0, colon) : words;
  const el: FakeElement = {};
  if (colon >= 0) el.value = words.slice(colon + 1).join(' ');
  const c = head.indexOf('comment');
  if (c >= 0) el.comment = unquote(head[c + 1]);
  const key = head.slice(0, c >= 0 ? c : head.length).filter((w, i, all) => w !== 'timeout' && all[i - 1] !== 'timeout');
  return { key: key.join(' '), el };
}

function addElements(tb: FakeTable, set: FakeSet, words: string[], start: number): void {
  for (const item of bodyItems(words, start, ',')) {
    const { key, el } = elementParts(item);
    if ((set.kind === 'map') !== (el.value !== undefined)) throw new Refused(`element ${key} does not match the ${set.kind}`);
    for (const c of targets((el.value ?? '').split(' '))) if (!tb.chains.has(c)) throw new Refused(ENOENT);
    const have = set.elements.get(key);
    if (have && have.value !== el.value) throw new Refused(EEXIST);
    if (!have) set.elements.set(key, el);
  }
}

interface ListOptions {
  rules?: boolean;
  elements?: boolean;
  handles?: boolean;
  only?: 'chains' | 'set' | 'map';
}

/** A table in `nft list` block form (tabs, as nft prints it). */
function listTable(tb: FakeTable, o: ListOptions): string {
  const out = [`table ${tb.family} ${tb.name} {${o.handles ? ` # handle ${tb.handle}` : ''}`];
  if (tb.comment !== undefined && !o.only) out.push(`\tcomment "${tb.comment}"`);
  for (const s of tb.sets.values()) {
    if (o.only === 'chains' || (o.only && o.only !== s.kind)) continue;
    out.push(`\t${s.kind} ${s.name} {`, ...s.spec.map((l) => `\t\t${l}`));
    if (o.elements && s.elements.size) out.push(`\t\telements = { ${[...s.elements].map(([k, el]) => elementText(k, el)).join(',\n\t\t\t     ')} }`);
    out.push('\t}');
  }
  for (const ch of tb.chains.values()) {
    if (o.only && o.only !== 'chains') continue;
    out.push(`\tchain ${ch.name} {`);
    if (ch.comment !== undefined) out.push(`\t\tcomment "${ch.comment}"`);
    if (ch.base) out.push(`\t\t${ch.base}; policy accept;`);
    if (o.rules) out.push(...ch.rules.map((r) => `\t\t${r}`));
    out.push('\t}');
  }
  out.push('}');
  return out.join('\n') + '\n';
}

function elementText(key: string, el: FakeElement): string {
  return `${key}${el.comment !== undefined ? ` comment "${el.comment}"` : ''}${el.value !== undefined ? ` : ${el.value}` : ''}`;
}
