// nftables mode: one private `kube-proxy` table per IP family (from 1,000 Services the
// Services spread over `kube-proxy-<n>` tables, shards.ts), written as one `nft -f`
// transaction per sync. Planner (plan.ts), text (ruleset.ts), tracer (trace.ts) are pure;
// the proxier (proxier.ts) applies through the nft executor (src/kernel/nft/exec.ts); TCP
// NodePorts on 127.0.0.1 / ::1 are served by userspace listeners beside it when
// --nodeport-addresses names the loopback address (localhost-nodeports.ts, KEP-6032).
import type { ConformanceAdapter } from '../../conformance/case.ts';
import { type CommandRunner, ExecError } from '../../kernel/runner.ts';
import { NftExecutor, type NftObjectRef } from '../../kernel/nft/exec.ts';
import { Links } from '../../kernel/links.ts';
import type { Logger } from '../../log.ts';
import type { ModeDeps, ModeModule, Proxier } from '../types.ts';
import type { TraceRequest, TraceResult } from '../trace-types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import { nftablesConformance } from './conformance.ts';
import { kubeProxyTableNames, TABLE } from './names.ts';
import { BASE_CHAINS, C, optionsFromInput, UNALLOCATED_CHAINS } from './plan.ts';
import { NftProxier } from './proxier.ts';
import { NftWithLocalhostNodePorts } from './localhost-nodeports.ts';
import { dumpRuleset, dumpRulesetParts, elementKey, newRuleset, type NftElement, type NftSet, type Ruleset } from './ruleset.ts';
import { traceTables, type ExactIndexes } from './trace.ts';
import { parseNftText } from './parse.ts';
import { eachShardedRuleset, planShardedRulesets, type ShardOptions } from './shards.ts';
import { skippedVIPNotes } from '../../core/vip.ts';
import { kproxyError } from '../../errors.ts';

export { planRuleset, optionsFromInput } from './plan.ts';
export { traceNft, traceRuleset } from './trace.ts';
export { dumpRuleset } from './ruleset.ts';
export { sortNftTransaction } from './conformance.ts';
export { runShardedCase } from './conformance-sharded.ts';

/** The table as it would be applied for this state (knftables dump form; valid `nft -f` input). */
function render(input: PlanInput): string {
  return [...renderParts(input)].join('');
}

/** render's text a table at a time: from 1,000 Services the mode writes several tables (shards.ts), all of them, in order. */
function* renderParts(input: PlanInput): Generator<string> {
  for (const r of eachShardedRuleset(input.state, optionsFromInput(input), { tables: input.config.nftables?.tables })) yield* dumpRulesetParts(r);
}

async function createProxier(deps: ModeDeps): Promise<Proxier> {
  // Fails with KPROXY_EXEC_MISSING when nft is not installed.
  await new NftExecutor(deps.runner).version();
  // One proxier per family: the IPv6 one writes the `ip6 kube-proxy` table. A kernel without
  // nf_tables for IPv6 refuses even a checked (not committed) creation of it.
  if (deps.family === 6) {
    const r = await deps.runner.run('nft', ['-c', '-f', '-'], { input: `add table ip6 ${TABLE}\n`, timeoutMs: 30_000 });
    if (r.code !== 0) {
      throw new ExecError('KPROXY_EXEC_FAILED', `nft cannot create the ip6 ${TABLE} table: ${r.stderr.trim()}; load nf_tables with IPv6 support (or disable IPv6)`, r);
    }
  }
  // K = 1 (upstream's single `kube-proxy` table) below 1,000 Services; several above (shards.ts chooseTables).
  const nft = new NftProxier({ runner: deps.runner, log: deps.log, shards: { tables: deps.config.nftables?.tables } });
  // Beside the ruleset, the userspace listeners of localhost NodePorts (localhost-nodeports.ts):
  // each sync's view says whether there are any (NodeSettings.localhostNodePortProxy).
  return new NftWithLocalhostNodePorts(nft, { config: deps.config, log: deps.log, family: deps.family ?? 4 });
}

/** Removes every kube-proxy table of ip and ip6: `kube-proxy` and the shards' `kube-proxy-<n>` (names.ts isKubeProxyTable), nothing else. */
async function cleanup(runner: CommandRunner, log: Logger): Promise<void> {
  const exec = new NftExecutor(runner);
  for (const family of ['ip', 'ip6'] as const) {
    try {
      // probed by name, not listed: `nft list tables` reads every table whole first (nft.ts)
      const tables = await exec.existingTables(family, kubeProxyTableNames());
      if (tables.length === 0) continue;
      // one transaction: every kube-proxy table of the family goes, or none
      await exec.apply(tables.map((t) => `delete table ${family} ${t}\n`).join(''));
      for (const table of tables) log.info({ family, table }, `deleted nftables table ${table}`);
    } catch (e) {
      const code = (e as { code?: string }).code;
      // No nft at all means nothing of ours can be there.
      if (code === 'KPROXY_EXEC_MISSING') return;
      throw e;
    }
  }
}

/**
 * The base chains at the hooks the tracer walks (prerouting, forward, input): the ones the
 * mode writes (plan.ts BASE_CHAINS, and the sharded tables' UNALLOCATED_CHAINS), which are
 * upstream's names; a live trace reads them by name, since listing a table's chains reads
 * the whole table (nft 1.0.6).
 */
const LIVE_BASE_CHAINS = [...BASE_CHAINS, ...UNALLOCATED_CHAINS].filter((c) => c.hook === 'prerouting' || c.hook === 'forward' || c.hook === 'input').map((c) => c.name);
/** upstream's filter prerouting chain before v1.31, read where filter-prerouting-pre-dnat is not */
const LIVE_OLD_FILTER_PREROUTING = 'filter-prerouting';
/**
 * Read with the base chains, in every table, before the walk asks for them: what the base
 * chains of every table lead any packet to (the firewall check and the Service dispatch of
 * prerouting, the checks of a forwarded packet), upstream's names (plan.ts C). Each would
 * otherwise be one more read: at 10,000 Services a NodePort's walk reads in three reads what
 * it read in nine. A name a table does not hold is not found (nft reports it, listObjects
 * leaves it out); the walk treats it as it treats any object it asked for and did not get.
 */
const LIVE_FIRST_CHAINS = [C.firewallCheck, C.services, C.serviceEndpointsCheck, C.clusterIPsCheck];
const LIVE_FIRST_SETS: Array<[kind: 'set' | 'map', name: string]> = [
  ['map', C.firewallIPs],
  ['map', C.serviceIPs],
  ['set', C.nodePortIPs],
  ['map', C.serviceNodePorts],
  ['map', C.noEndpointServices],
  ['set', C.clusterIPs],
];
/** Reads of a live trace at most: each is one step deeper in the walk (about three for a NodePort). */
const LIVE_READS_MAX = 16;
/** Chains (or sets and maps) of one read from which on they are listed by two nft processes, half the tables each. */
const LIVE_SPLIT = 16;
/** the layer 4 protocols a Service uses, as `nft -p` prints them */
const PROTOCOL_NAMES: Record<string, string> = { '6': 'tcp', '17': 'udp', '132': 'sctp' };

/**
 * The key parts of a set read with `nft -p` as nft prints them otherwise: a protocol number
 * of an `inet_proto` part as its name (tcp, udp, sctp: what the walk looks up; another protocol
 * stays a number, and matches no packet the tracer walks either way).
 */
function protocolNames(set: NftSet): void {
  const parts = set.type.split(' : ')[0].split(' . ');
  const at = parts.flatMap((p, i) => (p.trim() === 'inet_proto' ? [i] : []));
  if (!at.length) return;
  const elements = new Map<string, NftElement>();
  for (const el of set.elements.values()) {
    for (const i of at) if (el.key[i] !== undefined) el.key[i] = PROTOCOL_NAMES[el.key[i]] ?? el.key[i];
    elements.set(elementKey(el.key), el);
  }
  set.elements = elements;
}

/**
 * One read of objects: the chains by one `nft -i`, the sets and maps by another beside it,
 * with numeric protocols (listObjects); from LIVE_SPLIT of a kind, that kind by two, half the
 * tables each: each `list chain` costs nft some milliseconds of CPU, as it fetches the elements
 * of every set of the chain's table, and the sets and maps of 10,000 Services are 1.7 MB of
 * text, so on two cores the read takes half the time. Each answer is parsed as it comes and
 * handed to `take`, a table's objects of a kind all in one answer, in the order asked.
 */
async function readObjects(exec: NftExecutor, family: 'ip' | 'ip6', objects: NftObjectRef[], take: (rs: Ruleset) => void): Promise<void> {
  const chains = objects.filter((o) => o.kind === 'chain');
  const sets = objects.filter((o) => o.kind !== 'chain');
  const parts: Array<Promise<void>> = [];
  const read = (some: NftObjectRef[], numeric: boolean) =>
    parts.push(
      exec.listObjects(family, some, { numericProtocol: numeric }).then((text) => {
        for (const rs of parseNftText(text).values()) {
          if (numeric) for (const set of rs.sets.values()) protocolNames(set);
          take(rs);
        }
      }),
    );
  for (const [some, numeric] of [[chains, false], [sets, true]] as const) {
    if (some.length < LIVE_SPLIT) {
      if (some.length) read([...some], numeric);
      continue;
    }
    // cut between tables, near the middle
    let cut = Math.ceil(some.length / 2);
    while (cut < some.length && some[cut].table === some[cut - 1].table) cut++;
    read(some.slice(0, cut), numeric);
    if (cut < some.length) read(some.slice(cut), numeric);
  }
  await Promise.all(parts);
}

/**
 * The packet through the kernel's kube-proxy tables of its family, reading only what the walk
 * reaches: the base chains by name with what they lead every packet to (LIVE_FIRST_CHAINS,
 * LIVE_FIRST_SETS), then in each read the chains, sets and maps the walk looked for and did
 * not have (and with a Service's external chain its service chain, the one it goes to), until
 * the walk needs nothing more. At 10,000 Services in 16 tables a NodePort's walk reads some 250
 * small objects in three reads, where the whole tables are 280,000 lines. The tables are walked in name order
 * (kube-proxy, then kube-proxy-0, -1, ...): the order the mode creates them in; nft prints a
 * table's handle (its creation order) only when listing the whole table.
 */
async function traceLive(req: TraceRequest, runner: CommandRunner): Promise<TraceResult> {
  const pkt = { sourceIP: req.from, protocol: req.protocol, destIP: req.to, destPort: req.port };
  const family = req.to.includes(':') ? 'ip6' : 'ip';
  const exec = new NftExecutor(runner);
  // this host's addresses, for "fib ... type local", read meanwhile
  const localIPs = new Links(runner).hostAddresses().then((a) => a ?? []);
  // probed by name: `nft list tables` reads every table whole first (exec.ts existingTables)
  const names = await exec.existingTables(family, kubeProxyTableNames());
  if (!names.length) {
    await localIPs;
    return { output: '', masq: false, rules: [], notes: [`no ${family} ${TABLE} table on this host`] };
  }
  const tables = new Map(names.map((n) => [n, newRuleset(family, n)]));
  const asked = new Set<string>();
  // the sets read do not change between walks: each one's lookup index is built once
  const indexes: ExactIndexes = new Map();
  let want: NftObjectRef[] = names.flatMap((table) => [
    ...[...LIVE_BASE_CHAINS, ...LIVE_FIRST_CHAINS].map((name) => ({ kind: 'chain' as const, table, name })),
    ...LIVE_FIRST_SETS.map(([kind, name]) => ({ kind, table, name })),
  ]);
  for (let read = 1; ; read++) {
    for (const o of want) asked.add(`${o.kind} ${o.table} ${o.name}`);
    await readObjects(exec, family, want, (rs) => {
      const into = tables.get(rs.table);
      if (!into || rs.family !== family) return;
      for (const [n, c] of rs.chains) into.chains.set(n, c);
      for (const [n, x] of rs.sets) into.sets.set(n, x);
    });
    const next = new Map<string, NftObjectRef>();
    const ask = (table: string, kind: NftObjectRef['kind'], name: string) => next.set(`${kind} ${table} ${name}`, { kind, table, name });
    const missing = (rs: Ruleset, kind: 'chain' | 'set' | 'map', name: string): boolean => {
      // a lookup's syntax says set or map; one asked as the one and not found is asked as the other
      const kinds = kind === 'chain' ? ['chain' as const] : [kind, kind === 'set' ? ('map' as const) : ('set' as const)];
      const k = kinds.find((x) => !asked.has(`${x} ${rs.table} ${name}`));
      if (!k || read >= LIVE_READS_MAX) return false;
      ask(rs.table, k, name);
      // an external chain goes to its service chain (names.ts): read together
      const service = k === 'chain' && name.startsWith('external-') ? `service-${name.slice('external-'.length)}` : null;
      if (service && !asked.has(`chain ${rs.table} ${service}`)) ask(rs.table, 'chain', service);
      return true;
    };
    const r = traceTables([...tables.values()], pkt, { localIPs: await localIPs, missing, indexes });
    if (read === 1) {
      for (const rs of tables.values()) if (!rs.chains.has(C.filterPreroutingPreDNAT)) missing(rs, 'chain', LIVE_OLD_FILTER_PREROUTING);
    }
    if (!next.size) return { output: r.output, masq: r.masq, rules: r.rules, notes: r.notes };
    want = [...next.values()];
  }
}

async function trace(req: TraceRequest, deps: { runner: CommandRunner }): Promise<TraceResult> {
  if (req.live) return traceLive(req, deps.runner);
  const { tables: _tables, ...r } = tracePlanned(req);
  return r;
}

/**
 * A planned trace through the tables the mode writes for the state from scratch; `shards`
 * overrides the mode's thresholds (tests: K > 1 on a small state, test/intents).
 */
export function tracePlanned(req: TraceRequest, shards?: ShardOptions): TraceResult & { tables: string[] } {
  if (!req.input) throw kproxyError('KPROXY_TRACE_NO_INPUT', 'a planned trace needs --manifests (or use --live)');
  const pkt = { sourceIP: req.from, protocol: req.protocol, destIP: req.to, destPort: req.port };
  const tables = planShardedRulesets(req.input.state, optionsFromInput(req.input), { tables: req.input.config.nftables?.tables, ...shards });
  const r = traceTables(tables, pkt, { localIPs: req.input.node.nodeIPs });
  return { output: r.output, masq: r.masq, rules: r.rules, notes: [...(r.notes ?? []), ...skippedVIPNotes(req)], tables: tables.map((t) => t.table) };
}

export const mode: ModeModule = { name: 'nftables', render, renderParts, createProxier, cleanup, trace };
export const conformance: ConformanceAdapter | undefined = nftablesConformance;
