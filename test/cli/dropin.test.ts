// kproxy as a drop-in kube-proxy, on the real kernel, in namespaces this
// test creates, in ONE run of kproxy started as upstream's DaemonSet starts kube-proxy:
//
//   client ns (203.0.113.2) ── veth ── node ns (203.0.113.1, 10.180.0.254) ── veth ── pod ns (10.180.0.1, .2)
//                                      │ kproxy --config=config.conf --hostname-override=node-a
//                                      │ test API server (HTTPS + token) on 127.0.0.1:6443
//
// config.conf is a kubeadm-generated KubeProxyConfiguration (every field kubeadm writes, its
// zero values included) whose clientConnection.kubeconfig is a kubeadm-style kubeconfig.conf
// (certificate-authority and tokenFile paths, as the service account mounts them). Checked:
// - Services are served: TCP from the client namespace through a ClusterIP and a NodePort
//   reaches the pods;
// - health check node ports answer 200 (local ready endpoint) and 503 (none) with upstream's body;
// - /metrics has upstream's metric names;
// - the conntrack sysctls the file sets (those a network namespace has) and
//   /proc/PID/oom_score_adj are set as the file says;
// - a UDP client pinned by conntrack to an endpoint that is then removed (through the API
//   server) reaches the new endpoint within 5 s, from the same source port;
// - `kproxy --cleanup` leaves another program's KUBE-KUBELET-CANARY and KUBE-ROUTER-INPUT in
//   place and removes all of kproxy's own.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Netns, repoRoot, sh, uniqueName, vethPair, waitFor } from '../support/netns.ts';
import { ApiServerChild } from '../support/apiserver-child.ts';
import type { KObject } from '../support/apiserver.ts';

/** The argv before upstream's flags. */
const KPROXY_ARGS: string[] = []; // upstream's bare command line, as the DaemonSet starts it
/** upstream's `kube-proxy --cleanup` */
const CLEANUP_ARGS: string[] = [...KPROXY_ARGS, '--cleanup'];
/** upstream's metric names (pkg/proxy/metrics) that /metrics must carry (`# TYPE name ...`). */
const UPSTREAM_METRICS: string[] = [
  'kubeproxy_sync_proxy_rules_duration_seconds',
  'kubeproxy_sync_proxy_rules_last_timestamp_seconds',
  'kubeproxy_proxy_healthz_total',
  'kubeproxy_proxy_livez_total',
  'kubeproxy_conntrack_reconciler_deleted_entries_total',
  'kubeproxy_network_programming_duration_seconds',
  'kubeproxy_sync_full_proxy_rules_duration_seconds',
  'kubeproxy_sync_partial_proxy_rules_duration_seconds',
  'kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds',
  'kubeproxy_sync_proxy_rules_iptables_total',
  'kubeproxy_sync_proxy_rules_endpoint_changes_pending',
  'kubeproxy_sync_proxy_rules_endpoint_changes_total',
  'kubeproxy_sync_proxy_rules_service_changes_pending',
  'kubeproxy_sync_proxy_rules_service_changes_total',
  'kubeproxy_sync_proxy_rules_no_local_endpoints_total',
  'kubeproxy_sync_proxy_rules_iptables_restore_failures_total',
  'kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total',
];

const NS = 't';
const NODE_IP = '203.0.113.1';
const WEB_IP = '172.30.0.10';
const DNS_IP = '172.30.0.53';
const POD1 = '10.180.0.1';
const POD2 = '10.180.0.2';
const SRC_PORT = 40053;
const HC_LOCAL = 32000;
const HC_REMOTE = 32001;
const TOKEN = 'kpt-dropin-token';
/** what the file sets, per sysctl (all per network namespace; nf_conntrack_max is not: maxPerCore 0 leaves it) */
const CONNTRACK_SYSCTLS: Record<string, string> = {
  'net.netfilter.nf_conntrack_tcp_timeout_established': '82800',
  'net.netfilter.nf_conntrack_tcp_timeout_close_wait': '3540',
  'net.netfilter.nf_conntrack_tcp_be_liberal': '1',
  'net.netfilter.nf_conntrack_udp_timeout': '47',
  'net.netfilter.nf_conntrack_udp_timeout_stream': '119',
};
const OOM_SCORE_ADJ = 321; // raised, not lowered: lowering needs CAP_SYS_RESOURCE

/** kubeadm's KubeProxyConfiguration (`kubeadm config print init-defaults --component-configs KubeProxyConfiguration`), edited as a cluster admin would. */
function kubeadmConfig(kubeconfig: string): string {
  return `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: ${kubeconfig}
  qps: 0
clusterCIDR: 10.0.0.0/8
configSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: null
  tcpBeLiberal: true
  tcpCloseWaitTimeout: 59m0s
  tcpEstablishedTimeout: 23h0m0s
  udpStreamTimeout: 1m59s
  udpTimeout: 47s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: iptables
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: ${OOM_SCORE_ADJ}
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`;
}

/** kubeadm's kube-proxy kubeconfig.conf, with this test's server, CA file and token file. */
function kubeadmKubeconfig(server: string, caFile: string, tokenFile: string): string {
  return `apiVersion: v1
kind: Config
clusters:
- cluster:
    certificate-authority: ${caFile}
    server: ${server}
  name: default
contexts:
- context:
    cluster: default
    namespace: default
    user: default
  name: default
current-context: default
users:
- name: default
  user:
    tokenFile: ${tokenFile}
`;
}

// ---------- objects ----------

function service(name: string, spec: Record<string, unknown>, status?: Record<string, unknown>): KObject {
  return { metadata: { name, namespace: NS }, spec, ...(status ? { status } : {}) };
}

function slice(name: string, svc: string, endpoints: Array<{ ip: string; node: string }>, ports: Array<{ name: string; port: number; protocol: string }>): KObject {
  return {
    metadata: { name, namespace: NS, labels: { 'kubernetes.io/service-name': svc } },
    addressType: 'IPv4',
    endpoints: endpoints.map((e) => ({ addresses: [e.ip], conditions: { ready: true, serving: true, terminating: false }, nodeName: e.node })),
    ports,
  };
}

const HTTP = [{ name: 'http', port: 8080, protocol: 'TCP' }];
const DNS = [{ name: 'dns', port: 5353, protocol: 'UDP' }];

function lbLocal(name: string, ip: string, hcPort: number, nodePort: number): KObject {
  return service(name, {
    type: 'LoadBalancer', clusterIP: ip, clusterIPs: [ip], externalTrafficPolicy: 'Local', healthCheckNodePort: hcPort,
    ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort }],
  }, { loadBalancer: { ingress: [{ ip: '1.2.3.4' }] } });
}

const OBJECTS: Array<[string, KObject]> = [
  ['nodes', { metadata: { name: 'node-a', labels: { 'kubernetes.io/hostname': 'node-a' } }, status: { addresses: [{ type: 'InternalIP', address: NODE_IP }] } }],
  ['services', service('web', { type: 'NodePort', clusterIP: WEB_IP, clusterIPs: [WEB_IP], ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: 30080 }] })],
  ['endpointslices', slice('web-1', 'web', [{ ip: POD1, node: 'node-b' }, { ip: POD2, node: 'node-b' }], HTTP)],
  ['services', lbLocal('lb-local', '172.30.0.20', HC_LOCAL, 30081)],
  ['endpointslices', slice('lb-local-1', 'lb-local', [{ ip: POD1, node: 'node-a' }], HTTP)],
  ['services', lbLocal('lb-remote', '172.30.0.21', HC_REMOTE, 30082)],
  ['endpointslices', slice('lb-remote-1', 'lb-remote', [{ ip: POD2, node: 'node-b' }], HTTP)],
  ['services', service('dns', { type: 'ClusterIP', clusterIP: DNS_IP, clusterIPs: [DNS_IP], ports: [{ name: 'dns', protocol: 'UDP', port: 53, targetPort: 5353 }] })],
  ['endpointslices', slice('dns-1', 'dns', [{ ip: POD1, node: 'node-b' }], DNS)],
];

// ---------- namespaces, API server, kproxy ----------

const tag = uniqueName('kpt-dropin');
const node = new Netns(`${tag}-n`);
const pods = new Netns(`${tag}-p`);
const client = new Netns(`${tag}-c`);
const namespaces = [node, pods, client];
const dir = mkdtempSync(join(tmpdir(), 'kpt-dropin-'));
const configFile = join(dir, 'config.conf');

let api: ApiServerChild | undefined;
let kproxy: ChildProcess | undefined;
let kproxyLog = '';
let kproxyPartial = '';
/** successful syncs kproxy logged so far */
let syncs = 0;

function onKproxyOutput(s: string): void {
  kproxyLog = (kproxyLog + s).slice(-30_000);
  kproxyPartial += s;
  for (let i = kproxyPartial.indexOf('\n'); i >= 0; i = kproxyPartial.indexOf('\n')) {
    if (kproxyPartial.slice(0, i).includes('"msg":"synced"')) syncs++;
    kproxyPartial = kproxyPartial.slice(i + 1);
  }
}

/** Last resort if the process dies without `after`: nothing is left behind. */
function cleanupSync(): void {
  api?.kill();
  for (const ns of namespaces) sh('ip', ['netns', 'del', ns.name], { allowFail: true });
  rmSync(dir, { recursive: true, force: true });
}
process.once('exit', cleanupSync);

/** Another program's chains, with a jump from INPUT: the kubelet's canaries, kube-router's input chain. */
function addForeignChains(): void {
  for (const table of ['mangle', 'nat', 'filter']) node.exec('iptables', ['-w', '5', '-t', table, '-N', 'KUBE-KUBELET-CANARY']);
  node.exec('iptables', ['-w', '5', '-N', 'KUBE-ROUTER-INPUT']);
  node.exec('iptables', ['-w', '5', '-A', 'KUBE-ROUTER-INPUT', '-p', 'tcp', '--dport', '179', '-j', 'ACCEPT']);
  node.exec('iptables', ['-w', '5', '-I', 'INPUT', '-m', 'comment', '--comment', 'kube-router netpol', '-j', 'KUBE-ROUTER-INPUT']);
}

/** the host's own values of those sysctls, which kproxy in its namespace must leave alone */
const hostSysctls: Record<string, string> = {};

before(async () => {
  for (const key of Object.keys(CONNTRACK_SYSCTLS)) hostSysctls[key] = sh('sysctl', ['-n', key], { allowFail: true }).trim();
  for (const ns of namespaces) Netns.create(ns.name);
  vethPair(node, 'to-pods', '10.180.0.254/16', pods, 'eth0', `${POD1}/16`);
  pods.exec('ip', ['addr', 'add', `${POD2}/16`, 'dev', 'eth0']);
  pods.exec('ip', ['route', 'add', 'default', 'via', '10.180.0.254']);
  vethPair(node, 'to-client', `${NODE_IP}/24`, client, 'eth0', '203.0.113.2/24');
  client.exec('ip', ['route', 'add', 'default', 'via', NODE_IP]);
  node.exec('ip', ['route', 'add', 'default', 'via', '203.0.113.2']);
  node.exec('sysctl', ['-qw', 'net.ipv4.ip_forward=1']);
  addForeignChains();
  for (const [id, ip] of [['pod-1', POD1], ['pod-2', POD2]]) {
    let out = '';
    pods.node('test/support/backend-main.ts', [id, `tcp:${ip}:8080`, `udp:${ip}:5353`], (d) => (out += d));
    await waitFor(`backend ${id}`, () => out.includes('READY'), 30_000, 50);
  }

  // The API server writes a kubeconfig with inline credentials; kubeadm's kube-proxy has
  // files instead (the service account's ca.crt and token): rewrite it in that form.
  const own = join(dir, 'apiserver-kubeconfig.json');
  api = ApiServerChild.start(node, { port: 6443, token: TOKEN, kubeconfig: own });
  await waitFor('API server ready', () => api!.ready.then(() => true), 30_000).catch((e: Error) => assert.fail(`${e.message}\n${api?.output}`));
  const kc = JSON.parse(readFileSync(own, 'utf8')) as { clusters: Array<{ cluster: { server: string; 'certificate-authority-data': string } }> };
  writeFileSync(join(dir, 'ca.crt'), Buffer.from(kc.clusters[0].cluster['certificate-authority-data'], 'base64'));
  writeFileSync(join(dir, 'token'), TOKEN);
  writeFileSync(join(dir, 'kubeconfig.conf'), kubeadmKubeconfig(kc.clusters[0].cluster.server, join(dir, 'ca.crt'), join(dir, 'token')));
  writeFileSync(configFile, kubeadmConfig(join(dir, 'kubeconfig.conf')));
  await api.apply(...OBJECTS);

  // exactly as upstream's DaemonSet: --config and --hostname-override, nothing else
  kproxy = node.kproxy([...KPROXY_ARGS, `--config=${configFile}`, '--hostname-override=node-a'], onKproxyOutput);
  await waitFor('kproxy ready on the default healthz address', () => node.exec('curl', ['-sf', '-m', '3', 'http://127.0.0.1:10256/healthz'], { allowFail: true }).includes('"nodeEligible":true'), 60_000, 200)
    .catch((e: Error) => assert.fail(`${e.message}\n${kproxyLog.slice(-5000)}`));
});

after(async () => {
  if (kproxy) await node.kill(kproxy);
  api?.kill();
  for (const ns of namespaces) await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

// ---------- helpers ----------

interface Tally {
  replies: Record<string, number>;
  errors: Record<string, number>;
}

/** A bounded batch of TCP connections from the client namespace (test/support/client-main.ts). */
function tcpBatch(ip: string, port: number, n: number): Tally {
  const out = client.exec(process.execPath, ['--import', 'tsx', join(repoRoot, 'test/support/client-main.ts'), 'tcp', ip, String(port), String(n), '2000']);
  return JSON.parse(out.trim().split('\n').at(-1)!) as Tally;
}

/** The health check node port as a load balancer probes it: {code, body}. */
function probe(port: number): { code: number; body: string } {
  const out = node.exec('curl', ['-sS', '-m', '3', '-w', '\n%{http_code}', `http://${NODE_IP}:${port}/`], { allowFail: true });
  const lines = out.split('\n');
  return { code: Number(lines.at(-1)), body: lines.slice(0, -1).join('\n') };
}

const fail = (e: Error): never => assert.fail(`${e.message}\nkproxy log:\n${kproxyLog.slice(-5000)}`);

/** kproxy's chains still in the rules (the kubelet's KUBE-FIREWALL and another program's chains are not). */
function kproxyChains(): string[] {
  return (node.exec('iptables-save', []) + node.exec('ip6tables-save', []))
    .split('\n')
    .filter((l) => /^:(KUBE-|KPROXY-)/.test(l))
    .map((l) => l.slice(1).split(' ')[0])
    .filter((c) => !['KUBE-KUBELET-CANARY', 'KUBE-ROUTER-INPUT', 'KUBE-FIREWALL'].includes(c));
}

// ---------- the must-show, in order, on one kproxy ----------

test('Services are served: the ClusterIP and the NodePort reach the pods', async (t) => {
  const tries: string[] = [];
  const cluster = await waitFor('the ClusterIP reaches both pods', () => {
    const started = Date.now();
    const r = tcpBatch(WEB_IP, 80, 20);
    tries.push(`${Date.now() - started} ms: ${JSON.stringify(r)}`);
    return Object.keys(r.errors).length === 0 && r.replies['pod-1'] && r.replies['pod-2'] ? r : false;
  }, 30_000, 200).catch((e: Error) => fail(new Error(`${e.message}; batches:\n${tries.join('\n')}`)));
  t.diagnostic(`batches until both pods answered: ${tries.join('; ')}`);
  assert.equal(cluster.replies['pod-1'] + cluster.replies['pod-2'], 20);
  const nodePort = tcpBatch(NODE_IP, 30080, 20);
  assert.deepEqual(nodePort.errors, {}, JSON.stringify(nodePort));
  assert.deepEqual(Object.keys(nodePort.replies).sort(), ['pod-1', 'pod-2'], JSON.stringify(nodePort));
});

test('health check node ports answer 200 with local ready endpoints and 503 without, with upstream\'s body', async () => {
  const ok = await waitFor('200 on the local one', () => { const r = probe(HC_LOCAL); return r.code === 200 && r; }, 20_000, 200).catch(fail);
  assert.deepEqual(JSON.parse(ok.body), { service: { namespace: NS, name: 'lb-local' }, localEndpoints: 1, serviceProxyHealthy: true });
  const none = await waitFor('503 on the remote one', () => { const r = probe(HC_REMOTE); return r.code === 503 && r; }, 20_000, 200).catch(fail);
  assert.deepEqual(JSON.parse(none.body), { service: { namespace: NS, name: 'lb-remote' }, localEndpoints: 0, serviceProxyHealthy: true });
});

test('/metrics on the default metrics address has upstream\'s metric names', () => {
  const metrics = node.exec('curl', ['-sf', '-m', '3', 'http://127.0.0.1:10249/metrics']);
  const missing = UPSTREAM_METRICS.filter((m) => !new RegExp(`^# TYPE ${m} `, 'm').test(metrics));
  assert.deepEqual(missing, [], `missing from /metrics:\n${metrics.split('\n').filter((l) => l.startsWith('# TYPE')).join('\n')}`);
});

test('the conntrack sysctls and oom_score_adj are set as the file says', () => {
  const oom = node.exec('cat', [`/proc/${kproxy!.pid}/oom_score_adj`]).trim();
  assert.equal(oom, String(OOM_SCORE_ADJ), `oom_score_adj of kproxy (pid ${kproxy!.pid})`);
  for (const [key, want] of Object.entries(CONNTRACK_SYSCTLS)) {
    assert.equal(node.exec('sysctl', ['-n', key]).trim(), want, key);
    assert.equal(sh('sysctl', ['-n', key], { allowFail: true }).trim(), hostSysctls[key], `${key} of the host is untouched`);
  }
});

test('a UDP client pinned to an endpoint removed through the API server reaches the new one within 5 s, from the same source port', async (t) => {
  node.exec('conntrack', ['-D', '-p', 'udp', '--orig-port-src', String(SRC_PORT)], { allowFail: true });
  const replies: string[] = [];
  let out = '';
  const c = client.node('test/support/udp-pinned-main.ts', [DNS_IP, '53', String(SRC_PORT), '200', '120000'], (d) => {
    out += d;
    for (let i = out.indexOf('\n'); i >= 0; i = out.indexOf('\n')) {
      const line = out.slice(0, i);
      out = out.slice(i + 1);
      if (line.startsWith('REPLY ')) replies.push(line.slice(6));
    }
  });
  try {
    await waitFor('the client pinned to pod-1', () => replies.filter((r) => r === 'pod-1').length >= 3, 20_000, 100)
      .catch((e: Error) => fail(new Error(`${e.message}; replies ${JSON.stringify(replies)}`)));
    const flows = node.exec('conntrack', ['-L', '-p', 'udp', '--orig-port-src', String(SRC_PORT)], { allowFail: true });
    assert.match(flows, new RegExp(`src=${POD1.replace(/\./g, '\\.')} `), `the flow is DNATed to pod-1:\n${flows}`);

    // pod-1 leaves the Service (it keeps running and answering), pod-2 joins
    // The 5 s run from kproxy's sync of the change: how fast the change reaches kproxy through
    // the API server (test/cli/kubernetes-e2e.test.ts measures that) is not what this checks.
    const mark = replies.length;
    const syncsBefore = syncs;
    const t0 = Date.now();
    await api!.apply(['endpointslices', slice('dns-1', 'dns', [{ ip: POD2, node: 'node-b' }], DNS)]);
    await waitFor('kproxy synced the change', () => syncs > syncsBefore, 20_000, 20).catch(fail);
    const synced = Date.now();
    await waitFor('the same socket reaches pod-2', () => replies.slice(mark).includes('pod-2'), 5_000, 50)
      .catch((e: Error) => fail(new Error(`${e.message}; replies since the change ${JSON.stringify(replies.slice(mark))}\n${node.exec('conntrack', ['-L', '-p', 'udp'], { allowFail: true })}`)));
    const reached = Date.now();
    assert.ok(reached - synced <= 5_000, `reached pod-2 ${reached - synced} ms after the sync`);
    t.diagnostic(`pod-2 reached ${reached - synced} ms after the sync, ${reached - t0} ms after the API change`);
    // from then on only pod-2: the stale flow is gone
    const mark2 = replies.length;
    await waitFor('three more replies', () => replies.length >= mark2 + 3, 10_000, 50);
    assert.deepEqual([...new Set(replies.slice(mark2))], ['pod-2'], JSON.stringify(replies.slice(mark2)));
  } finally {
    await client.kill(c);
  }
});

test('kproxy --cleanup keeps another program\'s KUBE-KUBELET-CANARY and KUBE-ROUTER-INPUT and removes all of kproxy\'s', async () => {
  await node.kill(kproxy!);
  assert.ok(kproxyChains().length > 10, 'kproxy\'s chains stay in place when it stops');
  node.exec(process.execPath, [join(repoRoot, 'bin/kproxy.js'), ...CLEANUP_ARGS]);
  for (const table of ['mangle', 'nat', 'filter']) {
    assert.match(node.exec('iptables-save', ['-t', table]), /^:KUBE-KUBELET-CANARY /m, `KUBE-KUBELET-CANARY in ${table}`);
  }
  const filter = node.exec('iptables-save', ['-t', 'filter']);
  assert.match(filter, /^:KUBE-ROUTER-INPUT /m);
  assert.match(filter, /^-A INPUT -m comment --comment "kube-router netpol" -j KUBE-ROUTER-INPUT$/m, 'its jump from INPUT');
  assert.match(filter, /^-A KUBE-ROUTER-INPUT -p tcp -m tcp --dport 179 -j ACCEPT$/m, 'its rule');
  assert.deepEqual(kproxyChains(), [], `left behind:\n${node.exec('iptables-save', [])}`);
  assert.doesNotMatch(node.exec('iptables-save', []), /-j KUBE-(SERVICES|POSTROUTING|NODEPORTS|FORWARD|EXTERNAL-SERVICES|PROXY-FIREWALL)\b/);
  assert.doesNotMatch(node.exec('nft', ['list', 'tables']), /kube-proxy/);
});
