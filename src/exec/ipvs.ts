// ipvsadm (and the iptables calls of the ipvs mode): spawn through the CommandRunner, parse
// with the pure parsers of src/modes/ipvs/ipvs-model.ts.
import { ExecError, runChecked, type CommandRunner } from './runner.ts';
import { parseListing, parseRules, type IpvsTable } from '../modes/ipvs/ipvs-model.ts';

const TIMEOUT_MS = 30_000;

export class Ipvsadm {
  constructor(private readonly runner: CommandRunner) {}

  /** `ipvsadm -Ln`: the table with live connection counters */
  async list(): Promise<IpvsTable> {
    const r = await runChecked(this.runner, 'ipvsadm', ['-Ln'], { timeoutMs: TIMEOUT_MS });
    return parseListing(r.stdout);
  }

  /** `ipvsadm -Sn`: the table in rule form */
  async save(): Promise<IpvsTable> {
    return parseRules(await this.saveText());
  }

  async saveText(): Promise<string> {
    return (await runChecked(this.runner, 'ipvsadm', ['-Sn'], { timeoutMs: TIMEOUT_MS })).stdout;
  }

  /**
   * Applies rule lines in one `ipvsadm -R`. ipvsadm carries on after a failing line and
   * still exits 0, so any stderr output counts as failure (the caller resyncs fully).
   */
  async restore(lines: string[]): Promise<void> {
    if (lines.length === 0) return;
    const r = await this.runner.run('ipvsadm', ['-R'], { input: lines.join('\n') + '\n', timeoutMs: TIMEOUT_MS });
    if (r.code !== 0 || r.stderr.trim() !== '') {
      throw new ExecError('KPROXY_IPVS_APPLY_FAILED', `ipvsadm -R failed (exit ${r.code}): ${r.stderr.trim()}`, r);
    }
  }

  /** `ipvsadm --set tcp tcpfin udp` (seconds; 0 keeps the current value) */
  async setTimeouts(tcp: number, tcpFin: number, udp: number): Promise<void> {
    await runChecked(this.runner, 'ipvsadm', ['--set', String(tcp), String(tcpFin), String(udp)], { timeoutMs: TIMEOUT_MS });
  }

  async deleteVirtualServer(protoFlag: string, hostPort: string): Promise<void> {
    await this.runner.run('ipvsadm', ['-D', protoFlag, hostPort], { timeoutMs: TIMEOUT_MS });
  }
}

/** iptables of one family, as the ipvs mode uses it */
export class IptablesFamily {
  private readonly bin: string;
  constructor(
    private readonly runner: CommandRunner,
    family: 4 | 6,
  ) {
    this.bin = family === 6 ? 'ip6tables' : 'iptables';
  }

  /** restores our chains only (`--noflush`: other chains and tables stay as they are) */
  async restore(text: string): Promise<void> {
    const r = await this.runner.run(`${this.bin}-restore`, ['--noflush', '-w', '5'], { input: text, timeoutMs: TIMEOUT_MS });
    if (r.code !== 0) throw new ExecError('KPROXY_IPVS_IPTABLES_FAILED', `${this.bin}-restore failed: ${r.stderr.trim()}`, r);
  }

  /** `iptables-save` text of every table */
  async save(): Promise<string> {
    return (await runChecked(this.runner, `${this.bin}-save`, [], { timeoutMs: TIMEOUT_MS })).stdout;
  }

  /** ensures a jump rule exists in a built-in chain (prepended, as upstream) */
  async ensureJump(table: string, from: string, to: string, comment: string): Promise<void> {
    const spec = ['-m', 'comment', '--comment', comment, '-j', to];
    const check = await this.runner.run(this.bin, ['-w', '5', '-t', table, '-C', from, ...spec], { timeoutMs: TIMEOUT_MS });
    if (check.code === 0) return;
    await runChecked(this.runner, this.bin, ['-w', '5', '-t', table, '-I', from, ...spec], { timeoutMs: TIMEOUT_MS });
  }

  /** removes a jump rule; absence is fine */
  async deleteJump(table: string, from: string, to: string, comment: string): Promise<void> {
    const spec = ['-m', 'comment', '--comment', comment, '-j', to];
    for (let i = 0; i < 4; i++) {
      const r = await this.runner.run(this.bin, ['-w', '5', '-t', table, '-D', from, ...spec], { timeoutMs: TIMEOUT_MS });
      if (r.code !== 0) return;
    }
  }

  /** flushes then deletes chains (all flushed first, so jumps between them go first); absence is fine */
  async deleteChains(table: string, chains: string[]): Promise<void> {
    for (const c of chains) await this.runner.run(this.bin, ['-w', '5', '-t', table, '-F', c], { timeoutMs: TIMEOUT_MS });
    for (const c of chains) await this.runner.run(this.bin, ['-w', '5', '-t', table, '-X', c], { timeoutMs: TIMEOUT_MS });
  }
}
