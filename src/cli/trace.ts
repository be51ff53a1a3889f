import { type CommonOptions, allocationConfig, effectiveConfig, resolveNodeName } from './options.ts';
import { modes } from '../modes/registry.ts';
import { planFromManifests } from './state.ts';
import { hostRunner } from '../kernel/runner.ts';
import { canonicalIP, ipFamily, joinHostPort } from '../core/ip.ts';
import type { TraceResult } from '../modes/trace-types.ts';
import { kproxyError } from '../errors.ts';
import { readFileSync } from 'node:fs';
import { parseRulesFormat, traceSavedRules, type RulesFile, type RulesFormat } from '../modes/trace-saved.ts';

interface TraceOptions extends CommonOptions {
  live?: boolean;
  /** saved rules files (--rules, repeatable) */
  rules?: string[];
  rulesFormat?: string;
  family?: string;
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
    ...(r.warnings ?? []).map((w) => `warning:    ${w}`),
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
  return JSON.stringify({ output: r.output, masq: r.masq, rules: r.rules, notes: r.notes ?? [], ...(r.warnings ? { warnings: r.warnings } : {}) });
}

/** The packet of --from, --to and --proto, checked. */
function packetOf(o: TraceOptions): { from: string; ip: string; port: number; protocol: 'TCP' | 'UDP' | 'SCTP' } {
  const from = canonicalIP(o.from);
  if (!from) throw kproxyError('KPROXY_TRACE_INPUT', `--from wants an IP, got ${JSON.stringify(o.from)}`);
  const { ip, port } = parseTarget(o.to);
  const protocol = o.proto.toUpperCase();
  if (protocol !== 'TCP' && protocol !== 'UDP' && protocol !== 'SCTP') throw kproxyError('KPROXY_TRACE_INPUT', `--proto wants tcp, udp or sctp, got ${o.proto}`);
  if (ipFamily(from) !== ipFamily(ip)) throw kproxyError('KPROXY_TRACE_INPUT', `--from ${from} and --to ${ip} are of different IP families; give two IPv4 or two IPv6 addresses`);
  return { from, ip, port, protocol };
}

/** `kproxy trace --rules FILE...`: the packet through a node's saved rules (src/modes/trace-saved.ts). */
function traceRulesCommand(o: TraceOptions): void {
  if (o.live || o.manifests) throw kproxyError('KPROXY_TRACE_INPUT', '--rules traces saved rules: give it without --live and --manifests');
  const { from, ip, port, protocol } = packetOf(o);
  const paths = o.rules!;
  const formats: RulesFormat[] = o.rulesFormat ? o.rulesFormat.split(',').map(parseRulesFormat) : [];
  if (formats.length > 1 && formats.length !== paths.length) {
    throw kproxyError('KPROXY_TRACE_INPUT', `--rules-format names ${formats.length} formats for ${paths.length} --rules files; give one for all, or one per file`);
  }
  const files: RulesFile[] = paths.map((name, i) => {
    let text: string;
    try {
      text = readFileSync(name, 'utf8');
    } catch (e) {
      throw kproxyError('KPROXY_TRACE_INPUT', `--rules ${name}: ${(e as Error).message}`);
    }
    return { name, text, format: formats.length === 1 ? formats[0] : formats[i] };
  });
  let family: 4 | 6 | undefined;
  if (o.family !== undefined) {
    const f = o.family.replace(/^(ipv|ip)/i, '');
    if (f !== '4' && f !== '6') throw kproxyError('KPROXY_TRACE_INPUT', `--family wants 4 or 6, got ${JSON.stringify(o.family)}`);
    family = f === '6' ? 6 : 4;
  }
  const nodeIPs = (o.nodeIp ?? '').split(',').map((s) => s.trim()).filter(Boolean);
  for (const n of nodeIPs) if (!canonicalIP(n)) throw kproxyError('KPROXY_TRACE_INPUT', `--node-ip wants IPs, got ${JSON.stringify(n)}`);
  const r = traceSavedRules({ files, from, to: ip, port, protocol, family, nodeIPs });
  const shown = { ...r, notes: [...r.read.map((x) => `read ${x}`), ...r.notes] };
  if (o.json) process.stdout.write(traceJson({ ...shown, warnings: r.warnings }) + '\n');
  else process.stdout.write(formatTrace(shown, `${protocol.toLowerCase()} ${from} -> ${joinHostPort(ip, port)} (saved ${r.mode} rules: ${paths.join(', ')})`));
}

export async function traceCommand(o: TraceOptions): Promise<void> {
  if (o.rules?.length) return traceRulesCommand(o);
  const cfg = effectiveConfig(o);
  const mode = modes[cfg.mode];
  if (!mode.trace) throw kproxyError('KPROXY_TRACE_UNSUPPORTED', `mode ${cfg.mode} has no tracer yet`);
  const { from, ip, port, protocol } = packetOf(o);
  if (!o.live && !o.manifests) throw kproxyError('KPROXY_TRACE_INPUT', 'give --manifests DIR (planned rules), --live (kernel state) or --rules FILE (saved rules)');
  // The packet's family picks the family's rules: ip6tables, the ip6 table, IPv6 virtual servers.
  const family = ipFamily(ip) === 6 ? 6 : 4;
  const alloc = { config: allocationConfig(o), statePath: o.manifestsState };
  const input = o.live ? undefined : await planFromManifests(o.manifests!, cfg, resolveNodeName(cfg), o.nodeIp, undefined, family, alloc);
  const r = await mode.trace({ from, to: ip, port, protocol, input, live: !!o.live }, { runner: hostRunner });
  if (o.json) process.stdout.write(traceJson(r) + '\n');
  else process.stdout.write(formatTrace(r, `${protocol.toLowerCase()} ${from} -> ${joinHostPort(ip, port)} (mode ${cfg.mode}${o.live ? ', live' : ''})`));
}
