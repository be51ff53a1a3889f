// Waiting in tests: a condition polled against a deadline, so an assertion holds on a loaded
// machine without resting on a guessed sleep.

/** A condition: a truthy value ends the wait (and is its result); falsy or a throw means "not yet". */
export type Check<T> = () => T | undefined | null | false | Promise<T | undefined | null | false>;

/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

/**
 * Polls `check` until it returns a truthy value, which it resolves with, or rejects once
 * `timeoutMs` has passed with an error that names `what` (and the last error `check` threw).
 * The first polls come 10, 20, 40 ms apart, so a condition that holds soon is seen soon; then
 * one poll every `stepMs`, so a long wait on a spawned command stays cheap.
 */
export async function waitFor<T>(what: string, check: Check<T>, timeoutMs = 10_000, stepMs = 100): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  const maxPolls = Math.ceil(timeoutMs / stepMs) + 8;
  let last: unknown;
  for (let i = 0; i < maxPolls; i++) {
    try {
      const v = await check();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    const left = deadline - Date.now();
    if (left <= 0) break;
    await sleep(Math.min(stepMs, 10 * 2 ** i, left));
  }
  const why = last === undefined ? '' : ` (last error: ${last instanceof Error ? last.message : String(last)})`;
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${why}`);
}
