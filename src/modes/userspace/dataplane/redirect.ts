// Installs and removes the userspace mode's iptables rules: the nat DNATs to the proxy ports
// and the filter DROPs. The chain contents go in one iptables-restore --noflush transaction
// (declaring a chain flushes it, so the chains hold exactly the payload); the jumps from the
// builtin chains are added once with -C/-I because restore cannot add a rule to PREROUTING
// without flushing it.
import { ExecError, type CommandRunner } from '../../../kernel/runner.ts';
import { IptablesExecutor } from '../../../kernel/iptables/exec.ts';
import { ownedCleanup, type OwnedChains } from '../../../kernel/iptables/ownership.ts';
import type { Logger } from '../../../log.ts';
import { FILTER_JUMP_SOURCES, JUMP_SOURCES, filterJumpRuleSpec, jumpRuleSpec } from '../plan.ts';

const TIMEOUT_MS = 15_000;

/** Writes the chains and makes sure nat PREROUTING and OUTPUT, filter INPUT, FORWARD and OUTPUT jump to them (prepended). */
export async function applyRedirects(runner: CommandRunner, family: 4 | 6, payload: string): Promise<void> {
  const exec = new IptablesExecutor(runner, family);
  await exec.restoreOwned(payload, 'KPROXY_IPTABLES_RESTORE_FAILED', TIMEOUT_MS);
  for (const chain of JUMP_SOURCES) await exec.ensureRulePrepended('nat', chain, jumpRuleSpec());
  for (const chain of FILTER_JUMP_SOURCES) await exec.ensureRulePrepended('filter', chain, filterJumpRuleSpec());
}

/** kproxy's own chains (src/kernel/iptables/ownership.ts: removed with the jumps to them from the built-in chains) */
const USERSPACE_OWNED: OwnedChains = { chains: {}, prefixes: { nat: ['KPROXY-USERSPACE-'], filter: ['KPROXY-USERSPACE-'] } };

/**
 * The restore payload that removes our chains and every jump to them from the built-in
 * chains, from an `iptables-save` dump of the nat and filter tables; null when there is nothing of ours.
 */
export function removalPayload(saved: string): string | null {
  return ownedCleanup(saved, USERSPACE_OWNED).payload || null;
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
      // Each table read on its own: a kernel without the nat table still has filter rules to remove.
      const tables = [await exec.saveIfReadable('nat'), await exec.saveIfReadable('filter')].filter((t): t is string => t !== null);
      saved = tables.length ? tables.join('') : null;
    } catch (e) {
      if (e instanceof ExecError && e.code === 'KPROXY_EXEC_MISSING') {
        log.debug({ cmd: exec.bin.save }, 'userspace cleanup: not installed, nothing to remove');
        continue;
      }
      throw e;
    }
    if (saved === null) {
      // No nat nor filter table for this family (modules absent): nothing of ours can be there.
      log.debug({ cmd: exec.bin.save }, 'userspace cleanup: cannot read the nat table, skipped');
      continue;
    }
    const payload = removalPayload(saved);
    if (!payload) continue;
    await exec.restoreOwned(payload, 'KPROXY_IPTABLES_RESTORE_FAILED', TIMEOUT_MS);
    log.info({ family }, 'userspace cleanup: removed KPROXY-USERSPACE chains');
  }
}
