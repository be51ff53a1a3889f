import { type CommonOptions, allocationConfig, effectiveConfig, resolveNodeName } from './options.ts';
import { modes } from '../modes/registry.ts';
import { planFromManifests } from './state.ts';
import { hostRunner } from '../kernel/runner.ts';
import { canonicalIP, ipFamily, joinHostPort } from '../core/ip.ts';
import type { TraceResult } from '../modes/trace-types.ts';
import { kproxyError } from '../errors.ts';

interface TraceOptions extends CommonOptions {
  live?: boolean;
  from: string;
  to: string;
  proto: string;
  json?: boolean;
}

export function parseTarget(to: string): { ip: string; port: number } {
  const m = /^(?:\[([^\]]+)\]|([^:]+)):(\d+)$/.exec(to);
  const ip = m ? canonicalIP(m[1] ?? m[2]) : null;
  const port = m ? Number(m[3]) : NaN;
  if (!ip || !(port >= 1 && port <= 65535)) throw kproxyError('KPROXY_TRACE_INPUT', `--to wants IP:PORT, got ${JSON.stringify(to)}`);
  return { ip, port };
}

export function formatTrace(r: TraceResult, pkt: string): string {
  const verdict = r.output === '' ? 'not handled by kproxy (the packet is left alone)' : /^(REJECT|DROP|ACCEPT)$/.test(r.output) ? r.output : 'DNAT';
  const lines = [
    `packet:     ${pkt}`,
    `verdict:    ${verdict}`,
    `endpoints:  ${/^(REJECT|DROP|ACCEPT)?$/.test(r.output) ? '-' : r.output}`,
    `masquerade: ${r.masq ? 'yes' : 'no'}`,
    ...(r.notes ?? []).map((n) => `note:       ${n}`),
    'rules matched:',
    ...r.rules.map((x, i) => `  ${String(i + 1).padStart(3)}. ${x}`),
  ];
  return lines.join('\n') + '\n';
}

/**
 * The `--json` answer: {"output", "masq", "rules"} plus "notes", so that what the tracer
 * assumed or could not parse reaches scripts too (never a silent "no match").
 */
export function traceJson(r: TraceResult): string {
  return JSON.stringify({ output: r.output, masq: r.masq, rules: r.rules, notes: r.notes ?? [] });
}

export async function traceCommand(o: TraceOptions): Promise<void> {
  const cfg = effectiveConfig(o);
  const mode = modes[cfg.mode];
  if (!mode.trace) throw kproxyError('KPROXY_TRACE_UNSUPPORTED', `mode ${cfg.mode} has no tracer yet`);
  const from = canonicalIP(o.from);
  if (!from) throw kproxyError('KPROXY_TRACE_INPUT', `--from wants an IP, got ${JSON.stringify(o.from)}`);
  const { ip, port } = parseTarget(o.to);
  const protocol = o.proto.toUpperCase();
  if (protocol !== 'TCP' && protocol !== 'UDP' && protocol !== 'SCTP') throw kproxyError('KPROXY_TRACE_INPUT', `--proto wants tcp, udp or sctp, got ${o.proto}`);
  if (!o.live && !o.manifests) throw kproxyError('KPROXY_TRACE_INPUT', 'give --manifests DIR (planned rules) or --live (kernel state)');
  // The packet's family picks the family's rules: ip6tables, the ip6 table, IPv6 virtual servers.
  const family = ipFamily(ip) === 6 ? 6 : 4;
  if (ipFamily(from) !== family) throw kproxyError('KPROXY_TRACE_INPUT', `--from ${from} and --to ${ip} are of different IP families; give two IPv4 or two IPv6 addresses`);
  const alloc = { config: allocationConfig(o), statePath: o.manifestsState };
  const input = o.live ? undefined : await planFromManifests(o.manifests!, cfg, resolveNodeName(cfg), o.nodeIp, undefined, family, alloc);
  const r = await mode.trace({ from, to: ip, port, protocol, input, live: !!o.live }, { runner: hostRunner });
  if (o.json) process.stdout.write(traceJson(r) + '\n');
  else process.stdout.write(formatTrace(r, `${protocol.toLowerCase()} ${from} -> ${joinHostPort(ip, port)} (mode ${cfg.mode}${o.live ? ', live' : ''})`));
}
