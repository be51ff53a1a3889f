// The iptables and nftables modes render one node view, so their tracers must agree on every
// flow of the traffic-policy matrix: iTP × eTP × endpoint set (local+remote, remote only,
// local only, terminating only, none) for ClusterIP, NodePort, LB IP and external IP, from a
// pod on this node, from the node itself and from outside (upstream's two modes share their
// flow tables in proxier_test.go). The services come from the intent table's builders.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { resolveConfig } from '../../src/config/config.ts';
import { modes } from '../../src/modes/registry.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import type { CommandRunner } from '../../src/kernel/runner.ts';
import { FAMILIES, FRONTENDS, NODE_NAME, SOURCES, destination, serviceCases, serviceObject, sliceObject, type Family } from '../intents/table.ts';

const noRunner: CommandRunner = {
  run(cmd) {
    throw new Error(`a planned trace ran ${cmd}`);
  },
};

function planInput(family: Family, cases: ReturnType<typeof serviceCases>): PlanInput {
  const fp = FAMILIES[family];
  const t = new ProxyStateTracker(family, NODE_NAME, (msg, obj) => {
    throw new Error(`refused: ${obj}: ${msg}`);
  });
  for (const s of cases) {
    t.services.update(null, serviceObject(fp, s));
    const slice = sliceObject(fp, s);
    if (slice) t.endpoints.update(null, slice);
  }
  t.apply();
  return { state: t.state, config: resolveConfig({ clusterCIDR: fp.clusterCIDR }, {}), node: { nodeName: NODE_NAME, nodeIPs: [fp.nodeIP], nodeLabels: {}, family } };
}

for (const family of [4, 6] as const) {
  test(`IPv${family}: iptables and nftables tracers agree on the traffic-policy matrix`, async () => {
    const fp = FAMILIES[family];
    const cases = serviceCases().filter((s) => s.affinity === 'None');
    const input = planInput(family, cases);
    let flows = 0;
    const disagree: string[] = [];
    for (const s of cases) {
      for (const frontend of FRONTENDS) {
        for (const source of SOURCES) {
          const { to, port } = destination(fp, s, frontend);
          const req = { from: fp.sources[source], to, port, protocol: 'TCP' as const, input, live: false };
          const a = await modes.iptables.trace!(req, { runner: noRunner });
          const b = await modes.nftables.trace!(req, { runner: noRunner });
          flows++;
          if (a.output !== b.output || a.masq !== b.masq) {
            disagree.push(`${s.name} ${source} → ${frontend}: iptables ${JSON.stringify(a.output)} masq=${a.masq}, nftables ${JSON.stringify(b.output)} masq=${b.masq}`);
          }
        }
      }
    }
    assert.equal(flows, cases.length * 12);
    assert.deepEqual(disagree, []);
  });
}

test('eTP Local + iTP Local with only remote endpoints: pods and the node reach the cluster endpoints through the LB IP in both modes, outside is dropped', async () => {
  const fp = FAMILIES[4];
  const s = serviceCases().find((c) => c.itp === 'Local' && c.etp === 'Local' && c.endpoints === 'r' && c.affinity === 'None')!;
  const input = planInput(4, [s]);
  const { to, port } = destination(fp, s, 'loadBalancerIP');
  for (const mode of ['iptables', 'nftables'] as const) {
    const pod = await modes[mode].trace!({ from: fp.sources.pod, to, port, protocol: 'TCP', input, live: false }, { runner: noRunner });
    assert.equal(pod.output, `${fp.remoteEndpoint(s.n)}:8080`, `${mode}: pod traffic short-circuits to the cluster endpoints`);
    const node = await modes[mode].trace!({ from: fp.sources.node, to, port, protocol: 'TCP', input, live: false }, { runner: noRunner });
    assert.equal(node.output, `${fp.remoteEndpoint(s.n)}:8080`, `${mode}: node traffic too`);
    assert.equal(node.masq, true);
    const outside = await modes[mode].trace!({ from: fp.sources.outside, to, port, protocol: 'TCP', input, live: false }, { runner: noRunner });
    assert.equal(outside.output, 'DROP', `${mode}: outside traffic has no local endpoint`);
  }
});
