// Partial syncs retire what falls out of use in two steps: endpoint chains and affinity sets
// are flushed at once and deleted later (after an idle sync, NftProxier). Tests that compare a
// table between those steps with a fresh full sync's leave out the retired affinity sets, as
// they leave out the flushed chains.
import type { Ruleset } from '../../src/modes/nftables/ruleset.ts';

/** Removes affinity sets no rule of the table names (`@affinity-...`). */
export function dropRetiredAffinitySets(rs: Ruleset): void {
  const used = new Set<string>();
  for (const ch of rs.chains.values()) for (const r of ch.rules) for (const m of r.rule.matchAll(/@(affinity-\S+)/g)) used.add(m[1]);
  for (const name of [...rs.sets.keys()]) if (name.startsWith('affinity-') && !used.has(name)) rs.sets.delete(name);
}
