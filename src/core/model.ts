// The proxy's view of the world: service ports and their endpoints, already validated and
// canonical. Everything downstream (trackers, planners, the userspace proxy) works on
// these types, never on raw API objects. Pure: no I/O.
import { flat } from './flat.ts';

export type Protocol = 'TCP' | 'UDP' | 'SCTP';
export const PROTOCOLS: readonly Protocol[] = ['TCP', 'UDP', 'SCTP'];

/** Identity of one port of one Service: "ns/name:port" as upstream's ServicePortName.String(). */
export interface ServicePortName {
  namespace: string;
  name: string;
  /** the Service port's name ("" for a single unnamed port) */
  port: string;
  protocol: Protocol;
}

export function servicePortKey(n: { namespace: string; name: string; port: string }): string {
  return flat`${n.namespace}/${n.name}:${n.port}`;
}

/** "ns/name" of a Service. */
export function serviceKey(namespace: string, name: string): string {
  return flat`${namespace}/${name}`;
}

export interface ServicePort {
  /** servicePortKey(...): "ns/name:port" */
  key: string;
  /** "ns/name" */
  serviceKey: string;
  portName: ServicePortName;
  protocol: Protocol;
  /** canonical ClusterIP of this port's IP family, or null when the Service has none for it */
  clusterIP: string | null;
  port: number;
  /** 0 when none */
  nodePort: number;
  /** target port from the Service spec, informational (the DNAT port comes from the slice) */
  targetPort?: number | string;
  externalIPs: string[];
  /** status.loadBalancer.ingress[].ip, canonical */
  loadBalancerVIPs: string[];
  /** canonical CIDR texts */
  loadBalancerSourceRanges: string[];
  /** affinity timeout in seconds when sessionAffinity is ClientIP, else 0 */
  stickyMaxAgeSeconds: number;
  externalPolicyLocal: boolean;
  internalPolicyLocal: boolean;
  /** 0 when none; only set when externalPolicyLocal */
  healthCheckNodePort: number;
  /** spec.trafficDistribution, informational (hints on endpoints decide) */
  trafficDistribution?: string;
  /** address family of this ServicePort */
  family: 4 | 6;
}

export function externallyAccessible(sp: ServicePort): boolean {
  return sp.nodePort !== 0 || sp.loadBalancerVIPs.length > 0 || sp.externalIPs.length > 0;
}

/**
 * As upstream's UsesClusterEndpoints: internal policy Cluster, or any external access at all.
 * Even with externalTrafficPolicy Local, cluster endpoints are needed for short-circuiting
 * (pods on this node reaching an external IP / node port go to any endpoint).
 */
export function usesClusterEndpoints(sp: ServicePort): boolean {
  return !sp.internalPolicyLocal || externallyAccessible(sp);
}

export function usesLocalEndpoints(sp: ServicePort): boolean {
  return sp.internalPolicyLocal || (externallyAccessible(sp) && sp.externalPolicyLocal);
}

export interface Endpoint {
  /** canonical IP */
  ip: string;
  port: number;
  /** "ip:port" or "[ip]:port": the identity used for sorting and dedup */
  key: string;
  isLocal: boolean;
  ready: boolean;
  serving: boolean;
  terminating: boolean;
  nodeName?: string;
  zone?: string;
  zoneHints: string[];
  nodeHints: string[];
}

/** Everything a planner needs to know about the cluster for one IP family. */
export interface ProxyState {
  /** by servicePortKey */
  services: Map<string, ServicePort>;
  /** by servicePortKey; each list sorted by endpoint key, duplicates merged */
  endpoints: Map<string, Endpoint[]>;
}

export function emptyState(): ProxyState {
  return { services: new Map(), endpoints: new Map() };
}

/** Node facts that categorisation and planners need. */
export interface NodeInfo {
  name: string;
  labels: Record<string, string>;
}

export const LABEL_ZONE = 'topology.kubernetes.io/zone';
export const LABEL_HOSTNAME = 'kubernetes.io/hostname';
