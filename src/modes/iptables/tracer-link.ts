// The iptables tracer (parse.ts / trace.ts) is written separately; the planner side uses it
// only through this narrow signature, so either can change its internals freely.
import { traceIptables, type TracePacket } from './trace.ts';
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

/** The flow with its protocol checked and upper-cased, as the tracer takes it. */
export function checkedFlow(flow: TraceFlow): TracePacket {
  const protocol = flow.protocol.toUpperCase();
  if (!PROTOCOLS.has(protocol)) throw kproxyError('KPROXY_TRACE_BAD_PROTOCOL', `${flow.protocol} (want tcp, udp or sctp)`);
  return { ...flow, protocol: protocol as TracePacket['protocol'] };
}

export async function loadTracer(): Promise<TraceFn> {
  return (text, flow, opts) => traceIptables(text, checkedFlow(flow), opts);
}
