// Per-service health-check servers as upstream's ServiceHealthServer
// (pkg/proxy/healthcheck/service_health.go), with real sockets on 127.0.0.1: 200 with the
// local endpoint count when the Service has local ready endpoints, 503 when none or while the
// proxy is unhealthy, servers opened and closed as Services come and go, and a port that
// cannot be bound logged once (KPROXY_HEALTHCHECK_BIND) while the others are served.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, request, type Server } from 'node:http';
import { ServiceHealthServer, healthCheckServicesOf, serviceHealthBody, type HealthCheckService } from '../../src/server/service-health.ts';
import { buildNodeView } from '../../src/core/nodeview.ts';
import { resolveConfig } from '../../src/config/config.ts';
import type { Logger } from '../../src/log.ts';
import { endpoint, port, stateOf } from '../support/ports.ts';

const LOOPBACK = { matchAll: false, ips: ['127.0.0.1'] };

function captureLogger(): { log: Logger; errors: string[] } {
  const errors: string[] = [];
  const log = { info() {}, warn() {}, debug() {}, error: (_o: unknown, msg: string) => errors.push(msg), child: () => log } as unknown as Logger;
  return { log, errors };
}

async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  const p = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return p;
}

function get(p: number): Promise<{ code: number; body: string; headers: Record<string, unknown> }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port: p, path: '/', agent: false }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ code: res.statusCode!, body, headers: res.headers }));
    });
    req.on('error', reject);
    req.setTimeout(5000, () => req.destroy(new Error('timeout')));
    req.end();
  });
}

test('200 with the local endpoint count, 503 with none, as upstream', async () => {
  const { log } = captureLogger();
  const hc = new ServiceHealthServer({ log, proxyHealthy: () => true });
  const [p1, p2] = [await freePort(), await freePort()];
  try {
    await hc.sync(4, LOOPBACK, [
      { namespace: 'ns', name: 'web', port: p1, localEndpoints: 2 },
      { namespace: 'ns', name: 'empty', port: p2, localEndpoints: 0 },
    ]);
    const ok = await get(p1);
    assert.equal(ok.code, 200);
    assert.deepEqual(JSON.parse(ok.body), { service: { namespace: 'ns', name: 'web' }, localEndpoints: 2, serviceProxyHealthy: true });
    assert.equal(ok.body, serviceHealthBody('ns', 'web', 2, true));
    assert.equal(ok.headers['content-type'], 'application/json');
    assert.equal(ok.headers['x-load-balancing-endpoint-weight'], '2');
    const none = await get(p2);
    assert.equal(none.code, 503);
    assert.deepEqual(JSON.parse(none.body), { service: { namespace: 'ns', name: 'empty' }, localEndpoints: 0, serviceProxyHealthy: true });
  } finally {
    await hc.close();
  }
});

test('an unhealthy proxy answers 503 with serviceProxyHealthy false, even with local endpoints', async () => {
  const { log } = captureLogger();
  let healthy = true;
  const hc = new ServiceHealthServer({ log, proxyHealthy: () => healthy });
  const p = await freePort();
  try {
    await hc.sync(4, LOOPBACK, [{ namespace: 'ns', name: 'web', port: p, localEndpoints: 1 }]);
    assert.equal((await get(p)).code, 200);
    healthy = false;
    const r = await get(p);
    assert.equal(r.code, 503);
    assert.deepEqual(JSON.parse(r.body), { service: { namespace: 'ns', name: 'web' }, localEndpoints: 1, serviceProxyHealthy: false });
  } finally {
    await hc.close();
  }
});

test('servers open and close as Services come and go; counts follow the syncs', async () => {
  const { log } = captureLogger();
  const hc = new ServiceHealthServer({ log, proxyHealthy: () => true });
  const [p1, p2] = [await freePort(), await freePort()];
  const a: HealthCheckService = { namespace: 'ns', name: 'a', port: p1, localEndpoints: 1 };
  const b: HealthCheckService = { namespace: 'ns', name: 'b', port: p2, localEndpoints: 1 };
  try {
    await hc.sync(4, LOOPBACK, [a]);
    assert.deepEqual(hc.ports(), [p1]);
    await assert.rejects(get(p2), /ECONNREFUSED/);
    await hc.sync(4, LOOPBACK, [a, b]);
    assert.equal((await get(p2)).code, 200);
    await hc.sync(4, LOOPBACK, [{ ...a, localEndpoints: 0 }, b]);
    assert.equal((await get(p1)).code, 503);
    await hc.sync(4, LOOPBACK, [b]);
    await assert.rejects(get(p1), /ECONNREFUSED/);
    assert.deepEqual(hc.ports(), [p2]);
    // the port moves: the old one closes, the new one opens
    const p3 = await freePort();
    await hc.sync(4, LOOPBACK, [{ ...b, port: p3 }]);
    await assert.rejects(get(p2), /ECONNREFUSED/);
    assert.equal((await get(p3)).code, 200);
  } finally {
    await hc.close();
  }
  assert.deepEqual(hc.ports(), []);
});

test('families merge per port: one server, the larger count', async () => {
  const { log } = captureLogger();
  const hc = new ServiceHealthServer({ log, proxyHealthy: () => true });
  const p = await freePort();
  try {
    await hc.sync(4, LOOPBACK, [{ namespace: 'ns', name: 'ds', port: p, localEndpoints: 0 }]);
    await hc.sync(6, { matchAll: false, ips: [] }, [{ namespace: 'ns', name: 'ds', port: p, localEndpoints: 3 }]);
    const r = await get(p);
    assert.equal(r.code, 200);
    assert.equal(JSON.parse(r.body).localEndpoints, 3);
  } finally {
    await hc.close();
  }
});

test('a port that cannot be bound is logged once with KPROXY_HEALTHCHECK_BIND; the others are served', async () => {
  const { log, errors } = captureLogger();
  const hc = new ServiceHealthServer({ log, proxyHealthy: () => true });
  const holder: Server = createServer();
  await new Promise<void>((r) => holder.listen(0, '127.0.0.1', () => r()));
  const taken = (holder.address() as { port: number }).port;
  const p = await freePort();
  const services = [
    { namespace: 'ns', name: 'blocked', port: taken, localEndpoints: 1 },
    { namespace: 'ns', name: 'fine', port: p, localEndpoints: 1 },
  ];
  try {
    await hc.sync(4, LOOPBACK, services);
    await hc.sync(4, LOOPBACK, services);
    assert.equal(errors.filter((e) => e.startsWith('KPROXY_HEALTHCHECK_BIND')).length, 1, errors.join('\n'));
    assert.equal((await get(p)).code, 200);
    // freed: the next sync binds it
    await new Promise<void>((r) => holder.close(() => r()));
    await hc.sync(4, LOOPBACK, services);
    assert.equal(JSON.parse((await get(taken)).body).service.name, 'blocked');
  } finally {
    await hc.close();
    if (holder.listening) holder.close();
  }
});

test('the view gives eTP Local services with a health check port and their local ready endpoints', () => {
  const local = (ip: string, ready = true) => ({ ...endpoint(ip), isLocal: true, nodeName: 'node-a', ready, serving: ready });
  const lb = port('ns', 'lb', 'http', { externalPolicyLocal: true, healthCheckNodePort: 32000, nodePort: 30080, loadBalancerVIPs: ['1.2.3.4'] });
  const lb2 = port('ns', 'lb', 'https', { externalPolicyLocal: true, healthCheckNodePort: 32000, nodePort: 30443, port: 443, loadBalancerVIPs: ['1.2.3.4'] });
  const cluster = port('ns', 'cl', 'http', { healthCheckNodePort: 32001, nodePort: 30081 });
  const remote = port('ns', 'remote', 'http', { externalPolicyLocal: true, healthCheckNodePort: 32002, nodePort: 30082 });
  const state = stateOf([
    [lb, [local('10.180.0.1'), local('10.180.0.2', false), endpoint('10.180.0.3')]],
    [lb2, [local('10.180.0.1')]],
    [cluster, [local('10.180.0.4')]],
    [remote, [endpoint('10.180.0.5')]],
  ]);
  const config = resolveConfig({ nodePortAddresses: ['127.0.0.0/8'] } as never);
  const view = buildNodeView({ state, config, node: { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4 } });
  assert.deepEqual(view.nodePorts.ips, ['127.0.0.1']);
  const got = healthCheckServicesOf(view).sort((x, y) => x.port - y.port);
  assert.deepEqual(got, [
    { namespace: 'ns', name: 'lb', port: 32000, localEndpoints: 2 },
    { namespace: 'ns', name: 'remote', port: 32002, localEndpoints: 0 },
  ]);
});
