// The benchmark workload's pure parts: the one-Service payload the cold phase applies raw,
// the NodePort / ClusterIP split past the node ports, the changed Services' indexes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { getMode } from '../../src/modes/registry.ts';
import { changedServiceIndexes, oneServicePayload } from '../../bench/measure.ts';
import { benchConfig, clusterIPOf, MAX_NODE_PORT_SERVICES, MAX_SERVICES, serviceObject, sliceObject, Workload } from '../../bench/workload.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SERVICES_PER_FILE, servicesFileOf, writeManifests } from '../../bench/kproxy-run.ts';
import { MAX_MANIFEST_FILE_BYTES } from '../../src/sources/manifests.ts';

test('one-service payload holds exactly that service\'s chains', () => {
  const w = new Workload(3, 2, benchConfig('iptables'));
  const { payload, rules } = oneServicePayload(getMode('iptables').render(w.input()), clusterIPOf(1));
  const lines = payload.trim().split('\n');
  assert.equal(lines[0], '*nat');
  assert.equal(lines[lines.length - 1], 'COMMIT');
  // SVC (masq + 2 endpoint jumps), EXT (2), 2 SEPs (2 each)
  assert.equal(rules, 9);
  assert.ok(lines.filter((l) => l.startsWith('-A')).every((l) => /^-A KUBE-(SVC|EXT|SEP)-/.test(l)));
  assert.ok(payload.includes('172.30.0.2'));
  assert.ok(!payload.includes('172.30.0.1 '), 'no rule of another service');
});

test('the workload goes past the node ports: NodePort Services up to 35,535, ClusterIP only after (50,000 in the full scale run)', () => {
  const last = serviceObject(MAX_NODE_PORT_SERVICES - 1);
  assert.equal(last.spec!.type, 'NodePort');
  assert.equal(last.spec!.ports![0].nodePort, 65_534);
  const past = serviceObject(MAX_NODE_PORT_SERVICES);
  assert.equal(past.spec!.type, 'ClusterIP');
  assert.equal(past.spec!.ports![0].nodePort, undefined);
  assert.equal(past.spec!.ports![0].port, 80);
  const w = new Workload(MAX_NODE_PORT_SERVICES + 10, 1, benchConfig('iptables'));
  assert.equal(w.serviceKeys.size, MAX_NODE_PORT_SERVICES + 10, 'every Service accepted by the tracker');
  assert.throws(() => new Workload(MAX_SERVICES + 1, 1, benchConfig('iptables')), /KPROXY_BENCH_SIZE/);
});

test('changed services are distinct and in range', () => {
  const idx = changedServiceIndexes(10, 3, 2);
  assert.equal(new Set(idx).size, idx.length);
  assert.ok(idx.every((i) => i >= 0 && i < 10));
});

test('ClusterIPs past 172.30.0.0/16 go on into 172.31.0.0/16: the first 65,535 as before, each distinct, every one accepted by the tracker', () => {
  assert.equal(clusterIPOf(0), '172.30.0.1');
  assert.equal(clusterIPOf(64_999), '172.30.253.232');
  assert.equal(clusterIPOf(65_534), '172.30.255.255');
  assert.equal(clusterIPOf(65_535), '172.31.0.0');
  assert.equal(clusterIPOf(99_999), '172.31.134.160');
  assert.notEqual(clusterIPOf(MAX_SERVICES - 1), '172.31.255.255', 'not the broadcast address of 172.16.0.0/12');
  assert.ok(MAX_SERVICES >= 100_000);
  const problems: string[] = [];
  const tracker = new ProxyStateTracker(4, 'kpb-node', (msg, obj) => problems.push(`${obj}: ${msg}`));
  const picked = [65_534, 65_535, 65_536, 99_999, MAX_SERVICES - 1];
  for (const i of picked) {
    tracker.services.update(null, serviceObject(i));
    tracker.endpoints.update(null, sliceObject(i, 2, 21));
  }
  assert.equal(tracker.apply().size, picked.length);
  assert.deepEqual(problems, []);
  assert.equal(new Set([...tracker.state.services.values()].map((sp) => sp.clusterIP)).size, picked.length);
});

test('the run bench\'s manifests: Services in files of SERVICES_PER_FILE, each under the manifests source\'s limit', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpb-manifests-'));
  try {
    writeManifests(dir, SERVICES_PER_FILE + 1, 5, [3]);
    assert.deepEqual(readdirSync(dir).sort(), ['hot-svc-00003.yaml', 'services-1.yaml', 'services.yaml']);
    const first = readFileSync(join(dir, 'services.yaml'), 'utf8');
    const second = readFileSync(join(dir, 'services-1.yaml'), 'utf8');
    assert.equal(second.match(/"kind":"Service"/g)?.length, 1);
    assert.ok(second.includes(`"name":"svc-${SERVICES_PER_FILE}"`));
    assert.equal(first.match(/"kind":"Service"/g)?.length, SERVICES_PER_FILE);
    assert.equal(first.match(/"kind":"EndpointSlice"/g)?.length, SERVICES_PER_FILE - 1, 'the hot slice is in its own file');
    assert.ok(statSync(join(dir, 'services.yaml')).size < MAX_MANIFEST_FILE_BYTES / 2, 'a full file is well under the limit');
    assert.equal(servicesFileOf(99_999), 'services-4.yaml');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
