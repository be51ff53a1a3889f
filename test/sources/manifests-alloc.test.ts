// The manifests source over a directory as a real project publishes it: Namespaces,
// Deployments, a CRD, ConfigMaps, RBAC, a List, a misspelt kind, and Services without
// spec.clusterIP, in multi-document files. Every Service is delivered with what the API server
// would have given it; the state file keeps it across a restart; a collision is refused and
// counted as invalid, and gets in once the holder goes.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync, readFileSync, existsSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import pino from 'pino';
import { ManifestsSource } from '../../src/sources/manifests.ts';
import { allocatorConfig } from '../../src/sources/service-alloc.ts';
import { STATE_KIND, defaultStatePath, findStatePath, readStateFile, stateFileName } from '../../src/sources/allocation-state.ts';
import type { SourceHandler } from '../../src/sources/types.ts';
import type { K8sService } from '../../src/core/api.ts';
import { cidrContains } from '../../src/core/ip.ts';

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

function tempDir(prefix = 'kpt-alloc-'): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function waitFor(pred: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const APP = `apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, namespace: shop}
data: {a: b}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: nginx}]}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Servce
metadata: {name: typo, namespace: shop}
spec: {ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec:
  type: NodePort
  ports:
  - {name: grpc, port: 9090}
  - {name: dns-udp, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
---
apiVersion: v1
kind: Service
metadata: {name: edge, namespace: shop}
spec:
  type: LoadBalancer
  externalTrafficPolicy: Local
  ports: [{name: https, port: 443}]
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: shop}
spec: {clusterIP: None, ports: [{port: 5432}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.180.0.1]}]
`;

const CRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.com}
spec:
  group: example.com
  names: {kind: Widget, plural: widgets}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: widget-reader}
rules: [{apiGroups: [example.com], resources: [widgets], verbs: [get]}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: controller, namespace: widgets}
spec: {replicas: 1}
---
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: ServiceAccount
  metadata: {name: controller, namespace: widgets}
- apiVersion: v1
  kind: Service
  metadata: {name: webhook, namespace: widgets}
  spec: {ports: [{port: 443, targetPort: 9443}]}
- apiVersion: admissionregistration.k8s.io/v1
  kind: ValidatingWebhookConfiguration
  metadata: {name: widgets}
`;

function recorder() {
  const services = new Map<string, K8sService>();
  const invalid: string[] = [];
  let synced = false;
  const handler: SourceHandler = {
    onService: (o, n) => {
      const key = `${(n ?? o)!.metadata!.namespace}/${(n ?? o)!.metadata!.name}`;
      if (n) services.set(key, n);
      else services.delete(key);
    },
    onEndpointSlice: () => {},
    onInvalid: (kind, obj) => void invalid.push(`${kind} ${obj}`),
    onSynced: () => void (synced = true),
  };
  return { services, invalid, handler, synced: () => synced };
}

function captureLogger() {
  const lines: Array<Record<string, unknown>> = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l.trim()) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { logger: pino({ level: 'debug' }, stream), lines };
}

async function start(dir: string, statePath?: string) {
  const r = recorder();
  const { logger, lines } = captureLogger();
  const src = new ManifestsSource({ dir, nodeName: 'node-a', log: logger, pollMs: 50, allocation: allocatorConfig('10.96.0.0/24', '30000-32767'), statePath });
  cleanups.push(() => src.stop());
  await src.start(r.handler);
  return { src, lines, ...r };
}

const ips = (s: K8sService | undefined) => s?.spec?.clusterIPs ?? (s?.spec?.clusterIP ? [s.spec.clusterIP] : []);
/** What each Service got: its addresses and node ports. */
const summary = (m: Map<string, K8sService>) =>
  Object.fromEntries([...m].sort(([a], [b]) => (a < b ? -1 : 1)).map(([k, s]) => [k, { ips: ips(s), nodePorts: (s.spec?.ports ?? []).map((p) => p.nodePort ?? null), hc: s.spec?.healthCheckNodePort ?? null }]));

test('a real project directory: other kinds ignored, the misspelt one skipped with its line, every Service delivered with what the API server would give it', async () => {
  const dir = tempDir();
  const state = join(tempDir('kpt-alloc-state-'), 'nested', 'state.json');
  writeFileSync(join(dir, 'app.yaml'), APP);
  writeFileSync(join(dir, 'crd.yaml'), CRD);
  const { src, services, lines, synced, invalid } = await start(dir, state);
  assert.ok(synced());
  assert.deepEqual([...services.keys()].sort(), ['shop/api', 'shop/db', 'shop/edge', 'shop/web', 'widgets/webhook'], 'every Service, none of the other kinds');
  for (const key of ['shop/api', 'shop/edge', 'shop/web', 'widgets/webhook']) {
    const got = ips(services.get(key));
    assert.equal(got.length, 1, key);
    assert.ok(cidrContains('10.96.0.0/24', got[0]) && !['10.96.0.0', '10.96.0.1', '10.96.0.255'].includes(got[0]), `${key}: ${got}`);
  }
  assert.equal(services.get('shop/db')!.spec!.clusterIP, 'None', 'headless stays headless');
  assert.equal(new Set(['shop/api', 'shop/edge', 'shop/web', 'widgets/webhook'].map((k) => ips(services.get(k))[0])).size, 4, 'four different addresses');
  const api = services.get('shop/api')!.spec!.ports!.map((p) => p.nodePort!);
  assert.ok(api.every((p) => p >= 30000 && p <= 32767));
  assert.equal(api[1], api[2], 'DNS over UDP and TCP share a node port');
  assert.notEqual(api[0], api[1]);
  const edge = services.get('shop/edge')!.spec!;
  assert.ok(edge.ports![0].nodePort! >= 30000 && edge.healthCheckNodePort! >= 30000, 'LoadBalancer: node port and health check node port');
  assert.deepEqual(invalid, []);

  // the misspelt kind: one warning naming file:line; the ignored kinds: once each, at debug level
  const typoLine = APP.split('\n').indexOf('kind: Servce') + 1;
  const warns = lines.filter((l) => l.level === 40 && l.msg === 'manifest object skipped; the rest of the file is used');
  assert.equal(warns.length, 1);
  assert.equal(warns[0].line, typoLine);
  assert.match(String(warns[0].err), new RegExp(`KPROXY_MANIFEST_INVALID: .*app\\.yaml:${typoLine}: apiVersion v1 has no kind "Servce"`));
  const ignored = lines.filter((l) => l.level === 20 && l.msg === 'kind not used by kproxy; its objects are ignored').map((l) => l.kind);
  assert.deepEqual([...ignored].sort(), [
    'admissionregistration.k8s.io/v1 ValidatingWebhookConfiguration', 'apiextensions.k8s.io/v1 CustomResourceDefinition', 'apps/v1 Deployment',
    'rbac.authorization.k8s.io/v1 ClusterRole', 'v1 ConfigMap', 'v1 Namespace', 'v1 ServiceAccount',
  ], 'each kind once, though Deployment is in both files');
  assert.equal(lines.filter((l) => (l.level as number) >= 50).length, 0, 'no file is broken');
  assert.equal(src.health().problem, undefined);

  // the state file: written atomically, the holdings by namespace/name
  await waitFor(() => existsSync(state), 'the state file');
  const written = JSON.parse(readFileSync(state, 'utf8'));
  assert.equal(written.kind, STATE_KIND);
  assert.deepEqual(written.serviceClusterIPRange, ['10.96.0.0/24']);
  assert.deepEqual(written.services['shop/web'], { clusterIPs: ips(services.get('shop/web')) });
  assert.deepEqual(written.services['shop/api'].nodePorts, { grpc: api[0], 'dns-udp': api[1], 'dns-tcp': api[2] });
  const report = src.allocations();
  assert.deepEqual(report.allocated.map((a) => a.service), ['shop/api', 'shop/edge', 'shop/web', 'widgets/webhook']);
  assert.deepEqual(report.refused, []);

  // the same directory allocates the same way without the file
  const again = await start(dir);
  assert.deepEqual(summary(again.services), summary(services));
});

test('across a restart the state file keeps every allocation; a Service asking for a held address is refused, counted, and gets in when the holder goes', async () => {
  const dir = tempDir();
  const state = join(tempDir('kpt-alloc-state-'), 'state.json');
  writeFileSync(join(dir, 'app.yaml'), APP);
  writeFileSync(join(dir, 'crd.yaml'), CRD);
  const first = await start(dir, state);
  await waitFor(() => existsSync(state), 'the state file');
  const before = summary(first.services);
  const webIP = ips(first.services.get('shop/web'))[0];
  await first.src.stop();

  // while kproxy is down: a newcomer asks for web's address, sorting before web, and another Service arrives
  writeFileSync(join(dir, 'a-squatter.yaml'), `apiVersion: v1\nkind: Service\nmetadata: {name: aaa, namespace: shop}\nspec: {clusterIP: ${webIP}, ports: [{port: 80}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: new, namespace: shop}\nspec: {ports: [{port: 80}]}\n`);
  const second = await start(dir, state);
  assert.ok(second.lines.some((l) => l.msg === 'manifests state file read' && l.file === state), 'the state file is reused');
  const after = summary(second.services);
  for (const key of Object.keys(before)) assert.deepEqual(after[key], before[key], `${key} kept what it had`);
  assert.ok(!second.services.has('shop/aaa'), 'the newcomer is refused');
  assert.deepEqual(second.invalid, ['Service shop/aaa'], 'and counted as invalid');
  const warn = second.lines.find((l) => l.level === 40 && String(l.msg).startsWith('KPROXY_SERVICE_ALLOCATION'));
  assert.ok(warn, 'a warning with the code');
  assert.equal(warn.field, 'spec.clusterIPs');
  assert.match(String(warn.msg), new RegExp(`Service shop/aaa refused: spec\\.clusterIPs: failed to allocate IP ${webIP.replace(/\./g, '\\.')}: provided IP is already allocated \\(held by Service shop/web\\); skipped`));
  assert.deepEqual(second.src.allocations().refused.map((r) => [r.service, r.field]), [['shop/aaa', 'spec.clusterIPs']]);
  assert.ok(ips(second.services.get('shop/new'))[0], 'the other newcomer gets an address');

  // the holder goes: its address is released, the refused Service gets in
  writeFileSync(join(dir, 'app.yaml'), APP.replace(/---\napiVersion: v1\nkind: Service\nmetadata: \{name: web, namespace: shop\}\nspec:\n {2}selector: \{app: web\}\n {2}ports: \[\{name: http, port: 80, targetPort: 8080\}\]\n/, ''));
  await waitFor(() => second.services.has('shop/aaa') && !second.services.has('shop/web'), 'the squatter admitted once web is gone');
  assert.deepEqual(ips(second.services.get('shop/aaa')), [webIP]);
  assert.deepEqual(second.src.allocations().refused, []);
  await second.src.stop();
  const saved = readStateFile(state).state!.services;
  assert.equal(saved['shop/web'], undefined, 'a deleted Service releases its holding');
  assert.deepEqual(saved['shop/aaa'], { clusterIPs: [webIP] });

  // a Service deleted while kproxy is down: released at the first complete scan
  unlinkSync(join(dir, 'a-squatter.yaml'));
  const third = await start(dir, state);
  await third.src.stop();
  const final = readStateFile(state).state!.services;
  assert.equal(final['shop/aaa'], undefined);
  assert.equal(final['shop/new'], undefined);
  const [grpc, udp, tcp] = before['shop/api'].nodePorts;
  assert.deepEqual(final['shop/api'].nodePorts, { grpc, 'dns-udp': udp, 'dns-tcp': tcp }, 'kept through the restarts');
});

test('the state file lives where kproxy can write it, named after the directory; a broken one is reported and replaced', async () => {
  const dir = tempDir();
  const home = tempDir('kpt-alloc-home-');
  const name = stateFileName(dir);
  assert.match(name, /^manifests-kpt-alloc-[A-Za-z0-9]+-[0-9a-f]{12}\.json$/);
  assert.equal(stateFileName(join(dir, '.', '')), name, 'the real path names it');
  const env = { HOME: home, XDG_STATE_HOME: join(home, 'xdg') };
  const path = defaultStatePath(dir, env);
  assert.ok([join('/var/lib/kproxy', name), join(home, 'xdg', 'kproxy', name)].includes(path), path);
  if (process.getuid?.() !== 0) assert.equal(path, join(home, 'xdg', 'kproxy', name), 'not root: the XDG state directory');
  assert.equal(findStatePath(dir, env), path, 'a reader looks where run writes');

  const state = join(home, 'state.json');
  writeFileSync(state, '{not json');
  writeFileSync(join(dir, 'a.yaml'), 'apiVersion: v1\nkind: Service\nmetadata: {name: a}\nspec: {ports: [{port: 80}]}\n');
  const s = await start(dir, state);
  assert.ok(s.lines.some((l) => l.level === 40 && String(l.msg).startsWith('KPROXY_MANIFEST_STATE: ') && String(l.msg).includes('allocating afresh')));
  assert.ok(ips(s.services.get('default/a'))[0]);
  await waitFor(() => readStateFile(state).state !== undefined, 'a good state file');
});
