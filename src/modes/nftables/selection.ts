// How a service chain picks one of its endpoint chains. Upstream writes one anonymous
// verdict map per chain, `numgen random mod N vmap { 0 : goto A , 1 : goto B , ... }`, and
// the kernel's cost of creating anonymous maps dominates a cold start at scale: 150 s for
// 10,000 Services here (kubernetes#139513, #139328, #135639). One map shared by all
// service chains (kubernetes PR #140362's idea) is worse in the kernel: every commit that
// adds a goto re-validates the chain graph, walking the whole shared map once per rule that
// references it (O(services × endpoints): 160 s for a one-endpoint change at 10,000).
//
// So kproxy writes iptables' form of the same choice, one rule per endpoint:
//
//     numgen random mod N 0 goto A          (probability 1/N)
//     numgen random mod N-1 0 goto B        (1/(N-1) of the rest: 1/N)
//     ...
//     goto Z                                (the rest: 1/N)
//
// Each endpoint is chosen with probability 1/N, among the same endpoint chains, and there
// is no map at all. A single endpoint is one plain `goto`, no random draw: upstream too
// skips the selection for one endpoint (kubernetes PR #140723, its IPv6-safe rule form from
// #140960), though in upstream's table since 1.36 that is the endpoint's own
// `meta l4proto tcp dnat to IP:PORT` written in the service chain, its endpoint chains being
// kept only for session affinity; kproxy keeps an endpoint chain per endpoint (the hairpin
// masquerade and the DNAT), the shape of the upstream golden text it is compared with. expandSelection() turns such a table back into upstream's shape, which
// is how kproxy's table is compared with upstream's golden text. Pure.
import type { NftChain, NftRule, Ruleset } from './ruleset.ts';

/** The rules choosing uniformly among `chains` (in this order). */
export function selectionRules(chains: string[]): string[] {
  const n = chains.length;
  return chains.map((c, i) => (i < n - 1 ? `numgen random mod ${n - i} 0 goto ${c}` : `goto ${c}`));
}

/** "numgen random mod K 0 goto X" (as written and as `nft list` prints it) → [K, X]. */
const PICK = /^numgen random mod (\d+) (?:== )?0 goto (\S+)$/;
const LAST = /^goto (endpoint-\S+)$/;

export function parsePick(rule: string): { mod: number; chain: string } | null {
  const m = PICK.exec(rule);
  return m ? { mod: Number(m[1]), chain: m[2] } : null;
}

/**
 * The endpoint chains selected by the rules starting at `start` (a run of picks with
 * moduli N, N-1, ..., 2 ending in an unconditional goto to an endpoint chain), and how many
 * rules the run has; null when no selection starts there.
 */
export function selectionAt(rules: NftRule[], start: number): { chains: string[]; length: number } | null {
  const chains: string[] = [];
  let expect: number | null = null;
  for (let i = start; i < rules.length; i++) {
    const pick = parsePick(rules[i].rule);
    if (pick) {
      if (expect !== null && pick.mod !== expect) return null;
      chains.push(pick.chain);
      expect = pick.mod - 1;
      continue;
    }
    const last = LAST.exec(rules[i].rule);
    if (!last || (expect !== null && expect !== 1) || rules[i].comment !== undefined) return null;
    chains.push(last[1]);
    return { chains, length: i - start + 1 };
  }
  return null;
}

/**
 * The same table in upstream's shape: every selection run rewritten as upstream's
 * anonymous-map rule `numgen random mod N vmap { 0 : goto A , ... }`. Two tables that
 * expand to the same text send every packet to the same endpoint chains with the same
 * probabilities.
 */
export function expandSelection(rs: Ruleset): Ruleset {
  const chains = new Map<string, NftChain>();
  for (const [name, ch] of rs.chains) {
    let out: NftRule[] | null = null;
    for (let i = 0; i < ch.rules.length; i++) {
      const sel = selectionAt(ch.rules, i);
      if (!sel) {
        out?.push(ch.rules[i]);
        continue;
      }
      out ??= ch.rules.slice(0, i);
      const entries = sel.chains.map((c, k) => `${k} : goto ${c}`).join(' , ');
      out.push({ rule: `numgen random mod ${sel.chains.length} vmap { ${entries} }` });
      i += sel.length - 1;
    }
    chains.set(name, out ? { ...ch, rules: out } : ch);
  }
  return { ...rs, chains };
}
