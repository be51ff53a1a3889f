// The iptables planner's common part: what every sync's payload is made of, with upstream's
// layout and rule text (pkg/proxy/iptables/proxier.go syncProxyRules): the static chains,
// every service port's block (service-block.ts) and the NodePort catch-all, gathered in
// service-port key order. The strategies write it: full.ts (every chain, in chunks on
// nf_tables), restart.ts (a full sync over installed rules: only what differs), partial.ts
// (the changed services' chains) and partial-fast.ts (a partial sync in O(changed)). The sync
// state (sync-state.ts) picks the strategy. Pure: no I/O.
import type { Endpoint, ProxyState, ServicePort } from '../../core/model.ts';
import {
  KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING,
  KUBE_PROXY_FIREWALL, KUBE_SERVICES, isServiceChainName,
} from './names.ts';
import { NFACCT_CT_STATE_INVALID_DROPPED, type IptablesOptions } from './options.ts';
import { EMPTY, renderContext, ruleCount, sameUnitIn, updateApplied, type AppliedBlocks, type RenderContext } from './blocks.ts';
import type { ServiceBlock } from './service-block.ts';
import { groupByChain, unitDigest, type ChainUnit } from './units.ts';

/**
 * One iptables-restore's input, made a part at a time as the restore reads it, so a full
 * sync's text (20 MB at 10,000 Services) never exists whole; `lines` sets the restore's time
 * limit. `parts` can be called again: a refused restore's text is made again for its error.
 */
export interface RestoreInput {
  lines: number;
  parts: () => Iterable<string>;
}

export interface Plan {
  payload: string;
  natRulesWritten: number;
  natRulesTotal: number;
  filterRules: number;
  /** every per-service nat chain the rules need (installed, or written by this sync) */
  activeNatChains: Set<string>;
  deletedChains: string[];
  /** every installed service chain that is not active is in deletedChains (installed chains given, stale deletion asked) */
  staleDeletion: boolean;
  /** service ports whose chains were written */
  writtenServices: number;
  largeClusterMode: boolean;
  /** "table/chain" → digest of the static and dispatch chains this payload writes ('' : edited in place) */
  chainDigests: Map<string, string>;
  /** chains left out because their content was unchanged */
  skippedChains: number;
  /** kernel settings this ruleset needs, applied by the proxier before the restore */
  sysctls: Array<{ name: string; value: string }>;
  /**
   * Several restores to apply in order, one iptables-restore each, instead of `payload`
   * (which is then ''): a chunked full sync, a restart. Otherwise undefined.
   */
  chunks?: string[];
  /**
   * A full sync's restores in order, made as they are read (planFullStreamed); `payload` is
   * then '' and `chunks` undefined.
   */
  restores?: RestoreInput[];
  /** stale service chains this plan leaves installed (large-cluster mode defers their deletion) */
  deferredChains?: string[];
  /** a restart: chains found as planned in the kernel, not written */
  adoptedChains?: number;
  /** what the sync state keeps of this plan once applied: the base of the next partial sync */
  applied: AppliedChange;
}

/** How the applied blocks change when a plan is applied. */
export type AppliedChange =
  | { kind: 'replace'; blocks: AppliedBlocks }
  | {
    kind: 'update';
    /** per changed port: its key, its block now (undefined: gone), its Service ("ns/name") */
    updates: Array<[string, ServiceBlock | undefined, string]>;
    natRulesTotal: number;
    totalEndpoints: number;
  };

/** the sysctl localhost NodePorts need: packets to 127.0.0.0/8 may be DNATed and routed off lo */
export const SYSCTL_ROUTE_LOCALNET = 'net.ipv4.conf.all.route_localnet';

/** the nat chains that dispatch to the services' chains, written once every chain they jump to exists */
export const DISPATCH_CHAINS = new Set([KUBE_SERVICES, KUBE_NODEPORTS]);

const NAT_DECLARED = [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ];

function filterDeclared(opts: IptablesOptions): string[] {
  const declared = [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL];
  if (opts.family !== 6 && opts.localhostNodePorts) declared.push(KUBE_FIREWALL);
  return declared;
}

/** KUBE-POSTROUTING masquerades what KUBE-MARK-MASQ marked. */
function masqueradeRules(opts: IptablesOptions): string[] {
  const mark = opts.masqueradeMark;
  return [
    `-A ${KUBE_POSTROUTING} -m mark ! --mark ${mark}/${mark} -j RETURN`,
    `-A ${KUBE_POSTROUTING} -j MARK --xor-mark ${mark}`,
    `-A ${KUBE_POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE${opts.hasRandomFully ? ' --random-fully' : ''}`,
    `-A ${KUBE_MARK_MASQ} -j MARK --or-mark ${mark}`,
  ];
}

/** CVE-2020-8558: route_localnet makes 127/8 reachable from outside; such packets are dropped. */
function localnetRules(opts: IptablesOptions): string[] {
  if (opts.family === 6 || !opts.localhostNodePorts) return [];
  return [`-A ${KUBE_FIREWALL} -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`];
}

function forwardRules(opts: IptablesOptions): string[] {
  const mark = opts.masqueradeMark;
  const out: string[] = [];
  if (!opts.conntrackTCPLiberal) {
    // INVALID packets would otherwise reset connections (kubernetes#74839).
    const acct = opts.nfacctCTStateInvalidDropped ? ` -m nfacct --nfacct-name ${NFACCT_CT_STATE_INVALID_DROPPED}` : '';
    out.push(`-A ${KUBE_FORWARD} -m conntrack --ctstate INVALID${acct} -j DROP`);
  }
  out.push(`-A ${KUBE_FORWARD} -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark}/${mark} -j ACCEPT`);
  out.push(`-A ${KUBE_FORWARD} -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`);
  return out;
}

/**
 * The NodePort catch-all: the last rule of nat KUBE-SERVICES, on the node view's NodePort
 * addresses (loopback among them only when localhost NodePorts are served: nodePortIPsFor).
 */
function nodePortCatchAll(opts: IptablesOptions): string[] {
  const isIPv6 = opts.family === 6;
  const last = `-A ${KUBE_SERVICES} -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"`;
  if (opts.nodePorts.matchAll) {
    const dst = isIPv6 ? ' ! -d ::1/128' : opts.localhostNodePorts ? '' : ' ! -d 127.0.0.0/8';
    return [`${last} -m addrtype --dst-type LOCAL${dst} -j ${KUBE_NODEPORTS}`];
  }
  return opts.nodePorts.ips.map((ip) => `${last} -d ${ip} -j ${KUBE_NODEPORTS}`);
}

/** What a strategy decides for one service port: its block, and whether its own chains are written. */
export interface ServiceChoice {
  block: ServiceBlock;
  write: boolean;
  /** the block last applied: a chain it holds with the same rules is left out */
  old?: ServiceBlock;
}

/** The services whose own chains a sync writes. */
export interface WrittenServices {
  count: number;
  /** their chains, service after service */
  units: ChainUnit[];
  /** `units` index where each written service's chains start */
  starts: number[];
  /** each written service's nat dispatch rules (KUBE-SERVICES / KUBE-NODEPORTS), as `starts` */
  tops: string[][];
  /** chains left out as the last applied block holds them */
  skippedChains: number;
  /** rules of the chains not written (still counted in natRulesTotal) */
  skippedRules: number;
}

/** One sync's whole ruleset, with the services' own chains only where written. */
export interface Ruleset {
  ctx: RenderContext;
  /** every service port in key order, with its block */
  blocks: Array<[ServicePort, ServiceBlock]>;
  filterUnits: ChainUnit[];
  /** the static and dispatch nat chains */
  natStaticUnits: ChainUnit[];
  /** the NodePort catch-all rules (the end of KUBE-SERVICES) */
  natTail: string[];
  written: WrittenServices;
  /** every service chain the rules need */
  active: Set<string>;
}

function sortedServices(state: ProxyState): ServicePort[] {
  return [...state.services.values()].sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
}

function addWritten(w: WrittenServices, b: ServiceBlock, old: ServiceBlock | undefined): void {
  w.count++;
  w.starts.push(w.units.length);
  w.tops.push(b.natTop);
  for (const u of b.units) {
    // A chain the last applied block has with the same rules is in the kernel as is.
    if (old && u.declare && sameUnitIn(old, u)) {
      w.skippedChains++;
      w.skippedRules += u.rules.length;
    } else {
      w.units.push(u);
    }
  }
}

/** Renders the ruleset of `state`; `choose` says which services' own chains are written. */
export function collectRuleset(state: ProxyState, opts: IptablesOptions, choose: (sp: ServicePort, eps: Endpoint[], ctx: RenderContext) => ServiceChoice): Ruleset {
  const ctx = renderContext(state, opts);
  const filterRules = localnetRules(opts);
  const natRules = masqueradeRules(opts);
  const written: WrittenServices = { count: 0, units: [], starts: [], tops: [], skippedChains: 0, skippedRules: 0 };
  const active = new Set<string>();
  const blocks: Array<[ServicePort, ServiceBlock]> = [];
  for (const sp of sortedServices(state)) {
    const { block: b, write, old } = choose(sp, state.endpoints.get(sp.key) ?? EMPTY, ctx);
    blocks.push([sp, b]);
    for (const l of b.filter) filterRules.push(l);
    for (const l of b.natTop) natRules.push(l);
    for (const c of b.active) active.add(c);
    // Unchanged services' chains are already installed: count their rules, don't write them.
    if (write) addWritten(written, b, old);
    else written.skippedRules += ruleCount(b);
  }
  const natTail = nodePortCatchAll(opts);
  for (const l of natTail) natRules.push(l);
  for (const l of forwardRules(opts)) filterRules.push(l);
  return {
    ctx,
    blocks,
    filterUnits: groupByChain(filterDeclared(opts), filterRules),
    natStaticUnits: groupByChain(NAT_DECLARED, natRules),
    natTail,
    written,
    active,
  };
}

/** Every nat rule of the ruleset, written or not. */
function natRulesTotal(r: Ruleset): number {
  let n = r.written.skippedRules;
  for (const u of r.natStaticUnits) n += u.rules.length;
  for (const u of r.written.units) n += u.rules.length;
  return n;
}

/** The installed service chains no rule needs any more (none unless `deleteStale`). */
export function staleChains(installedNatChains: ReadonlySet<string> | undefined, active: ReadonlySet<string>, deleteStale: boolean): string[] {
  const out: string[] = [];
  if (!installedNatChains || !deleteStale) return out;
  for (const chain of installedNatChains) if (!active.has(chain) && isServiceChainName(chain)) out.push(chain);
  return out;
}

/**
 * Records the digest of every declared chain of `units` in `digests` ("table/chain") and
 * returns the units to write: with `last` (the digests last applied) a declared chain whose
 * digest is the same is left out (counted in `skipped.n`); a chain whose rules are split over
 * units (not declared here) is always written.
 */
export function unchangedLeftOut(table: string, units: ChainUnit[], digests: Map<string, string>, last: ReadonlyMap<string, string> | undefined, skipped: { n: number }): ChainUnit[] {
  const out: ChainUnit[] = [];
  for (const u of units) {
    const key = `${table}/${u.name}`;
    const d = unitDigest(u);
    if (last && u.declare && last.get(key) === d) {
      skipped.n++;
      continue;
    }
    if (u.declare) digests.set(key, d);
    out.push(u);
  }
  return out;
}

/**
 * upstream iptables NewProxier: route_localnet=1 lets 127.0.0.1:NodePort be DNATed to a pod;
 * needed only when localhost NodePorts are served (IPv4, localhostNodePorts, the NodePort
 * addresses include 127.0.0.1) and some service has a NodePort. The KUBE-FIREWALL "block
 * incoming localnet connections" rule (CVE-2020-8558) comes with it.
 */
export function routeLocalnet(opts: IptablesOptions, services: Iterable<ServicePort>): Plan['sysctls'] {
  if (opts.family === 6 || !opts.localhostNodePorts) return [];
  for (const sp of services) if (sp.nodePort !== 0) return routeLocalnetWith(opts, true);
  return [];
}

/** routeLocalnet when it is known whether some service port has a NodePort. */
export function routeLocalnetWith(opts: IptablesOptions, someNodePort: boolean): Plan['sysctls'] {
  if (opts.family === 6 || !opts.localhostNodePorts || !someNodePort) return [];
  return [{ name: SYSCTL_ROUTE_LOCALNET, value: '1' }];
}

export function hasServiceChain(chains: Iterable<string>): boolean {
  for (const c of chains) if (isServiceChainName(c)) return true;
  return false;
}

/** The restores a plan runs, in order: text, or made as it is read. */
export function planRestores(plan: Plan): Array<string | RestoreInput> {
  return plan.restores ?? plan.chunks ?? (plan.payload ? [plan.payload] : []);
}

/** A restore's whole text. */
export function restoreText(r: string | RestoreInput): string {
  if (typeof r === 'string') return r;
  let text = '';
  for (const part of r.parts()) text += part;
  return text;
}

/** What a sync writes: the part of its Plan each strategy (full, partial, restart) decides itself. */
export type WrittenPart = Pick<Plan, 'payload' | 'natRulesWritten' | 'filterRules' | 'deletedChains' | 'chainDigests' | 'skippedChains' | 'chunks' | 'restores' | 'adoptedChains'>;

/**
 * The Plan of a sync that collected the whole ruleset: what it writes (`written`) and what
 * follows from the ruleset alone (the totals, the active chains, the blocks it leaves applied,
 * the sysctls).
 */
export function rulesetPlan(r: Ruleset, req: { opts: IptablesOptions; installedNatChains?: ReadonlySet<string>; deleteStale?: boolean }, written: WrittenPart): Plan {
  const natTotal = natRulesTotal(r);
  return {
    sysctls: routeLocalnet(req.opts, r.blocks.map(([sp]) => sp)),
    natRulesTotal: natTotal,
    activeNatChains: r.active,
    staleDeletion: req.installedNatChains !== undefined && req.deleteStale !== false,
    writtenServices: r.written.count,
    largeClusterMode: r.ctx.largeClusterMode,
    applied: appliedBlocks(r, natTotal),
    ...written,
  };
}

/** The blocks a plan leaves applied, for the next partial sync. */
function appliedBlocks(r: Ruleset, natTotal: number): AppliedChange {
  const applied: AppliedBlocks = { ctx: r.ctx, blocks: new Map(), servicePorts: new Map(), nodePorts: 0, natRulesTotal: natTotal, totalEndpoints: 0 };
  for (const [sp, b] of r.blocks) {
    updateApplied(applied, sp.key, b, sp.serviceKey);
    applied.totalEndpoints! += b.endpoints;
  }
  return { kind: 'replace', blocks: applied };
}
