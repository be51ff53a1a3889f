// The iptables planner: ProxyState → one iptables-restore payload (filter + nat), with
// upstream's layout and rule text (pkg/proxy/iptables/proxier.go syncProxyRules). Partial
// syncs write only the changed services' chains; the rules of unchanged ones are counted
// but not built. Pure: no I/O. Output is built as arrays of lines joined once.
//
// Unlike upstream, a partial sync can also leave out every chain whose content is exactly
// what kproxy last wrote for it (given by the production proxier only: `applied`, the
// blocks last applied, for the services' own chains; `lastChainDigests` for the static and
// dispatch chains): upstream rewrites KUBE-SERVICES, KUBE-NODEPORTS and the static chains on
// every partial sync (2N + 26 nat rules for a one-endpoint change); leaving them out makes
// that write a small constant. With --noflush an omitted chain keeps its kernel content,
// which is the content it would have been rewritten with, so the resulting tables are the
// same. When no changed service's dispatch rules differ, planIptablesFast plans the partial
// sync without visiting the other services' rules at all (O(changed), see there).
import { hash } from 'node:crypto';
import type { Endpoint, ProxyState, ServicePort } from '../../core/model.ts';
import { NO_ENDPOINTS, portOf, type FrontendVerdict, type PortView } from '../../core/nodeview.ts';
import {
  KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING,
  KUBE_PROXY_FIREWALL, KUBE_SERVICES, endpointChainName, isServiceChainName, probability, serviceChains,
} from './names.ts';
import { NFACCT_CT_STATE_INVALID_DROPPED, NFACCT_LOCALHOST_NODEPORTS_ACCEPTED, type IptablesOptions } from './options.ts';
import { canonicalRule, chainDigest, type InstalledChain, type InstalledChains } from './canonical.ts';
import { chunkedDispatchEdits, keptRules, serviceChainKey, STATIC_GROUP, type DispatchChain } from './dispatch-chunks.ts';


const chainLine = (c: string) => `:${c} - [0:0]`;

export interface PlanRequest {
  state: ProxyState;
  opts: IptablesOptions;
  /** write every service's chains (true) or only those of `changed` services */
  full: boolean;
  /** service keys ("ns/name") changed since the last successful sync */
  changed?: Set<string>;
  /** nat chains believed installed; service chains among them that are not wanted are deleted */
  installedNatChains?: Set<string>;
  /** false skips stale-chain deletion (upstream: large clusters, within syncPeriod) */
  deleteStale?: boolean;
  /**
   * Digests ("table/chain" → digest) of the chain contents last applied. On a partial sync a
   * chain whose content digest is equal is left out of the payload (kproxy, not upstream).
   */
  lastChainDigests?: ReadonlyMap<string, string>;
  /** compute `Plan.chainDigests` for the chains written */
  recordDigests?: boolean;
  /**
   * Full syncs only: split the payload into `Plan.chunks` of about this many lines, each
   * holding whole services (kproxy, not upstream; see chunkedPayloads). Unset or 0: one payload.
   */
  chunkLines?: number;
  /**
   * The restart form only: lines per restore of the dispatch edits (dispatch-chunks.ts), each
   * Service's edits in one restore. Unset: dispatchBudget (chunkLines, up to twice it for a
   * large ruleset). 0: every dispatch edit in one restore (what legacy, whose every commit
   * replaces the whole table, does through chunkLines 0; bench/iptables-restart.ts compares
   * the two forms).
   */
  dispatchChunkLines?: number;
  /**
   * What the last applied sync rendered (the production proxier's IptablesSyncState). With
   * it, a partial sync also writes any service whose rendered block changed, and the plan
   * returns `blocks` for the next one.
   */
  applied?: AppliedBlocks;
  /**
   * Full syncs: kproxy's chains as the kernel holds them (canonical.ts installedChains, from
   * the iptables-save the sync reads anyway). When they include a service chain (a restart
   * over the rules a previous process left, or a full sync over this one's), the plan takes
   * the restart form (restartPayloads): only chains that differ are written.
   */
  installed?: InstalledChains;
}

/**
 * The per-service-port blocks the last applied sync rendered, and the render settings they
 * were rendered with: the base of a fast partial sync (planIptablesFast). Opaque outside.
 */
export interface AppliedBlocks {
  /** the render settings the blocks were rendered with (undefined: none yet) */
  ctx?: RenderContext;
  /** sp.key → its block */
  blocks: Map<string, ServiceBlock>;
  /** nat rules of all blocks plus the dispatch and static chains (Plan.natRulesTotal) */
  natRulesTotal: number;
  /** endpoints of all blocks (large-cluster mode), kept up to date by fast partial syncs */
  totalEndpoints?: number;
}

export interface Plan {
  payload: string;
  natRulesWritten: number;
  natRulesTotal: number;
  filterRules: number;
  /** every per-service nat chain the rules need (installed or written now) */
  activeNatChains: Set<string>;
  deletedChains: string[];
  /** every installed service chain that is not active is in deletedChains (installedNatChains given, deleteStale not false) */
  staleDeletion: boolean;
  /** service ports whose chains were written */
  writtenServices: number;
  largeClusterMode: boolean;
  /** with recordDigests: "table/chain" → digest of every chain this payload writes */
  chainDigests: Map<string, string>;
  /** chains left out because their content was unchanged (lastChainDigests) */
  skippedChains: number;
  /** kernel settings this ruleset needs, applied by the proxier before the restore */
  sysctls: Array<{ name: string; value: string }>;
  /**
   * With chunkLines on a full sync whose payload is larger: the restore payloads to apply
   * in order, one iptables-restore each, instead of `payload` (which is then ''). Their
   * union is exactly `payload`'s content. Otherwise undefined.
   */
  chunks?: string[];
  /**
   * Stale service chains this plan leaves installed (large-cluster mode defers their
   * deletion); set by IptablesSyncState for planIptables' plans, by planIptablesFast for its own.
   */
  deferredChains?: string[];
  /** the restart form (PlanRequest.installed): chains found as planned in the kernel, not written */
  adoptedChains?: number;
  /** with `applied` in the request: what this plan renders, for the next sync (commit it) */
  blocks?: AppliedBlocks;
  /** a fast partial plan: the blocks it changed (undefined: the service port is gone) */
  blockUpdates?: Array<[string, ServiceBlock | undefined]>;
  /** a fast partial plan: the endpoints of all blocks after it (AppliedBlocks.totalEndpoints) */
  totalEndpoints?: number;
}

/** the sysctl localhost NodePorts need: packets to 127.0.0.0/8 may be DNATed and routed off lo */
export const SYSCTL_ROUTE_LOCALNET = 'net.ipv4.conf.all.route_localnet';

/** One chain of the payload: its declaration (flush) and rules; the digest is memoised. */
interface ChainUnit {
  name: string;
  /** written with a `:name` declaration (false: rules appended to a chain declared elsewhere) */
  declare: boolean;
  rules: string[];
  digest?: string;
}

function unitDigest(u: ChainUnit): string {
  // One-shot hash: a Hash object per chain costs more than the hashing at 70k chains.
  if (u.digest === undefined) u.digest = hash('sha1', `${u.name}\n${u.rules.join('\n')}`, 'base64');
  return u.digest;
}

/** Groups `-A chain ...` lines into units, declared chains first in `declared` order. */
function groupByChain(declared: string[], rules: string[]): ChainUnit[] {
  const units = new Map<string, ChainUnit>();
  for (const name of declared) units.set(name, { name, declare: true, rules: [] });
  for (const r of rules) {
    const name = r.slice(3, r.indexOf(' ', 3));
    let u = units.get(name);
    if (!u) units.set(name, (u = { name, declare: false, rules: [] }));
    u.rules.push(r);
  }
  return [...units.values()];
}

function sortedServices(state: ProxyState): ServicePort[] {
  return [...state.services.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

// Endpoint objects live in the state until they change, so their chain name is cached on them.
const sepCache = new WeakMap<Endpoint, { svc: string; name: string }>();

function sepName(svcName: string, protocol: string, ep: Endpoint): string {
  const c = sepCache.get(ep);
  if (c && c.svc === svcName + protocol) return c.name;
  const name = endpointChainName(svcName, protocol, ep.key);
  sepCache.set(ep, { svc: svcName + protocol, name });
  return name;
}

/** Everything one service port contributes to a sync. */
export interface ServiceBlock {
  /** filter table rules (always rendered; written unless unchanged, see lastChainDigests) */
  filter: string[];
  /** nat KUBE-SERVICES / KUBE-NODEPORTS rules (always rendered; written unless unchanged) */
  natTop: string[];
  /** declarations of the service's own nat chains (written when the service changed) */
  chains: string[];
  /** rules of the service's own nat chains */
  rules: string[];
  /** the service's own nat chains */
  active: string[];
  /** `chains` + `rules` grouped per chain (built once, with the block) */
  units: ChainUnit[];
  /** how many endpoints it was rendered with (a fast partial sync's endpoint count) */
  endpoints: number;
  /**
   * compactServiceBlocks dropped `chains`, `rules` and `units` (the text of the service's own
   * chains, needed only when they are written): a write renders the block again
   */
  compact?: {
    ruleCount: number;
    /** each declared chain's digest (unitDigest): a partial sync still skips unchanged chains */
    chains: Map<string, string>;
  };
}

interface RenderContext {
  opts: IptablesOptions;
  largeClusterMode: boolean;
  ifLocal: string;
  ifNotLocal: string;
  /** fingerprint of everything above, for the block cache */
  key: string;
}

const EMPTY: Endpoint[] = NO_ENDPOINTS;

// A service's block only changes when its ServicePort or endpoint list does (the trackers
// replace those objects on change) or the settings do: unchanged services are not rebuilt.
const blockCache = new WeakMap<ServicePort, { eps: Endpoint[]; key: string; block: ServiceBlock }>();

function serviceBlock(sp: ServicePort, eps: Endpoint[], ctx: RenderContext, needChains = true): ServiceBlock {
  const hit = blockCache.get(sp);
  if (hit && hit.eps === eps && hit.key === ctx.key && !(needChains && hit.block.compact)) return hit.block;
  // The port as the node view decides it (without the VIPs no rule may hold: src/core/vip.ts).
  const block = renderService(portOf(ctx.opts.node, sp, eps), ctx);
  blockCache.set(sp, { eps, key: ctx.key, block });
  return block;
}

function renderService(v: PortView, ctx: RenderContext): ServiceBlock {
  const { sp, endpoints: eps } = v;
  const { opts, largeClusterMode, ifLocal, ifNotLocal } = ctx;
  const isIPv6 = opts.family === 6;
  const b: ServiceBlock = { filter: [], natTop: [], chains: [], rules: [], active: [], units: [], endpoints: eps.length };
  const names = serviceChains(sp);
  const { nameString: svcName, protocol } = names;
  // Every decision is the node view's (src/core/nodeview.ts); this only renders it.
  const { clusterEndpoints, localEndpoints, allReachableEndpoints, hasAnyEndpoints: hasEndpoints, hasInternalEndpoints, hasExternalEndpoints } = v;
  const usesClusterPolicyChain = v.usesClusterPath;
  const usesLocalPolicyChain = v.usesLocalPath;
  const internalTrafficChain = v.internalPolicy === 'local' ? names.svl : names.svc;
  const externalPolicyChain = v.externalPolicy === 'local' ? names.svl : names.svc;
  const ext = names.ext;
  const usesExternalTrafficChain = v.usesExternalPath;
  const usesFWChain = v.usesFirewallPath;
  const lbChain = usesFWChain ? names.fw : ext;

  // The view's verdicts as filter rules: a comment saying why, and the target.
  const filterComment = (v: FrontendVerdict) => (v === 'reject' ? `"${svcName} has no endpoints"` : v === 'drop' ? `"${svcName} has no local endpoints"` : '');
  const internalFilter = filterComment(v.internalVerdict);
  const externalFilter = filterComment(v.externalVerdict);
  const internalTarget = v.internalVerdict === 'reject' ? 'REJECT' : 'DROP';
  const externalTarget = v.externalVerdict === 'reject' ? 'REJECT' : 'DROP';
  const proto = `-m ${protocol} -p ${protocol}`;
  const port = sp.port;

  // Capture the cluster IP.
  if (sp.clusterIP) {
    if (hasInternalEndpoints) {
      b.natTop.push(`-A ${KUBE_SERVICES} -m comment --comment "${svcName} cluster IP" ${proto} -d ${sp.clusterIP} --dport ${port} -j ${internalTrafficChain}`);
    } else {
      b.filter.push(`-A ${KUBE_SERVICES} -m comment --comment ${internalFilter} ${proto} -d ${sp.clusterIP} --dport ${port} -j ${internalTarget}`);
    }
  }
  // Capture external IPs.
  for (const ip of sp.externalIPs) {
    if (hasEndpoints) b.natTop.push(`-A ${KUBE_SERVICES} -m comment --comment "${svcName} external IP" ${proto} -d ${ip} --dport ${port} -j ${ext}`);
    if (!hasExternalEndpoints) b.filter.push(`-A ${KUBE_EXTERNAL_SERVICES} -m comment --comment ${externalFilter} ${proto} -d ${ip} --dport ${port} -j ${externalTarget}`);
  }
  // Capture load-balancer ingress.
  for (const ip of sp.loadBalancerVIPs) {
    if (hasEndpoints) b.natTop.push(`-A ${KUBE_SERVICES} -m comment --comment "${svcName} loadbalancer IP" ${proto} -d ${ip} --dport ${port} -j ${lbChain}`);
    if (usesFWChain) b.filter.push(`-A ${KUBE_PROXY_FIREWALL} -m comment --comment "${svcName} traffic not accepted by ${names.fw}" ${proto} -d ${ip} --dport ${port} -j DROP`);
  }
  if (!hasExternalEndpoints) {
    for (const ip of sp.loadBalancerVIPs) {
      b.filter.push(`-A ${KUBE_EXTERNAL_SERVICES} -m comment --comment ${externalFilter} ${proto} -d ${ip} --dport ${port} -j ${externalTarget}`);
    }
  }
  // Capture node ports (not subject to loadBalancerSourceRanges, as upstream).
  if (sp.nodePort !== 0) {
    if (hasEndpoints) {
      if (opts.localhostNodePorts && !isIPv6 && opts.nfacctLocalhostNodePortsAccepted) {
        b.natTop.push(`-A ${KUBE_NODEPORTS} -m comment --comment ${svcName} ${proto} -d 127.0.0.0/8 --dport ${sp.nodePort} -m nfacct --nfacct-name ${NFACCT_LOCALHOST_NODEPORTS_ACCEPTED} -j ${ext}`);
      }
      b.natTop.push(`-A ${KUBE_NODEPORTS} -m comment --comment ${svcName} ${proto} --dport ${sp.nodePort} -j ${ext}`);
    }
    if (!hasExternalEndpoints) {
      b.filter.push(`-A ${KUBE_EXTERNAL_SERVICES} -m comment --comment ${externalFilter} -m addrtype --dst-type LOCAL ${proto} --dport ${sp.nodePort} -j ${externalTarget}`);
    }
  }
  if (v.healthCheckNodePort !== 0) {
    b.filter.push(`-A ${KUBE_NODEPORTS} -m comment --comment "${svcName} health check node port" -m tcp -p tcp --dport ${v.healthCheckNodePort} -j ACCEPT`);
  }


  if (hasInternalEndpoints && sp.clusterIP) {
    const args = `-m comment --comment "${svcName} cluster IP" ${proto} -d ${sp.clusterIP} --dport ${port}`;
    if (opts.masqueradeAll) {
      b.rules.push(`-A ${internalTrafficChain} ${args} -j ${KUBE_MARK_MASQ}`);
    } else if (opts.localDetector) {
      // Off-cluster traffic to a service VIP may be routed back off-node: masquerade it.
      b.rules.push(`-A ${internalTrafficChain} ${args} ${ifNotLocal} -j ${KUBE_MARK_MASQ}`);
    }
  }

  if (usesExternalTrafficChain) {
    b.chains.push(chainLine(ext));
    b.active.push(ext);
    if (v.externalPolicy === 'cluster') {
      b.rules.push(`-A ${ext} -m comment --comment "masquerade traffic for ${svcName} external destinations" -j ${KUBE_MARK_MASQ}`);
    } else {
      if (opts.localDetector && v.shortCircuitToCluster) {
        b.rules.push(`-A ${ext} -m comment --comment "pod traffic for ${svcName} external destinations" ${ifLocal} -j ${names.svc}`);
      }
      b.rules.push(`-A ${ext} -m comment --comment "masquerade LOCAL traffic for ${svcName} external destinations" -m addrtype --src-type LOCAL -j ${KUBE_MARK_MASQ}`);
      if (v.shortCircuitToCluster) b.rules.push(`-A ${ext} -m comment --comment "route LOCAL traffic for ${svcName} external destinations" -m addrtype --src-type LOCAL -j ${names.svc}`);
    }
    if (hasExternalEndpoints) b.rules.push(`-A ${ext} -j ${externalPolicyChain}`);
  }

  if (usesFWChain) {
    const fw = names.fw;
    b.chains.push(chainLine(fw));
    b.active.push(fw);
    const head = `-A ${fw} -m comment --comment "${svcName} loadbalancer IP"`;
    for (const cidr of v.firewall!.sourceRanges) b.rules.push(`${head} -s ${cidr} -j ${ext}`);
    // A node reaching its own VIP-like LB IP loops back with the VIP as source.
    if (v.firewall!.nodeInRanges) for (const ip of sp.loadBalancerVIPs) b.rules.push(`${head} -s ${ip} -j ${ext}`);
    b.rules.push(`-A ${fw} -m comment --comment "other traffic to ${svcName} will be dropped by KUBE-PROXY-FIREWALL"`);
  }

  if (usesClusterPolicyChain) {
    b.chains.push(chainLine(names.svc));
    b.active.push(names.svc);
    writeServiceToEndpointRules(b.rules, svcName, protocol, sp, names.svc, clusterEndpoints, largeClusterMode);
  }
  if (usesLocalPolicyChain) {
    b.chains.push(chainLine(names.svl));
    b.active.push(names.svl);
    writeServiceToEndpointRules(b.rules, svcName, protocol, sp, names.svl, localEndpoints, largeClusterMode);
  }
  const c = largeClusterMode ? '' : ` -m comment --comment ${svcName}`;
  for (const ep of allReachableEndpoints) {
    const sep = sepName(svcName, protocol, ep);
    b.chains.push(chainLine(sep));
    b.active.push(sep);
    // Hairpin: a pod reaching itself through the service must be masqueraded.
    b.rules.push(`-A ${sep}${c} -s ${ep.ip} -j ${KUBE_MARK_MASQ}`);
    const affinity = sp.stickyMaxAgeSeconds > 0 ? ` -m recent --name ${sep} --set` : '';
    b.rules.push(`-A ${sep}${c}${affinity} ${proto} -j DNAT --to-destination ${ep.key}`);
  }
  b.units = groupByChain(b.active, b.rules);
  return b;
}

// The same settings give the same string object, so the block cache's key check (once per
// service per sync) compares pointers, not a kilobyte of JSON. A few entries: one per family
// (and a test's variations); cleared when full.
const keys = new Map<string, string>();
function internKey(key: string): string {
  const hit = keys.get(key);
  if (hit !== undefined) return hit;
  if (keys.size >= 16) keys.clear();
  keys.set(key, key);
  return key;
}

function renderContext(state: ProxyState, opts: IptablesOptions): RenderContext {
  let totalEndpoints = 0;
  for (const sp of state.services.values()) totalEndpoints += state.endpoints.get(sp.key)?.length ?? 0;
  const largeClusterMode = totalEndpoints > opts.largeClusterEndpointsThreshold;
  return {
    opts,
    largeClusterMode,
    ifLocal: opts.localDetector ? opts.localDetector.ifLocal.join(' ') : '',
    ifNotLocal: opts.localDetector ? opts.localDetector.ifNotLocal.join(' ') : '',
    key: internKey(JSON.stringify([opts, largeClusterMode])),
  };
}

/**
 * Memory (kproxy, not upstream): after a full sync the cached blocks of every service keep
 * only what a partial sync reads for a service it does not write (its KUBE-SERVICES /
 * KUBE-NODEPORTS and filter rules, its chain names, its rule count); the text of its own
 * chains, two thirds of the block and ~50 MiB at 10,000 Services × 5 endpoints, is dropped
 * and rendered again when the service changes or a full sync writes it (docs/benchmarks.md,
 * "Where the memory goes"). Blocks of services not in the state are left alone.
 */
export function compactServiceBlocks(state: ProxyState): void {
  for (const sp of state.services.values()) {
    const hit = blockCache.get(sp);
    if (!hit || hit.block.compact) continue;
    // In place: the block is also the applied one (AppliedBlocks compares blocks by identity).
    const b = hit.block;
    const chains = new Map<string, string>();
    for (const u of b.units) if (u.declare) chains.set(u.name, unitDigest(u));
    b.compact = { ruleCount: b.rules.length, chains };
    b.chains = [];
    b.rules = [];
    b.units = [];
  }
}

/**
 * The service port whose rules or chain declarations include this payload line, or null
 * (the fixed rules, stale chain deletions). Names the Service whose line iptables-restore
 * refused; a linear scan over the (cached) blocks, only run after a failure.
 */
export function ownerOfPayloadLine(state: ProxyState, opts: IptablesOptions, text: string): ServicePort | null {
  // A dispatch rule inserted in place (dispatchEdits) is the block's `-A` line at a position.
  const ins = /^-I (\S+) \d+ (.*)$/.exec(text);
  const line = ins ? `-A ${ins[1]} ${ins[2]}` : text;
  const ctx = renderContext(state, opts);
  for (const sp of state.services.values()) {
    const b = serviceBlock(sp, state.endpoints.get(sp.key) ?? EMPTY, ctx);
    if (b.rules.includes(line) || b.natTop.includes(line) || b.filter.includes(line) || b.chains.includes(line)) return sp;
  }
  return null;
}

/** Builds the restore payload for one sync. */
export function planIptables(req: PlanRequest): Plan {
  const { state, opts } = req;
  const isIPv6 = opts.family === 6;
  const filterRules: string[] = [];
  const natStatic: string[] = [];
  const natServiceUnits: ChainUnit[] = [];
  const mark = opts.masqueradeMark;

  const filterDeclared = [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL];
  const natDeclared = [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ];

  natStatic.push(`-A ${KUBE_POSTROUTING} -m mark ! --mark ${mark}/${mark} -j RETURN`);
  natStatic.push(`-A ${KUBE_POSTROUTING} -j MARK --xor-mark ${mark}`);
  natStatic.push(`-A ${KUBE_POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE${opts.hasRandomFully ? ' --random-fully' : ''}`);
  natStatic.push(`-A ${KUBE_MARK_MASQ} -j MARK --or-mark ${mark}`);

  if (!isIPv6 && opts.localhostNodePorts) {
    // CVE-2020-8558: route_localnet makes 127/8 reachable from outside; drop such packets.
    filterDeclared.push(KUBE_FIREWALL);
    filterRules.push(`-A ${KUBE_FIREWALL} -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`);
  }

  const active = new Set<string>();
  const services = sortedServices(state);
  const ctx = renderContext(state, opts);
  const largeClusterMode = ctx.largeClusterMode;
  let writtenServices = 0;
  let skippedRules = 0;
  /** natServiceUnits index where each written service's units start */
  const serviceStarts: number[] = [];
  /** each written service's dispatch rules (nat KUBE-SERVICES / KUBE-NODEPORTS), as serviceStarts */
  const serviceTops: string[][] = [];
  // With the applied blocks, a partial sync compares a written service's chains with its
  // last applied block (no digest per service chain: 70k sha1 and map entries at 10k).
  const skipByBlock = !req.full && req.lastChainDigests !== undefined && req.applied !== undefined;
  let skippedChains = 0;
  const blocks = req.applied ? new Map<string, ServiceBlock>() : undefined;
  // A block rendered differently from the applied one (other settings) is written too.
  const prev = req.applied && req.applied.ctx?.key === ctx.key ? req.applied.blocks : undefined;
  // The restart form: each dispatch rule's Service, so its edits stay in one restore.
  const owners = req.full && req.installed ? new Map<string, string>() : undefined;
  const chainOwners = owners && new Map<string, string>();

  for (const sp of services) {
    const eps = state.endpoints.get(sp.key) ?? EMPTY;
    // A service not written keeps its (possibly compacted) block: its chains are not needed.
    let write = req.full || !req.changed || req.changed.has(sp.serviceKey);
    let b = serviceBlock(sp, eps, ctx, write);
    // A block rendered differently from the applied one (other settings) is written too.
    if (!write && req.applied && prev?.get(sp.key) !== b) {
      write = true;
      if (b.compact) b = serviceBlock(sp, eps, ctx, true);
    }
    blocks?.set(sp.key, b);
    for (const l of b.filter) filterRules.push(l);
    for (const l of b.natTop) natStatic.push(l);
    if (owners) {
      for (const l of b.filter) owners.set(l, sp.serviceKey);
      for (const l of b.natTop) owners.set(l, sp.serviceKey);
      chainOwners!.set(serviceChainKey(serviceChains(sp).svc)!, sp.serviceKey);
    }
    for (const c of b.active) active.add(c);
    // Unchanged services' chains are already installed: count their rules, don't write them.
    if (write) {
      writtenServices++;
      serviceStarts.push(natServiceUnits.length);
      serviceTops.push(b.natTop);
      const old = skipByBlock ? prev?.get(sp.key) : undefined;
      for (const u of b.units) {
        // A chain the last applied block has with the same rules is in the kernel as is.
        if (old && u.declare && sameUnitIn(old, u)) {
          skippedChains++;
          skippedRules += u.rules.length;
        } else {
          natServiceUnits.push(u);
        }
      }
    } else {
      skippedRules += b.compact?.ruleCount ?? b.rules.length;
    }
  }

  // The NodePort catch-all must be the last rule of nat KUBE-SERVICES.
  const last = `-A ${KUBE_SERVICES} -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"`;
  const natTail: string[] = [];
  if (opts.nodePorts.matchAll) {
    const dst = isIPv6 ? ' ! -d ::1/128' : opts.localhostNodePorts ? '' : ' ! -d 127.0.0.0/8';
    natTail.push(`${last} -m addrtype --dst-type LOCAL${dst} -j ${KUBE_NODEPORTS}`);
  } else {
    for (const ip of opts.nodePorts.ips) {
      if (isLoopbackIP(ip) && (isIPv6 || !opts.localhostNodePorts)) continue;
      natTail.push(`${last} -d ${ip} -j ${KUBE_NODEPORTS}`);
    }
  }
  for (const l of natTail) natStatic.push(l);

  if (!opts.conntrackTCPLiberal) {
    // INVALID packets would otherwise reset connections (kubernetes#74839).
    const acct = opts.nfacctCTStateInvalidDropped ? ` -m nfacct --nfacct-name ${NFACCT_CT_STATE_INVALID_DROPPED}` : '';
    filterRules.push(`-A ${KUBE_FORWARD} -m conntrack --ctstate INVALID${acct} -j DROP`);
  }
  filterRules.push(`-A ${KUBE_FORWARD} -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark}/${mark} -j ACCEPT`);
  filterRules.push(`-A ${KUBE_FORWARD} -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`);

  const deletedChains: string[] = [];
  if (req.installedNatChains && req.deleteStale !== false) {
    for (const chain of req.installedNatChains) {
      if (active.has(chain) || !isServiceChainName(chain)) continue;
      deletedChains.push(chain);
    }
  }

  // Choose the chains to write: all of them, or (lastChainDigests, partial sync) the ones
  // whose content differs from what was last applied.
  const skipping = !req.full && req.lastChainDigests !== undefined;
  const record = req.recordDigests === true;
  const chainDigests = new Map<string, string>();
  const choose = (table: string, units: ChainUnit[]): ChainUnit[] => {
    if (!skipping && !record) return units;
    const out: ChainUnit[] = [];
    for (const u of units) {
      const key = `${table}/${u.name}`;
      const d = unitDigest(u);
      // A chain whose rules are split over units (not declared here) is always written.
      if (skipping && u.declare && req.lastChainDigests!.get(key) === d) {
        skippedChains++;
        continue;
      }
      if (record && u.declare) chainDigests.set(key, d);
      out.push(u);
    }
    return out;
  };
  const filterUnits = choose('filter', groupByChain(filterDeclared, filterRules));
  const natStaticUnits = groupByChain(natDeclared, natStatic);
  const natAll = [...natStaticUnits, ...natServiceUnits];
  // With the applied blocks only the static and dispatch chains carry digests.
  const natUnits = req.applied ? [...choose('nat', natStaticUnits), ...natServiceUnits] : choose('nat', natAll);

  let natRulesTotal = skippedRules;
  for (const u of natAll) natRulesTotal += u.rules.length;
  let natRulesWritten = 0;
  for (const u of natUnits) natRulesWritten += u.rules.length;
  let filterCount = 0;
  for (const u of filterUnits) filterCount += u.rules.length;

  // Stale chains are flushed (declared) before they are deleted, after every rule written.
  const section = (table: string, units: ChainUnit[], deleted: string[]): string => {
    if (!units.length && !deleted.length && skipping) return '';
    const out: string[] = [`*${table}`];
    for (const u of units) if (u.declare) out.push(chainLine(u.name));
    for (const c of deleted) out.push(chainLine(c));
    for (const u of units) for (const r of u.rules) out.push(r);
    for (const c of deleted) out.push(`-X ${c}`);
    out.push('COMMIT');
    return out.join('\n') + '\n';
  };
  const natLines = natRulesWritten + natUnits.length + deletedChains.length * 2;
  const restart = req.full && req.installed && hasServiceChain(new Set(req.installed.get('nat')?.keys() ?? []))
    ? restartPayloads({ natStaticUnits, serviceUnits: natServiceUnits, serviceStarts, filterUnits, deleted: deletedChains, installed: req.installed, maxLines: req.chunkLines ?? 0, dispatchLines: req.dispatchChunkLines, owners: owners!, chainOwners: chainOwners! })
    : undefined;
  if (restart) {
    natRulesWritten = restart.natRules;
    filterCount = restart.filterRules;
  }
  const chunked = !restart && req.full && req.chunkLines ? natLines > req.chunkLines : false;
  // A cold start (no service chain installed, so the dispatch chains lead nowhere yet) can
  // publish each chunk's services with it; otherwise the dispatch chains are replaced at once.
  const cold = chunked && !deletedChains.length && req.installedNatChains !== undefined && !hasServiceChain(req.installedNatChains);
  const chunks = chunked
    ? chunkedPayloads(natUnits, natServiceUnits, serviceStarts, req.chunkLines!, section('filter', filterUnits, []), deletedChains, cold ? { tops: serviceTops, tail: natTail } : undefined)
    : undefined;
  const payload = chunks || restart ? '' : section('filter', filterUnits, []) + section('nat', natUnits, deletedChains);
  // upstream iptables NewProxier: route_localnet=1 lets 127.0.0.1:NodePort be DNATed to a
  // pod; needed only when localhost NodePorts are served (IPv4, localhostNodePorts, the
  // NodePort addresses include 127.0.0.1) and some service has a NodePort. The
  // KUBE-FIREWALL "block incoming localnet connections" rule (CVE-2020-8558) comes with it.
  const sysctls: Plan['sysctls'] = [];
  if (!isIPv6 && opts.localhostNodePorts && services.some((sp) => sp.nodePort !== 0)) {
    sysctls.push({ name: SYSCTL_ROUTE_LOCALNET, value: '1' });
  }
  return {
    sysctls,
    payload,
    natRulesWritten,
    natRulesTotal,
    filterRules: filterCount,
    activeNatChains: active,
    deletedChains,
    staleDeletion: req.installedNatChains !== undefined && req.deleteStale !== false,
    writtenServices,
    largeClusterMode,
    chainDigests,
    skippedChains,
    chunks: restart?.chunks ?? chunks,
    adoptedChains: restart?.adopted,
    blocks: blocks && { ctx, blocks, natRulesTotal, totalEndpoints: endpointsOf(blocks) },
  };
}

const sameLines = (a: readonly string[] | undefined, b: readonly string[] | undefined): boolean => {
  const x = a ?? EMPTY_LINES;
  const y = b ?? EMPTY_LINES;
  if (x.length !== y.length) return false;
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
};
const EMPTY_LINES: string[] = [];

/** Whether `block` has a declared chain named as `u` with the same rules. */
/** the rules of a block's own chains, also once compacted */
function ruleCount(b: ServiceBlock | undefined): number {
  return b ? (b.compact?.ruleCount ?? b.rules.length) : 0;
}

function sameUnitIn(block: ServiceBlock, u: ChainUnit): boolean {
  if (block.compact) {
    const d = block.compact.chains.get(u.name);
    return d !== undefined && d === unitDigest(u);
  }
  for (const o of block.units) if (o.name === u.name) return o.declare && sameLines(o.rules, u.rules);
  return false;
}

/** More services whose dispatch rules change than this: planIptables rewrites the chains. */
const MAX_DISPATCH_EDITS = 200;

// Per block: how many of its dispatch rules each "table/chain" holds.
const dispatchCounts = new WeakMap<ServiceBlock, Map<string, number>>();

function countsOf(b: ServiceBlock): Map<string, number> {
  let m = dispatchCounts.get(b);
  if (m) return m;
  m = new Map();
  for (const [table, lines] of [['nat', b.natTop], ['filter', b.filter]] as const) {
    for (const l of lines) {
      const k = `${table}/${l.slice(3, l.indexOf(' ', 3))}`;
      m.set(k, (m.get(k) ?? 0) + 1);
    }
  }
  dispatchCounts.set(b, m);
  return m;
}

/**
 * The restore lines that turn the dispatch chains (nat KUBE-SERVICES / KUBE-NODEPORTS, the
 * filter chains) from their applied content into what a full sync would write, editing only
 * the rules of `changed` services: each old rule deleted by its spec (`-D`: a wrong guess
 * fails the restore loudly, and the next sync is full), each new one inserted (`-I chain
 * pos`) where the full sync puts it. A chain holds the services' rules in service-port key
 * order (then, in nat KUBE-SERVICES, the NodePort catch-all), so a service's rules start
 * after the rules of every service whose key sorts before it. Services are edited in key
 * order, so when one is inserted all services before it already have their new rules.
 * Rewriting KUBE-SERVICES whole instead is one 20k-rule transaction at 10k services: 15–25 s
 * with iptables-nft (quadratic in a transaction's size), against ~0.6 s for a few `-I`.
 */
function dispatchEdits(
  changed: Array<[string, ServiceBlock | undefined, ServiceBlock | undefined]>,
  current: Array<[string, ServiceBlock]>,
): { nat: string[]; filter: string[]; natInserted: number; filterInserted: number; chains: string[] } {
  const out = { nat: [] as string[], filter: [] as string[], natInserted: 0, filterInserted: 0, chains: [] as string[] };
  if (!changed.length) return out;
  const chains = new Set<string>();
  const sorted = [...changed].sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
  for (const [key, old, b] of sorted) {
    // Rules of the services that sort before this one, per chain (their new content).
    const before = new Map<string, number>();
    if (b) {
      for (const [k, other] of current) {
        if (!(k < key)) continue;
        for (const [c, n] of countsOf(other)) before.set(c, (before.get(c) ?? 0) + n);
      }
    }
    for (const [table, oldLines, newLines] of [['nat', old?.natTop, b?.natTop], ['filter', old?.filter, b?.filter]] as const) {
      const lines = table === 'nat' ? out.nat : out.filter;
      for (const l of oldLines ?? EMPTY_LINES) {
        lines.push(`-D${l.slice(2)}`);
        chains.add(`${table}/${l.slice(3, l.indexOf(' ', 3))}`);
      }
      const next = new Map<string, number>();
      for (const l of newLines ?? EMPTY_LINES) {
        const sp = l.indexOf(' ', 3);
        const chain = l.slice(3, sp);
        const k = `${table}/${chain}`;
        const pos = (before.get(k) ?? 0) + (next.get(k) ?? 0) + 1;
        next.set(k, (next.get(k) ?? 0) + 1);
        lines.push(`-I ${chain} ${pos}${l.slice(sp)}`);
        chains.add(k);
        if (table === 'nat') out.natInserted++;
        else out.filterInserted++;
      }
    }
  }
  out.chains = [...chains];
  return out;
}

export interface FastPlanRequest {
  state: ProxyState;
  opts: IptablesOptions;
  applied: AppliedBlocks;
  /**
   * The services ("ns/name") changed since `applied` (the trackers' report). With it, only
   * their ports are looked at: every other port's block is the applied one (its ServicePort
   * and endpoint list are the same objects). Without it, every port's block is compared.
   */
  changed?: ReadonlySet<string>;
  /**
   * Large-cluster mode only: true defers the deletion of the chains that became stale (they
   * stay installed, unreferenced, until the cleanup is due); false deletes them and every
   * chain in `deferred`.
   */
  deferStale: boolean;
  /** the stale chains earlier syncs left installed (Plan.deferredChains of the last applied plan) */
  deferred: ReadonlySet<string>;
}

/**
 * A partial sync in O(changed services) rather than O(all services) (kproxy, not upstream):
 * compares each service port's rendered block with the one last applied (by identity: the
 * block cache returns the same object while the ServicePort, its endpoint list and the
 * settings are the same, see serviceBlock) and writes only the changed services' own chains
 * whose content changed (compared with the applied block), declaring only those; deletes the
 * chains that became stale, or defers them (`deferStale`, large-cluster mode) and deletes the
 * deferred ones when the cleanup is due. When no changed service's dispatch rules (nat
 * KUBE-SERVICES / KUBE-NODEPORTS, every filter rule) differ, which is the case for an endpoint
 * change, the restore leaves those chains and the filter table alone; when some do (a Service
 * added or removed, a VIP, port or node port changed, endpoints appearing or all going), they
 * are edited in place (dispatchEdits) rather than rewritten.
 *
 * Returns null when this shortcut does not apply (the caller then runs planIptables): the
 * render settings changed (large-cluster mode on or off included), or more than
 * MAX_DISPATCH_EDITS services' dispatch rules changed. The kernel ends in the state
 * planIptables would leave it in, rule order included; the deferred stale chains are known
 * (`deferred`), so no scan of the 70k installed chains is needed when their deletion comes due.
 */
export function planIptablesFast(req: FastPlanRequest): Plan | null {
  const { state, opts, applied } = req;
  // The applied settings, if the options are the same; large-cluster mode is checked after
  // the scan, which counts the endpoints on the way (one pass over the services, not two).
  const ctx = applied.ctx;
  if (!ctx || internKey(JSON.stringify([opts, ctx.largeClusterMode])) !== ctx.key) return null;
  const touched: Array<[string, ServiceBlock | undefined, ServiceBlock | undefined]> = [];
  let matched = 0;
  // With `changed`, an unchanged port costs one Set lookup: no map lookups, no block check
  // (at 10,000 services the three lookups per port were most of a change's 15-20 ms CPU).
  const changed = applied.totalEndpoints !== undefined ? req.changed : undefined;
  let totalEndpoints = changed ? applied.totalEndpoints! : 0;
  for (const sp of state.services.values()) {
    if (changed && !changed.has(sp.serviceKey)) {
      matched++;
      continue;
    }
    const eps = state.endpoints.get(sp.key) ?? EMPTY;
    totalEndpoints += eps.length;
    // Unchanged services' blocks are the applied ones, compacted or not: no chains needed.
    let b = serviceBlock(sp, eps, ctx, false);
    const old = applied.blocks.get(sp.key);
    if (old) matched++;
    if (changed && old) totalEndpoints -= old.endpoints;
    if (old !== b) {
      if (b.compact) b = serviceBlock(sp, eps, ctx, true);
      touched.push([sp.key, old, b]);
    }
  }
  if (matched < applied.blocks.size) {
    for (const [key, old] of applied.blocks) {
      if (state.services.has(key)) continue;
      touched.push([key, old, undefined]);
      if (changed) totalEndpoints -= old.endpoints;
    }
  }
  if (totalEndpoints > opts.largeClusterEndpointsThreshold !== ctx.largeClusterMode) return null;
  let deltaRules = 0;
  const redispatch: typeof touched = [];
  for (const t of touched) {
    const [, old, b] = t;
    if (!sameLines(old?.natTop, b?.natTop) || !sameLines(old?.filter, b?.filter)) redispatch.push(t);
    deltaRules += ruleCount(b) - ruleCount(old) + (b?.natTop.length ?? 0) - (old?.natTop.length ?? 0);
  }
  // Many services' dispatch rules at once (a settings-like change): rewrite the chains whole.
  if (redispatch.length > MAX_DISPATCH_EDITS) return null;
  // Every port's block in state order, only when dispatch rules move (a Service added or
  // removed...): a second pass; an endpoint change, the common case, allocates nothing per port.
  const current: Array<[string, ServiceBlock]> = [];
  if (redispatch.length) {
    for (const sp of state.services.values()) current.push([sp.key, serviceBlock(sp, state.endpoints.get(sp.key) ?? EMPTY, ctx, false)]);
  }
  const edits = dispatchEdits(redispatch, current);
  const stale: string[] = [];
  for (const [, old, b] of touched) {
    if (!old) continue;
    const now = new Set(b?.active ?? EMPTY_LINES);
    for (const c of old.active) if (!now.has(c)) stale.push(c);
  }
  // Outside large-cluster mode nothing is ever deferred; inside, until the cleanup is due.
  const defer = ctx.largeClusterMode && req.deferStale;

  const units: ChainUnit[] = [];
  const active = new Set<string>();
  let skippedChains = 0;
  let writtenServices = 0;
  for (const [, old, b] of touched) {
    if (!b) continue;
    writtenServices++;
    for (const c of b.active) active.add(c);
    for (const u of b.units) {
      if (old && u.declare && sameUnitIn(old, u)) {
        skippedChains++;
        continue;
      }
      units.push(u);
    }
  }
  // A deferred chain that a changed service uses again is no longer stale.
  const gone = [...req.deferred, ...stale].filter((c) => !active.has(c));
  const deletedChains = defer ? [] : gone;
  let natRulesWritten = edits.natInserted;
  for (const u of units) natRulesWritten += u.rules.length;
  let payload = '';
  if (edits.filter.length) payload += ['*filter', ...edits.filter, 'COMMIT', ''].join('\n');
  if (units.length || deletedChains.length || edits.nat.length) {
    // Chains first, then the dispatch edits that jump to them, then the stale chains' deletion.
    const out: string[] = ['*nat'];
    for (const u of units) if (u.declare) out.push(chainLine(u.name));
    for (const c of deletedChains) out.push(chainLine(c));
    for (const u of units) for (const r of u.rules) out.push(r);
    for (const l of edits.nat) out.push(l);
    for (const c of deletedChains) out.push(`-X ${c}`);
    out.push('COMMIT');
    payload += out.join('\n') + '\n';
  }
  // The edited dispatch chains' digests are void: a later full-scan sync rewrites them.
  const chainDigests = new Map<string, string>();
  for (const c of edits.chains) chainDigests.set(c, '');
  const natRulesTotal = applied.natRulesTotal + deltaRules;
  const sysctls: Plan['sysctls'] = [];
  if (opts.family !== 6 && opts.localhostNodePorts) {
    for (const sp of state.services.values()) {
      if (sp.nodePort === 0) continue;
      sysctls.push({ name: SYSCTL_ROUTE_LOCALNET, value: '1' });
      break;
    }
  }
  return {
    sysctls,
    payload,
    natRulesWritten,
    natRulesTotal,
    filterRules: edits.filterInserted,
    activeNatChains: active,
    deletedChains,
    staleDeletion: false,
    writtenServices,
    largeClusterMode: ctx.largeClusterMode,
    chainDigests,
    skippedChains,
    blockUpdates: touched.map(([key, , b]) => [key, b]),
    totalEndpoints,
    deferredChains: defer ? gone : [],
  };
}

function endpointsOf(blocks: Map<string, ServiceBlock>): number {
  let n = 0;
  for (const b of blocks.values()) n += b.endpoints;
  return n;
}

/** dispatch chains: rewritten in the last chunk, once every chain they jump to exists */
const DISPATCH_CHAINS = new Set([KUBE_SERVICES, KUBE_NODEPORTS]);

function hasServiceChain(chains: Set<string>): boolean {
  for (const c of chains) if (isServiceChainName(c)) return true;
  return false;
}

/**
 * A full sync's payload as several restores (kproxy, not upstream). iptables-nft-restore
 * --noflush is quadratic in the size of one transaction (one 10,000-service payload takes
 * minutes; see docs/benchmarks.md "iptables at scale"), while many restores of a few
 * thousand lines each stay linear. Each chunk is its own atomic transaction that holds whole
 * services, so traffic never sees half a service:
 * 1. leaf chunks: KUBE-MARK-MASQ and KUBE-POSTROUTING first, then the services' own chains
 *    (KUBE-SVC/SVL/EXT/FW/SEP), a group of whole services per chunk; nothing jumps into a
 *    new chain yet, and an existing chain is replaced with its whole service's chains at once;
 * 2. the last chunk: the filter table, nat KUBE-SERVICES and KUBE-NODEPORTS (the dispatch
 *    rules), and the stale chains' flush and deletion (after nothing jumps to them any more).
 * --noflush semantics are kept: only the chains kproxy declares are flushed.
 *
 * `progressive` (a cold start: no service chain is installed, nothing to delete): the filter
 * table goes first, the first chunk also flushes KUBE-SERVICES and KUBE-NODEPORTS, each chunk
 * appends its own services' dispatch rules after their chains (so a service becomes
 * reachable whole, in the transaction that creates it), and the last chunk is the NodePort
 * catch-all, the last rule of KUBE-SERVICES. Why: iptables-nft (1.8.x) keeps the chain
 * names a transaction mentions, jump targets included, in a sorted linked list
 * (nft-cache.c cache_chain_list_insert), so one last chunk with 20,000 dispatch rules that
 * jump to 20,000 chains costs 3–7 s at 10,000 services; here each chunk's targets are the
 * chains it declares anyway.
 */
function chunkedPayloads(
  natUnits: ChainUnit[],
  serviceUnits: ChainUnit[],
  serviceStarts: number[],
  maxLines: number,
  filterSection: string,
  deleted: string[],
  progressive?: { tops: string[][]; tail: string[] },
): string[] {
  const chunks: string[] = [];
  let lines: string[] = [];
  let decls: string[] = [];
  let tops: string[] = [];
  const flush = () => {
    if (!decls.length && !lines.length && !tops.length) return;
    chunks.push((chunks.length === 0 && progressive ? filterSection : '') + ['*nat', ...decls, ...lines, ...tops, 'COMMIT', ''].join('\n'));
    decls = [];
    lines = [];
    tops = [];
  };
  const add = (u: ChainUnit) => {
    if (u.declare) decls.push(chainLine(u.name));
    for (const r of u.rules) lines.push(r);
  };
  const service = new Set(serviceUnits);
  const dispatch: ChainUnit[] = [];
  for (const u of natUnits) {
    if (service.has(u)) continue;
    if (!DISPATCH_CHAINS.has(u.name)) add(u);
    else if (!progressive) dispatch.push(u);
    else if (u.declare) decls.push(chainLine(u.name));
  }
  for (let s = 0; s < serviceStarts.length; s++) {
    const end = s + 1 < serviceStarts.length ? serviceStarts[s + 1] : serviceUnits.length;
    const own = progressive ? progressive.tops[s] : EMPTY_LINES;
    let n = own.length;
    for (let i = serviceStarts[s]; i < end; i++) n += 1 + serviceUnits[i].rules.length;
    const size = decls.length + lines.length + tops.length;
    if (size && size + n > maxLines) flush();
    for (let i = serviceStarts[s]; i < end; i++) add(serviceUnits[i]);
    for (const l of own) tops.push(l);
  }
  flush();
  if (progressive) {
    if (progressive.tail.length) chunks.push(['*nat', ...progressive.tail, 'COMMIT', ''].join('\n'));
    return chunks;
  }
  const last = ['*nat'];
  for (const u of dispatch) if (u.declare) last.push(chainLine(u.name));
  for (const c of deleted) last.push(chainLine(c));
  for (const u of dispatch) for (const r of u.rules) last.push(r);
  for (const c of deleted) last.push(`-X ${c}`);
  last.push('COMMIT', '');
  chunks.push(filterSection + last.join('\n'));
  return chunks;
}

function isLoopbackIP(ip: string): boolean {
  return ip === '::1' || ip.startsWith('127.');
}

function writeServiceToEndpointRules(
  natRules: string[],
  svcName: string,
  protocol: string,
  sp: ServicePort,
  chain: string,
  endpoints: Endpoint[],
  largeClusterMode: boolean,
): void {
  const comment = (ep: Endpoint) => (largeClusterMode ? '' : ` -m comment --comment "${svcName} -> ${ep.key}"`);
  if (sp.stickyMaxAgeSeconds > 0) {
    for (const ep of endpoints) {
      const sep = sepName(svcName, protocol, ep);
      natRules.push(`-A ${chain}${comment(ep)} -m recent --name ${sep} --rcheck --seconds ${sp.stickyMaxAgeSeconds} --reap -j ${sep}`);
    }
  }
  const n = endpoints.length;
  for (let i = 0; i < n; i++) {
    const ep = endpoints[i];
    const stat = i < n - 1 ? ` -m statistic --mode random --probability ${probability(n - i)}` : '';
    natRules.push(`-A ${chain}${comment(ep)}${stat} -j ${sepName(svcName, protocol, ep)}`);
  }
}

/**
 * Lines per restore of a restart's dispatch edits by default (kproxy, not upstream; 0: one
 * restore): the chunk size, or a quarter of the planned nat dispatch rules (KUBE-SERVICES and
 * KUBE-NODEPORTS) when that is more, up to twice the chunk size. Every dispatch restore pays a
 * floor that grows with the ruleset, so a fixed budget would make the restores' total grow as
 * N²; this one keeps a rewrite of every dispatch rule at about 8 restores up to 20,000
 * Services (figures: docs/benchmarks.md, "Where the chunked dispatch edits' time goes").
 */
export function dispatchBudget(chunkLines: number, dispatchRules: number): number {
  if (!chunkLines) return 0;
  return Math.min(2 * chunkLines, Math.max(chunkLines, Math.floor(dispatchRules / 4)));
}

/**
 * The restore lines that turn an installed chain into `rules` (planned `-A` lines): null when
 * its rules already are those (canonical.ts); otherwise in-place edits, each installed rule
 * not kept deleted (`-D` by the line iptables-save printed, or by position for a duplicate;
 * last first) and each missing one
 * inserted where it belongs (`-I chain pos`), keeping the longest run of installed rules that
 * is already in planned order (a longest increasing subsequence); or the chain declared
 * (flushed) and rewritten whole when that is shorter or the chain is not installed.
 */
export function chainEdits(name: string, installed: InstalledChain | undefined, rules: readonly string[]): { decls: string[]; lines: string[]; written: number } | null {
  if (!installed) return { decls: [chainLine(name)], lines: [...rules], written: rules.length };
  const want = rules.map(canonicalRule);
  if (!installed.canon || !installed.lines) return { decls: [chainLine(name)], lines: [...rules], written: rules.length };
  const have = installed.canon;
  const haveLines = installed.lines;
  if (want.length === have.length && want.every((c, i) => c === have[i])) return null;
  const kept = keptRules(have, want);
  const keptPlanned = new Set<number>();
  const keptInstalled = new Set<number>();
  kept.keptPlanned.forEach((k, j) => {
    if (!k) return;
    keptPlanned.add(j);
    keptInstalled.add(kept.match[j]);
  });
  const edits = have.length - keptInstalled.size + want.length - keptPlanned.size;
  if (edits >= rules.length) return { decls: [chainLine(name)], lines: [...rules], written: rules.length };
  const lines: string[] = [];
  // Last first, so each deletion leaves the positions before it as read. By spec when the rule
  // is unique in the chain; a duplicate by its position, or -D would take the first copy.
  const copies = new Map<string, number>();
  for (const c of have) copies.set(c, (copies.get(c) ?? 0) + 1);
  for (let i = have.length - 1; i >= 0; i--) {
    if (keptInstalled.has(i)) continue;
    lines.push(copies.get(have[i])! > 1 ? `-D ${name} ${i + 1}` : `-D${haveLines[i].slice(2)}`);
  }
  let written = 0;
  for (let j = 0; j < rules.length; j++) {
    if (keptPlanned.has(j)) continue;
    const r = rules[j];
    const sp = r.indexOf(' ', 3);
    lines.push(`-I ${name} ${j + 1}${r.slice(sp)}`);
    written++;
  }
  return { decls: [], lines, written };
}

/**
 * A full sync over installed rules (kproxy, not upstream): the restart form. Upstream's first
 * sync after a restart rewrites every chain in one transaction; at 10,000 Services that is
 * 200,000 rules and, on the nf_tables backend, a commit held for seconds per chunk (tens of
 * seconds in all). Here every chain whose installed content already is the planned one is
 * adopted as is (the common restart: nothing changed while kproxy was down), and the rest is
 * written in restores of about `maxLines` lines (0: one restore), in this order:
 * 1. leaf chunks: the static chains that differ, then, a group of whole services per chunk,
 *    each service's own chains that differ or are missing (declared, so flushed, and written
 *    whole); nothing new is reachable yet, and an installed chain is replaced at once;
 * 2. the dispatch edits: the filter chains and nat KUBE-SERVICES / KUBE-NODEPORTS edited in
 *    place (`-D` of rules no longer wanted, `-I` of new ones where they belong), so a Service
 *    whose rules did not change stays reachable throughout and a changed one is switched in
 *    one transaction. With `dispatchLines` (nf_tables: dispatchBudget) in restores of about
 *    that many lines, each Service's edits in one (dispatch-chunks.ts), then the stale service
 *    chains flushed (with the last one when it fits); without (legacy, whose every commit
 *    replaces the whole table: one restore) in one restore with the flushes (chainEdits per
 *    chain, a chain rewritten whole when that is shorter);
 * 3. the stale chains deleted (`-X`), nothing jumping to them any more.
 * --noflush semantics are kept: only chains kproxy owns are declared, flushed or deleted.
 */
function restartPayloads(o: {
  natStaticUnits: ChainUnit[];
  serviceUnits: ChainUnit[];
  serviceStarts: number[];
  filterUnits: ChainUnit[];
  deleted: string[];
  installed: InstalledChains;
  maxLines: number;
  /** lines per restore of the dispatch edits (0: one restore, chainEdits per chain; undefined: dispatchBudget) */
  dispatchLines: number | undefined;
  /** each service dispatch rule's Service (the others are static) */
  owners: ReadonlyMap<string, string>;
  /** each service port's chains (serviceChainKey) → its Service */
  chainOwners: ReadonlyMap<string, string>;
}): { chunks: string[]; natRules: number; filterRules: number; adopted: number } {
  const nat = o.installed.get('nat') ?? new Map<string, InstalledChain>();
  const filter = o.installed.get('filter') ?? new Map<string, InstalledChain>();
  const chunks: string[] = [];
  let natRules = 0;
  let filterRules = 0;
  let adopted = 0;
  let decls: string[] = [];
  let lines: string[] = [];
  const flush = () => {
    if (!decls.length && !lines.length) return;
    chunks.push(['*nat', ...decls, ...lines, 'COMMIT', ''].join('\n'));
    decls = [];
    lines = [];
  };
  /** the lines a unit needs (whole, declared) or null when installed as planned */
  const leaf = (u: ChainUnit): ChainUnit | null => {
    const inst = nat.get(u.name);
    if (inst && inst.digest === chainDigest(u.rules)) {
      adopted++;
      return null;
    }
    return u;
  };
  const add = (u: ChainUnit) => {
    decls.push(chainLine(u.name));
    for (const r of u.rules) lines.push(r);
    natRules += u.rules.length;
  };
  const dispatch: ChainUnit[] = [];
  for (const u of o.natStaticUnits) {
    if (DISPATCH_CHAINS.has(u.name)) dispatch.push(u);
    else if (leaf(u)) add(u);
  }
  for (let s = 0; s < o.serviceStarts.length; s++) {
    const end = s + 1 < o.serviceStarts.length ? o.serviceStarts[s + 1] : o.serviceUnits.length;
    const write: ChainUnit[] = [];
    for (let i = o.serviceStarts[s]; i < end; i++) {
      const u = leaf(o.serviceUnits[i]);
      if (u) write.push(u);
    }
    if (!write.length) continue;
    let n = 0;
    for (const u of write) n += 1 + u.rules.length;
    const size = decls.length + lines.length;
    if (o.maxLines && size && size + n > o.maxLines) flush();
    for (const u of write) add(u);
  }
  if (o.maxLines) flush();
  let dispatchRules = 0;
  for (const u of dispatch) dispatchRules += u.rules.length;
  const dispatchLines = o.dispatchLines ?? dispatchBudget(o.maxLines, dispatchRules);
  if (dispatchLines) {
    // The dispatch edits in restores of about dispatchLines lines, each Service's in one.
    flush();
    const chains: DispatchChain[] = [];
    const ownersOf = (u: ChainUnit) => u.rules.map((r) => o.owners.get(r) ?? STATIC_GROUP);
    for (const u of o.filterUnits) chains.push({ table: 'filter', name: u.name, rules: u.rules, owners: ownersOf(u), installed: filter.get(u.name) });
    for (const u of dispatch) chains.push({ table: 'nat', name: u.name, rules: u.rules, owners: ownersOf(u), installed: nat.get(u.name) });
    const d = chunkedDispatchEdits(chains, dispatchLines, o.chainOwners);
    adopted += d.adopted;
    natRules += d.written.nat;
    filterRules += d.written.filter;
    // The stale chains' flush after every edit: with the last restore when it fits.
    const stale = o.deleted.map(chainLine);
    const last = d.chunks.at(-1);
    if (last && last.filter.length + last.nat.length + stale.length <= dispatchLines) {
      last.nat.unshift(...stale);
      stale.length = 0;
    }
    for (const c of d.chunks) {
      let text = '';
      if (c.filter.length) text += ['*filter', ...c.filter, 'COMMIT', ''].join('\n');
      if (c.nat.length) text += ['*nat', ...c.nat, 'COMMIT', ''].join('\n');
      if (text) chunks.push(text);
    }
    const budget = o.maxLines || dispatchLines;
    for (const l of stale) {
      decls.push(l);
      if (decls.length >= budget) flush();
    }
    flush();
    // Then the stale chains deleted, nothing jumping to them any more.
    for (const c of o.deleted) {
      lines.push(`-X ${c}`);
      if (lines.length >= budget) flush();
    }
    flush();
    return { chunks, natRules, filterRules, adopted };
  }
  // The dispatch restore (with the leaf lines when not chunked).
  const filterOut = { decls: [] as string[], lines: [] as string[] };
  for (const u of o.filterUnits) {
    const e = chainEdits(u.name, filter.get(u.name), u.rules);
    if (!e) {
      adopted++;
      continue;
    }
    filterOut.decls.push(...e.decls);
    filterOut.lines.push(...e.lines);
    filterRules += e.written;
  }
  for (const u of dispatch) {
    const e = chainEdits(u.name, nat.get(u.name), u.rules);
    if (!e) {
      adopted++;
      continue;
    }
    decls.push(...e.decls);
    lines.push(...e.lines);
    natRules += e.written;
  }
  for (const c of o.deleted) decls.push(chainLine(c));
  let last = '';
  if (filterOut.decls.length || filterOut.lines.length) last += ['*filter', ...filterOut.decls, ...filterOut.lines, 'COMMIT', ''].join('\n');
  if (!o.maxLines) for (const c of o.deleted) lines.push(`-X ${c}`);
  if (decls.length || lines.length) last += ['*nat', ...decls, ...lines, 'COMMIT', ''].join('\n');
  decls = [];
  lines = [];
  if (last) chunks.push(last);
  // Chunked: the flushed stale chains deleted in restores of their own.
  if (o.maxLines) {
    for (const c of o.deleted) {
      lines.push(`-X ${c}`);
      if (lines.length >= o.maxLines) flush();
    }
    flush();
  }
  return { chunks, natRules, filterRules, adopted };
}
