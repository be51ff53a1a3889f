// Builders of ProxyState/PlanInput for the ipvs tests (test addresses per the project plan).
import { resolveConfig, type ProxyConfig, type RawConfig } from '../../src/config/config.ts';
import { servicePortKey, type Endpoint, type Protocol, type ServicePort } from '../../src/core/model.ts';
import { joinHostPort } from '../../src/core/ip.ts';
import type { PlanInput } from '../../src/modes/types.ts';

export function svc(name: string, clusterIP: string, port: number, opts: Partial<ServicePort> & { protocol?: Protocol; portName?: string } = {}): ServicePort {
  const protocol = opts.protocol ?? 'TCP';
  const portName = opts.portName ?? '';
  const n = { namespace: 'ns', name, port: portName };
  return {
    key: servicePortKey(n),
    serviceKey: `ns/${name}`,
    portName: { ...n, protocol },
    protocol,
    clusterIP,
    port,
    nodePort: 0,
    externalIPs: [],
    loadBalancerVIPs: [],
    loadBalancerSourceRanges: [],
    stickyMaxAgeSeconds: 0,
    externalPolicyLocal: false,
    internalPolicyLocal: false,
    healthCheckNodePort: 0,
    family: clusterIP.includes(':') ? 6 : 4,
    ...opts,
  };
}

export function ep(ip: string, port: number, opts: Partial<Endpoint> = {}): Endpoint {
  return {
    ip,
    port,
    key: joinHostPort(ip, port),
    isLocal: false,
    ready: true,
    serving: true,
    terminating: false,
    zoneHints: [],
    nodeHints: [],
    ...opts,
  };
}

export function input(entries: Array<[ServicePort, Endpoint[]]>, raw: RawConfig = {}, node: Partial<PlanInput['node']> = {}): PlanInput {
  const config: ProxyConfig = resolveConfig({ mode: 'ipvs', ...raw });
  const services = new Map<string, ServicePort>();
  const endpoints = new Map<string, Endpoint[]>();
  for (const [s, eps] of entries) {
    services.set(s.key, s);
    endpoints.set(s.key, [...eps].sort((a, b) => (a.key < b.key ? -1 : 1)));
  }
  return {
    state: { services, endpoints },
    config,
    node: { nodeName: 'node-a', nodeIPs: ['192.168.0.2'], nodeLabels: {}, family: 4, ...node },
  };
}
