// The upstream conformance cases through the sharded table shape: where the table shape
// differs from upstream's, the packet semantics stay upstream's, so every upstream flow case
// still passes. The cases' golden TEXT is upstream's single `kube-proxy` table (K = 1); here
// their FLOWS are traced through K tables `kube-proxy-0..K-1` (shards.ts planShards) for every
// K asked, each K under several spreads of the Services over the tables, so that every Service
// sits in every table position at least once (a cross-table fault shows only in some orders):
//
// - `rotation r` (r = 0..K-1): the case's Services sorted by "namespace/name", the i-th in
//   table (i + r) mod K (with fewer Services than tables some tables stay empty: their fixed
//   part must not change a flow either);
// - `hash`: the mode's own shardOf (names.ts), as `kproxy run` spreads them.
//
// What each kind of case must give through every spread:
// - nftables flows cases: each flow's expected output and masquerade, as in flows.json;
// - golden and steps cases: every probe packet of the case (conformance.ts probePackets)
//   ends as through upstream's expected table (of each step);
// - flows cases of another mode (iptables): no nftables expectation exists for them, so each
//   flow's packet and every probe packet ends as through kproxy's single nftables table (K = 1)
//   of the same state: sharding changes nothing.
// Pure apart from what the case holds.
import { stateOf, trackerFor, applyObject, type CaseOutcome, type ConformanceCase } from '../../conformance/case.ts';
import type { ProxyState } from '../../core/model.ts';
import { optionsFromCase, probePackets, tracerLocalIPs } from './conformance.ts';
import { isServiceChainName, shardOf } from './names.ts';
import { parseKubeProxyTable } from './parse.ts';
import { C, planRuleset, type NftPlanOptions } from './plan.ts';
import type { Ruleset } from './ruleset.ts';
import { planShards } from './shards.ts';
import { traceTables, type NftPacket } from './trace.ts';

export interface ShardSpread {
  k: number;
  /** "K=2 rotation 1" | "K=3 hash" */
  name: string;
  shardOfKey(serviceKey: string): number;
}

/** The spreads of a state's Services over K tables for each K (see the file's comment). */
export function shardSpreads(state: ProxyState, ks: readonly number[]): ShardSpread[] {
  const keys = [...new Set([...state.services.values()].map((sp) => sp.serviceKey))].sort();
  const index = new Map(keys.map((k, i) => [k, i]));
  const out: ShardSpread[] = [];
  for (const k of ks) {
    if (!Number.isInteger(k) || k < 2) throw new Error(`shard count ${k}: must be an integer ≥ 2`);
    for (let r = 0; r < k; r++) out.push({ k, name: `K=${k} rotation ${r}`, shardOfKey: (key) => ((index.get(key) ?? 0) + r) % k });
    out.push({ k, name: `K=${k} hash`, shardOfKey: (key) => shardOf(key, k) });
  }
  return out;
}

const SERVICE_MAPS = [C.serviceIPs, C.serviceNodePorts, C.noEndpointServices, C.noEndpointNodePorts, C.firewallIPs, C.clusterIPs];

/** How many tables of a spread hold at least one Service (a chain of its own, or an element of a dispatch map). */
function tablesUsed(tables: Ruleset[]): number {
  return tables.filter((rs) => [...rs.chains.keys()].some(isServiceChainName) || SERVICE_MAPS.some((m) => (rs.sets.get(m)?.elements.size ?? 0) > 0)).length;
}

export interface ShardedOutcome extends CaseOutcome {
  /** spreads checked */
  spreads: number;
  /** packets traced per spread, summed */
  packets: number;
  /** the most tables holding Services in one spread */
  maxTablesUsed: number;
}

interface Check {
  pkt: NftPacket;
  label: string;
  want: { output: string; masq: boolean };
}

function judge(
  checks: (state: ProxyState) => Check[], state: ProxyState, o: NftPlanOptions, local: string[], ks: readonly number[], what: string, requirePackets = true,
): ShardedOutcome {
  const failures: string[] = [];
  let spreads = 0;
  let packets = 0;
  let maxTablesUsed = 0;
  const cs = checks(state);
  for (const sp of shardSpreads(state, ks)) {
    const tables = planShards(state, o, sp.k, sp.shardOfKey);
    spreads++;
    maxTablesUsed = Math.max(maxTablesUsed, tablesUsed(tables));
    for (const c of cs) {
      packets++;
      const got = traceTables(tables, c.pkt, { localIPs: local });
      if (got.output !== c.want.output || got.masq !== c.want.masq) {
        failures.push(
          `${what} ${sp.name}: ${c.label} ${c.pkt.sourceIP} -> ${c.pkt.destIP}:${c.pkt.destPort}/${c.pkt.protocol || 'TCP'}: ` +
            `want ${JSON.stringify(c.want.output)} masq=${c.want.masq}, got ${JSON.stringify(got.output)} masq=${got.masq}`,
          ...got.rules.map((x) => `    matched ${x}`),
          ...got.notes.map((x) => `    note ${x}`),
        );
      }
    }
  }
  if (cs.length === 0 && requirePackets) failures.push(`${what}: no packet to check`);
  return { ok: failures.length === 0, detail: failures.length ? failures.join('\n') : undefined, spreads, packets, maxTablesUsed };
}

/** Probe packets judged by the outcome through one reference table. */
function againstTable(reference: Ruleset, o: NftPlanOptions, local: string[]): (state: ProxyState) => Check[] {
  return (state) => {
    const mine = planRuleset(state, o);
    return probePackets([reference, mine], o).map((pkt) => {
      const r = traceTables([reference], pkt, { localIPs: local });
      return { pkt, label: 'probe', want: { output: r.output, masq: r.masq } };
    });
  };
}

/** Runs a case's flows through K = each of `ks` tables, under every spread (see the file's comment). */
export function runShardedCase(c: ConformanceCase, ks: readonly number[] = [2, 3]): ShardedOutcome {
  const o = optionsFromCase(c.config);
  const local = tracerLocalIPs(c.config);
  const fam = o.family === 6 ? 'ip6' : 'ip';
  if (c.kind === 'flows' && c.config.mode === 'nftables') {
    const checks = () => (c.flows ?? []).map((f) => ({ pkt: f, label: `flow ${JSON.stringify(f.name)}`, want: { output: f.output, masq: f.masq } }));
    return judge(checks, stateOf(c.config, c.objects), o, local, ks, c.name);
  }
  if (c.kind === 'flows') {
    const state = stateOf(c.config, c.objects);
    const single = planRuleset(state, o);
    const pkts: Array<{ pkt: NftPacket; label: string }> = [
      ...(c.flows ?? []).map((f) => ({ pkt: f as NftPacket, label: `flow ${JSON.stringify(f.name)} (as one nftables table)` })),
      ...probePackets([single], o).map((pkt) => ({ pkt, label: 'probe (as one nftables table)' })),
    ];
    const checks = () => pkts.map(({ pkt, label }) => {
      const r = traceTables([single], pkt, { localIPs: local });
      return { pkt, label, want: { output: r.output, masq: r.masq } };
    });
    return judge(checks, state, o, local, ks, c.name);
  }
  if (c.config.mode !== 'nftables') throw new Error(`${c.name}: a ${c.config.mode} ${c.kind} case has no nftables table to compare with`);
  if (c.kind === 'golden') {
    const state = stateOf(c.config, c.objects);
    return judge(againstTable(parseKubeProxyTable(c.expected ?? '', fam), o, local), state, o, local, ks, c.name);
  }
  // steps: each step's state against that step's expected table
  const tracker = trackerFor(c.config);
  const total: ShardedOutcome = { ok: true, spreads: 0, packets: 0, maxTablesUsed: 0 };
  const failures: string[] = [];
  for (const step of c.steps ?? []) {
    for (const obj of step.objects) applyObject(tracker, 'add', obj);
    for (const ev of step.events) applyObject(tracker, ev.op, ev.object);
    tracker.apply();
    if (step.expected === undefined) continue;
    const r = judge(againstTable(parseKubeProxyTable(step.expected, fam), o, local), tracker.state, o, local, ks, `${c.name}/${step.name}`, false);
    total.spreads += r.spreads;
    total.packets += r.packets;
    total.maxTablesUsed = Math.max(total.maxTablesUsed, r.maxTablesUsed);
    if (!r.ok && r.detail) failures.push(r.detail);
  }
  if (total.packets === 0) failures.push(`${c.name}: no packet to check in any step`);
  if (failures.length) return { ...total, ok: false, detail: failures.join('\n') };
  return total;
}
