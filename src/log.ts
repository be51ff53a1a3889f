// Structured logging (pino). One logger per process; components take a child.
//
// Two formats, as upstream's --logging-format: `json` (pino's JSON lines) and `text`
// (klog-like single lines: `I1203 10:00:00.000000    1234 component] "msg" key="value"`).
import pino from 'pino';

export type Logger = pino.Logger;
export type LogFormat = 'json' | 'text';

/** pino's record fields that are not key=value pairs of the message */
const RESERVED = new Set(['level', 'time', 'msg', 'pid', 'hostname', 'app', 'component']);

const pad = (n: number, w = 2) => String(n).padStart(w, '0');

/** One value as klog's text logger writes it: strings quoted (Go %q), numbers and booleans bare. */
function klogValue(v: unknown): string {
  if (typeof v === 'string') return JSON.stringify(v);
  if (typeof v === 'number' || typeof v === 'boolean' || v === null) return String(v);
  const e = v as { message?: unknown; stack?: unknown; type?: unknown } | undefined;
  if (e && typeof e === 'object' && typeof e.message === 'string' && (e.stack !== undefined || e.type !== undefined)) {
    // an error (pino's err serializer): its message, as klog's err="..."
    return JSON.stringify(e.message);
  }
  return JSON.stringify(v) ?? 'undefined';
}

/**
 * One pino JSON record → one klog text line (with its newline):
 * `Lmmdd hh:mm:ss.uuuuuu PID component] "msg" key=value ...`, L = I, W, E or F. klog's
 * file:line is the component the child logger names, else `kproxy`. A line that
 * is not JSON is passed through unchanged.
 */
export function klogLine(json: string, pid = process.pid): string {
  let rec: Record<string, unknown>;
  try {
    rec = JSON.parse(json) as Record<string, unknown>;
  } catch {
    return json.endsWith('\n') ? json : json + '\n';
  }
  const level = typeof rec.level === 'number' ? rec.level : 30;
  const sev = level >= 60 ? 'F' : level >= 50 ? 'E' : level >= 40 ? 'W' : 'I';
  const t = new Date(typeof rec.time === 'number' ? rec.time : Date.now());
  const micros = pad(t.getMilliseconds(), 3) + '000';
  const stamp = `${pad(t.getMonth() + 1)}${pad(t.getDate())} ${pad(t.getHours())}:${pad(t.getMinutes())}:${pad(t.getSeconds())}.${micros}`;
  const where = typeof rec.component === 'string' ? rec.component : 'kproxy';
  const parts = [`${sev}${stamp} ${String(pid).padStart(7)} ${where}] ${JSON.stringify(typeof rec.msg === 'string' ? rec.msg : '')}`];
  for (const [k, v] of Object.entries(rec)) {
    if (RESERVED.has(k) || v === undefined) continue;
    parts.push(`${k}=${klogValue(v)}`);
  }
  return parts.join(' ') + '\n';
}

export interface LoggerOptions {
  level?: string;
  /** `json` (default) or `text` (klog-like lines) */
  format?: LogFormat;
  /** where lines go (default: stdout) */
  dest?: { write(s: string): unknown };
}

export function createLogger(opts: LoggerOptions = {}): Logger {
  const level = opts.level ?? process.env.KPROXY_LOG_LEVEL ?? 'info';
  const base = { app: 'kproxy' };
  if (opts.format === 'text') {
    const out = opts.dest ?? pino.destination({ dest: 1, sync: true });
    return pino({ level, base }, { write: (s: string) => void out.write(klogLine(s)) });
  }
  return opts.dest ? pino({ level, base }, { write: (s: string) => void opts.dest!.write(s) }) : pino({ level, base });
}

/** A logger that drops everything, for tests and pure code paths. */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}
