// A userspace worker process (see workers.ts): accepts on copies of kproxy's TCP listeners,
// balances round robin on its own copy of the endpoints, and asks kproxy's process for the
// endpoint of a sticky (ClientIP affinity) Service's connection. Reports its counters every
// half second. Exits when kproxy's process goes. With a node-wide maxConnections, its
// connections take tokens from a lease kproxy's process grants (worker-cap.ts).
import type net from 'node:net';
import { createLogger } from '../../../log.ts';
import type { PlannedListener } from '../plan.ts';
import { admissionFor } from './admit.ts';
import { RoundRobinBalancer, type BalancedEndpoint } from './balancer.ts';
import { processBudgets } from './limits.ts';
import { newCounters, type EndpointPicker, type ForwardCounters } from './tcp.ts';
import { createTcpForwarder, resolveTcpPath, tcpPathChoice, type AnyTcpForwarder } from './tcp-raw.ts';
import { CapLease } from './worker-cap.ts';
import type { BalancerSpec, FromWorker, ToWorker } from './workers.ts';

const PICK_TIMEOUT_MS = 2000;
const REPORT_MS = 500;

const log = createLogger({ level: process.env.KPROXY_LOG_LEVEL ?? 'warn' });
const forwarders = new Map<string, AnyTcpForwarder>();
const local = new Map<string, RoundRobinBalancer>();
const sticky = new Map<string, number>();
const counters = new Map<string, ForwardCounters>();
const pending = new Map<number, { resolve: (e: BalancedEndpoint | null) => void; timer: NodeJS.Timeout; fallback: () => BalancedEndpoint | null }>();
let nextReq = 1;
let settings: Extract<ToWorker, { op: 'init' }> | null = null;
let lease: CapLease | null = null;

function send(m: FromWorker): void {
  if (process.connected) process.send?.(m);
}

/** Local round robin, or for a sticky Service the main process's choice (it owns the affinity table). */
function pickerFor(key: string): EndpointPicker {
  return {
    next(clientIP, reset = false, exclude) {
      const b = local.get(key);
      if (!(sticky.get(key) ?? 0)) return b?.next(clientIP, reset, exclude) ?? null;
      return new Promise((resolve) => {
        const req = nextReq++;
        const fallback = () => b?.next(clientIP, reset, exclude) ?? null;
        const timer = setTimeout(() => {
          pending.delete(req);
          resolve(fallback());
        }, PICK_TIMEOUT_MS);
        pending.set(req, { resolve, timer, fallback });
        send({ op: 'pick', req, key, clientIP, reset, exclude: exclude ? [...exclude] : [] });
      });
    },
  };
}

function countersFor(plan: PlannedListener): ForwardCounters {
  const k = `${plan.servicePortKey}|${plan.protocol}`;
  let c = counters.get(k);
  if (!c) counters.set(k, (c = newCounters()));
  return c;
}

function setBalancers(list: BalancerSpec[]): void {
  const keep = new Set<string>();
  for (const spec of list) {
    keep.add(spec.key);
    let b = local.get(spec.key);
    if (!b) local.set(spec.key, (b = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 })));
    b.setEndpoints(spec.endpoints);
    sticky.set(spec.key, spec.stickyMaxAgeSeconds);
  }
  for (const k of [...local.keys()]) {
    if (keep.has(k)) continue;
    local.delete(k);
    sticky.delete(k);
  }
}

function listen(id: string, plan: PlannedListener, server: net.Server): void {
  forwarders.get(id)?.close();
  if (!settings) return void server.close();
  const budgets = processBudgets(settings.settings);
  const fwd = createTcpForwarder({
    host: plan.host, port: plan.port, server, balancer: pickerFor(plan.balancerKey), counters: countersFor(plan), log,
    admit: admissionFor(plan), dialTimeoutsMs: settings.dialTimeoutsMs, budget: budgets.tcp, idleTimeoutMs: settings.settings.idleTimeoutMs,
  }, settings.settings.tcpPath);
  forwarders.set(id, fwd);
}

process.on('message', (m: ToWorker, handle?: net.Server) => {
  switch (m.op) {
    case 'init':
      settings = m;
      if (m.capBatch > 0 && !lease) {
        lease = new CapLease(m.capBatch, (n) => send({ op: 'cap-want', n }), (n) => send({ op: 'cap-return', n }));
        processBudgets(m.settings).tcp.shared = lease;
      }
      // The path this worker's forwarders take (its own feature check), for kproxy's stats.
      send({ op: 'ready', tcpPath: resolveTcpPath(tcpPathChoice(m.settings.tcpPath), log) });
      return;
    case 'cap-grant':
      lease?.granted(m.n);
      return;
    case 'cap-reclaim':
      send({ op: 'cap-returned', req: m.req, n: lease?.reclaim() ?? 0 });
      return;
    case 'balancers':
      setBalancers(m.list);
      return;
    case 'listen':
      if (handle) listen(m.id, m.plan, handle);
      return;
    case 'update': {
      const fwd = forwarders.get(m.id);
      if (fwd) {
        fwd.admit = admissionFor(m.plan);
        fwd.balancer = pickerFor(m.plan.balancerKey);
        fwd.counters = countersFor(m.plan);
      }
      return;
    }
    case 'close':
      forwarders.get(m.id)?.close();
      forwarders.delete(m.id);
      send({ op: 'closed', req: m.req });
      return;
    case 'picked': {
      const p = pending.get(m.req);
      if (!p) return;
      pending.delete(m.req);
      clearTimeout(p.timer);
      p.resolve(m.endpoint);
      return;
    }
  }
});

let lastReport = '';
setInterval(() => {
  const totals = [...counters.entries()];
  const text = JSON.stringify(totals);
  if (text === lastReport) return;
  lastReport = text;
  send({ op: 'counters', totals });
}, REPORT_MS);

// kproxy's process is gone (or stopped us): stop accepting, let nothing linger.
process.on('disconnect', () => process.exit(0));
process.on('SIGTERM', () => {
  for (const f of forwarders.values()) f.destroy();
  process.exit(0);
});
