// Synthetic cluster state for the benchmarks: N Services (ClusterIP + one NodePort each; past
// the 35,535 node ports 30000-65534, ClusterIP only; up to 131,000 ClusterIPs in 172.16.0.0/12)
// with E ready endpoints on another node, built the way kproxy builds it at run time (API
// objects → ProxyStateTracker), so the planners see exactly what a real sync would see.
// Pure: no I/O.
import { resolveConfig, type ModeName, type ProxyConfig } from '../src/config/config.ts';
import type { K8sEndpointSlice, K8sService } from '../src/core/api.ts';
import { ProxyStateTracker } from '../src/core/tracker.ts';
import { buildNodeView, type NodeContext, type NodeView, type PlanInput } from '../src/core/nodeview.ts';

export const NODE: NodeContext = {
  nodeName: 'kpb-node',
  nodeIPs: ['192.168.0.2'],
  nodeLabels: { 'kubernetes.io/hostname': 'kpb-node' },
  family: 4,
};

/**
 * ClusterIPs run from 172.30.0.1 through 172.30.255.255 and on into 172.31.0.0/16 (both inside
 * the service range 172.16.0.0/12), stopping short of 172.31.255.255, the range's broadcast
 * address: at most this many services.
 */
export const MAX_SERVICES = 131_000;
const FIRST_NODE_PORT = 30_000;

/** Every port is a valid node port up to 65535: this many services fit above 30000. */
export const MAX_NODE_PORT_SERVICES = 65_535 - FIRST_NODE_PORT;

function ipOf(base: [number, number], index: number): string {
  // base[0].base[1] + a 16-bit offset that may carry into the second octet
  const n = index;
  const b2 = base[1] + Math.floor(n / 65_536);
  return `${base[0]}.${b2}.${Math.floor(n / 256) % 256}.${n % 256}`;
}

/** ClusterIP of service i: 172.30.x.y (skipping 172.30.0.0), then 172.31.x.y from i = 65,535 */
export function clusterIPOf(i: number): string {
  return ipOf([172, 30], i + 1);
}

/** Address of endpoint j (global index): 10.180.x.y onwards, inside the pod range 10.0.0.0/8. */
export function endpointIPOf(j: number): string {
  return ipOf([10, 180], j + 1);
}

export function serviceName(i: number): string {
  return `svc-${String(i).padStart(5, '0')}`;
}

export const NAMESPACE = 'bench';

/**
 * Service i: NodePort (ClusterIP + node port 30000 + i) while node ports last, from
 * MAX_NODE_PORT_SERVICES on ClusterIP only, so
 * sizes up to MAX_SERVICES (100,000 in the largest scale run) can be built.
 */
export function serviceObject(i: number): K8sService {
  if (i >= MAX_NODE_PORT_SERVICES) {
    const s = nodePortServiceObject(i);
    return { ...s, spec: { ...s.spec!, type: 'ClusterIP', ports: s.spec!.ports!.map(({ nodePort: _, ...p }) => p) } };
  }
  return nodePortServiceObject(i);
}

function nodePortServiceObject(i: number): K8sService {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name: serviceName(i), namespace: NAMESPACE },
    spec: {
      type: 'NodePort',
      clusterIP: clusterIPOf(i),
      clusterIPs: [clusterIPOf(i)],
      ipFamilies: ['IPv4'],
      ports: [{ name: 'http', protocol: 'TCP', port: 80, targetPort: 8080, nodePort: FIRST_NODE_PORT + i }],
    },
  };
}

/**
 * The one EndpointSlice of service i with `count` endpoints. Endpoint addresses are unique
 * across the whole cluster: service i owns indexes [i*stride, i*stride+count).
 */
export function sliceObject(i: number, count: number, stride: number): K8sEndpointSlice {
  const endpoints = [];
  for (let k = 0; k < count; k++) {
    endpoints.push({
      addresses: [endpointIPOf(i * stride + k)],
      conditions: { ready: true, serving: true, terminating: false },
      nodeName: 'kpb-other-node',
    });
  }
  return {
    apiVersion: 'discovery.k8s.io/v1',
    kind: 'EndpointSlice',
    metadata: {
      name: `${serviceName(i)}-abcde`,
      namespace: NAMESPACE,
      labels: { 'kubernetes.io/service-name': serviceName(i) },
    },
    addressType: 'IPv4',
    endpoints,
    ports: [{ name: 'http', port: 8080, protocol: 'TCP' }],
  };
}

export function benchConfig(mode: ModeName): ProxyConfig {
  // A cluster CIDR makes both modes write their masquerade-for-off-cluster rules, as on a real node.
  return resolveConfig({}, { mode, clusterCidr: '10.0.0.0/8' });
}

/** A workload of N services × E endpoints, changeable one endpoint at a time. */
export class Workload {
  readonly tracker: ProxyStateTracker;
  /** every service key, "bench/svc-00000" ... */
  readonly serviceKeys: Set<string>;
  private readonly counts: number[];
  /** room for the endpoints a service may gain during a run */
  private readonly stride: number;

  constructor(
    readonly services: number,
    readonly endpointsPerService: number,
    readonly config: ProxyConfig,
    maxExtraEndpoints = 16,
  ) {
    if (services < 1 || services > MAX_SERVICES) {
      throw new Error(`KPROXY_BENCH_SIZE: ${services} services is out of range (1..${MAX_SERVICES})`);
    }
    this.stride = endpointsPerService + maxExtraEndpoints;
    // endpointIPOf carries into the second octet: 10.180.0.1 up to 10.255.255.255 (all inside the
    // pod range 10.0.0.0/8), room for 100,000 Services × (5 + 16)
    if (services * this.stride > (256 - 180) * 65_536 - 2) {
      throw new Error('KPROXY_BENCH_SIZE: too many endpoints for 10.180.0.0-10.255.255.255; lower --endpoints');
    }
    const problems: string[] = [];
    this.tracker = new ProxyStateTracker(4, NODE.nodeName, (msg, obj) => problems.push(`${obj}: ${msg}`));
    this.counts = new Array<number>(services).fill(endpointsPerService);
    for (let i = 0; i < services; i++) {
      this.tracker.services.update(null, serviceObject(i));
      this.tracker.endpoints.update(null, sliceObject(i, endpointsPerService, this.stride));
    }
    this.serviceKeys = this.tracker.apply();
    if (problems.length) throw new Error(`KPROXY_BENCH_WORKLOAD: generated objects rejected: ${problems.slice(0, 3).join('; ')}`);
  }

  /** the node view of the last input(): an incremental build starts from it */
  private lastView?: NodeView;

  /**
   * The input of a sync, with its node view computed as the sync loop computes it
   * (src/sync/controller.ts planInput): for a partial sync (`changed`, the services changed
   * since the last input) only their ports are decided again, from the last view; without it
   * (a full sync, a render) the whole view is built.
   */
  input(changed?: ReadonlySet<string>): PlanInput {
    const base = { state: this.tracker.state, config: this.config, node: NODE };
    const changes = changed && this.lastView ? { services: changed, portKeysOf: (k: string) => this.tracker.services.portKeysOf(k) } : undefined;
    const view = buildNodeView(base, changes && this.lastView, changes);
    this.lastView = view;
    return { ...base, view };
  }

  /** "ip:port" of the endpoint service i got last. */
  newestEndpoint(i: number): string {
    return `${endpointIPOf(i * this.stride + this.counts[i] - 1)}:8080`;
  }

  /** Adds one endpoint to service i; returns the changed service keys, as the sync loop would get them. */
  addEndpoint(i: number): Set<string> {
    const before = sliceObject(i, this.counts[i], this.stride);
    this.counts[i]++;
    if (this.counts[i] > this.stride) throw new Error('KPROXY_BENCH_WORKLOAD: service ran out of endpoint addresses');
    this.tracker.endpoints.update(before, sliceObject(i, this.counts[i], this.stride));
    return this.tracker.apply();
  }
}
