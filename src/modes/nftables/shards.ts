// How the nftables mode spreads the Services over several tables at scale: the
// number of tables K for N Services (with hysteresis), their names, a Service's table
// (names.ts shardOf) and the planned tables of a state. Pure; the proxier that applies them
// is src/modes/nftables/proxier.ts.
import type { ProxyState } from '../../core/model.ts';
import { shardOf, shardTable, TABLE } from './names.ts';
import { planRuleset, type NftPlanOptions } from './plan.ts';
import type { Ruleset } from './ruleset.ts';

export interface ShardOptions {
  /** fewer Services than this: one table, upstream's `kube-proxy` (default 1,000) */
  threshold?: number;
  /** Services per table above the threshold (default 600) */
  perTable?: number;
  /** at most this many tables (default 16: every new connection walks every table's base chains) */
  maxTables?: number;
  /** the configuration's nftables.tables: "auto" (this rule) or always that many tables */
  tables?: 'auto' | number;
}

/** The rule's thresholds, all given, and the configured number of tables, if any. */
export type ShardRule = Required<Omit<ShardOptions, 'tables'>> & Pick<ShardOptions, 'tables'>;

export const DEFAULT_SHARDS: Required<ShardOptions> = { threshold: 1000, perTable: 600, maxTables: 16, tables: 'auto' };

/** The number of tables for n Services from scratch. */
function targetTables(n: number, o: ShardRule): number {
  if (n < o.threshold || o.maxTables <= 1) return 1;
  return Math.min(o.maxTables, Math.max(2, Math.ceil(n / o.perTable)));
}

/**
 * The number of tables K for n Services: the one rule render, trace and the proxier share.
 * A number in the configuration (nftables.tables) is K whatever n; "auto" is this rule.
 * `current` is K now (0: a fresh start, which gets what render gets). Hysteresis, so K does
 * not flap around a boundary: up to K > 1 at the threshold, back to 1 only below 80 % of it;
 * in between a change only when the target is at least 1.5× or at most half the current K.
 */
export function chooseTables(n: number, current: number, o: ShardRule): number {
  if (o.tables !== undefined && o.tables !== 'auto') return o.tables;
  const t = targetTables(n, o);
  if (current <= 1) return t;
  if (n < o.threshold * 0.8 || o.maxTables <= 1) return 1;
  // between 80 % of the threshold and the threshold the target is 1, but K stays above 1
  const t2 = Math.min(o.maxTables, Math.max(2, t));
  if (t2 >= current * 1.5 || t2 * 2 <= current) return t2;
  return current;
}

/** Table names of K shards: upstream's single table for K = 1. */
export function shardTables(k: number): string[] {
  return k <= 1 ? [TABLE] : Array.from({ length: k }, (_, i) => shardTable(i));
}

/** The number of Services ("ns/name") of the family in the state. */
export function serviceCount(state: ProxyState, family: 4 | 6): number {
  const keys = new Set<string>();
  for (const sp of state.services.values()) if (sp.family === family) keys.add(sp.serviceKey);
  return keys.size;
}

/**
 * The states of the tables in `which` (default: all k), each holding only its Services (the
 * ServicePort and Endpoint objects shared, so the planners' caches hold). k = 1: the state.
 */
export function splitState(
  state: ProxyState, k: number, shardOfKey: (serviceKey: string) => number = (key) => shardOf(key, k),
  which: readonly number[] = Array.from({ length: Math.max(1, k) }, (_, i) => i),
): Map<number, ProxyState> {
  const out = new Map<number, ProxyState>();
  if (k <= 1) {
    for (const i of which) out.set(i, state);
    return out;
  }
  for (const i of which) out.set(i, { services: new Map(), endpoints: new Map() });
  for (const [key, sp] of state.services) {
    const st = out.get(shardOfKey(sp.serviceKey));
    if (!st) continue;
    st.services.set(key, sp);
    const eps = state.endpoints.get(key);
    if (eps) st.endpoints.set(key, eps);
  }
  return out;
}

/**
 * The tables' states kept across syncs (K > 1): what splitState gives, updated per changed
 * Service instead of cut out of the whole state on every sync (at 50,000 Services that walk,
 * and the Service count, would be most of kproxy's own time for a one-Service change). Each
 * table's maps are updated in place; a Service's ports and endpoint lists are the state's
 * own objects, so the planners' caches hold. Pure.
 */
export class ShardStates {
  private readonly states: ProxyState[] = [];
  /** each Service's port keys in its table's state */
  private readonly keysOf = new Map<string, string[]>();
  /**
   * per table, the port keys changed since its planner last planned it (planned(i)); null:
   * not known (a reset since), the planner looks at every port of the table
   */
  private readonly touched: Array<Set<string> | null> = [];

  constructor(
    readonly k: number,
    private readonly shardOfKey: (serviceKey: string) => number = (key) => shardOf(key, k),
  ) {
    for (let i = 0; i < Math.max(1, k); i++) {
      this.states.push({ services: new Map(), endpoints: new Map() });
      this.touched.push(null);
    }
  }

  /** Table i's port keys changed since planned(i), or undefined when not known (walk them all). */
  touchedIn(i: number): ReadonlySet<string> | undefined {
    return this.touched[i] ?? undefined;
  }

  /** Table i's planner has seen its state as it is now. */
  planned(i: number): void {
    this.touched[i] = new Set();
  }

  /** Table i's state. */
  state(i: number): ProxyState {
    return this.states[i];
  }

  /** The number of Services in the tables. */
  get serviceCount(): number {
    return this.keysOf.size;
  }

  /** Every port of the family's Services in the state, from scratch (O(N): full syncs). */
  reset(state: ProxyState, family: 4 | 6): void {
    for (const st of this.states) {
      st.services.clear();
      st.endpoints.clear();
    }
    this.touched.fill(null);
    this.keysOf.clear();
    for (const [key, sp] of state.services) {
      if (sp.family !== family) continue;
      const st = this.states[this.shardOfKey(sp.serviceKey)];
      if (!st) continue;
      st.services.set(key, sp);
      const eps = state.endpoints.get(key);
      if (eps) st.endpoints.set(key, eps);
      const list = this.keysOf.get(sp.serviceKey);
      if (list) list.push(key);
      else this.keysOf.set(sp.serviceKey, [key]);
    }
  }

  /**
   * The changed Services' ports as the state has them now (`portKeysOf`: their port keys in
   * the state, the node view's servicePorts), O(changed).
   */
  update(state: ProxyState, family: 4 | 6, changed: Iterable<string>, portKeysOf: (serviceKey: string) => Iterable<string> | undefined): void {
    for (const svc of changed) {
      const i = this.shardOfKey(svc);
      const st = this.states[i];
      if (!st) continue;
      const touched = this.touched[i];
      for (const key of this.keysOf.get(svc) ?? []) {
        st.services.delete(key);
        st.endpoints.delete(key);
        touched?.add(key);
      }
      const keys: string[] = [];
      for (const key of portKeysOf(svc) ?? []) {
        const sp = state.services.get(key);
        if (!sp || sp.family !== family || sp.serviceKey !== svc) continue;
        st.services.set(key, sp);
        const eps = state.endpoints.get(key);
        if (eps) st.endpoints.set(key, eps);
        keys.push(key);
        touched?.add(key);
      }
      if (keys.length) this.keysOf.set(svc, keys);
      else this.keysOf.delete(svc);
    }
  }
}

/** The tables the mode writes for a state from scratch (a fresh start's chooseTables), in shard order. */
export function planShardedRulesets(state: ProxyState, o: NftPlanOptions, opts: ShardOptions = {}): Ruleset[] {
  return [...eachShardedRuleset(state, o, opts)];
}

/** planShardedRulesets one table at a time, each planned when it is taken (a dry run holds one table's plan). */
export function* eachShardedRuleset(state: ProxyState, o: NftPlanOptions, opts: ShardOptions = {}): Generator<Ruleset> {
  const k = chooseTables(serviceCount(state, o.family), 0, { ...DEFAULT_SHARDS, ...opts });
  if (k <= 1) {
    yield planRuleset(state, o);
    return;
  }
  const names = shardTables(k);
  for (const [i, st] of splitState(state, k, (key) => shardOf(key, k))) yield planRuleset(st, { ...o, table: names[i], sharded: true });
}

/**
 * Exactly k tables for a state (k = 1: upstream's one `kube-proxy`), in shard order; a
 * Service's table is `shardOfKey` (default names.ts shardOf, as the mode). Tests and the
 * sharded conformance check pick other spreads (every Service in every position).
 */
export function planShards(
  state: ProxyState, o: NftPlanOptions, k: number, shardOfKey: (serviceKey: string) => number = (key) => shardOf(key, k),
): Ruleset[] {
  if (k <= 1) return [planRuleset(state, o)];
  const names = shardTables(k);
  return [...splitState(state, k, shardOfKey).entries()].map(([i, st]) => planRuleset(st, { ...o, table: names[i], sharded: true }));
}
