// userspace mode planner: state → the listeners kproxy must hold open and the iptables
// rules that steer service traffic to them. Pure: no sockets, no processes.
//
// A service port's frontends (ClusterIP, ExternalIPs, LB ingress IPs, NodePort) each get
// either a listener on the frontend address itself (a loopback VIP, as in the demo, or any
// local address when kproxy may not program iptables), or nat rules that DNAT the frontend
// to a "proxy port": an ephemeral port on one node address (never the wildcard). Every
// decision is the node view's (src/core/nodeview.ts); this file only expresses it:
// - the internal and external traffic policies pick the endpoint set of each frontend;
//   a DNAT hides which frontend a packet came in on, so each (service port, policy,
//   firewalled or not) has its own proxy port and each (service port, policy) its balancer;
// - externalTrafficPolicy Local: pods (the view's local-traffic detector) and the node
//   itself (`--src-type LOCAL`) are sent to the cluster-wide endpoints, everyone else to the
//   node-local ones (upstream's UsesClusterEndpoints short-circuit);
// - a Local policy with no local endpoint DROPs in the filter table (the client times
//   out, as with upstream's DROP), where a service with no endpoints at all is accepted
//   and reset (upstream REJECTs);
// - loadBalancerSourceRanges: the LB IPs' proxy port admits only sources inside the ranges
//   (and the LB IPs themselves when the node is inside them, upstream's allowFromNode);
//   the check is made at accept, since DNAT keeps the source address. NodePorts are not
//   firewalled, as upstream ("for loadbalancers which direct traffic to service NodePort,
//   the firewall rules will not apply");
// - SCTP is refused here: Node has no SCTP sockets.
import { NO_ENDPOINTS, nodePortAddressList, portFactsOf, portOf, settingsOf, type LocalDetectorSpec, type PortFacts, type PortView, type PlanInput } from '../../core/nodeview.ts';
import { canonicalIP, cidrContains, ipFamily, isLoopback, joinHostPort } from '../../core/ip.ts';
import type { Endpoint, ServicePort } from '../../core/model.ts';
import { describeSkippedVIP } from '../../core/vip.ts';

export const CHAIN_PORTALS = 'KPROXY-USERSPACE-PORTALS';
export const CHAIN_NODEPORTS = 'KPROXY-USERSPACE-NODEPORTS';
/** filter table: DROPs for Local policies without local endpoints */
export const CHAIN_FILTER = 'KPROXY-USERSPACE-FILTER';
export const USERSPACE_CHAINS = [CHAIN_PORTALS, CHAIN_NODEPORTS] as const;
/** builtin nat chains that jump to CHAIN_PORTALS: traffic from other namespaces and from the node */
export const JUMP_SOURCES = ['PREROUTING', 'OUTPUT'] as const;
/** builtin filter chains that jump to CHAIN_FILTER: traffic to the node, through it, and from it */
export const FILTER_JUMP_SOURCES = ['INPUT', 'FORWARD', 'OUTPUT'] as const;
export const JUMP_COMMENT = 'kproxy userspace portals';
export const FILTER_JUMP_COMMENT = 'kproxy userspace filter';

/** which endpoint set a frontend uses: the node view's clusterEndpoints or localEndpoints */
export type Policy = 'cluster' | 'local';
export type FrontendKind = 'clusterIP' | 'externalIP' | 'loadBalancerIP' | 'nodePort';

export interface Frontend {
  kind: FrontendKind;
  /** null for a NodePort (any matching node address) */
  ip: string | null;
  port: number;
}

export interface PlannedListener {
  /** stable across syncs while the listener should stay open */
  id: string;
  servicePortKey: string;
  protocol: 'TCP' | 'UDP';
  policy: Policy;
  /** listeners with the same balancerKey share round robin and affinity state */
  balancerKey: string;
  /** 'vip': bound on the frontend address; 'proxy': an ephemeral port on `host` that DNAT rules target */
  kind: 'vip' | 'proxy';
  /** a specific address, never 0.0.0.0 or :: */
  host: string;
  /** 0 = ephemeral (proxy ports) */
  port: number;
  /** extra addresses to bind with the same port (none today; kept for the forwarder's shape) */
  extraHosts: string[];
  frontends: Frontend[];
  /** candidate endpoints, sorted by key */
  endpoints: Endpoint[];
  stickyMaxAgeSeconds: number;
  /**
   * loadBalancerSourceRanges: the CIDRs a client must be inside (checked at accept, the
   * connection reset or the datagram dropped otherwise); null admits every source.
   */
  allowedSources: string[] | null;
}

export interface PlannedRedirect {
  chain: typeof CHAIN_PORTALS | typeof CHAIN_NODEPORTS;
  protocol: 'TCP' | 'UDP';
  /** destination CIDR text, null for NodePorts (matched by the LOCAL jump) */
  dst: string | null;
  dport: number;
  /** source match arguments (the eTP Local short-circuit), [] for every source */
  match: string[];
  listenerId: string;
  comment: string;
}

/** A filter-table DROP: a Local traffic policy without local endpoints. */
export interface PlannedDrop {
  protocol: 'TCP' | 'UDP';
  /** destination CIDR text, null for a NodePort (`-m addrtype --dst-type LOCAL`) */
  dst: string | null;
  dport: number;
  comment: string;
}

export interface UserspacePlan {
  family: 4 | 6;
  listeners: PlannedListener[];
  redirects: PlannedRedirect[];
  drops: PlannedDrop[];
  /** extra match arguments of each PORTALS → NODEPORTS jump (one jump per entry) */
  nodePortJumps: string[][];
  /** service ports or frontends that cannot be served, and why */
  notes: string[];
  /** SCTP service ports ("ns/name:port"), refused: the userspace proxy has no SCTP sockets */
  sctpRefused: string[];
}

export interface PlanOptions {
  /** may kproxy program iptables rules (root, iptables present)? */
  redirect: boolean;
  /** addresses kproxy can bind besides loopback (defaults to node.nodeIPs) */
  localAddresses?: string[];
}

function loopbackAddress(family: 4 | 6): string {
  return family === 4 ? '127.0.0.1' : '::1';
}

function hostCIDR(ip: string): string {
  return ipFamily(ip) === 6 ? `${ip}/128` : `${ip}/32`;
}

function compareKeys(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function frontendText(f: Frontend): string {
  return f.kind === 'nodePort' ? `nodePort ${f.port}` : `${f.kind} ${joinHostPort(f.ip!, f.port)}`;
}

const COMMENT_OF: Record<FrontendKind, string> = {
  clusterIP: 'cluster IP',
  externalIP: 'external IP',
  loadBalancerIP: 'loadbalancer IP',
  nodePort: 'nodePort',
};

/** The jumps PORTALS → NODEPORTS: only for local destinations, and only for the configured node addresses. */
function planNodePortJumps(input: PlanInput): string[][] {
  // The NodePort addresses are the node view's (CIDRs, "primary" = the Node's primary IP).
  const view = settingsOf(input);
  const base = ['-m', 'addrtype', '--dst-type', 'LOCAL'];
  // Upstream never lets IPv6 localhost reach NodePorts; IPv4 only with localhostNodePorts.
  const noLoopback = view.family === 6 ? ['!', '-d', '::1/128'] : view.localhostNodePorts ? [] : ['!', '-d', '127.0.0.0/8'];
  if (view.nodePorts.matchAll) return [[...noLoopback, ...base]];
  return view.nodePorts.cidrs.map((c) => ['-d', c, ...base]);
}

/** iptables source matches of the view's local-traffic detector (upstream's LocalTrafficDetector). */
export function detectorMatch(d: LocalDetectorSpec | null): string[] | null {
  if (!d) return null;
  if (d.kind === 'cidr') return ['-s', d.cidr];
  return ['-i', d.kind === 'interface' ? d.name : `${d.prefix}+`];
}

/** the node itself: upstream's "masquerade LOCAL traffic" rule, here a match on the source */
export const NODE_SOURCE_MATCH = ['-m', 'addrtype', '--src-type', 'LOCAL'];

interface Builder {
  input: PlanInput;
  /** the node facts every port's decisions are taken with (src/core/nodeview.ts portOf) */
  facts: PortFacts;
  opts: PlanOptions;
  local: Set<string>;
  plan: UserspacePlan;
  /** "TCP host:port" → owner, to refuse two listeners on one socket address */
  bound: Map<string, string>;
  byId: Map<string, PlannedListener>;
  /** the node address proxy ports listen on and DNAT rules target */
  proxyHost: string;
}

function canBind(b: Builder, ip: string): boolean {
  return isLoopback(ip) || b.local.has(ip);
}

/**
 * The address proxy ports bind: the node's primary IP of the family when this host has
 * it, else its first own node address, else loopback (then only the node's own traffic
 * reaches them: the kernel does not route other hosts' packets to 127.0.0.1 or ::1).
 */
function chooseProxyHost(b: Builder): string {
  const view = settingsOf(b.input);
  const candidates = [view.primaryNodeIP, ...b.input.node.nodeIPs].map((a) => (a ? canonicalIP(a) : null));
  for (const ip of candidates) if (ip && !isLoopback(ip) && b.local.has(ip)) return ip;
  return loopbackAddress(b.input.node.family);
}

interface ListenerSpec {
  policy: Policy;
  endpoints: Endpoint[];
  allowedSources: string[] | null;
}

function listenerFor(b: Builder, sp: ServicePort, protocol: 'TCP' | 'UDP', spec: ListenerSpec, kind: 'vip' | 'proxy', host: string, port: number): PlannedListener | null {
  // The ranges are part of the id: a listener's admission is fixed when it opens, so a
  // change of loadBalancerSourceRanges opens a new proxy port (and rewrites its rules).
  const fw = spec.allowedSources ? `/fw=${spec.allowedSources.join(',')}` : '';
  const id = kind === 'proxy'
    ? `${sp.key}/${protocol}/proxy/${spec.policy}${fw}`
    : `${sp.key}/${protocol}/vip/${joinHostPort(host, port)}`;
  const existing = b.byId.get(id);
  if (existing) return existing;
  if (kind === 'vip') {
    const sock = `${protocol} ${joinHostPort(host, port)}`;
    const owner = b.bound.get(sock);
    if (owner !== undefined) {
      b.plan.notes.push(`${sp.key}: ${sock} is already served by ${owner}; skipped`);
      return null;
    }
    b.bound.set(sock, sp.key);
  }
  const l: PlannedListener = {
    id,
    servicePortKey: sp.key,
    protocol,
    policy: spec.policy,
    balancerKey: `${sp.key}/${protocol}/${spec.policy}`,
    kind,
    host,
    port,
    extraHosts: [],
    frontends: [],
    endpoints: spec.endpoints,
    stickyMaxAgeSeconds: sp.stickyMaxAgeSeconds,
    allowedSources: spec.allowedSources,
  };
  b.byId.set(id, l);
  b.plan.listeners.push(l);
  return l;
}

/** How the view says one frontend is served. */
interface FrontendDecision {
  /** the policy (endpoint set) of sources that are not short-circuited; null: DROP them */
  policy: Policy | null;
  /** pods and the node go to the cluster endpoints (eTP Local short-circuit) */
  shortCircuit: boolean;
  allowedSources: string[] | null;
}

function endpointsOf(v: PortView, p: Policy): Endpoint[] {
  return p === 'local' ? v.localEndpoints : v.clusterEndpoints;
}

function redirectRule(b: Builder, sp: ServicePort, protocol: 'TCP' | 'UDP', f: Frontend, match: string[], l: PlannedListener, note = ''): void {
  b.plan.redirects.push({
    chain: f.kind === 'nodePort' ? CHAIN_NODEPORTS : CHAIN_PORTALS,
    protocol,
    dst: f.ip === null ? null : hostCIDR(f.ip),
    dport: f.port,
    match,
    listenerId: l.id,
    comment: `${sp.key} ${COMMENT_OF[f.kind]}${note}`,
  });
  if (!l.frontends.some((x) => x.kind === f.kind && x.ip === f.ip && x.port === f.port)) l.frontends.push(f);
}

/** A frontend steered by nat rules to proxy ports (root with iptables). */
function planRedirected(b: Builder, v: PortView, protocol: 'TCP' | 'UDP', f: Frontend, d: FrontendDecision): void {
  const sp = v.sp;
  const proxy = (policy: Policy, allowed: string[] | null) =>
    listenerFor(b, sp, protocol, { policy, endpoints: endpointsOf(v, policy), allowedSources: allowed }, 'proxy', b.proxyHost, 0)!;
  if (d.shortCircuit) {
    const cluster = proxy('cluster', d.allowedSources);
    const pods = detectorMatch(settingsOf(b.input).localDetector);
    if (pods) redirectRule(b, sp, protocol, f, pods, cluster, ' (pods to every endpoint)');
    redirectRule(b, sp, protocol, f, NODE_SOURCE_MATCH, cluster, ' (the node to every endpoint)');
  }
  if (d.policy) {
    redirectRule(b, sp, protocol, f, [], proxy(d.policy, d.allowedSources));
    return;
  }
  // No local endpoint for a Local policy: no DNAT, and the filter table drops the packet.
  b.plan.drops.push({ protocol, dst: f.ip === null ? null : hostCIDR(f.ip), dport: f.port, comment: `${sp.key} ${COMMENT_OF[f.kind]} has no local endpoints` });
}

/** A frontend served by a listener bound on the address itself (loopback VIPs; every local address without iptables). */
function planBound(b: Builder, v: PortView, protocol: 'TCP' | 'UDP', f: Frontend, host: string, d: FrontendDecision): void {
  // Without rules there is no source-based choice and no silent drop: the policy's own
  // endpoint set serves every source, and an empty one resets (said in the render).
  const policy = d.policy ?? (f.kind === 'clusterIP' ? v.internalPolicy : v.externalPolicy);
  if (d.shortCircuit || !d.policy) {
    b.plan.notes.push(`${v.sp.key}: ${frontendText(f)} is bound directly (no iptables): ${d.policy ? 'pods and the node are not short-circuited to every endpoint' : 'no local endpoint, so connections are reset instead of dropped'}`);
  }
  listenerFor(b, v.sp, protocol, { policy, endpoints: endpointsOf(v, policy), allowedSources: d.allowedSources }, 'vip', host, f.port)?.frontends.push(f);
}

function planAddressFrontend(b: Builder, v: PortView, protocol: 'TCP' | 'UDP', f: Frontend, d: FrontendDecision): void {
  const ip = f.ip!;
  // With iptables every address is steered by rules, so the policies and drops hold; only
  // loopback VIPs (the demo's) are bound, since PREROUTING never sees them.
  if (isLoopback(ip) || (!b.opts.redirect && canBind(b, ip))) return planBound(b, v, protocol, f, ip, d);
  if (!b.opts.redirect) {
    b.plan.notes.push(`${v.sp.key}: ${frontendText(f)} is not a local address and REDIRECT is unavailable (not root); not served`);
    return;
  }
  planRedirected(b, v, protocol, f, d);
}

function planNodePort(b: Builder, v: PortView, protocol: 'TCP' | 'UDP', d: FrontendDecision): void {
  const f: Frontend = { kind: 'nodePort', ip: null, port: v.sp.nodePort };
  if (b.opts.redirect) return planRedirected(b, v, protocol, f, d);
  // Without iptables a NodePort is a listener on each NodePort address of the view that this
  // host can bind; never the wildcard.
  const view = settingsOf(b.input);
  const candidates = nodePortAddressList(view.nodePorts, view.nodeIPs);
  const hosts = [...new Set(candidates.map((a) => canonicalIP(a)).filter((a): a is string => !!a && canBind(b, a)))];
  if (hosts.length === 0) {
    b.plan.notes.push(`${v.sp.key}: ${frontendText(f)} has no NodePort address this host can bind; not served`);
    return;
  }
  for (const host of hosts) planBound(b, v, protocol, { ...f, ip: host }, host, d);
}

/** The node view's decisions for one service port, as frontend decisions. */
function decide(v: PortView): { internal: FrontendDecision; external: FrontendDecision; lb: FrontendDecision } {
  // The view's REJECT is here a listener with no endpoint, which resets; its DROP no listener.
  const internal: FrontendDecision = {
    policy: v.internalVerdict === 'drop' ? null : v.internalPolicy,
    shortCircuit: false,
    allowedSources: null,
  };
  const external: FrontendDecision = {
    policy: v.externalVerdict === 'drop' ? null : v.externalPolicy,
    shortCircuit: v.shortCircuitToCluster,
    allowedSources: null,
  };
  const fw = v.firewall;
  const allowed = fw && !fw.allowAll ? fw.allowedSources : null;
  return { internal, external, lb: { ...external, allowedSources: allowed } };
}

function planServicePort(b: Builder, v: PortView): void {
  const { sp } = v;
  if (sp.protocol === 'SCTP') {
    b.plan.sctpRefused.push(sp.key);
    return;
  }
  const protocol = sp.protocol;
  const d = decide(v);
  if (sp.clusterIP) planAddressFrontend(b, v, protocol, { kind: 'clusterIP', ip: sp.clusterIP, port: sp.port }, d.internal);
  for (const ip of sp.externalIPs) planAddressFrontend(b, v, protocol, { kind: 'externalIP', ip, port: sp.port }, d.external);
  for (const ip of sp.loadBalancerVIPs) planAddressFrontend(b, v, protocol, { kind: 'loadBalancerIP', ip, port: sp.port }, d.lb);
  if (sp.nodePort) planNodePort(b, v, protocol, d.external);
}

export function planUserspace(input: PlanInput, opts: PlanOptions): UserspacePlan {
  const local = new Set<string>();
  for (const a of opts.localAddresses ?? input.node.nodeIPs) {
    const c = canonicalIP(a);
    if (c) local.add(c);
  }
  // The userspace mode serves loopback VIPs itself (its listeners bind them).
  const facts: PortFacts = { ...portFactsOf(settingsOf(input)), loopbackVIPs: true };
  const b: Builder = {
    input,
    facts,
    opts,
    local,
    plan: { family: input.node.family, listeners: [], redirects: [], drops: [], nodePortJumps: [], notes: [], sctpRefused: [] },
    bound: new Map(),
    byId: new Map(),
    proxyHost: '',
  };
  b.proxyHost = chooseProxyHost(b);
  const services = [...input.state.services.values()].sort((x, y) => compareKeys(x.key, y.key));
  for (const sp of services) {
    if (sp.family !== input.node.family) continue;
    // The view leaves out an unspecified, multicast or other special VIP; a loopback one is
    // bound, not redirected, and takes nothing from localhost.
    const v = portOf(b.facts, sp, input.state.endpoints.get(sp.key) ?? NO_ENDPOINTS);
    for (const s of v.skippedVIPs) b.plan.notes.push(describeSkippedVIP(s));
    planServicePort(b, v);
  }
  if (b.plan.redirects.length > 0 && isLoopback(b.proxyHost)) {
    b.plan.notes.push(`proxy ports listen on ${b.proxyHost}: this host has none of the node addresses (${input.node.nodeIPs.join(', ') || 'none known'}), so only the node's own traffic reaches them`);
  }
  if (b.plan.redirects.some((r) => r.chain === CHAIN_NODEPORTS)) b.plan.nodePortJumps = planNodePortJumps(input);
  return b.plan;
}

/** Does the plan need any iptables rule (nat or filter)? */
export function hasRules(plan: UserspacePlan): boolean {
  return plan.redirects.length > 0 || plan.drops.length > 0;
}

function dnatTarget(host: string, port: number | string): string {
  return `DNAT --to-destination ${joinHostPort(host, port as number)}`;
}

/**
 * The iptables-restore --noflush payload that makes the KPROXY-USERSPACE-* chains (nat and
 * filter) hold exactly `plan`'s rules; `portOf` gives each proxy listener's bound port.
 */
export function restorePayload(plan: UserspacePlan, portOf: (listenerId: string) => number | string): string {
  const hostOf = new Map(plan.listeners.map((l) => [l.id, l.host]));
  const lines = ['*nat', `:${CHAIN_PORTALS} - [0:0]`, `:${CHAIN_NODEPORTS} - [0:0]`];
  const match = (protocol: string, dst: string | null, dport: number) => {
    const proto = protocol.toLowerCase();
    return `-p ${proto} -m ${proto}${dst ? ` -d ${dst}` : ''} --dport ${dport}`;
  };
  const rule = (r: PlannedRedirect) => {
    const src = r.match.length ? ` ${r.match.join(' ')}` : '';
    return `-A ${r.chain} -m comment --comment "${r.comment}"${src} ${match(r.protocol, r.dst, r.dport)} -j ${dnatTarget(hostOf.get(r.listenerId) ?? '', portOf(r.listenerId))}`;
  };
  for (const r of plan.redirects) if (r.chain === CHAIN_PORTALS) lines.push(rule(r));
  // NodePorts last: a ClusterIP that happens to be local must not be taken by a NodePort.
  for (const j of plan.nodePortJumps) lines.push(`-A ${CHAIN_PORTALS} ${j.join(' ')} -j ${CHAIN_NODEPORTS}`);
  for (const r of plan.redirects) if (r.chain === CHAIN_NODEPORTS) lines.push(rule(r));
  lines.push('COMMIT', '*filter', `:${CHAIN_FILTER} - [0:0]`);
  for (const d of plan.drops) {
    const local = d.dst === null ? ' -m addrtype --dst-type LOCAL' : '';
    lines.push(`-A ${CHAIN_FILTER} -m comment --comment "${d.comment}"${local} ${match(d.protocol, d.dst, d.dport)} -j DROP`);
  }
  lines.push('COMMIT', '');
  return lines.join('\n');
}

/** The rule spec (after "-t nat -I|-C|-D PREROUTING") of each builtin chain's jump to PORTALS. */
export function jumpRuleSpec(): string[] {
  return ['-m', 'comment', '--comment', JUMP_COMMENT, '-j', CHAIN_PORTALS];
}

/** The rule spec (after "-t filter -I INPUT") of each builtin filter chain's jump to FILTER. */
export function filterJumpRuleSpec(): string[] {
  return ['-m', 'comment', '--comment', FILTER_JUMP_COMMENT, '-j', CHAIN_FILTER];
}

function endpointText(eps: Endpoint[]): string {
  return eps.length ? eps.map((e) => e.key).join(', ') : '(no endpoints: connections are reset)';
}

/** Human-readable plan, for `kproxy render` and /debug/rules. `portOf` fills in bound proxy ports when known. */
export function renderPlan(plan: UserspacePlan, portOf?: (listenerId: string) => number | undefined): string {
  const index = new Map(plan.listeners.filter((l) => l.kind === 'proxy').map((l, i) => [l.id, i + 1]));
  const port = (id: string): number | string => portOf?.(id) ?? `<proxy-port-${index.get(id)}>`;
  const out: string[] = [`# userspace mode (IPv${plan.family}): ${plan.listeners.length} listeners, ${plan.redirects.length} DNAT rules, ${plan.drops.length} DROP rules`];
  for (const l of plan.listeners) {
    const addr = l.kind === 'proxy' ? joinHostPort(l.host, port(l.id) as number) : joinHostPort(l.host, l.port);
    const extra = l.extraHosts.length ? ` (+${l.extraHosts.join(', ')})` : '';
    const affinity = l.stickyMaxAgeSeconds ? ` affinity=ClientIP/${l.stickyMaxAgeSeconds}s` : '';
    const fw = l.allowedSources ? ` sourceRanges=${l.allowedSources.join(',')}` : '';
    out.push(`listen ${l.protocol} ${addr}${extra} ${l.servicePortKey} policy=${l.policy}${affinity}${fw}`);
    out.push(`  frontends: ${l.frontends.map(frontendText).join(', ')}`);
    out.push(`  endpoints: ${endpointText(l.endpoints)}`);
  }
  for (const k of plan.sctpRefused) out.push(`# ${sctpRefusal(k)}`);
  for (const n of plan.notes) out.push(`# ${n}`);
  if (hasRules(plan)) {
    const jumps = `nat ${JUMP_SOURCES.join(' and ')}: -j ${CHAIN_PORTALS}; filter ${FILTER_JUMP_SOURCES.join(', ')}: -j ${CHAIN_FILTER}`;
    out.push(`# ${plan.family === 4 ? 'iptables' : 'ip6tables'}-restore --noflush, plus ${jumps}`);
    out.push(restorePayload(plan, port).trimEnd());
  }
  return out.join('\n') + '\n';
}

/** The message (after the code) of an SCTP service port's refusal. */
export function sctpRefusal(servicePortKey: string): string {
  return `${servicePortKey}: SCTP is not served by the userspace mode (Node has no SCTP sockets); use the iptables, ipvs or nftables mode for it`;
}

// ---- tracing the plan -----------------------------------------------------------------------

/** Facts about a traced packet's source that rules can match. */
export interface TraceSource {
  from: string;
  /** the source is one of this node's addresses (`--src-type LOCAL`) */
  local: boolean;
}

/** Does a rule's source match hold for `src`? Interface matches cannot be known from an address: never. */
function sourceMatches(match: string[], src: TraceSource): boolean {
  if (match.length === 0) return true;
  if (match[0] === '-s') return cidrContains(match[1], src.from);
  if (match.join(' ') === NODE_SOURCE_MATCH.join(' ')) return src.local;
  return false;
}

/** Is `ip` inside one of the CIDRs? */
export function sourceAllowed(allowed: string[] | null, ip: string): boolean {
  return allowed === null || allowed.some((c) => cidrContains(c, ip));
}

export type PlanHit =
  | { kind: 'listener'; listener: PlannedListener; frontend: Frontend; rule: PlannedRedirect | null }
  | { kind: 'drop'; drop: PlannedDrop };

/**
 * What a packet from `src` to `to:port` meets, as the rules order it: a bound listener, a
 * DNAT rule (PORTALS in order, then the NodePort jump and NODEPORTS), then the filter DROPs;
 * null when nothing of kproxy's matches.
 */
export function walkPlan(plan: UserspacePlan, input: PlanInput, src: TraceSource, to: string, port: number, protocol: string): PlanHit | null {
  const dst = canonicalIP(to);
  if (!dst) return null;
  for (const l of plan.listeners) {
    if (l.kind !== 'vip' || l.protocol !== protocol || l.port !== port || l.host !== dst) continue;
    return { kind: 'listener', listener: l, frontend: l.frontends[0], rule: null };
  }
  const byId = new Map(plan.listeners.map((l) => [l.id, l]));
  const hit = (r: PlannedRedirect): PlanHit => {
    const listener = byId.get(r.listenerId)!;
    const frontend = listener.frontends.find((f) => f.port === r.dport && (r.dst === null ? f.ip === null : r.dst === hostCIDR(f.ip!)))!;
    return { kind: 'listener', listener, frontend, rule: r };
  };
  const matches = (r: { protocol: string; dst: string | null; dport: number }) => r.protocol === protocol && r.dport === port;
  for (const r of plan.redirects) {
    if (r.chain === CHAIN_PORTALS && matches(r) && r.dst === hostCIDR(dst) && sourceMatches(r.match, src)) return hit(r);
  }
  const settings = settingsOf(input);
  const isNodeAddress = input.node.nodeIPs.includes(dst) || (settings.localhostNodePorts && cidrContains('127.0.0.0/8', dst));
  const np = settings.nodePorts;
  const nodePortJump = isNodeAddress && (np.matchAll || np.cidrs.some((c) => cidrContains(c, dst)));
  if (nodePortJump) {
    for (const r of plan.redirects) if (r.chain === CHAIN_NODEPORTS && matches(r) && sourceMatches(r.match, src)) return hit(r);
  }
  for (const d of plan.drops) {
    if (matches(d) && (d.dst === null ? input.node.nodeIPs.includes(dst) || isLoopback(dst) : d.dst === hostCIDR(dst))) return { kind: 'drop', drop: d };
  }
  return null;
}
