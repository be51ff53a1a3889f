// Which endpoints a service port uses: upstream's CategorizeEndpoints (pkg/proxy/topology.go).
// Ready endpoints first; serving-and-terminating ones only when no ready one exists; Local
// traffic policies pick node-local endpoints; topology hints (zone or node, set by the
// EndpointSlice controller for topology-aware routing and trafficDistribution) narrow the
// cluster set when every ready endpoint carries them and one matches this node. Pure.
import { LABEL_ZONE, usesClusterEndpoints, usesLocalEndpoints, type Endpoint, type ServicePort } from './model.ts';

export interface Categorized {
  clusterEndpoints: Endpoint[];
  localEndpoints: Endpoint[];
  allReachableEndpoints: Endpoint[];
  hasAnyEndpoints: boolean;
}

type TopologyMode = '' | 'node' | 'zone';

/** No endpoints: one shared frozen list (most ports have no local endpoints). */
const NONE: Endpoint[] = Object.freeze([]) as unknown as Endpoint[];

/**
 * The endpoints of a list that pass: the list itself when all do (the usual case: every
 * endpoint ready, no topology hints), else a new list at its exact length. A port's view is
 * kept between syncs, and Array.prototype.filter leaves room for 16 more elements: ~150
 * bytes per port and list at 10,000 Services. Readers never modify these lists.
 */
function keepWhere(list: Endpoint[], pass: (ep: Endpoint) => boolean): Endpoint[] {
  let n = 0;
  for (const ep of list) if (pass(ep)) n++;
  if (n === list.length) return n === 0 ? NONE : list;
  if (n === 0) return NONE;
  const out = new Array<Endpoint>(n);
  let i = 0;
  for (const ep of list) if (pass(ep)) out[i++] = ep;
  return out;
}

function topologyModeFromHints(endpoints: Endpoint[], nodeName: string, zone: string): TopologyMode {
  let hasEndpointForNode = false;
  let allHaveNodeHints = true;
  let hasEndpointForZone = false;
  let allHaveZoneHints = true;
  for (const ep of endpoints) {
    if (!ep.ready) continue;
    if (ep.nodeHints.length === 0) allHaveNodeHints = false;
    else if (ep.nodeHints.includes(nodeName)) hasEndpointForNode = true;
    if (ep.zoneHints.length === 0) allHaveZoneHints = false;
    else if (ep.zoneHints.includes(zone)) hasEndpointForZone = true;
  }
  if (allHaveNodeHints && hasEndpointForNode) return 'node';
  if (allHaveZoneHints && hasEndpointForZone) return 'zone';
  return '';
}

function availableForTopology(ep: Endpoint, mode: TopologyMode, nodeName: string, zone: string): boolean {
  if (mode === 'node') return ep.nodeHints.includes(nodeName);
  if (mode === 'zone') return ep.zoneHints.includes(zone);
  return true;
}

export function categorizeEndpoints(
  endpoints: Endpoint[],
  svc: ServicePort,
  nodeName: string,
  nodeLabels: Record<string, string> = {},
): Categorized {
  let clusterEndpoints: Endpoint[] = NONE;
  let localEndpoints: Endpoint[] = NONE;
  let hasAnyEndpoints = false;

  if (usesClusterEndpoints(svc)) {
    const zone = nodeLabels[LABEL_ZONE] ?? '';
    const mode = topologyModeFromHints(endpoints, nodeName, zone);
    clusterEndpoints = keepWhere(endpoints, (ep) => ep.ready && availableForTopology(ep, mode, nodeName, zone));
    if (clusterEndpoints.length === 0) {
      clusterEndpoints = keepWhere(endpoints, (ep) => ep.serving && ep.terminating && availableForTopology(ep, mode, nodeName, zone));
    }
    if (clusterEndpoints.length > 0) hasAnyEndpoints = true;
  }

  if (!usesLocalEndpoints(svc)) {
    return { clusterEndpoints, localEndpoints, allReachableEndpoints: clusterEndpoints, hasAnyEndpoints };
  }

  let hasLocalReady = false;
  let hasLocalServingTerminating = false;
  for (const ep of endpoints) {
    if (ep.ready) {
      hasAnyEndpoints = true;
      if (ep.isLocal) hasLocalReady = true;
    } else if (ep.serving && ep.terminating) {
      hasAnyEndpoints = true;
      if (ep.isLocal) hasLocalServingTerminating = true;
    }
  }
  if (hasLocalReady) localEndpoints = keepWhere(endpoints, (ep) => ep.isLocal && ep.ready);
  else if (hasLocalServingTerminating) localEndpoints = keepWhere(endpoints, (ep) => ep.isLocal && ep.serving && ep.terminating);

  if (!usesClusterEndpoints(svc)) {
    return { clusterEndpoints, localEndpoints, allReachableEndpoints: localEndpoints, hasAnyEndpoints };
  }
  if (localEndpoints.length === 0) {
    return { clusterEndpoints, localEndpoints, allReachableEndpoints: clusterEndpoints, hasAnyEndpoints };
  }
  const merged = new Map<string, Endpoint>();
  for (const ep of clusterEndpoints) merged.set(ep.key, ep);
  for (const ep of localEndpoints) merged.set(ep.key, ep);
  const allReachableEndpoints = [...merged.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  return { clusterEndpoints, localEndpoints, allReachableEndpoints, hasAnyEndpoints };
}
