// Every planner leaves out an address that can never be a Service VIP (loopback, unspecified,
// link-local, multicast, broadcast): a ClusterIP of 127.0.0.1 would otherwise make the
// no-endpoints reject rule (or a DNAT) match all of localhost. The API server accepts most of
// these (a ClusterIP or load-balancer IP is checked with IsValidIP only), so the Service is kept
// and only the address is dropped, with the reason and the upstream rule it passed
// (EXTRA_REFUSALS in src/core/validate.ts). Pure.
import { canonicalIP, cidrContains, parseCIDR } from './ip.ts';
import type { ServicePort } from './model.ts';

const SPECIAL: Array<{ cidr: string; reason: string }> = [
  { cidr: '0.0.0.0/8', reason: 'unspecified ("this network") address' },
  { cidr: '127.0.0.0/8', reason: 'loopback address' },
  { cidr: '169.254.0.0/16', reason: 'link-local address' },
  { cidr: '224.0.0.0/4', reason: 'multicast address' },
  { cidr: '255.255.255.255/32', reason: 'broadcast address' },
  { cidr: '::/128', reason: 'unspecified address' },
  { cidr: '::1/128', reason: 'loopback address' },
  { cidr: 'fe80::/10', reason: 'link-local address' },
  { cidr: 'ff00::/8', reason: 'multicast address' },
];

// Parsed once: this check runs for every VIP of every Service at a full sync.
const SPECIAL_PARSED = SPECIAL.map((s) => ({ cidr: parseCIDR(s.cidr)!, reason: s.reason }));

/**
 * A canonical address outside every SPECIAL range, told from its first octet or its first
 * characters (a cheap filter; false means "check the ranges"): at a full sync this runs for
 * every VIP of every Service.
 */
function surelyOrdinary(c: string): boolean {
  if (c.includes(':')) return c !== '::' && c !== '::1' && !c.startsWith('fe') && !c.startsWith('ff');
  const o = parseInt(c, 10);
  return o !== 0 && o !== 127 && o !== 169 && o < 224;
}

/** Why `ip` can never be a Service VIP, or null when it can. */
export function unsafeVIPReason(ip: string): string | null {
  const c = canonicalIP(ip);
  if (!c) return 'not an IP address';
  if (surelyOrdinary(c)) return null;
  for (const s of SPECIAL_PARSED) if (cidrContains(s.cidr, c)) return s.reason;
  return null;
}

export interface SkippedVIP {
  /** "ns/name:port" */
  servicePort: string;
  field: 'clusterIP' | 'externalIPs' | 'loadBalancerVIPs';
  ip: string;
  reason: string;
}

export interface SafePort {
  /** the port itself when nothing was dropped, else a copy without the unsafe addresses */
  sp: ServicePort;
  skipped: SkippedVIP[];
}

// The trackers replace a ServicePort whenever its Service changes: one check per object.
// A port with no unsafe VIP (nearly all) is cached as CLEAN, and its SafePort made on each
// ask: a kept object and list per port would be ~70 bytes each at 10,000 Services.
const CLEAN = 0;
const cache = new WeakMap<ServicePort, SafePort | typeof CLEAN>();
const cacheLoopbackAllowed = new WeakMap<ServicePort, SafePort | typeof CLEAN>();
const NOTHING_SKIPPED: SkippedVIP[] = Object.freeze([]) as unknown as SkippedVIP[];

export interface SafeOptions {
  /**
   * Keep loopback VIPs: the userspace proxy serves them by binding the address itself (the
   * standalone demo's ClusterIPs are 127.0.100.x), which takes nothing else from localhost.
   */
  allowLoopback?: boolean;
}

/**
 * The port without VIPs that must never match a rule. An unsafe ClusterIP becomes null
 * (the port is then planned as one without a ClusterIP); unsafe external and LB IPs are left out.
 */
export function safeServicePort(sp: ServicePort, opts: SafeOptions = {}): SafePort {
  const c = opts.allowLoopback ? cacheLoopbackAllowed : cache;
  const hit = c.get(sp);
  if (hit === CLEAN) return { sp, skipped: NOTHING_SKIPPED };
  if (hit) return hit;
  const skipped: SkippedVIP[] = [];
  const keep = (field: SkippedVIP['field'], ip: string): boolean => {
    let reason = unsafeVIPReason(ip);
    if (reason === 'loopback address' && opts.allowLoopback) reason = null;
    if (reason) skipped.push({ servicePort: sp.key, field, ip, reason });
    return reason === null;
  };
  const clusterIP = sp.clusterIP !== null && !keep('clusterIP', sp.clusterIP) ? null : sp.clusterIP;
  const externalIPs = sp.externalIPs.filter((ip) => keep('externalIPs', ip));
  const loadBalancerVIPs = sp.loadBalancerVIPs.filter((ip) => keep('loadBalancerVIPs', ip));
  if (skipped.length === 0) {
    c.set(sp, CLEAN);
    return { sp, skipped: NOTHING_SKIPPED };
  }
  const out: SafePort = { sp: { ...sp, clusterIP, externalIPs, loadBalancerVIPs }, skipped };
  c.set(sp, out);
  return out;
}

/** Every unsafe VIP of a state's ports, for the proxiers to report. */
export function skippedVIPs(services: Iterable<ServicePort>): SkippedVIP[] {
  const out: SkippedVIP[] = [];
  for (const sp of services) for (const s of safeServicePort(sp).skipped) out.push(s);
  return out;
}

/** The upstream rule each field passed: why the API server accepted an address kproxy leaves out. */
const ACCEPTED_BY: Record<SkippedVIP['field'], string> = {
  clusterIP: 'validateClusterIPs checks IsValidIP only',
  externalIPs: 'ValidateEndpointIP lets global multicast and broadcast through',
  loadBalancerVIPs: 'ValidateLoadBalancerStatus checks IsValidIP only',
};

/**
 * "ns/name:port clusterIP 127.0.0.1: loopback address; never used as a Service VIP (the API
 * server accepts it: validateClusterIPs checks IsValidIP only)"
 */
export function describeSkippedVIP(s: SkippedVIP): string {
  return `${s.servicePort} ${s.field} ${s.ip}: ${s.reason}; never used as a Service VIP (the API server accepts it: ${ACCEPTED_BY[s.field]})`;
}

/** For a planned trace: why the destination is not a VIP here, when the planner left it out. */
export function skippedVIPNotes(req: { to: string; input?: { state: { services: Map<string, ServicePort> } } }): string[] {
  if (!req.input) return [];
  const to = canonicalIP(req.to);
  return skippedVIPs(req.input.state.services.values())
    .filter((s) => s.ip === to)
    .map(describeSkippedVIP);
}
