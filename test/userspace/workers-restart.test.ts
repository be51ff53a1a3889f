// Worker process management (src/modes/userspace/dataplane/workers.ts over runner.ts's forkNode): a worker
// killed with SIGKILL is started again, its listeners serve again, ClientIP affinity holds
// across the restart; a fork the host refuses (EMFILE thrown, or EAGAIN emitted as 'error')
// is counted and retried with back-off, never thrown.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { resolveConfig } from '../../src/config/config.ts';
import { UserspaceProxier } from '../../src/modes/userspace/proxier.ts';
import { WorkerPool } from '../../src/modes/userspace/dataplane/workers.ts';
import { forkNode, spawnError } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { Metrics } from '../../src/server/servers.ts';
import { startTcpBackend, tcpExchange } from '../support/backends.ts';
import { planInput, refusingRunner, slice, svc, testConfig } from './helpers.ts';
import { sleep, waitFor } from '../support/wait.ts';

const BACKENDS = ['127.0.26.1', '127.0.26.2', '127.0.26.3'];
const BP = 20000 + ((process.pid + 19) % 20000);

const cleanups: (() => Promise<void> | void)[] = [];
after(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** n connections at once from `from`; the backend id each reached. */
async function burst(from: string, n: number): Promise<string[]> {
  const replies = await Promise.all(Array.from({ length: n }, () => tcpExchange('127.0.26.10', 80, 'x', { localAddress: from, timeoutMs: 10_000 })));
  return replies.map((r) => r.id);
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

test('a killed worker is started again: it serves the listeners again and ClientIP affinity still holds', async () => {
  const backends = await Promise.all(BACKENDS.map((ip, i) => startTcpBackend(ip, BP, `b${i + 1}`)));
  cleanups.push(async () => {
    await Promise.all(backends.map((b) => b.close()));
  });
  const p = new UserspaceProxier({
    config: testConfig({ userspace: { workers: 3 } }), log: silentLogger(), runner: refusingRunner, redirect: false,
    localAddresses: () => [], dialTimeoutsMs: [1000, 1000, 1000, 1000],
  });
  cleanups.push(() => p.stop());
  await p.sync(planInput([
    svc('sticky', { clusterIP: '127.0.26.10', ports: [{ port: 80 }], affinitySeconds: 600 }),
    slice('sticky', BACKENDS.map((ip) => ({ ip })), [{ port: BP }]),
  ]), new Set(), true);
  const clients = ['127.0.27.1', '127.0.27.2', '127.0.27.3', '127.0.27.4'];
  const endpointOf = new Map<string, string>();
  for (const c of clients) {
    const ids = new Set(await burst(c, 10));
    assert.equal(ids.size, 1, `client ${c} reached ${[...ids].join(', ')}`);
    endpointOf.set(c, [...ids][0]);
  }

  // Every connection so far counted (workers report every half second), then one worker killed.
  const accepted = () => p.counters().find((c) => c.servicePort.includes('sticky'))!.accepted;
  await waitFor('the first connections counted', () => accepted() === clients.length * 10, 5000);
  const [victim, other] = p.workerStats().map((w) => w.pid);
  process.kill(victim, 'SIGKILL');
  await waitFor('the killed worker replaced', () => p.workerStats().length === 2 && !p.workerStats().some((w) => w.pid === victim), 15_000);
  const fresh = p.workerStats().find((w) => w.pid !== other)!.pid;
  assert.ok(alive(fresh));
  assert.deepEqual(p.workerHealth(), { restarts: 1, forkErrors: 0 });
  const m = new Metrics({ mode: 'userspace', processMetrics: false });
  m.collectUserspaceWorkers([p]);
  const text = await m.registry.metrics();
  assert.match(text, /^kproxy_userspace_worker_restarts_total 1$/m);
  assert.match(text, /^kproxy_userspace_workers 2$/m);
  assert.match(text, /^kproxy_userspace_worker_start_failures_total 0$/m);

  // The new process starts node and is then handed the listeners: wait for that, not for a
  // guessed number of bursts (a loaded machine takes seconds to start a node process).
  await waitFor('the restarted worker holds the listeners', () => p.workerStats().find((w) => w.pid === fresh)?.holdsListeners, 30_000);
  // Bursts until the new worker has accepted connections (the kernel picks the acceptor among
  // three processes), bounded in time and count; every connection of a client still reaches
  // its endpoint. Counts arrive every half second, so the loop checks between bursts.
  const deadline = Date.now() + 40_000;
  let rounds = 0;
  const freshAccepted = () => p.workerStats().find((w) => w.pid === fresh)?.accepted ?? 0;
  do {
    for (const c of clients) {
      for (const id of await burst(c, 10)) assert.equal(id, endpointOf.get(c), `client ${c} kept its endpoint after the restart`);
    }
    rounds++;
    if (rounds % 5 === 0) await sleep(600);
  } while (freshAccepted() === 0 && rounds < 200 && Date.now() < deadline);
  await waitFor('the restarted worker serves the listener', () => freshAccepted() > 0, 5000);
  // The killed worker's connections still count: the totals never go down.
  await waitFor(`every connection counted once (${accepted()})`, () => accepted() === clients.length * 10 * (rounds + 1), 5000);

  // stop() ends every worker's process group.
  await p.stop();
  await waitFor('the workers gone after stop', () => !alive(fresh) && !alive(other), 10_000);
});

test('a fork the host refuses is counted and retried with back-off, never thrown', async () => {
  let calls = 0;
  const starts: number[] = [];
  const fork = (entry: URL, args: string[], opts: { execArgv?: string[] }): ChildProcess => {
    calls++;
    starts.push(Date.now());
    if (calls === 1) throw spawnError('userspace-worker', Object.assign(new Error('spawn EMFILE'), { code: 'EMFILE' }));
    if (calls === 2) {
      // node's other way: a child without a pid that emits 'error' on the next tick
      const fake = Object.assign(new EventEmitter(), { pid: undefined, connected: false, exitCode: null, signalCode: null, send: () => false });
      setImmediate(() => fake.emit('error', Object.assign(new Error('spawn EAGAIN'), { code: 'EAGAIN' })));
      return fake as unknown as ChildProcess;
    }
    return forkNode(entry, args, opts);
  };
  const warnings: string[] = [];
  const log = Object.assign(silentLogger(), { warn: (o: { code?: string }, msg?: string) => void warnings.push(`${o.code ?? ''} ${msg ?? ''}`) });
  const pool = new WorkerPool({
    count: 1, settings: resolveConfig({ mode: 'userspace' }).userspace, log: log as never, pick: () => null, fork, restartDelayMs: 50,
  });
  cleanups.push(() => pool.stop());
  assert.equal(pool.stats().length, 0, 'no process before the first listener');
  void pool.ensureStarted();
  await waitFor('the worker up on the third try', () => pool.stats().length === 1 && pool.stats()[0].pid > 0 && alive(pool.stats()[0].pid), 15_000);
  assert.equal(calls, 3);
  assert.deepEqual(pool.health(), { restarts: 2, forkErrors: 2 });
  // 50 ms, then doubled: timers fire late on a busy machine, never (much) early.
  assert.ok(starts[1] - starts[0] >= 45, `first retry after ${starts[1] - starts[0]} ms`);
  assert.ok(starts[2] - starts[1] >= 95, `the delay doubles: second retry after ${starts[2] - starts[1]} ms`);
  assert.ok(warnings.filter((w) => w.startsWith('KPROXY_EXEC_SPAWN_FAILED')).length >= 1, warnings.join('\n'));
  const pid = pool.stats()[0].pid;
  await pool.stop();
  await waitFor('the worker gone after stop', () => !alive(pid), 10_000);
});

test('a proxier without TCP listeners (e.g. the IPv6 one of a node without IPv6 Services) forks no worker', async () => {
  const p = new UserspaceProxier({ config: testConfig({ userspace: { workers: 3 } }), log: silentLogger(), runner: refusingRunner, redirect: false, localAddresses: () => [] });
  cleanups.push(() => p.stop());
  await p.sync(planInput([
    svc('dns', { clusterIP: '127.0.26.20', ports: [{ port: 53, protocol: 'UDP' }] }),
    slice('dns', [{ ip: '127.0.26.1' }], [{ port: 5353, protocol: 'UDP' }]),
  ]), new Set(), true);
  assert.match(p.dump(), /UDP/, 'the UDP listener is open');
  assert.deepEqual(p.workerStats(), [], 'UDP stays in kproxy\'s process: no worker needed');
});
