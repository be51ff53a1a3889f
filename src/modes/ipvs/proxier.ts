// The ipvs mode's proxier: applies a plan to the host by difference; nothing is flushed.
// A full sync (the first, hourly, after any failure) reads the live IPVS table (`ipvsadm
// -Ln`), ipsets (`ipset save`) and kube-ipvs0's addresses and changes what differs. After it
// succeeded the proxier keeps its own model of what it applied (the plan's per-port fragments
// and the virtual servers as written), and a partial sync re-plans only the changed Services
// and writes the difference against that model without reading the kernel back: O(changed),
// not O(N). It reads only one virtual server (`ipvsadm -Ln -t VIP:PORT`) when a real server
// leaves it, for the connection counters graceful termination needs. Removed real servers drain gracefully
// (weight 0 until their connections end), checked on every sync and on a short timer.
// This file is the mode's composition root: the only one in src/modes/ipvs that touches
// the host, and only through the executors in src/exec.
import { SkippedVIPReporter } from '../skipped-vips.ts';
import { release } from 'node:os';
import type { Logger } from '../../log.ts';
import type { ModeDeps, Proxier, SyncStats } from '../types.ts';
import { portsInOrder, type PlanInput } from '../../core/nodeview.ts';
import type { ServicePort } from '../../core/model.ts';
import { Ipvsadm } from '../../kernel/ipvs/exec.ts';
import { IptablesExecutor } from '../../kernel/iptables/exec.ts';
import { IPSetExec } from '../../kernel/ipset/exec.ts';
import { Links } from '../../kernel/links.ts';
import { ensureSysctl, procSysctl, type Sysctl } from '../../kernel/sysctl.ts';
import { ensureModules, type ModuleFS } from '../../kernel/modules.ts';
import { BASE_MODULES, DUMMY_DEVICE, schedulerModule } from './names.ts';
import { withMissingJumps } from './iptables-rules.ts';
import { planContext, planPort } from './planner.ts';
import { type IpvsPlan, type PlanContext, type Rejected } from './plan-model.ts';
import { PlanState, type PlanDelta } from './plan-state.ts';
import { diffIPSets, type IPSetDiff, type IPSetTable } from '../../kernel/ipset/model.ts';
import { afterDiff, diffIpvs, drainLines, drainsAtOnce, ownershipPredicate, type IpvsDiff } from './diff.ts';
import { applyLines, splitHostPort, virtualServerKey, type IpvsTable, type VirtualServer, type VirtualServerState } from '../../kernel/ipvs/model.ts';
import { ExecError } from '../../kernel/runner.ts';
import { plannedSysctls, sysctlApplies } from './sysctls.ts';
import { renderPlan } from './render.ts';
import { ipFamily } from '../../core/ip.ts';
import { coded } from '../../errors.ts';

/** The IPVS mode's iptables payload is small (its chains and set matches): 30 s is plenty. */
const IPVS_IPTABLES_TIMEOUT_MS = 30_000;

/**
 * Re-reads of the IPVS table allowed per sync while isolating refused ipvsadm lines (about
 * log2(lines) per refused line); past it the host is broken rather than one Service.
 */
const MAX_REREADS = 64;

/** draining virtual servers read one by one (`ipvsadm -Ln -t`) up to this many; past it, one whole listing is cheaper */
const MAX_SINGLE_READS = 16;

/**
 * whether diffing a virtual server needs its live connection counters: a TCP/SCTP real server
 * leaves it (weight 0 while in use, deleted once drained); UDP ones go at once
 */
function needsCounters(have: VirtualServerState, want: VirtualServerState): boolean {
  if (drainsAtOnce(want.vs)) return false;
  for (const rk of have.reals.keys()) if (!want.reals.has(rk)) return true;
  return false;
}

/** the service port owning the virtual server an ipvsadm line names ('' when none: a stale one) */
function ipvsLineOwner(p: Pick<IpvsPlan, 'owners'>, line: string): string {
  const w = line.trim().split(/\s+/);
  const protocol = w[1] === '-u' ? 'UDP' : w[1] === '--sctp-service' ? 'SCTP' : 'TCP';
  const hp = splitHostPort(w[2] ?? '');
  return hp ? (p.owners.get(virtualServerKey({ ...hp, protocol })) ?? '') : '';
}

/** A sync step: runs `fn`, logs and keeps its error, and says whether it succeeded (see IpvsProxier.steps). */
type Step = (what: string, fn: () => Promise<void>) => Promise<boolean>;

/** The IPVS difference of a sync that writes no IPVS line. */
function emptyIpvsDiff(): IpvsDiff {
  return { lines: [], terminating: new Set(), counts: { vsAdded: 0, vsEdited: 0, vsDeleted: 0, rsAdded: 0, rsEdited: 0, rsDeleted: 0 } };
}

/** Every port of the node view planned into a fresh model (a full sync's plan); its delta is consumed. */
function planAllPorts(ctx: PlanContext): PlanState {
  const st = new PlanState(ctx.family);
  for (const v of portsInOrder(ctx.view)) {
    const f = planPort(ctx, v);
    if (f) st.put(v.sp.key, f);
  }
  st.takeDelta();
  return st;
}

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
  // IPv6 virtual servers need ip6tables for their masquerade and filter rules.
  if (opts.family === 6) await requireIp6tables(runner);
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

async function requireIp6tables(runner: ModeDeps['runner']): Promise<void> {
  let code: number;
  try {
    code = (await runner.run('ip6tables-restore', ['--version'], { timeoutMs: 10_000 })).code;
  } catch (e) {
    if (e instanceof ExecError && e.code === 'KPROXY_EXEC_MISSING') code = 127;
    else throw e;
  }
  if (code === 127) throw new ExecError('KPROXY_EXEC_MISSING', 'ip6tables-restore not found; install the iptables package for IPv6 Services');
}

export class IpvsProxier implements Proxier {
  private readonly ipvsadm: Ipvsadm;
  private readonly ipset: IPSetExec;
  private readonly links: Links;
  private readonly log: Logger;
  private skippedVIPs?: SkippedVIPReporter;
  /** the plan as last applied, fragment by fragment (null until a full sync succeeded) */
  private model: PlanState | null = null;
  private modelCtx: PlanContext | null = null;
  /**
   * kproxy's virtual servers as the kernel holds them after the last apply (the full sync's
   * listing with every line written since applied to it); valid with `model`
   */
  private kernel: IpvsTable = new Map();
  private lastIptables = '';
  /** virtual servers this process created (owned even if their VIP bookkeeping is lost) */
  private readonly created = new Set<string>();
  /** "vsKey/rsKey" of real servers at weight 0 waiting for their connections to end */
  readonly terminating = new Set<string>();
  private chain: Promise<unknown> = Promise.resolve();
  /** what the kernel (or the planner, for it) refuses, by line: left out and reported once */
  private readonly refusals = new Map<string, Rejected>();
  /** refusals reported since start (a counter for metrics) */
  refusedTotal = 0;
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

  sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    return this.serial(async () => {
      const ctx = planContext(input);
      // a partial sync needs the model of a successful full sync under the same node facts
      if (full || !this.model || this.modelCtx?.key !== ctx.key) return this.fullSync(input, ctx);
      return this.partialSync(input, ctx, changed);
    });
  }

  /** the step runner of a sync: each part is tried even when an earlier one failed */
  private steps(): { errors: Error[]; step: Step } {
    const errors: Error[] = [];
    const step = async (what: string, fn: () => Promise<void>): Promise<boolean> => {
      try {
        await fn();
        return true;
      } catch (e) {
        errors.push(e as Error);
        this.log.error({ err: e, step: what }, `ipvs sync: ${what} failed; the other parts are still applied`);
        return false;
      }
    };
    return { errors, step };
  }

  private async fullSync(input: PlanInput, ctx: PlanContext): Promise<SyncStats> {
    (this.skippedVIPs ??= new SkippedVIPReporter(this.log)).report(input);
    this.model = null;
    const st = planAllPorts(ctx);
    const p = st.toPlan(ctx);
    // Failure isolation: each part (device, ipsets, iptables, IPVS, addresses) is tried even
    // when an earlier one failed, since the kernel does not tie them together; the first
    // failure is thrown at the end so that the loop retries with a full sync.
    const { errors, step } = this.steps();
    const seen = new Set<string>();
    for (const r of p.rejected) this.noteRefusal(`plan ${r.owner} ${r.what}`, r, seen);

    const dummyOK = await step('dummy device', async () => {
      await this.links.ensureDummy(DUMMY_DEVICE);
    });
    // ipsets first: the iptables rules reference them by name
    const { liveSets, setDiff } = await this.fullIpsets(p, step, seen);
    await this.fullIptables(p, step);
    let dummyAddrs: string[] = [];
    if (dummyOK) await step('kube-ipvs0 addresses', async () => {
      dummyAddrs = (await this.links.addresses(DUMMY_DEVICE)).filter((a) => ipFamily(a) === p.family);
    });
    const { d, kernel } = await this.fullIpvs(input, p, step, dummyAddrs, liveSets, seen);
    const addrChanges = await this.fullAddresses(p, dummyAddrs, dummyOK, step);

    // a full sync plans and tries every line again: forget the refusals it did not meet again
    for (const k of [...this.refusals.keys()]) if (!seen.has(k)) this.refusals.delete(k);

    if (errors.length) throw errors[0];
    // from now on partial syncs diff against this model instead of reading the kernel
    this.model = st;
    this.modelCtx = ctx;
    this.kernel = kernel;
    const diff = this.diffSummary(d.counts, setDiff.added, setDiff.deleted, addrChanges);
    if (d.lines.length || setDiff.script || addrChanges) this.log.info({ diff }, 'ipvs sync applied changes');
    return {
      rulesWritten: d.lines.length + setDiff.added + setDiff.deleted + addrChanges,
      rulesTotal: p.table.size + st.realServers,
      diff,
      rejected: this.refusals.size,
    };
  }

  /**
   * A full sync's ipsets: the live sets read and the difference restored, every line tried
   * again (partial syncs leave refused ones out). The live sets also tell the IPVS step
   * which virtual servers are kproxy's.
   */
  private async fullIpsets(p: IpvsPlan, step: Step, seen: Set<string>): Promise<{ liveSets: IPSetTable; setDiff: IPSetDiff }> {
    let liveSets: IPSetTable = new Map();
    let setDiff: IPSetDiff = { script: '', added: 0, deleted: 0, created: 0 };
    await step('ipset restore', async () => {
      liveSets = await this.ipset.save();
      setDiff = diffIPSets(p.sets, liveSets);
      const { refused } = await this.ipset.restoreIsolating(setDiff.script.split('\n').filter(Boolean).join('\n'));
      for (const f of refused) {
        const w = f.line.trim().split(/\s+/);
        const owner = p.entryOwners.get(`${w[1]} ${w[2]}`) ?? '';
        this.noteRefusal(`ipset ${f.line}`, { owner, what: `ipset ${f.line.replace(/\s+-exist$/, '')}`, reason: f.error }, seen);
      }
    });
    return { liveSets, setDiff };
  }

  /** A full sync's iptables: kproxy's chains restored, with the jumps from built-in chains checked in the same restore. */
  private async fullIptables(p: IpvsPlan, step: Step): Promise<void> {
    const ipt = new IptablesExecutor(this.opts.runner, p.family);
    await step(`${p.family === 6 ? 'ip6tables' : 'iptables'}-restore`, async () => {
      await ipt.restoreOwned(withMissingJumps(p.iptables, await ipt.saveAll()), 'KPROXY_IPVS_IPTABLES_FAILED', IPVS_IPTABLES_TIMEOUT_MS);
      this.lastIptables = p.iptables;
    });
  }

  /**
   * A full sync's IPVS table: the live table read, the difference to kproxy's own virtual
   * servers written (refused lines isolated), and the model of the kernel kept for partial
   * syncs. On success the created and draining sets follow the plan.
   */
  private async fullIpvs(
    input: PlanInput,
    p: IpvsPlan,
    step: Step,
    dummyAddrs: string[],
    liveSets: IPSetTable,
    seen: Set<string>,
  ): Promise<{ d: IpvsDiff; kernel: IpvsTable }> {
    let d: IpvsDiff = emptyIpvsDiff();
    let kernel: IpvsTable = new Map();
    const ipvsOK = await step('ipvsadm -R', async () => {
      const live = await this.ipvsadm.list();
      const owned = ownershipPredicate({
        dummyAddresses: dummyAddrs,
        liveSets,
        nodeIPs: p.nodePortIPs,
        created: this.created,
        excludeCIDRs: input.config.ipvs.excludeCIDRs,
        family: p.family,
      });
      d = diffIpvs(p.table, live, owned);
      let isolated: boolean;
      try {
        isolated = await this.restoreIpvsIsolating(p, d.lines, owned, seen);
      } finally {
        for (const k of p.table.keys()) this.created.add(k);
      }
      // the model of kproxy's virtual servers from now on: the listing with the lines written
      // (read again only when lines were refused: which ones got in is then the kernel's word)
      if (isolated) {
        kernel = new Map();
        for (const [k, v] of await this.ipvsadm.list()) if (p.table.has(k) || owned(k, v.vs)) kernel.set(k, v);
      } else kernel = afterDiff(p.table, live, d.terminating);
    });
    if (ipvsOK) {
      for (const k of [...this.created]) if (!p.table.has(k)) this.created.delete(k);
      this.terminating.clear();
      for (const k of d.terminating) this.terminating.add(k);
    }
    return { d, kernel };
  }

  /** A full sync's kube-ipvs0 addresses: the planned ones added, the others removed; returns the number of changes. */
  private async fullAddresses(p: IpvsPlan, dummyAddrs: string[], dummyOK: boolean, step: Step): Promise<number> {
    const want = new Set(p.boundAddresses);
    const have = new Set(dummyAddrs);
    const toAdd = p.boundAddresses.filter((a) => !have.has(a));
    const toDel = dummyAddrs.filter((a) => !want.has(a));
    if (dummyOK) await step('kube-ipvs0 addresses', () => this.links.changeAddresses(DUMMY_DEVICE, toAdd, toDel));
    return toAdd.length + toDel.length;
  }

  /** The one-line summary of a sync's changes, logged and returned in its stats. */
  private diffSummary(c: IpvsDiff['counts'], setAdded: number, setDeleted: number, addrChanges: number): string {
    const refusedNote = this.refusals.size ? `; ${this.refusals.size} left out (refused)` : '';
    return (
      `ipvs: +${c.vsAdded} ~${c.vsEdited} -${c.vsDeleted} virtual servers, +${c.rsAdded} ~${c.rsEdited} -${c.rsDeleted} real servers` +
      `${this.terminating.size ? ` (${this.terminating.size} draining)` : ''}; ipset: +${setAdded} -${setDeleted}; addresses: ${addrChanges} changed${refusedNote}`
    );
  }

  /**
   * A partial sync: the changed Services' ports are planned again and only the difference to
   * the model of the last apply is written, with no read of the whole kernel state. A
   * virtual server that loses a TCP/SCTP real server is read alone (its connection counters
   * decide between weight 0 and delete). Any failure drops the model: the loop's next sync is
   * a full one, which reads the kernel again.
   */
  private async partialSync(input: PlanInput, ctx: PlanContext, changed: Set<string>): Promise<SyncStats> {
    const st = this.model!;
    const delta = this.replanChanged(input, ctx, changed);
    const { errors, step } = this.steps();
    const seen = new Set<string>();
    for (const r of st.rejected()) this.noteRefusal(`plan ${r.owner} ${r.what}`, r, seen);

    const setLines = await this.partialIpsets(st, delta, step, seen);
    await this.partialIptables(st, ctx, step);
    const d = await this.partialIpvs(st, delta, step, seen);
    const addrChanges = delta.addressesAdded.length + delta.addressesDeleted.length;
    if (addrChanges) await step('kube-ipvs0 addresses', () => this.links.changeAddresses(DUMMY_DEVICE, delta.addressesAdded, delta.addressesDeleted));

    for (const k of [...this.refusals.keys()]) if (!seen.has(k) && k.startsWith('plan ')) this.refusals.delete(k);
    if (errors.length) {
      // the kernel may now hold anything between the old and the new state: read it again
      this.model = null;
      throw errors[0];
    }
    const setAdded = delta.entriesAdded.length;
    const setDeleted = delta.entriesDeleted.length;
    const diff = this.diffSummary(d.counts, setAdded, setDeleted, addrChanges);
    if (d.lines.length || setLines.length || addrChanges) this.log.info({ diff }, 'ipvs sync applied changes');
    return {
      rulesWritten: d.lines.length + setAdded + setDeleted + addrChanges,
      rulesTotal: st.table.size + st.realServers,
      diff,
      rejected: this.refusals.size,
    };
  }

  /**
   * The changed Services' ports planned again into the model (a port no longer planned is
   * removed from it); returns what changed. Only the changed Services can hold a newly
   * skipped VIP, so only they are reported (their ports before safeServicePort).
   */
  private replanChanged(input: PlanInput, ctx: PlanContext, changed: Set<string>): PlanDelta {
    const st = this.model!;
    const isChanged = (sp: ServicePort) => changed.has(sp.serviceKey);
    const ports = portsInOrder(ctx.view, changed);
    const raw = changed.size ? [...input.state.services.values()].filter(isChanged) : [];
    (this.skippedVIPs ??= new SkippedVIPReporter(this.log)).report({ ...input, state: { ...input.state, services: new Map(raw.map((sp) => [sp.key, sp])) } });
    const planned = new Set<string>();
    for (const v of ports) {
      const f = planPort(ctx, v);
      if (f) planned.add(v.sp.key);
      st.put(v.sp.key, f ?? undefined);
    }
    for (const svc of changed) for (const k of [...(st.byService.get(svc) ?? [])]) if (!planned.has(k)) st.put(k, undefined);
    return st.takeDelta();
  }

  /** A partial sync's ipsets: the changed entries written, lines refused before left out; returns the lines meant. */
  private async partialIpsets(st: PlanState, delta: PlanDelta, step: Step, seen: Set<string>): Promise<string[]> {
    const setLines = [
      ...delta.entriesDeleted.map((e) => `del ${e} -exist`),
      ...delta.entriesAdded.map((e) => `add ${e} -exist`),
    ];
    if (setLines.length) await step('ipset restore', async () => {
      const { refused } = await this.ipset.restoreIsolating(this.withoutRefused('ipset', setLines, seen).join('\n'));
      for (const f of refused) {
        const w = f.line.trim().split(/\s+/);
        const owner = st.entryOwner(`${w[1]} ${w[2]}`);
        this.noteRefusal(`ipset ${f.line}`, { owner, what: `ipset ${f.line.replace(/\s+-exist$/, '')}`, reason: f.error }, seen);
      }
    });
    return setLines;
  }

  /** A partial sync's iptables: kproxy's chains restored only when their text changed. */
  private async partialIptables(st: PlanState, ctx: PlanContext, step: Step): Promise<void> {
    const text = st.iptables(ctx);
    if (text === this.lastIptables) return;
    await step(`${ctx.family === 6 ? 'ip6tables' : 'iptables'}-restore`, async () => {
      await new IptablesExecutor(this.opts.runner, ctx.family).restoreOwned(text, 'KPROXY_IPVS_IPTABLES_FAILED', IPVS_IPTABLES_TIMEOUT_MS);
      this.lastIptables = text;
    });
  }

  /**
   * A partial sync's IPVS lines: the changed virtual servers diffed against the model of the
   * kernel (one that loses a TCP/SCTP real server read alone, for its connection counters),
   * the difference written, and the model, created and draining sets moved along.
   */
  private async partialIpvs(st: PlanState, delta: PlanDelta, step: Step, seen: Set<string>): Promise<IpvsDiff> {
    let d: IpvsDiff = emptyIpvsDiff();
    if (delta.virtualServers.length) await step('ipvsadm -R', async () => {
      const want: IpvsTable = new Map();
      const have: IpvsTable = new Map();
      for (const k of delta.virtualServers) {
        const w = st.table.get(k);
        if (w) want.set(k, w);
        let h = this.kernel.get(k);
        if (h && w && needsCounters(h, w)) {
          h = (await this.ipvsadm.listService(h.vs)).get(k);
          if (h) this.kernel.set(k, h);
          else this.kernel.delete(k);
        }
        if (h) have.set(k, h);
      }
      d = diffIpvs(want, have, () => true);
      const lines = this.withoutRefused('ipvsadm', d.lines, seen);
      await this.ipvsadm.restore(lines);
      if (lines.length === d.lines.length) {
        for (const [k, v] of afterDiff(want, have, d.terminating)) this.kernel.set(k, v);
        for (const k of delta.virtualServers) if (!want.has(k)) this.kernel.delete(k);
      } else applyLines(this.kernel, lines); // lines refused before were left out: follow what was sent
      for (const k of delta.virtualServers) {
        if (want.has(k)) this.created.add(k);
        else this.created.delete(k);
      }
      const touched = new Set(delta.virtualServers);
      for (const t of [...this.terminating]) if (touched.has(t.slice(0, t.lastIndexOf('/')))) this.terminating.delete(t);
      for (const t of d.terminating) this.terminating.add(t);
    });
    return d;
  }

  /**
   * `ipvsadm -R` goes on past a refused line but does not say which line it was, and a
   * usage error ends the batch. So after a failed batch the live table is read again and
   * what is still missing is applied in halves, down to single lines: a line refused on its
   * own is set aside and reported with its service, every other line gets in. Lines are not
   * idempotent (-A twice fails), hence the re-read before every retry, never a blind one.
   * True when the batch failed and lines were isolated (the kernel's state must be read).
   */
  private async restoreIpvsIsolating(
    p: IpvsPlan,
    lines: string[],
    owned: (vsKey: string, vs: VirtualServer) => boolean,
    seen: Set<string>,
  ): Promise<boolean> {
    const budget = { rereads: MAX_REREADS };
    await this.applyIpvsLines(p, lines, owned, seen, budget);
    return budget.rereads < MAX_REREADS;
  }

  private async applyIpvsLines(
    p: IpvsPlan,
    lines: string[],
    owned: (vsKey: string, vs: VirtualServer) => boolean,
    seen: Set<string>,
    budget: { rereads: number },
  ): Promise<void> {
    let failure: ExecError;
    try {
      await this.ipvsadm.restore(lines);
      return;
    } catch (e) {
      if (!(e instanceof ExecError) || e.code !== 'KPROXY_IPVS_APPLY_FAILED') throw e;
      failure = e;
    }
    if (budget.rereads-- <= 0) {
      throw new ExecError('KPROXY_IPVS_APPLY_FAILED', `ipvsadm -R keeps refusing lines; gave up isolating them: ${failure.message}`);
    }
    const still = new Set(diffIpvs(p.table, await this.ipvsadm.list(), owned).lines);
    const residue = lines.filter((l) => still.has(l));
    if (residue.length === 1 && lines.length === 1) {
      const reason = (failure.result?.stderr ?? failure.message).trim();
      this.noteRefusal(`ipvsadm ${residue[0]}`, { owner: ipvsLineOwner(p, residue[0]), what: `ipvsadm ${residue[0]}`, reason }, seen);
      return;
    }
    if (residue.length <= 1) {
      for (const l of residue) await this.applyIpvsLines(p, [l], owned, seen, budget);
      return;
    }
    const mid = Math.ceil(residue.length / 2);
    await this.applyIpvsLines(p, residue.slice(0, mid), owned, seen, budget);
    await this.applyIpvsLines(p, residue.slice(mid), owned, seen, budget);
  }

  /** lines minus those refused before (partial syncs only: full syncs try them again) */
  private withoutRefused(kind: 'ipset' | 'ipvsadm', lines: string[], seen: Set<string>): string[] {
    if (this.refusals.size === 0) return lines;
    return lines.filter((l) => {
      const k = `${kind} ${l}`;
      if (!this.refusals.has(k)) return true;
      seen.add(k);
      return false;
    });
  }

  /** records a refusal; logs and counts it only when it is new (no log flood per sync) */
  private noteRefusal(key: string, r: Rejected, seen: Set<string>): void {
    seen.add(key);
    if (this.refusals.has(key)) return;
    this.refusals.set(key, r);
    this.refusedTotal++;
    this.log.warn(
      { code: 'KPROXY_IPVS_REFUSED', service: r.owner || undefined, entry: r.what, reason: r.reason },
      coded('KPROXY_IPVS_REFUSED', `${r.what} left out${r.owner ? ` (service port ${r.owner})` : ''}: ${r.reason}; fix the Service (every other service is applied)`),
    );
  }

  /** deletes terminating real servers whose connections have ended */
  checkGraceful(): Promise<number> {
    return this.serial(async () => {
      if (this.terminating.size === 0) return 0;
      const live = await this.drainingListing();
      const { lines, still } = drainLines(this.terminating, live);
      await this.ipvsadm.restore(lines);
      if (this.model) applyLines(this.kernel, lines);
      this.terminating.clear();
      for (const k of still) this.terminating.add(k);
      if (lines.length) this.log.info({ deleted: lines.length }, 'drained real servers deleted');
      return lines.length;
    });
  }

  /**
   * The virtual servers holding draining real servers, with their counters: read one by one
   * when they are few (the usual case: a rollout of a few Services), else the whole table.
   */
  private async drainingListing(): Promise<IpvsTable> {
    const keys = new Set([...this.terminating].map((t) => t.slice(0, t.lastIndexOf('/'))));
    const known = [...keys].map((k) => this.kernel.get(k));
    if (!this.model || keys.size > MAX_SINGLE_READS || known.some((v) => !v)) return this.ipvsadm.list();
    const out: IpvsTable = new Map();
    for (const v of known as VirtualServerState[]) {
      for (const [k, st] of await this.ipvsadm.listService(v.vs)) out.set(k, st);
    }
    return out;
  }

  dump(): string {
    return this.model && this.modelCtx ? renderPlan(this.model.toPlan(this.modelCtx)) : '';
  }

  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    await this.chain;
  }
}
