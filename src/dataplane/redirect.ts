// Installs and removes the userspace mode's iptables REDIRECT rules. The chain contents go
// in one iptables-restore --noflush transaction (declaring a chain flushes it, so the
// chains hold exactly the payload); the jumps from the builtin chains are added once with
// -C/-I because restore cannot add a rule to PREROUTING without flushing it.
import { ExecError, runChecked, type CommandRunner } from '../exec/runner.ts';
import type { Logger } from '../log.ts';
import { JUMP_SOURCES, jumpRuleSpec } from '../modes/userspace/plan.ts';

const WAIT = ['-w', '5'];
const TIMEOUT_MS = 15_000;

export function binaries(family: 4 | 6): { iptables: string; save: string; restore: string } {
  return family === 4
    ? { iptables: 'iptables', save: 'iptables-save', restore: 'iptables-restore' }
    : { iptables: 'ip6tables', save: 'ip6tables-save', restore: 'ip6tables-restore' };
}

/** Writes the chains and makes sure PREROUTING and OUTPUT jump to them. */
export async function applyRedirects(runner: CommandRunner, family: 4 | 6, payload: string): Promise<void> {
  const bin = binaries(family);
  await runChecked(runner, bin.restore, [...WAIT, '--noflush'], { input: payload, timeoutMs: TIMEOUT_MS });
  for (const chain of JUMP_SOURCES) {
    const spec = jumpRuleSpec();
    const check = await runner.run(bin.iptables, [...WAIT, '-t', 'nat', '-C', chain, ...spec], { timeoutMs: TIMEOUT_MS });
    if (check.code === 0) continue;
    await runChecked(runner, bin.iptables, [...WAIT, '-t', 'nat', '-I', chain, '1', ...spec], { timeoutMs: TIMEOUT_MS });
  }
}

const OUR_CHAIN = /^KPROXY-USERSPACE-[A-Z0-9-]+$/;

/**
 * The restore payload that removes our chains and every jump to them, from an
 * `iptables-save -t nat` dump; null when there is nothing of ours.
 */
export function removalPayload(saved: string): string | null {
  const chains: string[] = [];
  const jumps: string[] = [];
  let inNat = false;
  for (const line of saved.split('\n')) {
    if (line.startsWith('*')) inNat = line.trim() === '*nat';
    if (!inNat) continue;
    const chainDecl = /^:(\S+) /.exec(line);
    if (chainDecl && OUR_CHAIN.test(chainDecl[1])) chains.push(chainDecl[1]);
    const rule = /^-A (\S+) (.*)$/.exec(line);
    if (rule && !OUR_CHAIN.test(rule[1]) && /(^| )-j KPROXY-USERSPACE-[A-Z0-9-]+( |$)/.test(rule[2])) {
      jumps.push(`-D ${rule[1]} ${rule[2]}`);
    }
  }
  if (chains.length === 0 && jumps.length === 0) return null;
  return ['*nat', ...chains.map((c) => `:${c} - [0:0]`), ...jumps, ...chains.map((c) => `-X ${c}`), 'COMMIT', ''].join('\n');
}

/**
 * Removes the KPROXY-USERSPACE-* chains and the jumps to them for both families. Absent
 * chains and a missing iptables (or ip6tables) are not errors; a failed removal is.
 */
export async function removeRedirects(runner: CommandRunner, log: Logger, families: (4 | 6)[] = [4, 6]): Promise<void> {
  for (const family of families) {
    const bin = binaries(family);
    let saved;
    try {
      saved = await runner.run(bin.save, ['-t', 'nat'], { timeoutMs: TIMEOUT_MS });
    } catch (e) {
      if (e instanceof ExecError && e.code === 'KPROXY_EXEC_MISSING') {
        log.debug({ cmd: bin.save }, 'userspace cleanup: not installed, nothing to remove');
        continue;
      }
      throw e;
    }
    if (saved.code !== 0) {
      // No nat table for this family (module absent): nothing of ours can be there.
      log.debug({ cmd: bin.save, stderr: saved.stderr.trim() }, 'userspace cleanup: cannot read the nat table, skipped');
      continue;
    }
    const payload = removalPayload(saved.stdout);
    if (!payload) continue;
    await runChecked(runner, bin.restore, [...WAIT, '--noflush'], { input: payload, timeoutMs: TIMEOUT_MS });
    log.info({ family }, 'userspace cleanup: removed KPROXY-USERSPACE chains');
  }
}
