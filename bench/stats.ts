// Small pure helpers the scale bench shares: percentiles, formatting, bounded polling.

/** The p-th percentile (0..100) by nearest rank; NaN for no samples. */
export function percentile(xs: number[], p: number): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * s.length);
  return s[Math.min(s.length - 1, Math.max(0, rank - 1))];
}

export function median(xs: number[]): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

/** "123 ms", "4.56 s", "–" for missing values. */
export function fmtMs(ms: number | undefined): string {
  if (ms === undefined || Number.isNaN(ms)) return '–';
  if (!Number.isFinite(ms)) return 'did not finish';
  if (ms >= 10_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms >= 1_000) return `${(ms / 1000).toFixed(2)} s`;
  if (ms >= 10) return `${ms.toFixed(0)} ms`;
  return `${ms.toFixed(2)} ms`;
}

export function fmtMiB(bytes: number | undefined): string {
  if (bytes === undefined || Number.isNaN(bytes)) return '–';
  return `${(bytes / 1024 / 1024).toFixed(0)} MiB`;
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * Calls check() until it returns a value other than undefined or the deadline passes
 * (then undefined). Bounded in time and in attempts.
 */
export async function pollUntil<T>(check: () => Promise<T | undefined>, timeoutMs: number, intervalMs = 5, maxAttempts = 100_000): Promise<T | undefined> {
  const end = performance.now() + timeoutMs;
  for (let i = 0; i < maxAttempts && performance.now() < end; i++) {
    const v = await check();
    if (v !== undefined) return v;
    if (intervalMs > 0) await sleep(intervalMs);
  }
  return undefined;
}
