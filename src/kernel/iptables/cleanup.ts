// Removes the iptables chains a mode owns (ownership.ts), both families: one atomic
// iptables-restore per family, command by command if that is refused (so that everything
// removable goes), never a rule of another program's chain.
import { ExecError, type CommandRunner } from '../runner.ts';
import { coded } from '../../errors.ts';
import type { Logger } from '../../log.ts';
import { IptablesExecutor } from './exec.ts';
import { ownedCleanup, type OwnedChains } from './ownership.ts';
import type { Table } from './save.ts';
import { splitRuleArgs } from './tokenize.ts';

export async function removeOwnedChains(runner: CommandRunner, log: Logger, spec: OwnedChains, what: string): Promise<void> {
  const problems: string[] = [];
  for (const family of [4, 6] as const) {
    const exec = new IptablesExecutor(runner, family);
    let saved: string;
    try {
      saved = await exec.saveAll();
    } catch (e) {
      // no binary, or no tables for this family (module absent): nothing of ours can be there
      log.debug({ family, err: (e as Error).message }, `${what} cleanup: rules not readable, skipped`);
      continue;
    }
    const plan = ownedCleanup(saved, spec);
    for (const k of plan.kept) {
      log.warn(
        { family, table: k.table, chain: k.chain, referencedBy: k.referencedBy },
        coded('KPROXY_CLEANUP_KEPT', `${k.table} ${k.chain} stays: another program's chain ${k.referencedBy} jumps to it; remove that rule and run kproxy cleanup again`),
      );
    }
    if (!plan.payload) continue;
    try {
      await exec.restoreOwned(plan.payload, 'KPROXY_IPTABLES_RESTORE_FAILED');
    } catch (e) {
      log.warn({ family, err: (e as Error).message }, `${what} cleanup: the atomic removal was refused; removing rule by rule`);
      const left = await removeOneByOne(exec, plan.payload);
      if (left.length) problems.push(`IPv${family}: ${left.join(', ')} (${(e as Error).message})`);
      else continue;
    }
    const removed = Object.values(plan.removed).reduce((n, cs) => n + (cs?.length ?? 0), 0);
    log.info({ family, chains: removed, jumps: plan.jumps }, `${what} cleanup: removed its chains`);
  }
  if (problems.length) throw new ExecError('KPROXY_IPTABLES_FAILED', `${what} cleanup could not remove ${problems.join('; ')}`);
}

/** The same removal as commands; returns the chains still there afterwards. */
async function removeOneByOne(exec: IptablesExecutor, payload: string): Promise<string[]> {
  let table: Table | null = null;
  const chains = new Map<Table, string[]>();
  for (const line of payload.split('\n')) {
    if (line.startsWith('*')) table = line.slice(1) as Table;
    else if (table && line.startsWith('-D ')) {
      const [, chain, ...rest] = splitRuleArgs(line);
      await exec.deleteRule(table, chain, rest);
    } else if (table && line.startsWith('-X ')) chains.set(table, [...(chains.get(table) ?? []), line.slice(3)]);
  }
  const left: string[] = [];
  for (const [t, cs] of chains) {
    await exec.deleteChains(t, cs);
    for (const c of cs) if (await exec.chainExists(t, c)) left.push(`${t} ${c}`);
  }
  return left;
}
