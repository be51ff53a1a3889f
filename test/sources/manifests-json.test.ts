// The manifests source's JSON documents (jsonDocument): JSON.parse reads a document only where
// js-yaml, the YAML 1.2 core schema reader it stands in for, reads the same value; everywhere
// else the document goes to js-yaml (and, when that fails, to the yaml package, which names
// the line), so a JSON manifest is taken or refused exactly as before.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { load as loadYaml, CORE_SCHEMA } from 'js-yaml';
import { ManifestError, NOT_JSON, jsonDocument, parseManifestFile, parseManifestFileExact } from '../../src/sources/manifests.ts';

/** js-yaml's value of one document, or the error it throws. */
function yamlValue(doc: string): { value?: unknown; error?: string } {
  try {
    return { value: loadYaml(doc, { schema: CORE_SCHEMA }) };
  } catch (e) {
    return { error: (e as Error).message };
  }
}

const service = {
  apiVersion: 'v1',
  kind: 'Service',
  metadata: { name: 'web', namespace: 't', labels: { app: 'web' }, annotations: { note: 'a "quoted" value: \\ é 🙂' } },
  spec: { clusterIP: '172.30.0.10', ports: [{ name: 'http', port: 80, targetPort: 8080, protocol: 'TCP' }] },
};

test('a JSON document, compact or indented, is read by JSON.parse, to the value js-yaml reads', () => {
  for (const doc of [JSON.stringify(service), `---\n${JSON.stringify(service)}\n`, `--- ${JSON.stringify(service, null, 2)}\n`, `\n  ${JSON.stringify([service, 1.5e300, -2, 'x'])}\r\n`]) {
    const v = jsonDocument(doc);
    assert.notEqual(v, NOT_JSON, doc);
    assert.deepStrictEqual(v, yamlValue(doc).value);
  }
});

test('jsonDocument declines what YAML reads otherwise: a key written twice, an integer -0, a key before a line break, deep nesting, no document marker', () => {
  const declined = [
    '{"a": 1, "a": 2}', // js-yaml: duplicated mapping key; JSON.parse: 2
    '{"metadata": {"name": "a", "name": "b"}}',
    '[-0]', // YAML: 0; JSON.parse: -0
    '{"a"\n: 1}', // YAML: an implicit key is one line
    `${'['.repeat(150)}${']'.repeat(150)}`,
    '---{"a": 1}', // not a marker: a plain scalar
    '{\t"a": 1}',
    'a: 1', // YAML, not JSON
    '{"a": 1} # a comment',
    '{"a": "b\\": c"}', // an escaped quote before a colon counts as a key: declined, not misread
  ];
  for (const doc of declined) assert.equal(jsonDocument(doc), NOT_JSON, doc);
  // what YAML makes of them, where it reads them: not what JSON.parse would give
  assert.ok(yamlValue('{"a": 1, "a": 2}').error);
  assert.ok(yamlValue('{"a"\n: 1}').error);
  assert.ok(Object.is((yamlValue('[-0]').value as number[])[0], 0));
});

test('a JSON value jsonDocument takes is the value js-yaml reads (property)', () => {
  const key = fc.oneof(fc.string({ maxLength: 6 }), fc.constantFrom('a', 'kind', '__proto__', '1', '":', 'a\\'));
  const scalar = fc.oneof(fc.string({ maxLength: 8 }), fc.integer(), fc.double({ noNaN: true, noDefaultInfinity: true }), fc.boolean(), fc.constant(null));
  const value = fc.letrec((tie) => ({
    v: fc.oneof({ depthSize: 'small' }, scalar, fc.array(tie('v'), { maxLength: 4 }), fc.dictionary(key, tie('v'), { maxKeys: 4 })),
  })).v;
  let taken = 0;
  fc.assert(
    fc.property(fc.dictionary(key, value, { maxKeys: 5 }), fc.constantFrom(0, 2), fc.boolean(), (obj, indent, marker) => {
      const doc = `${marker ? '---\n' : ''}${JSON.stringify(obj, null, indent)}\n`;
      const v = jsonDocument(doc);
      const y = yamlValue(doc);
      if (v === NOT_JSON) return;
      taken++;
      assert.equal(y.error, undefined, `js-yaml refuses what JSON.parse took: ${doc}`);
      assert.deepStrictEqual(v, y.value);
    }),
    { numRuns: 500, seed: 20261206 },
  );
  assert.ok(taken > 250, `JSON.parse read ${taken} of 500 documents`);
});

test('a JSON manifest with a key written twice is refused with its line, as the YAML reader refuses it', () => {
  const text = `---\n${JSON.stringify(service)}\n---\n{"apiVersion": "v1", "kind": "Service",\n "metadata": {"name": "b", "name": "c"}}\n`;
  assert.throws(() => parseManifestFile('dup.json', text), (e: unknown) => e instanceof ManifestError && e.line === 5 && /unique|duplicate/i.test(e.reason));
  assert.throws(() => parseManifestFileExact('dup.json', text), ManifestError);
});

test('a stream of JSON documents gives the objects the YAML reader gives', () => {
  const slice = {
    apiVersion: 'discovery.k8s.io/v1', kind: 'EndpointSlice', addressType: 'IPv4',
    metadata: { name: 'web-1', namespace: 't', labels: { 'kubernetes.io/service-name': 'web' } },
    endpoints: [{ addresses: ['10.180.0.1'], conditions: { ready: true } }], ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
  };
  const noNs = { apiVersion: 'v1', kind: 'Service', metadata: { name: 'plain' }, spec: { ports: [{ port: 80 }] } };
  const text = [service, slice, noNs].map((o) => `---\n${JSON.stringify(o)}\n`).join('');
  const fast = parseManifestFile('s.json', text);
  const exact = parseManifestFileExact('s.json', text).objects;
  assert.deepEqual([...fast.keys()], ['Service/t/web', 'EndpointSlice/t/web-1', 'Service/default/plain']);
  assert.deepStrictEqual(fast, exact);
});
