// The one stateful fake of the kernel's iptables tables, behind a CommandRunner, for the
// tests of every mode that uses iptables (iptables, ipvs, userspace): iptables-save,
// iptables-restore (atomic: a refused line changes nothing; --noflush or not) and the
// iptables -N/-C/-I/-D/-S/-F/-X calls the executors make. It rejects what the kernel
// rejects: an unknown table, a rule in a missing chain, a jump to a missing chain (checked
// per rule and again at COMMIT), deleting a missing or still-referenced chain, deleting a
// rule that is not there, a restore's `-I chain pos` / `-D chain pos` past the chain's end. Lines are read with the package's save reader and tokenizer, so a
// quoted comment matches however it was quoted. One instance per family. Used by tests
// only; pure (no I/O), so it lives beside the code it fakes.
import type { CommandRunner, RunOptions, RunResult } from '../runner.ts';
import { forEachSaveLine } from './save.ts';
import { quoteArg, splitRuleArgs } from './tokenize.ts';
import { inputText } from '../runner.ts';

export const BUILTIN_CHAINS: Record<string, string[]> = {
  filter: ['INPUT', 'FORWARD', 'OUTPUT'],
  nat: ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'],
  mangle: ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'],
};
const TARGETS = new Set(['ACCEPT', 'DROP', 'REJECT', 'RETURN', 'DNAT', 'SNAT', 'MASQUERADE', 'MARK', 'LOG', 'REDIRECT', 'CONNMARK', 'NOTRACK']);

/** table → chain → rules (each the text after `-A CHAIN`, as written) */
export type FakeTables = Map<string, Map<string, string[]>>;

function fresh(): FakeTables {
  const t: FakeTables = new Map();
  for (const [name, chains] of Object.entries(BUILTIN_CHAINS)) t.set(name, new Map(chains.map((c) => [c, []])));
  return t;
}

function clone(t: FakeTables): FakeTables {
  return new Map([...t].map(([n, chains]) => [n, new Map([...chains].map(([c, r]) => [c, [...r]]))]));
}

/** A rule's canonical text: its words, re-quoted, so `--comment "a"` and `--comment a` are one rule. */
export function canonicalRule(spec: string): string {
  return splitRuleArgs(spec).map(quoteArg).join(' ');
}

function jumpTarget(spec: string): string | undefined {
  const words = splitRuleArgs(spec);
  const i = words.findIndex((w) => w === '-j' || w === '--jump' || w === '-g' || w === '--goto');
  return i >= 0 ? words[i + 1] : undefined;
}

const ok = (stdout = ''): RunResult => ({ code: 0, stdout, stderr: '' });
const fail = (stderr: string, code = 1): RunResult => ({ code, stdout: '', stderr });

export interface FakeIptablesOptions {
  /** more refusals, e.g. a `--match-set` of a set that does not exist (the ipvs host fake) */
  check?: (table: string, spec: string) => string | null;
}

export class FakeIptables implements CommandRunner {
  tables: FakeTables = fresh();
  readonly calls: Array<{ cmd: string; args: string[]; input?: string }> = [];
  /** when set, the next restore fails at this payload line */
  failNextRestoreAtLine: number | null = null;

  constructor(
    readonly family: 4 | 6 = 4,
    private readonly opts: FakeIptablesOptions = {},
  ) {}

  get prefix(): string {
    return this.family === 6 ? 'ip6tables' : 'iptables';
  }

  /** Whether this fake answers a command (its family's iptables, -save and -restore). */
  handles(cmd: string): boolean {
    return cmd === this.prefix || cmd === `${this.prefix}-save` || cmd === `${this.prefix}-restore`;
  }

  async run(cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
    this.calls.push({ cmd, args, input: opts.input === undefined ? undefined : inputText(opts.input) });
    const a = args.filter((x, i) => !(x === '-w' || args[i - 1] === '-w'));
    if (cmd === `${this.prefix}-restore`) return this.restore(inputText(opts.input), a.includes('--noflush'));
    if (cmd === `${this.prefix}-save`) {
      const only = a[0] === '-t' ? a[1] : undefined;
      if (only && !this.tables.has(only)) return fail(`${this.prefix}-save: table '${only}' does not exist`);
      return ok(this.save(only));
    }
    if (cmd === this.prefix) return this.iptables(a);
    if (cmd === 'sysctl') return ok('0\n');
    return fail(`${cmd}: not modelled`, 127);
  }

  save(only?: string): string {
    const out: string[] = [];
    for (const [name, chains] of this.tables) {
      if (only && name !== only) continue;
      out.push(`*${name}`);
      for (const c of chains.keys()) out.push(`:${c} ${BUILTIN_CHAINS[name].includes(c) ? 'ACCEPT' : '-'} [0:0]`);
      for (const [c, rules] of chains) for (const r of rules) out.push(`-A ${c} ${r}`);
      out.push('COMMIT');
    }
    return out.join('\n') + '\n';
  }

  chains(table: string): string[] {
    return [...(this.tables.get(table)?.keys() ?? [])];
  }

  rules(table: string, chain: string): string[] {
    return this.tables.get(table)?.get(chain) ?? [];
  }

  /** What an admin's `iptables -F; iptables -X` on every table would do. */
  flushAll(): void {
    this.tables = fresh();
  }

  /** Why the kernel would refuse this rule in `table`, or null. */
  private refusal(tableName: string, table: Map<string, string[]>, spec: string): string | null {
    const target = jumpTarget(spec);
    if (target && !TARGETS.has(target) && !table.has(target)) return `Chain '${target}' does not exist`;
    return this.opts.check?.(tableName, spec) ?? null;
  }

  private referenced(table: Map<string, string[]>, chain: string): boolean {
    for (const rules of table.values()) if (rules.some((r) => jumpTarget(r) === chain)) return true;
    return false;
  }

  private restore(payload: string, noflush: boolean): RunResult {
    const t = clone(this.tables);
    let table: Map<string, string[]> | null = null;
    let tableName = '';
    let refused: RunResult | null = null;
    const err = (n: number, why: string) => fail(`${this.prefix}-restore v1.8.9 (nf_tables): ${why}\nError occurred at line: ${n}\n`, 2);
    const inject = this.failNextRestoreAtLine;
    // As the kernel refuses a batch it cannot take now (not a fault of the line's Service).
    const injected = () => {
      this.failNextRestoreAtLine = null;
      return err(inject!, 'injected failure: Resource temporarily unavailable');
    };
    forEachSaveLine(payload, (l) => {
      if (refused) return;
      const n = l.lineNo;
      if (inject !== null && n >= inject) return void (refused = injected());
      if (l.kind === 'table') {
        tableName = l.name;
        table = t.get(tableName) ?? null;
        if (!table) return void (refused = err(n, `can't initialize ${this.prefix}-restore table \`${tableName}': Table does not exist`));
        if (!noflush) for (const c of [...table.keys()]) if (!BUILTIN_CHAINS[tableName].includes(c)) table.delete(c);
        return;
      }
      const tbl = table as Map<string, string[]> | null;
      if (!tbl) return void (refused = err(n, 'no table'));
      if (l.kind === 'commit') {
        // The kernel checks every jump when the table is committed.
        for (const rules of tbl.values()) {
          for (const r of rules) {
            const target = jumpTarget(r);
            if (target && !TARGETS.has(target) && !tbl.has(target)) return void (refused = err(n, `Chain '${target}' does not exist`));
          }
        }
        table = null;
        return;
      }
      if (l.kind === 'chain') {
        // declaring a chain creates it, or flushes it when it exists
        tbl.set(l.name, []);
        return;
      }
      const why = this.chainOp(tableName, tbl, l.line);
      if (why) refused = err(n, why);
    });
    if (refused) return refused;
    if (inject !== null && inject <= payload.split('\n').length) return injected();
    this.tables = t;
    return ok();
  }

  /**
   * One -N/-A/-I/-D/-F/-X line of a restore applied to `tbl` (the batch's copy of the table);
   * returns the message iptables-restore gives when it refuses the line, or null.
   */
  private chainOp(tableName: string, tbl: Map<string, string[]>, line: string): string | null {
    const m = /^(-[AIDXNF])\s+(\S+)\s*(.*)$/.exec(line);
    if (!m) return `unknown line ${line}`;
    const [, op, chain, rest] = m;
    const rules = tbl.get(chain);
    if (op === '-N') {
      if (rules) return `Chain '${chain}' already exists`;
      tbl.set(chain, []);
      return null;
    }
    if (!rules) return `Chain '${chain}' does not exist`;
    if (op === '-A' || op === '-I') {
      let spec = rest;
      let pos = 1;
      if (op === '-I') {
        const p = /^(\d+)\s+(.*)$/.exec(rest);
        if (p) [pos, spec] = [Number(p[1]), p[2]];
      }
      const why = this.refusal(tableName, tbl, spec);
      if (why) return why;
      // as iptables: a position from 1 to one past the last rule
      if (op === '-I' && (pos < 1 || pos > rules.length + 1)) return 'Index of insertion too big';
      if (op === '-A') rules.push(spec);
      else rules.splice(pos - 1, 0, spec);
    } else if (op === '-D' && /^\d+$/.test(rest)) {
      // by position
      const pos = Number(rest);
      if (pos < 1 || pos > rules.length) return 'Index of deletion too big';
      rules.splice(pos - 1, 1);
    } else if (op === '-D') {
      const i = rules.findIndex((r) => canonicalRule(r) === canonicalRule(rest));
      if (i < 0) return 'Bad rule (does a matching rule exist in that chain?)';
      rules.splice(i, 1);
    } else if (op === '-F') {
      rules.length = 0;
    } else if (op === '-X') {
      if (this.referenced(tbl, chain)) return `Chain '${chain}' is still referenced`;
      tbl.delete(chain);
    }
    return null;
  }

  private iptables(a: string[]): RunResult {
    let tableName = 'filter';
    if (a[0] === '-t') {
      tableName = a[1];
      a = a.slice(2);
    }
    if (a[0] === '--version') return ok(`${this.prefix} v1.8.9 (nf_tables)\n`);
    const table = this.tables.get(tableName);
    if (!table) return fail(`${this.prefix} v1.8.9 (nf_tables): table '${tableName}' does not exist`, 3);
    const [op, chain, ...rest] = a;
    const spec = rest.map(quoteArg).join(' ');
    const rules = table.get(chain);
    const noChain = () => fail(`${this.prefix}: No chain/target/match by that name.`);
    const noRule = () => fail(`${this.prefix}: Bad rule (does a matching rule exist in that chain?).`);
    switch (op) {
      case '-N':
        if (rules) return fail(`${this.prefix}: Chain already exists.`);
        table.set(chain, []);
        return ok();
      case '-S':
        return rules ? ok(`-N ${chain}\n`) : noChain();
      case '-C':
        if (!rules) return noChain();
        return rules.some((r) => canonicalRule(r) === spec) ? ok() : noRule();
      case '-I': {
        if (!rules) return noChain();
        let pos = 1;
        let body = rest;
        if (/^\d+$/.test(rest[0] ?? '')) [pos, body] = [Number(rest[0]), rest.slice(1)];
        const text = body.map(quoteArg).join(' ');
        const why = this.refusal(tableName, table, text);
        if (why) return fail(`${this.prefix} v1.8.9 (nf_tables): ${why}`, 2);
        rules.splice(pos - 1, 0, text);
        return ok();
      }
      case '-D': {
        const i = rules?.findIndex((r) => canonicalRule(r) === spec) ?? -1;
        if (!rules || i < 0) return noRule();
        rules.splice(i, 1);
        return ok();
      }
      case '-F':
        if (!rules) return noChain();
        rules.length = 0;
        return ok();
      case '-X':
        if (!rules) return noChain();
        if (this.referenced(table, chain)) return fail(`${this.prefix}: Too many links.`);
        table.delete(chain);
        return ok();
      default:
        return fail(`op ${op} not modelled`);
    }
  }
}
