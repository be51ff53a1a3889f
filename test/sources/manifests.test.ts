// Unit tests for src/sources/manifests.ts on a real temporary directory: initial adds then
// onSynced, edits as (old, new), deletes, broken files reported with file and line while their
// last good content stays in force, List kinds, other kinds ignored and misspelt ones skipped with
// a warning naming their line; linear parsing that yields
// to the event loop; per-poll warnings logged once per change; the shared directory reader.
import { test, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync, renameSync, unlinkSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import pino from 'pino';
import fc from 'fast-check';
import { ManifestsSource, ManifestError, parseManifest, parseManifestFile, parseManifestFileExact, readManifestDir } from '../../src/sources/manifests.ts';
import { bigManifest } from '../support/big-manifest.ts';
import type { SourceHandler, K8sNode } from '../../src/sources/types.ts';
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';

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
  // the old object carries the identity only (SourceHandler: the source keeps digests)
  assert.deepEqual(e.oldObj, { kind: 'Service', metadata: { name: 'svc1', namespace: 'default' } });
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
  assert.deepEqual(e.oldObj, { kind: 'EndpointSlice', metadata: { name: 'svc1-x', namespace: 'default' } }, 'the identity of the last good object');
  assert.equal((e.newObj as K8sEndpointSlice).endpoints!.length, 2);
  await waitFor(() => src.health().problem === undefined, 'the problem to clear');
  assert.ok(lines.some((l) => l.level === 30 && l.file === epsFile), 'the recovery is logged');
});

test('a file that is broken from the start delivers nothing and does not block the rest', async () => {
  const dir = tempDir();
  writeFileSync(join(dir, 'a.yaml'), service('svc0', '172.30.0.40') + '---\nkind: Service\nmetadata: {}\n');
  writeFileSync(join(dir, 'b.yaml'), service('svc1', '172.30.0.41'));
  const { events, lines } = await startSource(dir);
  assert.deepEqual(events.map((x) => (x.type === 'service' ? x.new : x.type)), ['default/svc1', 'synced']);
  const line = service('svc0', '172.30.0.40').split('\n').length + 1;
  assert.ok(lines.some((l) => l.level === 50 && String(l.err).includes(`a.yaml:${line}:`) && String(l.err).includes('without metadata.name')));
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

test('other kinds are ignored; a misspelt core kind skips that object alone, with a warning naming its line', () => {
  const text = [
    service('svc1', '172.30.0.41'),
    '---\n# a config map\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n',
    '---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n',
    '---\napiVersion: v1\nkind: Servce\nmetadata: {name: typo}\nspec: {ports: [{port: 80}]}\n',
    '---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlices\nmetadata: {name: typo2}\n',
    '---\napiVersion: serving.knative.dev/v1\nkind: Service\nmetadata: {name: knative}\n',
    '---\nmetadata: {name: no-kind}\n',
    '---\n' + service('svc2', '172.30.0.42'),
  ].join('');
  const lines = text.split('\n');
  const { objects, notes } = parseManifest('/m/mixed.yaml', text);
  assert.deepEqual([...objects.keys()], ['Service/default/svc1', 'Service/default/svc2'], "another group's kind named Service is not a v1 Service");
  assert.deepEqual([...notes.ignored].sort(), ['apps/v1 Deployment', 'serving.knative.dev/v1 Service', 'v1 ConfigMap']);
  assert.deepEqual(
    notes.warnings.map((w) => [w.file, w.line, w.code]),
    [
      ['/m/mixed.yaml', lines.indexOf('kind: Servce') + 1, 'KPROXY_MANIFEST_INVALID'],
      ['/m/mixed.yaml', lines.indexOf('kind: EndpointSlices') + 1, 'KPROXY_MANIFEST_INVALID'],
      ['/m/mixed.yaml', lines.indexOf('metadata: {name: no-kind}') + 1, 'KPROXY_MANIFEST_INVALID'],
    ],
  );
  assert.match(notes.warnings[0].message, /apiVersion v1 has no kind "Servce" \(misspelt\?\); object skipped/);
  assert.match(notes.warnings[2].message, /object without kind; skipped/);

  // a List of mixed kinds: each item on its own
  const list = 'apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: a}\n- apiVersion: v1\n  kind: Secret\n  metadata: {name: b}\n- apiVersion: rbac.authorization.k8s.io/v1\n  kind: Role\n  metadata: {name: r}\n- apiVersion: v1\n  kind: Sevice\n  metadata: {name: c}\n';
  const l = parseManifest('l.yaml', list);
  assert.deepEqual([...l.objects.keys()], ['Service/default/a']);
  assert.deepEqual([...l.notes.ignored].sort(), ['rbac.authorization.k8s.io/v1 Role', 'v1 Secret']);
  assert.deepEqual(l.notes.warnings.map((w) => w.line), [14], 'the line of the misspelt List item');
  // another group's List whose items is not a list is that group's business
  assert.equal(parseManifest('o.yaml', 'apiVersion: example.com/v1\nkind: CheckList\nitems: {a: 1}\n').objects.size, 0);
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

test('wrong types in the envelope (kind, items, metadata) are ManifestErrors with a line, not crashes', () => {
  const kindNumber = parseManifest('k.yaml', 'apiVersion: v1\nkind: 5\nmetadata: {name: a}\n').notes.warnings;
  assert.deepEqual(kindNumber.map((w) => w.line), [2], 'a kind that is not a string skips that object');
  assert.match(kindNumber[0].message, /kind must be a string, got 5/);
  const items = manifestError(() => parseManifestFile('i.yaml', 'apiVersion: v1\nkind: List\nitems: 5\n'));
  assert.match(items.message, /items must be a list/);
  const meta = manifestError(() => parseManifestFile('m.yaml', 'apiVersion: v1\nkind: Service\nmetadata: "s"\n'));
  assert.match(meta.message, /metadata\.name/);
  const ns = manifestError(() => parseManifestFile('n.yaml', 'apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: [x]}\n'));
  assert.match(ns.message, /namespace must be a string/);
  // nesting deep enough to overflow the stack of either parser
  for (const deep of ['['.repeat(100_000), '{a: '.repeat(50_000), 'a:\n' + Array.from({ length: 5000 }, (_, i) => ' '.repeat(i + 1) + 'a:').join('\n')]) {
    const e = manifestError(() => parseManifestFile('deep.yaml', deep));
    assert.ok(e.line >= 1);
  }
});

// Finding each object's line by re-splitting the text from the start would make
// parsing quadratic (4 MB: 74 s, 925 MB). Compared with a 100 KB file of the same shape, 40
// times the size must take about 40 times as long; the bound leaves 4x room for a busy machine
// (the quadratic parser measured 100x already at 20 times the size). Both parsers are
// measured: good files take the fast one, a file with a problem the exact one (for its line).
test('parsing is linear in the file size, and line numbers are right at the end of a big file', { timeout: 300_000 }, () => {
  const lastDoc = '---\n# the last document\napiVersion: v1\nkind: ConfigMapp\nmetadata: {name: last}\n';
  const bigGood = bigManifest(5000);
  assert.ok(bigGood.length >= 4_000_000, `big is ${bigGood.length} bytes`);
  let lastWarnings: ManifestError[] = [];
  const timeOf = (text: string) => {
    const t0 = performance.now();
    lastWarnings = parseManifest('/m/big.yaml', text).notes.warnings;
    return performance.now() - t0;
  };
  for (const [what, small, big] of [
    ['good files', bigManifest(125), bigGood],
    ['files with a problem at the end', bigManifest(125) + lastDoc, bigGood + lastDoc],
  ] as const) {
    // warm the parser up, then take the best of several runs of each: the least disturbed by
    // other load (one run of the big file can meet a collection or a busy neighbour)
    const smallMs = Math.min(...[0, 1, 2, 3, 4, 5, 6].map(() => timeOf(small)));
    const bigMs = Math.min(...[0, 1, 2].map(() => timeOf(big)));
    assert.ok(bigMs <= 160 * smallMs, `${what}: 4 MB took ${bigMs.toFixed(0)} ms, 100 KB ${smallMs.toFixed(1)} ms: ${(bigMs / smallMs).toFixed(0)}x for 40x the size`);
  }
  assert.equal(lastWarnings.length, 1);
  assert.equal(lastWarnings[0].line, (bigGood + lastDoc).split('\n').indexOf('kind: ConfigMapp') + 1);
});

// A big file must not block the event loop for the whole parse: health checks have to answer
// while it loads. Measured relative to the load itself: the longest stall between timer ticks
// is a small part of the whole load, and timers ran many times meanwhile.
test('loading a big file yields to the event loop: timers keep running meanwhile', { timeout: 300_000 }, async () => {
  const dir = tempDir();
  writeFileSync(join(dir, 'big.yaml'), bigManifest(5000));
  const { handler, events } = recorder();
  const src = new ManifestsSource({ dir, nodeName: 'node-a', log: pino({ level: 'silent' }), pollMs: 3_600_000 });
  cleanups.push(() => src.stop());
  let ticks = 0;
  let maxGap = 0;
  let last = performance.now();
  const ticker = setInterval(() => {
    const now = performance.now();
    maxGap = Math.max(maxGap, now - last);
    last = now;
    ticks++;
  }, 1);
  cleanups.push(() => clearInterval(ticker));
  const t0 = performance.now();
  await src.start(handler);
  const total = performance.now() - t0;
  maxGap = Math.max(maxGap, performance.now() - last);
  clearInterval(ticker);
  assert.equal(events.filter((e) => e.type === 'service').length, 5000);
  assert.ok(ticks >= 10, `only ${ticks} timer ticks during a ${total.toFixed(0)} ms load`);
  assert.ok(maxGap < total / 3, `the event loop stalled ${maxGap.toFixed(0)} ms of a ${total.toFixed(0)} ms load`);
});

/** Polls until the source has completed `count` more scans (each moves health().lastContactMs). */
async function waitForScans(src: ManifestsSource, count: number): Promise<void> {
  const seen = new Set<number>([src.health().lastContactMs]);
  await waitFor(() => (seen.add(src.health().lastContactMs), seen.size > count), `${count} scans`);
}

// "defined in more than one file" was logged on every 1 s poll.
test('a duplicate across files is warned once over many polls, again only when a file changes', async () => {
  const dir = tempDir();
  writeFileSync(join(dir, 'a.yaml'), service('svc1', '172.30.0.41') + '---\n' + service('svc2', '172.30.0.42'));
  writeFileSync(join(dir, 'b.yaml'), service('svc1', '172.30.0.51') + '---\n' + service('svc2', '172.30.0.52'));
  const { src, events, lines } = await startSource(dir);
  const dupWarnings = () => lines.filter((l) => l.level === 40 && /more than one file/.test(String(l.msg)));
  await waitForScans(src, 6);
  assert.equal(dupWarnings().length, 1, 'one warning for the pair of files, over several polls');
  const w = dupWarnings()[0];
  assert.equal(w.file, 'b.yaml');
  assert.equal(w.otherFile, 'a.yaml');
  assert.equal(w.count, 2);
  const svc1 = events.find((e) => e.type === 'service' && e.new === 'default/svc1');
  assert.ok(svc1?.type === 'service' && (svc1.newObj as K8sService).spec!.clusterIP === '172.30.0.51', 'the later file wins');

  // the situation changes (b.yaml is edited, still duplicating): warned once more
  writeFileSync(join(dir, 'b.yaml'), service('svc1', '172.30.0.61') + '---\n' + service('svc2', '172.30.0.52'));
  await waitFor(() => dupWarnings().length >= 2, 'the warning after the change');
  await waitForScans(src, 6);
  assert.equal(dupWarnings().length, 2);
  // the duplicate goes away, then comes back: warned again
  writeFileSync(join(dir, 'b.yaml'), service('svc3', '172.30.0.63'));
  await waitForScans(src, 3);
  assert.equal(dupWarnings().length, 2);
  writeFileSync(join(dir, 'b.yaml'), service('svc1', '172.30.0.71'));
  await waitFor(() => dupWarnings().length >= 3, 'the warning after the duplicate came back');
});

test('an unreadable directory is logged once over many polls, and its recovery once', async () => {
  const dir = tempDir();
  const sub = join(dir, 'manifests');
  mkdirSync(sub);
  writeFileSync(join(sub, 'a.yaml'), service('svc1', '172.30.0.41'));
  const { src, events, lines } = await startSource(sub);
  events.length = 0;
  rmSync(sub, { recursive: true });
  const dirErrors = () => lines.filter((l) => l.level === 50 && /cannot read manifests directory/.test(String(l.msg)));
  await waitFor(() => dirErrors().length >= 1, 'the directory error');
  assert.match(String(dirErrors()[0].err), /^KPROXY_MANIFEST_DIR: /);
  assert.equal(src.health().connected, false);
  // no scan completes while the directory is gone, so give the 50 ms poll ample time to repeat itself
  await new Promise((r) => setTimeout(r, 600));
  assert.equal(dirErrors().length, 1, 'logged once, not on every poll');
  assert.equal(events.length, 0, 'the last good content stays in force');
  mkdirSync(sub);
  writeFileSync(join(sub, 'a.yaml'), service('svc1', '172.30.0.41'));
  await waitFor(() => src.health().connected, 'the directory to be readable again');
  assert.equal(src.health().problem, undefined);
});

test('readManifestDir: good files keep their objects, broken ones carry file:line, a FIFO never blocks', { timeout: 60_000 }, async () => {
  const dir = tempDir();
  writeFileSync(join(dir, 'a-good.yaml'), service('svc1', '172.30.0.41'));
  writeFileSync(join(dir, 'b-broken.yaml'), 'apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  labels: {x: [1, 2}\n');
  writeFileSync(join(dir, 'c-empty.yaml'), '');
  writeFileSync(join(dir, 'd-binary.yaml'), Buffer.from([0, 1, 2, 0xff, 0xfe, 10, 0x80, 0x81, 10]));
  execFileSync('mkfifo', [join(dir, 'e-fifo.yaml')]);
  const { names, read } = await readManifestDir(dir);
  assert.deepEqual(names, ['a-good.yaml', 'b-broken.yaml', 'c-empty.yaml', 'd-binary.yaml', 'e-fifo.yaml']);
  const byName = new Map(read.map((f) => [f.name, f]));
  assert.deepEqual([...byName.get('a-good.yaml')!.objects!.keys()], ['Service/default/svc1']);
  assert.equal(byName.get('b-broken.yaml')!.error!.line, 5);
  assert.ok(byName.get('b-broken.yaml')!.error!.message.includes(`${join(dir, 'b-broken.yaml')}:5:`));
  assert.equal(byName.get('c-empty.yaml')!.objects!.size, 0);
  assert.ok(byName.get('d-binary.yaml')!.error, 'a binary file is refused');
  assert.match(byName.get('e-fifo.yaml')!.error!.message, /not a regular file/);
  await assert.rejects(readManifestDir(join(dir, 'nope')), /^Error: KPROXY_MANIFEST_DIR: cannot read manifests directory .*nope/);
});

test('health() names broken files and lines, relative to the directory, without internal signatures, bounded', async () => {
  const dir = tempDir();
  writeFileSync(join(dir, 'a.yaml'), 'kind: Service\nmetadata: {}\n');
  const { src } = await startSource(dir);
  const problem = src.health().problem ?? '';
  assert.equal(problem, 'a.yaml:1: Service without metadata.name');
  for (let i = 0; i < 12; i++) writeFileSync(join(dir, `b${String(i).padStart(2, '0')}.yaml`), `kind: Service\nmetadata: {name: "${'x'.repeat(500)}", namespace: 5}\n`);
  await waitFor(() => /more broken files/.test(src.health().problem ?? ''), 'the new broken files');
  const many = src.health().problem ?? '';
  assert.match(many, /; and 3 more broken files$/);
  assert.ok(many.length < 2000, `bounded: ${many.length} characters`);
  assert.ok(!many.includes(dir), 'no absolute paths');
});

// Good files are read by js-yaml (fast), anything else by the yaml package (exact, with lines):
// both must read every good file alike, whatever YAML style it is written in.
test('the fast and the exact parser read good files alike', () => {
  const files: Record<string, string> = {
    block: service('svc1', '172.30.0.41') + '---\n' + slice('svc1-x', 'svc1', ['10.180.0.1']),
    flowAndScalars: [
      '--- # a comment on the marker',
      '{apiVersion: v1, kind: Service, metadata: {name: "q", namespace: \'ns\', labels: {a: "yes", b: no, c: ~, d: 2024-01-01, e: "0x10"}},',
      ' spec: {clusterIP: 172.30.0.9, ports: [{port: 0x50, targetPort: "8080", name: web}, {port: 0o17}, {port: 1e3}], sessionAffinity: null,',
      '  loadBalancerSourceRanges: [], externalIPs: [.inf, -.inf, true, False, 12.5, -7]}}',
      '...',
      '---',
      'apiVersion: v1',
      'kind: Node',
      'metadata:',
      '  name: node-a',
      '  annotations:',
      '    literal: |',
      '      line one',
      '        indented --- not a marker',
      '    folded: >-',
      '      folded',
      '      text',
      '    "quoted key": "tab\\tand unicode \\u00e9 \u2603"',
      '',
    ].join('\n'),
    crlf: service('svc2', '172.30.0.42').replace(/\n/g, '\r\n') + '---\r\n' + service('svc3', '172.30.0.43').replace(/\n/g, '\r\n'),
    bom: '\uFEFF' + service('svc4', '172.30.0.44'),
    json: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: [{ apiVersion: 'v1', kind: 'Service', metadata: { name: 'j' }, spec: { ports: [{ port: 80 }] } }] }),
    emptyDocs: '---\n---\n# only a comment\n---\n' + service('svc5', '172.30.0.45') + '---\n',
  };
  for (const [name, text] of Object.entries(files)) {
    const fast = parseManifestFile(name, text);
    const exact = parseManifestFileExact(name, text).objects;
    assert.ok(fast.size > 0, `${name}: some objects`);
    assert.deepEqual(fast, exact, `${name}: both parsers agree`);
  }
  const flow = parseManifestFile('f', files.flowAndScalars).get('Service/ns/q')!.obj as unknown as {
    metadata: { labels: Record<string, unknown> };
    spec: { ports: Array<{ port: unknown; targetPort: unknown }> };
  };
  assert.deepEqual(flow.metadata.labels, { a: 'yes', b: 'no', c: null, d: '2024-01-01', e: '0x10' }, 'YAML 1.2 core schema: no YAML 1.1 booleans, no timestamps');
  assert.deepEqual(flow.spec.ports.map((p) => p.port), [80, 15, 1000]);
});

test('anchors and aliases are read by the exact parser, which refuses an alias bomb', () => {
  const text = 'apiVersion: v1\nkind: Service\nmetadata: {name: a, labels: &l {app: x}, annotations: *l}\nspec: {ports: [{port: 80}]}\n';
  const svc = parseManifestFile('a.yaml', text).get('Service/default/a')!.obj as { metadata?: { annotations?: unknown } };
  assert.deepEqual(svc.metadata?.annotations, { app: 'x' });
  const levels = ['a: &a ["x","x","x","x","x","x","x","x","x","x"]'];
  for (let i = 1; i < 12; i++) levels.push(`${String.fromCharCode(97 + i)}: &${String.fromCharCode(97 + i)} [${Array(10).fill(`*${String.fromCharCode(96 + i)}`).join(',')}]`);
  const bomb = `apiVersion: v1\nkind: Service\nmetadata:\n  name: bomb\n  annotations:\n${levels.map((l) => `    ${l}`).join('\n')}\n`;
  const e = manifestError(() => parseManifestFile('bomb.yaml', bomb));
  assert.match(e.message, /alias/i);
});

// Whatever a file holds, parsing ends in objects or in a ManifestError naming file:line: never
// another exception (a TypeError from a wrong type, a ReferenceError from the alias limit), and
// every object it returns has a string kind, name and namespace.
test('fuzz: any text parses to objects or a ManifestError', { timeout: 120_000 }, () => {
  const fragments = [
    'apiVersion: v1\n', 'kind: Service\n', 'kind: List\n', 'kind: EndpointSlice\n', 'kind: Node\n', 'kind: 5\n', 'kind: [a]\n',
    'metadata: {name: a}\n', 'metadata: "s"\n', 'metadata: {name: 5, namespace: [x]}\n', 'metadata:\n  name: b\n', 'items: 5\n',
    'items:\n- kind: Service\n  metadata: {name: c}\n', 'items: [null, 1, "x"]\n', '---\n', '...\n', '- a\n', '  x: [1, 2}\n',
    'a: &x [1]\nb: *x\n', '*y\n', '%YAML 1.2\n', '!!binary aGk=\n', '"\n', '{\n', '\t\n', '\u0000', '\uFEFF', 'spec: {ports: 5}\n',
  ];
  const text = fc.oneof(
    fc.array(fc.constantFrom(...fragments), { maxLength: 12 }).map((a) => a.join('')),
    fc.string({ maxLength: 200 }),
    fc.uint8Array({ maxLength: 200 }).map((b) => Buffer.from(b).toString('utf8')),
  );
  fc.assert(
    fc.property(text, (t) => {
      let objs;
      try {
        objs = parseManifestFile('/f/x.yaml', t);
      } catch (e) {
        assert.ok(e instanceof ManifestError, `not a ManifestError for ${JSON.stringify(t)}: ${String(e)}`);
        assert.match(e.message, /^KPROXY_MANIFEST_INVALID: \/f\/x\.yaml(:\d+)?: ./);
        return;
      }
      for (const [key, { kind, obj }] of objs) {
        assert.equal(typeof obj.metadata?.name, 'string');
        assert.equal(key, `${kind}/${(obj.metadata as { namespace?: string }).namespace ?? ''}/${obj.metadata!.name}`);
      }
    }),
    { numRuns: 2000, seed: 12 },
  );
});
