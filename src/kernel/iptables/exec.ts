// The iptables executor: the only code that runs iptables binaries, for every mode that uses
// iptables (iptables, ipvs, userspace). The host part of the iptables package.
// Payloads go to iptables-restore on stdin (--noflush: other chains are left alone;
// --counters: counters are kept; -w: wait for the xtables lock). A restore is atomic: when
// it fails nothing changed, and the error names the failing line with context around it.
import { ExecError, inputText, type CommandRunner, type InputParts, type RunResult } from '../runner.ts';
import type { ErrorCode } from '../../errors.ts';
import type { Family, Table } from './save.ts';

export type { Family, Table };

export type IptablesBackend = 'nf_tables' | 'legacy' | 'unknown';

const WAIT = ['-w', '5'];
const TIMEOUT_MS = 60_000;
const RESTORE_MS_PER_1000_LINES = 3_000;
const RESTORE_MAX_TIMEOUT_MS = 600_000;

/**
 * The time limit of one iptables-restore: 60 s + 3 s per 1000 payload lines, at most 10
 * minutes. The nf_tables backend's --noflush restore grows faster than linearly: a
 * 5000-service full sync (~135k lines) took 276 s on the shared bench machine, which a
 * fixed 60 s (or 1 s per 1000 lines) killed; a 10k-service one (~270k lines) hits the cap.
 */
export function restoreTimeoutMs(lines: number): number {
  return Math.min(RESTORE_MAX_TIMEOUT_MS, TIMEOUT_MS + Math.ceil(lines / 1000) * RESTORE_MS_PER_1000_LINES);
}

/** Lines of a payload (a trailing newline does not start one more). */
function countLines(payload: string): number {
  let n = 0;
  for (let i = payload.indexOf('\n'); i >= 0; i = payload.indexOf('\n', i + 1)) n++;
  return payload.length && !payload.endsWith('\n') ? n + 1 : n;
}

export function binaries(family: Family): { iptables: string; save: string; restore: string } {
  return family === 6
    ? { iptables: 'ip6tables', save: 'ip6tables-save', restore: 'ip6tables-restore' }
    : { iptables: 'iptables', save: 'iptables-save', restore: 'iptables-restore' };
}

/** Lines `line-context .. line+context` of a payload, numbered, the failing one marked. */
export function extractLines(payload: string, line: number, context = 3): string {
  const lines = payload.split('\n');
  const from = Math.max(1, line - context);
  const to = Math.min(lines.length, line + context);
  const out: string[] = [];
  for (let i = from; i <= to; i++) out.push(`${i === line ? '>' : ' '} ${String(i).padStart(5)}: ${lines[i - 1]}`);
  return out.join('\n');
}

/** The failing line number in iptables-restore's error output, if it says. */
export function failedLine(stderr: string): number | null {
  const m = /line:? (\d+)/i.exec(stderr);
  return m ? Number(m[1]) : null;
}

export class RestoreError extends ExecError {
  constructor(
    readonly line: number | null,
    message: string,
    result?: RunResult,
    code: ErrorCode = 'KPROXY_IPTABLES_RESTORE_FAILED',
  ) {
    super(code, message, result);
  }
}

/** A run the runner killed at its time limit, as the result the restore paths interpret. */
function killedAtLimit(e: unknown): RunResult {
  if (e instanceof ExecError && e.code === 'KPROXY_EXEC_TIMEOUT') return e.result ?? { code: 128, stdout: '', stderr: '' };
  throw e;
}

/** A payload made a part at a time as iptables-restore reads it, with its line count (the time limit). */
export interface RestoreParts {
  lines: number;
  /** called again for a refused restore's error context */
  parts: InputParts;
}

export class IptablesExecutor {
  readonly bin: ReturnType<typeof binaries>;

  constructor(
    private readonly runner: CommandRunner,
    readonly family: Family,
  ) {
    this.bin = binaries(family);
  }

  /**
   * Applies a multi-table payload atomically; throws RestoreError with context on failure.
   * A payload in parts reaches iptables-restore as it is made (a full sync's text never
   * exists whole); if making a part fails, the runner kills the restore before it reads a
   * shortened payload's end, and nothing is applied.
   */
  async restore(payload: string | RestoreParts): Promise<void> {
    const lines = typeof payload === 'string' ? countLines(payload) : payload.lines;
    const input = typeof payload === 'string' ? payload : payload.parts;
    const timeoutMs = restoreTimeoutMs(lines);
    const started = Date.now();
    const r = await this.runner.run(this.bin.restore, [...WAIT, '--noflush', '--counters'], { input, timeoutMs }).catch(killedAtLimit);
    if (r.code === 0) return;
    // The runner kills at the limit (KPROXY_EXEC_TIMEOUT, or code 128 from a runner that only
    // kills) and says nothing about the payload: say it here.
    if (r.code === 128 && Date.now() - started >= timeoutMs - 50) {
      throw new RestoreError(
        null,
        `${this.bin.restore} did not finish within ${Math.round(timeoutMs / 1000)}s (payload of ${lines} lines); the previous rules stay in place; ` +
          'the next sync retries with a full sync. A restore this slow usually means a very large ruleset on the nf_tables backend: ' +
          'consider the legacy backend (update-alternatives) or the nftables mode.',
        r,
        'KPROXY_IPTABLES_RESTORE_TIMEOUT',
      );
    }
    const line = failedLine(r.stderr);
    const where = line ? `; around line ${line}:\n${extractLines(inputText(input), line)}` : '';
    throw new RestoreError(line, `${this.bin.restore} failed (exit ${r.code}): ${r.stderr.trim()}${where}`, r);
  }

  /**
   * Restores a payload that owns its chains (`--noflush`, no counters): the IPVS mode's
   * masquerade chains, the userspace mode's redirects, cleanup scripts. A refusal throws
   * ExecError with the caller's code and iptables-restore's stderr.
   */
  async restoreOwned(payload: string, code: ErrorCode = 'KPROXY_IPTABLES_RESTORE_FAILED', timeoutMs = TIMEOUT_MS): Promise<void> {
    const r = await this.runner.run(this.bin.restore, [...WAIT, '--noflush'], { input: payload, timeoutMs });
    if (r.code !== 0) throw new ExecError(code, `${this.bin.restore} failed: ${r.stderr.trim()}`, r);
  }

  /**
   * iptables-save of one table, or null when it cannot be read (no such table: the module is
   * not loaded). A missing binary still throws KPROXY_EXEC_MISSING.
   */
  async saveIfReadable(table: Table): Promise<string | null> {
    const r = await this.runner.run(this.bin.save, ['-t', table], { timeoutMs: TIMEOUT_MS });
    return r.code === 0 ? r.stdout : null;
  }

  async save(table: Table): Promise<string> {
    const r = await this.runner.run(this.bin.save, ['-t', table], { timeoutMs: TIMEOUT_MS });
    if (r.code !== 0) throw new ExecError('KPROXY_IPTABLES_SAVE_FAILED', `${this.bin.save} -t ${table} exited ${r.code}: ${r.stderr.trim()}`, r);
    return r.stdout;
  }

  /** iptables-save of every table the kernel has (one command). */
  async saveAll(): Promise<string> {
    const r = await this.runner.run(this.bin.save, [], { timeoutMs: TIMEOUT_MS });
    if (r.code !== 0) throw new ExecError('KPROXY_IPTABLES_SAVE_FAILED', `${this.bin.save} exited ${r.code}: ${r.stderr.trim()}`, r);
    return r.stdout;
  }

  /**
   * One chain as `iptables -t TABLE -S CHAIN` prints it (`-P`/`-N` then `-A` lines), or null
   * when it cannot be read (no such chain or table). On the nf_tables backend this asks the
   * kernel for that chain alone; legacy iptables reads the whole table for it.
   */
  async listChain(table: Table, chain: string): Promise<string | null> {
    const r = await this.run(['-t', table, '-S', chain]);
    return r.code === 0 ? r.stdout : null;
  }

  /**
   * Which kernel backend this family's iptables binaries use, from `iptables --version`
   * ("iptables v1.8.9 (nf_tables)" or "(legacy)"); 'unknown' when it does not say.
   */
  async backend(): Promise<IptablesBackend> {
    try {
      const r = await this.runner.run(this.bin.iptables, ['--version'], { timeoutMs: 10_000 });
      const text = r.stdout + r.stderr;
      return /\(nf_tables\)/.test(text) ? 'nf_tables' : /\(legacy\)/.test(text) ? 'legacy' : 'unknown';
    } catch {
      return 'unknown';
    }
  }

  private run(args: string[]): Promise<RunResult> {
    return this.runner.run(this.bin.iptables, [...WAIT, ...args], { timeoutMs: TIMEOUT_MS });
  }

  async ensureChain(table: Table, chain: string): Promise<void> {
    const r = await this.run(['-t', table, '-N', chain]);
    if (r.code !== 0 && !/exists/i.test(r.stderr)) {
      throw new ExecError('KPROXY_IPTABLES_FAILED', `${this.bin.iptables} -t ${table} -N ${chain}: ${r.stderr.trim()}`, r);
    }
  }

  async chainExists(table: Table, chain: string): Promise<boolean> {
    const r = await this.run(['-t', table, '-S', chain]);
    return r.code === 0;
  }

  /** Inserts the rule at the top of `chain` unless an identical rule exists (iptables -C). */
  async ensureRulePrepended(table: Table, chain: string, args: string[]): Promise<boolean> {
    const check = await this.run(['-t', table, '-C', chain, ...args]);
    if (check.code === 0) return false;
    const r = await this.run(['-t', table, '-I', chain, ...args]);
    if (r.code !== 0) throw new ExecError('KPROXY_IPTABLES_FAILED', `${this.bin.iptables} -t ${table} -I ${chain} ${args.join(' ')}: ${r.stderr.trim()}`, r);
    return true;
  }

  /** Deletes every copy of a rule (at most `max`); absence is fine. */
  async deleteRuleCopies(table: Table, chain: string, args: string[], max = 4): Promise<void> {
    for (let i = 0; i < max; i++) if ((await this.run(['-t', table, '-D', chain, ...args])).code !== 0) return;
  }

  /** Flushes then deletes chains (all flushed first, so jumps between them go first); absence is fine. */
  async deleteChains(table: Table, chains: string[]): Promise<void> {
    for (const c of chains) await this.run(['-t', table, '-F', c]);
    for (const c of chains) await this.run(['-t', table, '-X', c]);
  }

  /** Deletes one rule; a rule or chain that is not there is fine. */
  async deleteRule(table: Table, chain: string, args: string[]): Promise<void> {
    await this.run(['-t', table, '-D', chain, ...args]);
  }
}
