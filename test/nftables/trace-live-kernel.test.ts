// The nftables live trace (src/modes/nftables/index.ts traceLive) on the kernel, for each layer
// 4 protocol a Service uses: TCP, UDP and SCTP Services (ClusterIP and NodePort, one without
// endpoints) rendered by the mode and loaded with nft -f into a namespace this test creates
// (the node's address on its loopback). The live trace reads sets and maps with `nft -p`, which
// prints protocols as numbers, and names them again: each packet must be answered as the planned
// trace answers it and as the Services say (the endpoint, the masquerade, REJECT). The reads
// are counted too: the objects every walk reaches come with the base chains, a Service's
// service chain with its external chain. The namespace and the manifests are removed in `after`.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Netns, uniqueName } from '../support/netns.ts';
import { allocationConfig, effectiveConfig, resolveNodeName, type CommonOptions } from '../../src/cli/options.ts';
import { plansFromManifests } from '../../src/cli/state.ts';
import { hostRunner, type CommandRunner, inputText } from '../../src/kernel/runner.ts';
import { modes } from '../../src/modes/registry.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';

const NODE = '192.168.0.2';
const CLIENT = '203.0.113.9';
const dir = mkdtempSync(join(tmpdir(), 'kpt-ntl-'));
const ns = Netns.create(uniqueName('kpt-ntl'));

function service(name: string, ip: string, port: string, endpoint: string | null): string {
  const [protocol, p, target, nodePort] = port.split(':');
  const doc = `apiVersion: v1
kind: Service
metadata: {name: ${name}, namespace: t}
spec:
  type: ${nodePort ? 'NodePort' : 'ClusterIP'}
  clusterIP: ${ip}
  ports: [{name: p, port: ${p}, protocol: ${protocol}, targetPort: ${target}${nodePort ? `, nodePort: ${nodePort}` : ''}}]`;
  if (!endpoint) return doc;
  return `${doc}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: ${name}-a, namespace: t, labels: {kubernetes.io/service-name: ${name}}}
addressType: IPv4
endpoints: [{addresses: ["${endpoint}"], conditions: {ready: true}, nodeName: other-node}]
ports: [{name: p, port: ${target}, protocol: ${protocol}}]`;
}

let input: PlanInput;
const calls: string[] = [];
const inNs: CommandRunner = {
  run: (cmd, args, opts) => {
    calls.push([cmd, ...args].join(' ') + (opts?.input ? ` < ${inputText(opts.input).trim().split('\n').join('; ')}` : ''));
    return hostRunner.run('ip', ['netns', 'exec', ns.name, cmd, ...args], opts);
  },
};

before(async () => {
  writeFileSync(
    join(dir, 'services.yaml'),
    [
      service('web', '172.30.0.1', 'TCP:80:8080:30080', '10.180.0.1'),
      service('dns', '172.30.0.2', 'UDP:53:5353:30053', '10.180.0.2'),
      service('sig', '172.30.0.3', 'SCTP:9000:9001', '10.180.0.3'),
      service('none', '172.30.0.4', 'UDP:53:5353:30054', null),
    ].join('\n---\n') + '\n',
  );
  const o = { mode: 'nftables', manifests: dir, hostnameOverride: 'node-a', clusterCidr: '10.0.0.0/8', nodeIp: NODE } as CommonOptions;
  const cfg = effectiveConfig(o);
  [input] = await plansFromManifests(dir, cfg, resolveNodeName(cfg), o.nodeIp, () => {}, [4], { config: allocationConfig(o) });
  ns.exec('ip', ['addr', 'add', `${NODE}/32`, 'dev', 'lo']);
  ns.exec('nft', ['-f', '-'], { input: modes.nftables.render(input) });
});

after(async () => {
  await ns.destroy();
  rmSync(dir, { recursive: true, force: true });
});

const PACKETS: Array<{ name: string; to: string; port: number; protocol: 'TCP' | 'UDP' | 'SCTP'; output: string; masq: boolean; reads: number }> = [
  { name: 'TCP to a ClusterIP', to: '172.30.0.1', port: 80, protocol: 'TCP', output: '10.180.0.1:8080', masq: true, reads: 4 },
  { name: 'TCP to a NodePort', to: NODE, port: 30080, protocol: 'TCP', output: '10.180.0.1:8080', masq: true, reads: 4 },
  { name: 'UDP to a ClusterIP', to: '172.30.0.2', port: 53, protocol: 'UDP', output: '10.180.0.2:5353', masq: true, reads: 4 },
  { name: 'UDP to a NodePort', to: NODE, port: 30053, protocol: 'UDP', output: '10.180.0.2:5353', masq: true, reads: 4 },
  { name: 'SCTP to a ClusterIP', to: '172.30.0.3', port: 9000, protocol: 'SCTP', output: '10.180.0.3:9001', masq: true, reads: 4 },
  { name: 'UDP to a TCP ClusterIP port', to: '172.30.0.1', port: 80, protocol: 'UDP', output: 'REJECT', masq: false, reads: 3 },
  { name: 'UDP to a Service without endpoints', to: '172.30.0.4', port: 53, protocol: 'UDP', output: 'REJECT', masq: false, reads: 3 },
  { name: 'UDP to the NodePort of a Service without endpoints', to: NODE, port: 30054, protocol: 'UDP', output: 'REJECT', masq: false, reads: 5 },
];

for (const p of PACKETS) {
  test(`nftables trace --live, ${p.name}: as the Services say and as the planned trace`, async () => {
    const req = { from: CLIENT, to: p.to, port: p.port, protocol: p.protocol };
    const planned = await modes.nftables.trace!({ ...req, input, live: false }, { runner: hostRunner });
    calls.length = 0;
    const live = await modes.nftables.trace!({ ...req, live: true }, { runner: inNs });
    assert.deepEqual({ output: live.output, masq: live.masq }, { output: p.output, masq: p.masq }, `live: ${live.rules.join('; ')} ${(live.notes ?? []).join('; ')}`);
    assert.deepEqual({ output: planned.output, masq: planned.masq }, { output: p.output, masq: p.masq }, 'planned');
    assert.deepEqual(live.notes, planned.notes);
    // sets and maps read with numeric protocols, chains as nft prints them
    const reads = calls.filter((c) => / -i </.test(c));
    assert.ok(reads.some((c) => c.startsWith('nft -p -i <')) && reads.some((c) => c.startsWith('nft -i <')), reads.join('\n'));
    // the base chains with what every walk reaches next (two processes), then one read per step
    // deeper: a Service's external and service chains together, its endpoint's chain; the
    // reject chain; the input path's checks of a packet to the node
    assert.ok(reads.length <= p.reads, `${reads.length} nft reads:\n${reads.join('\n')}`);
  });
}
