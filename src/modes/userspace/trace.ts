// Which endpoints a packet to VIP:port reaches in userspace mode, from the planned state.
// Pure. It walks the plan as the kernel and the proxy would: a bound listener, else the nat
// DNAT rules in order (their source matches: the eTP Local short-circuit of pods and the
// node), else the filter DROPs; then the listener's loadBalancerSourceRanges check at
// accept. The proxy re-originates every connection from the node, so backends never see
// the client's address: `masq` is true whenever the packet is forwarded.
import { canonicalIP, isLoopback, joinHostPort } from '../../core/ip.ts';
import { settingsOf, type PlanInput } from '../../core/nodeview.ts';
import type { TraceResult } from '../trace-types.ts';
import { planUserspace, sctpRefusal, sourceAllowed, walkPlan, type PlanOptions } from './plan.ts';

export function traceUserspace(
  input: PlanInput,
  req: { from: string; to: string; port: number; protocol: 'TCP' | 'UDP' | 'SCTP' },
  opts: PlanOptions = { redirect: true },
): TraceResult {
  const plan = planUserspace(input, opts);
  if (req.protocol === 'SCTP') {
    const notes = plan.sctpRefused.length ? plan.sctpRefused.map(sctpRefusal) : ['the userspace proxy does not forward SCTP'];
    return { output: '', masq: false, rules: [], notes };
  }
  const from = canonicalIP(req.from) ?? req.from;
  const settings = settingsOf(input);
  const local = isLoopback(from) || input.node.nodeIPs.includes(from) || settings.nodeIPs.includes(from);
  const hit = walkPlan(plan, input, { from, local }, req.to, req.port, req.protocol);
  if (!hit) return { output: '', masq: false, rules: [], notes: ['no userspace listener or rule matches this destination'] };
  if (hit.kind === 'drop') {
    const d = hit.drop;
    return {
      output: 'DROP',
      masq: false,
      rules: [`KPROXY-USERSPACE-FILTER: -p ${d.protocol.toLowerCase()}${d.dst ? ` -d ${d.dst}` : ' --dst-type LOCAL'} --dport ${d.dport} -j DROP (${d.comment})`],
      notes: ['a Local traffic policy without local endpoints: dropped, the client times out'],
    };
  }
  const { listener: l, rule: r } = hit;
  const rules: string[] = [];
  if (r) {
    const src = r.match.length ? ` ${r.match.join(' ')}` : '';
    rules.push(`${r.chain}:${src} -p ${r.protocol.toLowerCase()}${r.dst ? ` -d ${r.dst}` : ''} --dport ${r.dport} -j DNAT (${r.comment})`);
    rules.push(`listen ${l.protocol} ${joinHostPort(l.host, 0).replace(/:0$/, ':<proxy-port>')} (${l.servicePortKey}, policy ${l.policy})`);
  } else {
    rules.push(`listen ${l.protocol} ${joinHostPort(l.host, l.port)} (${l.servicePortKey}, policy ${l.policy})`);
  }
  if (!sourceAllowed(l.allowedSources, from)) {
    return {
      output: 'REJECT',
      masq: false,
      rules,
      notes: [`${from} is outside loadBalancerSourceRanges (${l.allowedSources!.join(', ')}): TCP connections are reset at accept, UDP datagrams dropped`],
    };
  }
  const notes: string[] = [];
  if (l.allowedSources) notes.push(`loadBalancerSourceRanges ${l.allowedSources.join(', ')} admit ${from}`);
  if (l.stickyMaxAgeSeconds > 0) notes.push(`sessionAffinity ClientIP, timeout ${l.stickyMaxAgeSeconds}s`);
  notes.push('round robin over the endpoints; a refused dial is retried on the next one');
  if (l.endpoints.length === 0) {
    // Upstream's kernel modes REJECT; the userspace proxy accepts and resets at once.
    return { output: 'REJECT', masq: false, rules, notes: [...notes, 'no endpoints: TCP connections are reset, UDP datagrams dropped'] };
  }
  const output = l.endpoints.map((e) => e.key).sort().join(', ');
  return { output, masq: true, rules, notes };
}
