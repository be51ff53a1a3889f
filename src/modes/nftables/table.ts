// One table of the nftables mode, between syncs: what kproxy last wrote into it (its planner's
// index of the table and each port's inputs), and what it retires later. A sync prepares the table's operations
// (full on the first sync, after a failure and when asked; otherwise only the difference
// from what it last applied), the proxier applies every table's in one `nft -f`, then each
// table commits. Unused chains are flushed at once and deleted later: with a transaction
// that deletes anyway, or after an idle sync (staleChainMaxWaitMs). A removed element that is
// harmless meanwhile (a jump into such a chain, a ClusterIP no Service has) lingers the same
// way and goes before its chain (deferElementDeletes).
import type { NftExecutor } from '../../kernel/nft/exec.ts';
import { elementKey, renderOps, type NftOp, type NftTableRef } from '../../kernel/nft/model.ts';
import type { Logger } from '../../log.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import type { SyncStats } from '../types.ts';
import { coded } from '../../errors.ts';
import { parseNftText } from './parse.ts';
import { optionsFromInput } from './plan.ts';
import { IncrementalPlanner } from './incremental.ts';
import { dumpRuleset, type NftElement, type NftFamily, type TableLookup } from './ruleset.ts';
import { TABLE } from './names.ts';
import {
  deleteElementsOps,
  deleteRetiredOps,
  fullTransaction,
  lingeringTarget,
  partialTransaction,
  partialTransactionFor,
  type LingeringElement,
  type LiveNames,
  type Transaction,
} from './transaction.ts';

export interface RetireOptions {
  /** clock for retiring stale chains; tests inject one */
  now?: () => number;
  /** how long a retired chain is kept (flushed) before it is deleted */
  staleChainDelayMs?: number;
  /**
   * least time between two transactions that only delete retired chains (default 10 s):
   * `delete chain` makes nft 1.0.6 list every chain of the table first (seconds at 10,000
   * Services on a loaded node), so retirements are batched, or ride along with a partial
   * transaction that deletes elements and so pays that listing anyway
   */
  staleChainBatchMs?: number;
  /**
   * A retired chain's deletion waits for an idle sync (one that wrote nothing: the periodic
   * sync on a quiet cluster) or a full one, so that under a stream of changes no sync pays
   * nft 1.0.6's chain listing (~1 s at 10,000 Services) for it; under a stream that never
   * pauses it is deleted anyway once it has been due this long (default 60 s)
   */
  staleChainMaxWaitMs?: number;
  /**
   * Leave a removed element in the kernel when it is harmless (it jumps to a chain the same
   * transaction flushes, or it is a ClusterIP no Service uses: transaction.ts deferrable) and
   * delete it later with the retired chains (default true): a partial sync's `delete element`
   * makes nft 1.0.6 list every chain of the table (1.4 s at 10,000 Services), so a deleted
   * Service would cost that on the hot path
   */
  deferElementDeletes?: boolean;
}

/** A table's sync planned as operations, not applied yet (TableWriter.prepare → apply → commit). */
export interface PreparedSync {
  tx: Transaction;
  /** the table after the sync, by name (never the whole table: a full one is dropped once its operations are written) */
  desired: TableLookup;
  riders: { chains: string[]; sets: string[] };
  ridingEls: LingeringElement[];
  deletesStaleSets: boolean;
  partial: boolean;
  /** the transaction's operations: tx.ops may be dropped once sent (NftProxier.applyAll) */
  opCount: number;
}

/** What prepare() needs besides the (already filtered) input. */
export interface PrepareRequest {
  changed: ReadonlySet<string>;
  full: boolean;
  /** the port keys that may have changed since the last prepare (ShardStates); a partial plan looks at those only */
  portKeys?: ReadonlySet<string>;
  /** the table's chain and set names in the kernel when the caller listed them; absent: listed here if needed */
  knownLive?: LiveNames | null;
}

/** Elements left in the kernel by partial syncs: set → key → element, and since when. */
class LingeringElements {
  readonly bySet = new Map<string, Map<string, NftElement>>();
  private readonly since = new Map<string, number>();

  constructor(private readonly now: () => number) {}

  list(): LingeringElement[] {
    return [...this.bySet].flatMap(([set, els]) => [...els.values()].map((el) => ({ set, el })));
  }

  add(items: LingeringElement[]): void {
    for (const { set, el } of items) {
      const k = elementKey(el.key);
      let m = this.bySet.get(set);
      if (!m) this.bySet.set(set, (m = new Map()));
      m.set(k, el);
      if (!this.since.has(`${set} ${k}`)) this.since.set(`${set} ${k}`, this.now());
    }
  }

  remove(items: LingeringElement[]): void {
    for (const { set, el } of items) {
      const k = elementKey(el.key);
      this.bySet.get(set)?.delete(k);
      if (this.bySet.get(set)?.size === 0) this.bySet.delete(set);
      this.since.delete(`${set} ${k}`);
    }
  }

  clear(): void {
    this.bySet.clear();
    this.since.clear();
  }

  /** Elements left at least delayMs ago, and the oldest time among them. */
  due(delayMs: number): { items: LingeringElement[]; oldest: number } {
    const out = { items: [] as LingeringElement[], oldest: Infinity };
    for (const item of this.list()) {
      const since = this.since.get(`${item.set} ${elementKey(item.el.key)}`) ?? this.now();
      if (this.now() - since < delayMs) continue;
      out.items.push(item);
      out.oldest = Math.min(out.oldest, since);
    }
    return out;
  }
}

export class TableWriter {
  readonly ref: NftTableRef;
  private readonly now: () => number;
  private readonly delayMs: number;
  private readonly batchMs: number;
  private readonly maxWaitMs: number;
  private readonly deferElementDeletes: boolean;
  private lastChainDeletion = Number.NEGATIVE_INFINITY;
  /** whether a transaction of this table was applied (the planner's table is the kernel's) */
  private applied = false;
  private needFull = true;
  /** failed stale-chain deletions since the last successful sync (nftables_cleanup_failures_total) */
  private cleanupFailures = 0;
  private baseChainsRecreated = false;
  /** retired chain → when it was flushed */
  private readonly staleChains = new Map<string, number>();
  /** retired affinity set → when it was flushed (deleted with the chains) */
  private readonly staleSets = new Map<string, number>();
  /** elements removed from the desired table but left in the kernel, deleted with the chains */
  private readonly lingering: LingeringElements;
  /** each port's inputs and an index of the table, kept between syncs, so a partial sync replans only what changed */
  readonly planner = new IncrementalPlanner();

  constructor(
    family: NftFamily,
    readonly table: string,
    private readonly exec: NftExecutor,
    private readonly log: Logger,
    opts: RetireOptions = {},
  ) {
    this.ref = { family, table };
    this.now = opts.now ?? Date.now;
    this.delayMs = opts.staleChainDelayMs ?? 1000;
    this.batchMs = opts.staleChainBatchMs ?? 10_000;
    this.maxWaitMs = opts.staleChainMaxWaitMs ?? 60_000;
    this.deferElementDeletes = opts.deferElementDeletes ?? true;
    this.lingering = new LingeringElements(this.now);
  }

  /** Elements left in the kernel by partial syncs, to be deleted later (tests, /debug). */
  lingeringElements(): LingeringElement[] {
    return this.lingering.list();
  }

  /** Whether the next sync must be a full one (first sync, after a failure). */
  get needsFull(): boolean {
    return this.needFull || !this.applied;
  }

  /** The transaction of a prepared sync was refused (or not applied): the next sync is a full one. */
  applyFailed(): void {
    this.needFull = true;
  }

  private async liveNames(): Promise<LiveNames | null> {
    const text = await this.exec.listTable(this.ref.family, this.table);
    // No table: nothing to flush or retire (null would mean "unknown": flush everything).
    if (text === null) return { chains: new Set(), sets: new Map() };
    const rs = parseNftText(text).get(`${this.ref.family} ${this.table}`);
    if (!rs) return null;
    return { chains: new Set(rs.chains.keys()), sets: new Map([...rs.sets.values()].map((s) => [s.name, s.kind])) };
  }

  /** Chains and affinity sets retired at least delayMs ago that the desired table does not use again. */
  private dueStale(desired: TableLookup): { chains: string[]; sets: string[]; oldest: number } {
    const due = { chains: [] as string[], sets: [] as string[], oldest: Infinity };
    // A chain a lingering element still jumps to goes in a later transaction than the element
    // (a kernel older than 6.2 sees it referenced by an element deleted in the same batch).
    const held = new Set<string>();
    for (const { el } of this.lingering.list()) {
      const target = lingeringTarget(el);
      if (target !== undefined) held.add(target);
    }
    for (const [map, has, out] of [
      [this.staleChains, (n: string) => desired.hasChain(n), due.chains],
      [this.staleSets, (n: string) => desired.hasSet(n), due.sets],
    ] as const) {
      for (const [name, since] of map) {
        if (has(name)) map.delete(name);
        else if (held.has(name)) continue;
        else if (this.now() - since >= this.delayMs) {
          out.push(name);
          due.oldest = Math.min(due.oldest, since);
        }
      }
    }
    return due;
  }

  private forgetStale(due: { chains: string[]; sets: string[] }): void {
    for (const c of due.chains) this.staleChains.delete(c);
    for (const s of due.sets) this.staleSets.delete(s);
  }

  /** Applies a cleanup transaction of its own; a failure only logs (a full sync removes the rest). */
  private async applyCleanup(ops: NftOp[], what: string, fields: object): Promise<boolean> {
    this.lastChainDeletion = this.now();
    try {
      await this.exec.apply(renderOps(ops));
      return true;
    } catch (e) {
      this.log.warn({ err: (e as Error).message, table: this.table, ...fields }, coded('KPROXY_NFT_STALE_CHAINS', `could not delete ${what}; will retry`));
      this.needFull = true;
      this.cleanupFailures++;
      return false;
    }
  }

  /**
   * Deletes due retired chains in their own transaction, at most once per batchMs, and only
   * after an idle or full sync or once one has been due maxWaitMs. Lingering elements go
   * first, in their own transaction: the chains they jump to are due only after.
   */
  private async deleteStaleChains(desired: TableLookup, quiet: boolean): Promise<void> {
    if (this.now() - this.lastChainDeletion < this.batchMs) return;
    const els = this.lingering.due(this.delayMs);
    if (els.items.length && (quiet || this.now() - els.oldest >= this.delayMs + this.maxWaitMs)) {
      this.lingering.remove(els.items);
      const ok = await this.applyCleanup(deleteElementsOps(this.ref, els.items), 'the map elements of removed services', { elements: els.items.length });
      if (!ok) return;
    }
    const due = this.dueStale(desired);
    if (due.chains.length + due.sets.length === 0) return;
    if (!quiet && this.now() - due.oldest < this.delayMs + this.maxWaitMs) return;
    this.forgetStale(due);
    await this.applyCleanup(deleteRetiredOps(this.ref, due.chains, due.sets), 'retired chains', { chains: due.chains.length, sets: due.sets.length });
  }

  /**
   * The first half of a sync: plans (full, or only the changed Services) and builds the
   * table's operations without applying them, so the proxier applies every table's in one
   * `nft -f`. `input` is already filtered by the exclusions.
   */
  /**
   * What prepare needs from the kernel, read: a full transaction's live chain and set names
   * (req.knownLive when the caller listed them). prepare runs later, when the transaction
   * reaches this table.
   */
  async readyToPrepare(req: PrepareRequest): Promise<PrepareRequest> {
    if (!(req.full || this.needsFull) || req.knownLive !== undefined) return req;
    return { ...req, knownLive: await this.liveNames() };
  }

  /** This sync's transaction for the table; a full one needs readyToPrepare's request. */
  prepare(input: PlanInput, req: PrepareRequest): PreparedSync {
    const fullSync = req.full || this.needsFull;
    // a shard's table (`kube-proxy-<n>`) is one of several: NftPlanOptions.sharded
    const options = this.table === TABLE ? optionsFromInput(input) : { ...optionsFromInput(input), table: this.table, sharded: true };
    // A full sync plans every port afresh (and so also resets the fragment cache).
    if (fullSync && req.knownLive === undefined) throw new Error('a full transaction is prepared after readyToPrepare');
    const plan = this.planner.plan(input.state, options, fullSync ? null : req.changed, req.portKeys);
    let tx: Transaction;
    /** whether a full transaction deletes every set of the table it does not want */
    let deletesStaleSets = false;
    if (fullSync) {
      const live = req.knownLive!;
      deletesStaleSets = live !== null;
      tx = fullTransaction(plan.table!, live, { recreateBaseChains: !this.baseChainsRecreated, owners: plan.owners });
    } else {
      const popts = { lingering: this.lingering.bySet, deferRemovals: this.deferElementDeletes, owners: plan.owners };
      // plan.previous: only some ports were replanned; otherwise the options changed (e.g.
      // node addresses): every port was replanned, diff it all.
      tx = plan.previous ? partialTransactionFor(plan.desired, plan.previous, popts) : partialTransaction(plan.table!, plan.previousTable!, popts);
    }
    return this.withRiders({ tx, desired: plan.desired, riders: { chains: [], sets: [] }, ridingEls: [], deletesStaleSets, partial: !fullSync, opCount: tx.ops.length });
  }

  /**
   * nft lists every chain for a partial transaction's deletes anyway: lingering elements and
   * due retired chains (those no lingering element jumps to) ride along.
   */
  private withRiders(p: PreparedSync): PreparedSync {
    if (!p.partial || !p.tx.ops.some((op) => op.verb === 'delete')) return p;
    const revived = new Set(p.tx.revived.map(({ set, el }) => `${set} ${elementKey(el.key)}`));
    const ridingEls = this.lingering.due(this.delayMs).items.filter(({ set, el }) => !revived.has(`${set} ${elementKey(el.key)}`));
    const riders = this.dueStale(p.desired);
    const ops = [...p.tx.ops, ...deleteElementsOps(this.ref, ridingEls), ...deleteRetiredOps(this.ref, riders.chains, riders.sets)];
    return { ...p, tx: { ...p.tx, ops }, riders, ridingEls, opCount: ops.length };
  }

  /** The second half of a sync, once its transaction is in the kernel: bookkeeping, then the retired chains' deletion (own transactions). */
  async commit(prepared: PreparedSync): Promise<SyncStats> {
    const { tx, desired, riders, ridingEls, deletesStaleSets } = prepared;
    this.forgetStale(riders);
    this.lingering.remove(ridingEls);
    // A full transaction flushed every set: nothing lingers; a partial one may leave elements.
    if (!prepared.partial) this.lingering.clear();
    this.lingering.remove(tx.revived);
    this.lingering.add(tx.lingering);
    // The full transaction deleted the retired sets itself.
    if (deletesStaleSets) for (const s of this.staleSets.keys()) if (!desired.hasSet(s)) this.staleSets.delete(s);
    this.baseChainsRecreated = true;
    this.needFull = false;
    for (const c of tx.staleChains) if (!this.staleChains.has(c)) this.staleChains.set(c, this.now());
    for (const s of tx.staleSets) if (!this.staleSets.has(s)) this.staleSets.set(s, this.now());
    this.applied = true;
    this.planner.committed();
    this.log.debug({ ops: prepared.opCount, table: this.table }, tx.summary);
    // After the change is in the kernel, not before: `delete chain` makes nft 1.0.6 list every
    // chain of the table (half a second at 10,000 Services), which must not delay the change.
    // An idle sync (nothing written) or a full one (it listed the table anyway) may delete;
    // a sync that carried a change leaves them, so a stream of changes never waits for it.
    await this.deleteStaleChains(desired, prepared.opCount === 0 || !prepared.partial);
    const cleanupFailures = this.cleanupFailures;
    this.cleanupFailures = 0;
    return { rulesWritten: prepared.opCount, rulesTotal: this.planner.objectCount, diff: tx.summary, ...(cleanupFailures ? { cleanupFailures } : {}) };
  }

  /**
   * The table as last applied, as upstream's dump of one table, in planRuleset's order:
   * planned again from every port's inputs. A partial attempt that failed has replanned in
   * place: then its table is shown (the next sync is a full one).
   */
  dump(): string {
    if (!this.applied) return '';
    return dumpRuleset(this.planner.appliedTable());
  }
}
