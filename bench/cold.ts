// Cold start and one-service change through the mode's Proxier (bench/measure.ts), side by
// side with the raw references the issue's goals are stated against: a *flushing*
// `iptables-restore` (nf_tables backend and legacy) and `nft -f` of the same rendered
// payload into an empty namespace.
import { ExecError } from '../src/exec/runner.ts';
import { getMode } from '../src/proxy/registry.ts';
import { measure, modeOf, type Sample, type Variant } from './measure.ts';
import { LEGACY_IPTABLES, TimedRunner, type Namespaces } from './netns.ts';
import { benchConfig, Workload } from './workload.ts';

export interface RawRefs {
  /** iptables-restore (nf_tables backend), flushing, into an empty namespace */
  iptablesFlush?: number;
  /** iptables-legacy-restore, flushing */
  legacyFlush?: number;
  /** nft -f of the nftables mode's payload */
  nft?: number;
  payloadLines: { iptables?: number; nftables?: number };
}

export interface ColdResult {
  n: number;
  samples: Sample[];
  raw: RawRefs;
}

/** One raw apply in a fresh namespace; +Infinity when it was killed at the limit, NaN when it failed. */
async function rawApply(nss: Namespaces, cmd: string, args: string[], payload: string, rename: Record<string, string>, timeoutMs: number): Promise<number> {
  const ns = await nss.create('raw');
  try {
    const runner = new TimedRunner(ns, rename);
    const t0 = performance.now();
    try {
      const r = await runner.run(cmd, args, { input: payload, timeoutMs });
      return r.code === 0 ? performance.now() - t0 : NaN;
    } catch (e) {
      if (e instanceof ExecError && e.code === 'KPROXY_EXEC_TIMEOUT') return Number.POSITIVE_INFINITY;
      throw e;
    }
  } finally {
    await nss.delete(ns);
  }
}

export async function rawReferences(nss: Namespaces, n: number, endpoints: number, variants: Variant[], timeoutMs: number): Promise<RawRefs> {
  const out: RawRefs = { payloadLines: {} };
  if (variants.some((v) => modeOf(v) === 'iptables')) {
    const payload = getMode('iptables').render(new Workload(n, endpoints, benchConfig('iptables')).input());
    out.payloadLines.iptables = payload.split('\n').length;
    if (variants.includes('iptables')) out.iptablesFlush = await rawApply(nss, 'iptables-restore', ['-w', '5'], payload, {}, timeoutMs);
    if (variants.includes('iptables-legacy')) out.legacyFlush = await rawApply(nss, 'iptables-restore', ['-w', '5'], payload, LEGACY_IPTABLES, timeoutMs);
  }
  if (variants.includes('nftables')) {
    const payload = getMode('nftables').render(new Workload(n, endpoints, benchConfig('nftables')).input());
    out.payloadLines.nftables = payload.split('\n').length;
    out.nft = await rawApply(nss, 'nft', ['-f', '-'], payload, {}, timeoutMs);
  }
  return out;
}

export interface ColdOptions {
  n: number;
  endpoints: number;
  variants: Variant[];
  /** in-process one-service changes after the first sync */
  changes: number;
  /** replaces the executors' limits, and limits each raw apply */
  timeoutMs: number;
  log: (line: string) => void;
}

export async function coldPhase(nss: Namespaces, o: ColdOptions): Promise<ColdResult> {
  const raw = await rawReferences(nss, o.n, o.endpoints, o.variants, o.timeoutMs);
  o.log(`  raw N=${o.n}: iptables-restore ${fmt(raw.iptablesFlush)}, legacy ${fmt(raw.legacyFlush)}, nft -f ${fmt(raw.nft)}`);
  const samples: Sample[] = [];
  for (const v of o.variants) {
    const s = await measure(v, getMode(modeOf(v)), nss, {
      n: o.n, endpoints: o.endpoints, rep: 0, changes: o.changes, raw: false, verify: o.n <= 20_000, rawTimeoutMs: o.timeoutMs, execTimeoutMs: o.timeoutMs,
    });
    samples.push(s);
    o.log(`  ${v} N=${o.n}: ${s.error ? `first sync FAILED after ${fmt(s.full.wallMs)}: ${s.error}` : `first sync ${fmt(s.full.wallMs)}, change ${s.changes.map((c) => fmt(c.wallMs)).join(' / ')}`}`);
  }
  return { n: o.n, samples, raw };
}

function fmt(ms: number | undefined): string {
  if (ms === undefined) return '–';
  if (Number.isNaN(ms)) return 'failed';
  if (!Number.isFinite(ms)) return 'timeout';
  return `${(ms / 1000).toFixed(2)} s`;
}
