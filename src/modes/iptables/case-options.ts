// Planner options from an upstream conformance case's config.json. The upstream fake
// proxier (NewFakeProxier) sets its fields directly, so the case's values are taken
// literally (no NewProxier adjustments); absent keys get the fake's defaults. Pure.
import type { CaseConfig } from '../../conformance/case.ts';
import { canonicalIP, parseCIDR } from '../../core/ip.ts';
import { masqueradeMark } from '../../config/config.ts';
import {
  NFACCT_CT_STATE_INVALID_DROPPED, NFACCT_LOCALHOST_NODEPORTS_ACCEPTED, cidrDetector, detectorArgs, nodePortAddressing,
  type IptablesOptions, type LocalDetector,
} from './options.ts';

type Obj = Record<string, unknown>;

function pick(cfg: Obj, ...keys: string[]): unknown {
  for (const k of keys) if (k in cfg) return cfg[k];
  return undefined;
}

/** Addresses of the case's network interfaces ("ip/len" strings), in order. */
export function caseInterfaceIPs(cfg: CaseConfig): string[] {
  const ifs = pick(cfg, 'networkInterfaces', 'hostInterfaces') as Record<string, string[]> | undefined;
  const out: string[] = [];
  if (ifs && typeof ifs === 'object') {
    for (const addrs of Object.values(ifs)) {
      for (const a of addrs ?? []) {
        const ip = canonicalIP(String(a).split('/')[0]);
        if (ip && !out.includes(ip)) out.push(ip);
      }
    }
  }
  return out;
}

/** What the tracer treats as addrtype LOCAL: 127.0.0.1, ::1 and the test node IPs. */
export function caseLocalIPs(cfg: CaseConfig): string[] {
  const explicit = cfg.tracerLocalIPs;
  if (Array.isArray(explicit)) return explicit.map(String);
  const out = ['127.0.0.1', '::1'];
  const add = (ip: unknown) => {
    const c = typeof ip === 'string' ? canonicalIP(ip) : null;
    if (c && !out.includes(c)) out.push(c);
  };
  const tn = cfg.testNodeIPs;
  if (Array.isArray(tn)) tn.forEach(add);
  add(pick(cfg, 'nodeIP', 'proxierNodeIP'));
  caseInterfaceIPs(cfg).forEach(add);
  return out;
}

/**
 * The local-traffic detector: ClusterCIDR/NodeCIDR with a CIDR of the case's family, the
 * interface-based ones, or none (no key, null, a "none"/"NoOp" mode, or no usable CIDR).
 */
function detectorOf(raw: unknown, family: 4 | 6, topLevelCIDR: unknown): LocalDetector | null {
  const byCIDR = (cidr: unknown): LocalDetector | null => {
    const list = Array.isArray(cidr) ? cidr.map(String) : typeof cidr === 'string' ? cidr.split(',') : [];
    const c = list.map((x) => parseCIDR(x)).find((x) => x && x.family === family);
    return c ? cidrDetector(c.text) : null;
  };
  if (raw === undefined) return byCIDR(topLevelCIDR);
  if (raw === null || typeof raw !== 'object') return null;
  const d = raw as Obj;
  const mode = String(d.mode ?? '');
  if (mode === 'ClusterCIDR' || mode === 'NodeCIDR' || mode === '') {
    return byCIDR(pick(d, 'clusterCIDR', 'cidr', 'podCIDR', 'nodeCIDR', 'cidrs'));
  }
  if (mode === 'BridgeInterface') {
    const i = String(pick(d, 'bridgeInterface', 'interfaceName', 'interface') ?? '');
    return i ? detectorArgs({ kind: 'interface', name: i }) : null;
  }
  if (mode === 'InterfaceNamePrefix') {
    const p = String(pick(d, 'interfaceNamePrefix', 'prefix') ?? '');
    return p ? detectorArgs({ kind: 'interface-prefix', prefix: p }) : null;
  }
  return null;
}

function nfacctOf(raw: unknown): { invalid: boolean; localhost: boolean } {
  if (raw === undefined) return { invalid: true, localhost: true };
  if (Array.isArray(raw)) return { invalid: raw.includes(NFACCT_CT_STATE_INVALID_DROPPED), localhost: raw.includes(NFACCT_LOCALHOST_NODEPORTS_ACCEPTED) };
  if (raw && typeof raw === 'object') {
    const o = raw as Obj;
    return { invalid: o[NFACCT_CT_STATE_INVALID_DROPPED] === true, localhost: o[NFACCT_LOCALHOST_NODEPORTS_ACCEPTED] === true };
  }
  return { invalid: false, localhost: false };
}

export function caseOptions(cfg: CaseConfig): IptablesOptions {
  const family: 4 | 6 = cfg.ipFamily === 'IPv6' ? 6 : 4;
  const npa = pick(cfg, 'nodePortAddresses');
  const ifIPs = caseInterfaceIPs(cfg);
  const localIPs = ifIPs.length ? ifIPs : caseLocalIPs(cfg);
  const nf = nfacctOf(pick(cfg, 'nfacctCounters', 'nfAcctCounters', 'nfAcctCounter'));
  const nodeIP = pick(cfg, 'proxierNodeIP', 'nodeIP');
  const localhostNodePorts = cfg.localhostNodePorts !== false;
  return {
    family,
    node: {
      nodeName: cfg.nodeName ?? 'test-node',
      nodeLabels: (cfg.nodeLabels as Record<string, string>) ?? {},
      primaryNodeIP: typeof nodeIP === 'string' ? nodeIP : '192.168.0.2',
      loopbackVIPs: false,
    },
    masqueradeMark: typeof cfg.masqueradeMark === 'string' ? cfg.masqueradeMark : typeof cfg.masqueradeBit === 'number' ? masqueradeMark(cfg.masqueradeBit) : '0x4000',
    masqueradeAll: cfg.masqueradeAll === true,
    localDetector: detectorOf(pick(cfg, 'localDetector', 'localTrafficDetector', 'detectLocal'), family, pick(cfg, 'clusterCIDR', 'clusterCIDRs')),
    localhostNodePorts,
    nodePorts: nodePortAddressing(family, Array.isArray(npa) ? npa.map(String) : [], localIPs, localhostNodePorts),
    conntrackTCPLiberal: cfg.conntrackTCPLiberal === true,
    hasRandomFully: pick(cfg, 'iptablesHasRandomFully', 'hasRandomFully') === true,
    nfacctCTStateInvalidDropped: nf.invalid,
    nfacctLocalhostNodePortsAccepted: nf.localhost,
    largeClusterEndpointsThreshold: typeof cfg.largeClusterEndpointsThreshold === 'number' ? cfg.largeClusterEndpointsThreshold : 1000,
  };
}
