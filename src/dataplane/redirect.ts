// Installs and removes the userspace mode's iptables REDIRECT rules. The chain contents go
// in one iptables-restore --noflush transaction (declaring a chain flushes it, so the
// chains hold exactly the payload); the jumps from the builtin chains are added once with
// -C/-I because restore cannot add a rule to PREROUTING without flushing it.
import { ExecError, type CommandRunner } from '../exec/runner.ts';
import { IptablesExecutor } from '../iptables/exec.ts';
import { readSave } from '../iptables/save.ts';
import type { Logger } from '../log.ts';
import { JUMP_SOURCES, jumpRuleSpec } from '../modes/userspace/plan.ts';

const TIMEOUT_MS = 15_000;

/** Writes the chains and makes sure PREROUTING and OUTPUT jump to them (prepended). */
export async function applyRedirects(runner: CommandRunner, family: 4 | 6, payload: string): Promise<void> {
  const exec = new IptablesExecutor(runner, family);
  await exec.restoreOwned(payload, 'KPROXY_IPTABLES_RESTORE_FAILED', TIMEOUT_MS);
  for (const chain of JUMP_SOURCES) await exec.ensureRulePrepended('nat', chain, jumpRuleSpec());
}

const OUR_CHAIN = /^KPROXY-USERSPACE-[A-Z0-9-]+$/;

/**
 * The restore payload that removes our chains and every jump to them, from an
 * `iptables-save -t nat` dump; null when there is nothing of ours.
 */
export function removalPayload(saved: string): string | null {
  const nat = readSave(saved).get('nat');
  const chains = (nat?.chains ?? []).filter((c) => OUR_CHAIN.test(c));
  const jumps: string[] = [];
  for (const r of nat?.rules ?? []) {
    if (r.op === '-A' && r.rest && !OUR_CHAIN.test(r.chain) && /(^| )-j KPROXY-USERSPACE-[A-Z0-9-]+( |$)/.test(r.rest)) {
      jumps.push(`-D ${r.chain} ${r.rest}`);
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
    const exec = new IptablesExecutor(runner, family);
    let saved: string | null;
    try {
      saved = await exec.saveIfReadable('nat');
    } catch (e) {
      if (e instanceof ExecError && e.code === 'KPROXY_EXEC_MISSING') {
        log.debug({ cmd: exec.bin.save }, 'userspace cleanup: not installed, nothing to remove');
        continue;
      }
      throw e;
    }
    if (saved === null) {
      // No nat table for this family (module absent): nothing of ours can be there.
      log.debug({ cmd: exec.bin.save }, 'userspace cleanup: cannot read the nat table, skipped');
      continue;
    }
    const payload = removalPayload(saved);
    if (!payload) continue;
    await exec.restoreOwned(payload, 'KPROXY_IPTABLES_RESTORE_FAILED', TIMEOUT_MS);
    log.info({ family }, 'userspace cleanup: removed KPROXY-USERSPACE chains');
  }
}
