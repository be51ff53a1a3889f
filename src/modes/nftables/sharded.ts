// The nftables mode's Proxier at scale: the Services spread over K tables, each a
// complete copy of upstream's `kube-proxy` table holding only its Services. The kernel
// validates the whole TABLE on every commit that adds a jump, goto or dnat, so a one-Service
// change into one of K tables validates ~1/K of the graph (docs/benchmarks.md, "Sharding the
// table"). Below `threshold` Services K = 1 and the one table is upstream's `kube-proxy`,
// unchanged; above it K ≈ N / perTable (at most maxTables), with hysteresis, and the tables
// are `kube-proxy-0` … `kube-proxy-<K-1>`; a Service's table is shardOf(namespace/name, K).
// One NftProxier per table plans and diffs it; this class applies what they prepare as ONE
// `nft -f`: a partial sync holds only the changed Services' tables, a full sync and a reshard
// (K changed: the new tables written, the old ones deleted) every table.
import { onlyServices, SkippedVIPReporter } from '../skipped-vips.ts';
import { countLines, NftApplyError, NftExecutor } from '../../kernel/nft/exec.ts';
import type { Logger } from '../../log.ts';
import type { Proxier, SyncStats } from '../types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import { kubeProxyTableNames, SHARD_TABLE_NAMES, shardOf } from './names.ts';
import { chooseShards, DEFAULT_SHARDS, serviceCount, ShardStates, shardTables, type ShardOptions } from './shards.ts';
import { MAX_ISOLATION_RETRIES } from '../isolation.ts';
import { coded } from '../../errors.ts';
import { MAX_KEPT_TRANSACTION_CHARS, NftProxier, type NftProxierOptions, type PreparedSync } from './proxier.ts';
import { parseNftText } from './parse.ts';
import type { LiveNames } from './transaction.ts';

export { chooseShards, DEFAULT_SHARDS, shardTables, targetShards, type ShardOptions } from './shards.ts';

export interface ShardedNftProxierOptions extends Omit<NftProxierOptions, 'table'> {
  shards?: ShardOptions;
}

export class ShardedNftProxier implements Proxier {
  private readonly exec: NftExecutor;
  private readonly log: Logger;
  private readonly shardOpts: Required<ShardOptions>;
  private proxiers: NftProxier[] = [];
  /** tables written by earlier syncs (or found at start) that the current K does not use */
  private needTableScan = true;
  private lastTransaction = '';
  /** reshards done (tests, /debug) */
  reshards = 0;
  /** partial transactions refused and repaired by a full sync in the same call */
  partialFallbacks = 0;
  private skippedVIPs?: SkippedVIPReporter;

  constructor(private readonly opts: ShardedNftProxierOptions) {
    this.exec = new NftExecutor(opts.runner);
    this.log = opts.log;
    const o = { ...DEFAULT_SHARDS, ...(opts.shards ?? {}) };
    // never a table name that cleanup and the unused-table scan would not find (names.ts)
    this.shardOpts = { ...o, maxTables: Math.min(o.maxTables, SHARD_TABLE_NAMES) };
  }

  /** The current number of tables (0 before the first sync). */
  get shardCount(): number {
    return this.proxiers.length;
  }

  /** The current tables' names, in shard order. */
  tables(): string[] {
    return this.proxiers.map((p) => p.table);
  }

  /** The per-table proxiers (tests, /debug). */
  shardProxiers(): readonly NftProxier[] {
    return this.proxiers;
  }

  /** the last transaction sent to nft (for /debug and tests); '' after a successful one over MAX_KEPT_TRANSACTION_CHARS */
  lastTransactionText(): string {
    return this.lastTransaction;
  }

  private newProxier(table: string): NftProxier {
    const { shards: _shards, ...rest } = this.opts;
    return new NftProxier({ ...rest, table });
  }

  /** shardOf per Service for the current K (sha256 once per Service) */
  private shardMemo = new Map<string, number>();

  private shardOfKey(key: string): number {
    const k = this.proxiers.length;
    let s = this.shardMemo.get(key);
    if (s === undefined) {
      s = shardOf(key, k);
      if (this.shardMemo.size >= 1 << 20) this.shardMemo.clear();
      this.shardMemo.set(key, s);
    }
    return s;
  }

  /** the tables' states (K > 1), kept across syncs: updated per changed Service */
  private shardStates: ShardStates | null = null;

  async sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    const family = input.node.family;
    const view = input.view;
    // The number of Services: the node view keeps it (its per-Service index); without a view
    // (tests, render-like callers) it is counted.
    const n = view ? view.servicePorts.size : serviceCount(input.state, family);
    const k = chooseShards(n, this.proxiers.length, this.shardOpts);
    let reshard = k !== this.proxiers.length;
    if (reshard) {
      if (this.proxiers.length) {
        this.reshards++;
        this.log.info({ services: n, from: this.proxiers.length, to: k }, `nftables: spreading the Services over ${k} table(s)`);
      }
      this.proxiers = shardTables(k).map((t) => this.newProxier(t));
      this.shardMemo.clear();
      this.needTableScan = true;
      this.shardStates = null;
    }
    // Each table's state: from scratch on a full sync or a reshard (O(N)), else only the
    // changed Services' ports move (their keys from the node view), O(changed).
    if (k > 1) {
      if (!this.shardStates || full || reshard || !view) {
        this.shardStates ??= new ShardStates(k, (key) => this.shardOfKey(key));
        this.shardStates.reset(input.state, family);
      } else {
        this.shardStates.update(input.state, family, changed, (svc) => view.servicePorts.get(svc));
      }
    }
    (this.skippedVIPs ??= new SkippedVIPReporter(this.log)).report(full || reshard ? input : onlyServices(input, changed));
    for (const p of this.proxiers) p.exclusions.startSync(changed, full || reshard);
    let fellBack = false;
    for (let retry = 0; ; retry++) {
      try {
        const stats = await this.syncAttempt(input, changed, full || reshard || fellBack);
        const excluded = this.proxiers.flatMap((p) => p.exclusions.keys()).sort();
        return excluded.length ? { ...stats, excludedServices: excluded } : stats;
      } catch (e) {
        if (!(e instanceof NftApplyError)) throw e;
        if (this.lastAttemptPartial && !fellBack) {
          fellBack = true;
          this.partialFallbacks++;
          this.log.warn({ err: (e as Error).message }, coded('KPROXY_NFT_APPLY', 'partial sync refused; running a full sync now'));
          retry--;
          continue;
        }
        // The old tables are still there (the transaction changed nothing): needTableScan is
        // still set, so the next full sync deletes them.
        if (retry >= MAX_ISOLATION_RETRIES || !this.excludeRefused(e)) throw e;
        reshard = false;
      }
    }
  }

  private lastAttemptPartial = false;
  /** each shard's first line in the last transaction (1-based offsets: lines before it) */
  private lastOffsets: number[] = [];

  private excludeRefused(e: NftApplyError): boolean {
    let found = false;
    this.proxiers.forEach((p, i) => {
      const off = this.lastOffsets[i];
      if (off !== undefined && off >= 0 && p.excludeRefused(e, off)) found = true;
    });
    return found;
  }

  /**
   * The live chain and set names of `tables` from one listing of the family's names; a table
   * not in the kernel gets empty names (nothing to delete). null when the listing fails or
   * does not parse: each table then lists itself.
   */
  private async liveNamesOf(family: 'ip' | 'ip6', tables: string[]): Promise<Map<string, LiveNames> | null> {
    let text: string;
    try {
      text = await this.exec.listNames(family);
    } catch (e) {
      this.log.warn({ family, err: (e as Error).message }, 'nftables: listing the chain and set names failed; listing each table instead');
      return null;
    }
    let parsed: ReturnType<typeof parseNftText>;
    try {
      parsed = parseNftText(text);
    } catch {
      return null;
    }
    const out = new Map<string, LiveNames>();
    for (const t of tables) {
      const rs = parsed.get(`${family} ${t}`);
      out.set(t, rs ? { chains: new Set(rs.chains.keys()), sets: new Map([...rs.sets.values()].map((x) => [x.name, x.kind])) } : { chains: new Set(), sets: new Map() });
    }
    return out;
  }

  /** The kube-proxy tables of the family in the kernel that the current K does not use. */
  private async unusedTables(family: 'ip' | 'ip6'): Promise<string[]> {
    const keep = new Set(this.tables());
    // probed by name: `nft list tables` reads every table whole first (55 s at 10k: nft.ts)
    return this.exec.existingTables(family, kubeProxyTableNames().filter((t) => !keep.has(t)));
  }

  private async syncAttempt(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    const k = this.proxiers.length;
    const family = input.node.family === 6 ? 'ip6' : 'ip';
    // Which tables this sync writes: every one for a full sync; otherwise those of the changed
    // Services, or every one when nothing changed (an idle sync retires chains in each).
    const which = full || changed.size === 0 || this.proxiers.some((p) => p.needsFull)
      ? this.proxiers.map((_, i) => i)
      : [...new Set([...changed].map((key) => this.shardOfKey(key)))].sort((a, b) => a - b);

    // The chain and set names a full transaction needs (to delete what the table no longer
    // wants): for several tables one listing of the family's names (`nft list chains` and terse
    // sets and maps, 0.4 s at 10,000 in 16 tables), not one `nft list table` per table (each walks
    // the whole family's rules in the kernel: 0.5–1.2 s apiece, 9–12 s for 16).
    const fullOnes = which.filter((i) => full || this.proxiers[i].needsFull);
    const known = fullOnes.length >= 2 ? await this.liveNamesOf(family, fullOnes.map((i) => this.proxiers[i].table)) : null;
    const prepared = new Map<number, PreparedSync>();
    for (const i of which) {
      const p = this.proxiers[i];
      const own = k <= 1 ? changed : new Set([...changed].filter((key) => this.shardOfKey(key) === i));
      const state = k <= 1 ? input.state : this.shardStates!.state(i);
      // the table's changed port keys: its planner looks at those only (O(changed))
      const keys = k <= 1 ? undefined : this.shardStates!.touchedIn(i);
      prepared.set(i, await p.prepare({ ...input, state: p.exclusions.filter(state) }, own, full, keys, known?.get(p.table)));
      if (k > 1) this.shardStates!.planned(i);
    }
    this.lastAttemptPartial = [...prepared.values()].some((x) => x.partial);
    // Tables no longer used (a reshard; leftovers of an earlier K or run), as the kernel has
    // them (probed by name), go in the same transaction when every table is written whole.
    const scan = this.needTableScan && !this.lastAttemptPartial;
    const drop = scan ? (await this.unusedTables(family)).sort() : [];
    this.lastOffsets = [];
    let text = '';
    let lines = 0;
    for (const [i, x] of prepared) {
      if (x.tx.ops === 0) continue;
      this.lastOffsets[i] = lines;
      text += x.tx.text;
      lines += countLines(x.tx.text);
    }
    // `delete table` after the new tables are written: one commit, so a packet sees the old
    // tables or the new ones, never neither.
    for (const t of drop) text += `delete table ${family} ${t}\n`;
    if (text !== '') {
      this.lastTransaction = text;
      try {
        await this.exec.apply(text);
      } catch (e) {
        for (const x of prepared.keys()) this.proxiers[x].applyFailed();
        throw e;
      }
      // as NftProxier: a big successful transaction is not kept (33 MB at 10,000 Services)
      if (text.length > MAX_KEPT_TRANSACTION_CHARS) this.lastTransaction = '';
    }
    if (drop.length) this.log.info({ family, tables: drop }, `deleted nftables tables ${drop.join(', ')}`);
    if (scan) this.needTableScan = false;
    const stats: SyncStats = { rulesWritten: drop.length, rulesTotal: 0 };
    const diffs: string[] = [];
    for (const [i, x] of prepared) {
      const s = await this.proxiers[i].commit(x);
      stats.rulesWritten += s.rulesWritten;
      if (s.cleanupFailures) stats.cleanupFailures = (stats.cleanupFailures ?? 0) + s.cleanupFailures;
      if (s.diff) diffs.push(k > 1 ? `${this.proxiers[i].table}: ${s.diff}` : s.diff);
    }
    for (const p of this.proxiers) stats.rulesTotal += p.planner.objectCount;
    if (drop.length) diffs.push(`deleted tables ${drop.join(', ')}`);
    stats.diff = diffs.join('; ');
    return stats;
  }

  /** Every table, in shard order (each as upstream's dump of one table). */
  dump(): string {
    return this.proxiers.map((p) => p.dump()).filter(Boolean).join('\n');
  }

  async stop(): Promise<void> {
    for (const p of this.proxiers) await p.stop();
  }
}
