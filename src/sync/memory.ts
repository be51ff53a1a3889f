// Giving memory back after a big full sync. A first full sync at 10,000 Services builds the
// whole ruleset text, its restore input and the tool's output: 150+ MiB of garbage that V8
// would otherwise keep committed (the old generation only shrinks after a full mark-compact,
// which an idle proxy may not run for a long time), so the process's RSS after the first sync
// stays near its peak. One full collection right after such a sync returns those pages to the
// OS (docs/benchmarks.md §1, "Rule programming vs the number of Services": the measured effect per mode).
//
// V8 exposes a gc() function only with --expose-gc; setting the flag at run time and reading
// `gc` from a fresh context gives the same function without changing how kproxy is started.
import { getHeapSpaceStatistics, setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

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
 * Runs one full, compacting garbage collection; false when this runtime offers none (nothing
 * happened). Compacting: a plain full collection frees objects but keeps every page that
 * still holds one live object, and after a first sync most pages hold a few survivors among
 * the garbage; moving them together lets V8 return the emptied pages (measured: ~20 % less
 * committed heap on a fragmented heap).
 *
 * A plain full collection goes first: compaction copies the survivors of every page into
 * fresh pages before it frees the old ones, and with a full sync's garbage still around those
 * fresh pages came on top of the sync's peak (10,000 Services, iptables: the process's
 * high-water mark rose by 60–80 MB during the collection). Once the plain collection has freed
 * the garbage, the copies go into its space.
 */
export function collectGarbage(): boolean {
  const gc = gcFunction();
  if (!gc) return false;
  gc();
  let compacting = false;
  try {
    setFlagsFromString('--compact-on-every-full-gc');
    compacting = true;
  } catch {
    /* a runtime without the flag: a plain full collection */
  }
  try {
    gc();
  } finally {
    if (compacting) setFlagsFromString('--no-compact-on-every-full-gc');
  }
  return true;
}

/**
 * One plain full collection (no compaction: quick, and it needs no fresh pages); false when
 * this runtime offers none.
 */
export function collectGarbagePlain(): boolean {
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
    private readonly o: { minRules?: number; minIntervalMs?: number; minObjects?: number; now?: () => number; collect?: () => boolean; collectPlain?: () => boolean } = {},
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
   * high-water mark at the first sync 359 → ~300 MB, iptables, manifests source). A plain
   * collection: there is nothing to give back yet, only room to reuse.
   */
  afterLoad(objects: number): boolean {
    if (objects < (this.o.minObjects ?? 5_000)) return false;
    return (this.o.collectPlain ?? collectGarbagePlain)();
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
