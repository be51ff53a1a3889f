// Which endpoints a packet to VIP:port reaches in userspace mode, from the planned state.
// Pure. The proxy re-originates every connection from the node, so backends never see the
// client's address: `masq` is true whenever the packet is forwarded.
import { joinHostPort } from '../../core/ip.ts';
import type { PlanInput, TraceResult } from '../types.ts';
import { listenersFor, planUserspace, type PlanOptions } from './plan.ts';

export function traceUserspace(
  input: PlanInput,
  req: { from: string; to: string; port: number; protocol: 'TCP' | 'UDP' | 'SCTP' },
  opts: PlanOptions = { redirect: true },
): TraceResult {
  if (req.protocol === 'SCTP') {
    return { output: '', masq: false, rules: [], notes: ['the userspace proxy does not forward SCTP'] };
  }
  const plan = planUserspace(input, opts);
  const hits = listenersFor(plan, input, req.to, req.port, req.protocol);
  if (hits.length === 0) return { output: '', masq: false, rules: [], notes: ['no userspace listener or REDIRECT matches this destination'] };
  const { listener: l, frontend: f } = hits[0];
  const rules: string[] = [];
  if (l.kind === 'proxy') {
    const r = plan.redirects.find((x) => x.listenerId === l.id && x.dport === f.port && (f.ip === null ? x.dst === null : x.dst?.startsWith(`${f.ip}/`)));
    if (r) rules.push(`${r.chain}: -p ${r.protocol.toLowerCase()}${r.dst ? ` -d ${r.dst}` : ''} --dport ${r.dport} -j REDIRECT (${r.comment})`);
    rules.push(`listen ${l.protocol} ${joinHostPort(l.host, 0).replace(/:0$/, ':<proxy-port>')} (${l.servicePortKey}, policy ${l.policy})`);
  } else {
    rules.push(`listen ${l.protocol} ${joinHostPort(l.host, l.port)} (${l.servicePortKey}, policy ${l.policy})`);
  }
  const notes: string[] = [];
  if (l.stickyMaxAgeSeconds > 0) notes.push(`sessionAffinity ClientIP, timeout ${l.stickyMaxAgeSeconds}s`);
  notes.push('round robin over the endpoints; a refused dial is retried on the next one');
  if (l.endpoints.length === 0) {
    // Upstream's kernel modes REJECT; the userspace proxy accepts and resets at once.
    return { output: 'REJECT', masq: false, rules, notes: [...notes, 'no endpoints: TCP connections are reset, UDP datagrams dropped'] };
  }
  const output = l.endpoints.map((e) => e.key).sort().join(', ');
  return { output, masq: true, rules, notes };
}
