// Names the ipvs mode shares with upstream kube-proxy (pkg/proxy/ipvs): the dummy device,
// iptables chains, ipsets (name, type, comment) and which iptables rule matches each set.
// Keeping upstream's names means upstream's docs, dashboards and debugging habits apply.
import type { IPSetType } from '../../kernel/ipset/model.ts';

export const DUMMY_DEVICE = 'kube-ipvs0';

export const SET = {
  loopBack: 'KUBE-LOOP-BACK',
  clusterIP: 'KUBE-CLUSTER-IP',
  externalIP: 'KUBE-EXTERNAL-IP',
  externalIPLocal: 'KUBE-EXTERNAL-IP-LOCAL',
  loadBalancer: 'KUBE-LOAD-BALANCER',
  loadBalancerFW: 'KUBE-LOAD-BALANCER-FW',
  loadBalancerLocal: 'KUBE-LOAD-BALANCER-LOCAL',
  loadBalancerSourceIP: 'KUBE-LOAD-BALANCER-SOURCE-IP',
  loadBalancerSourceCIDR: 'KUBE-LOAD-BALANCER-SOURCE-CIDR',
  nodePortTCP: 'KUBE-NODE-PORT-TCP',
  nodePortLocalTCP: 'KUBE-NODE-PORT-LOCAL-TCP',
  nodePortUDP: 'KUBE-NODE-PORT-UDP',
  nodePortLocalUDP: 'KUBE-NODE-PORT-LOCAL-UDP',
  nodePortSCTP: 'KUBE-NODE-PORT-SCTP-HASH',
  nodePortLocalSCTP: 'KUBE-NODE-PORT-LOCAL-SCTP-HASH',
  healthCheckNodePort: 'KUBE-HEALTH-CHECK-NODE-PORT',
  ipvsIPs: 'KUBE-IPVS-IPS',
} as const;

export type SetKey = keyof typeof SET;

export interface SetInfo {
  key: SetKey;
  type: IPSetType;
  comment: string;
}

/** upstream's ipsetInfo, in its order */
export const SET_INFO: SetInfo[] = [
  { key: 'loopBack', type: 'hash:ip,port,ip', comment: 'Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose' },
  { key: 'clusterIP', type: 'hash:ip,port', comment: 'Kubernetes service cluster ip + port for masquerade purpose' },
  { key: 'externalIP', type: 'hash:ip,port', comment: 'Kubernetes service external ip + port for masquerade and filter purpose' },
  { key: 'externalIPLocal', type: 'hash:ip,port', comment: 'Kubernetes service external ip + port with externalTrafficPolicy=local' },
  { key: 'loadBalancer', type: 'hash:ip,port', comment: 'Kubernetes service lb portal' },
  { key: 'loadBalancerFW', type: 'hash:ip,port', comment: 'Kubernetes service load balancer ip + port for load balancer with sourceRange' },
  { key: 'loadBalancerLocal', type: 'hash:ip,port', comment: 'Kubernetes service load balancer ip + port with externalTrafficPolicy=local' },
  { key: 'loadBalancerSourceIP', type: 'hash:ip,port,ip', comment: 'Kubernetes service load balancer ip + port + source IP for packet filter purpose' },
  { key: 'loadBalancerSourceCIDR', type: 'hash:ip,port,net', comment: 'Kubernetes service load balancer ip + port + source cidr for packet filter purpose' },
  { key: 'nodePortTCP', type: 'bitmap:port', comment: 'Kubernetes nodeport TCP port for masquerade purpose' },
  { key: 'nodePortLocalTCP', type: 'bitmap:port', comment: 'Kubernetes nodeport TCP port with externalTrafficPolicy=local' },
  { key: 'nodePortUDP', type: 'bitmap:port', comment: 'Kubernetes nodeport UDP port for masquerade purpose' },
  { key: 'nodePortLocalUDP', type: 'bitmap:port', comment: 'Kubernetes nodeport UDP port with externalTrafficPolicy=local' },
  { key: 'nodePortSCTP', type: 'hash:ip,port', comment: "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'" },
  { key: 'nodePortLocalSCTP', type: 'hash:ip,port', comment: "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'" },
  { key: 'healthCheckNodePort', type: 'bitmap:port', comment: 'Kubernetes health check node port' },
  { key: 'ipvsIPs', type: 'hash:ip', comment: 'Addresses on the ipvs interface' },
];

/**
 * The kernel name of a set for a family: IPv6 sets get the "KUBE-6-" prefix so that both
 * families can coexist (upstream's rule, including its truncation to ipset's 31 characters).
 */
export function setName(key: SetKey, family: 4 | 6): string {
  const base = SET[key];
  if (family === 4) return base;
  return base.replace(/^KUBE-/, 'KUBE-6-').slice(0, 31);
}

/** every set name this mode may create, both families (for cleanup and ownership checks) */
export function allSetNames(): string[] {
  return [4, 6].flatMap((f) => SET_INFO.map((s) => setName(s.key, f as 4 | 6)));
}

export const CHAIN = {
  services: 'KUBE-SERVICES',
  postrouting: 'KUBE-POSTROUTING',
  markMasq: 'KUBE-MARK-MASQ',
  nodePort: 'KUBE-NODE-PORT',
  loadBalancer: 'KUBE-LOAD-BALANCER',
  forward: 'KUBE-FORWARD',
  proxyFirewall: 'KUBE-PROXY-FIREWALL',
  sourceRangesFirewall: 'KUBE-SOURCE-RANGES-FIREWALL',
  ipvsFilter: 'KUBE-IPVS-FILTER',
  ipvsOutFilter: 'KUBE-IPVS-OUT-FILTER',
} as const;

export const NAT_CHAINS = [CHAIN.services, CHAIN.postrouting, CHAIN.nodePort, CHAIN.loadBalancer, CHAIN.markMasq];
export const FILTER_CHAINS = [
  CHAIN.forward,
  CHAIN.nodePort,
  CHAIN.proxyFirewall,
  CHAIN.sourceRangesFirewall,
  CHAIN.ipvsFilter,
  CHAIN.ipvsOutFilter,
];

/** jumps from built-in chains into ours (upstream's iptablesJumpChain), prepended once */
export const JUMPS: Array<{ table: 'nat' | 'filter'; from: string; to: string; comment: string }> = [
  { table: 'nat', from: 'OUTPUT', to: CHAIN.services, comment: 'kubernetes service portals' },
  { table: 'nat', from: 'PREROUTING', to: CHAIN.services, comment: 'kubernetes service portals' },
  { table: 'nat', from: 'POSTROUTING', to: CHAIN.postrouting, comment: 'kubernetes postrouting rules' },
  { table: 'filter', from: 'FORWARD', to: CHAIN.forward, comment: 'kubernetes forwarding rules' },
  { table: 'filter', from: 'INPUT', to: CHAIN.nodePort, comment: 'kubernetes health check rules' },
  { table: 'filter', from: 'INPUT', to: CHAIN.proxyFirewall, comment: 'kube-proxy firewall rules' },
  { table: 'filter', from: 'FORWARD', to: CHAIN.proxyFirewall, comment: 'kube-proxy firewall rules' },
  { table: 'filter', from: 'INPUT', to: CHAIN.ipvsFilter, comment: 'kubernetes ipvs access filter' },
  { table: 'filter', from: 'OUTPUT', to: CHAIN.ipvsOutFilter, comment: 'kubernetes ipvs access filter' },
];

/** upstream's ipsetWithIptablesChain: sets whose non-emptiness adds one match rule */
export const SET_RULES: Array<{
  key: SetKey;
  table: 'nat' | 'filter';
  from: string;
  to: string;
  match: string;
  proto?: 'tcp' | 'udp' | 'sctp';
}> = [
  { key: 'loopBack', table: 'nat', from: CHAIN.postrouting, to: 'MASQUERADE', match: 'dst,dst,src' },
  { key: 'loadBalancer', table: 'nat', from: CHAIN.services, to: CHAIN.loadBalancer, match: 'dst,dst' },
  { key: 'loadBalancerLocal', table: 'nat', from: CHAIN.loadBalancer, to: 'RETURN', match: 'dst,dst' },
  { key: 'nodePortLocalTCP', table: 'nat', from: CHAIN.nodePort, to: 'RETURN', match: 'dst', proto: 'tcp' },
  { key: 'nodePortTCP', table: 'nat', from: CHAIN.nodePort, to: CHAIN.markMasq, match: 'dst', proto: 'tcp' },
  { key: 'nodePortLocalUDP', table: 'nat', from: CHAIN.nodePort, to: 'RETURN', match: 'dst', proto: 'udp' },
  { key: 'nodePortUDP', table: 'nat', from: CHAIN.nodePort, to: CHAIN.markMasq, match: 'dst', proto: 'udp' },
  { key: 'nodePortLocalSCTP', table: 'nat', from: CHAIN.nodePort, to: 'RETURN', match: 'dst,dst', proto: 'sctp' },
  { key: 'nodePortSCTP', table: 'nat', from: CHAIN.nodePort, to: CHAIN.markMasq, match: 'dst,dst', proto: 'sctp' },
  { key: 'loadBalancerFW', table: 'filter', from: CHAIN.proxyFirewall, to: CHAIN.sourceRangesFirewall, match: 'dst,dst' },
  { key: 'loadBalancerSourceCIDR', table: 'filter', from: CHAIN.sourceRangesFirewall, to: 'RETURN', match: 'dst,dst,src' },
  { key: 'loadBalancerSourceIP', table: 'filter', from: CHAIN.sourceRangesFirewall, to: 'RETURN', match: 'dst,dst,src' },
];

/** kernel modules the mode needs besides the scheduler's */
export const BASE_MODULES = ['ip_vs', 'nf_conntrack'];

export function schedulerModule(scheduler: string): string {
  return `ip_vs_${scheduler}`;
}
