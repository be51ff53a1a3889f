// /healthz and /livez as upstream's ProxyHealthServer (pkg/proxy/healthcheck/proxy_health.go):
// healthy unless an update has been queued for healthTimeout or longer without a successful
// sync; /livez ignores the node's eligibility; the public bodies carry upstream's fields only
// and stay small whatever the errors say; the details live on the local debug server
// (/debug/health) and in `kproxy status`. Driven through the real ProxyController and SyncLoop
// with a fake source and a fake proxier (no kernel), the health clock injected.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ProxyController } from '../../src/sync/controller.ts';
import { ProxyHealth } from '../../src/sync/health.ts';
import { startServers, sanitizeDetail, type RunningServers } from '../../src/server/servers.ts';
import { statusCommand } from '../../src/cli/status.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { silentLogger } from '../../src/log.ts';
import type { ModeModule, Proxier, SyncStats } from '../../src/modes/types.ts';
import type { Source, SourceHandler, SourceHealth } from '../../src/sources/types.ts';
import type { K8sService } from '../../src/core/api.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import { waitFor } from '../support/wait.ts';
import { makeService } from '../support/builders.ts';

const HEALTH_TIMEOUT_MS = 60_000;
const T0 = 1_700_000_000_000;

function service(name: string, port = 80): K8sService {
  return makeService('default', name, { type: 'ClusterIP', clusterIP: '172.30.0.10', clusterIPs: ['172.30.0.10'], ports: [{ name: 'http', port, protocol: 'TCP' }] });
}

class FakeSource implements Source {
  handler: SourceHandler | null = null;
  sourceHealth: SourceHealth = { synced: true, connected: true, lastContactMs: T0 };
  constructor(private readonly syncAtStart = true) {}
  async start(h: SourceHandler): Promise<void> {
    this.handler = h;
    h.onService(null, service('web'));
    if (this.syncAtStart) h.onSynced();
  }
  async stop(): Promise<void> {
    this.handler = null;
  }
  health(): SourceHealth {
    return this.sourceHealth;
  }
}

/** A proxier whose syncs wait for the test to release them, or fail as told. */
class GatedProxier implements Proxier {
  calls = 0;
  private gates: Array<() => void> = [];
  gated = true;
  failWith: Error | null = null;
  async sync(): Promise<SyncStats> {
    this.calls++;
    if (this.gated) await new Promise<void>((r) => this.gates.push(r));
    if (this.failWith) throw this.failWith;
    return { rulesWritten: 1, rulesTotal: 1 };
  }
  release(): void {
    for (const g of this.gates.splice(0)) g();
  }
  get waiting(): number {
    return this.gates.length;
  }
  dump(): string {
    return '';
  }
  async stop(): Promise<void> {
    this.gated = false;
    this.release();
  }
}

const noRunner = { run: async () => { throw new Error('no commands in this test'); } } as unknown as CommandRunner;

interface Rig {
  ctrl: ProxyController;
  source: FakeSource;
  proxier: GatedProxier;
  servers: RunningServers;
  clock: { t: number };
  get(server: 'healthz' | 'metrics', path: string): Promise<{ code: number; text: string; json: any }>;
  close(): Promise<void>;
}

async function rig(opts: { syncAtStart?: boolean } = {}): Promise<Rig> {
  const clock = { t: T0 };
  const proxier = new GatedProxier();
  const mode: ModeModule = { name: 'userspace', render: () => '', createProxier: async () => proxier, cleanup: async () => {} };
  const base = resolveConfig({ mode: 'userspace' });
  // Real timers for the loop (short minSyncPeriod, quick retries); the health clock is the test's.
  const config = { ...base, minSyncPeriodMs: 5, syncPeriodMs: HEALTH_TIMEOUT_MS / 2 };
  const source = new FakeSource(opts.syncAtStart ?? true);
  const log = silentLogger();
  const ctrl = new ProxyController({
    config, nodeName: 'node-a', mode, allModes: { userspace: mode, iptables: mode, ipvs: mode, nftables: mode }, source, runner: noRunner, log,
    skipCleanup: true, nodeIPs: () => ['192.168.0.2'], backoffInitialMs: 20, backoffMaxMs: 50, now: () => clock.t,
  });
  const servers = await startServers({ ctrl, source, mode: 'userspace', log }, '127.0.0.1:0', '127.0.0.1:0');
  const get = async (server: 'healthz' | 'metrics', path: string) => {
    const res = await fetch(`http://127.0.0.1:${servers.ports[server]}${path}`, { signal: AbortSignal.timeout(10_000) });
    const text = await res.text();
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      json = undefined;
    }
    return { code: res.status, text, json };
  };
  await ctrl.start();
  return {
    ctrl, source, proxier, servers, clock, get,
    close: async () => {
      proxier.gated = false;
      proxier.failWith = null;
      proxier.release();
      await ctrl.stop();
      await servers.close();
    },
  };
}

const codes = async (r: Rig) => ({ healthz: (await r.get('healthz', '/healthz')).code, livez: (await r.get('healthz', '/livez')).code });

test('ProxyHealth: healthy unless a queued update waited healthTimeout; an update queued during a sync survives its success', () => {
  let t = T0;
  const h = new ProxyHealth({ healthTimeoutMs: 1000, now: () => t });
  assert.equal(h.verdict().live, true, 'live at start, nothing queued');
  assert.equal(h.verdict().healthy, false, 'not healthy before a first successful sync');
  h.queuedUpdate();
  t += 999;
  assert.equal(h.verdict().live, true, 'queued 999 ms < timeout');
  t += 1;
  assert.equal(h.verdict().live, false, 'queued for the whole timeout (upstream: unhealthy when not < healthTimeout)');
  h.syncStarted();
  assert.equal(h.verdict().live, false, 'a running sync does not make a late update on time');
  h.queuedUpdate(); // comes while the sync runs: the sync does not cover it
  const queuedDuring = t;
  h.updated();
  assert.deepEqual([h.verdict().live, h.verdict().healthy, h.verdict().lastUpdated], [true, true, t]);
  assert.equal(h.verdict().oldestPendingQueued, queuedDuring, 'the update queued during the sync is still pending');
  t += 1000;
  assert.equal(h.verdict().live, false, 'and it goes late if no later sync succeeds');
  h.syncStarted();
  h.syncFailed();
  assert.equal(h.verdict().oldestPendingQueued, queuedDuring, 'a failed sync keeps the time first queued');
  h.syncStarted();
  h.updated();
  assert.deepEqual([h.verdict().live, h.verdict().oldestPendingQueued], [true, 0]);
  h.syncNode({ metadata: { name: 'n' }, spec: { taints: [{ key: 'ToBeDeletedByClusterAutoscaler', effect: 'NoSchedule' }] } });
  assert.deepEqual([h.verdict().live, h.verdict().healthy, h.verdict().nodeEligible], [true, false, false]);
  h.syncNode({ metadata: { name: 'n' }, spec: { taints: 'garbage' } });
  assert.equal(h.verdict().nodeEligible, true, 'a wrong-typed taints field is no taint, and no crash');
  h.syncNode({ metadata: { name: 'n', deletionTimestamp: '2024-01-01T00:00:00Z' } });
  assert.equal(h.verdict().nodeEligible, false, 'a node being deleted is not eligible');
});

test('/livez stays 200 through a slow first sync; /healthz is 503 until the first success', async () => {
  const r = await rig();
  try {
    await waitFor('the first sync to start', () => r.proxier.waiting === 1, 15_000);
    assert.deepEqual(await codes(r), { healthz: 503, livez: 200 }, 'first sync running: not ready, but alive');
    const hz = await r.get('healthz', '/healthz');
    assert.deepEqual(hz.json, { lastUpdated: '0001-01-01T00:00:00Z', currentTime: new Date(T0).toISOString(), nodeEligible: true }, 'no sync yet: the zero time, as upstream');
    r.clock.t += HEALTH_TIMEOUT_MS - 1; // the first sync has been pending just under the timeout
    assert.deepEqual(await codes(r), { healthz: 503, livez: 200 });
    r.proxier.release();
    await waitFor('/healthz 200 after the first sync', async () => (await r.get('healthz', '/healthz')).code === 200, 15_000);
    const now = new Date(r.clock.t).toISOString();
    assert.deepEqual((await r.get('healthz', '/healthz')).json, { lastUpdated: now, currentTime: now, nodeEligible: true });
    assert.deepEqual((await r.get('healthz', '/livez')).json, { lastUpdated: now, currentTime: now });
    assert.equal((await r.get('healthz', '/healthz?verbose')).code, 200, 'a query string does not change the path');
  } finally {
    await r.close();
  }
});

test('a queued update that waited past healthTimeout: /livez and /healthz 503, back to 200 when a sync succeeds', async () => {
  const r = await rig();
  try {
    await waitFor('the first sync to start', () => r.proxier.waiting === 1, 15_000);
    r.proxier.release();
    await waitFor('first sync done', async () => (await r.get('healthz', '/healthz')).code === 200, 15_000);
    r.clock.t += 10 * HEALTH_TIMEOUT_MS; // no change queued: time alone does not make it unhealthy
    assert.deepEqual(await codes(r), { healthz: 200, livez: 200 });

    r.source.handler!.onService(service('web'), service('web', 8080));
    await waitFor('the sync of the change to start', () => r.proxier.waiting === 1, 15_000);
    r.clock.t += HEALTH_TIMEOUT_MS - 1;
    assert.deepEqual(await codes(r), { healthz: 200, livez: 200 }, 'late only at the timeout');
    r.clock.t += 1;
    assert.deepEqual(await codes(r), { healthz: 503, livez: 503 }, 'the update has waited healthTimeout: a hung sync is caught');
    const lz = await r.get('healthz', '/livez');
    assert.deepEqual(Object.keys(lz.json).sort(), ['currentTime', 'lastUpdated']);
    assert.equal(lz.json.lastUpdated, new Date(T0).toISOString(), 'unhealthy: lastUpdated is the last successful sync');
    const dbg = await r.get('metrics', '/debug/health');
    assert.equal(dbg.json.live, false);
    assert.match(dbg.json.reasons.join('; '), /an update has waited 60s for a successful sync \(health timeout 60s\)/);
    r.proxier.release();
    await waitFor('healthy again after the sync', async () => JSON.stringify(await codes(r)) === JSON.stringify({ healthz: 200, livez: 200 }), 15_000);
  } finally {
    await r.close();
  }
});

test('no sync ever succeeds: /livez 200 within healthTimeout, 503 after it; /healthz 503 throughout', async () => {
  const r = await rig();
  try {
    r.proxier.failWith = new Error('KPROXY_TEST: cannot write rules');
    r.proxier.gated = false;
    r.proxier.release();
    await waitFor('two failed syncs', () => r.ctrl.loop.status.failures >= 2, 15_000);
    assert.deepEqual(await codes(r), { healthz: 503, livez: 200 }, 'failing, but the first update is not late yet');
    r.clock.t += HEALTH_TIMEOUT_MS;
    assert.deepEqual(await codes(r), { healthz: 503, livez: 503 }, 'the first sync has waited healthTimeout');
    await waitFor('another failed sync', () => r.ctrl.loop.status.failures >= 4, 15_000);
    assert.equal((await r.get('healthz', '/livez')).code, 503, 'a retry that fails again does not reset the wait');
  } finally {
    await r.close();
  }
});

test('sources not synced (API server unreachable at start): /livez 200 however long, /healthz 503', async () => {
  const r = await rig({ syncAtStart: false });
  try {
    r.clock.t += 10 * HEALTH_TIMEOUT_MS;
    assert.deepEqual(await codes(r), { healthz: 503, livez: 200 }, 'a restart would not bring the API server back');
    assert.equal(r.proxier.calls, 0);
    assert.deepEqual((await r.get('metrics', '/debug/health')).json.reasons, ['sources not synced yet']);
  } finally {
    await r.close();
  }
});

test('a node tainted for deletion: /healthz 503 with nodeEligible false, /livez 200', async () => {
  const r = await rig();
  try {
    r.proxier.gated = false;
    r.proxier.release();
    await waitFor('first sync done', async () => (await r.get('healthz', '/healthz')).code === 200, 15_000);
    r.source.handler!.onNode!({ metadata: { name: 'node-a' }, spec: { taints: [{ key: 'ToBeDeletedByClusterAutoscaler', effect: 'NoSchedule' }] } } as never);
    const hz = await r.get('healthz', '/healthz');
    assert.equal(hz.code, 503);
    assert.equal(hz.json.nodeEligible, false);
    assert.equal((await r.get('healthz', '/livez')).code, 200, '/livez ignores the node');
  } finally {
    await r.close();
  }
});

test('the public bodies say little and stay small; the details (sanitized, bounded) are only on the debug server', async () => {
  const r = await rig();
  try {
    const ruleText = '-A KUBE-SVC-XPGD46QRK7WJZT7O -m comment --comment "default/web:http" -j KUBE-SEP-ABCDEF\n'.repeat(2000);
    r.proxier.failWith = new Error(`iptables-restore: line 3 failed in /var/lib/kproxy/secret.conf:\n${ruleText}\u001b[31mred`);
    r.proxier.gated = false;
    r.proxier.release();
    r.source.sourceHealth = {
      synced: true, connected: false, lastContactMs: T0 - 30_000,
      problem: `1700000000123.456:8192:4242|/etc/kproxy/manifests/a.yaml: bad\n${'x'.repeat(50_000)}`,
    };
    await waitFor('a failed sync', () => r.ctrl.loop.status.failures >= 1, 15_000);
    r.clock.t += 2 * HEALTH_TIMEOUT_MS;
    for (const path of ['/healthz', '/livez']) {
      const res = await r.get('healthz', path);
      assert.equal(res.code, 503, path);
      assert.ok(res.text.length < 1024, `${path} body is ${res.text.length} bytes`);
      assert.deepEqual(Object.keys(res.json).sort(), path === '/healthz' ? ['currentTime', 'lastUpdated', 'nodeEligible'] : ['currentTime', 'lastUpdated']);
      assert.doesNotMatch(res.text, /KUBE-|\/var\/|\/etc\/|iptables|1700000000123/, `${path} carries no rule text, path, error or internal id`);
    }
    for (const path of ['/debug/health', '/debug/rules', '/debug/state', '/debug/diff', '/metrics']) {
      assert.equal((await r.get('healthz', path)).code, 404, `${path} is not on the public health server`);
    }

    const dbg = await r.get('metrics', '/debug/health');
    assert.equal(dbg.code, 200);
    const rep = dbg.json;
    assert.deepEqual([rep.healthy, rep.live, rep.synced, rep.mode], [false, false, true, 'userspace']);
    assert.ok(rep.syncFailures >= 1);
    assert.equal(rep.source.connected, false);
    assert.equal(rep.source.staleSeconds, 150);
    assert.ok(rep.lastError.length <= 512 && rep.lastError.startsWith('iptables-restore: line 3 failed'), `lastError bounded: ${rep.lastError.length}`);
    assert.ok(rep.source.problem.length <= 512, `problem bounded: ${rep.source.problem.length}`);
    assert.ok(rep.source.problem.startsWith('/etc/kproxy/manifests/a.yaml: bad'), `no internal mtime:size:inode prefix: ${rep.source.problem.slice(0, 60)}`);
    // eslint-disable-next-line no-control-regex
    assert.doesNotMatch(rep.lastError + rep.source.problem, /[\u0000-\u001f]/, 'no control characters');
    const diff = (await r.get('metrics', '/debug/diff')).json as Array<{ error?: string }>;
    assert.ok(diff.length >= 1 && diff.every((d) => (d.error ?? '').length <= 512), '/debug/diff errors bounded too');
  } finally {
    await r.close();
  }
});

test('kproxy status reads the details from the debug server, and falls back to /healthz without it', async () => {
  const r = await rig();
  const out: string[] = [];
  const write = process.stdout.write;
  const exitCode = process.exitCode;
  try {
    r.proxier.gated = false;
    r.proxier.release();
    await waitFor('first sync done', async () => (await r.get('healthz', '/healthz')).code === 200, 15_000);
    r.source.sourceHealth = { synced: true, connected: false, lastContactMs: T0 - 5000, problem: '1.5:2:3|KPROXY_SOURCE_API_ERROR: connect ECONNREFUSED\nnext' };
    process.stdout.write = ((s: string) => (out.push(String(s)), true)) as typeof process.stdout.write;
    await statusCommand({ healthzAddress: `127.0.0.1:${r.servers.ports.healthz}`, metricsAddress: `127.0.0.1:${r.servers.ports.metrics}` });
    await statusCommand({ healthzAddress: `127.0.0.1:${r.servers.ports.healthz}`, metricsAddress: '127.0.0.1:1' });
    process.stdout.write = write;
    const [full, fallback] = out;
    assert.match(full, /^health: +healthy \(\/healthz 200, \/livez 200\)$/m);
    assert.match(full, /^source: +DISCONNECTED, last contact .*, KPROXY_SOURCE_API_ERROR: connect ECONNREFUSED next$/m);
    assert.match(full, /^recent syncs:\n {2}\S+ full/m);
    assert.match(fallback, /^health: +healthy \(\/healthz 200\)$/m);
    assert.match(fallback, /^details: +metrics server 127\.0\.0\.1:1 not reachable/m);
  } finally {
    process.stdout.write = write;
    process.exitCode = exitCode;
    await r.close();
  }
});

test('sanitizeDetail: control characters, internal signatures, bound', () => {
  assert.equal(sanitizeDetail('a\n\tb\u001b[0m  c'), 'a b [0m c');
  assert.equal(sanitizeDetail('1712.5:10:99|file.yaml: bad; 3:4:5|other.yaml: bad'), 'file.yaml: bad; other.yaml: bad');
  assert.equal(sanitizeDetail('y'.repeat(600)).length, 512);
  assert.equal(sanitizeDetail(undefined), '');
});
