// A stateful fake of the kernel's iptables tables behind a CommandRunner: iptables-save,
// iptables-restore (--noflush, atomic, rejects what the kernel rejects: appending to or
// jumping to a missing chain, deleting a chain that is missing or still referenced) and
// the iptables -N/-C/-I/-D/-S/-F/-X calls the proxier makes. One instance per family.
import type { CommandRunner, RunOptions, RunResult } from '../../src/exec/runner.ts';

const BUILTIN: Record<string, string[]> = {
  filter: ['INPUT', 'FORWARD', 'OUTPUT'],
  nat: ['PREROUTING', 'INPUT', 'OUTPUT', 'POSTROUTING'],
  mangle: ['PREROUTING', 'INPUT', 'FORWARD', 'OUTPUT', 'POSTROUTING'],
};
const TARGETS = new Set(['ACCEPT', 'DROP', 'REJECT', 'RETURN', 'DNAT', 'SNAT', 'MASQUERADE', 'MARK', 'LOG']);

type Tables = Map<string, Map<string, string[]>>;

function fresh(): Tables {
  const t: Tables = new Map();
  for (const [name, chains] of Object.entries(BUILTIN)) t.set(name, new Map(chains.map((c) => [c, []])));
  return t;
}

function clone(t: Tables): Tables {
  return new Map([...t].map(([n, chains]) => [n, new Map([...chains].map(([c, r]) => [c, [...r]]))]));
}

const ok = (stdout = ''): RunResult => ({ code: 0, stdout, stderr: '' });
const fail = (stderr: string, code = 1): RunResult => ({ code, stdout: '', stderr });

export class FakeKernel implements CommandRunner {
  tables: Tables = fresh();
  readonly calls: Array<{ cmd: string; args: string[]; input?: string }> = [];
  /** when set, the next restore fails at this payload line */
  failNextRestoreAtLine: number | null = null;

  constructor(readonly family: 4 | 6 = 4) {}

  private get prefix(): string {
    return this.family === 6 ? 'ip6tables' : 'iptables';
  }

  async run(cmd: string, args: string[], opts: RunOptions = {}): Promise<RunResult> {
    this.calls.push({ cmd, args, input: opts.input });
    const a = args.filter((x, i) => !(x === '-w' || args[i - 1] === '-w'));
    if (cmd === `${this.prefix}-restore`) return this.restore(opts.input ?? '', a.includes('--noflush'));
    if (cmd === `${this.prefix}-save`) return ok(this.save(a[0] === '-t' ? a[1] : undefined));
    if (cmd === this.prefix) return this.iptables(a);
    if (cmd === 'sysctl') return ok('0\n');
    return fail(`${cmd}: not modelled`, 127);
  }

  save(only?: string): string {
    const out: string[] = [];
    for (const [name, chains] of this.tables) {
      if (only && name !== only) continue;
      out.push(`*${name}`);
      for (const c of chains.keys()) out.push(`:${c} ${BUILTIN[name].includes(c) ? 'ACCEPT' : '-'} [0:0]`);
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

  private restore(payload: string, noflush: boolean): RunResult {
    const t = clone(this.tables);
    const lines = payload.split('\n');
    let table: Map<string, string[]> | null = null;
    let tableName = '';
    const err = (n: number, why: string) => fail(`${this.prefix}-restore v1.8.9 (nf_tables): ${why}\nError occurred at line: ${n}\n`, 2);
    for (let i = 0; i < lines.length; i++) {
      const n = i + 1;
      const line = lines[i].trim();
      if (this.failNextRestoreAtLine === n) {
        this.failNextRestoreAtLine = null;
        // As the kernel refuses a batch it cannot take now (not a fault of the line's Service).
        return err(n, 'injected failure: Resource temporarily unavailable');
      }
      if (!line || line.startsWith('#')) continue;
      if (line.startsWith('*')) {
        tableName = line.slice(1);
        table = t.get(tableName) ?? null;
        if (!table) return err(n, `unknown table ${tableName}`);
        if (!noflush) for (const c of [...table.keys()]) if (!BUILTIN[tableName].includes(c)) table.delete(c);
        continue;
      }
      if (!table) return err(n, 'no table');
      if (line === 'COMMIT') {
        // The kernel checks every jump when the table is committed.
        for (const rules of table.values()) {
          for (const r of rules) {
            const m = / -j (\S+)|^-j (\S+)/.exec(r);
            const target = m?.[1] ?? m?.[2];
            if (target && !TARGETS.has(target) && !table.has(target)) return err(n, `Chain '${target}' does not exist`);
          }
        }
        table = null;
        continue;
      }
      if (line.startsWith(':')) {
        table.set(line.slice(1).split(' ')[0], []);
      } else if (line.startsWith('-A ')) {
        const [, chain, ...rest] = line.split(' ');
        const rules = table.get(chain);
        if (!rules) return err(n, `Chain '${chain}' does not exist`);
        const target = /(?:^| )-j (\S+)/.exec(rest.join(' '))?.[1];
        if (target && !TARGETS.has(target) && !table.has(target)) return err(n, `Chain '${target}' does not exist`);
        rules.push(rest.join(' '));
      } else if (line.startsWith('-I ')) {
        // `-I chain [n] rule`: inserted at position n (1 when absent), as iptables -I.
        const [, chain, ...rest] = line.split(' ');
        const rules = table.get(chain);
        if (!rules) return err(n, `Chain '${chain}' does not exist`);
        const pos = /^\d+$/.test(rest[0] ?? '') ? Number(rest.shift()) : 1;
        const target = /(?:^| )-j (\S+)/.exec(rest.join(' '))?.[1];
        if (target && !TARGETS.has(target) && !table.has(target)) return err(n, `Chain '${target}' does not exist`);
        rules.splice(pos - 1, 0, rest.join(' '));
      } else if (line.startsWith('-X ')) {
        const chain = line.split(' ')[1];
        if (!table.has(chain)) return err(n, `Chain '${chain}' does not exist`);
        for (const rules of table.values()) {
          if (rules.some((r) => r.endsWith(`-j ${chain}`) || r.includes(`-j ${chain} `))) return err(n, `Chain '${chain}' is still referenced`);
        }
        table.delete(chain);
      } else {
        return err(n, `unknown line ${line}`);
      }
    }
    this.tables = t;
    return ok();
  }

  private iptables(a: string[]): RunResult {
    let tableName = 'filter';
    if (a[0] === '-t') {
      tableName = a[1];
      a = a.slice(2);
    }
    if (a[0] === '--version') return ok('iptables v1.8.9 (nf_tables)\n');
    const table = this.tables.get(tableName);
    if (!table) return fail(`table ${tableName} does not exist`);
    const [op, chain, ...rest] = a;
    const spec = rest.map((x) => (/\s/.test(x) ? `"${x}"` : x)).join(' ');
    const rules = table.get(chain);
    switch (op) {
      case '-N':
        if (rules) return fail('iptables: Chain already exists.');
        table.set(chain, []);
        return ok();
      case '-S':
        return rules ? ok(`-N ${chain}\n`) : fail(`iptables: No chain/target/match by that name.`);
      case '-C':
        return rules?.includes(spec) ? ok() : fail('iptables: Bad rule (does a matching rule exist in that chain?).');
      case '-I': {
        if (!rules) return fail('iptables: No chain/target/match by that name.');
        const target = /(?:^| )-j (\S+)/.exec(spec)?.[1];
        if (target && !TARGETS.has(target) && !table.has(target)) return fail(`iptables: Chain '${target}' does not exist`);
        rules.unshift(spec);
        return ok();
      }
      case '-D': {
        const i = rules?.indexOf(spec) ?? -1;
        if (!rules || i < 0) return fail('iptables: Bad rule (does a matching rule exist in that chain?).');
        rules.splice(i, 1);
        return ok();
      }
      case '-F':
        if (!rules) return fail('no chain');
        rules.length = 0;
        return ok();
      default:
        return fail(`op ${op} not modelled`);
    }
  }

  /** What an admin's `iptables -F; iptables -X` on every table would do. */
  flushAll(): void {
    this.tables = fresh();
  }
}
