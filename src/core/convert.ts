// API objects (v1 Service, discovery.k8s.io/v1 EndpointSlice) → validated model.
// Nothing from an API object reaches a rule without passing through here: names that could
// break a rule, bad IPs, ports out of range and unknown protocols are reported and skipped.
// Pure: no I/O; problems go to the `report` callback.
import { flat } from './flat.ts';
import { Interner } from './intern.ts';
import { canonicalIP, ipFamily, parseCIDR, joinHostPort, type IPFamily } from './ip.ts';
import {
  PROTOCOLS,
  servicePortKey,
  serviceKey,
  LABEL_ZONE,
  type Endpoint,
  type Protocol,
  type ServicePort,
} from './model.ts';
import { unusableEndpointReason } from './validate.ts';
import {
  ANNOTATION_LAST_CHANGE_TRIGGER_TIME,
  DEFAULT_AFFINITY_TIMEOUT,
  LABEL_SERVICE_NAME,
  LABEL_SERVICE_PROXY_NAME,
  type K8sEndpointSlice,
  type K8sMeta,
  type K8sService,
  type K8sServicePort,
  type Report,
} from './api.ts';

const RFC3339 = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$/;

/**
 * A slice's last-change-trigger-time in epoch ms, or null when absent or not RFC 3339 (upstream's
 * getLastChangeTriggerTime parses it with time.RFC3339Nano and ignores a bad value).
 */
export function lastChangeTriggerTime(slice: K8sEndpointSlice): number | null {
  const v = slice.metadata?.annotations?.[ANNOTATION_LAST_CHANGE_TRIGGER_TIME];
  const m = typeof v === 'string' ? RFC3339.exec(v) : null;
  if (!m) return null;
  // Date.parse reads milliseconds only: cut the fraction to 3 digits
  const t = Date.parse(`${m[1]}${(m[2] ?? '').slice(0, 4)}${m[3]}`);
  return Number.isFinite(t) ? t : null;
}

// DNS-1123 subdomain (namespaces and names are stricter in practice; this is enough to keep
// quotes, spaces and rule syntax out of comments and set names).
const NAME_RE = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
const PORT_NAME_RE = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

export function validName(s: unknown): s is string {
  return typeof s === 'string' && NAME_RE.test(s);
}

function validPort(n: unknown): n is number {
  return typeof n === 'number' && Number.isInteger(n) && n >= 1 && n <= 65535;
}

function parseProtocol(p: unknown): Protocol | null {
  if (p === undefined || p === null || p === '') return 'TCP';
  return PROTOCOLS.includes(p as Protocol) ? (p as Protocol) : null;
}

export function objectName(o: { metadata?: K8sMeta } | undefined): string {
  return `${o?.metadata?.namespace ?? '?'}/${o?.metadata?.name ?? '?'}`;
}

/** Why a Service is not proxied at all, or null when it is. */
export function serviceSkipReason(svc: K8sService): string | null {
  const labels = svc.metadata?.labels ?? {};
  if (LABEL_SERVICE_PROXY_NAME in labels) return `labelled ${LABEL_SERVICE_PROXY_NAME}`;
  if (svc.spec?.type === 'ExternalName') return 'ExternalName service';
  const cip = svc.spec?.clusterIP;
  if (cip === undefined || cip === '' || cip === 'None') return 'headless (no cluster IP)';
  return null;
}

/**
 * The Service's cluster IP of this family, or null: the one rule by which a Service has
 * ports in a family's state (servicePortsOf). Safe on an object not yet validated.
 */
export function clusterIPForFamily(svc: K8sService, family: IPFamily): string | null {
  const ips: unknown = svc.spec?.clusterIPs;
  const candidates: unknown[] = Array.isArray(ips) && ips.length ? ips : [svc.spec?.clusterIP ?? ''];
  for (const c of candidates) {
    const ip = typeof c === 'string' ? canonicalIP(c) : null;
    if (ip && ipFamily(ip) === family) return ip;
  }
  return null;
}

/**
 * The ServicePorts of one Service for one IP family (empty when the Service is skipped or
 * has no cluster IP of that family). Invalid parts are reported and dropped.
 */
export function servicePortsOf(svc: K8sService, family: IPFamily, report: Report = () => {}): ServicePort[] {
  const who = objectName(svc);
  if (!validName(svc.metadata?.namespace) || !validName(svc.metadata?.name)) {
    report('invalid namespace or name', who);
    return [];
  }
  if (serviceSkipReason(svc)) return [];
  const spec = svc.spec ?? {};
  const rawCIP = spec.clusterIP ?? '';
  if (!canonicalIP(rawCIP) && !(spec.clusterIPs ?? []).some((c) => canonicalIP(c))) {
    report(`invalid clusterIP ${JSON.stringify(rawCIP)}`, who);
    return [];
  }
  const clusterIP = clusterIPForFamily(svc, family);
  if (!clusterIP) return [];
  const wide = serviceWideFields(svc, family, who, report);
  const type = spec.type ?? 'ClusterIP';

  const out: ServicePort[] = [];
  const seen = new Set<string>();
  const namespace = names.get(svc.metadata!.namespace!);
  const name = svc.metadata!.name!;
  const svcKey = serviceKey(namespace, name);
  for (const p of spec.ports ?? []) {
    const port = validServicePort(p, type, who, report);
    if (!port) continue;
    const key = servicePortKey({ namespace, name, port: port.portName });
    if (seen.has(key)) {
      report(`duplicate port name ${JSON.stringify(port.portName)} skipped`, who);
      continue;
    }
    seen.add(key);
    // Every field written out in one literal, in one order: V8 then gives all ServicePorts
    // one hidden class with the fields inside the object. Spreading `wide` in, or building
    // portName by spreading its parts, put fields in a separate property array and gave each
    // portName a hidden class of its own (~270 bytes more per port, measured at 10,000).
    out.push({
      key,
      serviceKey: svcKey,
      portName: { namespace, name, port: port.portName, protocol: port.protocol },
      protocol: port.protocol,
      clusterIP,
      port: port.port,
      nodePort: port.nodePort,
      targetPort: p.targetPort,
      externalIPs: wide.externalIPs,
      loadBalancerVIPs: wide.loadBalancerVIPs,
      loadBalancerSourceRanges: wide.loadBalancerSourceRanges,
      stickyMaxAgeSeconds: wide.stickyMaxAgeSeconds,
      externalPolicyLocal: wide.externalPolicyLocal,
      internalPolicyLocal: wide.internalPolicyLocal,
      healthCheckNodePort: wide.healthCheckNodePort,
      trafficDistribution: spec.trafficDistribution,
      family,
    });
  }
  return out;
}

/**
 * An empty list of names or addresses (no topology hints: nearly every endpoint; no external
 * IPs, load balancer IPs or source ranges: most Services): one shared frozen array, not one
 * per endpoint or port (50,000 endpoints × 2 and 10,000 ports × 3 at 10,000 Services).
 */
const NONE: string[] = Object.freeze([]) as unknown as string[];

/** What every port of a Service shares (addresses, policies, affinity), for one family. */
type ServiceWide = Pick<
  ServicePort,
  | 'externalIPs'
  | 'loadBalancerVIPs'
  | 'loadBalancerSourceRanges'
  | 'stickyMaxAgeSeconds'
  | 'externalPolicyLocal'
  | 'internalPolicyLocal'
  | 'healthCheckNodePort'
>;

/**
 * The Service-wide fields of its ports, read once per Service: invalid addresses and ranges
 * are reported (in this order: externalIPs, load balancer ingress, source ranges) and dropped.
 */
function serviceWideFields(svc: K8sService, family: IPFamily, who: string, report: Report): ServiceWide {
  const spec = svc.spec ?? {};
  const externalIPs = ipsOfFamily(spec.externalIPs, 'externalIP', family, who, report);
  const lbIngress = (svc.status?.loadBalancer?.ingress ?? [])
    .filter((i) => i.ip && (i.ipMode === undefined || i.ipMode === null || i.ipMode === 'VIP'))
    .map((i) => i.ip as string);
  const loadBalancerVIPs = spec.type === 'LoadBalancer' ? ipsOfFamily(lbIngress, 'load balancer ingress IP', family, who, report) : NONE;
  const sourceRanges: string[] = [];
  for (const raw of spec.loadBalancerSourceRanges ?? []) {
    const c = parseCIDR(String(raw));
    if (!c) {
      report(`invalid loadBalancerSourceRange ${JSON.stringify(raw)} ignored`, who);
      continue;
    }
    if (c.family === family && !sourceRanges.includes(c.text)) sourceRanges.push(c.text);
  }
  const type = spec.type ?? 'ClusterIP';
  const externallyAccessibleType =
    type === 'LoadBalancer' || type === 'NodePort' || ((type === 'ClusterIP' || type === '') && externalIPs.length > 0);
  const externalPolicyLocal = externallyAccessibleType && spec.externalTrafficPolicy === 'Local';
  const internalPolicyLocal = spec.internalTrafficPolicy === 'Local';
  let sticky = 0;
  if (spec.sessionAffinity === 'ClientIP') {
    const t = spec.sessionAffinityConfig?.clientIP?.timeoutSeconds;
    sticky = typeof t === 'number' && t > 0 && t <= 86400 ? Math.floor(t) : DEFAULT_AFFINITY_TIMEOUT;
  }
  const hcnp = externalPolicyLocal && validPort(spec.healthCheckNodePort) ? spec.healthCheckNodePort : 0;
  return {
    externalIPs,
    loadBalancerVIPs,
    loadBalancerSourceRanges: sourceRanges.length ? sourceRanges : NONE,
    stickyMaxAgeSeconds: sticky,
    externalPolicyLocal,
    internalPolicyLocal,
    healthCheckNodePort: hcnp,
  };
}

/** The addresses of a list in one family, canonical and without repeats; invalid ones are reported and dropped. */
function ipsOfFamily(list: string[] | undefined, what: string, family: IPFamily, who: string, report: Report): string[] {
  const out: string[] = [];
  for (const raw of list ?? []) {
    const ip = canonicalIP(String(raw));
    if (!ip) {
      report(`invalid ${what} ${JSON.stringify(raw)} ignored`, who);
      continue;
    }
    if (ipFamily(ip) === family && !out.includes(ip)) out.push(ip);
  }
  return out.length ? out : NONE;
}

/**
 * One port of a Service's spec checked (name, protocol, port; a nodePort out of range is
 * reported and ignored, one on a type without node ports is ignored), or null when it is
 * reported and skipped.
 */
function validServicePort(
  p: K8sServicePort,
  type: string,
  who: string,
  report: Report,
): { portName: string; protocol: Protocol; port: number; nodePort: number } | null {
  const portName = p.name ?? '';
  if (portName !== '' && !PORT_NAME_RE.test(portName)) {
    report(`invalid port name ${JSON.stringify(portName)} skipped`, who);
    return null;
  }
  const protocol = parseProtocol(p.protocol);
  if (!protocol) {
    report(`unknown protocol ${JSON.stringify(p.protocol)} on port ${JSON.stringify(portName)} skipped`, who);
    return null;
  }
  if (!validPort(p.port)) {
    report(`port ${JSON.stringify(p.port)} of ${JSON.stringify(portName)} out of range, skipped`, who);
    return null;
  }
  let nodePort = 0;
  if (p.nodePort !== undefined && p.nodePort !== null && p.nodePort !== 0) {
    if (!validPort(p.nodePort)) {
      report(`nodePort ${JSON.stringify(p.nodePort)} out of range, ignored`, who);
    } else if (type === 'NodePort' || type === 'LoadBalancer') {
      nodePort = p.nodePort;
    }
  }
  return { portName, protocol, port: p.port, nodePort };
}

/** Service "ns/name" an EndpointSlice belongs to, or null. */
export function sliceServiceKey(slice: K8sEndpointSlice): string | null {
  const ns = slice.metadata?.namespace;
  const svc = slice.metadata?.labels?.[LABEL_SERVICE_NAME];
  if (!validName(ns) || !validName(svc)) return null;
  return serviceKey(ns, svc);
}

/**
 * Endpoints of a set of EndpointSlices of one Service, by servicePortKey, for one family.
 * Duplicates across slices collapse as upstream (a local copy wins); lists sorted by key.
 */
export function endpointsOfSlices(
  slices: K8sEndpointSlice[],
  family: IPFamily,
  nodeName: string,
  report: Report = () => {},
): Map<string, Endpoint[]> {
  const byPort = new Map<string, Map<string, Endpoint>>();
  const sorted = [...slices].sort((a, b) => (a.metadata?.name ?? '').localeCompare(b.metadata?.name ?? ''));
  for (const slice of sorted) {
    const svcKey = sliceServiceKey(slice);
    const who = objectName(slice);
    if (!svcKey) {
      report('EndpointSlice without a valid service-name label', who);
      continue;
    }
    const wantType = family === 4 ? 'IPv4' : 'IPv6';
    if (slice.addressType !== wantType) continue;
    for (const p of slice.ports ?? []) {
      const portName = p.name ?? '';
      if (portName !== '' && !PORT_NAME_RE.test(portName)) {
        report(`invalid port name ${JSON.stringify(portName)} skipped`, who);
        continue;
      }
      if (!validPort(p.port)) {
        if (p.port !== undefined && p.port !== null) report(`port ${JSON.stringify(p.port)} out of range, skipped`, who);
        continue;
      }
      if (!parseProtocol(p.protocol)) {
        report(`unknown protocol ${JSON.stringify(p.protocol)} skipped`, who);
        continue;
      }
      const key = flat`${svcKey}:${portName}`;
      let set = byPort.get(key);
      if (!set) byPort.set(key, (set = new Map()));
      for (const ep of slice.endpoints ?? []) {
        if (!ep.addresses?.length) continue;
        const ip = canonicalIP(String(ep.addresses[0]));
        if (!ip) {
          report(`invalid endpoint address ${JSON.stringify(ep.addresses[0])} skipped`, who);
          continue;
        }
        if (ipFamily(ip) !== family) continue;
        const unusable = unusableEndpointReason(ip);
        if (unusable) {
          report(`endpoint address ${ip} is ${unusable}: the API server accepts it (ValidateEndpointIP), but no mode can forward to it; endpoint skipped`, who);
          continue;
        }
        const c = ep.conditions ?? {};
        const isLocal = !!ep.nodeName && ep.nodeName === nodeName;
        const e: Endpoint = {
          ip,
          port: p.port,
          key: joinHostPort(ip, p.port),
          isLocal,
          ready: c.ready === undefined || c.ready === null || c.ready === true,
          serving: c.serving === undefined || c.serving === null || c.serving === true,
          terminating: c.terminating === true,
          nodeName: shared(ep.nodeName),
          zone: shared(ep.zone),
          zoneHints: hintNames(ep.hints?.forZones),
          nodeHints: hintNames(ep.hints?.forNodes),
        };
        if (!set.has(e.key) || isLocal) set.set(e.key, e);
      }
    }
  }
  const out = new Map<string, Endpoint[]>();
  for (const [key, set] of byPort) {
    out.set(key, [...set.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0)));
  }
  return out;
}

// Node, zone and namespace names repeat across endpoints and Services (a few hundred nodes,
// 50,000 endpoints): the objects kept share one string per name (see Interner).
const names = new Interner();

function shared(name: string | undefined): string | undefined {
  return name === undefined ? undefined : names.get(name);
}

function hintNames(list: Array<{ name?: string | null }> | null | undefined): string[] {
  if (!list?.length) return NONE;
  return list.map((z) => z.name ?? '').filter(Boolean);
}

export { LABEL_ZONE };
