// The live trace reads only the chains its walk reaches. On the nf_tables backend
// `iptables -S CHAIN` asks the kernel for one chain (at 10,000 Services: about 20 ms for a
// Service's chain, 0.2 s for KUBE-SERVICES), where iptables-save reads every rule (2.4 s).
// Legacy iptables reads the whole table for every -S, so there one iptables-save is read
// and only the chains the walk reaches are parsed out of it (save.ts indexSaveChains).
// The walk runs over the chains read so far; the targets it met that are not read yet are
// read together, and it walks again, until it meets none. The last walk met only chains it
// had read, each as the kernel holds it, so it is the walk over the whole ruleset.
import { parseIptablesSave, type Ruleset, type Table } from '../../kernel/iptables/parse.ts';
import { FILTER_CHAINS, MARK_MASQ_CHAIN, MAX_DEPTH, traceIptables, type IptablesTraceResult, type TraceOptions, type TracePacket } from './trace.ts';

/**
 * What every walk looks at before it jumps anywhere: the entry chains and the masquerade
 * mark's chain; and KUBE-NODEPORTS, which KUBE-SERVICES's last rule jumps to for the node's
 * own addresses, read at once rather than one round later (it is as long as KUBE-SERVICES).
 */
const FIRST_READ: Array<[string, string]> = [
  ['nat', 'PREROUTING'],
  ['nat', 'KUBE-SERVICES'],
  ['nat', 'KUBE-NODEPORTS'],
  ['nat', MARK_MASQ_CHAIN],
  ...FILTER_CHAINS.map((c): [string, string] => ['filter', c]),
];

/** One chain's lines (`iptables -S CHAIN` or iptables-save's), or null when there is no such chain. */
export type ChainReader = (table: 'nat' | 'filter', chain: string) => Promise<string | null> | string | null;

/** The trace over the chains the walk reaches, read with `read`. */
export async function traceLiveChains(read: ChainReader, pkt: TracePacket, opts: TraceOptions): Promise<IptablesTraceResult> {
  const rs: Ruleset = { tables: new Map(), warnings: [] };
  const tried = new Set<string>();
  const readAll = (todo: Array<[string, string]>) =>
    Promise.all(
      todo.map(async ([table, chain]) => {
        tried.add(`${table}/${chain}`);
        const text = await read(table as 'nat' | 'filter', chain);
        if (text !== null) addChain(rs, parseIptablesSave(`*${table}\n${text}COMMIT\n`));
      }),
    );
  await readAll(FIRST_READ);
  // Each walk reaches at least one chain deeper than the last; a walk deeper than MAX_DEPTH stops anyway.
  for (let round = 0; round <= MAX_DEPTH + 1; round++) {
    const unread = new Map<string, [string, string]>();
    const r = traceIptables(rs, pkt, {
      ...opts,
      onUnknownTarget: (table, name) => {
        const key = `${table}/${name}`;
        if (!tried.has(key)) unread.set(key, [table, name]);
      },
    });
    if (unread.size === 0) return r;
    await readAll([...unread.values()]);
  }
  return traceIptables(rs, pkt, opts);
}

/** Adds the chains (and parse warnings) of one chain's listing to the ruleset read so far. */
function addChain(rs: Ruleset, one: Ruleset): void {
  rs.warnings.push(...one.warnings);
  for (const [name, t] of one.tables) {
    const into: Table = rs.tables.get(name) ?? { name, chains: new Map(), deleted: [] };
    rs.tables.set(name, into);
    for (const [c, chain] of t.chains) into.chains.set(c, chain);
  }
}
