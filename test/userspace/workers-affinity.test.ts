// userspace.workers: 2 — a worker process accepts on the same listeners as kproxy's own
// process. ClientIP affinity must hold whichever process accepted a connection: the worker
// asks kproxy's process (the owner of the affinity table) for the endpoint.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { UserspaceProxier } from '../../src/modes/userspace/proxier.ts';
import { silentLogger } from '../../src/log.ts';
import { startTcpBackend, tcpExchange, type Backend } from '../support/backends.ts';
import { TCP_PATHS, planInput, refusingRunner, slice, svc, testConfig, type TcpPathName } from './helpers.ts';
import { waitFor } from '../support/wait.ts';

const BACKENDS = ['127.0.22.1', '127.0.22.2', '127.0.22.3'];
const BP = 20000 + ((process.pid + 7) % 20000);

const cleanups: (() => Promise<void> | void)[] = [];

async function setup(tcpPath: TcpPathName): Promise<{ p: UserspaceProxier; backends: Backend[] }> {
  const backends = await Promise.all(BACKENDS.map((ip, i) => startTcpBackend(ip, BP, `b${i + 1}`)));
  cleanups.push(async () => {
    await Promise.all(backends.map((b) => b.close()));
  });
  const p = new UserspaceProxier({
    config: testConfig({ userspace: { workers: 2, tcpPath } }), log: silentLogger(), runner: refusingRunner, redirect: false,
    localAddresses: () => [], dialTimeoutsMs: [1000, 1000, 1000, 1000],
  });
  cleanups.push(() => p.stop());
  await p.sync(planInput([
    svc('sticky', { clusterIP: '127.0.22.10', ports: [{ port: 80 }], affinitySeconds: 600 }),
    slice('sticky', BACKENDS.map((ip) => ({ ip })), [{ port: BP }]),
    svc('plain', { clusterIP: '127.0.22.11', ports: [{ port: 80 }] }),
    slice('plain', BACKENDS.map((ip) => ({ ip })), [{ port: BP }]),
  ]), new Set(), true);
  return { p, backends };
}

/** n connections at once from `from`; the backend id each reached. */
async function burst(vip: string, from: string, n: number): Promise<string[]> {
  const replies = await Promise.all(Array.from({ length: n }, () => tcpExchange(vip, 80, 'x', { localAddress: from, timeoutMs: 10_000 })));
  return replies.map((r) => r.id);
}

// Every suite on both TCP paths: the worker gets the path of kproxy's process (the config).
for (const path of TCP_PATHS) describe(`TCP on ${path}`, () => {
let p: UserspaceProxier;
before(async () => {
  ({ p } = await setup(path));
});
after(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

test('with 2 workers, every connection of a client reaches its one endpoint, whichever process accepted it', async () => {
  assert.equal(p.workerStats().length, 1, 'one forked worker besides kproxy\'s own process');
  assert.equal(p.workerStats()[0].tcpPath, path, `the worker forwards on the ${path} path`);
  const clients = ['127.0.23.1', '127.0.23.2', '127.0.23.3', '127.0.23.4', '127.0.23.5', '127.0.23.6'];
  const chosen = new Map<string, Set<string>>(clients.map((c) => [c, new Set()]));
  // Bursts of concurrent connections until the worker has taken some (the kernel decides
  // which process accepts); bounded in rounds and time.
  const deadline = Date.now() + 30_000;
  let rounds = 0;
  do {
    for (const c of clients) for (const id of await burst('127.0.22.10', c, 20)) chosen.get(c)!.add(id);
    rounds++;
  } while ((p.workerStats()[0]?.accepted ?? 0) === 0 && rounds < 20 && Date.now() < deadline);
  await waitFor('the worker reports accepted connections', () => (p.workerStats()[0]?.accepted ?? 0) > 0, 5000);
  for (const [c, ids] of chosen) assert.equal(ids.size, 1, `client ${c} reached ${[...ids].join(', ')}`);
  // Round robin over new clients still spreads them: six clients, three endpoints.
  const used = new Set([...chosen.values()].map((s) => [...s][0]));
  assert.ok(used.size >= 2, `clients spread over ${[...used].join(', ')}`);
  // The main process counts the worker's connections with its own.
  const total = p.counters().find((c) => c.servicePort.includes('sticky'))!;
  await waitFor('all connections counted', () => p.counters().find((c) => c.servicePort.includes('sticky'))!.accepted === rounds * clients.length * 20, 5000);
  assert.ok(total.failed === 0);
});

test('with 2 workers, a Service without affinity is balanced over every endpoint', async () => {
  const ids = await burst('127.0.22.11', '127.0.23.9', 60);
  const seen = new Set(ids);
  assert.deepEqual([...seen].sort(), ['b1', 'b2', 'b3']);
});
});
