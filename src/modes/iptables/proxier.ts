// The iptables proxier: plans with the pure planner and applies through the executor.
// Full syncs (first, after any failure, when asked, or when the canary chain vanished
// because someone flushed iptables) ensure the jump rules from the built-in chains and
// re-read the installed nat chains from iptables-save; partial syncs write only changed
// services' chains and delete the chains that became stale. One state per IP family.
// Partial syncs also leave out every chain whose content is what kproxy last wrote for it
// (skipUnchangedChains; upstream rewrites KUBE-SERVICES and KUBE-NODEPORTS every time), so
// a one-endpoint change writes a few rules whatever the number of services.
// A full sync over installed service chains (a restart over the previous process's rules, or
// a later full sync) compares them with the plan and writes only what differs
// (restart.ts): a restart over unchanged rules makes no restore at all.
import { onlyServices, SkippedVIPReporter } from '../skipped-vips.ts';
import type { CommandRunner } from '../../kernel/runner.ts';
import { ensureSysctl, type Sysctl } from '../../kernel/sysctl.ts';
import { IptablesExecutor, RestoreError, type IptablesBackend, type Table } from '../../kernel/iptables/exec.ts';
import { readSave, type SavedTable } from '../../kernel/iptables/save.ts';
import { quoteArg, splitRuleArgs } from '../../kernel/iptables/tokenize.ts';
import type { Logger } from '../../log.ts';
import type { ProxyConfig } from '../../config/config.ts';
import type { Proxier, SyncStats } from '../types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import {
  KUBE_EXTERNAL_SERVICES, KUBE_FIREWALL, KUBE_FORWARD, KUBE_NODEPORTS, KUBE_POSTROUTING, KUBE_PROXY_CANARY,
  KUBE_PROXY_FIREWALL, KUBE_SERVICES,
} from './names.ts';
import { isServiceChainName } from './names.ts';
import { optionsFromConfig, type IptablesOptions, type RuntimeFacts, DEFAULT_FACTS } from './options.ts';
import { ownerOfPayloadLine } from './blocks.ts';
import { planFull } from './full.ts';
import { planRestores, restoreText, type RestoreInput } from './plan.ts';
import { IptablesSyncState } from './sync-state.ts';
import { installedChains } from './canonical.ts';
import { exclusionMessage, isTransientRefusal, MAX_ISOLATION_RETRIES, ServiceExclusions } from '../isolation.ts';

export interface JumpRule {
  table: Table;
  dst: string;
  src: string;
  comment: string;
  extra: string[];
}

const NEW = ['-m', 'conntrack', '--ctstate', 'NEW'];

/** upstream's iptablesJumpChains: how packets enter kproxy's chains from the built-in ones. */
export const JUMP_RULES: JumpRule[] = [
  { table: 'filter', dst: KUBE_EXTERNAL_SERVICES, src: 'INPUT', comment: 'kubernetes externally-visible service portals', extra: NEW },
  { table: 'filter', dst: KUBE_EXTERNAL_SERVICES, src: 'FORWARD', comment: 'kubernetes externally-visible service portals', extra: NEW },
  { table: 'filter', dst: KUBE_NODEPORTS, src: 'INPUT', comment: 'kubernetes health check service ports', extra: [] },
  { table: 'filter', dst: KUBE_SERVICES, src: 'FORWARD', comment: 'kubernetes service portals', extra: NEW },
  { table: 'filter', dst: KUBE_SERVICES, src: 'OUTPUT', comment: 'kubernetes service portals', extra: NEW },
  { table: 'filter', dst: KUBE_FORWARD, src: 'FORWARD', comment: 'kubernetes forwarding rules', extra: [] },
  { table: 'filter', dst: KUBE_PROXY_FIREWALL, src: 'INPUT', comment: 'kubernetes load balancer firewall', extra: NEW },
  { table: 'filter', dst: KUBE_PROXY_FIREWALL, src: 'OUTPUT', comment: 'kubernetes load balancer firewall', extra: NEW },
  { table: 'filter', dst: KUBE_PROXY_FIREWALL, src: 'FORWARD', comment: 'kubernetes load balancer firewall', extra: NEW },
  { table: 'nat', dst: KUBE_SERVICES, src: 'OUTPUT', comment: 'kubernetes service portals', extra: [] },
  { table: 'nat', dst: KUBE_SERVICES, src: 'PREROUTING', comment: 'kubernetes service portals', extra: [] },
  { table: 'nat', dst: KUBE_POSTROUTING, src: 'POSTROUTING', comment: 'kubernetes postrouting rules', extra: [] },
];

/** Duplicates of kubelet's anti-martian chain jumps (kubelet makes the same ones). */
export const KUBELET_JUMP_RULES: JumpRule[] = [
  { table: 'filter', dst: KUBE_FIREWALL, src: 'INPUT', comment: '', extra: [] },
  { table: 'filter', dst: KUBE_FIREWALL, src: 'OUTPUT', comment: '', extra: [] },
];

/** the built-in chains the jump rules start from: the only ones whose rules are read */
const JUMP_SOURCES = new Set([...JUMP_RULES, ...KUBELET_JUMP_RULES].map((j) => j.src));

/**
 * Per table of an iptables-save text: chain → its rules as argument arrays, for the chains
 * jumps start from (every declared chain is listed; the 200,000 rules of kproxy's own chains
 * at 10,000 Services are not split into words: seconds on a loaded machine).
 */
function parseSave(saved: Map<string, SavedTable>): Map<string, Map<string, string[][]>> {
  return new Map([...saved].map(([name, t]) => {
    const chains = new Map<string, string[][]>();
    for (const c of t.chains) chains.set(c, []);
    for (const r of t.rules) if (r.op === '-A' && JUMP_SOURCES.has(r.chain)) chains.get(r.chain)?.push(splitRuleArgs(r.rest));
    return [name, chains];
  }));
}

const sameArgs = (a: string[], b: string[]) => a.length === b.length && a.every((x, i) => x === b[i]);

/** The restore payload that adds the missing canaries, chains and jumps ('' when none). */
export function jumpsPayload(saved: string | Map<string, SavedTable>): string {
  const tables = parseSave(typeof saved === 'string' ? readSave(saved) : saved);
  const out = new Map<Table, { chains: string[]; rules: string[] }>();
  const section = (t: Table) => {
    let s = out.get(t);
    if (!s) out.set(t, (s = { chains: [], rules: [] }));
    return s;
  };
  const ensureChain = (t: Table, chain: string) => {
    let chains = tables.get(t);
    if (!chains) tables.set(t, (chains = new Map()));
    if (chains.has(chain)) return;
    chains.set(chain, []);
    section(t).chains.push(`:${chain} - [0:0]`);
  };
  for (const t of ['mangle', 'nat', 'filter'] as const) ensureChain(t, KUBE_PROXY_CANARY);
  for (const j of [...JUMP_RULES, ...KUBELET_JUMP_RULES]) {
    ensureChain(j.table, j.dst);
    const args = jumpArgs(j);
    const src = tables.get(j.table)!.get(j.src);
    if (src?.some((r) => sameArgs(r, args))) continue;
    src?.unshift(args);
    section(j.table).rules.push(`-I ${j.src} ${args.map(quoteArg).join(' ')}`);
  }
  let payload = '';
  for (const [t, s] of out) payload += [`*${t}`, ...s.chains, ...s.rules, 'COMMIT', ''].join('\n');
  return payload;
}

/**
 * A jumps payload without its nat `-j KUBE-SERVICES` insertions (`now`) and those insertions
 * as a payload of their own (`later`); `defer` false: all now.
 */
export function splitServiceJumps(payload: string, defer: boolean): { now: string; later: string } {
  if (!defer) return { now: payload, later: '' };
  const later: string[] = [];
  let table = '';
  const now = payload.split('\n').filter((l) => {
    if (l.startsWith('*')) table = l;
    const move = table === '*nat' && l.startsWith('-I ') && l.endsWith(` -j ${KUBE_SERVICES}`);
    if (move) later.push(l);
    return !move;
  });
  return { now: now.join('\n'), later: later.length ? ['*nat', ...later, 'COMMIT', ''].join('\n') : '' };
}

export function jumpArgs(j: JumpRule): string[] {
  return [...j.extra, ...(j.comment ? ['-m', 'comment', '--comment', j.comment] : []), '-j', j.dst];
}

interface FamilyState {
  exec: IptablesExecutor;
  sync: IptablesSyncState;
  lastCanaryCheckMs: number;
  last?: { input: PlanInput; opts: IptablesOptions };
  /** Services iptables-restore refused, left out until they change (modes/isolation.ts) */
  exclusions: ServiceExclusions;
  /** the binaries' backend, probed at the first full sync */
  backend?: IptablesBackend;
}

/**
 * Lines per restore when a full sync is applied in chunks (full.ts chunkedPayloads): with
 * the nf_tables backend one `--noflush` transaction is quadratic in its size, chunks of a
 * few thousand lines keep it linear. 5,000 lines per chunk beats smaller chunks (each restore
 * pays the process start and the chain-cache fetch) and larger ones (the quadratic cost
 * inside one transaction is back): docs/benchmarks.md §1, "Rule programming vs the number of Services".
 */
export const DEFAULT_CHUNK_LINES = 5_000;

/**
 * Chunk size for a backend: nf_tables (and an unknown one) chunks; legacy does not, as
 * x_tables replaces the whole table at every commit, so chunks would make it quadratic.
 */
export function chunkLinesFor(backend: IptablesBackend, override?: number): number {
  if (override !== undefined) return override;
  return backend === 'legacy' ? 0 : DEFAULT_CHUNK_LINES;
}

/** A restore with the cold start's deferred nat jumps appended (ensureJumps). */
function withJumps(last: string | RestoreInput, jumps: string): string | RestoreInput {
  if (typeof last === 'string') return last + jumps;
  const jumpLines = jumps.split('\n').length - 1;
  return {
    lines: last.lines + jumpLines,
    parts: function* () {
      yield* last.parts();
      yield jumps;
    },
  };
}

/** The service restore payload a sync attempt was refused, with what it was planned from. */
interface Refusal {
  error: RestoreError;
  payload: string;
  state: PlanInput['state'];
  opts: IptablesOptions;
}

export interface IptablesProxierDeps {
  runner: CommandRunner;
  log: Logger;
  config: ProxyConfig;
  facts?: Partial<Record<4 | 6, RuntimeFacts>>;
  now?: () => number;
  /** where the kernel settings the plan asks for (route_localnet) go; none: not applied (unit tests) */
  sysctl?: Sysctl;
  /** lines per chunk of a full sync (0: one restore); default: chunkLinesFor(the probed backend) */
  chunkLines?: number;
  /**
   * lines per restore of a restart's dispatch edits (restart.ts,
   * dispatch-chunks.ts); default: restart.ts dispatchBudget (the chunk size, up to twice it for a
   * large ruleset). 0: one dispatch restore (bench/iptables-restart.ts compares the two forms)
   */
  dispatchChunkLines?: number;
}

export class IptablesProxier implements Proxier {
  private readonly families = new Map<4 | 6, FamilyState>();
  private readonly now: () => number;

  constructor(private readonly deps: IptablesProxierDeps) {
    this.now = deps.now ?? Date.now;
  }

  private familyState(family: 4 | 6): FamilyState {
    let fs = this.families.get(family);
    if (!fs) {
      fs = {
        exec: new IptablesExecutor(this.deps.runner, family),
        sync: new IptablesSyncState({ skipUnchangedChains: true }),
        lastCanaryCheckMs: this.now(),
        exclusions: new ServiceExclusions(),
      };
      this.families.set(family, fs);
    }
    return fs;
  }

  /**
   * One sync. When iptables-restore refuses a line written by a Service, that Service is left
   * out and the sync retried at once (a bounded number of times), so the others converge in
   * this sync; a refused fixed rule fails the sync.
   */
  async sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats> {
    const fs = this.familyState(input.node.family);
    fs.exclusions.startSync(changed, full);
    // A partial sync can only add skipped VIPs of the changed services: check only those.
    (this.skippedVIPs ??= new SkippedVIPReporter(this.deps.log)).report(full ? input : onlyServices(input, changed));
    for (let retry = 0; ; retry++) {
      const refusal: { last?: Refusal } = {};
      try {
        const stats = await this.syncAttempt({ ...input, state: fs.exclusions.filter(input.state) }, changed, full || retry > 0, refusal);
        return fs.exclusions.size ? { ...stats, excludedServices: fs.exclusions.keys() } : stats;
      } catch (e) {
        const r = refusal.last;
        if (!r || e !== r.error || retry >= MAX_ISOLATION_RETRIES || !this.excludeRefused(fs, r)) throw e;
      }
    }
  }

  /** Excludes the Service that wrote the refused line; false when the line is not a Service's. */
  private excludeRefused(fs: FamilyState, r: Refusal): boolean {
    if (r.error.line === null || isTransientRefusal(r.error.result?.stderr ?? '')) return false;
    const text = r.payload.split('\n')[r.error.line - 1] ?? '';
    const sp = ownerOfPayloadLine(r.state, r.opts, text, fs.sync.blocks);
    if (!sp || fs.exclusions.has(sp.serviceKey)) return false;
    const stderr = (r.error.result?.stderr ?? '').split('\n').find((l) => l.trim() && !/^Error occurred at line|^Try `/.test(l)) ?? 'refused';
    const why = stderr.replace(/^\S*restore v[\d.]+ \([^)]*\): /, '').trim();
    if (fs.exclusions.exclude(sp.serviceKey, why)) {
      this.deps.log.warn(
        { service: sp.serviceKey, line: r.error.line, family: fs.exec.family },
        exclusionMessage(sp.serviceKey, fs.exec.bin.restore, `line ${r.error.line}: ${why}: ${text}`.slice(0, 500)),
      );
    }
    return true;
  }

  private skippedVIPs?: SkippedVIPReporter;


  private async syncAttempt(input: PlanInput, changed: Set<string>, full: boolean, refusal: { last?: Refusal }): Promise<SyncStats> {
    const family = input.node.family;
    const fs = this.familyState(family);
    const opts = optionsFromConfig(input.config, input.node, this.deps.facts?.[family] ?? DEFAULT_FACTS);
    const syncPeriodMs = input.config.syncPeriodMs;
    let doFull = full || fs.sync.needFullSync;
    try {
      if (!doFull && this.now() - fs.lastCanaryCheckMs >= syncPeriodMs) {
        fs.lastCanaryCheckMs = this.now();
        if (!(await fs.exec.chainExists('mangle', KUBE_PROXY_CANARY))) {
          this.deps.log.warn({ family }, 'iptables canary chain is gone (iptables was flushed?): forcing a full sync');
          doFull = true;
        }
      }
      let deferredJumps = '';
      if (doFull) {
        fs.backend ??= await fs.exec.backend();
        fs.sync.chunkLines = chunkLinesFor(fs.backend, this.deps.chunkLines);
        fs.sync.dispatchChunkLines = this.deps.dispatchChunkLines;
        deferredJumps = await this.ensureJumps(fs);
      }
      // the view's per-Service port index: a partial sync visits only the changed services' ports
      const plan = fs.sync.plan(input.state, opts, changed, doFull, this.now(), syncPeriodMs, input.view?.servicePorts);
      // Before the restore: the localhost NodePort rules need route_localnet to work.
      if (this.deps.sysctl) for (const { name, value } of plan.sysctls) await ensureSysctl(this.deps.sysctl, name, value);
      // Nothing differs from what is installed: no restore at all. A chunked full sync is
      // several restores (leaf chains first, the dispatch rules last), each atomic; a cold
      // start's nat jumps into KUBE-SERVICES come with the last one (ensureJumps).
      const restores = [...planRestores(plan)];
      if (deferredJumps) {
        const last = restores.pop();
        restores.push(last === undefined ? deferredJumps : withJumps(last, deferredJumps));
      }
      for (const payload of restores) {
        try {
          await fs.exec.restore(payload);
        } catch (e) {
          if (e instanceof RestoreError) refusal.last = { error: e, payload: restoreText(payload), state: input.state, opts };
          throw e;
        }
      }
      fs.sync.commit(plan);
      fs.last = { input, opts };
      // memory: unchanged services' chain text is not kept between syncs (blocks.ts)
      if (plan.full) fs.sync.blocks.compact(input.state);
      const kind = plan.full ? 'full' : 'partial';
      const diff = `${kind} sync (IPv${family}): ${plan.writtenServices} service ports written, ${plan.natRulesWritten} of ${plan.natRulesTotal} nat rules, ${plan.filterRules} filter rules` +
        (plan.skippedChains ? `, ${plan.skippedChains} unchanged chains left out` : '') +
        (plan.adoptedChains ? `, ${plan.adoptedChains} chains found installed as planned` : '') +
        (restores.length > 1 ? `, in ${restores.length} restores` : '') +
        (plan.deletedChains.length ? `, deleted ${plan.deletedChains.join(' ')}` : '');
      this.deps.log.debug({ family, full: plan.full, natRulesWritten: plan.natRulesWritten, natRulesTotal: plan.natRulesTotal }, diff);
      // the filter table is written whole by every sync that writes anything, and by every full sync
      const rulesByTable = { nat: { total: plan.natRulesTotal, written: plan.natRulesWritten }, filter: { total: plan.filterRules, written: plan.payload || plan.restores ? plan.filterRules : 0 } };
      return { rulesWritten: plan.natRulesWritten, rulesTotal: plan.natRulesTotal, diff, rulesByTable };
    } catch (e) {
      // The change history is consumed: only a full sync can be trusted next.
      fs.sync.fail();
      throw e;
    }
  }

  /**
   * Makes the canary chains, kproxy's top-level chains and the jump rules into them exist:
   * one iptables-save (which also tells the installed nat chains), then one iptables-restore
   * --noflush declaring only the missing chains (declaring an existing one would flush it)
   * and inserting only the missing jumps with `-I`, in the order upstream's one-by-one
   * `iptables -C || -I` gives (each at the top).
   * A chunked cold start (no service chain installed; kproxy, not upstream) leaves out the nat
   * jumps into KUBE-SERVICES and returns them, for the sync's last restore: while nothing
   * reaches KUBE-SERVICES, a chunk's commit does not make nf_tables validate every service
   * published by the chunks before it (the kernel validates what the base chains reach on
   * every commit that adds a rule; docs/benchmarks.md §1, "Rule programming vs the number of Services" compares the two).
   * Nothing is reachable before it.
   */
  private async ensureJumps(fs: FamilyState): Promise<string> {
    const saved = readSave(await fs.exec.saveAll());
    const installed = new Set(saved.get('nat')?.chains ?? []);
    fs.sync.installedNatChains = installed;
    // what is installed, for the restart form (restart.ts)
    fs.sync.installed = installedChains(saved);
    let cold = fs.sync.chunkLines > 0;
    for (const c of installed) if (cold && isServiceChainName(c)) cold = false;
    const { now, later } = splitServiceJumps(jumpsPayload(saved), cold);
    if (now) await fs.exec.restore(now);
    return later;
  }

  dump(): string {
    const out: string[] = [];
    for (const [family, fs] of [...this.families].sort((a, b) => a[0] - b[0])) {
      if (!fs.last) continue;
      out.push(`# IPv${family} (${fs.exec.bin.restore})`);
      out.push(planFull({ state: fs.last.input.state, opts: fs.last.opts, cache: fs.sync.blocks }).payload);
    }
    return out.join('\n');
  }

  async stop(): Promise<void> {}
}
