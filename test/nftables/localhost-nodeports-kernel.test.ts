// Localhost NodePorts in the nftables mode (KEP-6032) through the CLI, on the real kernel, in
// namespaces this test creates: a node (192.168.0.2 on a veth link) runs
// `kproxy run --mode nftables --nodeport-addresses=primary,localhost` on a manifests
// directory; the Service's endpoint is a backend in a pod namespace (10.180.0.1, veth). From
// the node, 127.0.0.1:<nodePort> reaches the Service (as `curl 127.0.0.1:<nodePort>`); with
// externalTrafficPolicy Local and only a remote endpoint nothing listens there; a node-local
// endpoint brings it back; the listener goes when the Service goes; the gauge on /metrics
// follows. Without `localhost` in the addresses, or with the gate false, nothing listens on loopback.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Netns, uniqueName, vethPair, waitFor } from '../support/netns.ts';
import { startBackendsInNetns, type NetnsBackends } from '../support/backends.ts';

const NODE_IP = '192.168.0.2';
const NODE_PORT = 30080;
const POD_IP = '10.180.0.1';
const GAUGE = 'kubeproxy_nftables_localhost_nodeport_listeners';

function manifests(o: { service: boolean; local?: boolean; endpointNode?: string }): string {
  const svc = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: 172.30.0.10
  type: NodePort
  externalTrafficPolicy: ${o.local ? 'Local' : 'Cluster'}
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: ${NODE_PORT}}
---
`;
  return `${o.service ? svc : ''}apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-1
  namespace: t
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [${POD_IP}]
  conditions: {ready: true}
  nodeName: ${o.endpointNode ?? 'node-b'}
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: ${NODE_IP}}]
`;
}

const tag = uniqueName('kpt-lnp');
const node = new Netns(`${tag}-n`);
const pod = new Netns(`${tag}-p`);
/** the node's neighbour on its primary network (the node IP needs a link that is up) */
const peer = new Netns(`${tag}-c`);
const dir = mkdtempSync(join(tmpdir(), 'kp-lnp-'));
const stateDir = mkdtempSync(join(tmpdir(), 'kp-lnp-state-'));
let backends: NetnsBackends | null = null;

before(async () => {
  Netns.create(node.name);
  Netns.create(pod.name);
  Netns.create(peer.name);
  vethPair(node, 'eth0', `${NODE_IP}/24`, peer, 'eth0', '192.168.0.3/24');
  vethPair(node, 'pod0', '10.180.0.254/24', pod, 'eth0', `${POD_IP}/24`);
  pod.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  backends = await startBackendsInNetns(pod.name, [{ proto: 'tcp', host: POD_IP, port: 8080, id: 'pod-web' }]);
});

after(async () => {
  await backends?.close();
  await node.destroy();
  await pod.destroy();
  await peer.destroy();
  rmSync(dir, { recursive: true, force: true });
  rmSync(stateDir, { recursive: true, force: true });
});

/** What the node gets from ip:port: the backend's answer, 'refused', or the error (socat: connect, half-close, read). */
function connectFrom(ns: Netns, ip: string, port: number): string {
  try {
    return ns.exec('socat', ['-T', '3', '-t', '3', '-', `TCP:${ip}:${port},connect-timeout=3`], { input: '' }).split('\n')[0].trim();
  } catch (e) {
    const msg = (e as Error).message;
    return /Connection refused/i.test(msg) ? 'refused' : `error: ${msg.slice(0, 300)}`;
  }
}

/** Waits until ip:port answers `want`, saying what it answered last when it does not. */
async function until(what: string, ip: string, port: number, want: string, fail: (e: Error) => never, timeoutMs = 30_000): Promise<void> {
  let last = '';
  await waitFor(what, () => (last = connectFrom(node, ip, port)) === want, timeoutMs, 200).catch((e: Error) => fail(new Error(`${e.message} (last answer: ${last})`)));
}

/** The gauge's IPv4 value on the node's /metrics, or null when the line is missing. */
function gauge(): number | null {
  const text = node.exec('curl', ['-sS', '--max-time', '3', 'http://127.0.0.1:10249/metrics'], { allowFail: true });
  const m = new RegExp(`^${GAUGE}\\{ip_family="IPv4"\\} (\\d+)$`, 'm').exec(text);
  return m ? Number(m[1]) : null;
}

function start(extra: string[], log: { text: string }) {
  return node.kproxy(
    ['run', '--mode', 'nftables', '--manifests', dir, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8',
      '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249',
      // the manifests source's allocations in this test's own file, never the host's /var/lib/kproxy
      '--manifests-state', join(stateDir, 'state.json'), ...extra],
    (s) => (log.text = (log.text + s).slice(-20_000)),
  );
}

test('nftables --nodeport-addresses=primary,localhost: 127.0.0.1:<nodePort> reaches the Service through the userspace listener', async () => {
  writeFileSync(join(dir, 'web.yaml'), manifests({ service: true }));
  const log = { text: '' };
  const proc = start(['--nodeport-addresses=primary,localhost'], log);
  const fail = (e: Error): never => assert.fail(`${e.message}\n${log.text.slice(-4000)}`);
  try {
    await until('127.0.0.1:30080 answers from the pod', '127.0.0.1', NODE_PORT, 'pod-web', fail, 30_000);
    // the ruleset runs beside it: the node IP reaches the pod through nftables
    await until('192.168.0.2:30080 answers from the pod', NODE_IP, NODE_PORT, 'pod-web', fail, 15_000);
    await waitFor('the gauge counts one listener', () => gauge() === 1, 15_000, 200).catch(fail);
    // the listener is kproxy's own socket on loopback only
    const ss = node.exec('ss', ['-Htln', `sport = :${NODE_PORT}`]);
    assert.match(ss, /127\.0\.0\.1:30080/);
    assert.ok(!/(0\.0\.0\.0|\*|192\.168\.0\.2):30080/.test(ss), ss);

    // eTP Local with only a remote endpoint: no listener (upstream: no fallback to remote endpoints)
    writeFileSync(join(dir, 'web.yaml'), manifests({ service: true, local: true, endpointNode: 'node-b' }));
    await until('127.0.0.1:30080 refused with eTP Local and no local endpoint', '127.0.0.1', NODE_PORT, 'refused', fail, 30_000);
    await waitFor('the gauge drops to 0', () => gauge() === 0, 15_000, 200).catch(fail);

    // the endpoint on this node: served again
    writeFileSync(join(dir, 'web.yaml'), manifests({ service: true, local: true, endpointNode: 'node-a' }));
    await until('127.0.0.1:30080 answers with a local endpoint', '127.0.0.1', NODE_PORT, 'pod-web', fail, 30_000);

    // the Service goes: so does the listener
    writeFileSync(join(dir, 'web.yaml'), manifests({ service: false }));
    await until('127.0.0.1:30080 refused once the Service is deleted', '127.0.0.1', NODE_PORT, 'refused', fail, 30_000);
    await waitFor('the gauge is 0 again', () => gauge() === 0, 15_000, 200).catch(fail);
  } finally {
    await node.kill(proc);
  }
});

const offCases: Array<[string, string[]]> = [
  ['the default addresses (primary)', []],
  ['primary,localhost and KubeProxyNFTablesLocalhostNodePorts=false', ['--nodeport-addresses=primary,localhost', '--feature-gates=KubeProxyNFTablesLocalhostNodePorts=false']],
];
for (const [why, flags] of offCases) {
  test(`nftables with ${why}: nothing listens on 127.0.0.1:<nodePort>, the node IP still works`, async () => {
    writeFileSync(join(dir, 'web.yaml'), manifests({ service: true }));
    const log = { text: '' };
    const proc = start(flags, log);
    const fail = (e: Error): never => assert.fail(`${e.message}\n${log.text.slice(-4000)}`);
    try {
      await until('192.168.0.2:30080 answers from the pod', NODE_IP, NODE_PORT, 'pod-web', fail, 30_000);
      assert.equal(connectFrom(node, '127.0.0.1', NODE_PORT), 'refused');
      await waitFor('the gauge reads 0', () => gauge() === 0, 15_000, 200).catch(fail);
    } finally {
      await node.kill(proc);
    }
  });
}

// ---- both families: 127.0.0.1 and ::1 ---------------------------------------------------------

const DUAL = `apiVersion: v1
kind: Service
metadata: {name: web6, namespace: t}
spec:
  type: NodePort
  clusterIP: 172.30.0.20
  clusterIPs: [172.30.0.20, "fd00:172:30::20"]
  ipFamilies: [IPv4, IPv6]
  ipFamilyPolicy: RequireDualStack
  ports:
  - {name: http, port: 80, protocol: TCP, nodePort: 30081}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web6-v4, namespace: t, labels: {kubernetes.io/service-name: web6}}
addressType: IPv4
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: [10.180.0.1]
  nodeName: node-b
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web6-v6, namespace: t, labels: {kubernetes.io/service-name: web6}}
addressType: IPv6
ports:
- {name: http, port: 8080, protocol: TCP}
endpoints:
- addresses: ["fd00:10:180::1"]
  nodeName: node-b
---
apiVersion: v1
kind: Node
metadata: {name: node-a}
status:
  addresses: [{type: InternalIP, address: 10.180.0.254}, {type: InternalIP, address: "fd00:10:180::fe"}]
`;

test('dual-stack nftables --nodeport-addresses=primary,localhost: 127.0.0.1 and ::1 each reach their family\'s endpoint', async (t) => {
  const tag6 = uniqueName('kpt-lnp6');
  const n6 = new Netns(`${tag6}-n`);
  const p6 = new Netns(`${tag6}-p`);
  const dir6 = mkdtempSync(join(tmpdir(), 'kp-lnp6-'));
  t.after(async () => {
    await n6.destroy();
    await p6.destroy();
    rmSync(dir6, { recursive: true, force: true });
  });
  for (const ns of [n6, p6]) {
    Netns.create(ns.name);
    ns.exec('sysctl', ['-qw', 'net.ipv6.conf.all.disable_ipv6=0']);
    ns.exec('sysctl', ['-qw', 'net.ipv6.conf.default.disable_ipv6=0']);
  }
  vethPair(n6, 'pod0', '10.180.0.254/24', p6, 'eth0', '10.180.0.1/24');
  n6.exec('ip', ['-6', 'addr', 'add', 'fd00:10:180::fe/64', 'dev', 'pod0', 'nodad']);
  p6.exec('ip', ['-6', 'addr', 'add', 'fd00:10:180::1/64', 'dev', 'eth0', 'nodad']);
  // one backend per family, each answering its own name
  for (const [id, spec] of [['pod-v4', 'tcp:10.180.0.1:8080'], ['pod-v6', 'tcp:fd00:10:180::1:8080']]) {
    let out = '';
    p6.node('test/support/backend-main.ts', [id, spec], (d) => (out += d));
    await waitFor(`backend ${id}`, () => out.includes('READY'), 20_000, 50);
  }
  writeFileSync(join(dir6, 'web6.yaml'), DUAL);
  let log = '';
  n6.kproxy(['run', '--mode', 'nftables', '--manifests', dir6, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8,fd00:10::/32',
    '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249', '--nodeport-addresses=primary,localhost',
    '--manifests-state', join(dir6, '..', `${tag6}-state.json`)], (s) => (log = (log + s).slice(-20_000)));
  t.after(() => rmSync(join(dir6, '..', `${tag6}-state.json`), { force: true }));
  const fail = (e: Error): never => assert.fail(`${e.message}\n${log.slice(-4000)}`);
  const via = (addr: string) => {
    try {
      return n6.exec('socat', ['-T', '3', '-t', '3', '-', `${addr},connect-timeout=3`], { input: '' }).split('\n')[0].trim();
    } catch (e) {
      return `error: ${(e as Error).message.slice(0, 200)}`;
    }
  };
  // each family's listener dials its own family's endpoint
  await waitFor('127.0.0.1:30081 answers from the IPv4 endpoint', () => via('TCP4:127.0.0.1:30081') === 'pod-v4', 30_000, 200).catch(fail);
  await waitFor('[::1]:30081 answers from the IPv6 endpoint', () => via('TCP6:[::1]:30081') === 'pod-v6', 30_000, 200).catch(fail);
  const ss = n6.exec('ss', ['-Htln', 'sport = :30081']);
  assert.match(ss, /127\.0\.0\.1:30081/);
  assert.match(ss, /\[::1\]:30081/);
  const metrics = await waitFor('both gauges at 1', () => {
    const text = n6.exec('curl', ['-sS', '--max-time', '3', 'http://127.0.0.1:10249/metrics'], { allowFail: true });
    return /^kubeproxy_nftables_localhost_nodeport_listeners\{ip_family="IPv6"\} 1$/m.test(text) && /^kubeproxy_nftables_localhost_nodeport_listeners\{ip_family="IPv4"\} 1$/m.test(text) && text;
  }, 15_000, 200).catch(fail);
  assert.ok(metrics);
});
