// The iptables executor: the only code that runs iptables binaries for the iptables mode.
// Payloads go to iptables-restore on stdin (--noflush: other chains are left alone;
// --counters: counters are kept; -w: wait for the xtables lock). A restore is atomic: when
// it fails nothing changed, and the error names the failing line with context around it.
import { ExecError, type CommandRunner, type RunResult } from './runner.ts';
import { tokenize } from '../modes/iptables/parse.ts';
import type { ErrorCode } from '../errors.ts';

export type Family = 4 | 6;
export type Table = 'filter' | 'nat' | 'mangle';

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

/** Chain names declared in iptables-save output of one table (upstream's GetChainsFromTable). */
export function chainsFromSave(text: string, table: Table = 'nat'): Set<string> {
  const chains = new Set<string>();
  let inTable = false;
  for (const line of text.split('\n')) {
    if (line.startsWith('*')) inTable = line.slice(1).trim() === table;
    else if (inTable && line.startsWith(':')) chains.add(line.slice(1).split(' ')[0]);
    else if (line === 'COMMIT') inTable = false;
  }
  return chains;
}

/**
 * Splits an iptables-save rule line into arguments with the project's one iptables
 * tokenizer (src/modes/iptables/parse.ts: double quotes group, backslash escapes, as
 * iptables-restore reads them); a line with an unterminated quote splits on whitespace.
 */
export function splitRuleArgs(line: string): string[] {
  return tokenize(line)?.words ?? line.split(/\s+/).filter((w) => w !== '');
}

/** A run the runner killed at its time limit, as the result the restore paths interpret. */
function killedAtLimit(e: unknown): RunResult {
  if (e instanceof ExecError && e.code === 'KPROXY_EXEC_TIMEOUT') return e.result ?? { code: 128, stdout: '', stderr: '' };
  throw e;
}

export class IptablesExecutor {
  readonly bin: ReturnType<typeof binaries>;

  constructor(
    private readonly runner: CommandRunner,
    readonly family: Family,
  ) {
    this.bin = binaries(family);
  }

  /** Applies a full multi-table payload atomically; throws RestoreError with context on failure. */
  async restore(payload: string): Promise<void> {
    const lines = countLines(payload);
    const timeoutMs = restoreTimeoutMs(lines);
    const started = Date.now();
    const r = await this.runner.run(this.bin.restore, [...WAIT, '--noflush', '--counters'], { input: payload, timeoutMs }).catch(killedAtLimit);
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
    const where = line ? `; around line ${line}:\n${extractLines(payload, line)}` : '';
    throw new RestoreError(line, `${this.bin.restore} failed (exit ${r.code}): ${r.stderr.trim()}${where}`, r);
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

  /** Deletes one rule; a rule or chain that is not there is fine. */
  async deleteRule(table: Table, chain: string, args: string[]): Promise<void> {
    await this.run(['-t', table, '-D', chain, ...args]);
  }
}
