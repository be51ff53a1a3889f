// A Service whose names are at the API server's limits, for the kernel tests of every mode
// (test/cli/long-names-cli.test.ts; the ipvs mode's in the IPVS VM, test/ipvs/fixtures/vm-checks.ts):
// namespace, name and first port name of 63 characters (the longest DNS-1123 labels), a second
// port named "8443" (all digits, a valid DNS-1123 label), a named targetPort of 15 characters
// (IANA_SVC_NAME's limit), and its EndpointSlice.
import type { K8sEndpointSlice, K8sService } from '../../src/core/api.ts';

export const LONG_NS = 'long-namespace-' + 'n'.repeat(40) + '-0123456';
export const LONG_NAME = 'long-service-name-' + 's'.repeat(37) + '-0123456';
export const LONG_PORT_NAME = 'long-port-name-' + 'p'.repeat(40) + '-0123456';
export const DIGIT_PORT_NAME = '8443';
export const TARGET_PORT_NAME = 'http-target-abc';

export interface LongNamedOptions {
  clusterIP: string;
  endpoints: string[];
  /** the endpoints' port for the long-named port (its targetPort is TARGET_PORT_NAME) and for "8443" */
  endpointPorts: { long: number; digits: number };
  nodePorts: { long: number; digits: number };
  externalIPs?: string[];
  /** a LoadBalancer with this ingress IP, open to `sourceRanges` */
  loadBalancer?: { ip: string; sourceRanges: string[] };
  affinity?: boolean;
}

/** The Service (NodePort, or LoadBalancer) and its one EndpointSlice, as the API server stores them. */
export function longNamedService(o: LongNamedOptions): [K8sService, K8sEndpointSlice] {
  const service = {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: LONG_NS, name: LONG_NAME },
    spec: {
      type: o.loadBalancer ? 'LoadBalancer' : 'NodePort',
      clusterIP: o.clusterIP,
      clusterIPs: [o.clusterIP],
      ipFamilies: ['IPv4'],
      ...(o.externalIPs ? { externalIPs: o.externalIPs } : {}),
      ...(o.loadBalancer ? { loadBalancerSourceRanges: o.loadBalancer.sourceRanges } : {}),
      externalTrafficPolicy: 'Cluster',
      internalTrafficPolicy: 'Cluster',
      sessionAffinity: o.affinity ? 'ClientIP' : 'None',
      ports: [
        { name: LONG_PORT_NAME, protocol: 'TCP', port: 80, targetPort: TARGET_PORT_NAME, nodePort: o.nodePorts.long },
        { name: DIGIT_PORT_NAME, protocol: 'TCP', port: 8443, targetPort: o.endpointPorts.digits, nodePort: o.nodePorts.digits },
      ],
    },
    ...(o.loadBalancer ? { status: { loadBalancer: { ingress: [{ ip: o.loadBalancer.ip }] } } } : {}),
  } as K8sService;
  const slice: K8sEndpointSlice = {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { namespace: LONG_NS, name: `${LONG_NAME}-abcde`, labels: { 'kubernetes.io/service-name': LONG_NAME } },
    addressType: 'IPv4',
    ports: [
      { name: LONG_PORT_NAME, protocol: 'TCP', port: o.endpointPorts.long },
      { name: DIGIT_PORT_NAME, protocol: 'TCP', port: o.endpointPorts.digits },
    ],
    endpoints: o.endpoints.map((ip) => ({ addresses: [ip], conditions: { ready: true }, nodeName: 'other-node' })),
  };
  return [service, slice];
}
