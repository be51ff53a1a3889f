// `kproxy render --mode M --manifests DIR` over a directory as projects publish it (Services
// without spec.clusterIP among Namespaces, Deployments, a CRD, ConfigMaps, a misspelt kind):
// every mode programs every Service, at the addresses and node ports `run` would give it. The
// state file `run` keeps is read (a pinned address wins) and never written. The expected values
// come from the allocator itself, fed the objects directly (not from kproxy's reading of the
// directory or of its own output); each mode's payload is matched as text.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync, readFileSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { ServiceAllocator, allocatorConfig, applyPatch } from '../../src/sources/service-alloc.ts';
import type { K8sService } from '../../src/core/api.ts';

const repo = resolve(import.meta.dirname, '../..');
const bin = join(repo, 'bin/kproxy.js');
const RANGES = ['--service-cluster-ip-range', '10.96.0.0/24,fd00:96::/112', '--service-node-port-range', '31000-31999'];
let dir = '';
let state = '';

const service = (ns: string, name: string, spec: Record<string, unknown>): K8sService =>
  ({ apiVersion: 'v1', kind: 'Service', metadata: { name, namespace: ns }, spec: { selector: { app: name }, ...spec } }) as K8sService;
const slice = (ns: string, svc: string, port: number, ip: string) => ({
  apiVersion: 'discovery.k8s.io/v1',
  kind: 'EndpointSlice',
  metadata: { name: `${svc}-${ip.includes(':') ? 'v6' : 'v4'}`, namespace: ns, labels: { 'kubernetes.io/service-name': svc } },
  addressType: ip.includes(':') ? 'IPv6' : 'IPv4',
  ports: [{ name: 'p', port }],
  endpoints: [{ addresses: [ip] }],
});

const SERVICES = [
  service('shop', 'web', { ports: [{ name: 'p', port: 80, targetPort: 8080 }] }),
  service('shop', 'api', { type: 'NodePort', ports: [{ name: 'p', port: 9090, targetPort: 9090 }] }),
  service('shop', 'edge', { type: 'LoadBalancer', externalTrafficPolicy: 'Local', ports: [{ name: 'p', port: 443, targetPort: 8443 }] }),
  service('shop', 'dual', { ipFamilyPolicy: 'PreferDualStack', ports: [{ name: 'p', port: 81, targetPort: 8081 }] }),
  service('widgets', 'webhook', { ports: [{ name: 'p', port: 444, targetPort: 9443 }] }),
];
/** web's address in the state file `run` wrote: render must use it */
const PINNED = '10.96.0.200';

const OTHER_KINDS = `apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec: {replicas: 1}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cfg, namespace: shop}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec: {group: example.com, names: {kind: Widget, plural: widgets}, scope: Namespaced, versions: []}
---
apiVersion: v1
kind: Servce
metadata: {name: typo, namespace: shop}
`;

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kpt-render-alloc-'));
  const docs = (objs: unknown[]) => objs.map((o) => JSON.stringify(o)).join('\n---\n') + '\n';
  writeFileSync(join(dir, 'a-other.yaml'), OTHER_KINDS);
  writeFileSync(join(dir, 'b-shop.yaml'), OTHER_KINDS.split('---')[1] + '---\n' + docs([...SERVICES.slice(0, 4), slice('shop', 'web', 8080, '10.180.0.1'), slice('shop', 'api', 9090, '10.180.0.2'), slice('shop', 'edge', 8443, '10.180.0.3'), slice('shop', 'dual', 8081, '10.180.0.4'), slice('shop', 'dual', 8081, 'fd00:180::4')]));
  writeFileSync(join(dir, 'c-widgets.yaml'), docs([{ apiVersion: 'v1', kind: 'List', items: [{ apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: 'sa', namespace: 'widgets' } }, SERVICES[4]] }, slice('widgets', 'webhook', 9443, '10.180.0.5')]));
  state = join(dir, '..', `${dir.split('/').pop()}-state.json`);
  writeFileSync(state, JSON.stringify({ kind: 'KproxyServiceAllocations', version: 1, services: { 'shop/web': { clusterIPs: [PINNED] } } }));
});

after(() => {
  rmSync(dir, { recursive: true, force: true });
  rmSync(state, { force: true });
});

function kproxy(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [bin, ...args], { timeout: 120_000, env: { ...process.env, KPROXY_NO_BUNDLE: '1' }, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      done({ code: err ? (typeof err.code === 'number' ? err.code : -1) : 0, stdout, stderr });
    });
  });
}

/** What `run` gives each Service, from the allocator fed the objects and the state directly. */
function expected(): Map<string, K8sService> {
  const a = new ServiceAllocator(allocatorConfig('10.96.0.0/24,fd00:96::/112', '31000-31999'), JSON.parse(readFileSync(state, 'utf8')));
  const byKey = new Map(SERVICES.map((s) => [`${s.metadata!.namespace}/${s.metadata!.name}`, s]));
  const out = new Map<string, K8sService>();
  for (const o of a.apply(byKey)) out.set(o.key, applyPatch(byKey.get(o.key)!, o.patch!));
  return out;
}

const esc = (s: string) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');

/** How each mode's payload names a cluster IP:port and a node port. */
const PATTERNS: Record<string, { cluster: (ip: string, port: number) => RegExp; nodePort: (np: number) => RegExp }> = {
  iptables: { cluster: (ip, port) => new RegExp(`-d ${esc(ip)} --dport ${port} `), nodePort: (np) => new RegExp(`--dport ${np} -j KUBE-EXT-`) },
  nftables: { cluster: (ip, port) => new RegExp(`${esc(ip)} \\. tcp \\. ${port} : goto service-`), nodePort: (np) => new RegExp(`tcp \\. ${np} : goto external-`) },
  ipvs: { cluster: (ip, port) => new RegExp(`^-A -t ${ip.includes(':') ? `\\[${esc(ip)}\\]` : esc(ip)}:${port} `, 'm'), nodePort: (np) => new RegExp(`^-A -t \\S+:${np} `, 'm') },
  userspace: { cluster: (ip, port) => new RegExp(`clusterIP ${ip.includes(':') ? `\\[${esc(ip)}\\]` : esc(ip)}:${port}\\b`), nodePort: (np) => new RegExp(`nodePort ${np}\\b`) },
};

for (const mode of ['iptables', 'nftables', 'ipvs', 'userspace']) {
  test(`render --mode ${mode} programs every Service of a mixed directory at the values run gives it`, { timeout: 180_000 }, async () => {
    const mtime = statSync(state).mtimeMs;
    const r = await kproxy(['render', '--mode', mode, '--manifests', dir, '--manifests-state', state, ...RANGES, '--node-ip', '192.168.0.2,fd00::2']);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /a-other\.yaml:\d+: apiVersion v1 has no kind "Servce"/, 'the misspelt kind is named');
    assert.doesNotMatch(r.stderr, /Deployment|CustomResourceDefinition|Namespace|ConfigMap|ServiceAccount/, 'other kinds are no warning');
    assert.match(r.stdout, /^# ==== kproxy IPv4 ====$/m);
    assert.match(r.stdout, /^# ==== kproxy IPv6 ====$/m, 'the PreferDualStack Service makes it dual-stack');
    const [v4, v6] = r.stdout.split(/^# ==== kproxy IPv6 ====$/m);
    const want = expected();
    assert.deepEqual(want.get('shop/web')!.spec!.clusterIPs, [PINNED], 'the state file pins web');
    const p = PATTERNS[mode];
    for (const [key, svc] of want) {
      const port = svc.spec!.ports![0].port!;
      for (const ip of svc.spec!.clusterIPs!) {
        assert.ok(ip.includes(':') ? ip.startsWith('fd00:96::') : ip.startsWith('10.96.0.'), `${key}: ${ip} from the range`);
        assert.match(ip.includes(':') ? v6 : v4, p.cluster(ip, port), `${mode}: ${key} at ${ip}:${port}`);
      }
      const np = svc.spec!.ports![0].nodePort;
      if (svc.spec!.type === 'NodePort' || svc.spec!.type === 'LoadBalancer') {
        assert.ok(np! >= 31000 && np! <= 31999, `${key}: node port ${np}`);
        assert.match(v4, p.nodePort(np!), `${mode}: ${key} node port ${np}`);
      }
    }
    assert.equal(want.get('shop/dual')!.spec!.clusterIPs!.length, 2);
    assert.equal(statSync(state).mtimeMs, mtime, 'render never writes the state file');
  });
}

test('render without a state file allocates the same way on every run, and never creates one', { timeout: 180_000 }, async () => {
  const missing = join(dir, '..', `${dir.split('/').pop()}-none.json`);
  const a = await kproxy(['render', '--mode', 'iptables', '--manifests', dir, '--manifests-state', missing, ...RANGES, '--node-ip', '192.168.0.2,fd00::2']);
  const b = await kproxy(['render', '--mode', 'iptables', '--manifests', dir, '--manifests-state', missing, ...RANGES, '--node-ip', '192.168.0.2,fd00::2']);
  assert.equal(a.code, 0, a.stderr);
  assert.equal(a.stdout, b.stdout);
  assert.doesNotMatch(a.stdout, new RegExp(esc(PINNED)), 'without the state file web gets its own first candidate');
  assert.throws(() => statSync(missing), /ENOENT/);
});

test('bad ranges are usage errors (exit 2), as kube-apiserver refuses its flags', { timeout: 180_000 }, async () => {
  const r = await kproxy(['render', '--mode', 'iptables', '--manifests', dir, '--service-cluster-ip-range', '10.0.0.0/24,10.1.0.0/24']);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /KPROXY_CONFIG_INVALID: --service-cluster-ip-range: invalid argument "10\.0\.0\.0\/24,10\.1\.0\.0\/24": --service-cluster-ip-range\[0\] and --service-cluster-ip-range\[1\] must be of different IP family/);
  const p = await kproxy(['render', '--mode', 'iptables', '--manifests', dir, '--service-node-port-range', '32767-30000']);
  assert.equal(p.code, 2);
  assert.match(p.stderr, /--service-node-port-range: invalid argument "32767-30000": end port cannot be less than start port/);
});

test('render refuses a Service asking for a held address as run does: without state the first by name holds it, with state its holder', { timeout: 180_000 }, async () => {
  const d = mkdtempSync(join(tmpdir(), 'kpt-render-collide-'));
  try {
    const svcText = (name: string) => `apiVersion: v1\nkind: Service\nmetadata: {name: ${name}, namespace: shop}\nspec: {clusterIP: 10.96.0.50, ports: [{name: p, port: 80}]}\n`;
    writeFileSync(join(d, 'svc.yaml'), svcText('a-first') + '---\n' + svcText('b-second'));
    const held = join(d, '..', `${d.split('/').pop()}-state.json`);
    const base = ['render', '--mode', 'iptables', '--manifests', d, ...RANGES, '--node-ip', '192.168.0.2'];
    const fresh = await kproxy([...base, '--manifests-state', join(d, 'none.json')]);
    assert.equal(fresh.code, 0, fresh.stderr);
    // no endpoints: the address rejects, in the holder's name
    assert.match(fresh.stdout, /"shop\/a-first:p has no endpoints" .*-d 10\.96\.0\.50 --dport 80 -j REJECT/);
    assert.doesNotMatch(fresh.stdout, /shop\/b-second/);
    assert.match(fresh.stderr, /^kproxy: warning: Service shop\/b-second: spec\.clusterIPs: failed to allocate IP 10\.96\.0\.50: provided IP is already allocated \(held by Service shop\/a-first\); skipped$/m);
    assert.match(fresh.stderr, /^kproxy: skipped 0 files, 1 object: Service shop\/b-second$/m);
    try {
      writeFileSync(held, JSON.stringify({ kind: 'KproxyServiceAllocations', version: 1, services: { 'shop/b-second': { clusterIPs: ['10.96.0.50'] } } }));
      const withState = await kproxy([...base, '--manifests-state', held]);
      assert.equal(withState.code, 0, withState.stderr);
      assert.match(withState.stdout, /"shop\/b-second:p has no endpoints" .*-d 10\.96\.0\.50 --dport 80 -j REJECT/, 'the holder run recorded keeps it');
      assert.doesNotMatch(withState.stdout, /shop\/a-first/);
      assert.match(withState.stderr, /Service shop\/a-first: spec\.clusterIPs: failed to allocate IP 10\.96\.0\.50: provided IP is already allocated \(held by Service shop\/b-second\)/);
    } finally {
      rmSync(held, { force: true });
    }
  } finally {
    rmSync(d, { recursive: true, force: true });
  }
});
