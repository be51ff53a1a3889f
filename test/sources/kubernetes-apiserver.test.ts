// The test API server speaks kube-apiserver's protocol: checked over raw HTTP, and with
// client-node's own typed client and informer (unchanged).
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { join } from 'node:path';
import { CoreV1Api, DiscoveryV1Api, KubeConfig, makeInformer, type V1Service } from '@kubernetes/client-node';
import { TestApiServer, parseLabelSelector, tempDir } from '../support/apiserver.ts';
import { node, slice, svc, waitFor } from './k8s-fixtures.ts';

interface Resp {
  status: number;
  body: string;
  json: any; // eslint-disable-line @typescript-eslint/no-explicit-any
}

function get(url: string, headers: Record<string, string> = {}): Promise<Resp> {
  return new Promise((resolve, reject) => {
    http
      .get(url, { headers, agent: false }, (res) => {
        let body = '';
        res.on('data', (c) => (body += c));
        res.on('end', () => {
          let json;
          try {
            json = JSON.parse(body);
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, body, json });
        });
      })
      .on('error', reject);
  });
}

/** Opens a watch and collects its events until `n` have arrived or the stream ends (bounded). */
function watch(url: string, n: number, timeoutMs = 3000): Promise<{ status: number; events: any[]; ended: boolean }> { // eslint-disable-line @typescript-eslint/no-explicit-any
  return new Promise((resolve, reject) => {
    const events: any[] = []; // eslint-disable-line @typescript-eslint/no-explicit-any
    let buf = '';
    const req = http.get(url, (res) => {
      const finish = (ended: boolean) => {
        clearTimeout(timer);
        req.destroy();
        resolve({ status: res.statusCode ?? 0, events, ended });
      };
      const timer = setTimeout(() => finish(false), timeoutMs);
      res.on('data', (c) => {
        buf += c;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          events.push(JSON.parse(buf.slice(0, i)));
          buf = buf.slice(i + 1);
        }
        if (events.length >= n) finish(false);
      });
      res.on('end', () => finish(true));
    });
    req.on('error', (e) => ((e as NodeJS.ErrnoException).code === 'ECONNRESET' ? undefined : reject(e)));
  });
}

describe('test API server protocol', () => {
  test('list: kinds, global resourceVersion, selectors, namespaces, Exact / too-large versions', async () => {
    const s = await TestApiServer.start();
    try {
      s.create('services', svc('a', { labels: { app: 'x' } }));
      s.create('services', svc('b', { ns: 'kube-system', labels: { app: 'y', 'service.kubernetes.io/service-proxy-name': 'p' } }));
      s.create('endpointslices', slice('a-1', 'a', ['10.180.0.1']));
      s.create('nodes', node('node-a'));
      s.create('nodes', node('node-b'));
      const l = await get(`${s.url}/api/v1/services`);
      assert.equal(l.status, 200);
      assert.equal(l.json.kind, 'ServiceList');
      assert.equal(l.json.apiVersion, 'v1');
      assert.equal(l.json.metadata.resourceVersion, String(s.resourceVersion));
      assert.deepEqual(l.json.items.map((i: V1Service) => `${i.metadata?.namespace}/${i.metadata?.name}`), ['default/a', 'kube-system/b']);
      assert.equal(l.json.items[0].kind, undefined, 'list items carry no kind');
      assert.equal(l.json.items[0].metadata.resourceVersion, '2');
      const sel = async (q: string) => (await get(`${s.url}/api/v1/services?labelSelector=${encodeURIComponent(q)}`)).json.items.map((i: V1Service) => i.metadata?.name);
      assert.deepEqual(await sel('!service.kubernetes.io/service-proxy-name'), ['a']);
      assert.deepEqual(await sel('service.kubernetes.io/service-proxy-name'), ['b']);
      assert.deepEqual(await sel('app=y'), ['b']);
      assert.deepEqual(await sel('app==x,!nope'), ['a']);
      assert.deepEqual(await sel('app!=x'), ['b']);
      assert.deepEqual(await sel('app in (x,z)'), ['a']);
      assert.deepEqual(await sel('app notin (x)'), ['b']);
      assert.equal((await get(`${s.url}/api/v1/services?labelSelector=${encodeURIComponent('a b c')}`)).status, 400);
      assert.deepEqual((await get(`${s.url}/api/v1/namespaces/kube-system/services`)).json.items.map((i: V1Service) => i.metadata?.name), ['b']);
      const es = await get(`${s.url}/apis/discovery.k8s.io/v1/namespaces/default/endpointslices`);
      assert.equal(es.json.kind, 'EndpointSliceList');
      assert.equal(es.json.apiVersion, 'discovery.k8s.io/v1');
      assert.equal(es.json.items.length, 1);
      const nodes = await get(`${s.url}/api/v1/nodes?fieldSelector=metadata.name%3Dnode-b`);
      assert.deepEqual(nodes.json.items.map((i: V1Service) => i.metadata?.name), ['node-b']);
      assert.equal((await get(`${s.url}/api/v1/nodes?fieldSelector=spec.foo%3Dx`)).status, 400);
      // Exact: the state as it was then; too old after compaction; from the future: 504
      const exact = await get(`${s.url}/api/v1/services?resourceVersion=2&resourceVersionMatch=Exact`);
      assert.deepEqual(exact.json.items.map((i: V1Service) => i.metadata?.name), ['a']);
      assert.equal(exact.json.metadata.resourceVersion, '2');
      assert.equal((await get(`${s.url}/api/v1/services?resourceVersion=999&resourceVersionMatch=NotOlderThan`)).status, 504);
      s.compact();
      const gone = await get(`${s.url}/api/v1/services?resourceVersion=2&resourceVersionMatch=Exact`);
      assert.equal(gone.status, 410);
      assert.equal(gone.json.kind, 'Status');
      assert.equal(gone.json.reason, 'Expired');
      assert.equal(gone.json.code, 410);
      // single objects, 404 and 405 as Status objects
      assert.equal((await get(`${s.url}/api/v1/namespaces/default/services/a`)).json.kind, 'Service');
      const nf = await get(`${s.url}/api/v1/namespaces/default/services/zz`);
      assert.equal(nf.status, 404);
      assert.equal(nf.json.reason, 'NotFound');
      assert.equal((await get(`${s.url}/api/v1/pods`)).status, 404);
      // discovery
      assert.deepEqual((await get(`${s.url}/api`)).json.versions, ['v1']);
      assert.equal((await get(`${s.url}/apis`)).json.groups[0].name, 'discovery.k8s.io');
    } finally {
      await s.close();
    }
  });

  test('watch: events after a version, selector transitions, bookmarks, 410 in the stream, timeoutSeconds', async () => {
    const s = await TestApiServer.start({ bookmarkIntervalMs: 100 });
    try {
      s.create('services', svc('a'));
      const rv0 = s.resourceVersion;
      s.create('services', svc('b'));
      const b = s.get('services', 'default', 'b')!;
      b.metadata!.labels = { 'service.kubernetes.io/service-proxy-name': 'p' };
      s.update('services', b); // leaves the selector: DELETED for a selector watch
      s.remove('services', 'default', 'a');
      const q = `labelSelector=${encodeURIComponent('!service.kubernetes.io/service-proxy-name')}`;
      const w = await watch(`${s.url}/api/v1/services?watch=true&resourceVersion=${rv0}&${q}`, 3);
      assert.equal(w.status, 200);
      assert.deepEqual(
        w.events.map((e) => [e.type, e.object.metadata.name, e.object.kind, e.object.apiVersion]),
        [
          ['ADDED', 'b', 'Service', 'v1'],
          ['DELETED', 'b', 'Service', 'v1'],
          ['DELETED', 'a', 'Service', 'v1'],
        ],
      );
      assert.equal(w.events[2].object.metadata.resourceVersion, String(s.resourceVersion), 'DELETED carries the deletion version');
      // live events and bookmarks
      const live = watch(`${s.url}/api/v1/services?watch=1&resourceVersion=${s.resourceVersion}&allowWatchBookmarks=true`, 3, 3000);
      await waitFor(() => s.watchCount('services') === 1, 'watch registered');
      s.create('services', svc('c'));
      const lw = await live;
      assert.equal(lw.events[0].type, 'ADDED');
      assert.ok(lw.events.slice(1).every((e) => e.type === 'BOOKMARK' && e.object.kind === 'Service' && e.object.metadata.resourceVersion === String(s.resourceVersion)));
      // rv "" → synthetic ADDED for the current state; timeoutSeconds ends the stream cleanly
      const fresh = await watch(`${s.url}/api/v1/services?watch=true&timeoutSeconds=1`, 100, 3000);
      assert.equal(fresh.ended, true);
      assert.deepEqual(fresh.events.map((e) => [e.type, e.object.metadata.name]), [['ADDED', 'b'], ['ADDED', 'c']]);
      // expired version: 200, one ERROR event with a 410 Status, end of stream
      s.compact();
      const old = await watch(`${s.url}/api/v1/services?watch=true&resourceVersion=${rv0}`, 5);
      assert.equal(old.status, 200);
      assert.equal(old.ended, true);
      assert.equal(old.events.length, 1);
      assert.equal(old.events[0].type, 'ERROR');
      assert.deepEqual(
        { kind: old.events[0].object.kind, code: old.events[0].object.code, reason: old.events[0].object.reason, status: old.events[0].object.status },
        { kind: 'Status', code: 410, reason: 'Expired', status: 'Failure' },
      );
      assert.match(old.events[0].object.message, /^too old resource version: \d+ \(\d+\)$/);
      // sendInitialEvents: initial state then a bookmark marking its end
      const wl = await watch(`${s.url}/api/v1/services?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true`, 3);
      assert.deepEqual(wl.events.map((e) => e.type), ['ADDED', 'ADDED', 'BOOKMARK']);
      assert.equal(wl.events[2].object.metadata.annotations['k8s.io/initial-events-end'], 'true');
    } finally {
      await s.close();
    }
  });

  test('bearer token, stop/restart on the same port', async () => {
    const s = await TestApiServer.start({ token: 't0k' });
    try {
      const noAuth = await get(`${s.url}/api/v1/services`);
      assert.equal(noAuth.status, 401);
      assert.equal(noAuth.json.reason, 'Unauthorized');
      assert.equal((await get(`${s.url}/api/v1/services`, { Authorization: 'Bearer t0k' })).status, 200);
      const port = s.port;
      s.create('services', svc('a'));
      await s.stop();
      await assert.rejects(get(`${s.url}/api/v1/services`), /ECONNREFUSED/);
      await s.start();
      assert.equal(s.port, port);
      assert.equal((await get(`${s.url}/api/v1/services`, { Authorization: 'Bearer t0k' })).json.items.length, 1);
      await s.restart({ reset: true });
      assert.equal((await get(`${s.url}/api/v1/services`, { Authorization: 'Bearer t0k' })).json.items.length, 0);
    } finally {
      await s.close();
    }
  });

  test('dropWatches ends open streams (graceful: clean end of the chunked body)', async () => {
    const s = await TestApiServer.start();
    try {
      const w = watch(`${s.url}/api/v1/services?watch=true&resourceVersion=${s.resourceVersion}`, 10, 3000);
      await waitFor(() => s.watchCount() === 1, 'watch open');
      assert.equal(s.dropWatches({ graceful: true }), 1);
      const r = await w;
      assert.equal(r.ended, true);
      assert.equal(s.watchCount(), 0);
    } finally {
      await s.close();
    }
  });

  test('client-node unchanged: typed API clients and makeInformer work against it (HTTPS)', async () => {
    const s = await TestApiServer.start({ tls: true, token: 'abc' });
    const tmp = tempDir('kpt-k8s-api-');
    try {
      s.create('services', svc('a', { ip: '172.30.0.10' }));
      s.create('endpointslices', slice('a-1', 'a', ['10.180.0.1']));
      const kc = new KubeConfig();
      kc.loadFromFile(s.writeKubeconfig(join(tmp.dir, 'kc')));
      const core = kc.makeApiClient(CoreV1Api);
      const list = await core.listServiceForAllNamespaces({ labelSelector: '!service.kubernetes.io/service-proxy-name' });
      assert.equal(list.items[0].spec?.clusterIP, '172.30.0.10');
      assert.equal(list.metadata?.resourceVersion, String(s.resourceVersion));
      const disco = kc.makeApiClient(DiscoveryV1Api);
      const sl = await disco.listEndpointSliceForAllNamespaces();
      assert.equal(sl.items[0].endpoints[0].addresses[0], '10.180.0.1');
      const inf = makeInformer(kc, '/api/v1/services', () => core.listServiceForAllNamespaces());
      const seen: string[] = [];
      inf.on('add', (o) => seen.push(`add ${o.metadata?.name}`));
      inf.on('update', (o) => seen.push(`update ${o.metadata?.name}`));
      inf.on('delete', (o) => seen.push(`delete ${o.metadata?.name}`));
      await inf.start();
      try {
        await waitFor(() => s.watchCount('services') === 1, 'informer watching');
        s.create('services', svc('b', { ip: '172.30.0.11' }));
        s.remove('services', 'default', 'a');
        await waitFor(() => seen.length === 3, 'informer events');
        assert.deepEqual(seen, ['add a', 'add b', 'delete a']);
      } finally {
        await inf.stop();
      }
    } finally {
      await s.close();
      tmp.cleanup();
    }
  });

  test('label selector parser', () => {
    const m = (sel: string, labels: Record<string, string>) => parseLabelSelector(sel)({ metadata: { labels } });
    assert.equal(m('', {}), true);
    assert.equal(m('!a,!b', { c: '1' }), true);
    assert.equal(m('!a,!b', { b: '' }), false);
    assert.equal(m('a', { a: '' }), true);
    assert.equal(m('a=1,b in (2, 3)', { a: '1', b: '3' }), true);
    assert.equal(m('a=1,b in (2, 3)', { a: '1', b: '4' }), false);
    assert.equal(m('x notin (1)', {}), true);
    assert.throws(() => m('a b', {}));
  });
});
