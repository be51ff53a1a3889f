// nftables mode: one private `kube-proxy` table per IP family (from 1,000 Services the
// Services spread over `kube-proxy-<n>` tables, shards.ts), written as one `nft -f`
// transaction per sync. Planner (plan.ts), text (ruleset.ts), tracer (trace.ts) are pure;
// the proxier (proxier.ts) applies through the nft executor (src/kernel/nft/exec.ts); TCP
// NodePorts on 127.0.0.1 / ::1 are served by userspace listeners beside it when
// --nodeport-addresses names the loopback address (localhost-nodeports.ts, KEP-6032).
import type { ConformanceAdapter } from '../../conformance/case.ts';
import { type CommandRunner, ExecError } from '../../kernel/runner.ts';
import { NftExecutor } from '../../kernel/nft/exec.ts';
import { Links } from '../../kernel/links.ts';
import type { Logger } from '../../log.ts';
import type { ModeDeps, ModeModule, Proxier } from '../types.ts';
import type { TraceRequest, TraceResult } from '../trace-types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import { nftablesConformance } from './conformance.ts';
import { kubeProxyTableNames, TABLE } from './names.ts';
import { optionsFromInput } from './plan.ts';
import { NftProxier } from './proxier.ts';
import { NftWithLocalhostNodePorts } from './localhost-nodeports.ts';
import { dumpRuleset } from './ruleset.ts';
import { traceNft, traceTables } from './trace.ts';
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

/** `nft -a list table` output without its "# handle N" comments, and the table's handle. */
export function withoutHandles(text: string): { handle: number; text: string } {
  const m = /^table \S+ \S+ \{ # handle (\d+)$/m.exec(text);
  return { handle: m ? parseInt(m[1], 10) : Number.MAX_SAFE_INTEGER, text: text.replace(/ # handle \d+$/gm, '') };
}

async function trace(req: TraceRequest, deps: { runner: CommandRunner }): Promise<TraceResult> {
  const pkt = { sourceIP: req.from, protocol: req.protocol, destIP: req.to, destPort: req.port };
  if (req.live) {
    const family = req.to.includes(':') ? 'ip6' : 'ip';
    // every kube-proxy table of the family: upstream's one, or the shards' (names.ts)
    const exec = new NftExecutor(deps.runner);
    // Probed by name (`nft list tables` reads every table whole first: nft.ts existingTables),
    // each listed with its handle, joined in the kernel's creation order (handle order): at
    // equal priority the tracer runs the table created last first, as the kernel does.
    const listed: Array<{ handle: number; text: string }> = [];
    for (const table of await exec.existingTables(family, kubeProxyTableNames())) {
      const t = await exec.listTable(family, table, { handles: true });
      if (t !== null) listed.push(withoutHandles(t));
    }
    const texts = listed.sort((a, b) => a.handle - b.handle).map((x) => x.text);
    if (!texts.length) return { output: '', masq: false, rules: [], notes: [`no ${family} ${TABLE} table on this host`] };
    const text = texts.join('\n');
    // this host's addresses, for "fib ... type local"
    const local = (await new Links(deps.runner).hostAddresses()) ?? [];
    const r = traceNft(text, pkt, { localIPs: local });
    return { output: r.output, masq: r.masq, rules: r.rules, notes: r.notes };
  }
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
