// ipvsadm (and the iptables calls of the ipvs mode): spawn through the CommandRunner, parse
// with the pure parsers of src/kernel/ipvs/model.ts.
import { ExecError, runChecked, type CommandRunner } from '../runner.ts';
import { parseListing, parseRules, serviceFlag, type IpvsTable } from './model.ts';
import { joinHostPort } from '../../core/ip.ts';
import type { Protocol } from '../../core/model.ts';

const TIMEOUT_MS = 30_000;

export class Ipvsadm {
  constructor(private readonly runner: CommandRunner) {}

  /** `ipvsadm -Ln`: the table with live connection counters */
  async list(): Promise<IpvsTable> {
    const r = await runChecked(this.runner, 'ipvsadm', ['-Ln'], { timeoutMs: TIMEOUT_MS });
    return parseListing(r.stdout);
  }

  /**
   * `ipvsadm -Ln -t|-u|--sctp-service VIP:PORT`: one virtual server with its counters (an
   * empty table when it does not exist). What a partial sync reads instead of the whole table.
   */
  async listService(vs: { protocol: Protocol; address: string; port: number }): Promise<IpvsTable> {
    const r = await this.runner.run('ipvsadm', ['-Ln', serviceFlag(vs.protocol), joinHostPort(vs.address, vs.port)], { timeoutMs: TIMEOUT_MS });
    if (r.code !== 0) {
      if (/no such service/i.test(r.stderr)) return new Map();
      throw new ExecError('KPROXY_IPVS_APPLY_FAILED', `ipvsadm -Ln for ${joinHostPort(vs.address, vs.port)}/${vs.protocol} failed (exit ${r.code}): ${r.stderr.trim()}`, r);
    }
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
