// ipset: read with `ipset save`, change with `ipset restore` (payload on stdin).
import { ExecError, runChecked, type CommandRunner } from '../runner.ts';
import { parseSave, parseTestAnswers, type IPSetTable } from './model.ts';

const TIMEOUT_MS = 30_000;

export class IPSetExec {
  constructor(private readonly runner: CommandRunner) {}

  /** every set with its entries */
  async save(): Promise<IPSetTable> {
    const r = await runChecked(this.runner, 'ipset', ['save'], { timeoutMs: TIMEOUT_MS });
    return parseSave(r.stdout);
  }

  /**
   * Whether each entry is in its set, as the kernel's set match answers it (a net set holds an
   * address inside one of its nets; a missing set holds nothing). One `ipset -` process (its
   * interactive mode answers every `test` line, where `ipset restore` stops at the first answer)
   * instead of one `ipset test` per entry or `ipset save` of every set.
   */
  async test(questions: Array<{ set: string; entry: string }>): Promise<boolean[]> {
    if (questions.length === 0) return [];
    const input = questions.map((q) => `test ${q.set} ${q.entry}`).join('\n') + '\nquit\n';
    const r = await this.runner.run('ipset', ['-'], { input, timeoutMs: TIMEOUT_MS });
    const answers = r.code === 0 ? parseTestAnswers(r.stderr, questions) : null;
    if (!answers) {
      throw new ExecError('KPROXY_IPVS_IPSET_FAILED', `ipset - (test ${questions.length} entries) failed (exit ${r.code}): ${r.stderr.trim().slice(0, 300)}`, r);
    }
    return answers;
  }

  async restore(script: string): Promise<void> {
    if (!script) return;
    const r = await this.runner.run('ipset', ['restore'], { input: script, timeoutMs: TIMEOUT_MS });
    if (r.code !== 0) throw new ExecError('KPROXY_IPVS_IPSET_FAILED', `ipset restore failed: ${r.stderr.trim()}`, r);
  }

  /**
   * Applies a restore script as far as the kernel lets it. `ipset restore` stops at the
   * first refused line and names it ("Error in line N"); that line is set aside and the
   * script restored again without it, so one bad entry never keeps the others out. A refused `create` takes its set's later lines with it.
   * Throws (KPROXY_IPVS_IPSET_FAILED) only when the failing line cannot be identified or
   * more than `maxRefused` lines are refused.
   */
  async restoreIsolating(script: string, maxRefused = 64): Promise<{ refused: Array<{ line: string; error: string }> }> {
    const refused: Array<{ line: string; error: string }> = [];
    let lines = script.split('\n').filter((l) => l.trim() !== '');
    for (let attempt = 0; lines.length; attempt++) {
      const r = await this.runner.run('ipset', ['restore'], { input: lines.join('\n') + '\n', timeoutMs: TIMEOUT_MS });
      if (r.code === 0) break;
      const m = /Error in line (\d+):\s*(.*)/.exec(r.stderr);
      const at = m ? Number(m[1]) - 1 : -1;
      if (at < 0 || at >= lines.length || attempt >= maxRefused) {
        throw new ExecError('KPROXY_IPVS_IPSET_FAILED', `ipset restore failed: ${r.stderr.trim()}`, r);
      }
      const bad = lines[at];
      const error = m![2].trim();
      refused.push({ line: bad, error });
      const set = bad.trim().split(/\s+/);
      // From the start again, not from the next line: ipset batches the lines of one set,
      // and a line it cannot parse makes it drop the batch before it unsent. Every line is
      // idempotent (-exist), so sending the applied ones again is harmless.
      lines = lines.filter((l, i) => {
        if (i === at) return false;
        const dependent = i > at && set[0] === 'create' && l.trim().split(/\s+/)[1] === set[1];
        if (dependent) refused.push({ line: l, error: `set ${set[1]} could not be created: ${error}` });
        return !dependent;
      });
    }
    return { refused };
  }

  async listNames(): Promise<string[]> {
    const r = await runChecked(this.runner, 'ipset', ['list', '-n'], { timeoutMs: TIMEOUT_MS });
    return r.stdout.split('\n').map((s) => s.trim()).filter(Boolean);
  }

  /**
   * Destroys sets in one `ipset restore`; if that fails (a set still in use), falls back to
   * one by one so that every destroyable set goes and the first real error is thrown.
   */
  async destroyAll(names: string[]): Promise<void> {
    if (!names.length) return;
    const r = await this.runner.run('ipset', ['restore'], { input: names.map((n) => `destroy ${n}`).join('\n') + '\n', timeoutMs: TIMEOUT_MS });
    if (r.code === 0) return;
    const errors: string[] = [];
    for (const n of names) await this.destroy(n).catch((e: Error) => errors.push(e.message));
    if (errors.length) throw new ExecError('KPROXY_IPVS_IPSET_FAILED', errors.join('; '));
  }

  /** destroys a set; a missing set is fine, a set still referenced by a rule is an error */
  async destroy(name: string): Promise<void> {
    const r = await this.runner.run('ipset', ['destroy', name], { timeoutMs: TIMEOUT_MS });
    if (r.code !== 0 && !/does not exist/i.test(r.stderr)) {
      throw new ExecError('KPROXY_IPVS_IPSET_FAILED', `ipset destroy ${name} failed: ${r.stderr.trim()}`, r);
    }
  }
}
