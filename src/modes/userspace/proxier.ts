// The userspace Proxier: reconciles open listeners, balancers and REDIRECT rules with the
// plan of each sync. Listeners are keyed by a stable id, so a sync only opens what is new
// and closes what is gone (closing stops accepting; spliced connections finish on their
// own), and an endpoint change only swaps the balancer's list: removed endpoints get no new
// connections, their open ones carry on.
import { networkInterfaces } from 'node:os';
import type { ProxyConfig } from '../../config/config.ts';
import { canonicalIP } from '../../core/ip.ts';
import type { CommandRunner } from '../../kernel/runner.ts';
import type { Logger } from '../../log.ts';
import { hasRules, planUserspace, renderPlan, restorePayload, sctpRefusal, type PlannedListener, type UserspacePlan } from './plan.ts';
import type { Proxier, SyncStats } from '../types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import { admissionFor } from './dataplane/admit.ts';
import { RoundRobinBalancer } from './dataplane/balancer.ts';
import { applyRedirects, removeRedirects } from './dataplane/redirect.ts';
import { processBudgets, type ProcessBudgets } from './dataplane/limits.ts';
import { newCounters, type ForwardCounters } from './dataplane/tcp.ts';
import { createTcpForwarder, type AnyTcpForwarder } from './dataplane/tcp-raw.ts';
import { WorkerPool, type WorkerPoolStats, type WorkerStat } from './dataplane/workers.ts';
import { capOwnerFor } from './dataplane/worker-cap.ts';
import { UdpForwarder } from './dataplane/udp.ts';
import { coded, kproxyError } from '../../errors.ts';

export interface UserspaceProxierOptions {
  config: ProxyConfig;
  log: Logger;
  runner: CommandRunner;
  /** may this proxier program iptables REDIRECT rules (root with iptables)? */
  redirect: boolean;
  /** addresses this host can bind besides loopback; default: the interfaces' addresses */
  localAddresses?: () => string[];
  dialTimeoutsMs?: number[];
  /** the process's TCP connection and UDP session budgets; default: the process-wide ones */
  budgets?: ProcessBudgets;
}

/** Per service port, for metrics. */
export interface ServicePortCounters extends ForwardCounters {
  servicePort: string;
  protocol: 'TCP' | 'UDP';
}

interface LiveListener {
  plan: PlannedListener;
  fwd: AnyTcpForwarder | UdpForwarder;
  port: number;
}

export function interfaceAddresses(): string[] {
  const out: string[] = [];
  for (const list of Object.values(networkInterfaces())) {
    for (const a of list ?? []) {
      const ip = canonicalIP(a.address.split('%')[0]);
      if (ip) out.push(ip);
    }
  }
  return out;
}

export class UserspaceProxier implements Proxier {
  private readonly listeners = new Map<string, LiveListener>();
  private readonly balancers = new Map<string, RoundRobinBalancer>();
  private readonly counterMap = new Map<string, ServicePortCounters>();
  /** SCTP service ports refused and already logged (logged again only after they left and came back) */
  private sctpLogged = new Set<string>();
  /** SCTP service ports refused since start (each counted once per appearance) */
  private sctpRefusedTotal = 0;
  private plan: UserspacePlan | null = null;
  /** the payload last written; null when kproxy believes no chain of its own is installed */
  private appliedPayload: string | null = null;
  private synced = false;
  private lastNotes = '';
  private readonly budgets: ProcessBudgets;
  /** worker processes that accept on the TCP listeners too (userspace.workers > 1) */
  private readonly workers: WorkerPool | null;

  constructor(private readonly opts: UserspaceProxierOptions) {
    const us = opts.config.userspace;
    this.budgets = opts.budgets ?? processBudgets(us);
    // A configured maxConnections holds over every process: this one owns it and lends it out.
    const cap = us.workers > 1 && us.maxConnections > 0 ? capOwnerFor(this.budgets.tcp, us.maxConnections) : undefined;
    this.workers = us.workers > 1
      ? new WorkerPool({ count: us.workers - 1, settings: us, log: opts.log, dialTimeoutsMs: opts.dialTimeoutsMs, cap, pick: (key, ip, reset, exclude) => this.balancers.get(key)?.next(ip, reset, exclude) ?? null })
      : null;
  }

  get redirect(): boolean {
    return this.opts.redirect;
  }

  async sync(input: PlanInput, _changed: Set<string>, full: boolean): Promise<SyncStats> {
    const localAddresses = this.opts.localAddresses ? this.opts.localAddresses() : interfaceAddresses();
    const plan = planUserspace(input, { redirect: this.opts.redirect, localAddresses });
    const wanted = new Map(plan.listeners.map((l) => [l.id, l]));
    const changes: string[] = [];

    // Close first: a listener whose id changed may want the same address back.
    for (const [id, live] of this.listeners) {
      if (wanted.has(id)) continue;
      live.fwd.close();
      this.listeners.delete(id);
      changes.push(`- ${id}`);
      await this.workers?.closeListener(id);
    }
    this.updateBalancers(plan);
    this.workers?.setBalancers(plan.listeners);
    const failures: string[] = [];
    for (const l of plan.listeners) {
      const live = this.listeners.get(l.id);
      if (live) {
        this.rebind(live, l);
        continue;
      }
      try {
        const live = await this.open(l);
        this.listeners.set(l.id, live);
        changes.push(`+ ${l.id}`);
        if (this.workers && !(live.fwd instanceof UdpForwarder)) await this.workers.addListener(l, live.fwd.listener);
      } catch (e) {
        failures.push(`${l.protocol} ${l.host}:${l.port} (${l.servicePortKey}): ${(e as Error).message}`);
      }
    }
    const rulesWritten = await this.syncRules(plan, full || !this.synced);
    this.plan = plan;
    this.synced = true;
    // Frontends that cannot be served are worth a warning, once per change, not every sync.
    const notes = plan.notes.join('\n');
    if (notes !== this.lastNotes) for (const n of plan.notes) this.opts.log.warn(coded('KPROXY_USERSPACE_UNSERVED', n));
    this.lastNotes = notes;
    this.reportSctp(plan.sctpRefused);
    if (failures.length) {
      throw kproxyError('KPROXY_USERSPACE_BIND', `cannot listen on ${failures.join('; ')}; free the address or change the Service`);
    }
    return {
      rulesWritten: changes.length + rulesWritten,
      rulesTotal: this.listeners.size + plan.redirects.length + plan.drops.length,
      diff: changes.join('\n'),
    };
  }

  /** An SCTP service port is logged once (per service port, while it stays) and counted. */
  private reportSctp(keys: string[]): void {
    const now = new Set(keys);
    for (const k of keys) {
      if (this.sctpLogged.has(k)) continue;
      this.sctpRefusedTotal++;
      this.opts.log.warn({ code: 'KPROXY_USERSPACE_SCTP', servicePort: k }, coded('KPROXY_USERSPACE_SCTP', sctpRefusal(k)));
    }
    this.sctpLogged = now;
  }

  /** Service ports refused at plan time: the SCTP ones now, and how many were refused since start. */
  refused(): { sctp: string[]; sctpTotal: number } {
    return { sctp: [...this.sctpLogged].sort(), sctpTotal: this.sctpRefusedTotal };
  }

  private updateBalancers(plan: UserspacePlan): void {
    const used = new Set<string>();
    for (const l of plan.listeners) {
      if (used.has(l.balancerKey)) continue;
      used.add(l.balancerKey);
      let b = this.balancers.get(l.balancerKey);
      if (!b) this.balancers.set(l.balancerKey, (b = new RoundRobinBalancer({ stickyMaxAgeSeconds: l.stickyMaxAgeSeconds })));
      b.setStickyMaxAge(l.stickyMaxAgeSeconds);
      b.setEndpoints(l.endpoints.map((e) => ({ key: e.key, ip: e.ip, port: e.port })));
    }
    for (const k of [...this.balancers.keys()]) if (!used.has(k)) this.balancers.delete(k);
  }

  private countersFor(l: PlannedListener): ServicePortCounters {
    let c = this.counterMap.get(l.servicePortKey);
    if (!c || c.protocol !== l.protocol) {
      c = { servicePort: l.servicePortKey, protocol: l.protocol, ...newCounters() };
      this.counterMap.set(l.servicePortKey, c);
    }
    return c;
  }

  private async open(l: PlannedListener): Promise<LiveListener> {
    const balancer = this.balancers.get(l.balancerKey)!;
    const counters = this.countersFor(l);
    const log = this.opts.log;
    const admit = admissionFor(l);
    const us = this.opts.config.userspace;
    const fwd = l.protocol === 'TCP'
      ? createTcpForwarder({ host: l.host, port: l.port, balancer, counters, log, admit, dialTimeoutsMs: this.opts.dialTimeoutsMs, budget: this.budgets.tcp, idleTimeoutMs: us.idleTimeoutMs }, us.tcpPath)
      : new UdpForwarder({ hosts: [l.host, ...l.extraHosts], port: l.port, balancer, counters, log, admit, idleMs: this.opts.config.udpIdleTimeoutMs || 250, budget: this.budgets.udp });
    const port = await fwd.listen();
    return { plan: l, fwd, port };
  }

  /** An existing listener follows the plan's balancer (the policy may have changed) and timeouts. */
  private rebind(live: LiveListener, l: PlannedListener): void {
    live.plan = l;
    live.fwd.balancer = this.balancers.get(l.balancerKey)!;
    live.fwd.counters = this.countersFor(l);
    // The plan may have changed who is admitted (source ranges, policies) under the same id.
    live.fwd.admit = admissionFor(l);
    if (live.fwd instanceof UdpForwarder) live.fwd.idleMs = this.opts.config.udpIdleTimeoutMs || 250;
    else {
      live.fwd.idleTimeoutMs = this.opts.config.userspace.idleTimeoutMs;
      this.workers?.updateListener(l);
    }
  }

  /** Writes the REDIRECT rules when they changed (always on a full sync); returns rules written. */
  private async syncRules(plan: UserspacePlan, full: boolean): Promise<number> {
    if (!this.opts.redirect) return 0;
    // A rule for a listener that failed to bind would send traffic to a closed port.
    const redirects = plan.redirects.filter((r) => this.listeners.has(r.listenerId));
    if (!hasRules({ ...plan, redirects })) {
      if (this.appliedPayload !== null || full) {
        await removeRedirects(this.opts.runner, this.opts.log, [plan.family]);
        const written = this.appliedPayload === null ? 0 : 1;
        this.appliedPayload = null;
        return written;
      }
      return 0;
    }
    const payload = restorePayload({ ...plan, redirects }, (id) => this.listeners.get(id)!.port);
    if (payload === this.appliedPayload && !full) return 0;
    try {
      await applyRedirects(this.opts.runner, plan.family, payload);
    } catch (e) {
      // Unknown state: '' never equals a payload and is not null, so the next sync rewrites or removes.
      this.appliedPayload = '';
      throw e;
    }
    this.appliedPayload = payload;
    return redirects.length + plan.drops.length;
  }

  dump(): string {
    if (!this.plan) return '# userspace mode: not synced yet\n';
    return renderPlan(this.plan, (id) => this.listeners.get(id)?.port);
  }

  /** Counters per service port (accepted/failed/retried connections, open ones), for metrics. */
  counters(): ServicePortCounters[] {
    const out = [...this.counterMap.values()].map((c) => ({ ...c }));
    // The workers' connections count with the main process's, per service port.
    const fromWorkers = this.workers?.counters() ?? new Map<string, ForwardCounters>();
    for (const c of out) {
      const w = fromWorkers.get(`${c.servicePort}|${c.protocol}`);
      if (!w) continue;
      for (const k of Object.keys(w) as (keyof ForwardCounters)[]) c[k] += w[k];
    }
    return out.sort((a, b) => (a.servicePort < b.servicePort ? -1 : 1));
  }

  /** The worker processes, for tests and /debug: pid and connections accepted by each. */
  workerStats(): WorkerStat[] {
    return this.workers?.stats() ?? [];
  }

  /** Worker restarts and refused starts (tests, /debug); null without workers. */
  workerHealth(): WorkerPoolStats | null {
    return this.workers?.health() ?? null;
  }

  /** Bound port of a planned listener (tests, debug). */
  listenerPort(id: string): number | undefined {
    return this.listeners.get(id)?.port;
  }

  /** UDP sessions open now, over all listeners. */
  udpSessions(): number {
    let n = 0;
    for (const l of this.listeners.values()) if (l.fwd instanceof UdpForwarder) n += l.fwd.sessionCount;
    return n;
  }

  async stop(): Promise<void> {
    await this.workers?.stop();
    for (const l of this.listeners.values()) {
      l.fwd.destroy();
    }
    this.listeners.clear();
  }
}
