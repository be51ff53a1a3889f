// The manifests source keeps a digest of each object's JSON text between scans (memory: a
// parsed object graph takes several times its text, and the text itself 25 MiB at 10,000
// Services). What the handler needs must not change: the old object of an update or delete
// names the object delivered before (kind, name, namespace: SourceHandler), values JSON
// cannot carry (.inf, .nan) survive, and an edit that changes nothing is not delivered.
import { test } from 'node:test';
import { createHash } from 'node:crypto';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { silentLogger } from '../../src/log.ts';
import { identityObject, ManifestsSource, restoreObject, storeObject } from '../../src/sources/manifests.ts';
import type { SourceHandler } from '../../src/sources/types.ts';

// each Service its own cluster IP: two Services with one address are refused as the API server refuses them
const svc = (name: string, port: string) => `---
apiVersion: v1
kind: Service
metadata: {name: ${name}, namespace: default, labels: {a: "1"}}
spec: {type: ClusterIP, clusterIP: 172.30.0.${10 + [...name].reduce((n, c) => n + c.charCodeAt(0), 0) % 200}, ports: [{name: http, protocol: TCP, port: ${port}, targetPort: 8080}]}
`;

function recorder() {
  const events: Array<{ old: unknown; new: unknown }> = [];
  const handler: SourceHandler = {
    onService: (o, n) => void events.push({ old: o, new: n }),
    onEndpointSlice: (o, n) => void events.push({ old: o, new: n }),
    onSynced: () => {},
  };
  return { events, handler };
}

function write(dir: string, name: string, text: string): void {
  const tmp = join(dir, `.tmp-${name}`);
  writeFileSync(tmp, text);
  renameSync(tmp, join(dir, name));
}

test('store/restore: JSON text round-trips until it is dropped; the digest stays; non-finite numbers are kept as parsed', () => {
  const o = { apiVersion: 'v1', kind: 'Service', metadata: { name: 'a', namespace: 'default' }, spec: { ports: [{ port: 80 }] } };
  const s = storeObject('Service', o as never);
  assert.equal(typeof s.text, 'string');
  assert.equal(s.obj, undefined);
  assert.deepEqual(restoreObject(s), o);
  assert.equal(s.digest, storeObject('Service', structuredClone(o) as never).digest, 'equal objects, equal digests');
  assert.notEqual(s.digest, storeObject('Service', { ...o, spec: { ports: [{ port: 81 }] } } as never).digest);
  // the first 128 bits of the text's sha256, one Latin-1 character per byte (a 16-character string kept per object)
  assert.equal(s.digest, createHash('sha256').update(s.text!).digest().subarray(0, 16).toString('latin1'));
  assert.equal(s.digest!.length, 16);
  assert.deepEqual(identityObject('Service/default/a', 'Service'), { kind: 'Service', metadata: { name: 'a', namespace: 'default' } });
  assert.deepEqual(identityObject('Node//n1', 'Node'), { kind: 'Node', metadata: { name: 'n1' } });
  const inf = { ...o, spec: { ports: [{ port: Number.POSITIVE_INFINITY }] } };
  const t = storeObject('Service', inf as never);
  assert.equal(t.text, undefined);
  assert.equal((restoreObject(t) as unknown as typeof inf).spec.ports[0].port, Number.POSITIVE_INFINITY);
});

test('the old object of an update and of a delete names the object delivered before', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-compact-'));
  const src = new ManifestsSource({ dir, nodeName: 'n', log: silentLogger(), pollMs: 3_600_000 });
  try {
    write(dir, 'a.yaml', svc('web', '80') + svc('inf', '.inf'));
    const { events, handler } = recorder();
    await src.start(handler);
    assert.equal(events.length, 2);
    const firstWeb = events.find((e) => (e.new as { metadata: { name: string } }).metadata.name === 'web')!.new;
    const firstInf = events.find((e) => (e.new as { metadata: { name: string } }).metadata.name === 'inf')!.new;
    assert.equal((firstInf as { spec: { ports: Array<{ port: number }> } }).spec.ports[0].port, Number.POSITIVE_INFINITY);

    // same content, rewritten: nothing to deliver
    write(dir, 'a.yaml', svc('web', '80') + svc('inf', '.inf'));
    await src.scan();
    assert.equal(events.length, 2);

    write(dir, 'a.yaml', svc('web', '81') + svc('inf', '.inf'));
    await src.scan();
    assert.equal(events.length, 3);
    const webId = { kind: 'Service', metadata: { name: 'web', namespace: 'default' } };
    assert.deepEqual(events[2].old, webId, 'the identity of the object delivered before');
    assert.equal((firstWeb as { metadata: { name: string } }).metadata.name, 'web');
    assert.equal((events[2].new as { spec: { ports: Array<{ port: number }> } }).spec.ports[0].port, 81);
    const secondWeb = events[2].new;

    write(dir, 'a.yaml', '');
    await src.scan();
    assert.equal(events.length, 5);
    const deletes = events.slice(3);
    assert.ok(deletes.every((e) => e.new === null));
    // .inf cannot be a digest of JSON text: that object is kept whole, and handed over whole
    assert.deepEqual(deletes.map((e) => e.old).sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b))),
      [firstInf, webId].sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b))));
    assert.equal((secondWeb as { metadata: { name: string } }).metadata.name, 'web');
  } finally {
    await src.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an object another file overrode wins again when that file goes: delivered with its own content', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-compact-'));
  const src = new ManifestsSource({ dir, nodeName: 'n', log: silentLogger(), pollMs: 3_600_000 });
  const port = (e: { new: unknown }) => (e.new as { spec: { ports: Array<{ port: number }> } } | null)?.spec.ports[0].port;
  try {
    write(dir, 'a.yaml', svc('web', '80'));
    const { events, handler } = recorder();
    await src.start(handler);
    assert.deepEqual(events.map(port), [80]);
    write(dir, 'b.yaml', svc('web', '90'));
    await src.scan();
    assert.deepEqual(events.map(port), [80, 90], 'the later file wins');
    rmSync(join(dir, 'b.yaml'));
    await src.scan();
    assert.deepEqual(events.map(port), [80, 90, 80], 'a.yaml wins again, read again for its content');
    assert.deepEqual(events[2].old, { kind: 'Service', metadata: { name: 'web', namespace: 'default' } });
    await src.scan();
    assert.equal(events.length, 3, 'and nothing more');
  } finally {
    await src.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('delivering many objects to a slow handler gives timers a turn', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-compact-'));
  const src = new ManifestsSource({ dir, nodeName: 'n', log: silentLogger(), pollMs: 3_600_000 });
  try {
    const n = 200;
    let text = '';
    for (let i = 0; i < n; i++) text += svc(`s${i}`, '80').replace(/clusterIP: [0-9.]+/, `clusterIP: 172.30.${i >> 8}.${(i & 255) + 1}`);
    write(dir, 'many.yaml', text);
    let delivered = 0;
    let deliveredAtFirstTick = -1;
    // a handler that takes 1 ms per object (validation of a big object on a loaded node)
    const busy = () => {
      const end = performance.now() + 1;
      while (performance.now() < end);
      delivered++;
    };
    const timer = setInterval(() => {
      if (deliveredAtFirstTick < 0 && delivered > 0) deliveredAtFirstTick = delivered;
    }, 1);
    try {
      await src.start({ onService: busy, onEndpointSlice: busy, onSynced: () => {} });
    } finally {
      clearInterval(timer);
    }
    assert.equal(delivered, n);
    assert.ok(deliveredAtFirstTick > 0 && deliveredAtFirstTick < n, `a timer ran during the delivery (first tick after ${deliveredAtFirstTick} of ${n})`);
  } finally {
    await src.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
