// What every mode's tracer answers: the question (a packet's source, destination and
// protocol, through planned or live rules) and the answer. Types only.
import type { PlanInput } from '../core/nodeview.ts';

export interface TraceRequest {
  from: string;
  to: string;
  port: number;
  protocol: 'TCP' | 'UDP' | 'SCTP';
  /** planned state to trace through; absent with live */
  input?: PlanInput;
  live: boolean;
}

export interface TraceResult {
  /** "10.180.0.1:80, 10.180.0.2:80" | "REJECT" | "DROP" | "ACCEPT" | "" */
  output: string;
  masq: boolean;
  /** every rule matched, in order, as text */
  rules: string[];
  /** free-form extra facts (scheduler, affinity, ...) */
  notes?: string[];
  /** lines of a saved ruleset that could not be read and were left out, each named ("FILE line N: ...") */
  warnings?: string[];
}
