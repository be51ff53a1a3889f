// userspace mode planner: state → the listeners kproxy must hold open and the iptables
// REDIRECT rules that steer service traffic to them. Pure: no sockets, no processes.
//
// A service port's frontends (ClusterIP, ExternalIPs, LB ingress IPs, NodePort) each get
// either a listener on the frontend address itself (when that address is local, e.g. a
// 127.0.0.0/8 ClusterIP in the demo), or a REDIRECT rule to a shared "proxy port" (an
// ephemeral port on the wildcard address) when kproxy may program iptables. Cluster and
// external traffic can use different endpoints (traffic policies), and a REDIRECT hides
// which frontend a packet came in on, so each (service port, policy) has its own proxy
// port and its own balancer.
import { portView, settingsOf } from '../../core/nodeview.ts';
import { canonicalIP, cidrContains, ipFamily, isLoopback, joinHostPort } from '../../core/ip.ts';
import type { Endpoint, ServicePort } from '../../core/model.ts';
import type { PlanInput } from '../types.ts';
import { describeSkippedVIP, safeServicePort } from '../vip.ts';

export const CHAIN_PORTALS = 'KPROXY-USERSPACE-PORTALS';
export const CHAIN_NODEPORTS = 'KPROXY-USERSPACE-NODEPORTS';
export const USERSPACE_CHAINS = [CHAIN_PORTALS, CHAIN_NODEPORTS] as const;
/** builtin nat chains that jump to CHAIN_PORTALS: traffic from other namespaces and from the node */
export const JUMP_SOURCES = ['PREROUTING', 'OUTPUT'] as const;
export const JUMP_COMMENT = 'kproxy userspace portals';

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
  /** 'vip': bound on the frontend address; 'proxy': an ephemeral port that REDIRECT rules target */
  kind: 'vip' | 'proxy';
  host: string;
  /** 0 = ephemeral (proxy ports) */
  port: number;
  /**
   * extra addresses to bind with the same port. A UDP proxy port also binds loopback:
   * OUTPUT's REDIRECT sends node-local datagrams to 127.0.0.1, and a reply only leaves
   * from 127.0.0.1 (which conntrack turns back into the VIP) if it is sent from a socket
   * bound there; a wildcard socket would reply from the route's source address.
   */
  extraHosts: string[];
  frontends: Frontend[];
  /** candidate endpoints, sorted by key */
  endpoints: Endpoint[];
  stickyMaxAgeSeconds: number;
}

export interface PlannedRedirect {
  chain: typeof CHAIN_PORTALS | typeof CHAIN_NODEPORTS;
  protocol: 'TCP' | 'UDP';
  /** destination CIDR text, null for NodePorts (matched by the LOCAL jump) */
  dst: string | null;
  dport: number;
  listenerId: string;
  comment: string;
}

export interface UserspacePlan {
  family: 4 | 6;
  listeners: PlannedListener[];
  redirects: PlannedRedirect[];
  /** extra match arguments of each PORTALS → NODEPORTS jump (one jump per entry) */
  nodePortJumps: string[][];
  /** service ports or frontends that cannot be served, and why */
  notes: string[];
}

export interface PlanOptions {
  /** may kproxy program iptables REDIRECT rules (root, iptables present)? */
  redirect: boolean;
  /** addresses kproxy can bind besides loopback (defaults to node.nodeIPs) */
  localAddresses?: string[];
}

function wildcard(family: 4 | 6): string {
  return family === 4 ? '0.0.0.0' : '::';
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

interface Builder {
  input: PlanInput;
  opts: PlanOptions;
  local: Set<string>;
  plan: UserspacePlan;
  /** "TCP host:port" → owner, to refuse two listeners on one socket address */
  bound: Map<string, string>;
  byId: Map<string, PlannedListener>;
}

function canBind(b: Builder, ip: string): boolean {
  return isLoopback(ip) || b.local.has(ip);
}

function listenerFor(
  b: Builder,
  sp: ServicePort,
  protocol: 'TCP' | 'UDP',
  policy: Policy,
  endpoints: Endpoint[],
  kind: 'vip' | 'proxy',
  host: string,
  port: number,
): PlannedListener | null {
  const id = kind === 'proxy'
    ? `${sp.key}/${protocol}/proxy/${policy}`
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
    policy,
    balancerKey: `${sp.key}/${protocol}/${policy}`,
    kind,
    host,
    port,
    extraHosts: kind === 'proxy' && protocol === 'UDP' ? [loopbackAddress(b.input.node.family)] : [],
    frontends: [],
    endpoints,
    stickyMaxAgeSeconds: sp.stickyMaxAgeSeconds,
  };
  b.byId.set(id, l);
  b.plan.listeners.push(l);
  return l;
}

function planAddressFrontend(b: Builder, sp: ServicePort, protocol: 'TCP' | 'UDP', policy: Policy, endpoints: Endpoint[], f: Frontend): void {
  const ip = f.ip!;
  if (canBind(b, ip)) {
    listenerFor(b, sp, protocol, policy, endpoints, 'vip', ip, f.port)?.frontends.push(f);
    return;
  }
  if (!b.opts.redirect) {
    b.plan.notes.push(`${sp.key}: ${frontendText(f)} is not a local address and REDIRECT is unavailable (not root); not served`);
    return;
  }
  const l = listenerFor(b, sp, protocol, policy, endpoints, 'proxy', wildcard(b.input.node.family), 0)!;
  l.frontends.push(f);
  b.plan.redirects.push({
    chain: CHAIN_PORTALS,
    protocol,
    dst: hostCIDR(ip),
    dport: f.port,
    listenerId: l.id,
    comment: `${sp.key} ${COMMENT_OF[f.kind]}`,
  });
}

function planNodePort(b: Builder, sp: ServicePort, protocol: 'TCP' | 'UDP', policy: Policy, endpoints: Endpoint[]): void {
  const f: Frontend = { kind: 'nodePort', ip: null, port: sp.nodePort };
  if (b.opts.redirect) {
    const l = listenerFor(b, sp, protocol, policy, endpoints, 'proxy', wildcard(b.input.node.family), 0)!;
    l.frontends.push(f);
    b.plan.redirects.push({ chain: CHAIN_NODEPORTS, protocol, dst: null, dport: sp.nodePort, listenerId: l.id, comment: sp.key });
    return;
  }
  // Without iptables a NodePort is a plain listener on each node address (all when none is known).
  const own = b.input.node.nodeIPs.filter((ip) => canBind(b, ip));
  const hosts = own.length ? own : [wildcard(b.input.node.family)];
  for (const host of hosts) {
    listenerFor(b, sp, protocol, policy, endpoints, 'vip', host, sp.nodePort)?.frontends.push({ ...f, ip: host === wildcard(b.input.node.family) ? null : host });
  }
}

function planServicePort(b: Builder, sp: ServicePort): void {
  if (sp.protocol === 'SCTP') {
    b.plan.notes.push(`${sp.key}: SCTP is not supported by the userspace proxy; not served`);
    return;
  }
  const protocol = sp.protocol;
  // Every decision is the node view's (src/core/nodeview.ts). The userspace proxy sees only
  // a connection's source address, not its input interface: the view's local-traffic
  // detector does not apply here (it has no masquerade to decide: every proxied connection
  // gets kproxy's own address as source), so detectLocalMode BridgeInterface and
  // InterfaceNamePrefix change nothing in this mode.
  const view = settingsOf(b.input);
  const cat = portView(sp, b.input.state.endpoints.get(sp.key) ?? [], { nodeName: view.nodeName, nodeLabels: view.nodeLabels, nodeIP: view.primaryNodeIP });
  // Same choice as upstream's iptables mode: a Local policy uses the node-local endpoints.
  const clusterPolicy: Policy = cat.internalPolicy;
  const externalPolicy: Policy = cat.externalPolicy;
  const endpointsOf = (p: Policy) => (p === 'local' ? cat.localEndpoints : cat.clusterEndpoints);

  if (sp.clusterIP) {
    planAddressFrontend(b, sp, protocol, clusterPolicy, endpointsOf(clusterPolicy), { kind: 'clusterIP', ip: sp.clusterIP, port: sp.port });
  }
  for (const ip of sp.externalIPs) {
    planAddressFrontend(b, sp, protocol, externalPolicy, endpointsOf(externalPolicy), { kind: 'externalIP', ip, port: sp.port });
  }
  for (const ip of sp.loadBalancerVIPs) {
    planAddressFrontend(b, sp, protocol, externalPolicy, endpointsOf(externalPolicy), { kind: 'loadBalancerIP', ip, port: sp.port });
  }
  if (sp.nodePort) planNodePort(b, sp, protocol, externalPolicy, endpointsOf(externalPolicy));
}

export function planUserspace(input: PlanInput, opts: PlanOptions): UserspacePlan {
  const local = new Set<string>();
  for (const a of opts.localAddresses ?? input.node.nodeIPs) {
    const c = canonicalIP(a);
    if (c) local.add(c);
  }
  const b: Builder = {
    input,
    opts,
    local,
    plan: { family: input.node.family, listeners: [], redirects: [], nodePortJumps: [], notes: [] },
    bound: new Map(),
    byId: new Map(),
  };
  const services = [...input.state.services.values()].sort((x, y) => compareKeys(x.key, y.key));
  for (const sp of services) {
    if (sp.family !== input.node.family) continue;
    // Never listen on or redirect an unspecified, multicast or other special address as a
    // Service VIP; a loopback one is bound, not redirected, and takes nothing from localhost.
    const safe = safeServicePort(sp, { allowLoopback: true });
    for (const s of safe.skipped) b.plan.notes.push(describeSkippedVIP(s));
    planServicePort(b, safe.sp);
  }
  if (b.plan.redirects.length > 0) b.plan.nodePortJumps = planNodePortJumps(input);
  return b.plan;
}

/** The iptables-restore --noflush payload that makes the KPROXY-USERSPACE-* chains hold exactly `plan`'s rules. */
export function restorePayload(plan: UserspacePlan, portOf: (listenerId: string) => number | string): string {
  const lines = ['*nat', `:${CHAIN_PORTALS} - [0:0]`, `:${CHAIN_NODEPORTS} - [0:0]`];
  const rule = (r: PlannedRedirect) => {
    const proto = r.protocol.toLowerCase();
    const dst = r.dst ? ` -d ${r.dst}` : '';
    return `-A ${r.chain} -m comment --comment "${r.comment}" -p ${proto} -m ${proto}${dst} --dport ${r.dport} -j REDIRECT --to-ports ${portOf(r.listenerId)}`;
  };
  for (const r of plan.redirects) if (r.chain === CHAIN_PORTALS) lines.push(rule(r));
  // NodePorts last: a ClusterIP that happens to be local must not be taken by a NodePort.
  for (const j of plan.nodePortJumps) lines.push(`-A ${CHAIN_PORTALS} ${j.join(' ')} -j ${CHAIN_NODEPORTS}`);
  for (const r of plan.redirects) if (r.chain === CHAIN_NODEPORTS) lines.push(rule(r));
  lines.push('COMMIT', '');
  return lines.join('\n');
}

/** The rule spec (after "-t nat -I|-C|-D PREROUTING") of each builtin chain's jump to PORTALS. */
export function jumpRuleSpec(): string[] {
  return ['-m', 'comment', '--comment', JUMP_COMMENT, '-j', CHAIN_PORTALS];
}

function endpointText(eps: Endpoint[]): string {
  return eps.length ? eps.map((e) => e.key).join(', ') : '(no endpoints: connections are reset)';
}

/** Human-readable plan, for `kproxy render` and /debug/rules. `portOf` fills in bound proxy ports when known. */
export function renderPlan(plan: UserspacePlan, portOf?: (listenerId: string) => number | undefined): string {
  const index = new Map(plan.listeners.filter((l) => l.kind === 'proxy').map((l, i) => [l.id, i + 1]));
  const port = (id: string): number | string => portOf?.(id) ?? `<proxy-port-${index.get(id)}>`;
  const out: string[] = [`# userspace mode (IPv${plan.family}): ${plan.listeners.length} listeners, ${plan.redirects.length} REDIRECT rules`];
  for (const l of plan.listeners) {
    const addr = l.kind === 'proxy' ? joinHostPort(l.host, port(l.id) as number) : joinHostPort(l.host, l.port);
    const extra = l.extraHosts.length ? ` (+${l.extraHosts.join(', ')})` : '';
    const affinity = l.stickyMaxAgeSeconds ? ` affinity=ClientIP/${l.stickyMaxAgeSeconds}s` : '';
    out.push(`listen ${l.protocol} ${addr}${extra} ${l.servicePortKey} policy=${l.policy}${affinity}`);
    out.push(`  frontends: ${l.frontends.map(frontendText).join(', ')}`);
    out.push(`  endpoints: ${endpointText(l.endpoints)}`);
  }
  for (const n of plan.notes) out.push(`# ${n}`);
  if (plan.redirects.length) {
    out.push(`# ${plan.family === 4 ? 'iptables' : 'ip6tables'}-restore --noflush, plus in nat ${JUMP_SOURCES.join(' and ')}: -j ${CHAIN_PORTALS}`);
    out.push(restorePayload(plan, port).trimEnd());
  }
  return out.join('\n') + '\n';
}

/** Listeners a packet to `to:port` would reach (first match wins, as a REDIRECT would). */
export function listenersFor(plan: UserspacePlan, input: PlanInput, to: string, port: number, protocol: string): { listener: PlannedListener; frontend: Frontend }[] {
  const dst = canonicalIP(to);
  if (!dst) return [];
  const localhostNodePorts = settingsOf(input).localhostNodePorts;
  const isNodeAddress = (ip: string) => input.node.nodeIPs.includes(ip) || (localhostNodePorts && cidrContains('127.0.0.0/8', ip));
  const out: { listener: PlannedListener; frontend: Frontend }[] = [];
  for (const l of plan.listeners) {
    if (l.protocol !== protocol) continue;
    for (const f of l.frontends) {
      const hit = f.kind === 'nodePort' ? f.port === port && (f.ip === null ? isNodeAddress(dst) : f.ip === dst) : f.ip === dst && f.port === port;
      if (hit) out.push({ listener: l, frontend: f });
    }
  }
  // Exact addresses before NodePorts, as the rules order them.
  return out.sort((a, b) => Number(a.frontend.kind === 'nodePort') - Number(b.frontend.kind === 'nodePort'));
}
