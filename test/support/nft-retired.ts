// The kernel's nftables table as the tests compare it, read from `nft -j list table` (nft's
// own JSON, not kproxy's parser), and what partial syncs leave in it for later. Partial syncs
// retire what falls out of use in two steps: endpoint chains and affinity sets are flushed at
// once and deleted later (after an idle sync, NftProxier), and removed elements that are
// harmless stay until then. Tests that compare a table between those steps with a fresh full
// sync's leave those out.
import { runChecked, type CommandRunner } from '../../src/kernel/runner.ts';
import { elementKey, type NftElement } from '../../src/modes/nftables/ruleset.ts';

/** One table from the kernel: chains (declaration and rules) and sets (declaration and elements), each as JSON text. */
export interface KernelTable {
  chains: Map<string, { decl: string; rules: string[] }>;
  sets: Map<string, { decl: string; elements: Map<string, string> }>;
}

type Json = Record<string, unknown>;

/** An element key as kproxy writes it: a concatenation's parts joined by " . ". */
function keyText(v: unknown): string {
  const val = (v as Json)?.elem ? ((v as Json).elem as Json).val : v;
  const c = (val as Json)?.concat;
  if (Array.isArray(c)) return c.map((p) => (typeof p === 'object' ? JSON.stringify(p) : String(p))).join(' . ');
  return typeof val === 'object' ? JSON.stringify(val) : String(val);
}

/** `nft -j list table FAMILY NAME` through `runner`. */
export async function kernelTable(runner: CommandRunner, family: string, name: string): Promise<KernelTable> {
  const r = await runChecked(runner, 'nft', ['-j', 'list', 'table', family, name], { timeoutMs: 30_000 });
  const out: KernelTable = { chains: new Map(), sets: new Map() };
  for (const item of (JSON.parse(r.stdout) as { nftables: Json[] }).nftables) {
    if (item.chain) {
      const { handle: _h, ...decl } = item.chain as Json;
      out.chains.set(decl.name as string, { decl: JSON.stringify(decl), rules: [] });
    } else if (item.rule) {
      const { handle: _h, ...rule } = item.rule as Json;
      out.chains.get(rule.chain as string)!.rules.push(JSON.stringify(rule));
    } else if (item.set || item.map) {
      const { handle: _h, elem, ...decl } = (item.set ?? item.map) as Json;
      const elements = new Map<string, string>();
      for (const e of (elem as unknown[] | undefined) ?? []) {
        const [k, v] = Array.isArray(e) ? e : [e, undefined];
        elements.set(keyText(k), JSON.stringify([k, v]));
      }
      out.sets.set(decl.name as string, { decl: JSON.stringify({ kind: item.set ? 'set' : 'map', ...decl }), elements });
    }
  }
  return out;
}

/** Every object of the table as one line, sorted (rules in their chain's order). */
export function tableLines(t: KernelTable): string[] {
  const lines: string[] = [];
  for (const [name, ch] of t.chains) {
    lines.push(`chain ${ch.decl}`);
    ch.rules.forEach((r, i) => lines.push(`rule ${name} ${i} ${r}`));
  }
  for (const [name, s] of t.sets) {
    lines.push(`set ${s.decl}`);
    for (const e of s.elements.values()) lines.push(`element ${name} ${e}`);
  }
  return lines.sort();
}

/** Removes the chains a partial sync flushed (a Service's, named with a '/', now empty). */
export function dropFlushedChains(t: KernelTable): void {
  for (const [name, ch] of t.chains) if (name.includes('/') && ch.rules.length === 0) t.chains.delete(name);
}

/** Removes affinity sets no rule of the table names (`@affinity-...`). */
export function dropRetiredAffinitySets(t: KernelTable): void {
  const used = new Set<string>();
  for (const ch of t.chains.values()) for (const r of ch.rules) for (const m of r.matchAll(/"@(affinity-[^"]+)"/g)) used.add(m[1]);
  for (const name of [...t.sets.keys()]) if (name.startsWith('affinity-') && !used.has(name)) t.sets.delete(name);
}

/**
 * Partial syncs also leave removed elements in the kernel when they are harmless
 * (NftProxier.lingeringElements(): a ClusterIP in cluster-ips, or a jump into a chain that is
 * flushed), and delete them later with the retired chains. Removes exactly those from the
 * kernel's table, after checking each is there and harmless; returns what was wrong (empty
 * when all is well), for the test's assertion.
 */
export function dropLingering(t: KernelTable, lingering: Array<{ set: string; el: NftElement }>): string[] {
  const problems: string[] = [];
  for (const { set, el } of lingering) {
    const k = elementKey(el.key);
    const s = t.sets.get(set);
    if (!s?.elements.has(k)) {
      problems.push(`lingering ${set} { ${k} } is not in the kernel`);
      continue;
    }
    const target = /^(?:goto|jump) (\S+)$/.exec(el.value ?? '')?.[1];
    if (set !== 'cluster-ips' && (target === undefined || (t.chains.get(target)?.rules.length ?? 0) > 0)) {
      problems.push(`lingering ${set} { ${k} : ${el.value} } does not jump to an empty chain`);
    }
    s.elements.delete(k);
  }
  return problems;
}

/** Every table of the kernel (`nft -j list tables`), "family name" → tableLines. */
export async function kernelTables(runner: CommandRunner): Promise<Map<string, string[]>> {
  const r = await runChecked(runner, 'nft', ['-j', 'list', 'tables'], { timeoutMs: 30_000 });
  const out = new Map<string, string[]>();
  for (const item of (JSON.parse(r.stdout) as { nftables: Json[] }).nftables) {
    const t = item.table as { family: string; name: string } | undefined;
    if (t) out.set(`${t.family} ${t.name}`, tableLines(await kernelTable(runner, t.family, t.name)));
  }
  return out;
}
