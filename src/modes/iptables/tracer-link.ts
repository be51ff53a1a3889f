// The iptables tracer (parse.ts / trace.ts) is written separately; the planner side uses it
// only through this narrow signature, so either can change its internals freely.
import { traceIptables } from './trace.ts';
import { kproxyError } from '../../errors.ts';

export interface TraceFlow {
  sourceIP: string;
  /** "TCP" | "UDP" | "SCTP" ("" means TCP) */
  protocol: string;
  destIP: string;
  destPort: number;
}
export interface TraceOutcome {
  output: string;
  masq: boolean;
  rules: string[];
  notes?: string[];
}
export type TraceFn = (text: string, flow: TraceFlow, opts: { localIPs: string[] }) => TraceOutcome;

const PROTOCOLS = new Set(['TCP', 'UDP', 'SCTP', '']);

export async function loadTracer(): Promise<TraceFn> {
  return (text, flow, opts) => {
    const protocol = flow.protocol.toUpperCase();
    if (!PROTOCOLS.has(protocol)) throw kproxyError('KPROXY_TRACE_BAD_PROTOCOL', `${flow.protocol} (want tcp, udp or sctp)`);
    return traceIptables(text, { ...flow, protocol: protocol as 'TCP' | 'UDP' | 'SCTP' | '' }, opts);
  };
}
