// Structured logging (pino). One logger per process; components take a child.
import pino from 'pino';

export type Logger = pino.Logger;

export function createLogger(opts: { level?: string; pretty?: boolean } = {}): Logger {
  return pino({ level: opts.level ?? process.env.KPROXY_LOG_LEVEL ?? 'info', base: { app: 'kproxy' } });
}

/** A logger that drops everything, for tests and pure code paths. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
