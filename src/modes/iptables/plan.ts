// The iptables planner: ProxyState → one iptables-restore payload (filter + nat), with
// upstream's layout and rule text (pkg/proxy/iptables/proxier.go syncProxyRules). Partial
// syncs write only the changed services' chains; the rules of unchanged ones are counted
// but not built. Pure: no I/O. Output is built as arrays of lines joined once.
import { categorizeEndpoints } from '../../core/categorize.ts';
import { cidrContains } from '../../core/ip.ts';
import { externallyAccessible, usesClusterEndpoints, usesLocalEndpoints, type Endpoint, type ProxyState, type ServicePort } from '../../core/model.ts';
import {
  KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_MARK_MASQ, KUBE_NODEPORTS, KUBE_POSTROUTING,
  KUBE_PROXY_FIREWALL, KUBE_SERVICES, endpointChainName, isServiceChainName, probability, serviceChains,
} from './names.ts';
import { NFACCT_CT_STATE_INVALID_DROPPED, NFACCT_LOCALHOST_NODEPORTS_ACCEPTED, type IptablesOptions } from './options.ts';

/** Lines of one section of the payload. */
class Lines {
  readonly lines: string[] = [];
  get count(): number {
    return this.lines.length;
  }
  write(line: string): void {
    this.lines.push(line);
  }
}

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
}

export interface Plan {
  payload: string;
  natRulesWritten: number;
  natRulesTotal: number;
  filterRules: number;
  /** every per-service nat chain the rules need (installed or written now) */
  activeNatChains: Set<string>;
  deletedChains: string[];
  /** service ports whose chains were written */
  writtenServices: number;
  largeClusterMode: boolean;
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
interface ServiceBlock {
  /** filter table rules (always written) */
  filter: string[];
  /** nat KUBE-SERVICES / KUBE-NODEPORTS rules (always written) */
  natTop: string[];
  /** declarations of the service's own nat chains (written when the service changed) */
  chains: string[];
  /** rules of the service's own nat chains */
  rules: string[];
  /** the service's own nat chains */
  active: string[];
}

interface RenderContext {
  opts: IptablesOptions;
  largeClusterMode: boolean;
  ifLocal: string;
  ifNotLocal: string;
  /** fingerprint of everything above, for the block cache */
  key: string;
}

const EMPTY: Endpoint[] = [];

// A service's block only changes when its ServicePort or endpoint list does (the trackers
// replace those objects on change) or the settings do: unchanged services are not rebuilt.
const blockCache = new WeakMap<ServicePort, { eps: Endpoint[]; key: string; block: ServiceBlock }>();

function serviceBlock(sp: ServicePort, eps: Endpoint[], ctx: RenderContext): ServiceBlock {
  const hit = blockCache.get(sp);
  if (hit && hit.eps === eps && hit.key === ctx.key) return hit.block;
  const block = renderService(sp, eps, ctx);
  blockCache.set(sp, { eps, key: ctx.key, block });
  return block;
}

function renderService(sp: ServicePort, eps: Endpoint[], ctx: RenderContext): ServiceBlock {
  const { opts, largeClusterMode, ifLocal, ifNotLocal } = ctx;
  const isIPv6 = opts.family === 6;
  const b: ServiceBlock = { filter: [], natTop: [], chains: [], rules: [], active: [] };
  const names = serviceChains(sp);
  const { nameString: svcName, protocol } = names;
  const cat = categorizeEndpoints(eps, sp, opts.nodeName, opts.nodeLabels);
  const { clusterEndpoints, localEndpoints, allReachableEndpoints, hasAnyEndpoints: hasEndpoints } = cat;

  const usesClusterPolicyChain = clusterEndpoints.length > 0 && usesClusterEndpoints(sp);
  const usesLocalPolicyChain = localEndpoints.length > 0 && usesLocalEndpoints(sp);
  let internalTrafficChain = names.svc;
  let hasInternalEndpoints = hasEndpoints;
  if (sp.internalPolicyLocal) {
    internalTrafficChain = names.svl;
    if (localEndpoints.length === 0) hasInternalEndpoints = false;
  }
  let externalPolicyChain = names.svc;
  let hasExternalEndpoints = hasEndpoints;
  if (sp.externalPolicyLocal) {
    externalPolicyChain = names.svl;
    if (localEndpoints.length === 0) hasExternalEndpoints = false;
  }
  const ext = names.ext;
  const usesExternalTrafficChain = hasEndpoints && externallyAccessible(sp);
  const usesFWChain = hasEndpoints && sp.loadBalancerVIPs.length > 0 && sp.loadBalancerSourceRanges.length > 0;
  const lbChain = usesFWChain ? names.fw : ext;

  let internalFilter = '';
  let externalFilter = '';
  if (!hasEndpoints) {
    internalFilter = externalFilter = `"${svcName} has no endpoints"`;
  } else {
    if (!hasInternalEndpoints) internalFilter = `"${svcName} has no local endpoints"`;
    if (!hasExternalEndpoints) externalFilter = `"${svcName} has no local endpoints"`;
  }
  const internalTarget = hasEndpoints ? 'DROP' : 'REJECT';
  const externalTarget = internalTarget;
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
  if (sp.healthCheckNodePort !== 0) {
    b.filter.push(`-A ${KUBE_NODEPORTS} -m comment --comment "${svcName} health check node port" -m tcp -p tcp --dport ${sp.healthCheckNodePort} -j ACCEPT`);
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
    if (!sp.externalPolicyLocal) {
      b.rules.push(`-A ${ext} -m comment --comment "masquerade traffic for ${svcName} external destinations" -j ${KUBE_MARK_MASQ}`);
    } else {
      if (opts.localDetector) {
        b.rules.push(`-A ${ext} -m comment --comment "pod traffic for ${svcName} external destinations" ${ifLocal} -j ${names.svc}`);
      }
      b.rules.push(`-A ${ext} -m comment --comment "masquerade LOCAL traffic for ${svcName} external destinations" -m addrtype --src-type LOCAL -j ${KUBE_MARK_MASQ}`);
      b.rules.push(`-A ${ext} -m comment --comment "route LOCAL traffic for ${svcName} external destinations" -m addrtype --src-type LOCAL -j ${names.svc}`);
    }
    if (hasExternalEndpoints) b.rules.push(`-A ${ext} -j ${externalPolicyChain}`);
  }

  if (usesFWChain) {
    const fw = names.fw;
    b.chains.push(chainLine(fw));
    b.active.push(fw);
    const head = `-A ${fw} -m comment --comment "${svcName} loadbalancer IP"`;
    let allowFromNode = false;
    for (const cidr of sp.loadBalancerSourceRanges) {
      b.rules.push(`${head} -s ${cidr} -j ${ext}`);
      if (opts.nodeIP && cidrContains(cidr, opts.nodeIP)) allowFromNode = true;
    }
    // A node reaching its own VIP-like LB IP loops back with the VIP as source.
    if (allowFromNode) for (const ip of sp.loadBalancerVIPs) b.rules.push(`${head} -s ${ip} -j ${ext}`);
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
  return b;
}

/** Builds the restore payload for one sync. */
export function planIptables(req: PlanRequest): Plan {
  const { state, opts } = req;
  const isIPv6 = opts.family === 6;
  const filterChains = new Lines();
  const filterRules = new Lines();
  const natChainsKept = new Lines();
  const natRulesKept = new Lines();
  const mark = opts.masqueradeMark;

  for (const c of [KUBE_SERVICES, KUBE_EXTERNAL_SERVICES, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_PROXY_FIREWALL]) filterChains.write(chainLine(c));
  for (const c of [KUBE_SERVICES, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_MARK_MASQ]) natChainsKept.write(chainLine(c));

  natRulesKept.write(`-A ${KUBE_POSTROUTING} -m mark ! --mark ${mark}/${mark} -j RETURN`);
  natRulesKept.write(`-A ${KUBE_POSTROUTING} -j MARK --xor-mark ${mark}`);
  natRulesKept.write(`-A ${KUBE_POSTROUTING} -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE${opts.hasRandomFully ? ' --random-fully' : ''}`);
  natRulesKept.write(`-A ${KUBE_MARK_MASQ} -j MARK --or-mark ${mark}`);

  if (!isIPv6 && opts.localhostNodePorts) {
    // CVE-2020-8558: route_localnet makes 127/8 reachable from outside; drop such packets.
    filterChains.write(chainLine(KUBE_FIREWALL));
    filterRules.write(`-A ${KUBE_FIREWALL} -m comment --comment "block incoming localnet connections" -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP`);
  }

  const active = new Set<string>();
  const services = sortedServices(state);
  let totalEndpoints = 0;
  for (const sp of services) totalEndpoints += state.endpoints.get(sp.key)?.length ?? 0;
  const largeClusterMode = totalEndpoints > opts.largeClusterEndpointsThreshold;
  const ctx: RenderContext = {
    opts,
    largeClusterMode,
    ifLocal: opts.localDetector ? opts.localDetector.ifLocal.join(' ') : '',
    ifNotLocal: opts.localDetector ? opts.localDetector.ifNotLocal.join(' ') : '',
    key: '',
  };
  ctx.key = JSON.stringify([opts, largeClusterMode]);
  let writtenServices = 0;
  let skippedRules = 0;

  for (const sp of services) {
    const b = serviceBlock(sp, state.endpoints.get(sp.key) ?? EMPTY, ctx);
    for (const l of b.filter) filterRules.write(l);
    for (const l of b.natTop) natRulesKept.write(l);
    for (const c of b.active) active.add(c);
    // Unchanged services' chains are already installed: count their rules, don't write them.
    if (req.full || !req.changed || req.changed.has(sp.serviceKey)) {
      writtenServices++;
      for (const l of b.chains) natChainsKept.write(l);
      for (const l of b.rules) natRulesKept.write(l);
    } else {
      skippedRules += b.rules.length;
    }
  }

  const deletedChains: string[] = [];
  if (req.installedNatChains && req.deleteStale !== false) {
    for (const chain of req.installedNatChains) {
      if (active.has(chain) || !isServiceChainName(chain)) continue;
      natChainsKept.write(chainLine(chain));
      natRulesKept.write(`-X ${chain}`);
      deletedChains.push(chain);
    }
  }

  // The NodePort catch-all must be the last rule of nat KUBE-SERVICES.
  const last = `-A ${KUBE_SERVICES} -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain"`;
  if (opts.nodePorts.matchAll) {
    const dst = isIPv6 ? ' ! -d ::1/128' : opts.localhostNodePorts ? '' : ' ! -d 127.0.0.0/8';
    natRulesKept.write(`${last} -m addrtype --dst-type LOCAL${dst} -j ${KUBE_NODEPORTS}`);
  } else {
    for (const ip of opts.nodePorts.ips) {
      if (isLoopbackIP(ip) && (isIPv6 || !opts.localhostNodePorts)) continue;
      natRulesKept.write(`${last} -d ${ip} -j ${KUBE_NODEPORTS}`);
    }
  }

  if (!opts.conntrackTCPLiberal) {
    // INVALID packets would otherwise reset connections (kubernetes#74839).
    const acct = opts.nfacctCTStateInvalidDropped ? ` -m nfacct --nfacct-name ${NFACCT_CT_STATE_INVALID_DROPPED}` : '';
    filterRules.write(`-A ${KUBE_FORWARD} -m conntrack --ctstate INVALID${acct} -j DROP`);
  }
  filterRules.write(`-A ${KUBE_FORWARD} -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark}/${mark} -j ACCEPT`);
  filterRules.write(`-A ${KUBE_FORWARD} -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`);

  const payload =
    '*filter\n' + filterChains.lines.join('\n') + '\n' + (filterRules.lines.length ? filterRules.lines.join('\n') + '\n' : '') + 'COMMIT\n' +
    '*nat\n' + natChainsKept.lines.join('\n') + '\n' + natRulesKept.lines.join('\n') + '\nCOMMIT\n';
  return {
    payload,
    natRulesWritten: natRulesKept.count - deletedChains.length,
    natRulesTotal: natRulesKept.count + skippedRules - deletedChains.length,
    filterRules: filterRules.count,
    activeNatChains: active,
    deletedChains,
    writtenServices,
    largeClusterMode,
  };
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
