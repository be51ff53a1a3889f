// ServicePort and Endpoint objects built directly (not through the API conversion), so
// planner tests can feed what validation at the boundary should have refused: the
// planners must be safe on their own.
import { joinHostPort } from '../../src/core/ip.ts';
import { emptyState, type Endpoint, type ProxyState, type ServicePort } from '../../src/core/model.ts';

export function port(namespace: string, name: string, portName: string, extra: Partial<ServicePort> = {}): ServicePort {
  return {
    key: `${namespace}/${name}:${portName}`,
    serviceKey: `${namespace}/${name}`,
    portName: { namespace, name, port: portName, protocol: extra.protocol ?? 'TCP' },
    protocol: extra.protocol ?? 'TCP',
    clusterIP: '172.30.0.1',
    port: 80,
    nodePort: 0,
    externalIPs: [],
    loadBalancerVIPs: [],
    loadBalancerSourceRanges: [],
    stickyMaxAgeSeconds: 0,
    externalPolicyLocal: false,
    internalPolicyLocal: false,
    healthCheckNodePort: 0,
    family: 4,
    ...extra,
  };
}

export function endpoint(ip: string, p = 8080): Endpoint {
  return { ip, port: p, key: joinHostPort(ip, p), isLocal: false, ready: true, serving: true, terminating: false, nodeName: 'node-b', zoneHints: [], nodeHints: [] };
}

export function stateOf(entries: Array<[ServicePort, Endpoint[]]>): ProxyState {
  const s = emptyState();
  for (const [sp, eps] of entries) {
    s.services.set(sp.key, sp);
    if (eps.length) s.endpoints.set(sp.key, eps);
  }
  return s;
}

/** A valid 63-character DNS label starting with `c`. */
export function label63(c: string): string {
  return (c + 'abcdefghijklmnopqrstuvwxyz0123456789'.repeat(2)).slice(0, 62) + 'z';
}
