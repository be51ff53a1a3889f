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
// Workers are forked at the first TCP listener (ensureStarted), as node processes started with src/kernel/runner.ts's forkNode (an argument array,
// an IPC channel, their own process group): the pool supervises them. One that exits is
// started again after a back-off (1 s, doubling to 30 s; back to 1 s once a worker lived
// 10 s) and given every listener; a fork the host refuses (EMFILE, EAGAIN) is logged,
// counted and retried the same way, never thrown. Workers exit when kproxy's process goes
// (IPC disconnect); stop() signals each worker's process group.
//
// userspace.maxConnections is node-wide: kproxy's process owns the cap and lends workers
// tokens in batches (worker-cap.ts).
import type { ChildProcess } from 'node:child_process';
import type net from 'node:net';
import type { UserspaceSettings } from '../../../config/config.ts';
import type { Logger } from '../../../log.ts';
import type { PlannedListener } from '../plan.ts';
import type { BalancedEndpoint } from './balancer.ts';
import type { ForwardCounters } from './tcp.ts';
import { forkNode, killGroup, spawnError, type ForkOptions } from '../../../kernel/runner.ts';
import { KproxyError } from '../../../errors.ts';
import { leaseBatch, type CapOwner } from './worker-cap.ts';

export interface BalancerSpec {
  key: string;
  endpoints: BalancedEndpoint[];
  stickyMaxAgeSeconds: number;
}

/** kproxy → worker */
export type ToWorker =
  | { op: 'init'; settings: UserspaceSettings; workers: number; dialTimeoutsMs?: number[]; capBatch: number }
  | { op: 'balancers'; list: BalancerSpec[] }
  | { op: 'listen'; id: string; plan: PlannedListener }
  | { op: 'update'; id: string; plan: PlannedListener }
  | { op: 'close'; id: string; req: number }
  | { op: 'picked'; req: number; endpoint: BalancedEndpoint | null }
  | { op: 'cap-grant'; n: number }
  | { op: 'cap-reclaim'; req: number };

/** worker → kproxy */
export type FromWorker =
  | { op: 'ready'; tcpPath?: 'net' | 'raw' }
  | { op: 'pick'; req: number; key: string; clientIP: string; reset: boolean; exclude: string[] }
  | { op: 'closed'; req: number }
  | { op: 'counters'; totals: [string, ForwardCounters][] }
  | { op: 'cap-want'; n: number }
  | { op: 'cap-return'; n: number }
  | { op: 'cap-returned'; req: number; n: number };

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
  /** the node-wide maxConnections (absent: each process bounds itself by its fd limit) */
  cap?: CapOwner;
  /** starts a worker; default: runner.ts's forkNode (tests inject failures) */
  fork?: (entry: URL, args: string[], opts: ForkOptions) => ChildProcess;
  /** first restart delay; doubles per consecutive failure up to RESTART_MAX_MS */
  restartDelayMs?: number;
}

export interface WorkerPoolStats {
  /** workers started again after an exit or a failed start */
  restarts: number;
  /** starts the host refused (EMFILE, EAGAIN, ...) */
  forkErrors: number;
}

/** One worker process as tests and /debug see it. */
export interface WorkerStat {
  pid: number;
  /** connections it accepted, as it last reported (every half second) */
  accepted: number;
  tcpPath?: 'net' | 'raw';
  /** every listener the pool held when it started was handed to it */
  holdsListeners: boolean;
}

interface Worker {
  index: number;
  /** the cap's name of this process (a restarted worker is a new holder) */
  id: string;
  child: ChildProcess;
  ready: Promise<void>;
  markReady: () => void;
  startedAt: number;
  totals: Map<string, ForwardCounters>;
  accepted: number;
  /** the TCP path the worker's forwarders take (tcp-raw.ts), as it reported at start */
  tcpPath?: 'net' | 'raw';
  /** set once the pool knows this process is gone */
  gone: boolean;
  /** resolves once it was sent what the pool holds (balancers, listeners) */
  replayed?: Promise<void>;
  /** true once every listener the pool held at its start was handed to it */
  holdsListeners?: boolean;
}

const CLOSE_ACK_MS = 3000;
const RESTART_DELAY_MS = 1000;
const RESTART_MAX_MS = 30_000;
/** a worker that lived this long starts the back-off again from its first step */
const STABLE_MS = 10_000;
const RECLAIM_ACK_MS = 1000;
const READY_MS = 30_000;
const STOP_GRACE_MS = 3000;

let poolSeq = 0;

export function workerEntry(): { url: URL; execArgv: string[] } {
  const fromSources = import.meta.url.endsWith('.ts');
  const url = new URL(fromSources ? './worker-main.ts' : './userspace-worker.js', import.meta.url);
  return { url, execArgv: fromSources ? ['--import', 'tsx'] : [] };
}

export class WorkerPool {
  private readonly workers: (Worker | null)[] = [];
  private readonly backoff: number[] = [];
  private readonly restartTimers = new Set<NodeJS.Timeout>();
  private readonly listeners = new Map<string, { plan: PlannedListener; server: net.Server }>();
  private balancers: BalancerSpec[] = [];
  private readonly pendingClose = new Map<number, () => void>();
  private readonly pendingReclaim = new Map<number, () => void>();
  private nextReq = 1;
  private stopped = false;
  private readonly seq = ++poolSeq;
  private generation = 0;
  private readonly counts: WorkerPoolStats = { restarts: 0, forkErrors: 0 };
  private started: Promise<void> | null = null;
  /** the totals of workers that exited */
  private readonly retired = new Map<string, ForwardCounters>();

  constructor(private readonly opts: WorkerPoolOptions) {
    for (let i = 0; i < opts.count; i++) {
      this.workers.push(null);
      this.backoff.push(this.firstDelay);
    }
  }

  /**
   * Forks the workers, once: at the first TCP listener (a proxier with none, e.g. the IPv6
   * one of a node without IPv6 Services, starts no process). Each is sent what the pool holds.
   */
  ensureStarted(): Promise<void> {
    if (!this.started) {
      this.started = (async () => {
        for (let i = 0; i < this.opts.count; i++) this.start(i);
        await Promise.all(this.workers.map((w) => w?.replayed));
      })();
    }
    return this.started;
  }

  private get firstDelay(): number {
    return this.opts.restartDelayMs ?? RESTART_DELAY_MS;
  }

  /** Forks worker `index`; a refused fork schedules another try, it never throws. */
  private start(index: number): void {
    const { url, execArgv } = this.opts.entry ? { url: this.opts.entry, execArgv: this.opts.entry.pathname.endsWith('.ts') ? ['--import', 'tsx'] : [] } : workerEntry();
    const fork = this.opts.fork ?? forkNode;
    let child: ChildProcess;
    try {
      child = fork(url, [], { execArgv });
    } catch (e) {
      this.startFailed(index, e);
      return;
    }
    let resolveReady: () => void = () => {};
    const ready = new Promise<void>((r) => (resolveReady = r));
    // A worker that never says ready must not hold up the sync: killed (and so restarted).
    const readyTimer = setTimeout(() => {
      this.opts.log.warn({ worker: index, pid: child.pid }, `userspace worker not ready within ${READY_MS} ms; killing it`);
      killGroup(child);
      resolveReady();
    }, READY_MS);
    readyTimer.unref();
    const markReady = () => {
      clearTimeout(readyTimer);
      resolveReady();
    };
    const w: Worker = { index, id: `${this.seq}.${index}.${++this.generation}`, child, ready, markReady, startedAt: Date.now(), totals: new Map(), accepted: 0, gone: false };
    this.workers[index] = w;
    this.opts.cap?.attach(w.id, { reclaim: () => this.reclaim(w) });
    child.on('message', (m: FromWorker) => this.onMessage(w, m));
    child.on('error', (e) => {
      // No pid: the process never started (node reports EMFILE/EAGAIN here); else an IPC error.
      if (child.pid === undefined) this.exited(w, () => this.startFailed(index, spawnError('userspace worker', e)));
      else this.opts.log.warn({ err: e.message, worker: index }, 'userspace worker error');
    });
    child.on('exit', (code, signal) =>
      this.exited(w, () => {
        this.opts.log.warn({ worker: index, code, signal }, 'userspace worker exited; starting it again');
        if (Date.now() - w.startedAt >= STABLE_MS) this.backoff[index] = this.firstDelay;
        this.scheduleRestart(index);
      }),
    );
    void this.send(w, { op: 'init', settings: this.opts.settings, workers: this.opts.count + 1, dialTimeoutsMs: this.opts.dialTimeoutsMs, capBatch: this.capBatch });
    w.replayed = this.replay(w);
  }

  private get capBatch(): number {
    return this.opts.cap ? leaseBatch(this.opts.cap.max, this.opts.count + 1) : 0;
  }

  /** Once per worker process: forget it (its lease; its totals stay counted) and react. */
  private exited(w: Worker, then: () => void): void {
    if (w.gone) return;
    w.gone = true;
    w.markReady();
    this.opts.cap?.detach(w.id);
    // Totals stay monotonic for the metrics; its open connections died with it.
    for (const [k, c] of w.totals) addCounters(this.retired, k, { ...c, active: 0 });
    if (this.workers[w.index] === w) this.workers[w.index] = null;
    if (!this.stopped) then();
  }

  private startFailed(index: number, e: unknown): void {
    this.counts.forkErrors++;
    const err = e instanceof KproxyError ? e : null;
    this.opts.log.warn({ code: err?.code ?? 'KPROXY_EXEC_SPAWN_FAILED', err: (e as Error)?.message ?? String(e), worker: index, retryInMs: this.backoff[index] }, 'userspace worker could not be started; trying again later');
    this.scheduleRestart(index);
  }

  private scheduleRestart(index: number): void {
    if (this.stopped) return;
    const delay = this.backoff[index];
    this.backoff[index] = Math.min(delay * 2, RESTART_MAX_MS);
    const t = setTimeout(() => {
      this.restartTimers.delete(t);
      if (this.stopped || this.workers[index]) return;
      this.counts.restarts++;
      this.start(index);
    }, delay);
    t.unref();
    this.restartTimers.add(t);
  }

  private onMessage(w: Worker, m: FromWorker): void {
    switch (m.op) {
      case 'ready':
        w.tcpPath = m.tcpPath;
        w.markReady();
        return;
      case 'pick': {
        let endpoint: BalancedEndpoint | null = null;
        try {
          endpoint = this.opts.pick(m.key, m.clientIP, m.reset, new Set(m.exclude));
        } catch (e) {
          this.opts.log.error({ err: e }, 'userspace worker pick failed');
        }
        void this.send(w, { op: 'picked', req: m.req, endpoint });
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
      case 'cap-want': {
        const cap = this.opts.cap;
        if (!cap) return void this.send(w, { op: 'cap-grant', n: 0 });
        void cap.want(w.id, m.n).then((n) => this.send(w, { op: 'cap-grant', n }));
        return;
      }
      case 'cap-return':
        this.opts.cap?.giveBack(w.id, m.n);
        return;
      case 'cap-returned':
        // Applied whenever it arrives, even after the reclaim gave up waiting: the worker did give them back.
        this.opts.cap?.giveBack(w.id, m.n);
        this.pendingReclaim.get(m.req)?.();
        return;
    }
  }

  /** Asks a worker for its unused tokens; resolves once applied, or after RECLAIM_ACK_MS. */
  private reclaim(w: Worker): Promise<void> {
    if (w.gone || !w.child.connected) return Promise.resolve();
    const req = this.nextReq++;
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        this.pendingReclaim.delete(req);
        resolve();
      };
      const t = setTimeout(done, RECLAIM_ACK_MS);
      this.pendingReclaim.set(req, done);
      void this.send(w, { op: 'cap-reclaim', req });
    });
  }

  private send(w: Worker, m: ToWorker, handle?: net.Server): Promise<void> {
    return new Promise((resolve) => {
      if (w.gone || !w.child.connected) return resolve();
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
    w.holdsListeners = true;
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
    // The first listener starts the workers, whose start sends every listener held.
    if (!this.started) return this.ensureStarted();
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
    for (const [k, c] of this.retired) addCounters(out, k, c);
    for (const w of this.workers) {
      if (!w) continue;
      for (const [k, c] of w.totals) addCounters(out, k, c);
    }
    return out;
  }

  stats(): WorkerStat[] {
    return this.workers.filter((w): w is Worker => !!w).map((w) => ({ pid: w.child.pid ?? 0, accepted: w.accepted, tcpPath: w.tcpPath, holdsListeners: !!w.holdsListeners }));
  }

  /** Restarts and refused starts since the pool began. */
  health(): WorkerPoolStats {
    return { ...this.counts };
  }

  /** Stops restarting; SIGTERM to each worker's process group, SIGKILL after a grace period. */
  async stop(): Promise<void> {
    this.stopped = true;
    for (const t of this.restartTimers) clearTimeout(t);
    this.restartTimers.clear();
    await Promise.all(this.workers.map((w) => {
      if (!w || w.child.exitCode !== null || w.child.signalCode !== null) return undefined;
      return new Promise<void>((resolve) => {
        const t = setTimeout(() => {
          killGroup(w.child);
          resolve();
        }, STOP_GRACE_MS);
        w.child.once('exit', () => {
          clearTimeout(t);
          resolve();
        });
        killGroup(w.child, 'SIGTERM');
      });
    }));
  }
}

function addCounters(into: Map<string, ForwardCounters>, key: string, c: ForwardCounters): void {
  const s = into.get(key);
  if (!s) into.set(key, { ...c });
  else for (const f of Object.keys(c) as (keyof ForwardCounters)[]) s[f] += c[f];
}
