// ipset: read with `ipset save`, change with `ipset restore` (payload on stdin).
import { ExecError, runChecked, type CommandRunner } from './runner.ts';
import { parseSave, type IPSetTable } from '../modes/ipvs/ipsets.ts';

const TIMEOUT_MS = 30_000;

export class IPSetExec {
  constructor(private readonly runner: CommandRunner) {}

  /** every set with its entries */
  async save(): Promise<IPSetTable> {
    const r = await runChecked(this.runner, 'ipset', ['save'], { timeoutMs: TIMEOUT_MS });
    return parseSave(r.stdout);
  }

  async restore(script: string): Promise<void> {
    if (!script) return;
    const r = await this.runner.run('ipset', ['restore'], { input: script, timeoutMs: TIMEOUT_MS });
    if (r.code !== 0) throw new ExecError('KPROXY_IPVS_IPSET_FAILED', `ipset restore failed: ${r.stderr.trim()}`, r);
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
