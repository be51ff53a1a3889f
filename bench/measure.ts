// One measurement: one mode at one size, in namespaces of its own. Everything goes through
// the mode's public ModeModule / Proxier interface (src/modes/types.ts); the raw
// iptables-restore / nft references are timed by running the binaries directly on the
// payload the mode renders.
import type { ModeName } from '../src/config/config.ts';
import { silentLogger } from '../src/log.ts';
import { ExecError, type RunResult } from '../src/kernel/runner.ts';
import { endpointCheck, kubeProxyTables, nftTableOf } from './kproxy-run.ts';
import type { ModeModule, Proxier, SyncStats } from '../src/modes/types.ts';
import { execMs, isWrite, LEGACY_IPTABLES, type ExecRecord, type Namespaces, TimedRunner } from './netns.ts';
import { benchConfig, clusterIPOf, Workload } from './workload.ts';

/** One sync: wall time, and how it splits between kproxy itself and the commands it ran. */
export interface SyncSample {
  wallMs: number;
  /** time inside the commands that write rules (iptables-restore, nft -f) */
  writeMs: number;
  /** time inside every other command (probes, iptables -C/-I, iptables-save, nft list) */
  otherExecMs: number;
  /** wall − all commands: kproxy's own work (planning = render + diff, bookkeeping) */
  inProcessMs: number;
  commands: number;
  rulesWritten: number;
  rulesTotal: number;
  /** bytes sent to the rule-writing commands */
  payloadBytes: number;
}

export interface RawSample {
  /** iptables-restore --noflush (or nft -f) of the full rendered payload into an empty namespace */
  fullApplyMs: number;
  fullPayloadBytes: number;
  /** iptables-restore --noflush of one service's chains only, into the populated namespace */
  oneServiceApplyMs?: number;
  oneServicePayloadBytes?: number;
  oneServiceRules?: number;
}

export interface KernelCheck {
  /** lines of iptables-save after the run (iptables; nftables checks each new endpoint's chain instead) */
  listedLines?: number;
  /** nftables: the kube-proxy tables in the kernel (`kube-proxy`, or the shards' `kube-proxy-<n>`) */
  tables?: string[];
  /** the endpoints added by the one-service changes are in the kernel */
  changesPresent: boolean;
}

/**
 * What a run measures: a mode, or the iptables mode with the legacy (x_tables) binaries in
 * place of the nf_tables-backed ones (iptables-legacy-restore etc.).
 */
export type Variant = ModeName | 'iptables-legacy';
export const VARIANTS: readonly Variant[] = ['iptables', 'iptables-legacy', 'nftables', 'ipvs', 'userspace'];

export function modeOf(v: Variant): ModeName {
  return v === 'iptables-legacy' ? 'iptables' : v;
}

export interface Sample {
  n: number;
  mode: Variant;
  rep: number;
  endpointsPerService: number;
  /** mode.render(input): the pure planner, full state → text */
  renderMs: number;
  renderBytes: number;
  full: SyncSample;
  /** each adds one endpoint to one service, then Proxier.sync(input, {that service}, false) */
  changes: SyncSample[];
  raw?: RawSample;
  kernel?: KernelCheck;
  /** set when the first full sync failed (then changes is empty and full.wallMs is the time to fail) */
  error?: string;
}

export interface MeasureOptions {
  n: number;
  endpoints: number;
  rep: number;
  /** one-service changes per measurement */
  changes: number;
  /** time the raw restore / nft -f references */
  raw: boolean;
  /** read the kernel back and check the changes landed (slow at large N: do it once per size) */
  verify: boolean;
  /** limit for each raw apply, ms (kproxy's own executors have their own limits) */
  rawTimeoutMs: number;
  /** replaces the executors' own time limits for kproxy's commands (undefined: keep them) */
  execTimeoutMs?: number;
}

function syncSample(wallMs: number, records: ExecRecord[], stats: SyncStats): SyncSample {
  const all = execMs(records);
  const write = execMs(records, isWrite);
  return {
    wallMs,
    writeMs: write,
    otherExecMs: all - write,
    inProcessMs: Math.max(0, wallMs - all),
    commands: records.length,
    rulesWritten: stats.rulesWritten,
    rulesTotal: stats.rulesTotal,
    payloadBytes: records.filter(isWrite).reduce((s, r) => s + r.inputBytes, 0),
  };
}

/** One Proxier.sync, timed, with the commands it ran (`runner.take()` before and after). */
export async function timedSync(proxier: Proxier, runner: TimedRunner, w: Workload, changed: Set<string>, full: boolean): Promise<SyncSample> {
  runner.take();
  const t0 = performance.now();
  // the view is part of the sync: built whole for a full one, for the changed services only otherwise
  const stats = await proxier.sync(w.input(full ? undefined : changed), changed, full);
  const wall = performance.now() - t0;
  return syncSample(wall, runner.take(), stats);
}

/** Services whose endpoints the one-service changes touch: spread over the list, never the same twice. */
export function changedServiceIndexes(n: number, count: number, rep: number): number[] {
  const out: number[] = [];
  for (let k = 0; k < count; k++) {
    const i = Math.floor(((k + 0.5) / count) * n + rep * 7) % n;
    if (!out.includes(i)) out.push(i);
  }
  return out;
}

/**
 * The nat chains of one service (KUBE-SVC-*, KUBE-EXT-*, its KUBE-SEP-*), cut out of a full
 * iptables-restore payload: what a restore that touches only that service has to write.
 */
export function oneServicePayload(full: string, clusterIP: string): { payload: string; rules: number } {
  const nat = full.slice(full.indexOf('*nat'));
  const lines = nat.split('\n');
  const svcRule = lines.find((l) => l.startsWith('-A KUBE-SERVICES ') && new RegExp(`-d ${clusterIP.replace(/\./g, '\\.')}(/32)? `).test(l));
  const svc = svcRule && / -j (KUBE-SVC-\S+)/.exec(svcRule)?.[1];
  if (!svc) throw new Error(`KPROXY_BENCH_PAYLOAD: no KUBE-SERVICES rule for ${clusterIP} in the rendered payload`);
  const chains = [svc, svc.replace('KUBE-SVC-', 'KUBE-EXT-')];
  for (const l of lines) {
    if (l.startsWith(`-A ${svc} `)) {
      const sep = / -j (KUBE-SEP-\S+)/.exec(l)?.[1];
      if (sep) chains.push(sep);
    }
  }
  const declared = chains.filter((c) => lines.includes(`:${c} - [0:0]`));
  const rules = lines.filter((l) => declared.some((c) => l.startsWith(`-A ${c} `)));
  const payload = ['*nat', ...declared.map((c) => `:${c} - [0:0]`), ...rules, 'COMMIT', ''].join('\n');
  return { payload, rules: rules.length };
}

/** Time of one raw apply; +Infinity when it ran into the timeout. */
async function timedApply(runner: TimedRunner, mode: ModeName, payload: string, timeoutMs: number): Promise<number> {
  const [cmd, args] = mode === 'nftables' ? ['nft', ['-f', '-']] : ['iptables-restore', ['-w', '5', '--noflush', '--counters']];
  const t0 = performance.now();
  let r: RunResult;
  try {
    r = await runner.run(cmd, args as string[], { input: payload, timeoutMs });
  } catch (e) {
    // the runner rejects a run it killed at the limit
    if (e instanceof ExecError && e.code === 'KPROXY_EXEC_TIMEOUT') return Number.POSITIVE_INFINITY;
    throw e;
  }
  const ms = performance.now() - t0;
  if (r.code !== 0 && ms >= timeoutMs) return Number.POSITIVE_INFINITY;
  if (r.code !== 0) throw new Error(`KPROXY_BENCH_RAW_APPLY: ${cmd} exited ${r.code}: ${r.stderr.trim().slice(0, 400)}`);
  return ms;
}

async function kernelCheck(runner: TimedRunner, mode: ModeName, added: Array<{ i: number; ep: string }>): Promise<KernelCheck> {
  if (mode === 'nftables') {
    // Every kube-proxy table (from 1,000 Services the mode writes `kube-proxy-0` …, shards.ts),
    // and each new endpoint's chain in its Service's table: one netlink request each. Listing
    // the tables with nft (1.0.6) took ~60 s at 10,000 in 16 tables.
    const tables = await kubeProxyTables(runner);
    let present = tables.length > 0;
    for (const { i, ep } of added) {
      if (!present) break;
      const c = endpointCheck('nftables', i, ep, nftTableOf(tables, i));
      present = (await runner.run(c.cmd, c.args, { timeoutMs: 30_000 })).code === 0;
    }
    return { tables, changesPresent: present };
  }
  const r = await runner.run('iptables-save', [], { timeoutMs: 120_000 });
  if (r.code !== 0) throw new Error(`KPROXY_BENCH_VERIFY: listing the kernel rules failed: ${r.stderr.trim()}`);
  return {
    listedLines: r.stdout.split('\n').length,
    changesPresent: added.every(({ ep }) => r.stdout.includes(ep)),
  };
}

/** Runs one mode at one size: render, first full sync, one-service changes, raw references. */
export async function measure(variant: Variant, mode: ModeModule, nss: Namespaces, o: MeasureOptions): Promise<Sample> {
  const w = new Workload(o.n, o.endpoints, benchConfig(mode.name));
  const rename = variant === 'iptables-legacy' ? LEGACY_IPTABLES : {};

  const t0 = performance.now();
  const rendered = mode.render(w.input());
  const renderMs = performance.now() - t0;
  const base = { n: o.n, mode: variant, rep: o.rep, endpointsPerService: o.endpoints, renderMs, renderBytes: rendered.length };

  const ns = await nss.create(variant === 'iptables-legacy' ? 'leg' : mode.name.slice(0, 3));
  try {
    const runner = new TimedRunner(ns, rename, o.execTimeoutMs);
    const proxier = await mode.createProxier({ config: w.config, log: silentLogger(), runner });
    try {
      runner.take();
      const tf = performance.now();
      let full: SyncSample;
      try {
        full = await timedSync(proxier, runner, w, w.serviceKeys, true);
      } catch (e) {
        const wallMs = performance.now() - tf;
        const records = runner.take();
        const failed = syncSample(wallMs, records, { rulesWritten: 0, rulesTotal: 0 });
        return { ...base, full: failed, changes: [], error: (e as Error).message.split('\n')[0].slice(0, 300) };
      }
      const changes: SyncSample[] = [];
      const added: Array<{ i: number; ep: string }> = [];
      const touched = changedServiceIndexes(o.n, o.changes, o.rep);
      for (const i of touched) {
        const changed = w.addEndpoint(i);
        if (changed.size !== 1) throw new Error(`KPROXY_BENCH_WORKLOAD: one endpoint change reported ${changed.size} changed services`);
        added.push({ i, ep: w.newestEndpoint(i) });
        changes.push(await timedSync(proxier, runner, w, changed, false));
      }
      const kernel = o.verify ? await kernelCheck(runner, mode.name, added) : undefined;
      const raw = o.raw ? await rawReferences(mode, nss, runner, w, rendered, touched[0], rename, o.rawTimeoutMs) : undefined;
      return { ...base, full, changes, raw, kernel };
    } finally {
      await proxier.stop();
    }
  } finally {
    await nss.delete(ns);
  }
}

async function rawReferences(
  mode: ModeModule, nss: Namespaces, populated: TimedRunner, w: Workload, fullPayload: string, changedIndex: number,
  rename: Record<string, string>, timeoutMs: number,
): Promise<RawSample> {
  const fresh = await nss.create(`${mode.name.slice(0, 3)}raw`);
  let fullApplyMs: number;
  try {
    fullApplyMs = await timedApply(new TimedRunner(fresh, rename), mode.name, fullPayload, timeoutMs);
  } finally {
    await nss.delete(fresh);
  }
  const out: RawSample = { fullApplyMs, fullPayloadBytes: fullPayload.length };
  if (mode.name === 'iptables') {
    // the service's chains as they are now (after the changes), into the populated namespace
    const one = oneServicePayload(mode.render(w.input()), clusterIPOf(changedIndex));
    out.oneServiceApplyMs = await timedApply(populated, mode.name, one.payload, timeoutMs);
    out.oneServicePayloadBytes = one.payload.length;
    out.oneServiceRules = one.rules;
  }
  return out;
}
