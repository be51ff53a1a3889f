// Comparing kproxy's chains in a namespace's kernel with another namespace's (the kernel tests).
import type { Netns } from '../support/netns.ts';

/**
 * kproxy's chains (KUBE-*) of nat and filter and the built-in chains' jumps into them: each
 * chain's rules in kernel order, chains sorted by name (the order chains were created in
 * differs, their content may not).
 */
export function kproxyChains(ns: Netns, family: 4 | 6, legacy = false): string {
  const tool = (b: string) => (legacy ? b.replace(/^(ip6?tables)/, '$1-legacy') : b);
  const save = family === 6 ? 'ip6tables-save' : 'iptables-save';
  const out: string[] = [];
  for (const table of ['nat', 'filter']) {
    const chains = new Map<string, string[]>();
    for (const l of ns.exec(tool(save), ['-t', table]).split('\n')) {
      const decl = /^:(KUBE-\S+) /.exec(l);
      if (decl) chains.set(decl[1], chains.get(decl[1]) ?? []);
      const rule = /^-A (KUBE-\S+|[A-Z]+ .*-j KUBE-\S+$)/.exec(l);
      const chain = rule && l.split(' ')[1];
      if (chain) chains.set(chain, [...(chains.get(chain) ?? []), l]);
    }
    for (const [name, rules] of [...chains].sort(([a], [b]) => (a < b ? -1 : 1))) out.push(`${table} ${name}`, ...rules.map((r) => `  ${r}`));
  }
  return out.join('\n');
}

