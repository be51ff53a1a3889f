// Every kernel mode's proxier reports the Service VIPs its planner left out (loopback,
// unspecified, link-local, multicast, broadcast: src/core/vip.ts) once per address, with
// KPROXY_SERVICE_IP_SKIPPED, so a hostile Service is visible without flooding the log.
import type { Logger } from '../log.ts';
import type { PlanInput } from '../core/nodeview.ts';
import type { ServicePort } from '../core/model.ts';
import { describeSkippedVIP, skippedVIPs } from '../core/vip.ts';
import { coded } from '../errors.ts';

export class SkippedVIPReporter {
  private readonly reported = new Set<string>();

  constructor(private readonly log: Logger) {}

  /** Logs each newly skipped VIP of this state once; returns how many VIPs are skipped. */
  report(input: PlanInput): number {
    const skipped = skippedVIPs(input.state.services.values());
    for (const s of skipped) {
      const text = describeSkippedVIP(s);
      if (this.reported.has(text)) continue;
      if (this.reported.size >= 10_000) this.reported.clear(); // bounded memory; at worst one repeat
      this.reported.add(text);
      this.log.warn({ code: 'KPROXY_SERVICE_IP_SKIPPED', service: s.servicePort, field: s.field, ip: s.ip }, coded('KPROXY_SERVICE_IP_SKIPPED', text));
    }
    return skipped.length;
  }
}

/**
 * The input restricted to the ports of `services` (what a partial sync may have changed):
 * through the node view's per-Service index when there is a view (O(changed)), else a walk.
 */
export function onlyServices(input: PlanInput, services: ReadonlySet<string>): PlanInput {
  const ports = new Map<string, ServicePort>();
  const index = input.view?.servicePorts;
  if (index) {
    for (const svc of services) {
      for (const k of index.get(svc) ?? []) {
        const sp = input.state.services.get(k);
        if (sp) ports.set(k, sp);
      }
    }
  } else if (services.size) for (const [k, sp] of input.state.services) if (services.has(sp.serviceKey)) ports.set(k, sp);
  return { ...input, state: { services: ports, endpoints: new Map() } };
}
