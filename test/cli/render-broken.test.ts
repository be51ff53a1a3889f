// `kproxy render` and `kproxy trace` read the directory as `run` does: broken files are
// skipped with a warning naming file:line on stderr, the good files' objects are kept, kinds
// kproxy does not use are ignored, a misspelt core kind skips that object alone, one summary
// line lists what was skipped, stdout stays the pure payload, and the exit code is 0.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const repo = resolve(import.meta.dirname, '../..');
const bin = join(repo, 'bin/kproxy.js');
let dir = '';

before(() => {
  dir = mkdtempSync(join(tmpdir(), 'kpt-render-broken-'));
  writeFileSync(
    join(dir, 'a-good.yaml'),
    [
      'apiVersion: v1',
      'kind: Service',
      'metadata: {name: good, namespace: shop}',
      'spec:',
      '  clusterIP: 172.30.0.41',
      '  ports: [{name: http, port: 80, targetPort: 8080}]',
      '---',
      'apiVersion: discovery.k8s.io/v1',
      'kind: EndpointSlice',
      'metadata: {name: good-x, namespace: shop, labels: {kubernetes.io/service-name: good}}',
      'addressType: IPv4',
      'ports: [{name: http, port: 8080}]',
      'endpoints: [{addresses: [10.180.0.1]}]',
      '',
    ].join('\n'),
  );
  // broken YAML on line 5
  writeFileSync(join(dir, 'b-broken.yaml'), 'apiVersion: v1\nkind: Service\nmetadata:\n  name: bad\n  labels: {x: [1, 2}\n');
  // a good Service, a kind kproxy does not use on line 8 (ignored), a misspelt kind on line 12 (that object skipped)
  writeFileSync(
    join(dir, 'c-wrong-kind.yaml'),
    'apiVersion: v1\nkind: Service\nmetadata: {name: other}\nspec: {clusterIP: 172.30.0.42, ports: [{port: 80}]}\n---\napiVersion: apps/v1\n# a deployment\nkind: Deployment\nmetadata: {name: d}\n---\napiVersion: v1\nkind: Servise\nmetadata: {name: typo}\n',
  );
  writeFileSync(join(dir, 'd-binary.yaml'), Buffer.from([0x7f, 0x45, 0x4c, 0x46, 2, 1, 1, 0, 0, 0xff, 0xfe, 10, 0x80, 0x81, 0, 10]));
  writeFileSync(join(dir, 'e-empty.yaml'), '');
  writeFileSync(
    join(dir, 'f-good.json'),
    JSON.stringify({ apiVersion: 'v1', kind: 'Service', metadata: { name: 'second', namespace: 'shop' }, spec: { clusterIP: '172.30.0.43', ports: [{ name: 'dns', port: 53, protocol: 'UDP' }] } }),
  );
});

after(() => rmSync(dir, { recursive: true, force: true }));

function kproxy(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(process.execPath, [bin, ...args], { timeout: 120_000, env: { ...process.env, KPROXY_NO_BUNDLE: '1' }, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      const code = err ? (typeof err.code === 'number' ? err.code : -1) : 0;
      done({ code, stdout, stderr });
    });
  });
}

function assertSkipReport(stderr: string): void {
  assert.ok(stderr.includes(`${join(dir, 'b-broken.yaml')}:5:`), `b-broken.yaml:5 named in:\n${stderr}`);
  assert.ok(stderr.includes(`${join(dir, 'c-wrong-kind.yaml')}:12: apiVersion v1 has no kind "Servise"`), `c-wrong-kind.yaml:12 named in:\n${stderr}`);
  assert.doesNotMatch(stderr, /Deployment/, 'another group\'s kind is no warning');
  assert.ok(stderr.includes(`${join(dir, 'd-binary.yaml')}:`), `d-binary.yaml named in:\n${stderr}`);
  assert.doesNotMatch(stderr, /e-empty\.yaml/, 'an empty file is not a problem');
  const summary = stderr.split('\n').filter((l) => l.startsWith('kproxy: skipped '));
  assert.equal(summary.length, 1, `one summary line in:\n${stderr}`);
  assert.match(summary[0], /^kproxy: skipped 2 files, 1 object: b-broken\.yaml:5, d-binary\.yaml(:\d+)?, c-wrong-kind\.yaml:12$/);
}

test('render skips broken files, keeps the good ones, names file:line on stderr, exits 0', { timeout: 180_000 }, async () => {
  const r = await kproxy(['render', '--mode', 'iptables', '--manifests', dir, '--node-ip', '192.168.0.2']);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /^\*filter$/m, 'stdout is the iptables-restore payload');
  assert.match(r.stdout, /-A KUBE-SERVICES -m comment --comment "shop\/good:http cluster IP" .*-d 172\.30\.0\.41 --dport 80 /);
  assert.match(r.stdout, /--comment shop\/good:http -m tcp -p tcp -j DNAT --to-destination 10\.180\.0\.1:8080/);
  assert.match(r.stdout, /shop\/second:dns/, 'the good JSON file is kept');
  assert.doesNotMatch(r.stdout, /kproxy:|warning/, 'nothing but the payload on stdout');
  assert.match(r.stdout, /-d 172\.30\.0\.42 --dport 80 /, 'the file with other kinds keeps its Service, as `run` keeps it');
  assertSkipReport(r.stderr);
});

test('trace over a directory with broken files traces the good Services, exits 0', { timeout: 180_000 }, async () => {
  const r = await kproxy(['trace', '--mode', 'iptables', '--manifests', dir, '--node-ip', '192.168.0.2', '--from', '10.0.0.5', '--to', '172.30.0.41:80', '--json']);
  assert.equal(r.code, 0, r.stderr);
  const out = JSON.parse(r.stdout) as { output: string };
  assert.equal(out.output, '10.180.0.1:8080');
  assertSkipReport(r.stderr);
});

test('a missing directory is still an error with a code, exit 1', { timeout: 180_000 }, async () => {
  const r = await kproxy(['render', '--mode', 'iptables', '--manifests', join(dir, 'nope'), '--node-ip', '192.168.0.2']);
  assert.equal(r.code, 1);
  assert.match(r.stderr, /^kproxy: KPROXY_MANIFEST_DIR: cannot read manifests directory .*nope.*; check --manifests$/m);
  assert.equal(r.stdout, '');
});
