// Dry-run text of a plan: what the proxier would put on the host, section by section.
import { formatTable } from '../../kernel/ipvs/model.ts';
import { formatIPSets } from '../../kernel/ipset/model.ts';
import { DUMMY_DEVICE } from './names.ts';
import type { IpvsPlan } from './plan-model.ts';

export function renderPlan(p: IpvsPlan): string {
  const out: string[] = [];
  out.push('# sysctls');
  for (const s of p.sysctls) {
    const when = s.minKernel || s.belowKernel ? `  # kernels ${s.minKernel ?? ''}..${s.belowKernel ? `<${s.belowKernel}` : ''} only` : '';
    out.push(`${s.name}=${s.value}${when}`);
  }
  if (p.timeouts) out.push('# ipvsadm timeouts', `ipvsadm --set ${p.timeouts.tcp} ${p.timeouts.tcpFin} ${p.timeouts.udp}`);
  out.push(`# addresses on ${DUMMY_DEVICE} (dummy device)`);
  for (const a of p.boundAddresses) out.push(`ip addr add ${a}/${a.includes(':') ? 128 : 32} dev ${DUMMY_DEVICE}`);
  out.push('# ipset restore');
  out.push(formatIPSets(p.sets).trimEnd());
  out.push('# ipvsadm -R');
  out.push(formatTable(p.table).trimEnd());
  out.push(`# ${p.family === 6 ? 'ip6tables' : 'iptables'}-restore --noflush`);
  out.push(p.iptables.trimEnd());
  if (p.rejected.length) out.push('# left out: the kernel would refuse these');
  for (const r of p.rejected) out.push(`#   ${r.owner || '-'}: ${r.what}: ${r.reason}`);
  return out.filter((l) => l !== '').join('\n') + '\n';
}
