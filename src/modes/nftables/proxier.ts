// The nftables Proxier: plans the table, writes it in one atomic `nft -f` transaction per
// sync (full on the first sync, after a failure and when asked; otherwise only the
// difference from what it last applied), and retires unused chains later: flushed at once,
// deleted with a transaction that deletes anyway, or after an idle sync (staleChainMaxWaitMs).
// A removed element that is harmless meanwhile (a jump into such a chain, a ClusterIP no
// Service has) lingers the same way and goes before its chain (deferElementDeletes).
import { onlyServices, SkippedVIPReporter } from '../skipped-vips.ts';
import type { CommandRunner } from '../../kernel/runner.ts';
import { NftApplyError, NftExecutor } from '../../kernel/nft/exec.ts';
import type { Logger } from '../../log.ts';
import type { Proxier, SyncStats } from '../types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import { parseNftText } from './parse.ts';
import { assembleRuleset, optionsFromInput, type NftPlanOptions } from './plan.ts';
import { IncrementalPlanner } from './incremental.ts';
import { dumpRuleset, type NftFamily, type Ruleset, elementKey, type NftElement } from './ruleset.ts';
import {
  deleteChainsTransaction,
  deleteElementsText,
  fullTransaction,
  lingeringTarget,
  partialTransaction,
  partialTransactionFor,
  type LingeringElement,
  type LiveNames,
  type Transaction,
} from './transaction.ts';
import { TABLE } from './names.ts';
import { exclusionMessage, isTransientRefusal, MAX_ISOLATION_RETRIES, ServiceExclusions } from '../isolation.ts';
import { coded } from '../../errors.ts';

export interface NftProxierOptions {
  runner: CommandRunner;
  log: Logger;
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
  /** the table this proxier owns (default `kube-proxy`, upstream's single table) */
  table?: string;
}

/** A sync planned and written as text, not applied yet (NftProxier.prepare → apply → commit). */
export interface PreparedSync {
  tx: Transaction;
  desired: Ruleset;
  options: NftPlanOptions;
  riders: { chains: string[]; sets: string[] };
  ridingEls: LingeringElement[];
  deletesStaleSets: boolean;
  partial: boolean;
}

/** a successful transaction longer than this is not kept for lastTransactionText() */
export const MAX_KEPT_TRANSACTION_CHARS = 1 << 20;

export class NftProxier implements Proxier {
  private readonly exec: NftExecutor;
  /** the table this proxier writes (names.ts TABLE unless given) */
  readonly table: string;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly delayMs: number;
  private readonly batchMs: number;
  private readonly maxWaitMs: number;
  private lastChainDeletion = Number.NEGATIVE_INFINITY;
  private applied: Ruleset | null = null;
  private needFull = true;
  /** failed stale-chain deletions since the last successful sync (nftables_cleanup_failures_total) */
  private cleanupFailures = 0;
  private baseChainsRecreated = false;
  /** retired chain → when it was flushed */
  private readonly staleChains = new Map<string, number>();
  /** retired affinity set → when it was flushed (deleted with the chains) */
  private readonly staleSets = new Map<string, number>();
  /** elements removed from the desired table but left in the kernel (set → key → element), deleted with the chains */
  private readonly lingering = new Map<string, Map<string, NftElement>>();
  /** `${set} ${key}` of a lingering element → when it was left */
  private readonly lingeringSince = new Map<string, number>();
  private readonly deferElementDeletes: boolean;
  private lastTransaction = '';
  /** whether the last syncAttempt wrote a partial transaction */
  private lastAttemptPartial = false;
  /** partial transactions refused and repaired by a full sync in the same call (tests, /debug) */
  partialFallbacks = 0;
  /** per-port fragments kept between syncs, so a partial sync replans only what changed */
  readonly planner = new IncrementalPlanner();
  /** what `applied` was assembled from, for dump() in planRuleset's order (fragments: the planner's, at that generation) */
  private appliedParts: { options: NftPlanOptions; generation: number } | null = null;

  /** Services nft refused, left out of the table until they change (modes/isolation.ts) */
  readonly exclusions = new ServiceExclusions();
  /** unsafe VIPs already reported (vip.ts), so each is logged once */
  private skippedVIPs?: SkippedVIPReporter;

  constructor(opts: NftProxierOptions) {
    this.exec = new NftExecutor(opts.runner);
    this.log = opts.log;
    this.now = opts.now ?? Date.now;
    this.delayMs = opts.staleChainDelayMs ?? 1000;
    this.batchMs = opts.staleChainBatchMs ?? 10_000;
    this.maxWaitMs = opts.staleChainMaxWaitMs ?? 60_000;
    this.deferElementDeletes = opts.deferElementDeletes ?? true;
    this.table = opts.table ?? TABLE;
  }

  /** Elements left in the kernel by partial syncs, to be deleted later (tests, /debug). */
  lingeringElements(): LingeringElement[] {
    return [...this.lingering].flatMap(([set, els]) => [...els.values()].map((el) => ({ set, el })));
  }

  private linger(items: LingeringElement[]): void {
    for (const { set, el } of items) {
      const k = elementKey(el.key);
      let m = this.lingering.get(set);
      if (!m) this.lingering.set(set, (m = new Map()));
      m.set(k, el);
      if (!this.lingeringSince.has(`${set} ${k}`)) this.lingeringSince.set(`${set} ${k}`, this.now());
    }
  }

  private unlinger(items: LingeringElement[]): void {
    for (const { set, el } of items) {
      const k = elementKey(el.key);
      this.lingering.get(set)?.delete(k);
      if (this.lingering.get(set)?.size === 0) this.lingering.delete(set);
      this.lingeringSince.delete(`${set} ${k}`);
    }
  }

  /** Lingering elements left at least delayMs ago, and the oldest time among them. */
  private dueLingering(): { items: LingeringElement[]; oldest: number } {
    const out = { items: [] as LingeringElement[], oldest: Infinity };
    for (const item of this.lingeringElements()) {
      const since = this.lingeringSince.get(`${item.set} ${elementKey(item.el.key)}`) ?? this.now();
      if (this.now() - since < this.delayMs) continue;
      out.items.push(item);
      out.oldest = Math.min(out.oldest, since);
    }
    return out;
  }

  /** the text of the last transaction sent to nft (for /debug and tests); '' after a successful one over MAX_KEPT_TRANSACTION_CHARS */
  lastTransactionText(): string {
    return this.lastTransaction;
  }

  private async liveNames(family: NftFamily): Promise<LiveNames | null> {
    const text = await this.exec.listTable(family, this.table);
    // No table: nothing to flush or retire (null would mean "unknown": flush everything).
    if (text === null) return { chains: new Set(), sets: new Map() };
    const rs = parseNftText(text).get(`${family} ${this.table}`);
    if (!rs) return null;
    return { chains: new Set(rs.chains.keys()), sets: new Map([...rs.sets.values()].map((s) => [s.name, s.kind])) };
  }

  /** Chains and affinity sets retired at least delayMs ago that the desired table does not use again. */
  private dueStale(desired: Ruleset): { chains: string[]; sets: string[]; oldest: number } {
    const due = { chains: [] as string[], sets: [] as string[], oldest: Infinity };
    // A chain a lingering element still jumps to goes in a later transaction than the element
    // (a kernel older than 6.2 sees it referenced by an element deleted in the same batch).
    const held = new Set<string>();
    for (const { el } of this.lingeringElements()) {
      const target = lingeringTarget(el);
      if (target !== undefined) held.add(target);
    }
    for (const [map, has, out] of [
      [this.staleChains, (n: string) => desired.chains.has(n), due.chains],
      [this.staleSets, (n: string) => desired.sets.has(n), due.sets],
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

  /**
   * Deletes due retired chains in their own transaction, at most once per batchMs, and only
   * after an idle or full sync or once one has been due maxWaitMs; failures only log.
   */
  private async deleteStaleChains(family: NftFamily, desired: Ruleset, quiet: boolean): Promise<void> {
    if (this.now() - this.lastChainDeletion < this.batchMs) return;
    const rs = { family, table: this.table };
    // Lingering elements first, in their own transaction: the chains they jump to are due only after.
    const els = this.dueLingering();
    if (els.items.length && (quiet || this.now() - els.oldest >= this.delayMs + this.maxWaitMs)) {
      this.lastChainDeletion = this.now();
      this.unlinger(els.items);
      try {
        await this.exec.apply(deleteElementsText(rs, els.items));
      } catch (e) {
        // A full sync (it flushes every set) removes them instead.
        this.log.warn({ err: (e as Error).message, elements: els.items.length }, coded('KPROXY_NFT_STALE_CHAINS', 'could not delete the map elements of removed services; will retry'));
        this.needFull = true;
        this.cleanupFailures++;
        return;
      }
    }
    const due = this.dueStale(desired);
    if (due.chains.length + due.sets.length === 0) return;
    if (!quiet && this.now() - due.oldest < this.delayMs + this.maxWaitMs) return;
    this.lastChainDeletion = this.now();
    this.forgetStale(due);
    try {
      await this.exec.apply(deleteChainsTransaction(rs, due.chains, due.sets));
    } catch (e) {
      // They will be found again by the next full sync's listing and retried.
      this.log.warn({ err: (e as Error).message, chains: due.chains.length, sets: due.sets.length }, coded('KPROXY_NFT_STALE_CHAINS', 'could not delete retired chains; will retry'));
      this.needFull = true;
      this.cleanupFailures++;
    }
  }

  /**
   * One sync. When nft refuses the transaction at lines written by Services, those Services
   * are left out and the sync is retried at once (a bounded number of times), so the others
   * converge in this sync; an error in the fixed part of the table fails the sync.
   */
  async sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    this.exclusions.startSync(changed, full);
    (this.skippedVIPs ??= new SkippedVIPReporter(this.log)).report(full || this.needFull ? input : onlyServices(input, changed));
    let fellBack = false;
    for (let retry = 0; ; retry++) {
      try {
        const stats = await this.syncAttempt({ ...input, state: this.exclusions.filter(input.state) }, changed, full);
        return this.exclusions.size ? { ...stats, excludedServices: this.exclusions.keys() } : stats;
      } catch (e) {
        // A refused partial transaction most likely means the table is not what kproxy last
        // wrote (changed or deleted behind its back: a partial sync has no `add table`);
        // a full sync in the same call repairs it. Only a full sync's refusal isolates Services.
        if (this.lastAttemptPartial && !fellBack && e instanceof NftApplyError) {
          fellBack = true;
          this.partialFallbacks++;
          this.log.warn({ err: (e as Error).message }, coded('KPROXY_NFT_APPLY', 'partial sync refused; running a full sync now'));
          retry--;
          continue;
        }
        if (!(e instanceof NftApplyError) || retry >= MAX_ISOLATION_RETRIES || !this.excludeRefused(e)) throw e;
      }
    }
  }

  /**
   * Excludes the Services whose lines nft refused; false when no refused line is a Service's.
   * `offset`: the lines before this proxier's text in the transaction nft was given (several
   * tables' texts in one `nft -f`, sharded.ts); nft's line numbers count from the whole.
   */
  excludeRefused(e: NftApplyError, offset = 0): boolean {
    const lines = this.lastTransaction.split('\n');
    if (isTransientRefusal(e.result?.stderr ?? '')) return false;
    const errors = (e.result?.stderr ?? '').split('\n').filter((l) => l.includes('Error'));
    let found = false;
    for (const n of e.lineNos) {
      if (n - offset < 1) continue;
      const sp = this.planner.ownerOfLine(lines[n - offset - 1] ?? '');
      if (!sp || this.exclusions.has(sp.serviceKey)) continue;
      found = true;
      const why = errors.find((l) => new RegExp(`:${n}:\\d+`).test(l))?.replace(/^.*?Error: /, '') ?? 'refused';
      const reason = `line ${n}: ${why.trim()}: ${lines[n - offset - 1]}`.slice(0, 500);
      if (this.exclusions.exclude(sp.serviceKey, why)) this.log.warn({ service: sp.serviceKey, line: n }, exclusionMessage(sp.serviceKey, 'nft', reason));
    }
    return found;
  }


  private async syncAttempt(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    const prepared = await this.prepare(input, changed, full);
    if (prepared.tx.ops > 0) {
      try {
        await this.exec.apply(prepared.tx.text);
      } catch (e) {
        this.applyFailed();
        throw e;
      }
    }
    return this.commit(prepared);
  }

  /**
   * The first half of a sync: plans (full, or only the changed Services) and builds the
   * transaction's text without applying it, so a caller can apply several tables' in one
   * `nft -f` (the shards, sharded.ts). `input` is already filtered by the exclusions.
   * `portKeys`: the port keys that may have changed since the last prepare (sharded.ts knows
   * them); a partial plan then looks at those only.
   */
  async prepare(
    input: PlanInput,
    changed: Set<string>,
    full: boolean,
    portKeys?: ReadonlySet<string>,
    /** the table's chain and set names in the kernel, when the caller listed them (sharded.ts: one listing for every table); absent: this proxier lists its table if it needs them */
    knownLive?: LiveNames | null,
  ): Promise<PreparedSync> {
    const fullSync = full || this.needsFull;
    // A full sync plans every port afresh (and so also resets the fragment cache).
    // a shard's table (`kube-proxy-<n>`) is one of several: NftPlanOptions.sharded
    const options = this.table === TABLE ? optionsFromInput(input) : { ...optionsFromInput(input), table: this.table, sharded: true };
    const plan = this.planner.plan(input.state, options, fullSync ? null : changed, portKeys);
    const desired = plan.desired;
    const family = desired.family;

    let tx: Transaction;
    this.lastAttemptPartial = !fullSync;
    /** whether a full transaction deletes every set of the table it does not want */
    let deletesStaleSets = false;
    if (!this.lastAttemptPartial) {
      const live = knownLive !== undefined ? knownLive : await this.liveNames(family);
      deletesStaleSets = live !== null;
      tx = fullTransaction(desired, live, { recreateBaseChains: !this.baseChainsRecreated });
    } else {
      const popts = { lingering: this.lingering, deferRemovals: this.deferElementDeletes };
      // plan.previous: only some ports were replanned; otherwise the options changed (e.g.
      // node addresses): every port was replanned, diff it all.
      tx = plan.previous ? partialTransactionFor(desired, plan.previous, popts) : partialTransaction(desired, this.applied!, popts);
    }
    // nft lists every chain for this transaction's deletes anyway: lingering elements and due
    // retired chains (those no lingering element jumps to) ride along.
    const deletes = this.lastAttemptPartial && /^delete /m.test(tx.text);
    const revived = new Set(tx.revived.map(({ set, el }) => `${set} ${elementKey(el.key)}`));
    const ridingEls = deletes ? this.dueLingering().items.filter(({ set, el }) => !revived.has(`${set} ${elementKey(el.key)}`)) : [];
    const riders = deletes ? this.dueStale(desired) : { chains: [], sets: [] };
    const riding = ridingEls.length + riders.chains.length + riders.sets.length;
    if (riding) {
      const rs = { family, table: this.table };
      const text = tx.text + deleteElementsText(rs, ridingEls) + (riders.chains.length + riders.sets.length ? deleteChainsTransaction(rs, riders.chains, riders.sets) : '');
      tx = { ...tx, text, ops: tx.ops + riding };
    }
    if (tx.ops > 0) this.lastTransaction = tx.text;
    return { tx, desired, options, riders, ridingEls, deletesStaleSets, partial: this.lastAttemptPartial };
  }

  /** Whether the next sync must be a full one (first sync, after a failure). */
  get needsFull(): boolean {
    return this.needFull || !this.applied;
  }

  /** The transaction of a prepared sync was refused (or not applied): the next sync is a full one. */
  applyFailed(): void {
    this.needFull = true;
  }

  /** The second half of a sync, once its transaction is in the kernel: bookkeeping, then the retired chains' deletion (own transactions). */
  async commit(prepared: PreparedSync): Promise<SyncStats> {
    const { tx, desired, options, riders, ridingEls, deletesStaleSets } = prepared;
    const family = desired.family;
    this.forgetStale(riders);
    this.unlinger(ridingEls);
    // A full transaction flushed every set: nothing lingers; a partial one may leave elements.
    if (!prepared.partial) {
      this.lingering.clear();
      this.lingeringSince.clear();
    }
    this.unlinger(tx.revived);
    this.linger(tx.lingering);
    // The full transaction deleted the retired sets itself.
    if (deletesStaleSets) for (const s of this.staleSets.keys()) if (!desired.sets.has(s)) this.staleSets.delete(s);
    // memory: a full transaction at 10,000 Services is tens of MiB of text; it is needed only
    // to name the Services of refused lines, right after a failed apply (excludeRefused)
    if (this.lastTransaction.length > MAX_KEPT_TRANSACTION_CHARS) this.lastTransaction = '';
    this.baseChainsRecreated = true;
    this.needFull = false;
    for (const c of tx.staleChains) {
      if (!this.staleChains.has(c)) this.staleChains.set(c, this.now());
    }
    for (const s of tx.staleSets) {
      if (!this.staleSets.has(s)) this.staleSets.set(s, this.now());
    }
    // Retired chains are tracked in staleChains, not here, so partial syncs diff only live content.
    this.applied = desired;
    this.appliedParts = { options, generation: this.planner.generation };
    this.log.debug({ ops: tx.ops, table: this.table }, tx.summary);
    // After the change is in the kernel, not before: `delete chain` makes nft 1.0.6 list every
    // chain of the table (half a second at 10,000 Services), which must not delay the change.
    // An idle sync (nothing written) or a full one (it listed the table anyway) may delete;
    // a sync that carried a change leaves them, so a stream of changes never waits for it.
    await this.deleteStaleChains(family, desired, tx.ops === 0 || !prepared.partial);
    const cleanupFailures = this.cleanupFailures;
    this.cleanupFailures = 0;
    return { rulesWritten: tx.ops, rulesTotal: this.planner.objectCount, diff: tx.summary, ...(cleanupFailures ? { cleanupFailures } : {}) };
  }

  dump(): string {
    // A partial sync patches the table (new objects last); dump it in the planner's order.
    if (!this.appliedParts || !this.applied) return '';
    // A later attempt that failed has replanned (and patched the table in place): then only
    // the table object is left, in its patched order.
    if (this.appliedParts.generation !== this.planner.generation) return dumpRuleset(this.applied);
    return dumpRuleset(assembleRuleset(this.appliedParts.options, this.planner.fragments()));
  }

  async stop(): Promise<void> {}
}
