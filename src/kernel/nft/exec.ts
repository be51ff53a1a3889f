// The nft executor: applies a transaction with `nft -f -` (payload on stdin, so the whole
// text is one atomic netlink batch: all of it or none of it), reads the live table back with
// `nft list table`, and deletes tables. Errors name the failing line of the transaction.
import { ExecError, inputText, type CommandRunner, type InputParts } from '../runner.ts';

export type NftFamilyName = 'ip' | 'ip6';

export interface NftExecOptions {
  /** limit of the quick commands (list, delete, version); transactions scale it (applyTimeoutMs) */
  timeoutMs?: number;
}

// A full transaction at 5,000+ services takes tens of seconds in the kernel (docs/
// benchmarks.md), so a fixed limit kills exactly the syncs that are merely large.
const APPLY_BASE_MS = 30_000;
const APPLY_PER_1000_LINES_MS = 1_000;
const APPLY_MAX_MS = 600_000;

/** Time limit of an `nft -f` of `lines` lines: 30 s + 1 s per 1000 lines, at most 10 minutes. */
export function applyTimeoutMs(lines: number, baseMs = APPLY_BASE_MS): number {
  return Math.min(APPLY_MAX_MS, baseMs + Math.ceil(lines / 1000) * APPLY_PER_1000_LINES_MS);
}

/** Thrown when nft was killed at its time limit; nothing of the transaction was applied. */
export class NftTimeoutError extends ExecError {
  constructor(
    readonly limitMs: number,
    readonly lines: number,
    stderr: string,
  ) {
    super(
      'KPROXY_NFT_TIMEOUT',
      `nft did not finish within ${Math.round(limitMs / 1000)}s (transaction of ${lines} lines); the previous ruleset is unchanged; ` +
        'the kernel is slow to load a table this large: reduce the number of services or use a faster node, the next sync retries',
      { code: 128, stdout: '', stderr },
    );
  }
}

/** Thrown when nft rejects a transaction; nothing of it was applied. */
export class NftApplyError extends ExecError {
  constructor(
    message: string,
    readonly lineNo: number | null,
    readonly line: string | null,
    stderr: string,
    /** every line nft names in its errors (it reports all it finds while parsing) */
    readonly lineNos: number[] = lineNo === null ? [] : [lineNo],
  ) {
    super('KPROXY_NFT_APPLY', message, { code: 1, stdout: '', stderr });
  }
}

const NOT_FOUND = /No such file or directory|does not exist/;

/** One named object of a table, for listObjects. */
export interface NftObjectRef {
  kind: 'chain' | 'set' | 'map';
  table: string;
  name: string;
}

/** A table, chain or set name nft takes unquoted (what kproxy and upstream name them). */
const NFT_IDENTIFIER = /^[A-Za-z_.][A-Za-z0-9_.\/:\-\[\]]*$/;

/** "/dev/stdin:3:24-30: Error: ..." → 3 */
export function failingLine(stderr: string): number | null {
  const m = /(?:\/dev\/stdin|-|<cmdline>):(\d+):\d+/.exec(stderr);
  return m ? parseInt(m[1], 10) : null;
}

/** The input line nft shows under its error at line `lineNo` (nft prints it after the error), or null. */
export function erroredLineText(stderr: string, lineNo: number): string | null {
  const lines = stderr.split('\n');
  const re = new RegExp(`(?:/dev/stdin|-|<cmdline>):${lineNo}:\\d+(?:-\\d+)?: Error`);
  const at = lines.findIndex((l) => re.test(l));
  return at >= 0 && at + 1 < lines.length && lines[at + 1] !== '' ? lines[at + 1] : null;
}

/** Line `lineNo` of an input; null when an input in parts cannot be made again (a large one is made once). */
function inputLine(input: string | InputParts, lineNo: number): string | null {
  try {
    return inputText(input).split('\n')[lineNo - 1] ?? null;
  } catch {
    return null;
  }
}

/** Every distinct line number nft's errors name, in order. */
export function failingLines(stderr: string): number[] {
  const out: number[] = [];
  for (const m of stderr.matchAll(/(?:\/dev\/stdin|-|<cmdline>):(\d+):\d+(?:-\d+)?: Error/g)) {
    const n = parseInt(m[1], 10);
    if (!out.includes(n)) out.push(n);
  }
  return out;
}

/** Lines of a transaction text (a last line without its newline counts). */
export function countLines(text: string): number {
  let n = 0;
  for (let i = text.indexOf('\n'); i !== -1; i = text.indexOf('\n', i + 1)) n++;
  return text.endsWith('\n') || text === '' ? n : n + 1;
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

  /**
   * Runs the transaction atomically. On failure nothing changed and the error names the line.
   * A transaction in parts (InputParts: e.g. one table's text each) is built part by part as
   * nft reads it, with its line count given.
   */
  async apply(transaction: string | { parts: InputParts; lines: number }): Promise<void> {
    const lines = typeof transaction === 'string' ? countLines(transaction) : transaction.lines;
    const input = typeof transaction === 'string' ? transaction : transaction.parts;
    const limitMs = applyTimeoutMs(lines, this.timeoutMs);
    const started = Date.now();
    const r = await this.runner.run('nft', ['-f', '-'], { input, timeoutMs: limitMs }).catch((e: unknown) => {
      if (e instanceof ExecError && e.code === 'KPROXY_EXEC_TIMEOUT') throw new NftTimeoutError(limitMs, lines, e.result?.stderr ?? '');
      throw e;
    });
    if (r.code === 0) return;
    // The runner kills at the limit (SIGKILL, reported as 128) and nft then prints nothing.
    if (!r.stderr.includes('Error') && (r.code === 128 || Date.now() - started >= limitMs)) {
      throw new NftTimeoutError(limitMs, lines, r.stderr);
    }
    const lineNo = failingLine(r.stderr);
    const line = lineNo !== null ? (erroredLineText(r.stderr, lineNo) ?? inputLine(input, lineNo)) : null;
    const first = r.stderr.split('\n').find((l) => l.includes('Error')) ?? r.stderr.trim();
    throw new NftApplyError(
      `nft rejected the transaction${lineNo !== null ? ` at line ${lineNo}: ${line}` : ''}: ${first.trim()} (the previous ruleset is unchanged)`,
      lineNo,
      line,
      r.stderr,
      failingLines(r.stderr),
    );
  }

  /**
   * Which of `names` exist as tables of the family, in the order given. One `nft -c -f -` of
   * `create table` lines: nft checks the batch in the kernel without committing, and names every
   * line whose table exists ("File exists"). It reads no table's content, so it costs the same
   * at any size (33 ms with 16 tables of 10,000 Services, where `nft list tables` takes 55 s:
   * nft 1.0.6 fetches every table's chains, rules and sets first, and the kernel's dumps restart
   * per message). Names must be valid nft identifiers.
   */
  async existingTables(family: NftFamilyName, names: readonly string[]): Promise<string[]> {
    if (names.length === 0) return [];
    const input = names.map((n) => `create table ${family} ${n}\n`).join('');
    const r = await this.runner.run('nft', ['-c', '-f', '-'], { input, timeoutMs: this.timeoutMs });
    if (r.code === 0) return [];
    const found = new Set<number>();
    const other: string[] = [];
    for (const m of r.stderr.matchAll(/(?:\/dev\/stdin|-):(\d+):\d+(?:-\d+)?: Error: ([^\n]*)/g)) {
      if (/File exists/.test(m[2])) found.add(parseInt(m[1], 10));
      else other.push(`line ${m[1]}: ${m[2]}`);
    }
    if (other.length || found.size === 0) {
      throw new ExecError('KPROXY_EXEC_FAILED', `nft -c of ${names.length} create table lines (${family}) exited ${r.code}: ${other[0] ?? r.stderr.trim()}`, r);
    }
    return names.filter((_, i) => found.has(i + 1));
  }

  /**
   * The family's chains (declarations, no rules) and sets and maps (terse: no elements), every
   * table's, as nft prints them: what a full sync needs to know which names to delete. Three
   * commands; each costs one walk of the family, where `nft list table` of each of K tables
   * costs K walks of every rule.
   */
  async listNames(family: NftFamilyName): Promise<string> {
    let out = '';
    for (const args of [['list', 'chains', family], ['-t', 'list', 'sets', family], ['-t', 'list', 'maps', family]]) {
      const r = await this.runner.run('nft', args, { timeoutMs: this.timeoutMs });
      if (r.code !== 0) throw new ExecError('KPROXY_EXEC_FAILED', `nft ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`, r);
      out += r.stdout.endsWith('\n') || r.stdout === '' ? r.stdout : `${r.stdout}\n`;
    }
    return out;
  }

  /**
   * Chains, sets and maps by name, each with its rules or elements, as `nft list` prints them
   * (one `table FAMILY NAME { ... }` block per object); an object that does not exist is left
   * out. One `nft -i` process reading the `list` commands from stdin: each command fetches
   * only its own object from the kernel (1.0.6 at 10,000 Services: a few ms each, where
   * `nft list table` of one of 16 tables takes 0.5 s and `nft list ruleset` a minute). One
   * `nft -f` of several `list` commands does not do: nft 1.0.6 keeps one cache filter per
   * batch, the last command's, and the other commands find nothing. Names must be nft
   * identifiers as nft -f takes them unquoted (1.0.6 refuses quoted names here).
   * `numericProtocol` (`nft -p`) prints layer 4 protocols as numbers (`6 . 80`, not `tcp . 80`):
   * nft 1.0.6 names each one through getprotobynumber, which opens /etc/protocols once per
   * element printed (20,000 opens for the service maps of 10,000 Services), a third of the
   * CPU of listing a map; it also prints `meta l4proto 6` in rules, so it suits sets and maps.
   */
  async listObjects(family: NftFamilyName, objects: readonly NftObjectRef[], opts: { numericProtocol?: boolean } = {}): Promise<string> {
    const lines = objects.map((o) => {
      if (!NFT_IDENTIFIER.test(o.table) || !NFT_IDENTIFIER.test(o.name)) {
        throw new ExecError('KPROXY_EXEC_FAILED', `nft list ${o.kind}: ${JSON.stringify(`${o.table} ${o.name}`)} is not a name nft can list`, { code: 1, stdout: '', stderr: '' });
      }
      return `list ${o.kind} ${family} ${o.table} ${o.name}\n`;
    });
    if (!lines.length) return '';
    const r = await this.runner.run('nft', [...(opts.numericProtocol ? ['-p'] : []), '-i'], { input: lines.join(''), timeoutMs: this.timeoutMs });
    // nft -i exits 0 whatever its commands did; each failure is an "Error:" line on stderr.
    const failed = r.stderr.split('\n').filter((l) => l.startsWith('Error:') && !NOT_FOUND.test(l));
    if (r.code !== 0 || failed.length) throw new ExecError('KPROXY_EXEC_FAILED', `nft -i (${lines.length} list commands) exited ${r.code}: ${failed[0] ?? r.stderr.trim()}`, r);
    return r.stdout;
  }

  /** `nft list table FAMILY NAME` (`-a`: with `# handle N` comments), or null when the table does not exist. */
  async listTable(family: NftFamilyName, table = 'kube-proxy', opts: { handles?: boolean } = {}): Promise<string | null> {
    const r = await this.runner.run('nft', [...(opts.handles ? ['-a'] : []), 'list', 'table', family, table], { timeoutMs: this.timeoutMs });
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
