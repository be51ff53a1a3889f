// `kproxy render` and `kproxy trace` on a dual-stack state, no root: render
// prints a section per family, IPv4 first, each behind its marker line and holding that
// family's payload; a single-family state prints its payload alone; trace picks the family
// from --to ('[addr]:port' for IPv6) in every mode.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { repoRoot } from '../support/netns.ts';
import { plansFromManifests } from '../../src/cli/state.ts';
import { clusterIPForFamily } from '../../src/core/convert.ts';
import { allocatorConfig } from '../../src/sources/service-alloc.ts';
import type { K8sService } from '../../src/core/api.ts';
import { resolveConfig } from '../../src/config/config.ts';

const DUAL = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec:
  clusterIP: 172.30.0.10
  clusterIPs: [172.30.0.10, "fd00:172:30::10"]
  ipFamilies: [IPv4, IPv6]
  ports: [{name: http, port: 80, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v4, namespace: t, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.180.0.1]}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-v6, namespace: t, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["fd00:10:180::1"]}]
`;
const V4_ONLY = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: t}
spec: {clusterIP: 172.30.0.10, ports: [{name: http, port: 80}]}
`;

const dual = mkdtempSync(join(tmpdir(), 'kp-rds-'));
const single = mkdtempSync(join(tmpdir(), 'kp-rds1-'));
before(() => {
  writeFileSync(join(dual, 'web.yaml'), DUAL);
  writeFileSync(join(single, 'web.yaml'), V4_ONLY);
});
after(() => {
  rmSync(dual, { recursive: true, force: true });
  rmSync(single, { recursive: true, force: true });
});

const kproxy = (args: string[]) =>
  execFileSync(process.execPath, [join(repoRoot, 'bin/kproxy.js'), ...args, '--hostname-override', 'node-a', '--nodeport-addresses', '192.168.0.0/16'], {
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: 60_000,
  });

test('plansFromManifests: one PlanInput per family the state uses, IPv4 first, each with only its family', async () => {
  const plans = await plansFromManifests(dual, resolveConfig({ mode: 'iptables' }), 'node-a', '192.168.0.2,fd00::2', () => {});
  assert.deepEqual(plans.map((p) => p.node.family), [4, 6]);
  assert.deepEqual(plans.map((p) => p.node.nodeIPs), [['192.168.0.2'], ['fd00::2']]);
  assert.deepEqual(plans.map((p) => [...p.state.services.values()].map((s) => s.clusterIP)), [['172.30.0.10'], ['fd00:172:30::10']]);
  const one = await plansFromManifests(single, resolveConfig({ mode: 'iptables' }), 'node-a', '192.168.0.2', () => {});
  assert.deepEqual(one.map((p) => p.node.family), [4]);
});

test('plansFromManifests: the IPv6 state holds the Services with an IPv6 cluster IP, given or allocated, with their IPv6 endpoints, and no IPv4-only Service', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kp-rds6-'));
  try {
    const v6only = `apiVersion: v1
kind: Service
metadata: {name: six, namespace: t}
spec: {ipFamilies: [IPv6], ipFamilyPolicy: SingleStack, ports: [{name: http, port: 81, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: six-a, namespace: t, labels: {kubernetes.io/service-name: six}}
addressType: IPv6
ports: [{name: http, port: 8081, protocol: TCP}]
endpoints: [{addresses: ["fd00:10:180::7"]}]
`;
    writeFileSync(join(dir, 'a.yaml'), `${DUAL}---\n${V4_ONLY.replace('name: web', 'name: four').replace('172.30.0.10', '172.30.0.11')}---\n${v6only}`);
    const alloc = { config: allocatorConfig('172.30.0.0/24,fd00:172:30::/112'), statePath: null };
    const plans = await plansFromManifests(dir, resolveConfig({ mode: 'iptables' }), 'node-a', '192.168.0.2,fd00::2', () => {}, undefined, alloc);
    assert.deepEqual(plans.map((p) => p.node.family), [4, 6]);
    const [v4, v6] = plans;
    assert.deepEqual([...v4.state.services.values()].map((s) => s.serviceKey).sort(), ['t/four', 't/web']);
    const six = [...v6.state.services.values()].sort((a, b) => a.serviceKey.localeCompare(b.serviceKey));
    assert.deepEqual(six.map((s) => s.serviceKey), ['t/six', 't/web']);
    assert.match(six[0].clusterIP ?? '', /^fd00:172:30::/, 'the allocated IPv6 cluster IP');
    assert.deepEqual([...v6.state.endpoints.values()].flat().map((e) => e.key).sort(), ['[fd00:10:180::1]:8080', '[fd00:10:180::7]:8081']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('clusterIPForFamily: the family\'s cluster IP, or null; an object not yet validated does not throw', () => {
  const svc = (spec: unknown) => ({ metadata: { name: 'a' }, spec }) as K8sService;
  assert.equal(clusterIPForFamily(svc({ clusterIP: '10.0.0.1', clusterIPs: ['10.0.0.1'] }), 6), null);
  assert.equal(clusterIPForFamily(svc({ clusterIP: '10.0.0.1', clusterIPs: ['10.0.0.1'] }), 4), '10.0.0.1');
  assert.equal(clusterIPForFamily(svc({ clusterIP: 'None' }), 6), null);
  assert.equal(clusterIPForFamily(svc(undefined), 6), null);
  assert.equal(clusterIPForFamily(svc({ clusterIP: '10.0.0.1', clusterIPs: ['10.0.0.1', 'fd00::1'] }), 6), 'fd00::1');
  for (const spec of [{ clusterIP: 5 }, { clusterIPs: 'fd00::1' }, { clusterIPs: [null, {}] }, { clusterIPs: { length: 2 } }]) {
    assert.equal(clusterIPForFamily(svc(spec), 6), null, JSON.stringify(spec));
  }
});

for (const mode of ['iptables', 'nftables', 'ipvs', 'userspace']) {
  test(`${mode}: render prints both families, IPv4 first; trace follows --to's family`, () => {
    const out = kproxy(['render', '--mode', mode, '--manifests', dual]);
    const sections = out.split(/^(?=# ==== kproxy IPv[46] ====$)/m);
    assert.equal(sections.length, 2, out);
    assert.match(sections[0], /^# ==== kproxy IPv4 ====\n/);
    assert.match(sections[1], /^# ==== kproxy IPv6 ====\n/);
    assert.ok(sections[0].includes('172.30.0.10') && !sections[0].includes('fd00:172:30::10'), sections[0]);
    assert.ok(sections[1].includes('fd00:172:30::10') && !sections[1].includes('172.30.0.10'), sections[1]);
    const t6 = JSON.parse(kproxy(['trace', '--mode', mode, '--manifests', dual, '--from', 'fd00:10:180::5', '--to', '[fd00:172:30::10]:80', '--json']));
    assert.equal(t6.output, '[fd00:10:180::1]:8080', JSON.stringify(t6));
  });
}

test('a single-family state renders its payload alone, with no marker', () => {
  const out = kproxy(['render', '--mode', 'iptables', '--manifests', single]);
  assert.doesNotMatch(out, /# ==== kproxy/);
  assert.match(out, /^\*filter$/m);
});

test('trace refuses --from and --to of different families', () => {
  assert.throws(
    () => kproxy(['trace', '--mode', 'iptables', '--manifests', dual, '--from', '10.180.0.5', '--to', '[fd00:172:30::10]:80']),
    (e: { stderr?: string }) => /KPROXY_TRACE_INPUT: --from 10\.180\.0\.5 and --to fd00:172:30::10 are of different IP families/.test(e.stderr ?? ''),
  );
});
