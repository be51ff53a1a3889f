// Out of file descriptors never crashes kproxy: `kproxy run --mode userspace` under
// `prlimit --nofile=160` in a fresh namespace, with the connection cap set far above what
// the fds allow, so the fd limit is what stops it. Connections beyond the limit fail, kproxy
// lives, a Service added meanwhile is served once fds are free (the sync ran or was retried),
// and kproxy's fds return to their baseline when the clients go.
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Netns, repoRoot, uniqueName } from '../support/netns.ts';
import { waitFor } from '../support/wait.ts';

const FD_LIMIT = 160;
const dir = mkdtempSync(join(tmpdir(), 'kp-us-fd-'));
const ns = Netns.create(uniqueName('kpt-us-fd'));
after(async () => {
  await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

function service(name: string, vip: string): string {
  return `apiVersion: v1
kind: Service
metadata: {name: ${name}, namespace: t}
spec:
  clusterIP: ${vip}
  ports: [{name: tcp, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ${name}-1, namespace: t, labels: {kubernetes.io/service-name: ${name}}}
addressType: IPv4
ports: [{name: tcp, port: 8080, protocol: TCP}]
endpoints: [{addresses: [127.0.1.1]}]
`;
}

function fds(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

function helper(args: string[], onOutput?: (s: string) => void): ChildProcess {
  return ns.spawn(process.execPath, ['--import', 'tsx', resolve(repoRoot, 'test/userspace/hold-main.ts'), ...args], { onOutput });
}

function firstLine(p: ChildProcess, timeoutMs: number): Promise<string> {
  return new Promise((resolvePromise, reject) => {
    let out = '';
    const t = setTimeout(() => reject(new Error(`no output within ${timeoutMs}ms: ${out}`)), timeoutMs);
    p.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes('\n')) {
        clearTimeout(t);
        resolvePromise(out.split('\n')[0]);
      }
    });
  });
}

function reach(vip: string): string {
  return ns.exec('bash', ['-c', `exec 3<>/dev/tcp/${vip}/80 && timeout 3 head -n1 <&3`], { allowFail: true }).trim();
}

test('out of fds: connections beyond the limit fail, kproxy lives, syncs go on, fds return to baseline', async (t) => {
  const backend = helper(['serve', '127.0.1.1', '8080', 'b1']);
  assert.equal(await firstLine(backend, 20_000), 'ready');
  writeFileSync(join(dir, 'a.yaml'), service('a', '127.0.100.1'));
  let log = '';
  const kproxy = ns.spawn('prlimit', [`--nofile=${FD_LIMIT}:${FD_LIMIT}`, process.execPath, resolve(repoRoot, 'bin/kproxy.js'), 'run', '--mode', 'userspace',
    '--manifests', dir, '--hostname-override', 'node-a', '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249',
    '--userspace-max-connections', '100000'], { env: { KPROXY_USERSPACE_REDIRECT: '0' }, onOutput: (s) => (log += s) });
  const pid = kproxy.pid!;
  await waitFor('kproxy serves service a', () => reach('127.0.100.1') === 'b1', 30_000, 200).catch((e) => assert.fail(`${e.message}\n${log}`));
  // Baseline once idle (the probe's connection closed).
  await new Promise((r) => setTimeout(r, 500));
  const baseline = fds(pid);
  assert.ok(baseline < FD_LIMIT - 20, `baseline ${baseline} leaves room under the limit`);

  const clients = helper(['hold', '127.0.100.1', '80', String(FD_LIMIT)]);
  const held = JSON.parse(await firstLine(clients, 120_000)) as { ok: number; failed: number };
  t.diagnostic(`baseline ${baseline} fds, held ${JSON.stringify(held)}`);
  assert.ok(held.ok > 0, `some connections were served: ${JSON.stringify(held)}`);
  assert.ok(held.failed > 0, `the connections beyond the fd limit failed: ${JSON.stringify(held)}`);
  assert.ok(held.ok <= (FD_LIMIT - baseline) / 2 + 1, `no more than the fds allow: ${JSON.stringify(held)} (baseline ${baseline})`);
  assert.equal(kproxy.exitCode, null, `kproxy lives\n${log}`);

  // A Service added while out of fds: its listener cannot open yet; the sync fails and is retried.
  writeFileSync(join(dir, 'b.yaml'), service('b', '127.0.100.2'));
  await new Promise((r) => setTimeout(r, 2000));
  assert.equal(kproxy.exitCode, null, `kproxy still lives after a sync while out of fds\n${log}`);

  await ns.kill(clients, 'SIGKILL');
  await waitFor('kproxy fds back to baseline', () => fds(pid) <= baseline + 1, 30_000, 200)
    .catch((e) => assert.fail(`${e.message}: ${fds(pid)} vs ${baseline}\n${log}`));
  await waitFor('service b served once fds are free', () => reach('127.0.100.2') === 'b1', 60_000, 300)
    .catch((e) => assert.fail(`${e.message}\n${log}`));
  assert.equal(reach('127.0.100.1'), 'b1');
  assert.equal(kproxy.exitCode, null);
  await waitFor('fds settle at baseline (+1 listener)', () => fds(pid) <= baseline + 3, 10_000, 200);
});
