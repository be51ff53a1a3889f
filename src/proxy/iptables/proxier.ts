// The iptables proxier: plans with the pure planner and applies through the executor.
// Full syncs (first, after any failure, when asked, or when the canary chain vanished
// because someone flushed iptables) ensure the jump rules from the built-in chains and
// re-read the installed nat chains from iptables-save; partial syncs write only changed
// services' chains and delete the chains that became stale. One state per IP family.
import type { CommandRunner } from '../../exec/runner.ts';
import { IptablesExecutor, chainsFromSave, type Table } from '../../exec/iptables.ts';
import type { Logger } from '../../log.ts';
import type { ProxyConfig } from '../../config/config.ts';
import type { PlanInput, Proxier, SyncStats } from '../../modes/types.ts';
import {
  KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_CANARY,
  KUBE_PROXY_FIREWALL, KUBE_SERVICES,
} from '../../modes/iptables/names.ts';
import { optionsFromConfig, type IptablesOptions, type RuntimeFacts, DEFAULT_FACTS } from '../../modes/iptables/options.ts';
import { planIptables } from '../../modes/iptables/plan.ts';
import { IptablesSyncState } from '../../modes/iptables/sync-state.ts';

export interface JumpRule {
  table: Table;
  dst: string;
  src: string;
  comment: string;
  extra: string[];
}

const NEW = ['-m', 'conntrack', '--ctstate', 'NEW'];

/** upstream's iptablesJumpChains: how packets enter kproxy's chains from the built-in ones. */
export const JUMP_RULES: JumpRule[] = [
  { table: 'filter', dst: KUBE_EXTERNAL_SERVICES, src: 'INPUT', comment: 'kubernetes externally-visible service portals', extra: NEW },
  { table: 'filter', dst: KUBE_EXTERNAL_SERVICES, src: 'FORWARD', comment: 'kubernetes externally-visible service portals', extra: NEW },
  { table: 'filter', dst: KUBE_NODEPORTS, src: 'INPUT', comment: 'kubernetes health check service ports', extra: [] },
  { table: 'filter', dst: KUBE_SERVICES, src: 'FORWARD', comment: 'kubernetes service portals', extra: NEW },
  { table: 'filter', dst: KUBE_SERVICES, src: 'OUTPUT', comment: 'kubernetes service portals', extra: NEW },
  { table: 'filter', dst: KUBE_FORWARD, src: 'FORWARD', comment: 'kubernetes forwarding rules', extra: [] },
  { table: 'filter', dst: KUBE_PROXY_FIREWALL, src: 'INPUT', comment: 'kubernetes load balancer firewall', extra: NEW },
  { table: 'filter', dst: KUBE_PROXY_FIREWALL, src: 'OUTPUT', comment: 'kubernetes load balancer firewall', extra: NEW },
  { table: 'filter', dst: KUBE_PROXY_FIREWALL, src: 'FORWARD', comment: 'kubernetes load balancer firewall', extra: NEW },
  { table: 'nat', dst: KUBE_SERVICES, src: 'OUTPUT', comment: 'kubernetes service portals', extra: [] },
  { table: 'nat', dst: KUBE_SERVICES, src: 'PREROUTING', comment: 'kubernetes service portals', extra: [] },
  { table: 'nat', dst: KUBE_POSTROUTING, src: 'POSTROUTING', comment: 'kubernetes postrouting rules', extra: [] },
];

/** Duplicates of kubelet's anti-martian chain jumps (kubelet makes the same ones). */
export const KUBELET_JUMP_RULES: JumpRule[] = [
  { table: 'filter', dst: KUBE_FIREWALL, src: 'INPUT', comment: '', extra: [] },
  { table: 'filter', dst: KUBE_FIREWALL, src: 'OUTPUT', comment: '', extra: [] },
];

export function jumpArgs(j: JumpRule): string[] {
  return [...j.extra, ...(j.comment ? ['-m', 'comment', '--comment', j.comment] : []), '-j', j.dst];
}

interface FamilyState {
  exec: IptablesExecutor;
  sync: IptablesSyncState;
  lastCanaryCheckMs: number;
  last?: { input: PlanInput; opts: IptablesOptions };
}

export interface IptablesProxierDeps {
  runner: CommandRunner;
  log: Logger;
  config: ProxyConfig;
  facts?: Partial<Record<4 | 6, RuntimeFacts>>;
  now?: () => number;
}

export class IptablesProxier implements Proxier {
  private readonly families = new Map<4 | 6, FamilyState>();
  private readonly now: () => number;

  constructor(private readonly deps: IptablesProxierDeps) {
    this.now = deps.now ?? Date.now;
  }

  private familyState(family: 4 | 6): FamilyState {
    let fs = this.families.get(family);
    if (!fs) {
      fs = { exec: new IptablesExecutor(this.deps.runner, family), sync: new IptablesSyncState(), lastCanaryCheckMs: this.now() };
      this.families.set(family, fs);
    }
    return fs;
  }

  async sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    const family = input.node.family;
    const fs = this.familyState(family);
    const opts = optionsFromConfig(input.config, input.node, this.deps.facts?.[family] ?? DEFAULT_FACTS);
    const syncPeriodMs = input.config.syncPeriodMs;
    let doFull = full || fs.sync.needFullSync;
    try {
      if (!doFull && this.now() - fs.lastCanaryCheckMs >= syncPeriodMs) {
        fs.lastCanaryCheckMs = this.now();
        if (!(await fs.exec.chainExists('mangle', KUBE_PROXY_CANARY))) {
          this.deps.log.warn({ family }, 'iptables canary chain is gone (iptables was flushed?): forcing a full sync');
          doFull = true;
        }
      }
      if (doFull) {
        await this.ensureJumps(fs.exec);
        fs.sync.installedNatChains = chainsFromSave(await fs.exec.save('nat'), 'nat');
      }
      const plan = fs.sync.plan(input.state, opts, changed, doFull, this.now(), syncPeriodMs);
      await fs.exec.restore(plan.payload);
      fs.sync.commit(plan);
      fs.last = { input, opts };
      const kind = plan.full ? 'full' : 'partial';
      const diff = `${kind} sync (IPv${family}): ${plan.writtenServices} service ports written, ${plan.natRulesWritten} of ${plan.natRulesTotal} nat rules, ${plan.filterRules} filter rules` +
        (plan.deletedChains.length ? `, deleted ${plan.deletedChains.join(' ')}` : '');
      this.deps.log.debug({ family, full: plan.full, natRulesWritten: plan.natRulesWritten, natRulesTotal: plan.natRulesTotal }, diff);
      return { rulesWritten: plan.natRulesWritten, rulesTotal: plan.natRulesTotal, diff };
    } catch (e) {
      // The change history is consumed: only a full sync can be trusted next.
      fs.sync.fail();
      throw e;
    }
  }

  private async ensureJumps(exec: IptablesExecutor): Promise<void> {
    for (const t of ['mangle', 'nat', 'filter'] as const) await exec.ensureChain(t, KUBE_PROXY_CANARY);
    for (const j of [...JUMP_RULES, ...KUBELET_JUMP_RULES]) {
      await exec.ensureChain(j.table, j.dst);
      await exec.ensureRulePrepended(j.table, j.src, jumpArgs(j));
    }
  }

  dump(): string {
    const out: string[] = [];
    for (const [family, fs] of [...this.families].sort((a, b) => a[0] - b[0])) {
      if (!fs.last) continue;
      out.push(`# IPv${family} (${fs.exec.bin.restore})`);
      out.push(planIptables({ state: fs.last.input.state, opts: fs.last.opts, full: true }).payload);
    }
    return out.join('\n');
  }

  async stop(): Promise<void> {}
}
