// Admission of a new connection (TCP) or session (UDP) at accept time, built from a planned
// listener alone: the forwarders in kproxy's own process and in userspace workers call the
// same function on the same (serialisable) plan, so a worker admits exactly what the main
// process would. What to admit (loadBalancerSourceRanges, traffic policies) is decided by
// the node view and carried by the plan; this only turns the plan into a fast check.
import { ipToBigInt, parseCIDR } from '../../../core/ip.ts';
import type { PlannedListener } from '../plan.ts';
import type { AdmitFn } from './tcp.ts';
import { isIPv4, isIPv6 } from 'node:net';

/** An IPv4 address as an unsigned 32-bit number; null when not IPv4. */
function v4(ip: string): number | null {
  if (!isIPv4(ip)) return null;
  const p = ip.split('.');
  return ((+p[0] << 24) | (+p[1] << 16) | (+p[2] << 8) | +p[3]) >>> 0;
}

/** An IPv6 address as a BigInt; null when not IPv6. */
function v6(ip: string): bigint | null {
  if (!isIPv6(ip)) return null;
  try {
    return ipToBigInt(ip);
  } catch {
    return null;
  }
}

/**
 * The loadBalancerSourceRanges check of a listener: a precompiled list of (network, mask)
 * per family, so the accept path does integer compares only.
 */
function sourceRangeCheck(allowed: string[]): AdmitFn {
  const four: [number, number][] = [];
  const six: [bigint, bigint][] = [];
  for (const c of allowed) {
    const p = parseCIDR(c);
    if (!p) continue;
    if (p.family === 4) {
      const mask = p.prefix === 0 ? 0 : (~0 << (32 - p.prefix)) >>> 0;
      four.push([(v4(p.ip)! & mask) >>> 0, mask]);
    } else {
      const mask = p.prefix === 0 ? 0n : ((1n << 128n) - 1n) ^ ((1n << BigInt(128 - p.prefix)) - 1n);
      six.push([v6(p.ip)! & mask, mask]);
    }
  }
  return (remote) => {
    const a = v4(remote);
    if (a !== null) return four.some(([net, mask]) => ((a & mask) >>> 0) === net);
    const b = v6(remote);
    if (b !== null) return six.some(([net, mask]) => (b & mask) === net);
    return false;
  };
}

/** The admission check of a listener; undefined when every client is admitted (the fast path). */
export function admissionFor(listener: PlannedListener): AdmitFn | undefined {
  return listener.allowedSources ? sourceRangeCheck(listener.allowedSources) : undefined;
}
