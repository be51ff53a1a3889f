// Which iptables chains are kproxy's to remove, and the one restore payload that removes
// them. kproxy owns exactly what upstream kube-proxy's CleanupLeftovers removes (it takes
// over a node from kube-proxy and back), never another program's chains: the kubelet's
// KUBE-KUBELET-CANARY, KUBE-FIREWALL and KUBE-MARK-DROP, kube-router's KUBE-ROUTER-*, a
// CNI's chains all stay, whatever their prefix. Pure.
//
// Upstream (pkg/proxy/iptables and pkg/proxy/ipvs, CleanupLeftovers; `kube-proxy --cleanup`
// and a switch to nftables run both, per family):
//   iptables: nat KUBE-SERVICES, KUBE-NODEPORTS, KUBE-POSTROUTING and the KUBE-SVC-, -SVL-,
//             -SEP-, -FW-, -EXT- chains; filter KUBE-SERVICES, KUBE-EXTERNAL-SERVICES,
//             KUBE-FORWARD, KUBE-NODEPORTS; the jumps of its iptablesJumpChains.
//   ipvs:     nat KUBE-SERVICES, KUBE-POSTROUTING, KUBE-NODE-PORT, KUBE-LOAD-BALANCER,
//             KUBE-MARK-MASQ; filter KUBE-FORWARD, KUBE-NODE-PORT, KUBE-PROXY-FIREWALL,
//             KUBE-SOURCE-RANGES-FIREWALL, KUBE-IPVS-FILTER, KUBE-IPVS-OUT-FILTER.
// Deliberate differences, each because the chain can only be kube-proxy's:
//   - the iptables mode's cleanup also takes KUBE-MARK-MASQ and KUBE-PROXY-FIREWALL (upstream's
//     iptables cleanup deletes the jumps to KUBE-PROXY-FIREWALL and leaves both chains for its
//     ipvs cleanup, which always runs with it), so a switch from iptables to ipvs or nftables
//     leaves nothing of the iptables mode;
//   - KUBE-PROXY-CANARY (mangle, nat, filter), which upstream creates and never removes.
// Kept like upstream: KUBE-FIREWALL (filter) and its jumps from INPUT/OUTPUT. kube-proxy only
// duplicates the kubelet's chain (the CVE-2020-8558 anti-martian rule); removing it would
// remove the kubelet's protection too.
import { readSave, type Table } from './save.ts';
import { splitRuleArgs } from './tokenize.ts';

export interface OwnedChains {
  /** chain names owned, per table */
  chains: Partial<Record<Table, readonly string[]>>;
  /** prefixes of owned chain names, per table (the per-service chains) */
  prefixes?: Partial<Record<Table, readonly string[]>>;
}

const CANARY = 'KUBE-PROXY-CANARY';

/** The iptables mode's chains (upstream's iptables CleanupLeftovers, plus the differences above). */
export const IPTABLES_OWNED: OwnedChains = {
  chains: {
    nat: ['KUBE-SERVICES', 'KUBE-NODEPORTS', 'KUBE-POSTROUTING', 'KUBE-MARK-MASQ', CANARY],
    filter: ['KUBE-SERVICES', 'KUBE-EXTERNAL-SERVICES', 'KUBE-FORWARD', 'KUBE-NODEPORTS', 'KUBE-PROXY-FIREWALL', CANARY],
    mangle: [CANARY],
  },
  // the planner's per-service chains (modes/iptables/names.ts isServiceChainName; tested to agree)
  prefixes: { nat: ['KUBE-SVC-', 'KUBE-SVL-', 'KUBE-SEP-', 'KUBE-FW-', 'KUBE-EXT-'] },
};

/** The ipvs mode's chains (upstream's ipvs iptablesCleanupChains). */
export const IPVS_OWNED: OwnedChains = {
  chains: {
    nat: ['KUBE-SERVICES', 'KUBE-POSTROUTING', 'KUBE-NODE-PORT', 'KUBE-LOAD-BALANCER', 'KUBE-MARK-MASQ'],
    filter: ['KUBE-FORWARD', 'KUBE-NODE-PORT', 'KUBE-PROXY-FIREWALL', 'KUBE-SOURCE-RANGES-FIREWALL', 'KUBE-IPVS-FILTER', 'KUBE-IPVS-OUT-FILTER'],
  },
};

/** The chains of several specs. */
export function unionOwned(...specs: OwnedChains[]): OwnedChains {
  const chains: Partial<Record<Table, string[]>> = {};
  const prefixes: Partial<Record<Table, string[]>> = {};
  for (const s of specs) {
    for (const [t, cs] of Object.entries(s.chains) as Array<[Table, string[]]>) chains[t] = [...new Set([...(chains[t] ?? []), ...cs])];
    for (const [t, ps] of Object.entries(s.prefixes ?? {}) as Array<[Table, string[]]>) prefixes[t] = [...new Set([...(prefixes[t] ?? []), ...ps])];
  }
  return { chains, prefixes };
}

/**
 * What the iptables and the ipvs modes' cleanups remove: both lists, as upstream's
 * `--cleanup` and its switch to nftables run both CleanupLeftovers. The two modes share
 * chain names (KUBE-SERVICES, KUBE-POSTROUTING, KUBE-MARK-MASQ, ...) and jump from one's
 * chains into the other's, so neither can tell which of them left a chain; the mode that
 * starts next re-creates what it needs in its first (full) sync.
 */
export const KUBE_PROXY_OWNED: OwnedChains = unionOwned(IPTABLES_OWNED, IPVS_OWNED);

export function isOwnedChain(spec: OwnedChains, table: Table, chain: string): boolean {
  if (spec.chains[table]?.includes(chain)) return true;
  return (spec.prefixes?.[table] ?? []).some((p) => chain.startsWith(p));
}

/** The chain a rule jumps or goes to (`-j X` / `-g X`), if any. */
export function ruleTarget(rest: string): string | undefined {
  const args = splitRuleArgs(rest);
  for (let i = 0; i < args.length - 1; i++) if (args[i] === '-j' || args[i] === '--jump' || args[i] === '-g' || args[i] === '--goto') return args[i + 1];
  return undefined;
}

export interface KeptChain {
  table: Table;
  chain: string;
  /** the chain of another program whose rule (directly or through another kept chain) uses it */
  referencedBy: string;
}

export interface OwnedCleanup {
  /** an iptables-restore --noflush payload ('' when there is nothing of ours) */
  payload: string;
  /** owned chains the payload flushes and deletes, per table */
  removed: Partial<Record<Table, string[]>>;
  /** jump rules deleted from the built-in chains */
  jumps: number;
  /** owned chains another program's chain still jumps to: left in place, contents and all */
  kept: KeptChain[];
}

const TABLES: Table[] = ['mangle', 'nat', 'filter'];

/**
 * From an iptables-save text (every table, or some), the payload that removes our chains:
 * every owned chain is flushed (by declaring it) and deleted, and every rule in a built-in
 * chain (INPUT, FORWARD, PREROUTING, ...) that jumps to one is deleted, whatever its comment
 * (older kube-proxy versions worded them differently). A rule of another program's chain is
 * never touched: an owned chain it jumps to stays whole, with every owned chain that one
 * uses, and is reported in `kept`.
 */
export function ownedCleanup(saved: string, spec: OwnedChains): OwnedCleanup {
  const tables = readSave(saved);
  const out: string[] = [];
  const result: OwnedCleanup = { payload: '', removed: {}, jumps: 0, kept: [] };
  for (const table of TABLES) {
    const t = tables.get(table);
    if (!t) continue;
    const owned = new Set(t.chains.filter((c) => isOwnedChain(spec, table, c)));
    if (!owned.size) continue;
    const builtin = (c: string) => (t.policies.get(c) ?? '-') !== '-';
    const targets = new Map<string, string[]>(); // owned chain → owned chains its rules use
    const keptBy = new Map<string, string>();
    const deletes: string[] = [];
    for (const r of t.rules) {
      if (r.op !== '-A') continue;
      const to = ruleTarget(r.rest);
      if (!to || !owned.has(to)) continue;
      if (owned.has(r.chain)) targets.set(r.chain, [...(targets.get(r.chain) ?? []), to]);
      else if (builtin(r.chain)) deletes.push(`-D ${r.chain} ${r.rest}`);
      else if (!keptBy.has(to)) keptBy.set(to, r.chain);
    }
    // what a kept chain uses must stay too, or its rules would jump nowhere
    const queue = [...keptBy.keys()];
    while (queue.length) {
      const c = queue.shift()!;
      for (const u of targets.get(c) ?? []) {
        if (keptBy.has(u)) continue;
        keptBy.set(u, keptBy.get(c)!);
        queue.push(u);
      }
    }
    const removable = t.chains.filter((c) => owned.has(c) && !keptBy.has(c));
    for (const [chain, by] of keptBy) result.kept.push({ table, chain, referencedBy: by });
    // a jump from a built-in chain to a kept chain stays: the kept chain is still in use
    const jumps = deletes.filter((d) => !keptBy.has(ruleTarget(d.replace(/^-D \S+ /, '')) ?? ''));
    if (!removable.length && !jumps.length) continue;
    result.removed[table] = removable;
    result.jumps += jumps.length;
    out.push(`*${table}`, ...removable.map((c) => `:${c} - [0:0]`), ...jumps, ...removable.map((c) => `-X ${c}`), 'COMMIT');
  }
  result.payload = out.length ? out.join('\n') + '\n' : '';
  return result;
}
