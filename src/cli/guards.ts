// Process-level supervision of a long-running kproxy: an error that escapes every handler is
// logged with its stack and kproxy keeps running (the kernel rules it wrote keep forwarding,
// the next sync repairs what a failed one left). It exits non-zero only when it cannot go
// on: errors keep escaping faster than it can make progress, which means its own state is
// lost. Rules stay in place either way, as on SIGTERM.
import type { Logger } from '../log.ts';
import { coded, type ErrorCode } from '../errors.ts';

export interface GuardOptions {
  /** escaped errors tolerated within `windowMs` before kproxy gives up (default 20) */
  maxErrors?: number;
  windowMs?: number;
  /** how to give up; process.exit in production, a spy in tests */
  exit?: (code: number) => void;
  now?: () => number;
}

export interface ProcessGuards {
  /** what was caught so far (for tests and /debug) */
  readonly caught: number;
  uninstall(): void;
}

function asError(value: unknown): Error {
  if (value instanceof Error) return value;
  const e = new Error(`non-Error value: ${typeof value === 'string' ? value : safeJson(value)}`);
  return e;
}

function safeJson(value: unknown): string {
  try {
    return String(JSON.stringify(value)).slice(0, 500);
  } catch {
    return String(value);
  }
}

export type EscapedKind = Extract<ErrorCode, 'KPROXY_UNCAUGHT_EXCEPTION' | 'KPROXY_UNHANDLED_REJECTION'>;

/** The policy alone: log each escaped error, give up (exit 1) only on a storm of them. */
export function createErrorGuard(log: Logger, opts: GuardOptions = {}): { onError(kind: EscapedKind, value: unknown): void; readonly caught: number } {
  const maxErrors = opts.maxErrors ?? 20;
  const windowMs = opts.windowMs ?? 60_000;
  const exit = opts.exit ?? ((code: number) => process.exit(code));
  const now = opts.now ?? Date.now;
  const recent: number[] = [];
  let caught = 0;
  let exiting = false;
  return {
    get caught() {
      return caught;
    },
    onError(kind, value) {
      caught++;
      const err = asError(value);
      const t = now();
      recent.push(t);
      while (recent.length && recent[0] <= t - windowMs) recent.shift();
      try {
        log.error({ err, code: kind }, `${kind}: an error escaped every handler (a bug in kproxy; please report it with this stack); kproxy keeps running`);
      } catch {
        process.stderr.write(`kproxy: ${kind}: ${err.stack ?? err.message}\n`);
      }
      if (recent.length > maxErrors && !exiting) {
        exiting = true;
        try {
          log.fatal(
            { code: 'KPROXY_ERROR_STORM', errors: recent.length, windowMs },
            coded(
              'KPROXY_ERROR_STORM',
              `${recent.length} errors escaped within ${windowMs / 1000}s: kproxy's state cannot be trusted, exiting; ` +
                'the kernel rules stay in place for the next start',
            ),
          );
        } finally {
          exit(1);
        }
      }
    },
  };
}

export function installProcessGuards(log: Logger, opts: GuardOptions = {}): ProcessGuards {
  const guard = createErrorGuard(log, opts);
  const onException = (e: unknown) => guard.onError('KPROXY_UNCAUGHT_EXCEPTION', e);
  const onRejection = (e: unknown) => guard.onError('KPROXY_UNHANDLED_REJECTION', e);
  process.on('uncaughtException', onException);
  process.on('unhandledRejection', onRejection);
  return {
    get caught() {
      return guard.caught;
    },
    uninstall() {
      process.off('uncaughtException', onException);
      process.off('unhandledRejection', onRejection);
    },
  };
}
