// Removes what the ipvs mode may have left on the host: the virtual servers it owns (VIPs on
// kube-ipvs0 or in its ipsets, NodePorts on local addresses), its iptables jumps and chains,
// kube-ipvs0, then its ipsets (only once no rule references them). Absence of any piece,
// or of ipvsadm/ipset/iptables themselves, is fine.
import type { Logger } from '../../log.ts';
import { ExecError, type CommandRunner } from '../../kernel/runner.ts';
import { Ipvsadm } from '../../kernel/ipvs/exec.ts';
import { removeOwnedChains } from '../../kernel/iptables/cleanup.ts';
import { KUBE_PROXY_OWNED } from '../../kernel/iptables/ownership.ts';
import { IPSetExec } from '../../kernel/ipset/exec.ts';
import { Links } from '../../kernel/links.ts';
import { ipFamily } from '../../core/ip.ts';
import { allSetNames, DUMMY_DEVICE } from './names.ts';
import { ownershipPredicate } from './diff.ts';
import { vsDeleteLine } from '../../kernel/ipvs/model.ts';
import type { IPSetTable } from '../../kernel/ipset/model.ts';

function missingTool(e: unknown): boolean {
  return e instanceof ExecError && e.code === 'KPROXY_EXEC_MISSING';
}

/** A kernel without IPVS has no virtual server to remove: ipvsadm says it cannot initialise. */
function ipvsAbsent(e: unknown): boolean {
  return /Can't initialize ipvs|Protocol not available/.test((e as Error).message ?? '');
}

export async function cleanupIpvs(runner: CommandRunner, log: Logger): Promise<void> {
  const problems: string[] = [];
  const links = new Links(runner);
  const ipset = new IPSetExec(runner);
  let sets: IPSetTable = new Map();
  try {
    sets = await ipset.save();
  } catch (e) {
    if (!missingTool(e)) problems.push((e as Error).message);
  }

  try {
    const ipvsadm = new Ipvsadm(runner);
    const live = await ipvsadm.list();
    const dummy = await links.addresses(DUMMY_DEVICE);
    const locals = (await links.hostAddresses([DUMMY_DEVICE])) ?? [];
    const lines: string[] = [];
    for (const family of [4, 6] as const) {
      const owned = ownershipPredicate({
        dummyAddresses: dummy.filter((a) => ipFamily(a) === family),
        liveSets: sets,
        nodeIPs: locals.filter((a) => ipFamily(a) === family),
        created: new Set(),
        excludeCIDRs: [],
        family,
      });
      for (const [k, st] of live) if (owned(k, st.vs)) lines.push(vsDeleteLine(st.vs));
    }
    await ipvsadm.restore(lines);
    if (lines.length) log.info({ virtualServers: lines.length }, 'removed ipvs virtual servers');
  } catch (e) {
    if (!missingTool(e) && !ipvsAbsent(e)) problems.push((e as Error).message);
  }

  // its chains and the jumps to them (upstream's cleanupIptablesLeftovers), never another
  // program's: src/kernel/iptables/ownership.ts
  try {
    await removeOwnedChains(runner, log, KUBE_PROXY_OWNED, 'ipvs');
  } catch (e) {
    problems.push((e as Error).message);
  }

  try {
    await links.deleteLink(DUMMY_DEVICE);
  } catch (e) {
    if (!missingTool(e)) problems.push((e as Error).message);
  }

  // after the iptables rules: the kernel refuses to destroy a set a rule still references
  try {
    await ipset.destroyAll(allSetNames().filter((n) => sets.has(n)));
  } catch (e) {
    if (!missingTool(e)) problems.push((e as Error).message);
  }
  if (problems.length) {
    throw new ExecError('KPROXY_IPVS_CLEANUP_INCOMPLETE', `ipvs cleanup left state behind: ${problems.join('; ')}`);
  }
}
