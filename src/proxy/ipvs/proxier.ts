// The ipvs mode's proxier: applies a plan to the host by difference. Each sync reads the
// live IPVS table (`ipvsadm -Ln`), ipsets (`ipset save`) and kube-ipvs0's addresses, and
// changes only what differs; nothing is flushed. Removed real servers drain gracefully
// (weight 0 until their connections end), checked on every sync and on a short timer.
// This file is the mode's composition root: the only one in src/modes/ipvs that touches
// the host, and only through the executors in src/exec.
import { release } from 'node:os';
import type { Logger } from '../../log.ts';
import type { ModeDeps, PlanInput, Proxier, SyncStats } from '../../modes/types.ts';
import { Ipvsadm, IptablesFamily } from '../../exec/ipvs.ts';
import { IPSetExec } from '../../exec/ipset.ts';
import { Links } from '../../exec/links.ts';
import { ensureSysctl, procSysctl, type Sysctl } from '../../exec/sysctl.ts';
import { ensureModules, type ModuleFS } from '../../exec/modules.ts';
import { BASE_MODULES, DUMMY_DEVICE, schedulerModule } from '../../modes/ipvs/names.ts';
import { withMissingJumps } from '../../modes/ipvs/iptables-rules.ts';
import { plan, type IpvsPlan } from '../../modes/ipvs/planner.ts';
import { diffIPSets } from '../../modes/ipvs/ipsets.ts';
import { diffIpvs, drainLines, ownershipPredicate } from '../../modes/ipvs/diff.ts';
import { plannedSysctls, sysctlApplies } from '../../modes/ipvs/sysctls.ts';
import { renderPlan } from '../../modes/ipvs/render.ts';
import { ipFamily } from '../../core/ip.ts';

export interface IpvsProxierOptions extends ModeDeps {
  sysctl?: Sysctl;
  moduleFS?: ModuleFS;
  /** extra modules to require (tests use a bogus name to exercise the error) */
  extraModules?: string[];
  /** interval of the graceful-termination check; 0 disables the timer */
  gracefulCheckMs?: number;
  kernelRelease?: string;
}

/** checks and prepares the kernel (modules, sysctls, timeouts), then returns a proxier */
export async function createIpvsProxier(opts: IpvsProxierOptions): Promise<IpvsProxier> {
  const { config, runner, log } = opts;
  const sched = schedulerModule(config.ipvs.scheduler);
  const loaded = await ensureModules([...BASE_MODULES.slice(0, 1), sched, ...BASE_MODULES.slice(1), ...(opts.extraModules ?? [])], {
    runner,
    fs: opts.moduleFS,
    hint: (m) => (m === sched ? ' or pick another scheduler' : ''),
  });
  if (loaded.length) log.info({ modules: loaded }, 'loaded kernel modules');
  const sysctl = opts.sysctl ?? procSysctl();
  const rel = opts.kernelRelease ?? release();
  for (const s of plannedSysctls(config.ipvs.strictARP)) {
    if (!sysctlApplies(s, rel)) continue;
    if (await ensureSysctl(sysctl, s.name, s.value)) log.info({ sysctl: s.name, value: s.value }, 'set sysctl');
  }
  const t = config.ipvs;
  if (t.tcpTimeoutMs > 0 || t.tcpFinTimeoutMs > 0 || t.udpTimeoutMs > 0) {
    const s = (ms: number) => Math.round(ms / 1000);
    await new Ipvsadm(runner).setTimeouts(s(t.tcpTimeoutMs), s(t.tcpFinTimeoutMs), s(t.udpTimeoutMs));
  }
  return new IpvsProxier(opts);
}

export class IpvsProxier implements Proxier {
  private readonly ipvsadm: Ipvsadm;
  private readonly ipset: IPSetExec;
  private readonly links: Links;
  private readonly log: Logger;
  private last: IpvsPlan | null = null;
  private lastIptables = '';
  private jumpsEnsured = false;
  /** virtual servers this process created (owned even if their VIP bookkeeping is lost) */
  private readonly created = new Set<string>();
  /** "vsKey/rsKey" of real servers at weight 0 waiting for their connections to end */
  readonly terminating = new Set<string>();
  private chain: Promise<unknown> = Promise.resolve();
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly opts: IpvsProxierOptions) {
    this.ipvsadm = new Ipvsadm(opts.runner);
    this.ipset = new IPSetExec(opts.runner);
    this.links = new Links(opts.runner);
    this.log = opts.log;
    const every = opts.gracefulCheckMs ?? 5_000;
    if (every > 0) {
      this.timer = setInterval(() => {
        if (this.terminating.size) void this.checkGraceful().catch((e) => this.log.warn({ err: e }, 'graceful termination check failed'));
      }, every);
      this.timer.unref();
    }
  }

  /** one host change at a time: syncs and timer checks never interleave */
  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.chain.then(fn, fn);
    this.chain = next.catch(() => {});
    return next;
  }

  sync(input: PlanInput, _changed: Set<string>, full: boolean): Promise<SyncStats> {
    return this.serial(() => this.syncNow(input, full));
  }

  private async syncNow(input: PlanInput, full: boolean): Promise<SyncStats> {
    const p = plan(input);
    const family = p.family;
    await this.links.ensureDummy(DUMMY_DEVICE);

    // ipsets first: the iptables rules reference them by name
    const liveSets = await this.ipset.save();
    const setDiff = diffIPSets(p.sets, liveSets);
    await this.ipset.restore(setDiff.script);

    const ipt = new IptablesFamily(this.opts.runner, family);
    if (full || !this.jumpsEnsured || p.iptables !== this.lastIptables) {
      // on full syncs the jumps from built-in chains are checked too, in the same restore
      const text = full || !this.jumpsEnsured ? withMissingJumps(p.iptables, await ipt.save()) : p.iptables;
      await ipt.restore(text);
      this.lastIptables = p.iptables;
      this.jumpsEnsured = true;
    }

    const live = await this.ipvsadm.list();
    const dummyAddrs = (await this.links.addresses(DUMMY_DEVICE)).filter((a) => ipFamily(a) === family);
    const owned = ownershipPredicate({
      dummyAddresses: dummyAddrs,
      liveSets,
      nodeIPs: p.nodePortIPs,
      created: this.created,
      excludeCIDRs: input.config.ipvs.excludeCIDRs,
      family,
    });
    const d = diffIpvs(p.table, live, owned);
    try {
      await this.ipvsadm.restore(d.lines);
    } finally {
      for (const k of p.table.keys()) this.created.add(k);
    }
    for (const k of [...this.created]) if (!p.table.has(k)) this.created.delete(k);
    this.terminating.clear();
    for (const k of d.terminating) this.terminating.add(k);

    const want = new Set(p.boundAddresses);
    const have = new Set(dummyAddrs);
    const toAdd = p.boundAddresses.filter((a) => !have.has(a));
    const toDel = dummyAddrs.filter((a) => !want.has(a));
    await this.links.changeAddresses(DUMMY_DEVICE, toAdd, toDel);
    const addrChanges = toAdd.length + toDel.length;

    this.last = p;
    let rs = 0;
    for (const v of p.table.values()) rs += v.reals.size;
    const c = d.counts;
    const diff =
      `ipvs: +${c.vsAdded} ~${c.vsEdited} -${c.vsDeleted} virtual servers, +${c.rsAdded} ~${c.rsEdited} -${c.rsDeleted} real servers` +
      `${this.terminating.size ? ` (${this.terminating.size} draining)` : ''}; ipset: +${setDiff.added} -${setDiff.deleted}; addresses: ${addrChanges} changed`;
    if (d.lines.length || setDiff.script || addrChanges) this.log.info({ diff }, 'ipvs sync applied changes');
    return { rulesWritten: d.lines.length + setDiff.added + setDiff.deleted + addrChanges, rulesTotal: p.table.size + rs, diff };
  }

  /** deletes terminating real servers whose connections have ended */
  checkGraceful(): Promise<number> {
    return this.serial(async () => {
      if (this.terminating.size === 0) return 0;
      const live = await this.ipvsadm.list();
      const { lines, still } = drainLines(this.terminating, live);
      await this.ipvsadm.restore(lines);
      this.terminating.clear();
      for (const k of still) this.terminating.add(k);
      if (lines.length) this.log.info({ deleted: lines.length }, 'drained real servers deleted');
      return lines.length;
    });
  }

  dump(): string {
    return this.last ? renderPlan(this.last) : '';
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.chain;
  }
}
