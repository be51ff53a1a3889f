// Cold start and one-service change through the mode's Proxier (bench/measure.ts), side by
// side with the raw references the scale goals are stated against: a *flushing*
// `iptables-restore` (nf_tables backend and legacy) and `nft -f` of the same rendered
// payload into an empty namespace.
import { ExecError } from '../src/kernel/runner.ts';
import { getMode } from '../src/modes/registry.ts';
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

/**
 * Another program on the host holding the xtables lock (legacy iptables takes one lock for
 * every namespace; on this shared machine other jobs run long legacy restores): not a limit
 * of what is measured, so the measurement is retried.
 */
export const xtablesLockBusy = (text: string | undefined) => /xtables\.lock|Another app is currently holding the xtables lock/i.test(text ?? '');
export const LOCK_RETRIES = 5;

/** One raw apply in a fresh namespace; +Infinity when it was killed at the limit, NaN when it failed. */
async function rawApply(nss: Namespaces, cmd: string, args: string[], payload: string, rename: Record<string, string>, timeoutMs: number, attempt = 0): Promise<number> {
  const ns = await nss.create('raw');
  try {
    const runner = new TimedRunner(ns, rename);
    const t0 = performance.now();
    try {
      const r = await runner.run(cmd, args, { input: payload, timeoutMs });
      if (r.code !== 0 && xtablesLockBusy(r.stderr) && attempt < LOCK_RETRIES) {
        await nss.delete(ns);
        await new Promise((res) => setTimeout(res, 3000));
        return rawApply(nss, cmd, args, payload, rename, timeoutMs, attempt + 1);
      }
      return r.code === 0 ? performance.now() - t0 : NaN;
    } catch (e) {
      if (e instanceof ExecError && e.code === 'KPROXY_EXEC_TIMEOUT') return Number.POSITIVE_INFINITY;
      throw e;
    }
  } finally {
    await nss.delete(ns);
  }
}

/** `rawIptables: false` skips the raw flushing iptables-restore (both backends): > 400 s at 50,000 here. */
export async function rawReferences(nss: Namespaces, n: number, endpoints: number, variants: Variant[], timeoutMs: number, rawIptables = true): Promise<RawRefs> {
  const out: RawRefs = { payloadLines: {} };
  if (rawIptables && variants.some((v) => modeOf(v) === 'iptables')) {
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
  /** run the raw flushing iptables-restore references (default true; nft -f always runs) */
  rawIptables?: boolean;
  log: (line: string) => void;
}

export async function coldPhase(nss: Namespaces, o: ColdOptions): Promise<ColdResult> {
  const raw = await rawReferences(nss, o.n, o.endpoints, o.variants, o.timeoutMs, o.rawIptables ?? true);
  o.log(`  raw N=${o.n}: iptables-restore ${fmt(raw.iptablesFlush)}, legacy ${fmt(raw.legacyFlush)}, nft -f ${fmt(raw.nft)}`);
  const samples: Sample[] = [];
  for (const v of o.variants) {
    let s: Sample;
    for (let attempt = 0; ; attempt++) {
      s = await measure(v, getMode(modeOf(v)), nss, {
        n: o.n, endpoints: o.endpoints, rep: 0, changes: o.changes, raw: false, verify: o.n <= 20_000, rawTimeoutMs: o.timeoutMs, execTimeoutMs: o.timeoutMs,
      });
      if (!xtablesLockBusy(s.error) || attempt >= LOCK_RETRIES) break;
      o.log(`  ${v} N=${o.n}: the xtables lock was held by another program; measuring again`);
      await new Promise((res) => setTimeout(res, 3000));
    }
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
