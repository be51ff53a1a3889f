// Never-DNATed TCP attempts (kproxy, not upstream), on the real kernel, in namespaces this test
// creates:
//   client ns (203.0.113.2) ── veth ── node ns (kproxy) ── veth ── pod ns (10.180.0.1)
//                                      │ ── veth ── "uplink" ns (default route; forwards nothing)
// A TCP connection attempt to a Service address made while the address had no rule (before
// kproxy's first sync, or before the Service existed) is routed on to the uplink and lost;
// conntrack keeps its SYN_SENT entry, never DNATed, for 120 s, and does not refresh it on a new
// SYN. A client that later connects from the same source port (the kernel reuses ports; a SYN
// retransmitted after the rules arrived is the same case) matches that entry, skips NAT and is
// lost again, until the entry expires. kproxy clears such entries once the port has endpoints
// (src/core/nodeview.ts `unNATed`, src/kernel/conntrack.ts): here the same source port reaches
// the pod at once, and an attempt to an address that is no Service keeps its entry.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Netns, uniqueName, vethPair, waitFor, repoRoot } from '../support/netns.ts';

const POD = '10.180.0.1';
const NOT_A_SERVICE = '172.30.0.99';

const service = (name: string, ip: string) => `apiVersion: v1
kind: Service
metadata: {name: ${name}, namespace: t}
spec:
  clusterIP: ${ip}
  ports:
  - {name: http, port: 80, protocol: TCP, targetPort: 8080}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: ${name}-1
  namespace: t
  labels: {kubernetes.io/service-name: ${name}}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [${POD}]
  nodeName: other-node
`;

const tag = uniqueName('kpt-cttcp');
const node = new Netns(`${tag}-n`);
const pods = new Netns(`${tag}-p`);
const client = new Netns(`${tag}-c`);
const sink = new Netns(`${tag}-u`);
const namespaces = [node, pods, client, sink];
const dir = mkdtempSync(join(tmpdir(), 'kp-cttcp-'));
const manifestDir = join(dir, 'manifests');

function writeManifest(name: string, text: string): void {
  // atomic replace: the watcher never reads half a file
  writeFileSync(join(dir, `${name}.tmp`), text);
  renameSync(join(dir, `${name}.tmp`), join(manifestDir, `${name}.yaml`));
}

/** One bounded TCP connection from the client namespace, from a fixed source port: the reply, or the error. */
function connectFrom(srcPort: number, ip: string, timeoutS: number): Promise<string> {
  return new Promise((resolve) => {
    const p = spawn('ip', ['netns', 'exec', client.name, 'socat', `-T${timeoutS}`, '-',
      `TCP:${ip}:80,sourceport=${srcPort},reuseaddr,connect-timeout=${timeoutS}`], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout.on('data', (d: Buffer) => (out += d));
    p.stderr.on('data', (d: Buffer) => (err += d));
    const t = setTimeout(() => p.kill('SIGKILL'), (timeoutS + 5) * 1000);
    p.on('close', (code) => {
      clearTimeout(t);
      resolve(code === 0 && out.trim() ? out.trim() : `error: ${/timed out/i.test(err) ? 'ETIMEDOUT' : err.trim().split('\n').at(-1) ?? code}`);
    });
  });
}

/** The node's conntrack entries of the client's attempts from `srcPort` (one line each). */
function entriesFrom(srcPort: number): string[] {
  return node.exec('conntrack', ['-L', '-p', 'tcp', '--orig-port-src', String(srcPort)], { allowFail: true })
    .split('\n').filter((l) => l.startsWith('tcp'));
}

const unNATed = (ip: string, srcPort: number) => (l: string) =>
  l.includes('SYN_SENT') && l.includes(`dst=${ip} sport=${srcPort} dport=80 [UNREPLIED] src=${ip} `);

before(async () => {
  for (const ns of namespaces) Netns.create(ns.name);
  vethPair(node, 'to-pods', '10.180.0.254/16', pods, 'eth0', `${POD}/16`);
  pods.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  vethPair(node, 'to-client', '203.0.113.1/24', client, 'eth0', '203.0.113.2/24');
  client.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.1']);
  node.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  // the node's uplink, to a namespace that forwards nothing: a packet to an address without a
  // rule is routed on and lost there, as on a real node (so conntrack confirms its entry)
  vethPair(node, 'uplink', '192.168.0.2/24', sink, 'eth0', '192.168.0.1/24');
  node.exec('ip', ['route', 'add', 'default', 'via', '192.168.0.1']);
  // another program's rule that uses conntrack: the node tracks connections before kproxy runs
  node.exec('iptables', ['-A', 'FORWARD', '-m', 'conntrack', '--ctstate', 'INVALID', '-j', 'DROP']);
  let out = '';
  pods.node('test/support/backend-main.ts', ['pod-1', `tcp:${POD}:8080`], (d) => (out += d));
  await waitFor('backend', () => out.includes('READY'), 20_000, 50);
});

after(async () => {
  node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup'], { allowFail: true });
  for (const ns of namespaces) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

async function startKproxy(mode: string): Promise<{ proc: ChildProcess; log: () => string; syncs: () => number }> {
  let log = '';
  const proc = node.kproxy(
    ['run', '--mode', mode, '--manifests', manifestDir, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
    (s) => (log += s),
  );
  await waitFor(`kproxy ${mode} healthy`, () => node.exec('curl', ['-sf', '127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 30_000, 200)
    .catch((e) => assert.fail(`${e.message}\n${log}`));
  return { proc, log: () => log, syncs: () => (log.match(/"msg":"synced"/g) ?? []).length };
}

for (const [i, mode] of ['iptables', 'nftables'].entries()) {
  test(`${mode}: a client reusing the source port of an attempt made before the rules reaches the Service (first sync, and a Service added later)`, async () => {
    const web = `172.30.${1 + i}.10`;
    const web2 = `172.30.${1 + i}.11`;
    const [p1, p2, pOther] = [40080 + i * 10, 40082 + i * 10, 40084 + i * 10];
    node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), 'cleanup'], { allowFail: true });
    node.exec('conntrack', ['-F'], { allowFail: true });
    rmSync(manifestDir, { recursive: true, force: true });
    mkdirSync(manifestDir, { recursive: true });

    // 1. before kproxy runs: attempts to the Service address and to an address that is no Service
    assert.match(await connectFrom(p1, web, 0.5), /ETIMEDOUT/);
    assert.match(await connectFrom(pOther, NOT_A_SERVICE, 0.5), /ETIMEDOUT/);
    assert.ok(entriesFrom(p1).some(unNATed(web, p1)), `precondition: a never-DNATed SYN_SENT entry:\n${entriesFrom(p1).join('\n')}`);

    writeManifest('web', service('web', web));
    const k = await startKproxy(mode);
    try {
      await waitFor('the first sync', () => k.syncs() >= 1, 20_000, 50).catch((e) => assert.fail(`${e.message}\n${k.log()}`));
      // the same source port now reaches the pod (without the cleanup: silence for up to 120 s)
      assert.equal(await connectFrom(p1, web, 5), 'pod-1', `same source port after the first sync:\n${entriesFrom(p1).join('\n')}\n${k.log().slice(-3000)}`);
      assert.ok(entriesFrom(pOther).some(unNATed(NOT_A_SERVICE, pOther)), `an attempt to an address that is no Service keeps its entry:\n${entriesFrom(pOther).join('\n')}`);

      // 2. kproxy running: an attempt to a Service that does not exist yet, then the Service
      assert.match(await connectFrom(p2, web2, 0.5), /ETIMEDOUT/);
      assert.ok(entriesFrom(p2).some(unNATed(web2, p2)), `precondition: a never-DNATed SYN_SENT entry:\n${entriesFrom(p2).join('\n')}`);
      const before = k.syncs();
      writeManifest('web2', service('web2', web2));
      await waitFor('kproxy synced the new Service', () => k.syncs() > before, 20_000, 50).catch((e) => assert.fail(`${e.message}\n${k.log()}`));
      assert.equal(await connectFrom(p2, web2, 5), 'pod-1', `same source port after the Service came:\n${entriesFrom(p2).join('\n')}\n${k.log().slice(-3000)}`);

      const metrics = node.exec('curl', ['-sf', '127.0.0.1:10249/metrics']);
      const deleted = /^kubeproxy_conntrack_reconciler_deleted_entries_total\{ip_family="IPv4"\} (\d+)/m.exec(metrics);
      assert.ok(deleted && Number(deleted[1]) >= 2, `both deletions counted:\n${metrics.split('\n').filter((l) => l.includes('conntrack')).join('\n')}`);
    } finally {
      await node.kill(k.proc);
    }
  });
}
