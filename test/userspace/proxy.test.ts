// The userspace proxy on real sockets over 127.0.0.0/8 (no root, no iptables): Service
// VIPs on 127.0.10.x are local, so the proxy listens on them directly; backends on
// 127.0.20.1-3 answer with their identity.
import { afterEach, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import dgram from 'node:dgram';
import net from 'node:net';
import { Writable } from 'node:stream';
import { pino } from 'pino';
import { UserspaceProxier } from '../../src/modes/userspace/proxier.ts';
import { Metrics } from '../../src/server/servers.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import { silentLogger } from '../../src/log.ts';
import { startTcpBackend, startUdpBackend, tcpExchange, udpExchange, type Backend } from '../support/backends.ts';
import { rawStats } from '../../src/modes/userspace/dataplane/tcp-raw.ts';
import { TCP_PATHS, planInput, slice, svc, testConfig, type SvcOpts, type TcpPathName } from './helpers.ts';
import { sleep, waitFor } from '../support/wait.ts';

const BACKENDS = ['127.0.20.1', '127.0.20.2', '127.0.20.3'];
/** backend port, per process so parallel runs do not collide */
const BP = 20000 + (process.pid % 20000);

/** The loopback tests must never program the host: any command is a failure. */
const refusingRunner: CommandRunner = {
  run: async (cmd, args) => {
    throw new Error(`unexpected command in a loopback test: ${cmd} ${args.join(' ')}`);
  },
};

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function tcpBackends(port = BP, ips = BACKENDS): Promise<Backend[]> {
  const list = await Promise.all(ips.map((ip, i) => startTcpBackend(ip, port, `b${i + 1}`)));
  cleanups.push(async () => {
    await Promise.all(list.map((b) => b.close()));
  });
  return list;
}

async function udpBackends(port = BP, ips = BACKENDS): Promise<Backend[]> {
  const list = await Promise.all(ips.map((ip, i) => startUdpBackend(ip, port, `u${i + 1}`)));
  cleanups.push(async () => {
    await Promise.all(list.map((b) => b.close()));
  });
  return list;
}

/** The TCP path of the suite running (every suite runs on both). */
let tcpPath: TcpPathName = 'raw';

function proxier(raw: Record<string, unknown> = {}): UserspaceProxier {
  const p = new UserspaceProxier({
    config: testConfig({ ...raw, userspace: { tcpPath, ...(raw.userspace as object | undefined) } }),
    log: silentLogger(),
    runner: refusingRunner,
    redirect: false,
    localAddresses: () => [],
    dialTimeoutsMs: [1000, 1000, 1000, 1000],
  });
  cleanups.push(() => p.stop());
  return p;
}

function objects(name: string, o: SvcOpts, eps: string[], protocol: 'TCP' | 'UDP' = 'TCP', port = BP) {
  return [svc(name, o), slice(name, eps.map((ip) => ({ ip })), [{ port, protocol }])];
}

function tally(ids: string[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const id of ids) out[id] = (out[id] ?? 0) + 1;
  return out;
}

/** Opens a connection and waits for the backend's id line; the socket stays open. */
function holdConnection(host: string, port: number): Promise<{ id: string; sock: net.Socket; more: Buffer[] }> {
  return new Promise((resolve, reject) => {
    const sock = net.connect({ host, port, allowHalfOpen: true });
    const more: Buffer[] = [];
    let id: string | null = null;
    let buf = Buffer.alloc(0);
    const timer = setTimeout(() => reject(new Error('hold: no id')), 5000);
    sock.on('error', reject);
    sock.on('data', (d: Buffer) => {
      if (id !== null) return void more.push(d);
      buf = Buffer.concat([buf, d]);
      const nl = buf.indexOf(10);
      if (nl < 0) return;
      id = buf.subarray(0, nl).toString();
      if (nl + 1 < buf.length) more.push(buf.subarray(nl + 1));
      clearTimeout(timer);
      resolve({ id, sock, more });
    });
  });
}

for (const path of TCP_PATHS) describe(`userspace proxy on loopback (TCP on ${path})`, () => {
  let rawAccepted = 0;
  before(() => {
    tcpPath = path;
    rawAccepted = rawStats().accepted;
  });

  test('TCP round robin reaches every endpoint evenly, with the whole echo', async () => {
    await tcpBackends();
    const p = proxier();
    await p.sync(planInput(objects('rr', { clusterIP: '127.0.10.1', ports: [{ port: 8080 }] }, BACKENDS)), new Set(), true);
    const ids: string[] = [];
    for (let i = 0; i < 9; i++) {
      const r = await tcpExchange('127.0.10.1', 8080, `hello ${i}`);
      assert.equal(r.rest.toString(), `hello ${i}`);
      assert.equal(r.bye, `bye ${r.id} ${`hello ${i}`.length}`);
      ids.push(r.id);
    }
    assert.deepEqual(tally(ids), { b1: 3, b2: 3, b3: 3 });
    const c = p.counters().find((x) => x.servicePort === 'ns/rr:')!;
    assert.equal(c.accepted, 9);
    assert.equal(c.failed, 0);
  });

  test('UDP round robin per client address; replies come from the service address', async () => {
    await udpBackends();
    const p = proxier();
    await p.sync(planInput(objects('dns', { clusterIP: '127.0.10.2', ports: [{ port: 5353, protocol: 'UDP' }] }, BACKENDS, 'UDP')), new Set(), true);
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) {
      const r = await udpExchange('127.0.10.2', 5353, `q${i}`);
      assert.equal(r.from, '127.0.10.2:5353');
      const [id, payload] = r.reply.split(':');
      assert.equal(payload, `q${i}`);
      ids.push(id);
    }
    assert.deepEqual(tally(ids), { u1: 2, u2: 2, u3: 2 });
  });

  test('ClientIP affinity keeps a client on one endpoint, and expires after its timeout', async () => {
    await tcpBackends();
    const p = proxier();
    await p.sync(planInput(objects('sticky', { clusterIP: '127.0.10.3', ports: [{ port: 8080 }], affinitySeconds: 1 }, BACKENDS)), new Set(), true);
    const a: string[] = [];
    for (let i = 0; i < 5; i++) a.push((await tcpExchange('127.0.10.3', 8080, 'x', { localAddress: '127.0.30.5' })).id);
    assert.equal(new Set(a).size, 1, `client A moved: ${a}`);
    const b: string[] = [];
    for (let i = 0; i < 3; i++) b.push((await tcpExchange('127.0.10.3', 8080, 'x', { localAddress: '127.0.30.6' })).id);
    assert.equal(new Set(b).size, 1, `client B moved: ${b}`);
    assert.notEqual(a[0], b[0], 'a new client takes the next endpoint in turn');
    await sleep(1300);
    const after = (await tcpExchange('127.0.10.3', 8080, 'x', { localAddress: '127.0.30.5' })).id;
    assert.notEqual(after, a[0], 'after the timeout client A is balanced again');
  });

  test('UDP sessions follow ClientIP affinity across client ports', async () => {
    await udpBackends();
    const p = proxier();
    await p.sync(planInput(objects('udpsticky', { clusterIP: '127.0.10.4', ports: [{ port: 5353, protocol: 'UDP' }], affinitySeconds: 60 }, BACKENDS, 'UDP')), new Set(), true);
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) ids.push((await udpExchange('127.0.10.4', 5353, 'q', { localAddress: '127.0.30.7' })).reply.split(':')[0]);
    assert.equal(new Set(ids).size, 1, `moved: ${ids}`);
  });

  test('a removed endpoint gets no new connections while its open ones complete', async () => {
    const backends = await tcpBackends();
    const p = proxier();
    const mk = (eps: string[]) => planInput(objects('drain', { clusterIP: '127.0.10.5', ports: [{ port: 8080 }] }, eps));
    await p.sync(mk(BACKENDS), new Set(), true);
    const held = await Promise.all([0, 1, 2].map(() => holdConnection('127.0.10.5', 8080)));
    assert.deepEqual(held.map((h) => h.id).sort(), ['b1', 'b2', 'b3']);

    await p.sync(mk([BACKENDS[0], BACKENDS[2]]), new Set(['ns/drain']), false);
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) ids.push((await tcpExchange('127.0.10.5', 8080, 'new')).id);
    assert.deepEqual(tally(ids), { b1: 3, b3: 3 });
    assert.equal(backends[1].connections, 1, 'b2 saw only the connection opened before its removal');

    // The in-flight connection to b2 still carries data both ways and closes cleanly.
    const h2 = held.find((h) => h.id === 'b2')!;
    const done = new Promise<string>((resolve, reject) => {
      h2.sock.on('end', () => resolve(Buffer.concat(h2.more).toString()));
      h2.sock.on('error', reject);
    });
    h2.sock.end('still here');
    assert.equal(await done, 'still herebye b2 10\n');
    for (const h of held) h.sock.destroy();
  });

  test('a dead endpoint (connection refused) is retried on the next one; no client fails', async () => {
    const backends = await tcpBackends();
    const p = proxier();
    await p.sync(planInput(objects('dead', { clusterIP: '127.0.10.6', ports: [{ port: 8080 }] }, BACKENDS)), new Set(), true);
    await backends[1].close();
    const ids: string[] = [];
    for (let i = 0; i < 6; i++) ids.push((await tcpExchange('127.0.10.6', 8080, 'x')).id);
    assert.ok(!ids.includes('b2'), `b2 is dead: ${ids}`);
    assert.deepEqual(new Set(ids), new Set(['b1', 'b3']));
    const c = p.counters().find((x) => x.servicePort === 'ns/dead:')!;
    assert.equal(c.failed, 0);
    assert.ok(c.retries >= 2, `retries ${c.retries}`);
  });

  test('all endpoints dead or none: the client is reset and the failure counted', async () => {
    const p = proxier();
    await p.sync(planInput([svc('none', { clusterIP: '127.0.10.7', ports: [{ port: 8080 }] })]), new Set(), true);
    await assert.rejects(tcpExchange('127.0.10.7', 8080, 'x', { timeoutMs: 5000 }), /ECONNRESET|EPIPE/);
    assert.equal(p.counters().find((x) => x.servicePort === 'ns/none:')!.failed, 1);
  });

  test('half-close: a client that shuts its write side still receives the reply', async () => {
    await tcpBackends();
    const p = proxier();
    await p.sync(planInput(objects('half', { clusterIP: '127.0.10.8', ports: [{ port: 8080 }] }, BACKENDS)), new Set(), true);
    // tcpExchange ends its side right after sending; the backend answers "bye" only after that FIN.
    const r = await tcpExchange('127.0.10.8', 8080, 'hello');
    assert.equal(r.rest.toString(), 'hello');
    assert.equal(r.bye, `bye ${r.id} 5`);
  });

  test('back-pressure: 20 MB arrive intact both ways', async () => {
    await tcpBackends();
    const p = proxier();
    await p.sync(planInput(objects('bulk', { clusterIP: '127.0.10.9', ports: [{ port: 8080 }] }, BACKENDS)), new Set(), true);
    const payload = randomBytes(20 * 1024 * 1024);
    const r = await tcpExchange('127.0.10.9', 8080, payload, { timeoutMs: 60_000 });
    assert.equal(r.bye, `bye ${r.id} ${payload.length}`, 'the backend received every byte');
    assert.equal(r.rest.length, payload.length);
    assert.equal(createHash('sha256').update(r.rest).digest('hex'), createHash('sha256').update(payload).digest('hex'));
  });

  test('back-pressure: a client that does not read does not make the proxy buffer everything', async () => {
    await tcpBackends();
    const p = proxier();
    await p.sync(planInput(objects('slow', { clusterIP: '127.0.10.10', ports: [{ port: 8080 }] }, BACKENDS)), new Set(), true);
    // The client writes 64 MB but never reads: the echo fills the client's receive buffer,
    // the proxy must stop reading the backend, the backend stops reading the proxy, and
    // the client's writes stall. Without back-pressure the proxy would swallow it all.
    const sock = net.connect({ host: '127.0.10.10', port: 8080 });
    cleanups.push(() => void sock.destroy());
    sock.pause();
    await new Promise<void>((resolve) => sock.once('connect', () => resolve()));
    const chunk = Buffer.alloc(1024 * 1024, 7);
    let written = 0;
    for (let i = 0; i < 64; i++) {
      if (!sock.write(chunk)) {
        const drained = await Promise.race([new Promise<boolean>((r) => sock.once('drain', () => r(true))), sleep(1500).then(() => false)]);
        if (!drained) break;
      }
      written += chunk.length;
    }
    assert.ok(written < 64 * 1024 * 1024, `the client could write everything (${written} bytes): no back-pressure`);
  });

  test('UDP sessions close after the idle timeout and extend on traffic', async () => {
    const backends = await udpBackends();
    const p = proxier({ udpIdleTimeout: '600ms' });
    await p.sync(planInput(objects('idle', { clusterIP: '127.0.10.11', ports: [{ port: 5353, protocol: 'UDP' }] }, BACKENDS, 'UDP')), new Set(), true);
    const client = dgram.createSocket('udp4');
    cleanups.push(() => new Promise<void>((r) => client.close(() => r())));
    const replies: string[] = [];
    client.on('message', (m) => replies.push(m.toString()));
    await new Promise<void>((r) => client.bind(0, '127.0.0.1', () => r()));
    const send = (t: string) => client.send(t, 5353, '127.0.10.11');

    // Traffic every 100ms for ~1.2s keeps one session (twice the 600ms timeout).
    for (let i = 0; i < 12; i++) {
      send(`k${i}`);
      await sleep(100);
    }
    await waitFor('12 replies', () => replies.length === 12, 3000);
    assert.equal(new Set(replies.map((r) => r.split(':')[0])).size, 1, `one session, one endpoint: ${replies}`);
    assert.equal(p.udpSessions(), 1);
    const peersBefore = backends.reduce((n, b) => n + b.connections, 0);
    assert.equal(peersBefore, 1);

    await waitFor('the idle session to close', () => p.udpSessions() === 0, 3000);
    send('again');
    await waitFor('a reply from a new session', () => replies.length === 13, 3000);
    assert.equal(backends.reduce((n, b) => n + b.connections, 0), 2, 'a new upstream socket after the timeout');
    assert.notEqual(replies[12].split(':')[0], replies[0].split(':')[0], 'the new session is balanced anew');
  });

  test('externalTrafficPolicy Local: NodePort traffic only reaches local endpoints, ClusterIP all', async () => {
    await tcpBackends();
    const p = proxier();
    const objs = [
      svc('local', { type: 'NodePort', clusterIP: '127.0.10.12', ports: [{ port: 8080, nodePort: 30080 }], externalTrafficPolicy: 'Local' }),
      slice('local', [{ ip: BACKENDS[0] }, { ip: BACKENDS[1], node: 'node-b' }, { ip: BACKENDS[2] }], [{ port: BP }]),
    ];
    await p.sync(planInput(objs, { nodeIPs: ['127.0.30.1'] }), new Set(), true);
    const ext: string[] = [];
    for (let i = 0; i < 4; i++) ext.push((await tcpExchange('127.0.30.1', 30080, 'x')).id);
    assert.deepEqual(tally(ext), { b1: 2, b3: 2 });
    const int: string[] = [];
    for (let i = 0; i < 3; i++) int.push((await tcpExchange('127.0.10.12', 8080, 'x')).id);
    assert.deepEqual(tally(int), { b1: 1, b2: 1, b3: 1 });
  });

  test('sync opens new service ports and closes removed ones; dump shows bound listeners', async () => {
    await tcpBackends();
    const p = proxier();
    const a = objects('a', { clusterIP: '127.0.10.13', ports: [{ port: 8080 }] }, BACKENDS);
    const b = objects('b', { clusterIP: '127.0.10.14', ports: [{ port: 8080 }] }, BACKENDS);
    await p.sync(planInput(a), new Set(), true);
    await assert.rejects(tcpExchange('127.0.10.14', 8080, 'x', { timeoutMs: 3000 }), /ECONNREFUSED/);
    const s2 = await p.sync(planInput([...a, ...b]), new Set(['ns/b']), false);
    assert.match(s2.diff ?? '', /\+ ns\/b:\/TCP\/vip\/127\.0\.10\.14:8080/);
    assert.ok((await tcpExchange('127.0.10.14', 8080, 'x')).id);
    const held = await holdConnection('127.0.10.13', 8080);
    await p.sync(planInput(b), new Set(['ns/a']), false);
    await assert.rejects(tcpExchange('127.0.10.13', 8080, 'x', { timeoutMs: 3000 }), /ECONNREFUSED/);
    // A connection established before the removal finishes normally.
    const rest = new Promise<string>((resolve, reject) => {
      held.sock.on('end', () => resolve(Buffer.concat(held.more).toString()));
      held.sock.on('error', reject);
    });
    held.sock.end('late');
    assert.equal(await rest, `latebye ${held.id} 4\n`);
    held.sock.destroy();
    assert.match(p.dump(), /listen TCP 127\.0\.10\.14:8080 ns\/b: policy=cluster/);
    assert.doesNotMatch(p.dump(), /127\.0\.10\.13/);
  });

  test('an SCTP service port is refused at plan time: logged once with KPROXY_USERSPACE_SCTP, counted, the TCP port still served', async () => {
    await tcpBackends();
    const lines: Array<Record<string, unknown>> = [];
    const stream = new Writable({
      write(chunk, _enc, cb) {
        for (const l of String(chunk).split('\n')) if (l.trim()) lines.push(JSON.parse(l) as Record<string, unknown>);
        cb();
      },
    });
    const p = new UserspaceProxier({ config: testConfig({ userspace: { tcpPath } }), log: pino({ level: 'info' }, stream), runner: refusingRunner, redirect: false, localAddresses: () => [] });
    cleanups.push(() => p.stop());
    const objs = [
      svc('mixed', { clusterIP: '127.0.10.15', ports: [{ name: 'http', port: 8080 }, { name: 'sig', port: 9090, protocol: 'SCTP' }] }),
      slice('mixed', BACKENDS.map((ip) => ({ ip })), [{ name: 'http', port: BP }]),
    ];
    for (let i = 0; i < 3; i++) await p.sync(planInput(objs), new Set(), i === 0);
    const sctp = lines.filter((l) => l.code === 'KPROXY_USERSPACE_SCTP');
    assert.equal(sctp.length, 1, 'logged once, not at every sync');
    assert.match(String(sctp[0].msg), /^KPROXY_USERSPACE_SCTP: ns\/mixed:sig: SCTP is not served by the userspace mode \(Node has no SCTP sockets\)/);
    assert.deepEqual(p.refused(), { sctp: ['ns/mixed:sig'], sctpTotal: 1 });
    assert.match(p.dump(), /^# ns\/mixed:sig: SCTP is not served/m);
    assert.ok((await tcpExchange('127.0.10.15', 8080, 'x')).id, 'the TCP port of the same Service is served');
    const metrics = new Metrics();
    metrics.collectUserspaceRefusals([p]);
    assert.match(await metrics.registry.metrics(), /^kproxy_userspace_refused_service_ports\{reason="sctp"\} 1$/m);
    // gone and back: logged and counted again
    await p.sync(planInput([objs[0]].map(() => svc('mixed', { clusterIP: '127.0.10.15', ports: [{ name: 'http', port: 8080 }] }))), new Set(), false);
    assert.deepEqual(p.refused(), { sctp: [], sctpTotal: 1 });
    await p.sync(planInput(objs), new Set(), false);
    assert.equal(lines.filter((l) => l.code === 'KPROXY_USERSPACE_SCTP').length, 2);
    assert.deepEqual(p.refused(), { sctp: ['ns/mixed:sig'], sctpTotal: 2 });
  });

  test(`the TCP connections of this suite went through the ${path} path`, () => {
    const n = rawStats().accepted - rawAccepted;
    if (path === 'raw') assert.ok(n >= 30, `raw handles accepted ${n} connections`);
    else assert.equal(n, 0);
  });
});
