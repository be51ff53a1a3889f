// `kproxy trace --live` against `kproxy trace --manifests` (the planned rules) on the real
// kernel, at a size where the nftables mode spreads the Services over several tables: 1,100
// dual-stack Services (one endpoint per family on another node; Service 7 without endpoints),
// rendered with `kproxy render` and loaded with nft -f / iptables-restore / ip6tables-restore
// into a namespace this test creates (the node's addresses on its loopback), then a few
// packets of each family traced both ways: `kproxy trace --live` through the CLI in the
// namespace, the planned trace as `kproxy trace --manifests` computes it (its state read
// once per mode and family, in this process): the same output (endpoints or REJECT) and
// masquerade. The live traces read only what their walk reaches (nftables: the objects,
// src/modes/nftables/index.ts traceLive; iptables on nf_tables: the chains,
// src/modes/iptables/trace-live.ts), so a table or chain not read shows here as a wrong verdict. The namespace and the manifests are removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { Netns, repoRoot, uniqueName } from '../support/netns.ts';
import { allocationConfig, effectiveConfig, resolveNodeName, type CommonOptions } from '../../src/cli/options.ts';
import { plansFromManifests } from '../../src/cli/state.ts';
import { canonicalIP } from '../../src/core/ip.ts';
import { hostRunner, type CommandRunner } from '../../src/kernel/runner.ts';
import { modes } from '../../src/modes/registry.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import type { ModeName } from '../../src/config/config.ts';

const N = 1_100;
const NO_ENDPOINTS = 7;
const NODE = { 4: '192.168.0.2', 6: 'fd00::2' };
const CLIENT = { 4: '203.0.113.9', 6: 'fd00:203::9' };
const dir = mkdtempSync(join(tmpdir(), 'kpt-trl-'));
const ns = Netns.create(uniqueName('kpt-trl'));

const clusterIP = (i: number) => ({ 4: `172.30.${i >> 8}.${(i & 255) + 1}`, 6: `fd00:30::${(i + 1).toString(16)}` });
const endpoint = (i: number) => ({ 4: `10.180.${i >> 8}.${(i & 255) + 1}`, 6: `fd00:180::${(i + 1).toString(16)}` });

function manifests(): string {
  const docs: string[] = [];
  for (let i = 0; i < N; i++) {
    const ip = clusterIP(i);
    docs.push(`apiVersion: v1
kind: Service
metadata: {name: s${i}, namespace: t}
spec:
  type: NodePort
  ipFamilyPolicy: RequireDualStack
  ipFamilies: [IPv4, IPv6]
  clusterIP: ${ip[4]}
  clusterIPs: [${ip[4]}, "${ip[6]}"]
  ports: [{name: http, port: 80, protocol: TCP, targetPort: 8080, nodePort: ${30000 + i}}]`);
    if (i === NO_ENDPOINTS) continue;
    for (const f of [4, 6] as const) {
      docs.push(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: s${i}-v${f}, namespace: t, labels: {kubernetes.io/service-name: s${i}}}
addressType: IPv${f}
endpoints: [{addresses: ["${endpoint(i)[f]}"], conditions: {ready: true}, nodeName: other-node}]
ports: [{name: http, port: 8080, protocol: TCP}]`);
    }
  }
  return docs.join('\n---\n') + '\n';
}

function kproxy(args: string[], inNs = false): string {
  const cmd = [process.execPath, resolve(repoRoot, 'bin/kproxy.js'), ...args];
  const r = inNs ? spawnSync('ip', ['netns', 'exec', ns.name, ...cmd], { encoding: 'utf8', maxBuffer: 1 << 28, timeout: 120_000 }) : spawnSync(cmd[0], cmd.slice(1), { encoding: 'utf8', maxBuffer: 1 << 28, timeout: 120_000 });
  assert.equal(r.status, 0, `kproxy ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

const common = ['--manifests', dir, '--hostname-override', 'node-a', '--cluster-cidr', '10.0.0.0/8,fd00:180::/64', '--node-ip', `${NODE[4]},${NODE[6]}`];

/** `kproxy render` split at its family markers: [IPv4 payload, IPv6 payload]. */
function renderFamilies(mode: string): { 4: string; 6: string } {
  const text = kproxy(['render', '--mode', mode, ...common]);
  const at6 = text.indexOf('# ==== kproxy IPv6 ====');
  assert.ok(text.startsWith('# ==== kproxy IPv4 ====') && at6 > 0, 'a dual-stack render has a section per family');
  return { 4: text.slice(0, at6), 6: text.slice(at6) };
}

interface Answer {
  output: string;
  masq: boolean;
}

function traceLive(mode: ModeName, f: 4 | 6, to: string): Answer {
  const r = JSON.parse(kproxy(['trace', '--mode', mode, '--from', CLIENT[f], '--to', to, '--json', '--live'], true)) as Answer;
  return { output: r.output, masq: r.masq };
}

/** `kproxy trace --manifests` without the process: traceCommand's planned path, the state read once per mode. */
async function planner(mode: ModeName): Promise<(f: 4 | 6, to: string) => Promise<Answer>> {
  const o = { mode, manifests: dir, hostnameOverride: 'node-a', clusterCidr: '10.0.0.0/8,fd00:180::/64', nodeIp: `${NODE[4]},${NODE[6]}` } as CommonOptions;
  const cfg = effectiveConfig(o);
  const inputs = await plansFromManifests(dir, cfg, resolveNodeName(cfg), o.nodeIp, () => {}, [4, 6], { config: allocationConfig(o) });
  const byFamily = new Map<number, PlanInput>(inputs.map((i) => [i.node.family, i]));
  return async (f, to) => {
    const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(to)!;
    const r = await modes[mode].trace!({ from: CLIENT[f], to: canonicalIP(m[1])!, port: Number(m[2]), protocol: 'TCP', input: byFamily.get(f), live: false }, { runner: hostRunner });
    return { output: r.output, masq: r.masq };
  };
}

/** Packets of family f: ClusterIP and NodePort of the last Service, the no-endpoint Service's NodePort, a Service in the first table. */
function packets(f: 4 | 6): Array<{ to: string; want: Answer }> {
  const host = (ip: string) => (f === 6 ? `[${ip}]` : ip);
  const last = N - 1;
  const ep = (i: number) => `${host(endpoint(i)[f])}:8080`;
  return [
    { to: `${host(clusterIP(last)[f])}:80`, want: { output: ep(last), masq: true } },
    { to: `${host(NODE[f])}:${30000 + last}`, want: { output: ep(last), masq: true } },
    { to: `${host(NODE[f])}:${30000 + NO_ENDPOINTS}`, want: { output: 'REJECT', masq: false } },
    { to: `${host(clusterIP(3)[f])}:80`, want: { output: ep(3), masq: true } },
  ];
}

before(() => {
  writeFileSync(join(dir, 'services.yaml'), manifests());
  ns.exec('ip', ['addr', 'add', `${NODE[4]}/32`, 'dev', 'lo']);
  ns.exec('ip', ['addr', 'add', `${NODE[6]}/128`, 'dev', 'lo', 'nodad']);
});

after(async () => {
  await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

test('nftables at 1,100 Services (several tables per family): trace --live answers as the planned trace, IPv4 and IPv6', async () => {
  const text = renderFamilies('nftables');
  for (const f of [4, 6] as const) assert.match(text[f], new RegExp(`^add table ${f === 4 ? 'ip' : 'ip6'} kube-proxy-1 `, 'm'), `IPv${f}: several tables`);
  ns.exec('nft', ['-f', '-'], { input: text[4] + text[6] });
  try {
    const planned = await planner('nftables');
    for (const f of [4, 6] as const) {
      for (const { to, want } of packets(f)) {
        const p = await planned(f, to);
        assert.deepEqual(p, want, `planned ${to}`);
        assert.deepEqual(traceLive('nftables', f, to), p, `live ${to}`);
      }
    }
  } finally {
    for (const f of ['ip', 'ip6']) for (let i = 0; i < 16; i++) ns.exec('nft', ['delete', 'table', f, `kube-proxy-${i}`], { allowFail: true });
  }
});

test('iptables at 1,100 Services: trace --live answers as the planned trace, IPv4 and IPv6', async () => {
  const text = renderFamilies('iptables');
  ns.exec('iptables-restore', ['-w', '5'], { input: text[4] });
  ns.exec('ip6tables-restore', ['-w', '5'], { input: text[6] });
  const planned = await planner('iptables');
  for (const f of [4, 6] as const) {
    for (const { to, want } of packets(f)) {
      const p = await planned(f, to);
      assert.deepEqual(p, want, `planned ${to}`);
      assert.deepEqual(traceLive('iptables', f, to), p, `live ${to}`);
    }
  }
  // on the nf_tables backend the live trace reads the chains its walk reaches, never the whole ruleset
  const calls: string[] = [];
  const inNs: CommandRunner = {
    run: (cmd, args, opts) => {
      calls.push([cmd, ...args].join(' '));
      return hostRunner.run('ip', ['netns', 'exec', ns.name, cmd, ...args], opts);
    },
  };
  const last = N - 1;
  const r = await modes.iptables.trace!({ from: CLIENT[4], to: clusterIP(last)[4], port: 80, protocol: 'TCP', live: true }, { runner: inNs });
  assert.deepEqual({ output: r.output, masq: r.masq }, { output: `${endpoint(last)[4]}:8080`, masq: true });
  const listed = calls.filter((c) => / -S /.test(c));
  assert.ok(!calls.some((c) => /^iptables-save/.test(c)), `no iptables-save: ${calls.join('; ')}`);
  assert.ok(listed.some((c) => c.endsWith('-t nat -S KUBE-SERVICES')) && listed.some((c) => /-t nat -S KUBE-SEP-/.test(c)), listed.join('; '));
  assert.ok(listed.length < 20, `${listed.length} chains read of ${2 * N + 10}: ${listed.join('; ')}`);
});
