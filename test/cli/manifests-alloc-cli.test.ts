// `kproxy run --mode userspace --manifests DIR` over manifests as projects publish them
// (Services without spec.clusterIP, among other kinds): Services get cluster IPs from
// --service-cluster-ip-range (here on loopback, so no root is needed), traffic reaches the
// backend through the allocated address, and a restart keeps every allocation: the state file
// is reused, and a Service added meanwhile that asks for a held address is refused (status,
// /debug/state and kproxy_invalid_objects_total say so). As root it runs in a network
// namespace of its own (the userspace mode then installs iptables redirects there).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync, readFileSync, existsSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Netns, repoRoot, sh, uniqueName, waitFor } from '../support/netns.ts';

const root = process.getuid?.() === 0;
const ns = root ? Netns.create(uniqueName('kpt-alloc-cli')) : null;
const dir = mkdtempSync(join(tmpdir(), 'kp-alloc-cli-'));
const stateDir = mkdtempSync(join(tmpdir(), 'kp-alloc-cli-state-'));
const state = join(stateDir, 'allocations.json');
const local: ChildProcess[] = [];

after(async () => {
  for (const p of local) {
    try {
      process.kill(-p.pid!, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
  await ns?.destroy();
  rmSync(dir, { recursive: true, force: true });
  rmSync(stateDir, { recursive: true, force: true });
});

/** Runs a command to completion, in the namespace when there is one. */
function exec(cmd: string, args: string[], allowFail = false): string {
  return ns ? ns.exec(cmd, args, { allowFail }) : sh(cmd, args, { allowFail });
}

/** Starts a long-running process, in the namespace when there is one. */
function start(cmd: string, args: string[], onOutput: (s: string) => void): ChildProcess {
  if (ns) return ns.spawn(cmd, args, { onOutput });
  const p = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true, cwd: repoRoot });
  p.stdout!.on('data', (d: Buffer) => onOutput(d.toString()));
  p.stderr!.on('data', (d: Buffer) => onOutput(d.toString()));
  local.push(p);
  return p;
}

async function stop(p: ChildProcess): Promise<void> {
  if (p.exitCode !== null || p.signalCode !== null) return;
  const done = new Promise<void>((r) => p.once('exit', () => r()));
  process.kill(-p.pid!, 'SIGTERM');
  const t = setTimeout(() => {
    try {
      process.kill(-p.pid!, 'SIGKILL');
    } catch {
      /* gone */
    }
  }, 10_000);
  await done;
  clearTimeout(t);
}

/** A free loopback port (in a fresh namespace any port is free: the defaults). */
async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', () => r()));
  const port = (s.address() as { port: number }).port;
  await new Promise((r) => s.close(r));
  return port;
}

// a service port above 1023: without root the userspace mode listens on the address itself
const APP = `apiVersion: v1
kind: Namespace
metadata: {name: t}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: t}
spec: {replicas: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  selector: {app: web}
  ports: [{name: http, port: 18080, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: other, namespace: t}
spec:
  ports: [{name: http, port: 18080, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: t, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [127.0.1.1]}]
`;

interface Allocations {
  allocated: Array<{ service: string; clusterIPs?: string[] }>;
  refused: Array<{ service: string; field: string; reason: string }>;
}

test('kproxy run allocates loopback cluster IPs, serves them, and keeps them across a restart; a Service asking for a held address is refused', { timeout: 240_000 }, async () => {
  const healthz = ns ? 10256 : await freePort();
  const metrics = ns ? 10249 : await freePort();
  writeFileSync(join(dir, 'app.yaml'), APP);
  const backend = start(process.execPath, ['--import', 'tsx', join(repoRoot, 'test/support/backend-main.ts'), 'b1', 'tcp:127.0.1.1:8080'], () => {});
  await waitFor('the backend', () => new Promise<boolean>((r) => backend.stdout!.once('data', () => r(true))), 15_000);
  const args = [join(repoRoot, 'bin/kproxy.js'), 'run', '--mode', 'userspace', '--manifests', dir, '--manifests-state', state,
    '--service-cluster-ip-range', '127.0.100.0/24', '--hostname-override', 'node-a',
    '--healthz-bind-address', `127.0.0.1:${healthz}`, '--metrics-bind-address', `127.0.0.1:${metrics}`];
  const get = (path: string) => exec('curl', ['-sf', `127.0.0.1:${metrics}${path}`], true);
  const allocations = () => (JSON.parse(get('/debug/state') || '{}') as { allocations?: Allocations }).allocations;
  const webIP = (a: Allocations | undefined) => a?.allocated.find((x) => x.service === 't/web')?.clusterIPs?.[0];
  const client = (ip: string) => JSON.parse(exec(process.execPath, ['--import', 'tsx', join(repoRoot, 'test/support/client-main.ts'), 'tcp', ip, '18080', '3', '2000']).trim().split('\n').at(-1)!) as { replies: Record<string, number> };

  let log1 = '';
  const first = start(process.execPath, args, (s) => (log1 += s));
  await waitFor('kproxy healthy', () => exec('curl', ['-sf', `127.0.0.1:${healthz}/healthz`], true).includes('"nodeEligible":true'), 30_000, 200).catch((e) => assert.fail(`${e.message}\n${log1}`));
  const a1 = await waitFor('the allocations', () => (webIP(allocations()) ? allocations() : undefined), 10_000);
  const ip = webIP(a1)!;
  assert.match(ip, /^127\.0\.100\.\d+$/);
  assert.ok(!['127.0.100.0', '127.0.100.1', '127.0.100.255'].includes(ip));
  const otherIP = a1.allocated.find((x) => x.service === 't/other')?.clusterIPs?.[0];
  assert.ok(otherIP && otherIP !== ip, 'the other Service has an address of its own');
  assert.deepEqual(a1.refused, []);
  await waitFor('traffic through the allocated address', () => (client(ip).replies.b1 ?? 0) > 0, 10_000, 200).catch((e) => assert.fail(`${e.message}\n${log1}`));
  await waitFor('the state file', () => existsSync(state) && JSON.parse(readFileSync(state, 'utf8')).services?.['t/web']?.clusterIPs?.[0] === ip, 5_000);
  await stop(first);

  // while kproxy is down, a Service that sorts before web asks for web's address
  writeFileSync(join(dir, 'a-squatter.yaml'), `apiVersion: v1\nkind: Service\nmetadata: {name: aaa, namespace: t}\nspec: {clusterIP: ${ip}, ports: [{port: 18080}]}\n`);
  let log2 = '';
  const second = start(process.execPath, args, (s) => (log2 += s));
  await waitFor('kproxy healthy again', () => exec('curl', ['-sf', `127.0.0.1:${healthz}/healthz`], true).includes('"nodeEligible":true'), 30_000, 200).catch((e) => assert.fail(`${e.message}\n${log2}`));
  await waitFor('the state file reused', () => log2.includes('"msg":"manifests state file read"'), 15_000, 100).catch((e) => assert.fail(`${e.message}\n${log2}`));
  const a2 = await waitFor('the allocations', () => (webIP(allocations()) ? allocations() : undefined), 10_000);
  assert.equal(webIP(a2), ip, 'web keeps its address');
  assert.equal(a2.allocated.find((x) => x.service === 't/other')?.clusterIPs?.[0], otherIP, 'and other keeps its own');
  assert.deepEqual(a2.refused.map((r) => [r.service, r.field]), [['t/aaa', 'spec.clusterIPs']]);
  assert.match(a2.refused[0].reason, /provided IP is already allocated \(held by Service t\/web\)/);
  await waitFor('traffic through the kept address', () => (client(ip).replies.b1 ?? 0) > 0, 10_000, 200).catch((e) => assert.fail(`${e.message}\n${log2}`));

  const status = exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'status', '--healthz-address', `127.0.0.1:${healthz}`, '--metrics-address', `127.0.0.1:${metrics}`]);
  assert.match(status, /allocations: +2 Service\(s\) got values from 127\.0\.100\.0\/24, node ports 30000-32767; 1 refused/);
  assert.match(status, new RegExp(`^  t/web: clusterIPs ${ip.replace(/\./g, '\\.')}$`, 'm'));
  assert.match(status, /^  REFUSED t\/aaa: spec\.clusterIPs: failed to allocate IP .*: provided IP is already allocated/m);
  assert.match(get('/metrics'), /^kproxy_invalid_objects_total\{kind="Service",source="manifests"\} 1$/m);
  // the line reaches this process through a pipe, whenever its event loop reads it
  await waitFor('the refusal logged', () => /KPROXY_SERVICE_ALLOCATION: Service t\/aaa refused: spec\.clusterIPs/.test(log2), 15_000, 100).catch((e) => assert.fail(`${e.message}\n${log2}`));
  await stop(second);
  assert.equal(JSON.parse(readFileSync(state, 'utf8')).services['t/web'].clusterIPs[0], ip);
});
