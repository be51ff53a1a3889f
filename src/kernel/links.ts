// Links and addresses through `ip` (iproute2): the kube-ipvs0 dummy device and its VIPs.
import { ExecError, runChecked, type CommandRunner } from './runner.ts';
import { canonicalIP } from '../core/ip.ts';

const TIMEOUT_MS = 15_000;

/** The addresses in `ip -o addr show` output: one line per address, `N: dev    inet[6] ip/len ...`. */
function addressesOf(text: string): Array<{ dev: string; ip: string }> {
  const out: Array<{ dev: string; ip: string }> = [];
  for (const line of text.split('\n')) {
    const m = /^\d+:\s+([^\s:@]+)[^\n]*?\sinet6?\s+([0-9a-fA-F:.]+)\/\d+/.exec(line);
    const ip = m ? canonicalIP(m[2]) : null;
    if (ip) out.push({ dev: m![1], ip });
  }
  return out;
}

export class Links {
  constructor(private readonly runner: CommandRunner) {}

  async exists(dev: string): Promise<boolean> {
    const r = await this.runner.run('ip', ['link', 'show', 'dev', dev], { timeoutMs: TIMEOUT_MS });
    return r.code === 0;
  }

  /** creates a dummy device if missing; left down, as upstream (the VIPs are still local) */
  async ensureDummy(dev: string): Promise<boolean> {
    if (await this.exists(dev)) return false;
    const r = await this.runner.run('ip', ['link', 'add', dev, 'type', 'dummy'], { timeoutMs: TIMEOUT_MS });
    if (r.code !== 0 && !/exists/i.test(r.stderr)) {
      throw new ExecError('KPROXY_IPVS_LINK_FAILED', `cannot create dummy device ${dev}: ${r.stderr.trim()}`, r);
    }
    return true;
  }

  /** canonical addresses on a device ([] when it does not exist) */
  async addresses(dev: string): Promise<string[]> {
    const r = await this.runner.run('ip', ['-o', 'addr', 'show', 'dev', dev], { timeoutMs: TIMEOUT_MS });
    if (r.code !== 0) return [];
    return addressesOf(r.stdout).map((a) => a.ip);
  }

  /** `ip` itself is one of `dev`'s addresses: `ip -o addr show dev DEV to IP/32|128`, one line instead of every VIP ([] when absent) */
  async addressesTo(dev: string, ip: string): Promise<string[]> {
    const r = await this.runner.run('ip', ['-o', 'addr', 'show', 'dev', dev, 'to', `${ip}/${ip.includes(':') ? 128 : 32}`], { timeoutMs: TIMEOUT_MS });
    if (r.code !== 0) return [];
    return addressesOf(r.stdout).map((a) => a.ip);
  }

  /**
   * Every address of this host (loopback and link-local included), except those on the
   * devices named in `excludeDevices` (the ipvs mode's kube-ipvs0 holds Service VIPs, not
   * node addresses: upstream GetNodeIPs skips it). Null when `ip` cannot be run or fails.
   */
  async hostAddresses(excludeDevices: readonly string[] = []): Promise<string[] | null> {
    let r;
    try {
      r = await this.runner.run('ip', ['-o', 'addr', 'show'], { timeoutMs: TIMEOUT_MS });
    } catch {
      return null;
    }
    if (r.code !== 0) return null;
    const out: string[] = [];
    for (const a of addressesOf(r.stdout)) if (!excludeDevices.includes(a.dev) && !out.includes(a.ip)) out.push(a.ip);
    return out;
  }

  async addAddress(dev: string, ip: string): Promise<void> {
    const r = await this.runner.run('ip', ['addr', 'add', `${ip}/${ip.includes(':') ? 128 : 32}`, 'dev', dev], { timeoutMs: TIMEOUT_MS });
    if (r.code !== 0 && !/exists/i.test(r.stderr)) {
      throw new ExecError('KPROXY_IPVS_LINK_FAILED', `cannot add ${ip} to ${dev}: ${r.stderr.trim()}`, r);
    }
  }

  /**
   * Adds and removes addresses in one `ip -batch` (one process for any number of VIPs);
   * falls back to one command per address if the batch fails part-way.
   */
  async changeAddresses(dev: string, add: string[], del: string[]): Promise<void> {
    if (!add.length && !del.length) return;
    const pfx = (ip: string) => `${ip}/${ip.includes(':') ? 128 : 32}`;
    const lines = [...add.map((ip) => `addr add ${pfx(ip)} dev ${dev}`), ...del.map((ip) => `addr del ${pfx(ip)} dev ${dev}`)];
    const r = await this.runner.run('ip', ['-batch', '-'], { input: lines.join('\n') + '\n', timeoutMs: TIMEOUT_MS });
    if (r.code === 0) return;
    for (const ip of add) await this.addAddress(dev, ip);
    for (const ip of del) await this.deleteAddress(dev, ip);
  }

  async deleteAddress(dev: string, ip: string): Promise<void> {
    await this.runner.run('ip', ['addr', 'del', `${ip}/${ip.includes(':') ? 128 : 32}`, 'dev', dev], { timeoutMs: TIMEOUT_MS });
  }

  /** deletes a link; absence is fine */
  async deleteLink(dev: string): Promise<void> {
    if (!(await this.exists(dev))) return;
    await runChecked(this.runner, 'ip', ['link', 'del', dev], { timeoutMs: TIMEOUT_MS });
  }
}
