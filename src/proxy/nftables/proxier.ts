// The nftables Proxier: plans the table, writes it in one atomic `nft -f` transaction per
// sync (full on the first sync, after a failure and when asked; otherwise only the
// difference from what it last applied), and retires unused chains a second later.
import type { CommandRunner } from '../../exec/runner.ts';
import { NftExecutor } from '../../exec/nft.ts';
import type { Logger } from '../../log.ts';
import type { PlanInput, Proxier, SyncStats } from '../../modes/types.ts';
import { parseNftText } from '../../modes/nftables/parse.ts';
import { optionsFromInput, planRuleset } from '../../modes/nftables/plan.ts';
import { countObjects, dumpRuleset, type NftFamily, type Ruleset } from '../../modes/nftables/ruleset.ts';
import { deleteChainsTransaction, fullTransaction, partialTransaction, type LiveNames, type Transaction } from '../../modes/nftables/transaction.ts';
import { TABLE } from '../../modes/nftables/names.ts';

export interface NftProxierOptions {
  runner: CommandRunner;
  log: Logger;
  /** clock for retiring stale chains; tests inject one */
  now?: () => number;
  /** how long a retired chain is kept (flushed) before it is deleted */
  staleChainDelayMs?: number;
}

export class NftProxier implements Proxier {
  private readonly exec: NftExecutor;
  private readonly log: Logger;
  private readonly now: () => number;
  private readonly delayMs: number;
  private applied: Ruleset | null = null;
  private needFull = true;
  private baseChainsRecreated = false;
  /** retired chain → when it was flushed */
  private readonly staleChains = new Map<string, number>();
  private lastTransaction = '';

  constructor(opts: NftProxierOptions) {
    this.exec = new NftExecutor(opts.runner);
    this.log = opts.log;
    this.now = opts.now ?? Date.now;
    this.delayMs = opts.staleChainDelayMs ?? 1000;
  }

  /** the text of the last transaction sent to nft (for /debug and tests) */
  lastTransactionText(): string {
    return this.lastTransaction;
  }

  private async liveNames(family: NftFamily): Promise<LiveNames | null> {
    const text = await this.exec.listTable(family, TABLE);
    if (text === null) return null;
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
      this.log.warn({ err: (e as Error).message, chains: due.length }, 'KPROXY_NFT_STALE_CHAINS: could not delete retired chains; will retry');
      this.needFull = true;
    }
  }

  async sync(input: PlanInput, _changed: Set<string>, full: boolean): Promise<SyncStats> {
    const desired = planRuleset(input.state, optionsFromInput(input));
    const family = desired.family;
    await this.deleteStaleChains(family, desired);

    let tx: Transaction;
    if (full || this.needFull || !this.applied) {
      const live = await this.liveNames(family);
      tx = fullTransaction(desired, live, { recreateBaseChains: !this.baseChainsRecreated });
    } else {
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
    this.baseChainsRecreated = true;
    this.needFull = false;
    for (const c of tx.staleChains) {
      if (!this.staleChains.has(c)) this.staleChains.set(c, this.now());
    }
    // Retired chains are tracked in staleChains, not here, so partial syncs diff only live content.
    this.applied = desired;
    this.log.debug({ ops: tx.ops }, tx.summary);
    return { rulesWritten: tx.ops, rulesTotal: countObjects(desired), diff: tx.summary };
  }

  dump(): string {
    return this.applied ? dumpRuleset(this.applied) : '';
  }

  async stop(): Promise<void> {}
}
