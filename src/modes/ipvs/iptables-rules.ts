// The iptables rules of the ipvs mode (upstream's writeIptablesRules): IPVS itself does not
// masquerade, so ipset matches decide which packets get KUBE-MARK-MASQ, plus the filter
// chains for source ranges and VIP access. Rendered as iptables-restore text for
// `--noflush`: only our chains are declared (and so replaced). Pure: no I/O.
import { CHAIN, FILTER_CHAINS, JUMPS, NAT_CHAINS, SET_INFO, SET_RULES, setName, type SetKey } from './names.ts';
import type { IPSetTable } from '../../kernel/ipset/model.ts';
import type { LBNoNodeAccess } from './plan-model.ts';
import { appendedLines, readSave } from '../../kernel/iptables/save.ts';

export interface IptablesInput {
  family: 4 | 6;
  sets: IPSetTable;
  /** notLocal: the detector's "not from a local pod" match (`! -s CIDR`, `! -i br0`), else from clusterCIDR */
  masq: { all: boolean; clusterCIDR: string | null; notLocal?: string | null; mark: string };
  lbNoNodeAccess: LBNoNodeAccess[];
}

function quote(s: string): string {
  return `"${s}"`;
}

export function renderIptables(inp: IptablesInput): string {
  const name = (k: SetKey) => setName(k, inp.family);
  const isEmpty = (k: SetKey) => (inp.sets.get(name(k))?.entries.size ?? 0) === 0;
  const comment = (k: SetKey) => quote(SET_INFO.find((s) => s.key === k)!.comment);
  const { mark } = inp.masq;
  const nat: string[] = [];
  const filter: string[] = [];

  nat.push(`-A ${CHAIN.services} -s ${inp.family === 6 ? '::1/128' : '127.0.0.0/8'} -j RETURN`);

  for (const r of SET_RULES) {
    if (isEmpty(r.key)) continue;
    const proto = r.proto ? ` -p ${r.proto}` : '';
    const line = `-A ${r.from}${proto} -m comment --comment ${comment(r.key)} -m set --match-set ${name(r.key)} ${r.match} -j ${r.to}`;
    (r.table === 'filter' ? filter : nat).push(line);
  }

  if (!isEmpty('clusterIP')) {
    const base = `-A ${CHAIN.services} -m comment --comment ${comment('clusterIP')} -m set --match-set ${name('clusterIP')}`;
    if (inp.masq.all) nat.push(`${base} dst,dst -j ${CHAIN.markMasq}`);
    // traffic from outside the cluster (not from a local pod) to a VIP may bounce off-node: masquerade it
    else if (inp.masq.notLocal ?? (inp.masq.clusterCIDR ? `! -s ${inp.masq.clusterCIDR}` : null)) {
      nat.push(`${base} dst,dst ${inp.masq.notLocal ?? `! -s ${inp.masq.clusterCIDR}`} -j ${CHAIN.markMasq}`);
    }
    // without a cluster CIDR only node-originated traffic sourced from a VIP is masqueraded
    else nat.push(`${base} src,dst -j ${CHAIN.markMasq}`);
  }

  const externalIPRules = (base: string) => {
    nat.push(`${base} -m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT`);
    nat.push(`${base} -m addrtype --dst-type LOCAL -j ACCEPT`);
  };
  if (!isEmpty('externalIP')) {
    const base = `-A ${CHAIN.services} -m comment --comment ${comment('externalIP')} -m set --match-set ${name('externalIP')} dst,dst`;
    nat.push(`${base} -j ${CHAIN.markMasq}`);
    externalIPRules(base);
  }
  if (!isEmpty('externalIPLocal')) {
    externalIPRules(`-A ${CHAIN.services} -m comment --comment ${comment('externalIPLocal')} -m set --match-set ${name('externalIPLocal')} dst,dst`);
  }

  nat.push(`-A ${CHAIN.services} -m addrtype --dst-type LOCAL -j ${CHAIN.nodePort}`);
  nat.push(`-A ${CHAIN.loadBalancer} -j ${CHAIN.markMasq}`);
  filter.push(`-A ${CHAIN.sourceRangesFirewall} -j DROP`);
  for (const e of inp.lbNoNodeAccess) {
    filter.push(`-A ${CHAIN.ipvsOutFilter} -s ${e.ip} -m ipvs --vaddr ${e.ip} --vproto ${e.protocol} --vport ${e.port} -j DROP`);
  }
  // accept what IPVS will take, in case later rules of other software would drop it
  for (const k of ['clusterIP', 'loadBalancer'] as SetKey[]) {
    if (!isEmpty(k)) nat.push(`-A ${CHAIN.services} -m set --match-set ${name(k)} dst,dst -j ACCEPT`);
  }

  filter.push(`-A ${CHAIN.forward} -m comment --comment "kubernetes forwarding rules" -m mark --mark ${mark}/${mark} -j ACCEPT`);
  filter.push(`-A ${CHAIN.forward} -m comment --comment "kubernetes forwarding conntrack rule" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT`);
  filter.push(`-A ${CHAIN.nodePort} -m comment --comment ${comment('healthCheckNodePort')} -m set --match-set ${name('healthCheckNodePort')} dst -j ACCEPT`);
  // VIPs on kube-ipvs0 must not expose host ports (kubernetes#72236)
  for (const [k, m] of [['loadBalancer', 'dst,dst'], ['clusterIP', 'dst,dst'], ['externalIP', 'dst,dst'], ['externalIPLocal', 'dst,dst'], ['healthCheckNodePort', 'dst']] as Array<[SetKey, string]>) {
    filter.push(`-A ${CHAIN.ipvsFilter} -m set --match-set ${name(k)} ${m} -j RETURN`);
  }
  filter.push(`-A ${CHAIN.ipvsFilter} -m conntrack --ctstate NEW -m set --match-set ${name('ipvsIPs')} dst -j REJECT`);

  nat.push(`-A ${CHAIN.postrouting} -m mark ! --mark ${mark}/${mark} -j RETURN`);
  // clear the mark so a packet re-traversing the stack is not masqueraded twice
  nat.push(`-A ${CHAIN.postrouting} -j MARK --xor-mark ${mark}`);
  nat.push(`-A ${CHAIN.postrouting} -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully`);
  nat.push(`-A ${CHAIN.markMasq} -j MARK --or-mark ${mark}`);

  return [
    '*nat',
    ...NAT_CHAINS.map((c) => `:${c} - [0:0]`),
    ...nat,
    'COMMIT',
    '*filter',
    ...FILTER_CHAINS.map((c) => `:${c} - [0:0]`),
    ...filter,
    'COMMIT',
    '',
  ].join('\n');
}

/** a jump rule as iptables-save prints it */
export function jumpRule(j: { from: string; to: string; comment: string }): string {
  return `-A ${j.from} -m comment --comment "${j.comment}" -j ${j.to}`;
}

/** rule lines per table in iptables-save text (the iptables package's one reader) */
function savedTables(saved: string): Map<string, { chains: Set<string>; rules: string[] }> {
  return new Map([...readSave(saved)].map(([name, t]) => [name, { chains: t.declared, rules: appendedLines(t) }]));
}

/**
 * Adds `-I` lines for the jumps from built-in chains that `saved` (iptables-save text) lacks,
 * so rules and jumps go in one iptables-restore.
 */
export function withMissingJumps(text: string, saved: string): string {
  const tables = savedTables(saved);
  let out = text;
  for (const table of ['nat', 'filter']) {
    const have = tables.get(table)?.rules ?? [];
    const add = JUMPS.filter((j) => j.table === table && !have.includes(jumpRule(j))).map((j) => jumpRule(j).replace(/^-A /, '-I '));
    if (!add.length) continue;
    const start = out.indexOf(`*${table}\n`);
    const commit = out.indexOf('COMMIT\n', start);
    out = out.slice(0, commit) + add.join('\n') + '\n' + out.slice(commit);
  }
  return out;
}
