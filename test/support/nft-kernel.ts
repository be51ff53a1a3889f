// A table as the kernel holds it, read with `nft -j -s list table` (nft's JSON, without
// counters) and compared with another, without kproxy's own nft code: so a test that proves
// what kproxy wrote rests on the kernel's word, not on kproxy's parser.
import { runChecked, type CommandRunner } from '../../src/kernel/runner.ts';

/** One set or map: its declaration and its elements (key → value; '' for a set's). */
export interface KernelSet {
  decl: string;
  elements: Map<string, string>;
}

export interface KernelChain {
  decl: string;
  rules: string[];
}

export interface KernelTable {
  chains: Map<string, KernelChain>;
  sets: Map<string, KernelSet>;
}

type Json = Record<string, unknown>;

/** Drops what names an object or varies between two equal tables (handles, expiry times). */
function stable(o: Json, drop: string[]): string {
  const out: Json = {};
  for (const k of Object.keys(o).sort()) if (!drop.includes(k)) out[k] = o[k];
  return JSON.stringify(out);
}

/** An element's key without the time it has left (a timed set's element is `{elem: {val, timeout, expires}}`). */
function elementKey(k: unknown): string {
  const e = (k as { elem?: Json } | null)?.elem;
  return JSON.stringify(e && typeof e === 'object' ? { val: e.val, timeout: e.timeout } : k);
}

/** The table in nft's JSON listing (`nft -j list table ...`). */
export function tableFromJson(text: string): KernelTable {
  const items = (JSON.parse(text) as { nftables: Json[] }).nftables;
  const t: KernelTable = { chains: new Map(), sets: new Map() };
  const chain = (name: string) => t.chains.get(name) ?? t.chains.set(name, { decl: '', rules: [] }).get(name)!;
  for (const item of items) {
    if (item.chain) {
      const c = item.chain as Json;
      chain(String(c.name)).decl = stable(c, ['family', 'table', 'name', 'handle']);
    } else if (item.rule) {
      const r = item.rule as Json;
      chain(String(r.chain)).rules.push(stable(r, ['family', 'table', 'chain', 'handle']));
    } else if (item.set || item.map) {
      const s = (item.set ?? item.map) as Json;
      const elements = new Map<string, string>();
      for (const e of (s.elem as unknown[] | undefined) ?? []) {
        if (item.map) elements.set(elementKey((e as unknown[])[0]), JSON.stringify((e as unknown[])[1]));
        else elements.set(elementKey(e), '');
      }
      t.sets.set(String(s.name), { decl: (item.map ? 'map ' : 'set ') + stable(s, ['family', 'table', 'name', 'handle', 'elem']), elements });
    }
  }
  return t;
}

/** Reads table `family name` through `runner` (a namespace's nft). */
export async function readTable(runner: CommandRunner, family: 'ip' | 'ip6', name = 'kube-proxy'): Promise<KernelTable> {
  const r = await runChecked(runner, 'nft', ['-j', '-s', 'list', 'table', family, name], { timeoutMs: 20_000 });
  return tableFromJson(r.stdout);
}

/** The chain a verdict map's value goes to (`goto`/`jump`), if any. */
export function verdictTarget(value: string): string | undefined {
  const v = value ? (JSON.parse(value) as { goto?: { target?: string }; jump?: { target?: string } }) : {};
  return v.goto?.target ?? v.jump?.target;
}

/** What `a` holds beyond `b`, and everything else in which they differ. */
export interface TableDiff {
  /** in b and not in a, or in both but different: a chain, a rule list, a declaration, an element's value */
  differences: string[];
  /** chains only in a */
  extraChains: string[];
  /** sets and maps only in a */
  extraSets: string[];
  /** elements only in a, per set present in both: key → value */
  extraElements: Map<string, Map<string, string>>;
}

export function diffTables(a: KernelTable, b: KernelTable): TableDiff {
  const d: TableDiff = { differences: [], extraChains: [], extraSets: [], extraElements: new Map() };
  for (const [name, cb] of b.chains) {
    const ca = a.chains.get(name);
    if (!ca) d.differences.push(`chain ${name} missing`);
    else if (ca.decl !== cb.decl) d.differences.push(`chain ${name}: declared ${ca.decl}, want ${cb.decl}`);
    else if (JSON.stringify(ca.rules) !== JSON.stringify(cb.rules)) d.differences.push(`chain ${name}: rules ${JSON.stringify(ca.rules)}, want ${JSON.stringify(cb.rules)}`);
  }
  for (const name of a.chains.keys()) if (!b.chains.has(name)) d.extraChains.push(name);
  for (const [name, sb] of b.sets) {
    const sa = a.sets.get(name);
    if (!sa) {
      d.differences.push(`set ${name} missing`);
      continue;
    }
    if (sa.decl !== sb.decl) d.differences.push(`set ${name}: declared ${sa.decl}, want ${sb.decl}`);
    for (const [k, v] of sb.elements) {
      if (!sa.elements.has(k)) d.differences.push(`set ${name}: element ${k} missing`);
      else if (sa.elements.get(k) !== v) d.differences.push(`set ${name}: element ${k} is ${sa.elements.get(k)}, want ${v}`);
    }
    const extra = new Map([...sa.elements].filter(([k]) => !sb.elements.has(k)));
    if (extra.size) d.extraElements.set(name, extra);
  }
  for (const name of a.sets.keys()) if (!b.sets.has(name)) d.extraSets.push(name);
  return d;
}
