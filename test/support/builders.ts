// API objects for tests, in the shapes the API server serves: a Service, and an EndpointSlice
// labelled with its Service's name. Test files build their own fixtures on these. Addresses
// follow the project's plan: ClusterIPs 172.30.0.0/16, endpoints 10.180.x.
import type { K8sEndpoint, K8sEndpointSlice, K8sService } from '../../src/core/api.ts';

export type ServiceSpec = NonNullable<K8sService['spec']>;

/** A Service `namespace/name`; `status` only when given. */
export function makeService(namespace: string, name: string, spec: ServiceSpec, status?: K8sService['status']): K8sService {
  return { apiVersion: 'v1', kind: 'Service', metadata: { namespace, name }, spec, ...(status ? { status } : {}) };
}

/** A Service's LoadBalancer status with these ingress IPs. */
export function lbStatus(...ips: string[]): NonNullable<K8sService['status']> {
  return { loadBalancer: { ingress: ips.map((ip) => ({ ip })) } };
}

/** The spec fields of ClientIP session affinity with this timeout. */
export function clientIPAffinity(timeoutSeconds: number): Pick<ServiceSpec, 'sessionAffinity' | 'sessionAffinityConfig'> {
  return { sessionAffinity: 'ClientIP', sessionAffinityConfig: { clientIP: { timeoutSeconds } } };
}

export interface EndpointOpts {
  ip: string;
  node?: string;
  ready?: boolean;
  serving?: boolean;
  terminating?: boolean;
}

export interface SlicePort {
  name?: string;
  port: number;
  /** TCP when not given (the API server's default). */
  protocol?: string;
}

export interface SliceOpts {
  /** The slice's own name: `<service>-1` when not given. */
  name?: string;
  family?: 4 | 6;
  endpoints: EndpointOpts[];
  ports: SlicePort[];
}

/** One endpoint: its conditions hold only the ones given (none given: no conditions). */
export function makeEndpoint(e: EndpointOpts): K8sEndpoint {
  const conditions: NonNullable<K8sEndpoint['conditions']> = {};
  if (e.ready !== undefined) conditions.ready = e.ready;
  if (e.serving !== undefined) conditions.serving = e.serving;
  if (e.terminating !== undefined) conditions.terminating = e.terminating;
  return {
    addresses: [e.ip],
    ...(e.node !== undefined ? { nodeName: e.node } : {}),
    ...(Object.keys(conditions).length ? { conditions } : {}),
  };
}

/** An EndpointSlice of Service `namespace/service`. */
export function makeSlice(namespace: string, service: string, o: SliceOpts): K8sEndpointSlice {
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: { namespace, name: o.name ?? `${service}-1`, labels: { 'kubernetes.io/service-name': service } },
    addressType: o.family === 6 ? 'IPv6' : 'IPv4',
    endpoints: o.endpoints.map(makeEndpoint),
    ports: o.ports.map((p) => ({ ...(p.name !== undefined ? { name: p.name } : {}), port: p.port, protocol: p.protocol ?? 'TCP' })),
  };
}

/** ns/svc<i>: NodePort, ClusterIP 172.30.0.<i+1>, port http 80/TCP on NodePort 30000+i; `spec` adds or replaces fields. */
export function nodePortService(i: number, spec: Partial<ServiceSpec> = {}, status?: K8sService['status']): K8sService {
  return makeService('ns', `svc${i}`, {
    type: 'NodePort',
    clusterIP: `172.30.0.${i + 1}`,
    ports: [{ name: 'http', protocol: 'TCP', port: 80, nodePort: 30000 + i }],
    ...spec,
  }, status);
}

/**
 * svc<i>'s slice ns/svc<i>-x: n ready endpoints 10.180.<i>.1…n, port http 8080/TCP;
 * `node` names the node of every endpoint, or of endpoint k (undefined: no nodeName).
 */
export function numberedSlice(i: number, n: number, node?: string | ((k: number) => string | undefined)): K8sEndpointSlice {
  const nodeOf = typeof node === 'function' ? node : () => node;
  return makeSlice('ns', `svc${i}`, {
    name: `svc${i}-x`,
    endpoints: Array.from({ length: n }, (_, k) => ({ ip: `10.180.${i}.${k + 1}`, node: nodeOf(k), ready: true })),
    ports: [{ name: 'http', port: 8080 }],
  });
}
