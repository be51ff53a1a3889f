// Keeping the process's peak memory down and giving memory back after a big full sync.
//
// Where the peak comes from (10,000 Services × 5 endpoints, iptables, manifests source; the
// VmHWM at each step, docs/benchmarks.md §5):
//  1. the load: parsing leaves ~150 MB of garbage behind ~55 MB kept, and V8 grows the old
//     generation by up to 4× what survived its last collection while allocation is fast, so
//     the heap reaches ~230 MB before a collection frees it: boundHeapGrowth;
//  2. the first full sync: its plan (every Service's rule text, the restore payloads) is
//     live at once, ~100 MB on top of the ~60 MB kept;
//  3. a compacting collection after the sync copied the ~100 MB that survive it into fresh
//     pages before freeing the old ones, 50–85 MB above the sync's own peak: the collection
//     after a sync is a plain one (collectGarbagePlain).
//
// V8 exposes a gc() function only with --expose-gc; setting the flag at run time and reading
// `gc` from a fresh context gives the same function without changing how kproxy is started.
import { getHeapSpaceStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/**
 * V8's old generation may grow to this percentage above what survived its last full
 * collection before it collects again (--heap-growing-percent; V8 picks 10–300 % by itself,
 * the most while allocation is fast, as in a load or a full sync). 20 %: the load's peak at
 * 10,000 Services drops from ~300 to ~180 MB.
 */
export const HEAP_GROWING_PERCENT = 20;

/** Caps V8's heap growth for this process (see HEAP_GROWING_PERCENT); false when the runtime refuses the flag. */
export function boundHeapGrowth(percent = HEAP_GROWING_PERCENT): boolean {
  try {
    setFlagsFromString(`--heap-growing-percent=${percent}`);
    return true;
  } catch {
    return false;
  }
}

let gcFn: (() => void) | null | undefined;

function gcFunction(): (() => void) | null {
  if (gcFn !== undefined) return gcFn;
  const g = (globalThis as { gc?: unknown }).gc;
  if (typeof g === 'function') return (gcFn = g as () => void);
  try {
    setFlagsFromString('--expose-gc');
    const f = runInNewContext('gc') as unknown;
    gcFn = typeof f === 'function' ? (f as () => void) : null;
  } catch {
    gcFn = null;
  }
  return gcFn;
}

/**
 * Runs one full garbage collection; false when this runtime offers none (nothing happened).
 * Not a compacting one: compaction copies every survivor into fresh pages before it frees the
 * old ones, which after a first sync at 10,000 Services raised the process's high-water mark
 * by 50–85 MB, for ~30 MB less RSS afterwards. The pages a plain collection frees are reused
 * by the next allocations.
 */
export function collectGarbage(): boolean {
  const gc = gcFunction();
  if (!gc) return false;
  gc();
  return true;
}

/**
 * When a sync is worth a collection afterwards: a successful full sync of a big ruleset
 * (a small cluster's garbage is not worth blocking the event loop for), at most once per
 * `minIntervalMs` so a flapping cluster cannot turn every sync into a stop-the-world pause.
 */
export class GarbageAfterSync {
  private lastAt = -Infinity;

  constructor(
    private readonly o: { minRules?: number; minIntervalMs?: number; minObjects?: number; now?: () => number; collect?: () => boolean } = {},
  ) {}

  /** What the process holds, in MiB: for the log line after a collection. */
  static usage(): Record<string, number> {
    const m = process.memoryUsage();
    const mib = (b: number) => Math.round(b / 2 ** 17) / 8;
    const spaces = Object.fromEntries(getHeapSpaceStatistics().map((s) => [s.space_name, mib(s.space_size)]));
    return { rss: mib(m.rss), heapTotal: mib(m.heapTotal), heapUsed: mib(m.heapUsed), external: mib(m.external), arrayBuffers: mib(m.arrayBuffers), ...spaces };
  }

  /**
   * Collects once the sources have delivered their first state, when it is big
   * (`minObjects` Services and EndpointSlices or more). Loading leaves its garbage behind (the
   * parsed manifest documents or list responses: at 10,000 Services × 5 endpoints ~120 MB of
   * heap besides the ~65 MB kept) in a heap V8 has just grown to hold it; the first full sync
   * then builds its plan on top of that unless the garbage is freed first (measured: the
   * high-water mark at the first sync 359 → ~300 MB, iptables, manifests source).
   */
  afterLoad(objects: number): boolean {
    if (objects < (this.o.minObjects ?? 5_000)) return false;
    return (this.o.collect ?? collectGarbage)();
  }

  /** Collects now when the sync qualifies; true when it did. */
  afterSync(sync: { ok: boolean; full: boolean; rulesTotal?: number }): boolean {
    const minRules = this.o.minRules ?? 20_000;
    if (!sync.ok || !sync.full || (sync.rulesTotal ?? 0) < minRules) return false;
    const now = (this.o.now ?? Date.now)();
    if (now - this.lastAt < (this.o.minIntervalMs ?? 10 * 60_000)) return false;
    this.lastAt = now;
    return (this.o.collect ?? collectGarbage)();
  }
}
