// Conntrack: clearing stale UDP/SCTP flows after a sync (upstream pkg/proxy/conntrack
// cleanup.go CleanStaleEntries), and never-DNATed TCP attempts (kproxy, not upstream) and the conntrack sysctls and oom_score_adj applied at start
// (upstream cmd/kube-proxy server_linux.go, conntrack.go). Everything through argument arrays.
import type { CommandRunner } from './runner.ts';
import type { Sysctl } from './sysctl.ts';
import type { StaleFlow } from '../core/nodeview.ts';
import type { Logger } from '../log.ts';
import { kproxyError } from '../errors.ts';
import { canonicalIP } from '../core/ip.ts';
import type { ConntrackSettings } from '../config/config.ts';

/**
 * The `conntrack -D` arguments that delete one stale flow, as upstream's filters:
 * - endpoint: flows to the service address (or, for a NodePort, to the port) DNATed to the
 *   gone endpoint (--orig-dst/--orig-port-dst and --dst-nat);
 * - service: flows to a service address that just got endpoints (--orig-dst, --orig-port-dst);
 * - nodePort: flows to the NodePort that just got endpoints (--orig-port-dst).
 */
export function conntrackDeleteArgs(family: 4 | 6, flow: StaleFlow): string[] {
  const args = ['-D', '-f', family === 6 ? 'ipv6' : 'ipv4', '-p', flow.protocol.toLowerCase()];
  switch (flow.kind) {
    case 'endpoint':
      if (flow.serviceIP) args.push('--orig-dst', flow.serviceIP);
      args.push('--orig-port-dst', String(flow.port), '--dst-nat', flow.endpointIP);
      break;
    case 'service':
      args.push('--orig-dst', flow.ip, '--orig-port-dst', String(flow.port));
      break;
    case 'nodePort':
      args.push('--orig-port-dst', String(flow.port));
      break;
    case 'unNATed':
      // never reached by one filter per flow: see unNATedDeletes (one listing, exact tuples)
      throw new Error('unNATed flows are cleared from a listing, not by a filter');
  }
  return args;
}

/** The listing that finds never-DNATed TCP attempts: unanswered SYNs only. */
export function unNATedListArgs(family: 4 | 6): string[] {
  return ['-L', '-f', family === 6 ? 'ipv6' : 'ipv4', '-p', 'tcp', '--state', 'SYN_SENT'];
}

interface Tuple {
  src: string;
  dst: string;
  sport: number;
  dport: number;
}

/** "tcp 6 119 SYN_SENT src=… dst=… sport=… dport=… [UNREPLIED] src=… …" → original and reply tuples */
export function parseConntrackLine(line: string): { orig: Tuple; reply: Tuple } | null {
  const re = /src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+)/g;
  const tuples: Tuple[] = [];
  for (const m of line.matchAll(re)) {
    const src = canonicalIP(m[1]);
    const dst = canonicalIP(m[2]);
    if (!src || !dst) return null;
    tuples.push({ src, dst, sport: Number(m[3]), dport: Number(m[4]) });
  }
  return tuples.length === 2 ? { orig: tuples[0], reply: tuples[1] } : null;
}

/**
 * The `conntrack -D` arguments, one exact tuple each, of the listed SYN_SENT entries that are
 * to a flagged service address:port (or to a flagged NodePort on any address) and were never
 * DNATed (the reply comes from the original destination). The delete repeats `--reply-src` and
 * the state, so an entry that got answered or replaced since the listing is left alone.
 */
export function unNATedDeletes(family: 4 | 6, flows: StaleFlow[], listing: string): string[][] {
  const addresses = new Set<string>();
  const nodePorts = new Set<number>();
  for (const f of flows) {
    if (f.kind !== 'unNATed') continue;
    if (f.ip === null) nodePorts.add(f.port);
    else addresses.add(`${canonicalIP(f.ip) ?? f.ip}|${f.port}`);
  }
  const out: string[][] = [];
  for (const line of listing.split('\n')) {
    if (!/\bSYN_SENT\b/.test(line)) continue;
    const t = parseConntrackLine(line);
    if (!t) continue;
    const { orig, reply } = t;
    if (reply.src !== orig.dst || reply.sport !== orig.dport) continue; // DNATed: a live attempt
    if (!addresses.has(`${orig.dst}|${orig.dport}`) && !nodePorts.has(orig.dport)) continue;
    out.push(['-D', '-f', family === 6 ? 'ipv6' : 'ipv4', '-p', 'tcp', '--orig-src', orig.src, '--orig-dst', orig.dst,
      '--sport', String(orig.sport), '--dport', String(orig.dport), '--reply-src', orig.dst, '--state', 'SYN_SENT']);
  }
  return out;
}

/** "conntrack v1.4.6 (conntrack-tools): 2 flow entries have been deleted." → 2; null when absent */
export function deletedCount(output: string): number | null {
  const m = /(\d+) flow entr(?:y|ies) ha(?:s|ve) been deleted/.exec(output);
  return m ? Number(m[1]) : null;
}

export interface CleanResult {
  /** entries the kernel deleted */
  deleted: number;
  /** conntrack calls that failed (logged) */
  failed: number;
  durationMs: number;
}

/** Clears one family's stale flows after its sync. Never throws: failures are logged. */
export interface StaleFlowCleaner {
  clean(family: 4 | 6, flows: StaleFlow[]): Promise<CleanResult>;
}

/** Same flow twice (e.g. two service addresses folded to one filter) is deleted once. */
function unique(family: 4 | 6, flows: StaleFlow[]): string[][] {
  const seen = new Map<string, string[]>();
  for (const f of flows) {
    if (f.kind === 'unNATed') continue;
    const a = conntrackDeleteArgs(family, f);
    seen.set(a.join(' '), a);
  }
  return [...seen.values()];
}

export function conntrackCleaner(runner: CommandRunner, log: Logger): StaleFlowCleaner {
  return {
    async clean(family, flows) {
      const started = Date.now();
      let deleted = 0;
      let failed = 0;
      /** One `conntrack -D`; exit 1 with "0 flow entries have been deleted" (nothing matched, or gone since a listing) is no error. */
      const remove = async (args: string[], what: string) => {
        try {
          const r = await runner.run('conntrack', args, { timeoutMs: 10_000 });
          const n = deletedCount(r.stderr + r.stdout);
          if (r.code === 0 || (r.code === 1 && n === 0)) {
            deleted += n ?? 0;
            return;
          }
          throw kproxyError('KPROXY_CONNTRACK_FAILED', `conntrack ${args.join(' ')} exited ${r.code}: ${(r.stderr || r.stdout).trim()}`);
        } catch (e) {
          failed++;
          log.warn({ code: 'KPROXY_CONNTRACK_FAILED', family, args, err: (e as Error).message }, what);
        }
      };
      for (const args of unique(family, flows)) {
        await remove(args, 'could not clear stale conntrack entries; UDP/SCTP clients may stay on a gone endpoint until the entry expires');
      }
      if (flows.some((f) => f.kind === 'unNATed')) {
        // one listing of the unanswered TCP attempts, then one delete per never-DNATed entry found
        let deletes: string[][] = [];
        try {
          const r = await runner.run('conntrack', unNATedListArgs(family), { timeoutMs: 10_000 });
          if (r.code !== 0) throw kproxyError('KPROXY_CONNTRACK_FAILED', `conntrack ${unNATedListArgs(family).join(' ')} exited ${r.code}: ${r.stderr.trim()}`);
          deletes = unNATedDeletes(family, flows, r.stdout);
        } catch (e) {
          failed++;
          log.warn({ code: 'KPROXY_CONNTRACK_FAILED', family, err: (e as Error).message }, 'could not list never-DNATed TCP attempts; a client reusing their source port may time out until they expire (120 s)');
        }
        for (const args of deletes) await remove(args, 'could not clear a never-DNATed TCP attempt');
      }
      return { deleted, failed, durationMs: Date.now() - started };
    },
  };
}

// ---- settings at start -------------------------------------------------------------------


/** upstream getConntrackMax: maxPerCore × cores, at least min; 0 when maxPerCore is 0 */
export function conntrackMax(c: ConntrackSettings, cpus: number): number {
  if (c.maxPerCore <= 0) return 0;
  return Math.max(c.maxPerCore * cpus, c.min);
}

/** The sysctls upstream sets at start, in its order, only the ones the config asks for. */
export function conntrackSysctls(c: ConntrackSettings, cpus: number): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  const max = conntrackMax(c, cpus);
  if (max > 0) out.push(['net.netfilter.nf_conntrack_max', String(max)]);
  if (c.tcpEstablishedTimeoutSec > 0) out.push(['net.netfilter.nf_conntrack_tcp_timeout_established', String(c.tcpEstablishedTimeoutSec)]);
  if (c.tcpCloseWaitTimeoutSec > 0) out.push(['net.netfilter.nf_conntrack_tcp_timeout_close_wait', String(c.tcpCloseWaitTimeoutSec)]);
  if (c.tcpBeLiberal) out.push(['net.netfilter.nf_conntrack_tcp_be_liberal', '1']);
  if (c.udpTimeoutSec > 0) out.push(['net.netfilter.nf_conntrack_udp_timeout', String(c.udpTimeoutSec)]);
  if (c.udpStreamTimeoutSec > 0) out.push(['net.netfilter.nf_conntrack_udp_timeout_stream', String(c.udpStreamTimeoutSec)]);
  return out;
}

/**
 * Applies the conntrack sysctls (through `sysctl`, /proc/sys) and oom_score_adj (through
 * `proc`, a Sysctl rooted at /proc: "self.oom_score_adj"). A setting the host does not allow
 * (read-only /proc/sys in a container, a key the kernel lacks, nf_conntrack_max outside the
 * initial namespace) is skipped; all skipped ones are reported in ONE warning.
 * Returns what was set and what was skipped.
 */
export async function applyStartSettings(
  opts: { conntrack: ConntrackSettings | null; oomScoreAdj: number | null; cpus: number; sysctl: Sysctl; proc: Sysctl; log: Logger },
): Promise<{ set: string[]; skipped: string[] }> {
  const set: string[] = [];
  const skipped: string[] = [];
  const apply = async (s: Sysctl, name: string, value: string) => {
    try {
      const cur = await s.get(name);
      if (cur === null) {
        skipped.push(`${name} (missing)`);
        return;
      }
      if (cur === value) return;
      await s.set(name, value);
      set.push(`${name}=${value}`);
    } catch (e) {
      skipped.push(`${name} (${(e as Error).message})`);
    }
  };
  if (opts.conntrack) for (const [name, value] of conntrackSysctls(opts.conntrack, opts.cpus)) await apply(opts.sysctl, name, value);
  if (opts.oomScoreAdj !== null) await apply(opts.proc, 'self.oom_score_adj', String(opts.oomScoreAdj));
  if (set.length) opts.log.info({ settings: set }, 'applied conntrack settings and oom_score_adj');
  if (skipped.length) {
    opts.log.warn({ code: 'KPROXY_SYSCTL_FAILED', skipped }, 'some conntrack settings or oom_score_adj could not be set; they keep the host values');
  }
  return { set, skipped };
}
