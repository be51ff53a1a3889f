// The shapes of the Kubernetes API objects kproxy reads (v1 Service, discovery.k8s.io/v1
// EndpointSlice), the names of the labels and annotations it reads, and where problems with
// them are reported. Types and constants only: every layer may import them.

export type ObjectKind = 'Service' | 'EndpointSlice' | 'Node';

export interface InvalidDetail {
  kind: ObjectKind;
  /** field path */
  field: string;
  value: string;
}

// Minimal shapes of the API objects we read. Objects from YAML and from client-node both fit.
export interface K8sMeta {
  name?: string;
  namespace?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  resourceVersion?: string;
  uid?: string;
}
export interface K8sServicePort {
  name?: string;
  protocol?: string;
  port?: number;
  targetPort?: number | string;
  nodePort?: number;
}
export interface K8sService {
  apiVersion?: string;
  kind?: string;
  metadata?: K8sMeta;
  spec?: {
    type?: string;
    clusterIP?: string;
    clusterIPs?: string[];
    ports?: K8sServicePort[];
    externalIPs?: string[];
    loadBalancerSourceRanges?: string[];
    sessionAffinity?: string;
    sessionAffinityConfig?: { clientIP?: { timeoutSeconds?: number } };
    externalTrafficPolicy?: string;
    internalTrafficPolicy?: string;
    healthCheckNodePort?: number;
    trafficDistribution?: string;
    ipFamilies?: string[];
  };
  status?: { loadBalancer?: { ingress?: Array<{ ip?: string; hostname?: string; ipMode?: string }> } };
}
export interface K8sEndpoint {
  addresses?: string[];
  conditions?: { ready?: boolean | null; serving?: boolean | null; terminating?: boolean | null };
  nodeName?: string;
  zone?: string;
  hints?: { forZones?: Array<{ name?: string }>; forNodes?: Array<{ name?: string }> };
}
export interface K8sEndpointSlice {
  apiVersion?: string;
  kind?: string;
  metadata?: K8sMeta;
  addressType?: string;
  endpoints?: K8sEndpoint[] | null;
  ports?: Array<{ name?: string; port?: number; protocol?: string }> | null;
}

/**
 * Where problems go. `detail` is set for objects refused at the boundary (src/core/validate.ts):
 * which kind, which field, which value.
 */
export type Report = (msg: string, obj: string, detail?: InvalidDetail) => void;

export const LABEL_SERVICE_PROXY_NAME = 'service.kubernetes.io/service-proxy-name';
export const LABEL_SERVICE_NAME = 'kubernetes.io/service-name';
export const DEFAULT_AFFINITY_TIMEOUT = 10800;
/** set by the EndpointSlice controller: when the change this slice carries was triggered */
export const ANNOTATION_LAST_CHANGE_TRIGGER_TIME = 'endpoints.kubernetes.io/last-change-trigger-time';

