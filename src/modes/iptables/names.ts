// Chain names exactly as upstream's (pkg/proxy/iptables/proxier.go): SHA-256 of
// servicePortName + protocol [+ endpoint], base32 (std alphabet), first 16 characters.
// Names are cached per object because a large sync asks for the same ones again and again. Pure.
import { sha256Base32Prefix } from '../../core/chain-hash.ts';
import { flat } from '../../core/flat.ts';
import type { ServicePort } from '../../core/model.ts';

export const KUBE_SERVICES = 'KUBE-SERVICES';
export const KUBE_EXTERNAL_SERVICES = 'KUBE-EXTERNAL-SERVICES';
export const KUBE_NODEPORTS = 'KUBE-NODEPORTS';
export const KUBE_POSTROUTING = 'KUBE-POSTROUTING';
export const KUBE_MARK_MASQ = 'KUBE-MARK-MASQ';
export const KUBE_FORWARD = 'KUBE-FORWARD';
export const KUBE_PROXY_FIREWALL = 'KUBE-PROXY-FIREWALL';
export const KUBE_PROXY_CANARY = 'KUBE-PROXY-CANARY';
export const KUBE_FIREWALL = 'KUBE-FIREWALL';

const PREFIX_SVC = 'KUBE-SVC-';
const PREFIX_SVL = 'KUBE-SVL-';
const PREFIX_FW = 'KUBE-FW-';
const PREFIX_EXT = 'KUBE-EXT-';
const PREFIX_SEP = 'KUBE-SEP-';
const SERVICE_CHAIN_PREFIXES = [PREFIX_SVC, PREFIX_SVL, PREFIX_SEP, PREFIX_FW, PREFIX_EXT];

export function hash16(text: string): string {
  return sha256Base32Prefix(text, 16);
}

/** upstream's ServicePortName.String(): "ns/name:port", or "ns/name" for an unnamed port. */
export function servicePortNameString(sp: ServicePort): string {
  const n = sp.portName;
  return n.port === '' ? flat`${n.namespace}/${n.name}` : flat`${n.namespace}/${n.name}:${n.port}`;
}

export interface ServiceChains {
  nameString: string;
  protocol: string;
  svc: string;
  svl: string;
  fw: string;
  ext: string;
}

// Cached per ServicePort object: the trackers replace a ServicePort whenever its Service
// changes, so an entry is never stale, and the WeakMap drops it with the object (a cache keyed
// by name text would keep every name ever asked for: ~4 MB at 10,000 Services).
const serviceCache = new WeakMap<ServicePort, ServiceChains>();

export function serviceChains(sp: ServicePort): ServiceChains {
  let c = serviceCache.get(sp);
  if (!c) {
    const nameString = servicePortNameString(sp);
    const protocol = sp.protocol.toLowerCase();
    const h = hash16(nameString + protocol);
    c = { nameString, protocol, svc: flat`${PREFIX_SVC}${h}`, svl: flat`${PREFIX_SVL}${h}`, fw: flat`${PREFIX_FW}${h}`, ext: flat`${PREFIX_EXT}${h}` };
    serviceCache.set(sp, c);
  }
  return c;
}

/**
 * KUBE-SEP-… for one endpoint ("ip:port" / "[ip]:port") of a service port. Not cached here:
 * the renderer caches it per Endpoint object (service-block.ts sepName).
 */
export function endpointChainName(nameString: string, protocol: string, endpoint: string): string {
  return flat`${PREFIX_SEP}${hash16(nameString + protocol + endpoint)}`;
}

/** Per-service chains kproxy owns (the ones stale-chain cleanup may delete). */
export function isServiceChainName(chain: string): boolean {
  for (const p of SERVICE_CHAIN_PREFIXES) if (chain.startsWith(p)) return true;
  return false;
}

const probabilities: string[] = ['<bad value>'];

/** "%0.10f" of 1/n, as upstream prints the statistic match probability. */
export function probability(n: number): string {
  while (probabilities.length <= n) probabilities.push((1 / probabilities.length).toFixed(10));
  return probabilities[n];
}
