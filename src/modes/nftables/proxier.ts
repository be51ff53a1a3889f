// The nftables mode's Proxier: the Services of a family spread over K tables, each a
// complete copy of upstream's `kube-proxy` table holding only its Services. The kernel
// validates the whole TABLE on every commit that adds a jump, goto or dnat, so a one-Service
// change into one of K tables validates ~1/K of the graph (docs/benchmarks.md §1,
// "Rule programming vs the number of Services"). K comes from shards.ts chooseTables: K = 1 is upstream's one `kube-proxy` table,
// unchanged; above that the tables are `kube-proxy-0` … `kube-proxy-<K-1>` and a Service's
// table is shardOf(namespace/name, K). A TableWriter per table plans and diffs it; this class
// applies what they prepare as ONE `nft -f`: a partial sync holds only the changed Services'
// tables, a full sync and a reshard (K changed: the new tables written, the old ones deleted)
// every table. When nft refuses it, the line numbers name operations, and their owners the
// Services to leave out (modes/isolation.ts).
import { onlyServices, SkippedVIPReporter } from '../skipped-vips.ts';
import type { CommandRunner } from '../../kernel/runner.ts';
import { erroredLineText, NftApplyError, NftExecutor } from '../../kernel/nft/exec.ts';
import { opAtLine, renderOp, renderOps, type NftFamily, type NftOp } from '../../kernel/nft/model.ts';
import type { Logger } from '../../log.ts';
import type { Proxier, SyncStats } from '../types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import type { ProxyState } from '../../core/model.ts';
import { kubeProxyTableNames, SHARD_TABLE_NAMES, shardOf } from './names.ts';
import { chooseTables, DEFAULT_SHARDS, serviceCount, ShardStates, shardTables, type ShardOptions } from './shards.ts';
import { exclusionMessage, isTransientRefusal, MAX_ISOLATION_RETRIES, ServiceExclusions } from '../isolation.ts';
import { coded } from '../../errors.ts';
import { parseNftText } from './parse.ts';
import { TableWriter, type PreparedSync, type RetireOptions } from './table.ts';
import type { LingeringElement, LiveNames } from './transaction.ts';
import type { IncrementalPlanner } from './incremental.ts';

export interface NftProxierOptions extends RetireOptions {
  runner: CommandRunner;
  log: Logger;
  /** how the Services spread over tables (default DEFAULT_SHARDS) */
  shards?: ShardOptions;
}

/** a successful transaction longer than this is not kept for lastTransactionText() */
export const MAX_KEPT_TRANSACTION_CHARS = 1 << 20;
/** Operations rendered into one part of a transaction's text (~0.5 MB). */
const OPS_PER_PART = 4096;

/** A written table's preparation (TableWriter.prepare), run when the transaction reaches the table. */
interface TablePreparation {
  /** the table's writer */
  i: number;
  /** a partial transaction for the table (else it is written whole) */
  partial: boolean;
  prepare: () => PreparedSync;
}

/**
 * Each line of a transaction: its table's writer (-1: none) and its operation's owner, to name
 * the Services of refused lines (excludeRefused). Kept as runs of lines with the same two
 * (a port's chains, rules and elements come together): a full transaction at 10,000 Services
 * has 280,000 lines and ~50,000 runs.
 */
export class LineOwners {
  /** the first line (0-based) of each run */
  private readonly starts: number[] = [];
  private readonly writers: number[] = [];
  private readonly owners: Array<string | undefined> = [];
  /** lines so far */
  count = 0;

  push(writer: number, owner: string | undefined): void {
    const last = this.starts.length - 1;
    if (last < 0 || this.writers[last] !== writer || this.owners[last] !== owner) {
      this.starts.push(this.count);
      this.writers.push(writer);
      this.owners.push(owner);
    }
    this.count++;
  }

  /** Line n's (1-based) writer and owner; undefined past the end. */
  at(n: number): { writer: number; owner: string | undefined } | undefined {
    const i = n - 1;
    if (i < 0 || i >= this.count) return undefined;
    let lo = 0;
    let hi = this.starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.starts[mid] <= i) lo = mid;
      else hi = mid - 1;
    }
    return { writer: this.writers[lo], owner: this.owners[lo] };
  }
}

/** A table's own lines in a full transaction, beside its Services' (base chains, maps, flushes). */
const TABLE_LINES = 200;
/** Lines a full transaction writes at most per service port and per endpoint. */
const LINES_PER_PORT_OR_ENDPOINT = 6;

/** A full transaction's lines for a table's state, at most (fullTransactionLines). */
function stateLines(state: ProxyState): number {
  let n = state.services.size;
  for (const eps of state.endpoints.values()) n += eps.length;
  return n * LINES_PER_PORT_OR_ENDPOINT;
}

export class NftProxier implements Proxier {
  private readonly exec: NftExecutor;
  private readonly log: Logger;
  private readonly shardOpts: Required<ShardOptions>;
  private writers: TableWriter[] = [];
  /** tables written by earlier syncs (or found at start) that the current K may not use */
  private needTableScan = true;
  /** the operations last sent to nft, to name the Services of refused lines (excludeRefused) */
  private lastOps: NftOp[] = [];
  /** per line of the transaction being applied (dropped once it succeeds), to name the Services of refused lines */
  private lastLines = new LineOwners();
  private lastAttemptPartial = false;
  /** reshards done (tests, /debug) */
  reshards = 0;
  /** partial transactions refused and repaired by a full sync in the same call (tests, /debug) */
  partialFallbacks = 0;
  /** Services nft refused, left out of the tables until they change (modes/isolation.ts) */
  readonly exclusions = new ServiceExclusions();
  /** unsafe VIPs already reported (vip.ts), so each is logged once */
  private skippedVIPs?: SkippedVIPReporter;
  /** shardOf per Service for the current K (sha256 once per Service) */
  private shardMemo = new Map<string, number>();
  /** the tables' states (K > 1), kept across syncs: updated per changed Service */
  private shardStates: ShardStates | null = null;

  constructor(private readonly opts: NftProxierOptions) {
    this.exec = new NftExecutor(opts.runner);
    this.log = opts.log;
    const o = { ...DEFAULT_SHARDS, ...(opts.shards ?? {}) };
    // never a table name that cleanup and the unused-table scan would not find (names.ts)
    this.shardOpts = { ...o, maxTables: Math.min(o.maxTables, SHARD_TABLE_NAMES) };
  }

  /** The current number of tables (0 before the first sync). */
  get shardCount(): number {
    return this.writers.length;
  }

  /** The current tables' names, in shard order. */
  tables(): string[] {
    return this.writers.map((w) => w.table);
  }

  /** The per-table writers, in shard order (tests, /debug). */
  tableWriters(): readonly TableWriter[] {
    return this.writers;
  }

  /** The first table's planner: with K = 1, the table's (tests, benchmarks). */
  get planner(): IncrementalPlanner {
    return this.writers[0].planner;
  }

  /** Elements left in the kernel by partial syncs, every table's (tests, /debug). */
  lingeringElements(): LingeringElement[] {
    return this.writers.flatMap((w) => w.lingeringElements());
  }

  /** the last transaction sent to nft (for /debug and tests); '' after one over MAX_KEPT_TRANSACTION_CHARS */
  lastTransactionText(): string {
    return renderOps(this.lastOps);
  }

  private shardOfKey(key: string): number {
    const k = this.writers.length;
    let s = this.shardMemo.get(key);
    if (s === undefined) {
      s = shardOf(key, k);
      if (this.shardMemo.size >= 1 << 20) this.shardMemo.clear();
      this.shardMemo.set(key, s);
    }
    return s;
  }

  /** K for this sync, from the one rule (chooseTables); a change of K starts new tables. */
  private reshardIfNeeded(input: PlanInput): boolean {
    const family: NftFamily = input.node.family === 6 ? 'ip6' : 'ip';
    // The number of Services: the node view keeps it (its per-Service index); without a view
    // (tests, render-like callers) it is counted.
    const n = input.view ? input.view.servicePorts.size : serviceCount(input.state, input.node.family);
    const k = chooseTables(n, this.writers.length, this.shardOpts);
    if (k === this.writers.length) return false;
    if (this.writers.length) this.reshards++;
    // once per change of K, and at the start only when the Services are spread over several tables
    if (k > 1 || this.writers.length > 1) {
      this.log.info({ family, services: n, from: this.writers.length, tables: k }, `nftables: the ${family} Services are spread over ${k} table(s)`);
    }
    const { runner: _runner, log: _log, shards: _shards, ...retire } = this.opts;
    this.writers = shardTables(k).map((t) => new TableWriter(family, t, this.exec, this.log, retire));
    this.shardMemo.clear();
    this.needTableScan = true;
    this.shardStates = null;
    return true;
  }

  /**
   * Each table's state (K > 1): from scratch on a full sync or a reshard (O(N)), else only
   * the changed Services' ports move (their keys from the node view), O(changed).
   */
  private updateShardStates(input: PlanInput, changed: Set<string>, fromScratch: boolean): void {
    if (this.writers.length <= 1) return;
    const view = input.view;
    if (!this.shardStates || fromScratch || !view) {
      this.shardStates ??= new ShardStates(this.writers.length, (key) => this.shardOfKey(key));
      this.shardStates.reset(input.state, input.node.family);
    } else {
      this.shardStates.update(input.state, input.node.family, changed, (svc) => view.servicePorts.get(svc));
    }
  }

  /**
   * One sync. A refused partial transaction most likely means a table is not what kproxy
   * last wrote (changed or deleted behind its back: a partial sync has no `add table`); a full
   * sync in the same call repairs it. When nft refuses a full transaction at operations owned
   * by Services, those Services are left out and the sync is retried at once (a bounded number
   * of times), so the others converge in this sync; an error in the fixed part fails the sync.
   */
  async sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    let reshard = this.reshardIfNeeded(input);
    this.updateShardStates(input, changed, full || reshard);
    (this.skippedVIPs ??= new SkippedVIPReporter(this.log)).report(full || reshard ? input : onlyServices(input, changed));
    this.exclusions.startSync(changed, full || reshard);
    let fellBack = false;
    for (let retry = 0; ; retry++) {
      try {
        const stats = await this.syncAttempt(input, changed, full || reshard || fellBack);
        return this.exclusions.size ? { ...stats, excludedServices: this.exclusions.keys() } : stats;
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

  /** Excludes the Services whose operations nft refused; false when no refused operation is a Service's. */
  private excludeRefused(e: NftApplyError): boolean {
    const stderr = e.result?.stderr ?? '';
    if (isTransientRefusal(stderr)) return false;
    const errors = stderr.split('\n').filter((l) => l.includes('Error'));
    let found = false;
    for (const n of e.lineNos) {
      const line = this.lastLines.at(n);
      const writer = this.writers[line?.writer ?? -1];
      const owner = line?.owner;
      const sp = owner !== undefined ? writer?.planner.servicePort(owner) : undefined;
      if (!sp || this.exclusions.has(sp.serviceKey)) continue;
      found = true;
      const why = errors.find((l) => new RegExp(`:${n}:\\d+`).test(l))?.replace(/^.*?Error: /, '') ?? 'refused';
      const op = opAtLine(this.lastOps, n);
      const text = erroredLineText(stderr, n) ?? (op ? renderOp(op) : '');
      const reason = `line ${n}: ${why.trim()}: ${text}`.slice(0, 500);
      if (this.exclusions.exclude(sp.serviceKey, why)) this.log.warn({ service: sp.serviceKey, line: n }, exclusionMessage(sp.serviceKey, 'nft', reason));
    }
    return found;
  }

  /**
   * The live chain and set names of `tables` from one listing of the family's names; a table
   * not in the kernel gets empty names (nothing to delete). null when the listing fails or
   * does not parse: each table then lists itself.
   */
  private async liveNamesOf(family: NftFamily, tables: string[]): Promise<Map<string, LiveNames> | null> {
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
  private async unusedTables(family: NftFamily): Promise<string[]> {
    const keep = new Set(this.tables());
    // probed by name: `nft list tables` reads every table whole first (55 s at 10k: nft.ts)
    return this.exec.existingTables(family, kubeProxyTableNames().filter((t) => !keep.has(t)));
  }

  /**
   * Which tables this sync writes: every one for a full sync; otherwise those of the changed
   * Services, or every one when nothing changed (an idle sync retires chains in each).
   */
  private tablesToWrite(changed: Set<string>, full: boolean): number[] {
    if (full || changed.size === 0 || this.writers.some((w) => w.needsFull)) return this.writers.map((_, i) => i);
    return [...new Set([...changed].map((key) => this.shardOfKey(key)))].sort((a, b) => a - b);
  }

  /**
   * Each written table's preparation, run when the transaction reaches it. What a full one
   * needs from the kernel is read first: the chain and set names (to delete what the table no
   * longer wants), for several tables from one listing of the family's names (`nft list
   * chains` and terse sets and maps, 0.4 s at 10,000 in 16 tables), not one `nft list table`
   * per table (each walks the whole family's rules in the kernel: 0.5–1.2 s apiece, 9–12 s for 16).
   */
  private async tablePreparations(input: PlanInput, changed: Set<string>, full: boolean, which: number[]): Promise<TablePreparation[]> {
    const k = this.writers.length;
    const family: NftFamily = input.node.family === 6 ? 'ip6' : 'ip';
    const fullOnes = which.filter((i) => full || this.writers[i].needsFull);
    const known = fullOnes.length >= 2 ? await this.liveNamesOf(family, fullOnes.map((i) => this.writers[i].table)) : null;
    const out: TablePreparation[] = [];
    for (const i of which) {
      const w = this.writers[i];
      const own = k <= 1 ? changed : new Set([...changed].filter((key) => this.shardOfKey(key) === i));
      const knownLive = known?.get(w.table);
      const req = await w.readyToPrepare({ changed: own, full, ...(knownLive !== undefined ? { knownLive } : {}) });
      out.push({
        i,
        partial: !(full || w.needsFull),
        prepare: () => {
          const state = k <= 1 ? input.state : this.shardStates!.state(i);
          // the table's changed port keys: its planner looks at those only (O(changed))
          const portKeys = k <= 1 ? undefined : this.shardStates!.touchedIn(i);
          const prepared = w.prepare({ ...input, state: this.exclusions.filter(state) }, { ...req, portKeys });
          if (k > 1) this.shardStates!.planned(i);
          return prepared;
        },
      });
    }
    return out;
  }

  /**
   * Applies every table's operations, then the unused tables' deletion, as one `nft -f`; returns
   * each table's prepared sync. A full sync's tables are prepared as nft reads the transaction,
   * so kproxy plans a table while nft parses the one before; a partial sync's first, as it
   * may have nothing to write. Memory: a full transaction at 10,000 Services is 33 MB of text
   * and 400,000 operations, neither of which exists whole: nft reads it a few thousand lines at
   * a time, each part rendered when its turn comes, and a rendered operation is dropped; the
   * lines keep only their tables and owners, as runs (LineOwners), until nft accepts them. A
   * table's whole desired table is dropped once its operations are made (PreparedSync keeps
   * a lookup by name).
   */
  private async applyAll(preps: TablePreparation[], drop: string[], family: NftFamily, state: ProxyState): Promise<Map<number, PreparedSync>> {
    const prepared = new Map<number, PreparedSync>();
    const lines = (this.lastLines = new LineOwners());
    /** prepared, not yet rendered */
    let pending: NftOp[] = [];
    /** every operation, while the transaction is small (lastTransactionText) */
    let kept: NftOp[] | null = [];
    this.lastOps = [];
    let chars = 0;
    const add = (op: NftOp, writer: number) => {
      pending.push(op);
      lines.push(writer, op.owner);
    };
    let next = 0;
    const prepareNext = () => {
      const p = preps[next++];
      const x = p.prepare();
      for (const op of x.tx.ops) add(op, p.i);
      prepared.set(p.i, { ...x, tx: { ...x.tx, ops: [] } });
    };
    // `delete table` after the new tables are written: one commit, so a packet sees the old
    // tables or the new ones, never neither.
    let dropped = false;
    const prepareRest = () => {
      while (next < preps.length) prepareNext();
      if (dropped) return;
      dropped = true;
      for (const table of drop) add({ verb: 'delete', in: { family, table }, kind: 'table' }, -1);
    };
    const rendered = function* (): Generator<string> {
      for (let from = 0; from < pending.length; from += OPS_PER_PART) {
        const slice = pending.slice(from, from + OPS_PER_PART);
        const part = renderOps(slice);
        chars += part.length;
        if (kept && chars <= MAX_KEPT_TRANSACTION_CHARS) for (const op of slice) kept.push(op);
        else kept = null;
        yield part;
      }
      pending = [];
    };
    const streamed = !preps.some((p) => p.partial);
    if (!streamed) {
      prepareRest();
      if (lines.count === 0) return prepared;
    }
    let taken = false;
    // Made once, as nft reads it; called again it renders the transaction if it was small
    // (lastTransactionText), else refuses: a refused line's text is in nft's error.
    const parts = function* (): Iterable<string> {
      if (taken) {
        if (!kept) throw new Error('a full transaction over MAX_KEPT_TRANSACTION_CHARS is made once, as nft reads it');
        yield renderOps(kept);
        return;
      }
      taken = true;
      // each table's operations go as soon as it is prepared: nft parses them meanwhile
      while (next < preps.length) {
        prepareNext();
        yield* rendered();
      }
      prepareRest();
      yield* rendered();
    };
    try {
      await this.exec.apply({ parts, lines: streamed ? this.fullTransactionLines(preps, state) : lines.count });
      prepareRest();
      // applied: no line is refused any more
      this.lastLines = new LineOwners();
    } catch (e) {
      for (const i of prepared.keys()) this.writers[i].applyFailed();
      throw e;
    } finally {
      this.lastOps = kept ?? [];
    }
    return prepared;
  }

  /**
   * The lines of a full transaction before it is prepared, for nft's time limit (applyTimeoutMs):
   * at most about 6 per service port and endpoint (10,000 Services × 5 endpoints write 280,000),
   * and the tables' own.
   */
  private fullTransactionLines(preps: TablePreparation[], state: ProxyState): number {
    let n = 0;
    for (const { i } of preps) n += TABLE_LINES + stateLines(this.writers.length <= 1 ? state : this.shardStates!.state(i));
    return n;
  }

  private async syncAttempt(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    const family: NftFamily = input.node.family === 6 ? 'ip6' : 'ip';
    const preps = await this.tablePreparations(input, changed, full, this.tablesToWrite(changed, full));
    this.lastAttemptPartial = preps.some((p) => p.partial);
    // Tables no longer used (a reshard; leftovers of an earlier K or run), as the kernel has
    // them (probed by name), go in the same transaction when every table is written whole.
    const scan = this.needTableScan && !this.lastAttemptPartial;
    const drop = scan ? (await this.unusedTables(family)).sort() : [];
    const prepared = await this.applyAll(preps, drop, family, input.state);
    if (drop.length) this.log.info({ family, tables: drop }, `deleted nftables tables ${drop.join(', ')}`);
    if (scan) this.needTableScan = false;
    return this.commitTables(prepared, drop);
  }

  /** Each written table's bookkeeping, and the sync's statistics. */
  private async commitTables(prepared: Map<number, PreparedSync>, drop: string[]): Promise<SyncStats> {
    const stats: SyncStats = { rulesWritten: drop.length, rulesTotal: 0, tables: this.writers.length };
    const diffs: string[] = [];
    for (const [i, x] of prepared) {
      const s = await this.writers[i].commit(x);
      stats.rulesWritten += s.rulesWritten;
      if (s.cleanupFailures) stats.cleanupFailures = (stats.cleanupFailures ?? 0) + s.cleanupFailures;
      if (s.diff) diffs.push(this.writers.length > 1 ? `${this.writers[i].table}: ${s.diff}` : s.diff);
    }
    for (const w of this.writers) stats.rulesTotal += w.planner.objectCount;
    if (drop.length) diffs.push(`deleted tables ${drop.join(', ')}`);
    stats.diff = diffs.join('; ');
    return stats;
  }

  /** Every table, in shard order (each as upstream's dump of one table). */
  dump(): string {
    return this.writers.map((w) => w.dump()).filter(Boolean).join('\n');
  }

  async stop(): Promise<void> {}
}
