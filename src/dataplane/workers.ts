// userspace.workers > 1: extra processes accept on the same TCP listeners as kproxy's own
// process. kproxy binds every listener itself (so ports, ephemeral ports and bind errors stay
// in the sync), then hands a copy of the listening socket to each worker over IPC; the
// kernel gives each new connection to one of the processes waiting on it. A worker
// balances round robin on its own copy of the endpoints, except for ClientIP affinity:
// the affinity table lives in kproxy's process only, and a worker asks it for the endpoint
// of each new connection of a sticky Service, so every connection of a client goes to the
// same endpoint whichever process accepted it. UDP stays in kproxy's process (its sessions
// are per client address and need one owner).
//
// Workers are node processes forked with an IPC channel (not tools: src/exec/runner.ts is
// for those); they exit when kproxy's process goes (IPC disconnect), and one that dies is
// started again and given every listener.
import { fork, type ChildProcess } from 'node:child_process';
import type net from 'node:net';
import type { UserspaceSettings } from '../config/config.ts';
import type { Logger } from '../log.ts';
import type { PlannedListener } from '../modes/userspace/plan.ts';
import type { BalancedEndpoint } from './balancer.ts';
import type { ForwardCounters } from './tcp.ts';

export interface BalancerSpec {
  key: string;
  endpoints: BalancedEndpoint[];
  stickyMaxAgeSeconds: number;
}

/** kproxy → worker */
export type ToWorker =
  | { op: 'init'; settings: UserspaceSettings; workers: number; dialTimeoutsMs?: number[] }
  | { op: 'balancers'; list: BalancerSpec[] }
  | { op: 'listen'; id: string; plan: PlannedListener }
  | { op: 'update'; id: string; plan: PlannedListener }
  | { op: 'close'; id: string; req: number }
  | { op: 'picked'; req: number; endpoint: BalancedEndpoint | null };

/** worker → kproxy */
export type FromWorker =
  | { op: 'ready' }
  | { op: 'pick'; req: number; key: string; clientIP: string; reset: boolean; exclude: string[] }
  | { op: 'closed'; req: number }
  | { op: 'counters'; totals: [string, ForwardCounters][] };

export interface WorkerPoolOptions {
  /** processes to fork (kproxy's own process accepts too) */
  count: number;
  settings: UserspaceSettings;
  log: Logger;
  dialTimeoutsMs?: number[];
  /** the main process's balancer choice, for sticky Services */
  pick: (balancerKey: string, clientIP: string, reset: boolean, exclude: ReadonlySet<string>) => BalancedEndpoint | null;
  /** the worker entry; default: worker-main.ts next to this file (or the bundle's userspace-worker.js) */
  entry?: URL;
}

interface Worker {
  index: number;
  child: ChildProcess;
  ready: Promise<void>;
  totals: Map<string, ForwardCounters>;
  accepted: number;
}

const CLOSE_ACK_MS = 3000;
const RESTART_DELAY_MS = 1000;

export function workerEntry(): { url: URL; execArgv: string[] } {
  const fromSources = import.meta.url.endsWith('.ts');
  const url = new URL(fromSources ? './worker-main.ts' : './userspace-worker.js', import.meta.url);
  return { url, execArgv: fromSources ? ['--import', 'tsx'] : [] };
}

export class WorkerPool {
  private readonly workers: (Worker | null)[] = [];
  private readonly listeners = new Map<string, { plan: PlannedListener; server: net.Server }>();
  private balancers: BalancerSpec[] = [];
  private readonly pendingClose = new Map<number, () => void>();
  private nextReq = 1;
  private stopped = false;

  constructor(private readonly opts: WorkerPoolOptions) {
    for (let i = 0; i < opts.count; i++) this.workers.push(this.start(i));
  }

  private start(index: number): Worker {
    const { url, execArgv } = this.opts.entry ? { url: this.opts.entry, execArgv: this.opts.entry.pathname.endsWith('.ts') ? ['--import', 'tsx'] : [] } : workerEntry();
    const child = fork(url, [], { execArgv, stdio: ['ignore', 'inherit', 'inherit', 'ipc'], serialization: 'json' });
    let markReady: () => void = () => {};
    const w: Worker = { index, child, ready: new Promise((r) => (markReady = r)), totals: new Map(), accepted: 0 };
    child.on('message', (m: FromWorker) => this.onMessage(w, m, markReady));
    child.on('error', (e) => this.opts.log.warn({ err: e.message, worker: index }, 'userspace worker error'));
    child.on('exit', (code, signal) => {
      if (this.stopped || this.workers[index] !== w) return;
      this.opts.log.warn({ worker: index, code, signal }, 'userspace worker exited; starting it again');
      this.workers[index] = null;
      setTimeout(() => {
        if (this.stopped) return;
        const again = this.start(index);
        this.workers[index] = again;
        void this.replay(again);
      }, RESTART_DELAY_MS).unref();
    });
    this.send(w, { op: 'init', settings: this.opts.settings, workers: this.opts.count + 1, dialTimeoutsMs: this.opts.dialTimeoutsMs });
    return w;
  }

  private onMessage(w: Worker, m: FromWorker, markReady: () => void): void {
    switch (m.op) {
      case 'ready':
        markReady();
        return;
      case 'pick': {
        let endpoint: BalancedEndpoint | null = null;
        try {
          endpoint = this.opts.pick(m.key, m.clientIP, m.reset, new Set(m.exclude));
        } catch (e) {
          this.opts.log.error({ err: e }, 'userspace worker pick failed');
        }
        this.send(w, { op: 'picked', req: m.req, endpoint });
        return;
      }
      case 'closed':
        this.pendingClose.get(m.req)?.();
        return;
      case 'counters':
        w.totals = new Map(m.totals);
        w.accepted = 0;
        for (const c of w.totals.values()) w.accepted += c.accepted;
        return;
    }
  }

  private send(w: Worker, m: ToWorker, handle?: net.Server): Promise<void> {
    return new Promise((resolve) => {
      if (!w.child.connected) return resolve();
      try {
        w.child.send(m, handle as never, {}, () => resolve());
      } catch {
        resolve();
      }
    });
  }

  /** Sends everything a (re)started worker must hold. */
  private async replay(w: Worker): Promise<void> {
    await w.ready;
    await this.send(w, { op: 'balancers', list: this.balancers });
    for (const [id, l] of this.listeners) await this.send(w, { op: 'listen', id, plan: l.plan }, l.server);
  }

  /** Endpoints and affinity settings of every balancer the plan uses. */
  setBalancers(listeners: PlannedListener[]): void {
    const seen = new Set<string>();
    const list: BalancerSpec[] = [];
    for (const l of listeners) {
      if (l.protocol !== 'TCP' || seen.has(l.balancerKey)) continue;
      seen.add(l.balancerKey);
      list.push({ key: l.balancerKey, endpoints: l.endpoints.map((e) => ({ key: e.key, ip: e.ip, port: e.port })), stickyMaxAgeSeconds: l.stickyMaxAgeSeconds });
    }
    if (JSON.stringify(list) === JSON.stringify(this.balancers)) return;
    this.balancers = list;
    for (const w of this.workers) if (w) void w.ready.then(() => this.send(w, { op: 'balancers', list }));
  }

  /** Gives every worker a copy of a listening TCP socket. */
  async addListener(plan: PlannedListener, server: net.Server): Promise<void> {
    this.listeners.set(plan.id, { plan, server });
    await Promise.all(this.workers.map(async (w) => {
      if (!w) return;
      await w.ready;
      await this.send(w, { op: 'listen', id: plan.id, plan }, server);
    }));
  }

  /** A kept listener whose plan changed (admission, affinity): workers follow it. */
  updateListener(plan: PlannedListener): void {
    const l = this.listeners.get(plan.id);
    if (!l || JSON.stringify(l.plan) === JSON.stringify(plan)) return;
    l.plan = plan;
    for (const w of this.workers) if (w) void w.ready.then(() => this.send(w, { op: 'update', id: plan.id, plan }));
  }

  /** Workers stop accepting on a listener; resolves when they said so (or after a few seconds). */
  async closeListener(id: string): Promise<void> {
    if (!this.listeners.delete(id)) return;
    await Promise.all(this.workers.map((w) => {
      if (!w || !w.child.connected) return undefined;
      const req = this.nextReq++;
      return new Promise<void>((resolve) => {
        const t = setTimeout(done, CLOSE_ACK_MS);
        function done() {
          clearTimeout(t);
          resolve();
        }
        this.pendingClose.set(req, () => {
          this.pendingClose.delete(req);
          done();
        });
        void this.send(w, { op: 'close', id, req });
      });
    }));
  }

  /** Totals per "servicePort|protocol" over every worker. */
  counters(): Map<string, ForwardCounters> {
    const out = new Map<string, ForwardCounters>();
    for (const w of this.workers) {
      if (!w) continue;
      for (const [k, c] of w.totals) {
        const s = out.get(k);
        if (!s) out.set(k, { ...c });
        else for (const f of Object.keys(c) as (keyof ForwardCounters)[]) s[f] += c[f];
      }
    }
    return out;
  }

  stats(): { pid: number; accepted: number }[] {
    return this.workers.filter((w): w is Worker => !!w).map((w) => ({ pid: w.child.pid ?? 0, accepted: w.accepted }));
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await Promise.all(this.workers.map((w) => {
      if (!w || w.child.exitCode !== null || w.child.signalCode !== null) return undefined;
      return new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          w.child.kill('SIGKILL');
          resolve();
        }, 3000);
        w.child.once('exit', () => {
          clearTimeout(t);
          resolve();
        });
        w.child.kill('SIGTERM');
      });
    }));
  }
}
