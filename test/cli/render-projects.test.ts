// `kproxy render` in every mode over test/fixtures/projects: manifests shaped like published
// projects' (cert-manager, Istio's ingress gateway, Gatekeeper, Longhorn, Argo CD's HA Redis
// proxy), with Namespaces, CRDs, RBAC, Deployments and ConfigMaps beside Services that carry no
// clusterIP, port names of 16 to 63 characters or all digits, a List, a headless Service and one
// misspelt kind. Every Service port is programmed in every mode, the modes agree on the
// addresses the allocator gave, only the misspelt object is skipped, and the kernel accepts the
// iptables and nftables payloads and the ipvs mode's ipsets (in a namespace of its own).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Netns } from '../support/netns.ts';

const repo = resolve(import.meta.dirname, '../..');
const DIR = join(repo, 'test/fixtures/projects');

/** Every Service port of the fixtures, as "ns/name:port" (the headless Service has none). */
const PORTS = [
  'argocd/argocd-redis-ha-haproxy:a-port-name-of-exactly-sixty-three-characters-which-dns-allows0',
  'argocd/argocd-redis-ha-haproxy:http-exporter-port',
  'argocd/argocd-redis-ha-haproxy:tcp-haproxy',
  'cert-manager/cert-manager-webhook:https',
  'cert-manager/cert-manager-webhook:metrics',
  'cert-manager/cert-manager:tcp-prometheus-servicemonitor',
  'default/svc1:81',
  'default/svc1:8443',
  'gatekeeper-system/gatekeeper-webhook-service:https-webhook-server',
  'istio-system/istio-ingressgateway:http2',
  'istio-system/istio-ingressgateway:https',
  'istio-system/istio-ingressgateway:status-port',
  'longhorn-system/longhorn-admission-webhook:admission-webhook',
  'longhorn-system/longhorn-conversion-webhook:conversion-webhook',
  'longhorn-system/longhorn-frontend:http',
];

function render(mode: string, state: string): { out: string; err: string } {
  const r = spawnSync(process.execPath, [join(repo, 'bin/kproxy.js'), 'render', '--mode', mode, '--manifests', DIR, '--manifests-state', state], {
    encoding: 'utf8',
    timeout: 120_000,
    maxBuffer: 16 << 20,
  });
  assert.equal(r.status, 0, `${mode}: ${r.stderr}`);
  return { out: r.stdout, err: r.stderr };
}

test('render in every mode programs every Service port of real projects\' manifests, and the kernel accepts it', async () => {
  const tmp = mkdtempSync(join(tmpdir(), 'kpa-projects-'));
  const ns = Netns.create(`kpt-projects-${process.pid}`);
  try {
    // a state file that does not exist: render allocates from scratch and never writes it
    const state = join(tmp, 'state.json');
    const r = Object.fromEntries(['userspace', 'iptables', 'nftables', 'ipvs'].map((m) => [m, render(m, state)]));

    assert.equal(existsSync(state), false, 'render never writes the state file');

    // the userspace listing names each port with its ClusterIP: the addresses every mode must use
    const addr = new Map<string, { ip: string; port: string }>();
    for (const m of r.userspace.out.matchAll(/^listen TCP \S+ (\S+) policy=\S+\n\s+frontends: clusterIP ([\d.]+):(\d+)/gm)) addr.set(m[1], { ip: m[2], port: m[3] });
    assert.deepEqual([...addr.keys()].sort(), PORTS);
    assert.equal(addr.get('argocd/argocd-redis-ha-haproxy:tcp-haproxy')?.ip, '10.0.0.200', 'an explicit clusterIP is kept');
    const ips = new Map<string, string>();
    for (const [key, a] of addr) {
      const svc = key.split(':')[0];
      assert.match(a.ip, /^10\.0\.0\.\d+$/, `${key}: from kube-apiserver's default --service-cluster-ip-range 10.0.0.0/24`);
      assert.ok(!['10.0.0.0', '10.0.0.1', '10.0.0.255'].includes(a.ip), `${key}: never the network, broadcast or first address`);
      const owner = [...ips].find(([ip, s]) => ip === a.ip && s !== svc);
      assert.equal(owner, undefined, `${key}: ${a.ip} not shared with another Service`);
      ips.set(a.ip, svc);
    }

    for (const [key, { ip, port }] of addr) {
      assert.ok(r.iptables.out.includes(`--comment "${key} has no endpoints" -m tcp -p tcp -d ${ip} --dport ${port} -j REJECT`), `iptables: ${key}`);
      assert.ok(r.nftables.out.includes(`{ ${ip} . tcp . ${port} comment "${key}" : goto reject-chain }`), `nftables: ${key}`);
      assert.ok(r.ipvs.out.includes(`add KUBE-CLUSTER-IP ${ip},tcp:${port} -exist`), `ipvs: ${key}`);
    }

    // the misspelt kind is the only object skipped; no file is skipped
    for (const [mode, { err }] of Object.entries(r)) {
      assert.match(err, /longhorn\.yaml:\d+: apiVersion v1 has no kind "Servce"/, mode);
      assert.match(err, /skipped 0 files, 1 object/, mode);
    }

    // the kernel takes each payload
    ns.exec('iptables-restore', ['--test'], { input: r.iptables.out });
    ns.exec('nft', ['-c', '-f', '-'], { input: r.nftables.out });
    const ipsets = r.ipvs.out.split('\n# ipset restore\n')[1].split('\n# ')[0];
    ns.exec('ipset', ['restore'], { input: `${ipsets}\n` });
    assert.match(ns.exec('ipset', ['list', 'KUBE-CLUSTER-IP']), new RegExp(`${addr.get(PORTS[0])!.ip.replace(/\./g, '\\.')},tcp:9999`));
  } finally {
    await ns.destroy();
    rmSync(tmp, { recursive: true, force: true });
  }
});
