// Per-service health check node ports through the CLI, on the real kernel, in a namespace
// this test creates (node address 192.168.0.2 on a veth link): `kproxy run --manifests DIR`
// with an eTP Local LoadBalancer Service (healthCheckNodePort 32000) answers on
// http://192.168.0.2:32000/ as upstream's ServiceHealthServer: 200 with localEndpoints 1
// while its endpoint is on this node, 503 with localEndpoints 0 once the endpoint moves to
// another node, and nothing listens once the Service is deleted.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Netns, uniqueName, vethPair, waitFor } from '../support/netns.ts';

const NODE_IP = '192.168.0.2';
const HC_PORT = 32000;

function manifests(endpointNode: string, withService = true): string {
  const svc = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: 172.30.0.10
  type: LoadBalancer
  externalTrafficPolicy: Local
  healthCheckNodePort: ${HC_PORT}
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: 30080}
status:
  loadBalancer:
    ingress: [{ip: 1.2.3.4}]
---
`;
  return `${withService ? svc : ''}apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [10.180.0.1]
  conditions: {ready: true}
  nodeName: ${endpointNode}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: ${NODE_IP}}]
`;
}

const tag = uniqueName('kpt-hc');
const node = new Netns(`${tag}-n`);
const dir = mkdtempSync(join(tmpdir(), 'kp-hc-'));

const peer = new Netns(`${tag}-c`);

before(() => {
  Netns.create(node.name);
  Netns.create(peer.name);
  vethPair(node, 'eth0', `${NODE_IP}/24`, peer, 'eth0', '192.168.0.3/24');
});

after(async () => {
  await node.destroy();
  await peer.destroy();
  rmSync(dir, { recursive: true, force: true });
});

/** curl the health check: {code, body}, or {refused: true} when nothing listens. */
function probe(from: Netns = node): { code?: number; body?: string; refused?: boolean; error?: string } {
  try {
    const out = from.exec('curl', ['-sS', '--max-time', '3', '-w', '\n%{http_code}', `http://${NODE_IP}:${HC_PORT}/`]);
    const lines = out.split('\n');
    return { code: Number(lines.at(-1)), body: lines.slice(0, -1).join('\n') };
  } catch (e) {
    const msg = (e as Error).message;
    return /Connection refused|Couldn't connect/i.test(msg) ? { refused: true } : { error: msg };
  }
}

for (const mode of ['nftables', 'iptables', 'userspace']) {
  test(`${mode}: the health check node port follows the Service's local endpoints`, async () => {
    writeFileSync(join(dir, 'web.yaml'), manifests('node-a'));
    let log = '';
    const proc = node.kproxy(
      ['run', '--mode', mode, '--manifests', dir, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8',
        '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
      (s) => (log += s),
    );
    const fail = (e: Error) => assert.fail(`${e.message}\n${log.slice(-4000)}`);
    try {
      const ok = await waitFor('200 from the health check', () => { const r = probe(); return r.code === 200 && r; }, 30_000, 200).catch(fail);
      assert.deepEqual(JSON.parse(ok.body!), { service: { namespace: 't', name: 'web' }, localEndpoints: 1, serviceProxyHealthy: true });
      // as a load balancer probes it: from outside the node, through the mode's input rules
      assert.equal(probe(peer).code, 200, 'the probe from another host passes the rules');

      writeFileSync(join(dir, 'web.yaml'), manifests('node-b'));
      const unavailable = await waitFor('503 once the endpoint is remote', () => { const r = probe(); return r.code === 503 && r; }, 30_000, 200).catch(fail);
      assert.deepEqual(JSON.parse(unavailable.body!), { service: { namespace: 't', name: 'web' }, localEndpoints: 0, serviceProxyHealthy: true });

      writeFileSync(join(dir, 'web.yaml'), manifests('node-b', false));
      await waitFor('connection refused once the Service is deleted', () => probe().refused, 30_000, 200).catch(fail);
    } finally {
      await node.kill(proc);
    }
  });
}
