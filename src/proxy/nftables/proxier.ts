// The nftables Proxier: plans the table, writes it in one atomic `nft -f` transaction per
// sync (full on the first sync, after a failure and when asked; otherwise only the
// difference from what it last applied), and retires unused chains a second later.
import { SkippedVIPReporter } from '../skipped-vips.ts';
import type { CommandRunner } from '../../exec/runner.ts';
import { NftApplyError, NftExecutor } from '../../exec/nft.ts';
import type { Logger } from '../../log.ts';
import type { PlanInput, Proxier, SyncStats } from '../../modes/types.ts';
import { parseNftText } from '../../modes/nftables/parse.ts';
import { assembleRuleset, optionsFromInput, type NftPlanOptions, type PortFragment } from '../../modes/nftables/plan.ts';
import { IncrementalPlanner } from '../../modes/nftables/incremental.ts';
import { countObjects, dumpRuleset, type NftFamily, type Ruleset } from '../../modes/nftables/ruleset.ts';
import { deleteChainsTransaction, fullTransaction, partialTransaction, partialTransactionFor, type LiveNames, type Transaction } from '../../modes/nftables/transaction.ts';
import { TABLE } from '../../modes/nftables/names.ts';
import { exclusionMessage, isTransientRefusal, MAX_ISOLATION_RETRIES, ServiceExclusions } from '../../modes/isolation.ts';
import { coded } from '../../errors.ts';

export interface NftProxierOptions {
  runner: CommandRunner;
  log: Logger;
  /** clock for retiring stale chains; tests inject one */
  now?: () => number;
  /** how long a retired chain is kept (flushed) before it is deleted */
  staleChainDelayMs?: number;
}

/** a successful transaction longer than this is not kept for lastTransactionText() */
export const MAX_KEPT_TRANSACTION_CHARS = 1 << 20;

export class NftProxier implements Proxier {
  private readonly exec: NftExecutor;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly delayMs: number;
  private applied: Ruleset | null = null;
  private needFull = true;
  /** failed stale-chain deletions since the last successful sync (nftables_cleanup_failures_total) */
  private cleanupFailures = 0;
  private baseChainsRecreated = false;
  /** retired chain → when it was flushed */
  private readonly staleChains = new Map<string, number>();
  private lastTransaction = '';
  /** per-port fragments kept between syncs, so a partial sync replans only what changed */
  readonly planner = new IncrementalPlanner();
  /** what `applied` was assembled from, for dump() in planRuleset's order */
  private appliedParts: { options: NftPlanOptions; fragments: PortFragment[] } | null = null;

  /** Services nft refused, left out of the table until they change (modes/isolation.ts) */
  readonly exclusions = new ServiceExclusions();
  /** unsafe VIPs already reported (vip.ts), so each is logged once */
  private skippedVIPs?: SkippedVIPReporter;

  constructor(opts: NftProxierOptions) {
    this.exec = new NftExecutor(opts.runner);
    this.log = opts.log;
    this.now = opts.now ?? Date.now;
    this.delayMs = opts.staleChainDelayMs ?? 1000;
  }

  /** the text of the last transaction sent to nft (for /debug and tests); '' after a successful one over MAX_KEPT_TRANSACTION_CHARS */
  lastTransactionText(): string {
    return this.lastTransaction;
  }

  private async liveNames(family: NftFamily): Promise<LiveNames | null> {
    const text = await this.exec.listTable(family, TABLE);
    // No table: nothing to flush or retire (null would mean "unknown": flush everything).
    if (text === null) return { chains: new Set(), sets: new Map() };
    const rs = parseNftText(text).get(`${family} ${TABLE}`);
    if (!rs) return null;
    return { chains: new Set(rs.chains.keys()), sets: new Map([...rs.sets.values()].map((s) => [s.name, s.kind])) };
  }

  /** Deletes chains retired at least delayMs ago, in their own transaction; failures only log. */
  private async deleteStaleChains(family: NftFamily, desired: Ruleset): Promise<void> {
    const due: string[] = [];
    for (const [name, since] of this.staleChains) {
      if (desired.chains.has(name)) this.staleChains.delete(name);
      else if (this.now() - since >= this.delayMs) due.push(name);
    }
    if (due.length === 0) return;
    for (const c of due) this.staleChains.delete(c);
    try {
      await this.exec.apply(deleteChainsTransaction({ family, table: TABLE }, due));
    } catch (e) {
      // They will be found again by the next full sync's listing and retried.
      this.log.warn({ err: (e as Error).message, chains: due.length }, coded('KPROXY_NFT_STALE_CHAINS', 'could not delete retired chains; will retry'));
      this.needFull = true;
      this.cleanupFailures++;
    }
  }

  /**
   * One sync. When nft refuses the transaction at lines written by Services, those Services
   * are left out and the sync is retried at once (a bounded number of times), so the others
   * converge now; an error in the fixed part of the table fails the sync as before.
   */
  async sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    this.exclusions.startSync(changed, full);
    (this.skippedVIPs ??= new SkippedVIPReporter(this.log)).report(input);
    for (let retry = 0; ; retry++) {
      try {
        const stats = await this.syncAttempt({ ...input, state: this.exclusions.filter(input.state) }, changed, full);
        return this.exclusions.size ? { ...stats, excludedServices: this.exclusions.keys() } : stats;
      } catch (e) {
        if (!(e instanceof NftApplyError) || retry >= MAX_ISOLATION_RETRIES || !this.excludeRefused(e)) throw e;
      }
    }
  }

  /** Excludes the Services whose lines nft refused; false when no refused line is a Service's. */
  private excludeRefused(e: NftApplyError): boolean {
    const lines = this.lastTransaction.split('\n');
    if (isTransientRefusal(e.result?.stderr ?? '')) return false;
    const errors = (e.result?.stderr ?? '').split('\n').filter((l) => l.includes('Error'));
    let found = false;
    for (const n of e.lineNos) {
      const sp = this.planner.ownerOfLine(lines[n - 1] ?? '');
      if (!sp || this.exclusions.has(sp.serviceKey)) continue;
      found = true;
      const why = errors.find((l) => new RegExp(`:${n}:\\d+`).test(l))?.replace(/^.*?Error: /, '') ?? 'refused';
      const reason = `line ${n}: ${why.trim()}: ${lines[n - 1]}`.slice(0, 500);
      if (this.exclusions.exclude(sp.serviceKey, why)) this.log.warn({ service: sp.serviceKey, line: n }, exclusionMessage(sp.serviceKey, 'nft', reason));
    }
    return found;
  }


  private async syncAttempt(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    const fullSync = full || this.needFull || !this.applied;
    // A full sync plans every port afresh (and so also resets the fragment cache).
    const options = optionsFromInput(input);
    let plan = this.planner.plan(input.state, options, fullSync ? null : changed);
    await this.deleteStaleChains(plan.desired.family, plan.desired);
    // A failed deletion asks for a full sync: plan it afresh, as every full sync is.
    if (!fullSync && this.needFull) plan = this.planner.plan(input.state, options, null);
    const desired = plan.desired;
    const family = desired.family;

    let tx: Transaction;
    if (fullSync || this.needFull || !this.applied) {
      const live = await this.liveNames(family);
      tx = fullTransaction(desired, live, { recreateBaseChains: !this.baseChainsRecreated });
    } else if (plan.previous) {
      tx = partialTransactionFor(desired, plan.previous);
    } else {
      // The options changed (e.g. node addresses): every port was replanned, diff it all.
      tx = partialTransaction(desired, this.applied);
    }
    if (tx.ops > 0) {
      this.lastTransaction = tx.text;
      try {
        await this.exec.apply(tx.text);
      } catch (e) {
        this.needFull = true;
        throw e;
      }
    }
    // memory: a full transaction at 10,000 Services is tens of MiB of text; it is needed only
    // to name the Services of refused lines, right after a failed apply (excludeRefused)
    if (this.lastTransaction.length > MAX_KEPT_TRANSACTION_CHARS) this.lastTransaction = '';
    this.baseChainsRecreated = true;
    this.needFull = false;
    for (const c of tx.staleChains) {
      if (!this.staleChains.has(c)) this.staleChains.set(c, this.now());
    }
    // Retired chains are tracked in staleChains, not here, so partial syncs diff only live content.
    this.applied = desired;
    this.appliedParts = { options, fragments: this.planner.fragments() };
    this.log.debug({ ops: tx.ops }, tx.summary);
    const cleanupFailures = this.cleanupFailures;
    this.cleanupFailures = 0;
    return { rulesWritten: tx.ops, rulesTotal: countObjects(desired), diff: tx.summary, ...(cleanupFailures ? { cleanupFailures } : {}) };
  }

  dump(): string {
    // A partial sync patches the table (new objects last); dump it in the planner's order.
    return this.appliedParts ? dumpRuleset(assembleRuleset(this.appliedParts.options, this.appliedParts.fragments)) : '';
  }

  async stop(): Promise<void> {}
}
