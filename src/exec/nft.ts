// The nft executor: applies a transaction with `nft -f -` (payload on stdin, so the whole
// text is one atomic netlink batch: all of it or none of it), reads the live table back with
// `nft list table`, and deletes tables. Errors name the failing line of the transaction.
import { ExecError, type CommandRunner } from './runner.ts';

export type NftFamilyName = 'ip' | 'ip6';

export interface NftExecOptions {
  timeoutMs?: number;
}

/** Thrown when nft rejects a transaction; nothing of it was applied. */
export class NftApplyError extends ExecError {
  constructor(
    message: string,
    readonly lineNo: number | null,
    readonly line: string | null,
    stderr: string,
  ) {
    super('KPROXY_NFT_APPLY', message, { code: 1, stdout: '', stderr });
  }
}

const NOT_FOUND = /No such file or directory|does not exist/;

/** "/dev/stdin:3:24-30: Error: ..." → 3 */
export function failingLine(stderr: string): number | null {
  const m = /(?:\/dev\/stdin|-|<cmdline>):(\d+):\d+/.exec(stderr);
  return m ? parseInt(m[1], 10) : null;
}

export class NftExecutor {
  private readonly timeoutMs: number;

  constructor(
    private readonly runner: CommandRunner,
    opts: NftExecOptions = {},
  ) {
    this.timeoutMs = opts.timeoutMs ?? 30_000;
  }

  /** Fails with KPROXY_EXEC_MISSING when nft is not installed. */
  async version(): Promise<string> {
    const r = await this.runner.run('nft', ['--version'], { timeoutMs: this.timeoutMs });
    if (r.code !== 0) throw new ExecError('KPROXY_EXEC_MISSING', `nft --version failed: ${r.stderr.trim()}; install the nftables package`, r);
    return r.stdout.trim();
  }

  /** Runs the transaction atomically. On failure nothing changed and the error names the line. */
  async apply(transaction: string): Promise<void> {
    const r = await this.runner.run('nft', ['-f', '-'], { input: transaction, timeoutMs: this.timeoutMs });
    if (r.code === 0) return;
    const lineNo = failingLine(r.stderr);
    const line = lineNo !== null ? (transaction.split('\n')[lineNo - 1] ?? null) : null;
    const first = r.stderr.split('\n').find((l) => l.includes('Error')) ?? r.stderr.trim();
    throw new NftApplyError(
      `nft rejected the transaction${lineNo !== null ? ` at line ${lineNo}: ${line}` : ''}: ${first.trim()} (the previous ruleset is unchanged)`,
      lineNo,
      line,
      r.stderr,
    );
  }

  /** `nft list table FAMILY NAME`, or null when the table does not exist. */
  async listTable(family: NftFamilyName, table = 'kube-proxy'): Promise<string | null> {
    const r = await this.runner.run('nft', ['list', 'table', family, table], { timeoutMs: this.timeoutMs });
    if (r.code === 0) return r.stdout;
    if (NOT_FOUND.test(r.stderr)) return null;
    throw new ExecError('KPROXY_EXEC_FAILED', `nft list table ${family} ${table} exited ${r.code}: ${r.stderr.trim()}`, r);
  }

  /** Deletes a table; absence is not an error. */
  async deleteTable(family: NftFamilyName, table = 'kube-proxy'): Promise<boolean> {
    const r = await this.runner.run('nft', ['delete', 'table', family, table], { timeoutMs: this.timeoutMs });
    if (r.code === 0) return true;
    if (NOT_FOUND.test(r.stderr)) return false;
    throw new ExecError('KPROXY_EXEC_FAILED', `nft delete table ${family} ${table} exited ${r.code}: ${r.stderr.trim()}`, r);
  }
}
