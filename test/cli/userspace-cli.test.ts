// The issue's own check, as a user runs it: `kproxy run --mode userspace --manifests DIR` in a
// fresh network namespace with Services, EndpointSlices and backends on 127.0.0.0/8.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Netns, uniqueName, waitFor } from '../support/netns.ts';

function manifests(readyThird: boolean): string {
  return `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: 127.0.100.1
  ports:
  - {name: http, port: 80, protocol: TCP}
  - {name: dns, port: 53, protocol: UDP}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
- {name: dns, port: 5353, protocol: UDP}
endpoints:
- addresses: [127.0.1.1]
- addresses: [127.0.1.2]
- addresses: [127.0.1.3]
  conditions: {ready: ${readyThird}}
`;
}

const dir = mkdtempSync(join(tmpdir(), 'kp-us-cli-'));
const ns = Netns.create(uniqueName('kpt-cli-us'));
after(async () => {
  await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

function client(proto: 'tcp' | 'udp', port: number, n: number): { replies: Record<string, number>; errors: Record<string, number> } {
  const out = ns.exec(process.execPath, ['--import', 'tsx', 'test/support/client-main.ts', proto, '127.0.100.1', String(port), String(n), '2000']);
  return JSON.parse(out.trim().split('\n').at(-1)!);
}

test('userspace mode through the CLI: every ready endpoint gets traffic, an added one within 5 s', async () => {
  writeFileSync(join(dir, 'svc.yaml'), manifests(false));
  let log = '';
  for (const id of ['b1', 'b2', 'b3']) {
    const ip = `127.0.1.${id.slice(1)}`;
    const p = ns.node('test/support/backend-main.ts', [id, `tcp:${ip}:8080`, `udp:${ip}:5353`]);
    await waitFor(`backend ${id}`, () => new Promise<boolean>((r) => p.stdout!.once('data', () => r(true))), 15_000);
  }
  ns.kproxy(['run', '--mode', 'userspace', '--manifests', dir, '--hostname-override', 'node-a',
    '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'], (s) => (log += s));
  await waitFor('kproxy healthy', () => ns.exec('curl', ['-sf', '127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 20_000, 200)
    .catch((e) => assert.fail(`${e.message}\n${log}`));

  const tcp = client('tcp', 80, 20);
  assert.deepEqual(Object.keys(tcp.errors), [], JSON.stringify(tcp));
  assert.ok(tcp.replies.b1 > 0 && tcp.replies.b2 > 0, `both ready endpoints reached: ${JSON.stringify(tcp)}`);
  assert.equal(tcp.replies.b3, undefined, 'the not-ready endpoint gets nothing');
  const udp = client('udp', 53, 20);
  assert.ok(udp.replies.b1 > 0 && udp.replies.b2 > 0, `UDP reaches both: ${JSON.stringify(udp)}`);

  writeFileSync(join(dir, 'svc.yaml'), manifests(true));
  const t0 = Date.now();
  await waitFor('the added endpoint gets traffic', () => (client('tcp', 80, 6).replies.b3 ?? 0) > 0, 5_000, 100);
  assert.ok(Date.now() - t0 < 5_000);

  const rules = ns.exec('curl', ['-sf', '127.0.0.1:10249/debug/rules']);
  assert.match(rules, /127\.0\.100\.1/);

  const status = ns.exec(process.execPath, ['bin/kproxy.js', 'status']);
  assert.match(status, /health: +healthy \(\/healthz 200, \/livez 200\)/);
  assert.match(status, /mode: +userspace/);
  assert.match(status, /recent syncs:\n +\S+ (full|partial)/);
  const metrics = ns.exec('curl', ['-sf', '127.0.0.1:10249/metrics']);
  assert.match(metrics, /kubeproxy_sync_proxy_rules_last_timestamp_seconds\{ip_family="IPv4"\} \d/);
  assert.match(metrics, /kproxy_userspace_connections_accepted_total\{service_port="t\/web:http",protocol="TCP"\} \d+/);
});

test('the standalone demo spreads requests over its three loopback backends', async () => {
  const demoNs = Netns.create(uniqueName('kpt-cli-demo'));
  let out = '';
  try {
    out = demoNs.exec(process.execPath, ['bin/kproxy.js', 'demo', '--requests', '9']);
  } finally {
    await demoNs.destroy();
  }
  const counts = [...out.matchAll(/^\s*(\d+)\s+hello from (backend-\d)/gm)].map((m) => [m[2], Number(m[1])]);
  assert.deepEqual(counts, [['backend-1', 3], ['backend-2', 3], ['backend-3', 3]], out);
});
