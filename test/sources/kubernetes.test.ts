// The Kubernetes API source against the test API server: real client-node code, real HTTP(S).
import { test, describe, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createKubernetesSource, loadKubeConfig, masterURL, KubernetesSourceError, type KubernetesSource } from '../../src/sources/kubernetes.ts';
import { backoffDelay, isUnreachable, resolveBackoff, type ResilientInformer } from '../../src/sources/k8s-informer.ts';
import type { KubernetesObject } from '@kubernetes/client-node';
import { silentLogger } from '../../src/log.ts';
import { TestApiServer, tempDir, type TestApiServerOptions } from '../support/apiserver.ts';
import { Recorder, captureLogger, node, sleep, slice, svc, versions, waitFor } from './k8s-fixtures.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';

const NODE = 'node-a';
const tmp = tempDir('kpt-k8s-');
after(() => tmp.cleanup());

const FAST = { initialMs: 50, maxMs: 400, jitter: 0 };

interface Rig {
  server: TestApiServer;
  source: KubernetesSource;
  rec: Recorder;
  done(): Promise<void>;
}

let rigN = 0;
async function rig(opts: { server?: TestApiServerOptions; seed?: (s: TestApiServer) => void; backoff?: typeof FAST; log?: ReturnType<typeof silentLogger>; start?: boolean } = {}): Promise<Rig> {
  const server = await TestApiServer.start(opts.server ?? {});
  let source: KubernetesSource | undefined;
  try {
    opts.seed?.(server);
    const kubeconfig = server.writeKubeconfig(join(tmp.dir, `kubeconfig-${process.pid}-${rigN++}`));
    source = createKubernetesSource({ kubeconfig, nodeName: NODE, log: opts.log ?? silentLogger(), backoff: opts.backoff ?? FAST });
    const rec = new Recorder();
    if (opts.start !== false) await source.start(rec);
    const s = source;
    return {
      server,
      source: s,
      rec,
      async done() {
        await s.stop();
        await server.close();
      },
    };
  } catch (e) {
    await source?.stop();
    await server.close();
    throw e;
  }
}

function seedBasic(s: TestApiServer): void {
  s.create('services', svc('web', { ip: '172.30.0.10' }));
  s.create('services', svc('api', { ip: '172.30.0.11', port: 443 }));
  // another proxy's service and a headless service's slice: filtered by the label selector
  s.create('services', svc('other', { ip: '172.30.0.12', labels: { 'service.kubernetes.io/service-proxy-name': 'foo' } }));
  s.create('endpointslices', slice('web-abc', 'web', ['10.180.0.1', '10.180.0.2']));
  s.create('endpointslices', slice('api-abc', 'api', ['10.180.1.1']));
  s.create('endpointslices', slice('hl-abc', 'hl', ['10.180.2.1'], { labels: { 'service.kubernetes.io/headless': '' } }));
  s.create('nodes', node(NODE, 'zone-a'));
  s.create('nodes', node('node-b', 'zone-b'));
}

/** Waits until the source's view (replayed from its events) equals the server's filtered state. */
async function converged(r: Rig, timeoutMs = 5000): Promise<number> {
  const wantSvc = versions(r.server.list('services').filter((o) => !o.metadata?.labels?.['service.kubernetes.io/service-proxy-name']));
  const wantSl = versions(r.server.list('endpointslices').filter((o) => !(o.metadata?.labels && 'service.kubernetes.io/headless' in o.metadata.labels)));
  const same = (a: Map<string, string>, b: Map<string, string>) => a.size === b.size && [...a].every(([k, v]) => b.get(k) === v);
  return waitFor(
    () => same(versions([...Recorder.replay(r.rec.services).values()] as never), wantSvc) &&
      same(versions([...Recorder.replay(r.rec.slices).values()] as never), wantSl),
    'source to converge with the server',
    timeoutMs,
  );
}

describe('kubernetes source: list and sync', () => {
  test('synced only after both Services and EndpointSlices are listed; selector and node applied', async () => {
    const r = await rig({
      seed: (s) => {
        seedBasic(s);
        s.failLists.set('endpointslices', 500);
      },
    });
    try {
      await waitFor(() => r.rec.services.length === 2, 'services listed');
      await waitFor(() => r.source.health().problem?.includes('endpointslices') === true, 'slice list failure reported');
      await sleep(200);
      assert.equal(r.rec.syncedCalls, 0, 'not synced while EndpointSlices cannot be listed');
      const h = r.source.health();
      assert.equal(h.synced, false);
      assert.equal(h.connected, false);
      assert.match(h.problem!, /KPROXY_SOURCE_API_ERROR: endpointslices: .*HTTP 500/);

      r.server.failLists.delete('endpointslices');
      await waitFor(() => r.rec.syncedCalls === 1, 'synced');
      assert.deepEqual(r.rec.atSynced, { services: 2, slices: 2 }, 'every listed object delivered before onSynced');
      assert.deepEqual(r.rec.services.map((e) => [e.old, e.new?.metadata?.name]).sort(), [[null, 'api'], [null, 'web']]);
      assert.deepEqual(r.rec.slices.map((e) => e.new?.metadata?.name).sort(), ['api-abc', 'web-abc']);
      await waitFor(() => r.source.health().connected, 'connected');
      const h2 = r.source.health();
      assert.equal(h2.synced, true);
      assert.equal(h2.problem, undefined);
      assert.ok(Date.now() - h2.lastContactMs < 5000);
      // only this node, with its zone label
      await waitFor(() => r.rec.nodes.length >= 1, 'node delivered');
      assert.equal(r.rec.nodes[0]?.metadata?.name, NODE);
      assert.equal(r.rec.nodes[0]?.metadata?.labels?.['topology.kubernetes.io/zone'], 'zone-a');
      // the selectors were sent as upstream sends them
      const svcList = r.server.requests.find((q) => q.path === '/api/v1/services' && !q.watch)!;
      assert.equal(svcList.query.labelSelector, '!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name');
      const nodeWatch = r.server.requests.find((q) => q.path === '/api/v1/nodes' && q.watch)!;
      assert.equal(nodeWatch.query.fieldSelector, `metadata.name=${NODE}`);
      assert.equal(nodeWatch.query.allowWatchBookmarks, 'true');
      // only list and watch (GET) requests were made
      assert.ok(r.server.requests.every((q) => q.method === 'GET'));
      await sleep(100);
      assert.equal(r.rec.syncedCalls, 1, 'onSynced called once');
    } finally {
      await r.done();
    }
  });

  test('add / update / delete reach the handler as (old, new)', async () => {
    const r = await rig({ seed: seedBasic });
    try {
      await waitFor(() => r.rec.syncedCalls === 1, 'synced');
      await waitFor(() => r.server.watchCount() === 3, 'three watches open');
      const n0 = r.rec.services.length;
      const m0 = r.rec.slices.length;

      r.server.create('services', svc('new', { ip: '172.30.0.20' }));
      const v1 = r.server.get('services', 'default', 'web')!;
      v1.spec.ports[0].port = 8081;
      r.server.update('services', v1);
      r.server.remove('services', 'default', 'api');
      await waitFor(() => r.rec.services.length === n0 + 3, 'three service events');
      const [add, upd, del] = r.rec.services.slice(n0);
      assert.equal(add.old, null);
      assert.equal(add.new?.metadata?.name, 'new');
      // the old object is what the informer keeps: identity and the replaced resourceVersion (slimObject)
      assert.equal(upd.old?.spec, undefined);
      assert.ok(upd.old?.metadata?.resourceVersion && upd.old.metadata.resourceVersion !== upd.new?.metadata?.resourceVersion);
      assert.equal(upd.new?.spec?.ports?.[0].port, 8081);
      assert.equal(upd.old?.metadata?.name, 'web');
      assert.equal(del.old?.metadata?.name, 'api');
      assert.equal(del.old?.spec, undefined, 'the old object of a delete is the cached one, not the event\'s');
      assert.equal(del.new, null);

      // a slice update, and a slice whose headless label appears: it leaves our view (DELETED)
      const s1 = r.server.get('endpointslices', 'default', 'web-abc')!;
      s1.endpoints.push({ addresses: ['10.180.0.3'], conditions: { ready: true } });
      r.server.update('endpointslices', s1);
      const s2 = r.server.get('endpointslices', 'default', 'api-abc')!;
      s2.metadata!.labels!['service.kubernetes.io/headless'] = '';
      r.server.update('endpointslices', s2);
      await waitFor(() => r.rec.slices.length === m0 + 2, 'two slice events');
      const [su, sd] = r.rec.slices.slice(m0);
      assert.equal(su.old?.metadata?.name, 'web-abc');
      assert.equal(su.old?.endpoints, undefined);
      assert.equal(su.new?.endpoints?.length, 3);
      assert.equal(sd.old?.metadata?.name, 'api-abc');
      assert.equal(sd.new, null);

      // node label change, another node's change is not seen
      const k0 = r.rec.nodes.length;
      r.server.update('nodes', node('node-b', 'zone-c'));
      r.server.update('nodes', node(NODE, 'zone-b'));
      await waitFor(() => r.rec.nodes.length === k0 + 1, 'node event');
      assert.equal(r.rec.nodes[k0]?.metadata?.labels?.['topology.kubernetes.io/zone'], 'zone-b');
      r.server.remove('nodes', undefined, NODE);
      await waitFor(() => r.rec.nodes.length === k0 + 2, 'node delete');
      assert.equal(r.rec.nodes[k0 + 1], null);
      await converged(r);
    } finally {
      await r.done();
    }
  });
});

describe('kubernetes source: what the informers keep', () => {
  test('the one cache (ListWatch\'s) keeps each object\'s identity and resourceVersion only; changes and a relist still deliver whole new objects, with the replaced version as the old one, and no more', async () => {
    const r = await rig({ seed: seedBasic });
    try {
      await waitFor(() => r.rec.syncedCalls === 1, 'synced');
      await waitFor(() => r.server.watchCount() === 3, 'three watches open');
      type Informer = ResilientInformer<KubernetesObject>;
      const inf = r.source as unknown as { services: Informer; slices: Informer };
      const kept = (i: Informer) => {
        const lw = [...i.listWatchCache().values()].flatMap((m) => [...m.values()]);
        return { ours: [...i.snapshot().values()], lw };
      };
      const checkSlim = (what: string) => {
        for (const [resource, i] of [['services', inf.services], ['endpointslices', inf.slices]] as const) {
          const { ours, lw } = kept(i);
          assert.ok(ours.length >= 2 && lw.length === ours.length, `${what}: ${resource} cached`);
          for (const o of [...ours, ...lw]) {
            assert.deepEqual(Object.keys(o.metadata ?? {}).sort(), ['name', 'namespace', 'resourceVersion'].filter((k) => k in (o.metadata ?? {})));
            assert.ok(!('spec' in o) && !('endpoints' in o) && !('status' in o), `${what}: ${o.metadata?.name} slim`);
            const live = r.server.get(resource, o.metadata?.namespace, o.metadata!.name!);
            assert.equal(o.metadata?.resourceVersion, live?.metadata?.resourceVersion, `${what}: ${o.metadata?.name} at the server's version`);
          }
        }
      };
      checkSlim('after the list');
      // the handler got whole objects
      assert.equal(r.rec.services.find((e) => e.new?.metadata?.name === 'web')?.new?.spec?.ports?.[0].port, 80);

      const n0 = r.rec.services.length;
      const web = r.server.get('services', 'default', 'web')!;
      web.spec.ports[0].port = 8081;
      r.server.update('services', web);
      await waitFor(() => r.rec.services.length === n0 + 1, 'the update');
      assert.equal(r.rec.services[n0].new?.spec?.ports?.[0].port, 8081);
      checkSlim('after an update');

      // a relist (history compacted while away): only what changed is delivered
      const m0 = r.rec.slices.length;
      r.server.dropWatches();
      const api = r.server.get('services', 'default', 'api')!;
      api.spec.ports[0].port = 444;
      r.server.update('services', api);
      r.server.compact();
      await converged(r);
      await waitFor(() => r.server.watchCount() === 3, 'watches open again');
      assert.deepEqual(r.rec.services.slice(n0 + 1).map((e) => [e.old?.metadata?.name, e.new?.spec?.ports?.[0].port]), [['api', 444]]);
      const relisted = r.rec.services[n0 + 1];
      assert.equal(relisted.old?.spec, undefined, 'the old object of a relisted update is the cached one');
      assert.ok(relisted.old?.metadata?.resourceVersion && relisted.old.metadata.resourceVersion !== relisted.new?.metadata?.resourceVersion);
      assert.equal(r.rec.slices.length, m0, 'unchanged slices are not delivered again');
      checkSlim('after a relist');
    } finally {
      await r.done();
    }
  });
});

describe('kubernetes source: resilience', () => {
  test('a dropped watch loses no event: changes made while the stream is down arrive', async () => {
    const r = await rig({ seed: seedBasic });
    try {
      await waitFor(() => r.rec.syncedCalls === 1, 'synced');
      await waitFor(() => r.server.watchCount() === 3, 'watches open');
      const lists0 = r.server.count('services', 'list');
      for (let round = 0; round < 3; round++) {
        const dropped = r.server.dropWatches({ graceful: round === 1 });
        assert.equal(dropped, 3);
        // while no stream is open
        r.server.create('services', svc(`late-${round}`, { ip: `172.30.1.${round + 1}` }));
        r.server.create('endpointslices', slice(`late-${round}-x`, `late-${round}`, ['10.180.3.1']));
        const w = r.server.get('endpointslices', 'default', 'web-abc')!;
        w.endpoints[0].conditions.ready = round % 2 === 0;
        r.server.update('endpointslices', w);
        await converged(r);
        await waitFor(() => r.server.watchCount() === 3, 'watches re-opened');
      }
      r.server.remove('services', 'default', 'late-0');
      await converged(r);
      assert.equal(r.server.count('services', 'list'), lists0, 'resumed from the last resourceVersion, no relist');
      assert.equal(r.rec.syncedCalls, 1);
    } finally {
      await r.done();
    }
  });

  test('410 Gone (history compacted while away) → relist, deletes made during the gap delivered as (old, null)', async () => {
    const r = await rig({ seed: seedBasic });
    try {
      await waitFor(() => r.rec.syncedCalls === 1, 'synced');
      await waitFor(() => r.server.watchCount() === 3, 'watches open');
      const lists0 = r.server.count('services', 'list');
      r.server.dropWatches();
      r.server.remove('services', 'default', 'api');
      r.server.remove('endpointslices', 'default', 'api-abc');
      r.server.create('services', svc('gap', { ip: '172.30.0.30' }));
      const web = r.server.get('services', 'default', 'web')!;
      web.spec.ports[0].port = 81;
      r.server.update('services', web);
      r.server.compact();
      await converged(r);
      assert.ok(r.server.count('services', 'list') > lists0, 'relisted after 410');
      const watched410 = r.server.requests.filter((q) => q.watch && q.path === '/api/v1/services');
      assert.ok(watched410.length >= 2);
      const del = r.rec.services.find((e) => e.new === null);
      assert.equal(del?.old?.metadata?.name, 'api');
      const sdel = r.rec.slices.find((e) => e.new === null);
      assert.equal(sdel?.old?.metadata?.name, 'api-abc');
      const upd = r.rec.services.find((e) => e.old?.metadata?.name === 'web' && e.new);
      assert.equal(upd?.old?.metadata?.namespace, 'default');
      assert.equal(upd?.new?.spec?.ports?.[0].port, 81);
      assert.equal(r.rec.syncedCalls, 1, 'onSynced is not repeated on relist');
      await waitFor(() => r.source.health().connected, 'connected');
    } finally {
      await r.done();
    }
  });

  test('API server gone: a cut stream and a refused connect are both KPROXY_SOURCE_UNREACHABLE (no race between them)', async () => {
    // A long back-off freezes the first failure: the server's stop cuts the open watch streams
    // ("Premature close"); only a retry would see ECONNREFUSED. Either way the server is down.
    const r = await rig({ seed: seedBasic, backoff: { initialMs: 60_000, maxMs: 60_000, jitter: 0 } });
    try {
      await waitFor(() => r.rec.syncedCalls === 1, 'synced');
      await waitFor(() => r.source.health().connected, 'connected');
      await r.server.stop();
      await waitFor(() => !r.source.health().connected && (r.source.health().problem ?? '').split('KPROXY_').length > 3, 'all three informers failed', 5000);
      const problem = r.source.health().problem ?? '';
      assert.doesNotMatch(problem, /KPROXY_SOURCE_API_ERROR/, problem);
      for (const what of ['services', 'endpointslices', 'node node-a']) {
        assert.match(problem, new RegExp(`KPROXY_SOURCE_UNREACHABLE: ${what}: cannot reach the API server \\(`), problem);
      }
    } finally {
      await r.done();
    }
    // An HTTP answer is no transport failure: it keeps its own code.
    assert.equal(isUnreachable(Object.assign(new Error('forbidden'), { statusCode: 403 })), false);
    assert.equal(isUnreachable(Object.assign(new Error('Premature close'), { code: 'ERR_STREAM_PREMATURE_CLOSE' })), true);
    assert.equal(isUnreachable(Object.assign(new Error('request failed, reason: connect ECONNREFUSED 127.0.0.1:1'), { code: 'ECONNREFUSED' })), true);
  });

  test('API server down: connected=false with a problem; back up (state kept, reset, rewound) → converges within 5 s', async () => {
    const r = await rig({ seed: seedBasic, backoff: { initialMs: 100, maxMs: 1000, jitter: 0 } });
    try {
      await waitFor(() => r.rec.syncedCalls === 1, 'synced');
      await waitFor(() => r.source.health().connected, 'connected');
      const contact0 = r.source.health().lastContactMs;
      await r.server.stop();
      await waitFor(() => !r.source.health().connected, 'disconnected', 3000);
      const h = r.source.health();
      assert.match(h.problem ?? '', /KPROXY_SOURCE_UNREACHABLE: (services|endpointslices|node node-a): cannot reach the API server/);
      assert.doesNotMatch(h.problem ?? '', /KPROXY_SOURCE_API_ERROR/);
      assert.equal(h.synced, true, 'synced stays true: the last state is still served');
      // changes while the server is down (the store survives, as etcd would)
      r.server.create('services', svc('while-down', { ip: '172.30.0.40' }));
      r.server.remove('endpointslices', 'default', 'web-abc');
      await sleep(1500);
      assert.equal(r.source.health().connected, false);
      await r.server.start();
      const took = await converged(r, 5000);
      assert.ok(took < 5000);
      await waitFor(() => r.source.health().connected, 'reconnected', 3000);
      assert.equal(r.source.health().problem, undefined);
      assert.ok(r.source.health().lastContactMs > contact0);

      // restart with an emptied store (versions stay monotonic; history gone → 410 → relist)
      await r.server.stop();
      await sleep(300);
      await r.server.start({ reset: true });
      r.server.create('services', svc('fresh', { ip: '172.30.0.50' }));
      await converged(r, 5000);
      const names = [...Recorder.replay(r.rec.services).keys()];
      assert.deepEqual(names, ['default/fresh']);
      assert.equal(Recorder.replay(r.rec.slices).size, 0);

      // store rewound (versions restart at 1, older than ours): watches get 504 → relist
      await r.server.stop();
      await r.server.start({ rewind: true });
      r.server.create('services', svc('rewound', { ip: '172.30.0.51' }));
      r.server.create('endpointslices', slice('rewound-1', 'rewound', ['10.180.5.1']));
      await converged(r, 5000);
      assert.deepEqual([...Recorder.replay(r.rec.services).keys()], ['default/rewound']);
      assert.ok(r.server.requests.some((q) => q.watch && q.status === 504), 'a watch was refused as too new');
    } finally {
      await r.done();
    }
  });

  test('retry back-off grows exponentially and is capped', async () => {
    const cap = captureLogger();
    const r = await rig({ seed: seedBasic, backoff: { initialMs: 50, maxMs: 300, jitter: 0 }, log: cap.log });
    try {
      await waitFor(() => r.rec.syncedCalls === 1, 'synced');
      await waitFor(() => r.server.watchCount() === 3, 'watches open');
      await r.server.stop();
      await sleep(2000);
      const delays = cap.records.filter((x) => x.resource === 'services' && typeof x.delayMs === 'number').map((x) => x.delayMs as number);
      assert.ok(delays.length >= 5 && delays.length <= 12, `retries in 2 s: ${delays.join(',')}`);
      assert.deepEqual(delays.slice(0, 4), [50, 100, 200, 300]);
      assert.ok(delays.every((d) => d <= 300), `capped: ${delays.join(',')}`);
      await r.server.start();
      await waitFor(() => r.source.health().connected, 'reconnected', 3000);
      // after a successful watch the back-off starts again from the beginning
      cap.records.length = 0;
      await r.server.stop();
      await waitFor(() => cap.records.some((x) => x.resource === 'services' && typeof x.delayMs === 'number'), 'retry logged', 3000);
      assert.equal(cap.records.find((x) => x.resource === 'services' && typeof x.delayMs === 'number')!.delayMs, 50);
      await r.server.start();
    } finally {
      await r.done();
    }
  });

  test('backoffDelay: exponential, capped, jitter only shortens', () => {
    const b = resolveBackoff({ initialMs: 200, maxMs: 5000, jitter: 0.2 });
    assert.deepEqual(
      [0, 1, 2, 3, 4, 5, 6, 50].map((a) => backoffDelay(b, a, () => 0)),
      [200, 400, 800, 1600, 3200, 5000, 5000, 5000],
    );
    assert.equal(backoffDelay(b, 10, () => 1), 4000);
    for (let i = 0; i < 100; i++) assert.ok(backoffDelay(b, i % 12) <= 5000);
    assert.deepEqual(resolveBackoff(), { initialMs: 200, maxMs: 2500, factor: 2, jitter: 0.1 });
  });
});

describe('kubernetes source: configuration', () => {
  test('HTTPS with a bearer token and the CA from the kubeconfig; a wrong token is reported', async () => {
    const r = await rig({ server: { tls: true, token: 'sekret-token' }, seed: seedBasic });
    try {
      assert.match(r.source.server, /^https:\/\/127\.0\.0\.1:\d+$/);
      await waitFor(() => r.rec.syncedCalls === 1, 'synced over https');
      r.server.create('services', svc('tls-new', { ip: '172.30.0.60' }));
      await converged(r);
    } finally {
      await r.done();
    }

    const bad = await rig({ server: { tls: true, token: 'sekret-token' }, seed: seedBasic, start: false });
    try {
      const kc = bad.server.writeKubeconfig(join(tmp.dir, 'kubeconfig-badtoken'), { token: 'wrong' });
      const src = createKubernetesSource({ kubeconfig: kc, nodeName: NODE, log: silentLogger(), backoff: FAST });
      const rec = new Recorder();
      await src.start(rec);
      try {
        await waitFor(() => (src.health().problem ?? '').includes('HTTP 401'), '401 reported');
        const h = src.health();
        assert.equal(h.connected, false);
        assert.equal(h.synced, false);
        assert.match(h.problem!, /credentials and RBAC/);
        assert.equal(rec.services.length, 0);
      } finally {
        await src.stop();
      }
    } finally {
      await bad.done();
    }
  });

  test('in-cluster configuration: KUBERNETES_SERVICE_HOST/PORT + service account token and CA', async () => {
    const server = await TestApiServer.start({ tls: true, token: 'in-cluster-token' });
    const saved = { host: process.env.KUBERNETES_SERVICE_HOST, port: process.env.KUBERNETES_SERVICE_PORT };
    let source: KubernetesSource | undefined;
    try {
      seedBasic(server);
      const prefix = join(tmp.dir, 'incluster');
      const sa = join(prefix, 'var/run/secrets/kubernetes.io/serviceaccount');
      mkdirSync(sa, { recursive: true });
      writeFileSync(join(sa, 'token'), 'in-cluster-token');
      writeFileSync(join(sa, 'ca.crt'), server.caPem!);
      writeFileSync(join(sa, 'namespace'), 'kube-system');
      process.env.KUBERNETES_SERVICE_HOST = '127.0.0.1';
      process.env.KUBERNETES_SERVICE_PORT = String(server.port);
      source = createKubernetesSource({ nodeName: NODE, log: silentLogger(), backoff: FAST, inClusterPathPrefix: prefix });
      assert.equal(source.server, `https://127.0.0.1:${server.port}`);
      const rec = new Recorder();
      await source.start(rec);
      await waitFor(() => rec.syncedCalls === 1, 'synced in-cluster');
      assert.equal(rec.services.length, 2);
    } finally {
      await source?.stop();
      await server.close();
      if (saved.host === undefined) delete process.env.KUBERNETES_SERVICE_HOST;
      else process.env.KUBERNETES_SERVICE_HOST = saved.host;
      if (saved.port === undefined) delete process.env.KUBERNETES_SERVICE_PORT;
      else process.env.KUBERNETES_SERVICE_PORT = saved.port;
    }
  });

  test('--master overrides the kubeconfig server (a kubeconfig at a wrong port serves through --master)', async () => {
    const server = await TestApiServer.start({ tls: true, token: 'master-token' });
    const dead = await TestApiServer.start({ tls: true, token: 'master-token' });
    const deadPort = dead.port;
    await dead.close(); // nothing listens there any more
    let source: KubernetesSource | undefined;
    try {
      seedBasic(server);
      // the kubeconfig's CA and token stay in use; only the server URL is replaced
      const kc = server.writeKubeconfig(join(tmp.dir, 'kubeconfig-wrong-port'));
      writeFileSync(kc, readFileSync(kc, 'utf8').replace(`127.0.0.1:${server.port}`, `127.0.0.1:${deadPort}`));
      assert.match(loadKubeConfig({ kubeconfig: kc }).getCurrentCluster()!.server, new RegExp(`:${deadPort}$`));
      source = createKubernetesSource({ kubeconfig: kc, master: server.url, nodeName: NODE, log: silentLogger(), backoff: FAST });
      assert.equal(source.server, server.url);
      const rec = new Recorder();
      await source.start(rec);
      await waitFor(() => rec.syncedCalls === 1, 'synced through --master');
      assert.deepEqual([...Recorder.replay(rec.services).keys()].sort(), ['default/api', 'default/web']);
      assert.ok(server.requests.length > 0);
    } finally {
      await source?.stop();
      await server.close();
    }
  });

  test('--master alone (no kubeconfig, not in a cluster): plain http to the server, as upstream', async () => {
    const server = await TestApiServer.start();
    const saved = process.env.KUBERNETES_SERVICE_HOST;
    delete process.env.KUBERNETES_SERVICE_HOST;
    let source: KubernetesSource | undefined;
    try {
      seedBasic(server);
      // a bare host:port is http, as client-go's default scheme
      assert.equal(masterURL(`127.0.0.1:${server.port}`), server.url);
      assert.equal(masterURL(`${server.url}/`), server.url);
      assert.throws(() => masterURL('ftp://x'), /KPROXY_SOURCE_KUBECONFIG: --master "ftp:\/\/x" is not an http\(s\) URL/);
      assert.throws(() => masterURL('http://'), /KPROXY_SOURCE_KUBECONFIG/);
      source = createKubernetesSource({ master: `127.0.0.1:${server.port}`, nodeName: NODE, log: silentLogger(), backoff: FAST });
      assert.equal(source.server, server.url);
      const rec = new Recorder();
      await source.start(rec);
      await waitFor(() => rec.syncedCalls === 1, 'synced through --master alone');
      assert.equal(Recorder.replay(rec.services).size, 2);
      assert.ok(server.requests.every((r) => r.method === 'GET'));
    } finally {
      await source?.stop();
      await server.close();
      if (saved !== undefined) process.env.KUBERNETES_SERVICE_HOST = saved;
    }
  });

  test('configuration errors carry stable codes', () => {
    const saved = process.env.KUBERNETES_SERVICE_HOST;
    delete process.env.KUBERNETES_SERVICE_HOST;
    try {
      assert.throws(() => loadKubeConfig({ kubeconfig: join(tmp.dir, 'nope') }), (e: unknown) => e instanceof KubernetesSourceError && e.code === 'KPROXY_SOURCE_KUBECONFIG');
      assert.throws(() => loadKubeConfig({}), /KPROXY_SOURCE_NO_CLUSTER: .*--kubeconfig/);
      const plain = join(tmp.dir, 'kc-plain-http');
      writeFileSync(plain, JSON.stringify({ clusters: [{ name: 'c', cluster: { server: 'http://127.0.0.1:1' } }], users: [{ name: 'u', user: {} }], contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }], 'current-context': 'x' }));
      assert.throws(() => loadKubeConfig({ kubeconfig: plain }), /KPROXY_SOURCE_KUBECONFIG: .*insecure-skip-tls-verify/);
      assert.throws(() => createKubernetesSource({ kubeconfig: plain, nodeName: '', log: silentLogger() }), /KPROXY_SOURCE_NODE_NAME/);
    } finally {
      if (saved !== undefined) process.env.KUBERNETES_SERVICE_HOST = saved;
    }
  });
});

describe('kubernetes source → ProxyStateTracker', () => {
  test('end to end: the tracker state has the service ports and endpoints from the API', async () => {
    const tracker = new ProxyStateTracker(4, NODE);
    const r = await rig({
      seed: (s) => {
        s.create('services', svc('web', { ip: '172.30.0.10', type: 'NodePort', nodePort: 30080 }));
        s.create('services', svc('hl', { ip: 'None' }));
        s.create('endpointslices', slice('web-1', 'web', ['10.180.0.1', '10.180.0.2'], { nodeName: NODE }));
        s.create('endpointslices', slice('web-2', 'web', ['10.180.0.3']));
        s.create('nodes', node(NODE));
      },
      start: false,
    });
    try {
      let synced = false;
      await r.source.start({
        onService: (o, n) => void tracker.services.update(o, n),
        onEndpointSlice: (o, n) => void tracker.endpoints.update(o, n),
        onSynced: () => (synced = true),
      });
      await waitFor(() => synced, 'synced');
      const changed = tracker.apply();
      assert.deepEqual([...changed], ['default/web']);
      const sp = tracker.state.services.get('default/web:http')!;
      assert.equal(sp.clusterIP, '172.30.0.10');
      assert.equal(sp.port, 80);
      assert.equal(sp.nodePort, 30080);
      assert.equal(sp.protocol, 'TCP');
      assert.deepEqual(
        tracker.state.endpoints.get('default/web:http')!.map((e) => [e.key, e.isLocal, e.ready]),
        [
          ['10.180.0.1:8080', true, true],
          ['10.180.0.2:8080', true, true],
          ['10.180.0.3:8080', false, true],
        ],
      );
      assert.equal(tracker.state.services.size, 1, 'headless service has no service port');

      // an endpoint goes away and a port changes: exactly that service changes
      r.server.update('endpointslices', slice('web-2', 'web', []));
      const web = r.server.get('services', 'default', 'web')!;
      web.spec.ports[0].port = 8000;
      r.server.update('services', web);
      await waitFor(() => tracker.hasPending() && tracker.services.pendingCount() === 1 && tracker.endpoints.pendingCount() === 1, 'changes tracked');
      assert.deepEqual([...tracker.apply()], ['default/web']);
      assert.equal(tracker.state.services.get('default/web:http')!.port, 8000);
      assert.deepEqual(tracker.state.endpoints.get('default/web:http')!.map((e) => e.key), ['10.180.0.1:8080', '10.180.0.2:8080']);

      r.server.remove('services', 'default', 'web');
      r.server.remove('endpointslices', 'default', 'web-1');
      r.server.remove('endpointslices', 'default', 'web-2');
      await waitFor(() => tracker.services.pendingCount() === 1 && tracker.endpoints.pendingCount() === 1, 'deletes tracked');
      tracker.apply();
      assert.equal(tracker.state.services.size, 0);
      assert.equal(tracker.state.endpoints.size, 0);
    } finally {
      await r.done();
    }
  });
});
