import { createLogger, type Logger } from '../log.ts';
import { hostRunner, type CommandRunner } from '../kernel/runner.ts';
import { modes } from '../modes/registry.ts';
import { kproxyError } from '../errors.ts';

/** Removes every mode's kernel state; a mode whose tools are missing has nothing to remove. */
export async function cleanupAll(runner: CommandRunner, log: Logger): Promise<void> {
  let failed = 0;
  // ipvs before iptables: its ipsets can only go once no rule references them, and its
  // cleanup removes those rules first.
  for (const name of ['userspace', 'nftables', 'ipvs', 'iptables'] as const) {
    try {
      await modes[name].cleanup(runner, log.child({ cleanup: name }));
    } catch (e) {
      failed++;
      log.error({ mode: name, err: (e as Error).message }, 'cleanup failed');
    }
  }
  if (failed) throw kproxyError('KPROXY_CLEANUP_FAILED', `${failed} mode(s) could not be cleaned up; see the log`);
  log.info('cleanup done');
}

export async function cleanupCommand(): Promise<void> {
  await cleanupAll(hostRunner, createLogger());
}
