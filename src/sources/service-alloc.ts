// What the API server does to a Service before anyone else sees it, for the manifests source:
// real manifests carry no spec.clusterIP, no nodePort and no healthCheckNodePort, because
// kube-apiserver allocates them. Pure: no I/O (the state file is read and written beside the
// manifests source, src/sources/allocation-state.ts).
//
// Upstream, each rule cited where it is applied:
// - kube-apiserver --service-cluster-ip-range (one CIDR, or two of different families for
//   dual-stack; default 10.0.0.0/24, DefaultServiceIPCIDR) and --service-node-port-range
//   (default 30000-32767; k8s.io/apimachinery/pkg/util/net PortRange syntax);
// - pkg/registry/core/service/ipallocator (NewIPAllocator, bitmap.go New): never the network
//   address, never the IPv4 broadcast; the first address is the `kubernetes` Service's
//   (controlplane's ServiceIPRange: GetIndexedIP(range, 1)), so dynamic allocation skips it;
//   KEP-3070 calculateRangeOffset: dynamic allocation prefers the upper band of the range and
//   falls back to the lower one, which static choices are more likely to use;
// - pkg/registry/core/service/portallocator: one pool for every protocol, the same two bands
//   (calculateRangeOffset with min 16, max 128, step 32);
// - pkg/registry/core/service/storage/alloc.go: initIPFamilyFields (families and policy),
//   allocClusterIPs, initNodePorts (ports of one Service with the same port number share a
//   node port), shouldAllocateNodePorts (allocateLoadBalancerNodePorts), allocHealthCheckNodePort
//   (apiservice.NeedsHealthCheck: LoadBalancer with externalTrafficPolicy Local), and
//   storage.go patchAllocatedValues (an update without the values keeps the old ones: node
//   ports matched by port name).
//
// Where kproxy is more lenient than the API server (it is never stricter): a Service whose
// clusterIPs are all given passes as it is, whatever its families and ranges (explicit
// addresses outside the configured ranges are kept: manifests written for another cluster still
// work); explicit node ports outside the node port range are kept; an edit may change a
// clusterIP (the API server calls it immutable). Collisions are refused as the API server
// refuses them: an address or port already held by another Service. A value a Service held
// and its manifest no longer gives is kept (patchAllocatedValues) while the range could have
// handed it out: a value from outside the ranges (given by an older manifest, or held before
// the ranges changed) is replaced by an allocated one.
//
// Determinism: the first candidate of a dynamic allocation comes from a hash of the Service's
// namespace/name and the slot (family, port name), then the band is probed upward. The same
// directory therefore allocates the same way without any saved state, and a Service's values do
// not depend on the order it is seen in; the state file keeps them stable across edits of
// others (a probe that skipped a held address) and restarts.
import { createHash } from 'node:crypto';
import type { K8sService, K8sServicePort } from '../core/api.ts';
import { bigIntToIP, canonicalIP, ipFamily, ipToBigInt, parseCIDR, type IPFamily } from '../core/ip.ts';

/** kube-apiserver's DefaultServiceIPCIDR */
export const DEFAULT_SERVICE_CLUSTER_IP_RANGE = '10.0.0.0/24';
/** kube-apiserver's DefaultServiceNodePortRange */
export const DEFAULT_SERVICE_NODE_PORT_RANGE = '30000-32767';

export interface ServiceIPRange {
  /** canonical "ip/prefix" */
  cidr: string;
  family: IPFamily;
  /** the network address + 1: the `kubernetes` Service's, never handed out dynamically */
  first: bigint;
  /** the last address handed out: the broadcast - 1 (IPv4), the last address (IPv6) */
  last: bigint;
  /** KEP-3070: [first, first + offset) is the lower band, used only once the upper one is full */
  offset: bigint;
}

export interface NodePortRange {
  base: number;
  size: number;
  /** KEP-3668: [base, base + offset) is the lower band */
  offset: number;
  /** "base-last", as PortRange.String */
  text: string;
}

export interface AllocatorConfig {
  /** one range, or two of different families (the first is the default family) */
  ipRanges: ServiceIPRange[];
  nodePorts: NodePortRange;
}

/** What one Service holds: its cluster IPs, node ports by port name, health check node port. */
export interface Holding {
  clusterIPs?: string[];
  nodePorts?: Record<string, number>;
  healthCheckNodePort?: number;
}

/** What the state file keeps: the holdings of every Service, by "namespace/name". */
export interface AllocationState {
  services: Record<string, Holding>;
}

/** Why a Service was refused: the field, and the API server's words. */
export interface Refusal {
  field: string;
  reason: string;
}

/** The values a Service got from kproxy (not from its manifest), for status and /debug/state. */
export type AllocatedValues = Holding;

export interface AllocationReport {
  serviceClusterIPRange: string[];
  serviceNodePortRange: string;
  /** Services with allocated values, by "namespace/name", sorted */
  allocated: Array<{ service: string } & AllocatedValues>;
  /** Services refused (an address or port already held, a range full, a family not configured), sorted */
  refused: Array<{ service: string } & Refusal>;
}

/**
 * The values the API server would have set on a Service; empty when the manifest gave them
 * all. applyPatch() fills them into the manifest's object.
 */
export interface ServicePatch {
  clusterIPs?: string[];
  ipFamilies?: string[];
  ipFamilyPolicy?: string;
  /** [index in spec.ports, node port] */
  nodePorts?: Array<[number, number]>;
  healthCheckNodePort?: number;
}

/**
 * The result for one Service: `patch` says what to fill in before it is delivered; null when
 * the Service was deleted, or refused (then `refusal` says why).
 */
export interface Outcome {
  key: string;
  patch: ServicePatch | null;
  refusal?: Refusal;
}

/** The manifest's Service with the patch's values (a copy; the manifest's object is left as it is). */
export function applyPatch(svc: K8sService, patch: ServicePatch): K8sService {
  if (!patch.clusterIPs && !patch.nodePorts && patch.healthCheckNodePort === undefined) return svc;
  const spec = { ...(svc.spec as Spec) };
  if (patch.clusterIPs) {
    spec.clusterIP = patch.clusterIPs[0];
    spec.clusterIPs = patch.clusterIPs;
    spec.ipFamilies = patch.ipFamilies;
    spec.ipFamilyPolicy = patch.ipFamilyPolicy;
  }
  if (patch.nodePorts) {
    const ports = [...(spec.ports ?? [])];
    for (const [i, nodePort] of patch.nodePorts) ports[i] = { ...ports[i], nodePort };
    spec.ports = ports;
  }
  if (patch.healthCheckNodePort !== undefined) spec.healthCheckNodePort = patch.healthCheckNodePort;
  return { ...svc, spec };
}

/** Gives the manifest's object of a refused Service again, when a freed value lets it be tried again. */
export type ServiceLoader = (key: string) => K8sService | null | undefined;

// ---- the flags ------------------------------------------------------------------------------

/** min(max($min, size/$step), $max), 0 for a range of $min or fewer (ipallocator and portallocator's calculateRangeOffset) */
function rangeOffset(size: bigint, min: bigint, max: bigint, step: bigint): bigint {
  if (size <= min) return 0n;
  const o = size / step;
  return o < min ? min : o > max ? max : o;
}

/**
 * --service-cluster-ip-range, as kube-apiserver reads and validates it (validateClusterIPFlags;
 * NewIPAllocator's /64 limit for IPv6). Throws an Error whose message names the problem.
 */
export function parseServiceClusterIPRange(text: string): ServiceIPRange[] {
  const parts = text.split(',').map((s) => s.trim());
  if (text.trim() === '') throw new Error('must contain at least one valid cidr');
  if (parts.length > 2) throw new Error('must not contain more than two entries');
  const ranges = parts.map((p) => {
    const c = parseCIDR(p);
    if (!c) throw new Error(`${JSON.stringify(p)} is not a valid CIDR`);
    if (c.family === 6 && c.prefix < 64) throw new Error(`shortest allowed prefix length for service CIDR is 64, got ${c.prefix}`);
    const bits = c.family === 4 ? 32 : 128;
    const size = 1n << BigInt(bits - c.prefix);
    const network = ipToBigInt(c.ip);
    return {
      cidr: c.text,
      family: c.family,
      first: network + 1n,
      last: c.family === 4 ? network + size - 2n : network + size - 1n,
      offset: rangeOffset(size, 16n, 256n, 16n),
    };
  });
  if (ranges.length === 2 && ranges[0].family === ranges[1].family) {
    throw new Error('--service-cluster-ip-range[0] and --service-cluster-ip-range[1] must be of different IP family');
  }
  return ranges;
}

/** --service-node-port-range: "min-max", "min+offset" or "port" (PortRange.Set). Throws an Error. */
export function parseServiceNodePortRange(text: string): NodePortRange {
  const v = text.trim();
  const atoi = (s: string) => {
    if (!/^[+-]?[0-9]+$/.test(s)) throw new Error(`unable to parse port range: ${JSON.stringify(text)}`);
    return Number(s);
  };
  const hyphen = v.indexOf('-');
  const plus = v.indexOf('+');
  let low: number;
  let high: number;
  if (v === '') throw new Error('empty port range');
  if (hyphen >= 0 && plus >= 0) throw new Error(`unable to parse port range: ${v}`);
  if (hyphen >= 0) {
    low = atoi(v.slice(0, hyphen));
    high = atoi(v.slice(hyphen + 1));
  } else if (plus >= 0) {
    low = atoi(v.slice(0, plus));
    high = low + atoi(v.slice(plus + 1));
  } else {
    low = high = atoi(v);
  }
  if (low > 65535 || high > 65535) throw new Error(`the port range cannot be greater than 65535: ${v}`);
  if (high < low) throw new Error(`end port cannot be less than start port: ${v}`);
  if (low < 0) throw new Error(`unable to parse port range: ${v}`);
  const size = high - low + 1;
  return { base: low, size, offset: Number(rangeOffset(BigInt(size), 16n, 128n, 32n)), text: `${low}-${high}` };
}

export function allocatorConfig(ipRange = DEFAULT_SERVICE_CLUSTER_IP_RANGE, nodePortRange = DEFAULT_SERVICE_NODE_PORT_RANGE): AllocatorConfig {
  return { ipRanges: parseServiceClusterIPRange(ipRange), nodePorts: parseServiceNodePortRange(nodePortRange) };
}

// ---- planning one Service --------------------------------------------------------------------

/** The Service fields read here that kproxy's own API shape does not name. */
type Spec = NonNullable<K8sService['spec']> & {
  ipFamilyPolicy?: unknown;
  allocateLoadBalancerNodePorts?: unknown;
};

interface Slot<T> {
  /** what the manifest says */
  explicit?: T;
  /** what the Service held before (patchAllocatedValues) */
  prior?: T;
  /** what it gets */
  value?: T;
  /** the value was allocated here (not the manifest's) */
  allocated?: boolean;
}

interface IPSlot extends Slot<string> {
  family: IPFamily;
}

interface PortSlot extends Slot<number> {
  index: number;
  name: string;
  port: unknown;
  /** a node port is handed out when none is given or held (shouldAllocateNodePorts) */
  allocate: boolean;
}

interface Plan {
  key: string;
  /** null: the clusterIP fields are left as they are (all given, headless, ExternalName, or malformed for validation to refuse) */
  ips: IPSlot[] | null;
  /** what the Service held before this batch */
  prior: Holding | undefined;
  /** the explicit addresses when ips is null: held, for collisions */
  heldIPs: string[];
  /** the addresses the Service held before */
  priorIPs: string[];
  /** what this batch marked as the Service's in the index (released again if it is refused) */
  claimedIPs: string[];
  claimedPorts: number[];
  policy: string;
  ports: PortSlot[];
  hc: Slot<number> | null;
  refusal?: Refusal;
}

const FAMILY_NAME: Record<IPFamily, string> = { 4: 'IPv4', 6: 'IPv6' };
const isPort = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= 1 && v <= 65535;
/** a held node port is kept while the range could have handed it out */
const inPortRange = (v: unknown, cfg: AllocatorConfig): v is number => isPort(v) && v >= cfg.nodePorts.base && v < cfg.nodePorts.base + cfg.nodePorts.size;

function plan(key: string, svc: K8sService, prior: Holding | undefined, cfg: AllocatorConfig): Plan {
  const priorIPs = (prior?.clusterIPs ?? []).map((ip) => canonicalIP(ip)).filter((ip): ip is string => !!ip);
  const p: Plan = { key, prior, ips: null, heldIPs: [], priorIPs, claimedIPs: [], claimedPorts: [], policy: 'SingleStack', ports: [], hc: null };
  const spec = svc.spec as Spec | undefined;
  if (typeof spec !== 'object' || spec === null || Array.isArray(spec)) return p;
  const type = spec.type ?? 'ClusterIP';
  if (type === 'ExternalName') return p; // allocClusterIPs: ExternalName gets nothing
  planIPs(p, spec, cfg);
  if (p.refusal) return p;
  // needsNodePort: NodePort and LoadBalancer; shouldAllocateNodePorts: not a LoadBalancer with
  // allocateLoadBalancerNodePorts false (given node ports are still respected)
  if ((type === 'NodePort' || type === 'LoadBalancer') && Array.isArray(spec.ports)) {
    const allocate = type === 'NodePort' || spec.allocateLoadBalancerNodePorts !== false;
    spec.ports.forEach((port: K8sServicePort, index) => {
      if (typeof port !== 'object' || port === null) return;
      const name = typeof port.name === 'string' ? port.name : '';
      if (port.nodePort !== undefined && port.nodePort !== null && port.nodePort !== 0 && !isPort(port.nodePort)) return; // validation refuses it
      const given = isPort(port.nodePort) ? port.nodePort : undefined;
      const held = prior?.nodePorts?.[name];
      p.ports.push({ index, name, port: port.port, explicit: given, prior: inPortRange(held, cfg) ? held : undefined, allocate });
    });
  }
  // apiservice.NeedsHealthCheck
  if (type === 'LoadBalancer' && spec.externalTrafficPolicy === 'Local') {
    const hc = spec.healthCheckNodePort;
    if (hc === undefined || hc === null || hc === 0 || isPort(hc)) {
      p.hc = { explicit: isPort(hc) ? hc : undefined, prior: inPortRange(prior?.healthCheckNodePort, cfg) ? prior.healthCheckNodePort : undefined };
    }
  }
  return p;
}

/** initIPFamilyFields, for a create: which families the Service gets, and which of them need an address. */
function planIPs(p: Plan, spec: Spec, cfg: AllocatorConfig): void {
  const given = Array.isArray(spec.clusterIPs) && spec.clusterIPs.length > 0 ? spec.clusterIPs : typeof spec.clusterIP === 'string' && spec.clusterIP !== '' ? [spec.clusterIP] : [];
  if (given[0] === 'None' || spec.clusterIP === 'None') return; // headless: no address
  if (!given.every((ip) => typeof ip === 'string' && canonicalIP(ip))) return; // validation refuses it
  const ips = given.map((ip) => canonicalIP(ip as string)!);
  p.heldIPs = ips;
  const policy = typeof spec.ipFamilyPolicy === 'string' && spec.ipFamilyPolicy !== '' ? spec.ipFamilyPolicy : 'SingleStack';
  p.policy = policy;
  const families: IPFamily[] = [];
  if (Array.isArray(spec.ipFamilies)) {
    for (const f of spec.ipFamilies) {
      if (f === 'IPv4') families.push(4);
      else if (f === 'IPv6') families.push(6);
      else return; // validation refuses it
    }
  }
  // infer the families of the given addresses
  for (let i = families.length; i < ips.length; i++) families.push(ipFamily(ips[i])!);
  if (families.length === 0) families.push(cfg.ipRanges[0].family);
  if (policy !== 'SingleStack' && families.length === 1 && cfg.ipRanges.length === 2) families.push(families[0] === 4 ? 6 : 4);
  if (ips.length >= families.length) return; // every address given: nothing to allocate
  if (families.length > 2 || new Set(families).size !== families.length) return; // validation refuses it
  if (ips.some((ip, i) => ipFamily(ip) !== families[i])) return; // validation refuses it
  if (policy === 'SingleStack' && families.length === 2) {
    p.refusal = { field: 'spec.ipFamilyPolicy', reason: "must be 'RequireDualStack' or 'PreferDualStack' when multiple IP families are specified" };
    return;
  }
  if (policy === 'RequireDualStack' && cfg.ipRanges.length < 2) {
    p.refusal = { field: 'spec.ipFamilyPolicy', reason: 'this cluster is not configured for dual-stack services (give two ranges to --service-cluster-ip-range)' };
    return;
  }
  const slots: IPSlot[] = [];
  for (const [i, family] of families.entries()) {
    if (i < ips.length) {
      slots.push({ family, explicit: ips[i] });
      continue;
    }
    if (!cfg.ipRanges.some((r) => r.family === family)) {
      p.refusal = { field: `spec.ipFamilies[${i}]`, reason: `${FAMILY_NAME[family]} not configured on this cluster (see --service-cluster-ip-range)` };
      return;
    }
    // a held address is kept while the range could have handed it out (not after a change of
    // --service-cluster-ip-range, nor an address the manifest used to give outside the range)
    const r = cfg.ipRanges.find((x) => x.family === family)!;
    const held = p.priorIPs.find((ip) => ipFamily(ip) === family && ipToBigInt(ip) > r.first && ipToBigInt(ip) <= r.last);
    slots.push({ family, prior: held });
  }
  p.ips = slots;
}

// ---- the allocator ---------------------------------------------------------------------------

/** Runs a step generator to its end. */
function drive<T>(steps: Generator<void, T, undefined>): T {
  for (;;) {
    const r = steps.next();
    if (r.done) return r.value;
  }
}

/** 64 bits of sha256(key, slot): the first candidate of a dynamic allocation. */
function candidateBits(key: string, slot: string, word = 0): bigint {
  return createHash('sha256').update(`${key}\u0000${slot}`).digest().readBigUInt64BE(word * 8);
}

/** The first v in [lo, hi], from start upward and wrapping, for which free(v); null when none. */
function probe(lo: bigint, hi: bigint, start: bigint, free: (v: bigint) => boolean): bigint | null {
  if (hi < lo) return null;
  const n = hi - lo + 1n;
  let v = start;
  for (let i = 0n; i < n; i++) {
    if (free(v)) return v;
    v = v === hi ? lo : v + 1n;
  }
  return null;
}

/** Upper band first, then lower (allocateNextService), each from a hashed start. */
function allocateInBands(first: bigint, last: bigint, offset: bigint, key: string, slot: string, free: (v: bigint) => boolean): bigint | null {
  const upperLo = first + offset;
  if (upperLo <= last) {
    const v = probe(upperLo, last, upperLo + (candidateBits(key, slot) % (last - upperLo + 1n)), free);
    if (v !== null) return v;
  }
  const lowerHi = (upperLo <= last ? upperLo : last + 1n) - 1n;
  if (first <= lowerHi) return probe(first, lowerHi, first + (candidateBits(key, slot, 1) % (lowerHi - first + 1n)), free);
  return null;
}

const heldBy = (owner: string) => ` (held by Service ${owner})`;

/** Whether a slot keeps the value it held: it held one, and the manifest gives that value or none. */
function kept<T>(s: Slot<T>): boolean {
  return s.prior !== undefined && (s.explicit === undefined || s.explicit === s.prior);
}

/**
 * The holdings of every Service, as the API server's allocators keep them, and the Services
 * refused for a collision or a full range (tried again whenever an address or port is freed).
 * apply() takes changes in batches: within a batch, what a Service held before is kept first,
 * then the addresses and ports manifests ask for are claimed (a collision with a holder is
 * refused), then the rest is allocated, each step in namespace/name order.
 */
export class ServiceAllocator {
  private readonly holdings = new Map<string, Holding>();
  private readonly ipOwner = new Map<string, string>();
  private readonly portOwner = new Map<number, string>();
  private readonly allocated = new Map<string, AllocatedValues>();
  private readonly refused = new Map<string, Refusal>();
  /** holdings read from the state file whose Services have not been seen yet */
  private readonly dormant = new Set<string>();
  /** bumped on every change of the holdings (the state file is written when it moved) */
  version = 0;

  /**
   * loader gives a refused Service's object again for a retry (the manifests source keeps
   * the text of refused Services only; without it a refused Service waits for its next change)
   */
  constructor(
    readonly config: AllocatorConfig,
    persisted?: AllocationState,
    private readonly loader: ServiceLoader = () => undefined,
  ) {
    if (persisted) this.load(persisted);
  }

  /** Takes a state file's holdings; a value it holds twice (a hand-edited file) stays with the first Service by name. */
  private load(state: AllocationState): void {
    const services = state && typeof state.services === 'object' && state.services !== null ? state.services : {};
    for (const key of Object.keys(services).sort()) {
      const h = services[key];
      if (typeof h !== 'object' || h === null || !key.includes('/')) continue;
      const out: Holding = {};
      const ips = Array.isArray(h.clusterIPs) ? h.clusterIPs.map((ip) => (typeof ip === 'string' ? canonicalIP(ip) : null)).filter((ip): ip is string => !!ip) : [];
      const ipsFree = ips.filter((ip) => !this.ipOwner.has(ip));
      if (ipsFree.length) out.clusterIPs = ipsFree;
      const ports: Record<string, number> = {};
      for (const [name, port] of Object.entries(typeof h.nodePorts === 'object' && h.nodePorts !== null ? h.nodePorts : {})) {
        const owner = this.portOwner.get(port);
        if (isPort(port) && (owner === undefined || owner === key)) ports[name] = port;
      }
      if (Object.keys(ports).length) out.nodePorts = ports;
      if (isPort(h.healthCheckNodePort) && [undefined, key].includes(this.portOwner.get(h.healthCheckNodePort))) out.healthCheckNodePort = h.healthCheckNodePort;
      if (!out.clusterIPs && !out.nodePorts && out.healthCheckNodePort === undefined) continue;
      this.hold(key, out);
      this.dormant.add(key);
    }
  }

  private hold(key: string, h: Holding): void {
    this.holdings.set(key, h);
    for (const ip of h.clusterIPs ?? []) this.ipOwner.set(ip, key);
    for (const port of Object.values(h.nodePorts ?? {})) this.portOwner.set(port, key);
    if (h.healthCheckNodePort !== undefined) this.portOwner.set(h.healthCheckNodePort, key);
    this.version++;
  }

  /** Releases everything key holds; returns what it held. */
  private release(key: string): Holding | undefined {
    const h = this.holdings.get(key);
    this.allocated.delete(key);
    if (!h) return undefined;
    for (const ip of h.clusterIPs ?? []) if (this.ipOwner.get(ip) === key) this.ipOwner.delete(ip);
    for (const port of Object.values(h.nodePorts ?? {})) if (this.portOwner.get(port) === key) this.portOwner.delete(port);
    if (h.healthCheckNodePort !== undefined && this.portOwner.get(h.healthCheckNodePort) === key) this.portOwner.delete(h.healthCheckNodePort);
    this.holdings.delete(key);
    this.version++;
    return h;
  }

  /**
   * Applies a batch of changes (svc null: deleted), in namespace/name order, and returns an
   * outcome per change, plus one per refused Service that a freed address or port let in.
   * Each object is read once, when the iterable yields it, and not kept.
   */
  apply(changes: Iterable<[key: string, svc: K8sService | null]>): Outcome[] {
    return drive(this.applySteps(changes));
  }

  /**
   * apply() one step at a time: it yields after each Service it reads (reading is the costly
   * part: a big batch is 10,000 objects), so a caller can give the event loop a turn between
   * steps. Nothing else may change the allocator until the generator is done.
   */
  *applySteps(changes: Iterable<[key: string, svc: K8sService | null]>): Generator<void, Outcome[], undefined> {
    const plans = new Map<string, Plan | null>();
    const priors: Holding[] = [];
    for (const [key, svc] of changes) {
      const prior = this.release(key);
      if (prior) priors.push(prior);
      this.dormant.delete(key);
      this.refused.delete(key);
      // a key given twice: the later change wins, with the prior of the first
      const first = plans.has(key) ? plans.get(key)?.prior : prior;
      plans.set(key, svc === null ? null : plan(key, svc, first, this.config));
      yield;
    }
    const keys = [...plans.keys()].sort();
    const outcomes = new Map<string, Outcome>();
    for (const key of keys) if (plans.get(key) === null) outcomes.set(key, { key, patch: null });
    for (const o of yield* this.runSteps(keys.map((k) => plans.get(k)).filter((p): p is Plan => !!p))) outcomes.set(o.key, o);
    if (priors.some((h) => !this.stillHeld(h))) for (const o of this.retry()) outcomes.set(o.key, o);
    return [...outcomes.values()];
  }

  /**
   * Forgets the holdings of the state file whose Services are not among `present` (deleted
   * while kproxy was down). Call it once a complete, unbroken listing is known; returns the
   * refused Services this lets in.
   */
  forgetAbsent(present: ReadonlySet<string>): Outcome[] {
    if (this.dormant.size === 0) return [];
    let freed = false;
    for (const key of this.dormant) {
      if (present.has(key)) continue;
      this.release(key);
      freed = true;
    }
    this.dormant.clear();
    return freed ? this.retry() : [];
  }

  private stillHeld(h: Holding): boolean {
    return (
      (h.clusterIPs ?? []).every((ip) => this.ipOwner.has(ip)) &&
      Object.values(h.nodePorts ?? {}).every((p) => this.portOwner.has(p)) &&
      (h.healthCheckNodePort === undefined || this.portOwner.has(h.healthCheckNodePort))
    );
  }

  /** Tries the refused Services again, in name order; returns the ones let in. */
  private retry(): Outcome[] {
    if (this.refused.size === 0) return [];
    const plans: Plan[] = [];
    for (const key of [...this.refused.keys()].sort()) {
      const svc = this.loader(key);
      if (!svc) continue; // waits for its next change
      this.refused.delete(key);
      plans.push(plan(key, svc, undefined, this.config));
    }
    return drive(this.runSteps(plans)).filter((o) => o.patch !== null);
  }

  /** The three steps over a batch of plans: keep what was held, claim what is given, allocate the rest; yields after each plan of each step. */
  private *runSteps(plans: Plan[]): Generator<void, Outcome[], undefined> {
    const live = () => plans.filter((p) => !p.refusal);
    // 1. what the Service held and still wants (its manifest gives that value, or none)
    for (const p of live()) {
      this.keepHeld(p);
      yield;
    }
    // 2. what the manifest asks for: refused when another Service holds it (ErrAllocated)
    for (const p of live()) {
      yield;
      this.claimAsked(p);
    }
    // 3. the rest, from the ranges
    for (const p of live()) {
      yield;
      this.allocateRest(p);
    }
    const out: Outcome[] = [];
    for (const p of plans) {
      out.push(this.finish(p));
      yield;
    }
    return out;
  }

  /** Step 1 of runSteps for one plan: it keeps the values it held that are still free and still wanted. */
  private keepHeld(p: Plan): void {
    if (p.ips === null) {
      for (const ip of p.heldIPs) if (p.priorIPs.includes(ip) && this.isFree(p, 'ip', ip)) this.claim(p, 'ip', ip);
    }
    for (const s of p.ips ?? []) if (kept(s) && this.isFree(p, 'ip', s.prior!)) this.take(p, 'ip', s, s.prior!);
    for (const s of p.ports) if (kept(s) && this.isFree(p, 'port', s.prior!)) this.take(p, 'port', s, s.prior!);
    if (p.hc && kept(p.hc) && this.isFree(p, 'port', p.hc.prior!)) this.take(p, 'port', p.hc, p.hc.prior!);
  }

  /**
   * Step 2 of runSteps for one plan: it claims the values its manifest gives, after every
   * plan kept its own (step 1); one another Service holds refuses the plan, as the API
   * server's ErrAllocated.
   */
  private claimAsked(p: Plan): void {
    const asked = p.ips ? p.ips.filter((s) => s.explicit !== undefined && s.value === undefined).map((s) => s.explicit!) : p.heldIPs;
    for (const ip of asked) {
      if (!this.isFree(p, 'ip', ip)) {
        this.refuse(p, { field: 'spec.clusterIPs', reason: `failed to allocate IP ${ip}: provided IP is already allocated${heldBy(this.ipOwner.get(ip)!)}` });
        break;
      }
      const s = p.ips?.find((x) => x.explicit === ip);
      if (s) this.take(p, 'ip', s, ip);
      else this.claim(p, 'ip', ip);
    }
    if (p.refusal) return;
    for (const s of p.ports) {
      if (s.explicit === undefined || s.value !== undefined) continue;
      if (!this.isFree(p, 'port', s.explicit)) {
        this.refuse(p, { field: `spec.ports[${s.index}].nodePort`, reason: `provided port is already allocated${heldBy(this.portOwner.get(s.explicit)!)}` });
        break;
      }
      this.take(p, 'port', s, s.explicit);
    }
    if (p.refusal || !p.hc || p.hc.explicit === undefined || p.hc.value !== undefined) return;
    if (!this.isFree(p, 'port', p.hc.explicit)) {
      const owner = this.portOwner.get(p.hc.explicit)!;
      this.refuse(p, { field: 'spec.healthCheckNodePort', reason: `failed to allocate requested HealthCheck NodePort ${p.hc.explicit}: provided port is already allocated${heldBy(owner)}` });
      return;
    }
    this.take(p, 'port', p.hc, p.hc.explicit);
  }

  /**
   * Step 3 of runSteps for one plan: its slots still empty get values from the ranges, after
   * every given value was claimed (step 2); a full range refuses the plan.
   */
  private allocateRest(p: Plan): void {
    for (const s of p.ips ?? []) {
      if (s.value !== undefined) continue;
      const ip = this.nextIP(p.key, s.family);
      if (ip === null) {
        this.refuse(p, { field: 'spec.clusterIPs', reason: `failed to allocate a serviceIP: range is full (${this.config.ipRanges.find((r) => r.family === s.family)!.cidr})` });
        break;
      }
      this.take(p, 'ip', s, ip, true);
    }
    if (p.refusal) return;
    for (const s of p.ports) {
      if (s.value !== undefined || !s.allocate) continue;
      // initNodePorts: ports with the same port number share one node port
      const sibling = p.ports.find((o) => o !== s && o.value !== undefined && o.port === s.port);
      const port = sibling ? sibling.value! : this.nextPort(p.key, `port/${s.name}`);
      if (port === null) {
        this.refuse(p, { field: `spec.ports[${s.index}].nodePort`, reason: `failed to allocate a nodePort: range is full (${this.config.nodePorts.text})` });
        break;
      }
      this.take(p, 'port', s, port, true);
    }
    if (p.refusal || !p.hc || p.hc.value !== undefined) return;
    const hc = this.nextPort(p.key, 'healthCheckNodePort');
    if (hc === null) {
      this.refuse(p, { field: 'spec.healthCheckNodePort', reason: `failed to allocate a HealthCheck NodePort: range is full (${this.config.nodePorts.text})` });
      return;
    }
    this.take(p, 'port', p.hc, hc, true);
  }

  /** Refuses a plan: the reason is kept and what it claimed is released. */
  private refuse(p: Plan, r: Refusal): void {
    p.refusal = r;
    this.unclaim(p);
  }

  /** Whether an address or port is nobody's or already p's. */
  private isFree(p: Plan, what: 'ip' | 'port', v: string | number): boolean {
    const owner = what === 'ip' ? this.ipOwner.get(v as string) : this.portOwner.get(v as number);
    return owner === undefined || owner === p.key;
  }

  /** Marks v as p's in the index (the caller checked that nobody else holds it). */
  private claim(p: Plan, what: 'ip' | 'port', v: string | number): void {
    if (what === 'ip') {
      this.ipOwner.set(v as string, p.key);
      p.claimedIPs.push(v as string);
    } else {
      this.portOwner.set(v as number, p.key);
      p.claimedPorts.push(v as number);
    }
  }

  /** Gives slot s the value v. */
  private take<T extends string | number>(p: Plan, what: 'ip' | 'port', s: Slot<T>, v: T, allocated = false): void {
    this.claim(p, what, v);
    s.value = v;
    // a value the manifest does not give is kproxy's, whether allocated in this batch or held from an earlier one
    s.allocated = allocated || s.explicit === undefined;
  }

  /** Releases what a refused plan had claimed. */
  private unclaim(p: Plan): void {
    for (const ip of p.claimedIPs) if (this.ipOwner.get(ip) === p.key) this.ipOwner.delete(ip);
    for (const port of p.claimedPorts) if (this.portOwner.get(port) === p.key) this.portOwner.delete(port);
    p.claimedIPs = [];
    p.claimedPorts = [];
  }

  private nextIP(key: string, family: IPFamily): string | null {
    const r = this.config.ipRanges.find((x) => x.family === family)!;
    // the first address is the `kubernetes` Service's: the bands start one above it
    const ipOf = (n: bigint) => canonicalIP(bigIntToIP(n, family))!;
    const v = allocateInBands(r.first + 1n, r.last, r.offset > 0n ? r.offset - 1n : 0n, key, `ip/${family}`, (n) => !this.ipOwner.has(ipOf(n)));
    return v === null ? null : ipOf(v);
  }

  private nextPort(key: string, slot: string): number | null {
    const r = this.config.nodePorts;
    // port 0 means "none" in a Service: never handed out
    const lo = BigInt(Math.max(r.base, 1));
    const hi = BigInt(r.base + r.size - 1);
    const offset = BigInt(r.base + r.offset) - lo;
    const v = allocateInBands(lo, hi, offset > 0n ? offset : 0n, key, slot, (n) => !this.portOwner.has(Number(n)));
    return v === null ? null : Number(v);
  }

  /** The outcome of a plan, and the holding it leaves. */
  private finish(p: Plan): Outcome {
    if (p.refusal) {
      this.unclaim(p);
      this.holdings.delete(p.key);
      this.refused.set(p.key, p.refusal);
      return { key: p.key, patch: null, refusal: p.refusal };
    }
    const h: Holding = {};
    const got: AllocatedValues = {};
    const ips = p.ips ? p.ips.map((s) => s.value!) : p.heldIPs;
    if (ips.length) h.clusterIPs = ips;
    const portsByName: Record<string, number> = {};
    const allocatedPorts: Record<string, number> = {};
    for (const s of p.ports) {
      if (s.value === undefined) continue;
      portsByName[s.name] = s.value;
      if (s.allocated) allocatedPorts[s.name] = s.value;
    }
    if (Object.keys(portsByName).length) h.nodePorts = portsByName;
    if (p.hc?.value !== undefined) h.healthCheckNodePort = p.hc.value;
    const newIPs = p.ips?.filter((s) => s.allocated).map((s) => s.value!) ?? [];
    if (newIPs.length) got.clusterIPs = newIPs;
    if (Object.keys(allocatedPorts).length) got.nodePorts = allocatedPorts;
    if (p.hc?.allocated) got.healthCheckNodePort = p.hc.value;
    // the index already names p.key for each value; the holding is recorded whole
    if (h.clusterIPs || h.nodePorts || h.healthCheckNodePort !== undefined) {
      this.holdings.set(p.key, h);
      this.version++;
    } else this.holdings.delete(p.key);
    if (got.clusterIPs || got.nodePorts || got.healthCheckNodePort !== undefined) this.allocated.set(p.key, got);
    else this.allocated.delete(p.key);
    return { key: p.key, patch: this.patch(p) };
  }

  /** The values the API server would have set that the manifest does not give. */
  private patch(p: Plan): ServicePatch {
    const out: ServicePatch = {};
    if (p.ips !== null && p.ips.some((s) => s.explicit === undefined)) {
      out.clusterIPs = p.ips.map((s) => s.value!);
      out.ipFamilies = p.ips.map((s) => FAMILY_NAME[s.family]);
      out.ipFamilyPolicy = p.policy;
    }
    const ports = p.ports.filter((s) => s.value !== undefined && s.explicit === undefined).map((s): [number, number] => [s.index, s.value!]);
    if (ports.length) out.nodePorts = ports;
    if (p.hc?.value !== undefined && p.hc.explicit === undefined) out.healthCheckNodePort = p.hc.value;
    return out;
  }

  /** What the state file keeps: every holding, by name. */
  snapshot(): AllocationState {
    const services: Record<string, Holding> = {};
    for (const key of [...this.holdings.keys()].sort()) services[key] = this.holdings.get(key)!;
    return { services };
  }

  /** true while some value is allocated or some Service refused: the state matters across restarts */
  get matters(): boolean {
    return this.allocated.size > 0 || this.refused.size > 0;
  }

  /** true while holdings read from the state file wait for their Services to be seen */
  get hasDormant(): boolean {
    return this.dormant.size > 0;
  }

  isRefused(key: string): boolean {
    return this.refused.has(key);
  }

  report(): AllocationReport {
    const sort = <T>(m: Map<string, T>) => [...m].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
    return {
      serviceClusterIPRange: this.config.ipRanges.map((r) => r.cidr),
      serviceNodePortRange: this.config.nodePorts.text,
      allocated: sort(this.allocated).map(([service, v]) => ({ service, ...v })),
      refused: sort(this.refused).map(([service, r]) => ({ service, ...r })),
    };
  }
}
