// Small builders of API objects and plan inputs for the iptables tests.
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';
import { ProxyStateTracker } from '../../src/core/tracker.ts';
import { resolveConfig, type ProxyConfig } from '../../src/config/config.ts';
import type { PlanInput } from '../../src/core/nodeview.ts';
import { clientIPAffinity, lbStatus, makeService, makeSlice } from '../support/builders.ts';

export interface SvcOpts {
  clusterIP: string;
  port?: number;
  portName?: string;
  protocol?: string;
  type?: string;
  nodePort?: number;
  externalIPs?: string[];
  lbIPs?: string[];
  sourceRanges?: string[];
  etp?: 'Local' | 'Cluster';
  affinitySeconds?: number;
  extraPorts?: Array<{ name: string; port: number; protocol?: string; nodePort?: number }>;
}

export function svc(ns: string, name: string, o: SvcOpts): K8sService {
  return makeService(ns, name, {
    type: o.type ?? 'ClusterIP',
    clusterIP: o.clusterIP,
    ports: [
      { name: o.portName ?? 'p80', port: o.port ?? 80, protocol: o.protocol ?? 'TCP', nodePort: o.nodePort },
      ...(o.extraPorts ?? []),
    ],
    externalIPs: o.externalIPs,
    loadBalancerSourceRanges: o.sourceRanges,
    externalTrafficPolicy: o.etp,
    ...(o.affinitySeconds ? clientIPAffinity(o.affinitySeconds) : {}),
  }, o.lbIPs ? lbStatus(...o.lbIPs) : undefined);
}

export interface EpOpts {
  ip: string;
  nodeName?: string;
  ready?: boolean;
}

export function slice(ns: string, svcName: string, sliceName: string, eps: EpOpts[], ports: Array<{ name?: string; port: number; protocol?: string }>, family: 4 | 6 = 4): K8sEndpointSlice {
  return makeSlice(ns, svcName, {
    name: sliceName,
    family,
    endpoints: eps.map((e) => ({ ip: e.ip, node: e.nodeName, ready: e.ready === false ? false : undefined })),
    ports: ports.map((p) => ({ name: p.name ?? 'p80', port: p.port, protocol: p.protocol })),
  });
}

export function tracker(family: 4 | 6 = 4, nodeName = 'test-node'): ProxyStateTracker {
  return new ProxyStateTracker(family, nodeName);
}

export function testConfig(over: Partial<ProxyConfig> = {}): ProxyConfig {
  return { ...resolveConfig({ mode: 'iptables', clusterCIDR: '10.0.0.0/8' }), ...over };
}

export function planInput(t: ProxyStateTracker, config: ProxyConfig = testConfig(), family: 4 | 6 = 4, nodeIPs = ['192.168.0.2']): PlanInput {
  return { state: t.state, config, node: { nodeName: 'test-node', nodeIPs, nodeLabels: {}, family } };
}

/** Two ClusterIP services: ns1/svc1 with one endpoint, ns2/svc2 with two (not applied yet). */
export function twoServices(): ProxyStateTracker {
  const t = tracker();
  t.services.update(null, svc('ns1', 'svc1', { clusterIP: '172.30.0.41' }));
  t.endpoints.update(null, slice('ns1', 'svc1', 's1', [{ ip: '10.0.1.1' }], [{ port: 80 }]));
  t.services.update(null, svc('ns2', 'svc2', { clusterIP: '172.30.0.42' }));
  t.endpoints.update(null, slice('ns2', 'svc2', 's2', [{ ip: '10.0.2.1' }, { ip: '10.0.2.2' }], [{ port: 80 }]));
  return t;
}
