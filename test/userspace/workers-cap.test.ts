// userspace.maxConnections is node-wide with userspace.workers > 1: kproxy's process owns the
// cap and lends workers tokens (src/modes/userspace/dataplane/worker-cap.ts). The lease logic is checked as a
// property over random interleavings (never more than max open; in a quiet system a
// connection is refused only when max are open), then on real sockets with 3 processes: the
// K+1-th concurrent connection is refused and counted once, kproxy and its workers live,
// fds return to their baselines.
import { afterEach, test } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import fc from 'fast-check';
import { UserspaceProxier } from '../../src/modes/userspace/proxier.ts';
import { newBudget } from '../../src/modes/userspace/dataplane/tcp.ts';
import { UdpSessionBudget } from '../../src/modes/userspace/dataplane/udp.ts';
import { CapLease, CapOwner, leaseBatch } from '../../src/modes/userspace/dataplane/worker-cap.ts';
import { silentLogger } from '../../src/log.ts';
import { startTcpBackend } from '../support/backends.ts';
import { firstLine, openFds, planInput, refusingRunner, slice, svc, testConfig } from './helpers.ts';
import { waitFor } from '../support/wait.ts';

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/** kproxy's process and `workers` leases wired by an async in-memory transport (as IPC is). */
function simulated(max: number, workers: number) {
  const owner = new CapOwner(max);
  const batch = leaseBatch(max, workers + 1);
  const leases: CapLease[] = [];
  for (let i = 0; i < workers; i++) {
    const id = `w${i}`;
    const lease: CapLease = new CapLease(
      batch,
      (n) => void Promise.resolve().then(() => owner.want(id, n)).then((g) => setImmediate(() => lease.granted(g))),
      (n) => void Promise.resolve().then(() => owner.giveBack(id, n)),
      60_000,
    );
    owner.attach(id, { reclaim: () => new Promise((r) => setImmediate(() => { owner.giveBack(id, lease.reclaim()); r(); })) });
    leases.push(lease);
  }
  const procs = [owner.local, ...leases];
  return { owner, procs, leases };
}

const settle = () => new Promise<void>((r) => setTimeout(r, 5));

test('lease property: never more than max open; a quiet node refuses only when max are open', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 1, max: 40 }),
      fc.integer({ min: 1, max: 4 }),
      fc.array(fc.tuple(fc.boolean(), fc.nat(), fc.integer({ min: 1, max: 8 })), { minLength: 1, maxLength: 40 }),
      async (max, workers, steps) => {
        const { procs } = simulated(max, workers);
        const held: number[][] = procs.map(() => []);
        let open = 0;
        for (const [opening, who, count] of steps) {
          const p = who % procs.length;
          if (opening) {
            // a burst of concurrent takes in one process, answered in any order
            const answers = await Promise.all(Array.from({ length: count }, () => procs[p].take()));
            for (const ok of answers) if (ok) held[p].push(1), open++;
            assert.ok(open <= max, `open ${open} > max ${max}`);
            const refused = answers.filter((a) => !a).length;
            // refused only when the node is full (every answer came after a reclaim round)
            if (refused > 0) assert.equal(open, max, `refused ${refused} with ${open}/${max} open`);
          } else {
            for (let i = 0; i < count && held[p].length; i++) {
              held[p].pop();
              open--;
              procs[p].release();
            }
          }
          await settle();
        }
      },
    ),
    { numRuns: 60 },
  );
});

test('a batch is small next to the cap: a quarter of each process\'s share, 1 to 64', () => {
  assert.equal(leaseBatch(4, 3), 1);
  assert.equal(leaseBatch(24, 3), 2);
  assert.equal(leaseBatch(100_000, 4), 64);
});

test('a worker holding more than two batches unused gives the excess back unasked', async () => {
  const { owner, leases } = simulated(100, 1);
  const batch = leaseBatch(100, 2);
  const got = await Promise.all(Array.from({ length: 30 }, () => leases[0].take()));
  assert.ok(got.every(Boolean));
  for (let i = 0; i < 30; i++) leases[0].release();
  await settle();
  assert.ok(leases[0].lease <= 2 * batch, `at most two batches kept idle (holds ${leases[0].lease}, batch ${batch})`);
  assert.ok(leases[0].lease >= batch, 'a batch kept for the next connections');
  assert.equal(owner.free, 100 - leases[0].lease);
});

test('a worker that dies gives its whole lease back: its connections died with it', async () => {
  const { owner, leases } = simulated(10, 2);
  const got = await Promise.all(Array.from({ length: 10 }, () => leases[0].take()));
  assert.equal(got.filter(Boolean).length, 10);
  assert.equal(await owner.local.take(), false, 'the node is full');
  owner.detach('w0');
  assert.equal(owner.free, 10);
  assert.equal(await leases[1].take(), true, 'another process gets room at once');
});

test('a request that joined a running reclaim round gets a fresh one before a refusal: tokens granted after that round began are found', async () => {
  // The race seen on real sockets (a refusal with fewer than max open): a reclaim round R1 is
  // running; W2 asks and joins it; tokens free up and W1's earlier request, answered after R1,
  // takes both (it asked for a batch of 2 but needs 1); W2 then finds nothing free although W1
  // holds a token unused. Only a round that starts after W2 asked can find it.
  const owner = new CapOwner(2);
  const pending: Array<{ id: string; answer: (n: number) => void }> = [];
  const spare = new Map<string, number>([['w1', 0], ['w2', 0]]);
  for (const id of ['w1', 'w2']) {
    owner.attach(id, {
      reclaim: () => new Promise<void>((r) => pending.push({ id, answer: (n) => (owner.giveBack(id, n), spare.set(id, spare.get(id)! - n), r()) })),
    });
  }
  assert.equal(owner.local.take(), true);
  assert.equal(owner.local.take(), true);
  const w1 = owner.want('w1', 2); // free 0: starts round R1
  await settle();
  const w2 = owner.want('w2', 1); // joins R1
  await settle();
  owner.local.release();
  owner.local.release();
  for (const p of pending.splice(0)) p.answer(0); // R1: nothing unused anywhere yet
  assert.equal(await w1, 2, 'w1 is granted its batch of 2');
  spare.set('w1', 1); // w1 needed one of the two
  await settle();
  assert.equal(pending.length, 2, 'w2 started a fresh round instead of being refused');
  for (const p of pending.splice(0)) p.answer(spare.get(p.id)!);
  assert.equal(await w2, 1, 'w2 gets the token w1 held unused');
  assert.equal(owner.free, 0);
  assert.equal(owner.reclaims, 2);
});

const BP = 20000 + ((process.pid + 17) % 20000);
const VIP = '127.0.25.10';

test('3 processes, maxConnections 24: the 25th concurrent connection is refused and counted once; kproxy and its workers live; fds return to baseline', async () => {
  const K = 24;
  const backend = await startTcpBackend('127.0.25.1', BP, 'b1');
  cleanups.push(() => backend.close());
  const p = new UserspaceProxier({
    config: testConfig({ userspace: { workers: 3, maxConnections: K } }), log: silentLogger(), runner: refusingRunner, redirect: false,
    localAddresses: () => [], budgets: { tcp: newBudget(K), udp: new UdpSessionBudget(8192, 1024) },
  });
  cleanups.push(() => p.stop());
  await p.sync(planInput([svc('web', { clusterIP: VIP, ports: [{ port: 80 }] }), slice('web', [{ ip: '127.0.25.1' }], [{ port: BP }])]), new Set(), true);
  const pids = p.workerStats().map((w) => w.pid);
  assert.equal(pids.length, 2);
  const c = () => p.counters().find((x) => x.servicePort.startsWith('ns/web'))!;

  // A first connection through every process is not guaranteed (the kernel picks the
  // acceptor); rounds of K concurrent connections until the workers took some, bounded.
  // Baselines after the first round: a worker receives its listeners' handles and opens its
  // lazily made fds while it serves its first connections.
  let fdBase = new Map<number | 'self', number>();
  const deadline = Date.now() + 60_000;
  let rounds = 0;
  do {
    rounds++;
    const held = Array.from({ length: K }, () => net.connect({ host: VIP, port: 80 }));
    const lines = await Promise.all(held.map((s) => firstLine(s)));
    assert.deepEqual(lines, Array(K).fill('b1'), `round ${rounds}: all ${K} served`);
    const beyond = net.connect({ host: VIP, port: 80 });
    const t0 = Date.now();
    assert.match(await firstLine(beyond), /^(closed |error )/, `round ${rounds}: the ${K + 1}th refused`);
    assert.ok(Date.now() - t0 < 5000, 'refused at once, not left to time out');
    // each earlier round also served one connection after a close
    await waitFor(`round ${rounds}: counted once (accepted ${c().accepted}, refused ${c().refused})`, () => c().refused === rounds && c().accepted === rounds * K + rounds - 1, 5000);
    // Room again once one closes, in whichever process takes the next connection.
    held.pop()!.destroy();
    await waitFor('the closed connection released', () => c().active === K - 1, 5000);
    const again = net.connect({ host: VIP, port: 80 });
    held.push(again);
    assert.equal(await firstLine(again), 'b1', 'served again once one closed');
    for (const s of held) s.destroy();
    await waitFor('every connection closed', () => c().active === 0, 5000);
    if (rounds === 1) fdBase = new Map<number | 'self', number>([['self', openFds()], ...pids.map((pid) => [pid, openFds(pid)] as [number, number])]);
  } while ((rounds < 3 || p.workerStats().every((w) => w.accepted === 0)) && rounds < 10 && Date.now() < deadline);
  await waitFor('a worker accepted connections', () => p.workerStats().some((w) => w.accepted > 0), 5000);
  assert.deepEqual(p.workerStats().map((w) => w.pid), pids, 'no worker died');
  assert.deepEqual(p.workerHealth(), { restarts: 0, forkErrors: 0 });
  for (const [pid, base] of fdBase) {
    await waitFor(`fds of ${pid} back to baseline ${base} (now ${openFds(pid)})`, () => openFds(pid) <= base, 5000);
  }
});
