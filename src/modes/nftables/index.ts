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
import { dumpRuleset, newRuleset, type Ruleset } from './ruleset.ts';
import { traceTables } from './trace.ts';
import { parseNftText } from './parse.ts';
import { planShardedRulesets, type ShardOptions } from './shards.ts';
import { skippedVIPNotes } from '../../core/vip.ts';
import { kproxyError } from '../../errors.ts';

export { planRuleset, optionsFromInput } from './plan.ts';
export { traceNft, traceRuleset } from './trace.ts';
export { dumpRuleset } from './ruleset.ts';
export { sortNftTransaction } from './conformance.ts';
export { runShardedCase } from './conformance-sharded.ts';

/** The table as it would be applied for this state (knftables dump form; valid `nft -f` input). */
function render(input: PlanInput): string {
  // from 1,000 Services the mode writes several tables (shards.ts): all of them, in order
  return planShardedRulesets(input.state, optionsFromInput(input), { tables: input.config.nftables?.tables }).map(dumpRuleset).join('');
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
/** Reads of a live trace at most: each is one step deeper in the walk (about six for a NodePort). */
const LIVE_READS_MAX = 16;

/**
 * listObjects over two nft processes at once when there are many objects: each command
 * costs nft some milliseconds of CPU (it reads the table's chain list), so on a node with
 * two cores or more the read takes half the time.
 */
async function listInParallel(exec: NftExecutor, family: 'ip' | 'ip6', objects: NftObjectRef[]): Promise<string> {
  if (objects.length < 16) return exec.listObjects(family, objects);
  const half = Math.ceil(objects.length / 2);
  const parts = await Promise.all([exec.listObjects(family, objects.slice(0, half)), exec.listObjects(family, objects.slice(half))]);
  return parts.join('');
}

/**
 * The packet through the kernel's kube-proxy tables of its family, reading only what the walk
 * reaches: the base chains by name, then in each round the chains, sets and maps the walk
 * looked for and did not have, one `nft -i` for all of them (NftExecutor.listObjects), until
 * the walk needs nothing more. At 10,000 Services in 16 tables a NodePort's walk reads some 250
 * small objects in eight reads, where the whole tables are 280,000 lines. The tables are walked in name order
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
  let want: NftObjectRef[] = names.flatMap((table) => LIVE_BASE_CHAINS.map((name) => ({ kind: 'chain' as const, table, name })));
  for (let read = 1; ; read++) {
    for (const o of want) asked.add(`${o.kind} ${o.table} ${o.name}`);
    for (const rs of parseNftText(await listInParallel(exec, family, want)).values()) {
      const into = tables.get(rs.table);
      if (!into || rs.family !== family) continue;
      for (const [n, c] of rs.chains) into.chains.set(n, c);
      for (const [n, x] of rs.sets) into.sets.set(n, x);
    }
    const next = new Map<string, NftObjectRef>();
    const missing = (rs: Ruleset, kind: 'chain' | 'set' | 'map', name: string): boolean => {
      // a lookup's syntax says set or map; one asked as the one and not found is asked as the other
      const kinds = kind === 'chain' ? ['chain' as const] : [kind, kind === 'set' ? ('map' as const) : ('set' as const)];
      const k = kinds.find((x) => !asked.has(`${x} ${rs.table} ${name}`));
      if (!k || read >= LIVE_READS_MAX) return false;
      next.set(`${k} ${rs.table} ${name}`, { kind: k, table: rs.table, name });
      return true;
    };
    const r = traceTables([...tables.values()], pkt, { localIPs: await localIPs, missing });
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

export const mode: ModeModule = { name: 'nftables', render, createProxier, cleanup, trace };
export const conformance: ConformanceAdapter | undefined = nftablesConformance;
