// Partial syncs retire what falls out of use in two steps: endpoint chains and affinity sets
// are flushed at once and deleted later (after an idle sync, NftProxier). Tests that compare a
// table between those steps with a fresh full sync's leave out the retired affinity sets, as
// they leave out the flushed chains.
import { elementKey, type NftElement, type Ruleset } from '../../src/modes/nftables/ruleset.ts';

/** Removes affinity sets no rule of the table names (`@affinity-...`). */
export function dropRetiredAffinitySets(rs: Ruleset): void {
  const used = new Set<string>();
  for (const ch of rs.chains.values()) for (const r of ch.rules) for (const m of r.rule.matchAll(/@(affinity-\S+)/g)) used.add(m[1]);
  for (const name of [...rs.sets.keys()]) if (name.startsWith('affinity-') && !used.has(name)) rs.sets.delete(name);
}

/**
 * Partial syncs also leave removed elements in the kernel when they are harmless
 * (NftProxier.lingeringElements(): a ClusterIP in cluster-ips, or a jump into a chain that is
 * flushed), and delete them later with the retired chains. Removes exactly those from a table
 * read back from the kernel, after checking each is there and harmless; returns what was
 * wrong (empty when all is well), for the test's assertion.
 */
export function dropLingering(rs: Ruleset, lingering: Array<{ set: string; el: NftElement }>): string[] {
  const problems: string[] = [];
  for (const { set, el } of lingering) {
    const k = elementKey(el.key);
    const s = rs.sets.get(set);
    if (!s?.elements.has(k)) {
      problems.push(`lingering ${set} { ${k} } is not in the kernel`);
      continue;
    }
    const target = /^(?:goto|jump) (\S+)$/.exec(el.value ?? '')?.[1];
    if (set !== 'cluster-ips' && (target === undefined || (rs.chains.get(target)?.rules.length ?? 0) > 0)) {
      problems.push(`lingering ${set} { ${k} : ${el.value} } does not jump to an empty chain`);
    }
    s.elements.delete(k);
  }
  return problems;
}
