// detectLocalMode on the real kernel: the rules the iptables and nftables modes render for
// each of upstream's four detectors, IPv4 and IPv6, are accepted by iptables-restore /
// ip6tables-restore / nft inside a network namespace this test creates, and read back with the
// detector's match (`-i veth+`, `iifname "veth*"`, `-s 10.244.1.0/24` ...).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { Netns, uniqueName } from '../support/netns.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { resolveConfig, type ConfigFlags, type RawConfig } from '../../src/config/config.ts';
import { modes } from '../../src/modes/registry.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { lbStatus, makeService, makeSlice } from '../support/builders.ts';

const ns = Netns.create(uniqueName('kpt-det'));
after(async () => {
  await ns.destroy();
});

const FAM = {
  4: { clusterIP: '172.30.0.10', lb: '1.2.3.4', ep: '10.180.0.1', node: '192.168.0.2', clusterCIDR: '10.0.0.0/8', podCIDR: '10.244.1.0/24' },
  6: { clusterIP: 'fd00:172:30::10', lb: 'fd00:1:2:3::4', ep: 'fd00:10:180::1', node: 'fd00::2', clusterCIDR: 'fd00:10::/32', podCIDR: 'fd00:244:1::/64' },
} as const;

function input(family: 4 | 6, raw: RawConfig, flags: ConfigFlags): PlanInput {
  const f = FAM[family];
  const t = new ProxyStateTracker(family, 'node1', (msg) => {
    throw new Error(msg);
  });
  t.services.update(null, makeService('ns', 'web', {
    type: 'LoadBalancer',
    clusterIP: f.clusterIP,
    ipFamilies: [family === 4 ? 'IPv4' : 'IPv6'],
    externalTrafficPolicy: 'Local',
    ports: [{ name: 'p', port: 80, protocol: 'TCP', nodePort: 30080 }],
  }, lbStatus(f.lb)));
  t.endpoints.update(null, makeSlice('ns', 'web', { family, endpoints: [{ ip: f.ep, node: 'node1', ready: true }], ports: [{ name: 'p', port: 8080 }] }));
  t.apply();
  return {
    state: t.state,
    config: resolveConfig({ clusterCIDR: `${FAM[4].clusterCIDR},${FAM[6].clusterCIDR}`, ...raw }, flags),
    node: { nodeName: 'node1', nodeIPs: [f.node], nodeLabels: {}, family, podCIDRs: [FAM[4].podCIDR, FAM[6].podCIDR] },
  };
}

const DETECTORS: Array<{ name: string; raw: RawConfig; flags: ConfigFlags; ipt: (f: 4 | 6) => string; nft: (f: 4 | 6) => RegExp }> = [
  { name: 'ClusterCIDR', raw: {}, flags: {}, ipt: (f) => `! -s ${FAM[f].clusterCIDR}`, nft: (f) => new RegExp(`ip6? saddr != ${FAM[f].clusterCIDR.replace(/[.:/]/g, '\\$&')}`) },
  { name: 'NodeCIDR', raw: { detectLocalMode: 'NodeCIDR' }, flags: {}, ipt: (f) => `! -s ${FAM[f].podCIDR}`, nft: (f) => new RegExp(`ip6? saddr != ${FAM[f].podCIDR.replace(/[.:/]/g, '\\$&')}`) },
  { name: 'BridgeInterface', raw: {}, flags: { detectLocalMode: 'BridgeInterface', podBridgeInterface: 'cbr0' }, ipt: () => '! -i cbr0', nft: () => /iifname != "cbr0"/ },
  { name: 'InterfaceNamePrefix', raw: {}, flags: { detectLocalMode: 'InterfaceNamePrefix', podInterfaceNamePrefix: 'veth' }, ipt: () => '! -i veth+', nft: () => /iifname != "veth\*"/ },
];

for (const family of [4, 6] as const) {
  for (const d of DETECTORS) {
    test(`IPv${family} ${d.name}: iptables and nftables accept the detector rules`, () => {
      const inp = input(family, d.raw, d.flags);
      const restore = family === 4 ? 'iptables-restore' : 'ip6tables-restore';
      const save = family === 4 ? 'iptables-save' : 'ip6tables-save';
      ns.exec(restore, ['-w', '5'], { input: modes.iptables.render(inp) });
      const saved = ns.exec(save, ['-t', 'nat']);
      assert.ok(saved.includes(d.ipt(family)), `${save} shows ${d.ipt(family)}:\n${saved}`);
      assert.match(saved, /pod traffic for ns\/web:p external destinations/);
      ns.exec(restore, ['-w', '5'], { input: '*nat\nCOMMIT\n*filter\nCOMMIT\n' });

      const tableFamily = family === 4 ? 'ip' : 'ip6';
      ns.exec('nft', ['-f', '-'], { input: modes.nftables.render(inp) });
      const listed = ns.exec('nft', ['list', 'table', tableFamily, 'kube-proxy']);
      assert.match(listed, d.nft(family));
      assert.match(listed, /short-circuit pod traffic/);
      ns.exec('nft', ['delete', 'table', tableFamily, 'kube-proxy']);
    });
  }
}
