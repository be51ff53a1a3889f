// Unit tests for src/sources/manifests.ts on a real temporary directory: initial adds then
// onSynced, edits as (old, new), deletes, broken files reported with file and line while their
// last good content stays in force, List kinds, unsupported kinds.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, writeFileSync, rmSync, renameSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import pino from 'pino';
import { ManifestsSource, ManifestError, parseManifestFile } from '../../src/sources/manifests.ts';
import type { SourceHandler, K8sNode } from '../../src/sources/types.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/convert.ts';

type Event =
  | { type: 'service' | 'slice'; old: string | null; new: string | null; oldObj: unknown; newObj: unknown }
  | { type: 'node'; node: string | null }
  | { type: 'synced' };

/** One line per event, for comparing event sequences. */
function describe(e: Event): string {
  if (e.type === 'node') return `node ${e.node}`;
  if (e.type === 'synced') return 'synced';
  return `${e.type} ${e.old} -> ${e.new}`;
}

const id = (o: { metadata?: { namespace?: string; name?: string } } | null) =>
  o ? `${o.metadata?.namespace ?? ''}/${o.metadata?.name ?? ''}` : null;

function recorder(): { events: Event[]; handler: SourceHandler } {
  const events: Event[] = [];
  const handler: SourceHandler = {
    onService: (o: K8sService | null, n: K8sService | null) => events.push({ type: 'service', old: id(o), new: id(n), oldObj: o, newObj: n }),
    onEndpointSlice: (o: K8sEndpointSlice | null, n: K8sEndpointSlice | null) =>
      events.push({ type: 'slice', old: id(o), new: id(n), oldObj: o, newObj: n }),
    onNode: (n: K8sNode | null) => events.push({ type: 'node', node: n?.metadata?.name ?? null }),
    onSynced: () => events.push({ type: 'synced' }),
  };
  return { events, handler };
}

function captureLogger(): { logger: pino.Logger; lines: Array<Record<string, unknown>> } {
  const lines: Array<Record<string, unknown>> = [];
  const stream = new Writable({
    write(chunk, _enc, cb) {
      for (const l of String(chunk).split('\n')) if (l.trim()) lines.push(JSON.parse(l) as Record<string, unknown>);
      cb();
    },
  });
  return { logger: pino({ level: 'debug' }, stream), lines };
}

/** Polls until pred() holds; fails after timeoutMs. */
async function waitFor(pred: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!pred()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const service = (name: string, ip: string, port = 80, ns?: string) =>
  [
    'apiVersion: v1',
    'kind: Service',
    'metadata:',
    `  name: ${name}`,
    ...(ns ? [`  namespace: ${ns}`] : []),
    'spec:',
    `  clusterIP: ${ip}`,
    '  ports:',
    `  - name: p${port}`,
    `    port: ${port}`,
    '',
  ].join('\n');

const slice = (name: string, svc: string, ips: string[]) =>
  [
    'apiVersion: discovery.k8s.io/v1',
    'kind: EndpointSlice',
    'metadata:',
    `  name: ${name}`,
    '  labels:',
    `    kubernetes.io/service-name: ${svc}`,
    'addressType: IPv4',
    'ports:',
    '- name: p80',
    '  port: 80',
    'endpoints:',
    ...ips.map((ip) => `- addresses: ["${ip}"]`),
    '',
  ].join('\n');

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'kpt-manifests-'));
  cleanups.push(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function startSource(dir: string, nodeName = 'node-a') {
  const { events, handler } = recorder();
  const { logger, lines } = captureLogger();
  const src = new ManifestsSource({ dir, nodeName, log: logger, pollMs: 50 });
  cleanups.push(() => src.stop());
  await src.start(handler);
  return { src, events, lines };
}

test('initial objects are delivered as adds, then onSynced', async () => {
  const dir = tempDir();
  writeFileSync(join(dir, 'a-services.yaml'), service('svc1', '172.30.0.41') + '---\n' + service('svc2', '172.30.0.42', 80, 'other'));
  writeFileSync(join(dir, 'b-slices.yaml'), slice('svc1-x', 'svc1', ['10.180.0.1', '10.180.0.2']));
  writeFileSync(
    join(dir, 'c-nodes.json'),
    JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [
      { apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-a', labels: { 'topology.kubernetes.io/zone': 'zone-a' } } },
      { apiVersion: 'v1', kind: 'Node', metadata: { name: 'node-b' } },
    ] }),
  );
  writeFileSync(join(dir, 'notes.txt'), 'not a manifest');
  writeFileSync(join(dir, '.hidden.yaml'), 'kind: ConfigMap\n');
  const { events } = await startSource(dir);
  const last = events[events.length - 1];
  assert.deepEqual(last, { type: 'synced' });
  const adds = events.slice(0, -1).map(describe);
  assert.deepEqual(adds.sort(), [
    'node node-a', // only this node's Node is delivered
    'service null -> default/svc1', // namespace defaults to "default"
    'service null -> other/svc2',
    'slice null -> default/svc1-x',
  ]);
});

test('an edit is delivered as update(old, new); removing an object as delete', async () => {
  const dir = tempDir();
  const f = join(dir, 'svc.yaml');
  writeFileSync(f, service('svc1', '172.30.0.41') + '---\n' + service('svc2', '172.30.0.42'));
  const { events } = await startSource(dir);
  events.length = 0;

  writeFileSync(f, service('svc1', '172.30.0.41', 8080) + '---\n' + service('svc2', '172.30.0.42'));
  await waitFor(() => events.length >= 1, 'the update');
  await new Promise((r) => setTimeout(r, 150));
  assert.equal(events.length, 1, 'only the changed object is delivered');
  const e = events[0];
  assert.equal(e.type, 'service');
  if (e.type !== 'service') return;
  assert.equal(e.old, 'default/svc1');
  assert.equal(e.new, 'default/svc1');
  assert.equal((e.oldObj as K8sService).spec!.ports![0].port, 80);
  assert.equal((e.newObj as K8sService).spec!.ports![0].port, 8080);

  events.length = 0;
  writeFileSync(f, service('svc1', '172.30.0.41', 8080));
  await waitFor(() => events.length >= 1, 'the delete');
  assert.deepEqual(events.map((x) => (x.type === 'service' ? [x.old, x.new] : x.type)), [['default/svc2', null]]);

  events.length = 0;
  unlinkSync(f);
  await waitFor(() => events.length >= 1, 'the delete of the file');
  assert.deepEqual(events.map((x) => (x.type === 'service' ? [x.old, x.new] : x.type)), [['default/svc1', null]]);
});

test('a new file adds its objects; an atomic replace (rename) is seen', async () => {
  const dir = tempDir();
  const { events } = await startSource(dir);
  events.length = 0;
  const tmp = join(dir, '.svc.yaml.tmp');
  writeFileSync(tmp, service('svc1', '172.30.0.41'));
  renameSync(tmp, join(dir, 'svc.yaml'));
  await waitFor(() => events.length >= 1, 'the add');
  assert.deepEqual(events.map((x) => (x.type === 'service' ? [x.old, x.new] : x.type)), [[null, 'default/svc1']]);
  events.length = 0;
  writeFileSync(tmp, service('svc1', '172.30.0.99'));
  renameSync(tmp, join(dir, 'svc.yaml'));
  await waitFor(() => events.length >= 1, 'the update');
  const e = events[0];
  assert.ok(e.type === 'service' && (e.newObj as K8sService).spec!.clusterIP === '172.30.0.99');
});

test('a broken file is reported with file and line; its last good content stays, other files still update, a fix applies', async () => {
  const dir = tempDir();
  const svcFile = join(dir, 'a-svc.yaml');
  const epsFile = join(dir, 'b-eps.yaml');
  writeFileSync(svcFile, service('svc1', '172.30.0.41'));
  writeFileSync(epsFile, slice('svc1-x', 'svc1', ['10.180.0.1']));
  const { src, events, lines } = await startSource(dir);
  events.length = 0;

  // break b-eps.yaml: a mis-indented key on line 7
  writeFileSync(epsFile, slice('svc1-x', 'svc1', ['10.180.0.1']).replace('addressType: IPv4', ' addressType: IPv4'));
  await waitFor(() => lines.some((l) => l.level === 50), 'the error log');
  const err = lines.find((l) => l.level === 50)!;
  assert.equal(err.file, epsFile);
  assert.match(String(err.err), /KPROXY_MANIFEST_INVALID/);
  assert.ok(String(err.err).includes(`${epsFile}:7:`), `file and line in ${String(err.err)}`);
  assert.match(src.health().problem ?? '', /b-eps\.yaml:7/);
  await new Promise((r) => setTimeout(r, 200));
  assert.equal(events.length, 0, `the last good content of the broken file stays in force: ${events.map(describe).join(', ')}`);
  const errorsLogged = lines.filter((l) => l.level === 50).length;
  assert.equal(errorsLogged, 1, 'an unchanged broken file is reported once, not on every poll');

  // the other file still updates
  writeFileSync(svcFile, service('svc1', '172.30.0.41', 8080));
  await waitFor(() => events.length >= 1, 'the update of the good file');
  assert.deepEqual(events.map(describe), ['service default/svc1 -> default/svc1']);

  // fixing the broken file applies its new content
  events.length = 0;
  writeFileSync(epsFile, slice('svc1-x', 'svc1', ['10.180.0.1', '10.180.0.2']));
  await waitFor(() => events.length >= 1, 'the fixed file');
  const e = events[0];
  assert.ok(e.type === 'slice');
  if (e.type !== 'slice') return;
  assert.equal((e.oldObj as K8sEndpointSlice).endpoints!.length, 1);
  assert.equal((e.newObj as K8sEndpointSlice).endpoints!.length, 2);
  await waitFor(() => src.health().problem === undefined, 'the problem to clear');
  assert.ok(lines.some((l) => l.level === 30 && l.file === epsFile), 'the recovery is logged');
});

test('a file that is broken from the start delivers nothing and does not block the rest', async () => {
  const dir = tempDir();
  writeFileSync(join(dir, 'a.yaml'), 'kind: ConfigMap\nmetadata: {name: x}\n');
  writeFileSync(join(dir, 'b.yaml'), service('svc1', '172.30.0.41'));
  const { events, lines } = await startSource(dir);
  assert.deepEqual(events.map((x) => (x.type === 'service' ? x.new : x.type)), ['default/svc1', 'synced']);
  assert.ok(lines.some((l) => l.level === 50 && String(l.err).includes('a.yaml:1:') && String(l.err).includes('ConfigMap')));
});

test('a List kind works', () => {
  const text = [
    'apiVersion: v1',
    'kind: List',
    'items:',
    '- apiVersion: v1',
    '  kind: Service',
    '  metadata: {name: svc1, namespace: ns1}',
    '  spec: {clusterIP: 172.30.0.41, ports: [{port: 80}]}',
    '- apiVersion: discovery.k8s.io/v1',
    '  kind: EndpointSlice',
    '  metadata: {name: svc1-x, namespace: ns1, labels: {kubernetes.io/service-name: svc1}}',
    '  addressType: IPv4',
    '  endpoints: [{addresses: [10.180.0.1]}]',
    '',
  ].join('\n');
  const objs = parseManifestFile('list.yaml', text);
  assert.deepEqual([...objs.keys()], ['Service/ns1/svc1', 'EndpointSlice/ns1/svc1-x']);
  // ServiceList and friends too
  const typed = parseManifestFile('l2.yaml', 'apiVersion: v1\nkind: ServiceList\nitems:\n- {apiVersion: v1, kind: Service, metadata: {name: a}}\n');
  assert.deepEqual([...typed.keys()], ['Service/default/a']);
  assert.equal(parseManifestFile('empty.yaml', 'apiVersion: v1\nkind: List\nitems: []\n').size, 0);
});

function manifestError(fn: () => unknown): ManifestError {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof ManifestError, `want ManifestError, got ${String(e)}`);
    assert.equal(e.code, 'KPROXY_MANIFEST_INVALID');
    return e;
  }
  assert.fail('expected a ManifestError');
}

test('unsupported kinds are rejected with the line number', () => {
  const text = service('svc1', '172.30.0.41') + '---\n# a config map\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
  const e = manifestError(() => parseManifestFile('/m/mixed.yaml', text));
  const kindLine = text.split('\n').indexOf('kind: ConfigMap') + 1;
  assert.equal(e.file, '/m/mixed.yaml');
  assert.equal(e.line, kindLine);
  assert.match(e.message, new RegExp(`^KPROXY_MANIFEST_INVALID: /m/mixed\\.yaml:${kindLine}: unsupported kind "ConfigMap"`));

  const list = 'apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n- apiVersion: v1\n  kind: Secret\n  metadata: {name: b}\n';
  const le = manifestError(() => parseManifestFile('l.yaml', list));
  assert.equal(le.line, 8, 'the line of the offending List item');
  assert.match(le.message, /"Secret"/);

  const noKind = manifestError(() => parseManifestFile('k.yaml', 'apiVersion: v1\nmetadata: {name: a}\n'));
  assert.equal(noKind.line, 1);
});

test('YAML syntax errors, non-objects, missing names and duplicates are rejected with a line', () => {
  const syntax = manifestError(() => parseManifestFile('s.yaml', 'apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  labels: {x: [1, 2}\n'));
  assert.equal(syntax.line, 5);
  const scalar = manifestError(() => parseManifestFile('s.yaml', 'just a string\n'));
  assert.match(scalar.message, /Kubernetes object/);
  const noName = manifestError(() => parseManifestFile('n.yaml', 'apiVersion: v1\nkind: Service\nmetadata: {}\n'));
  assert.match(noName.message, /metadata\.name/);
  const dup = manifestError(() => parseManifestFile('d.yaml', service('a', '172.30.0.1') + '---\n' + service('a', '172.30.0.2')));
  assert.match(dup.message, /duplicate Service\/default\/a/);
  assert.equal(dup.line, service('a', '172.30.0.1').split('\n').length + 2, 'the line of the second kind:');
  // empty documents are fine
  assert.equal(parseManifestFile('e.yaml', '---\n---\n').size, 0);
});
