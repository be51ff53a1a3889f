// What every proxy mode provides. A mode is a pure planner (state → desired rules/objects →
// text) plus an executor-backed Proxier that applies it; modes register by name in
// registry.ts (kpng's "backends are functions from full state to kernel").
import type { ProxyConfig, ModeName } from '../config/config.ts';
import type { Logger } from '../log.ts';
import type { CommandRunner } from '../kernel/runner.ts';
import type { PlanInput } from '../core/nodeview.ts';
import type { TraceRequest, TraceResult } from './trace-types.ts';

export interface SyncStats {
  /** rules (or objects) written by this sync */
  rulesWritten: number;
  /** rules (or objects) kproxy believes are installed after it */
  rulesTotal: number;
  /** human-readable summary of what changed, for the per-sync diff log and /debug/diff */
  diff?: string;
  /** objects (set entries, virtual servers) left out because the kernel refuses them */
  rejected?: number;
  /**
   * Services ("ns/name") left out of this sync because the kernel refused their part of an
   * atomic transaction; retried when they change and at the next full sync. For a metric
   * (kproxy_sync_excluded_services) and /debug.
   */
  excludedServices?: string[];
  /**
   * Rules per table, installed and written by this sync (the iptables mode: upstream's
   * sync_proxy_rules_iptables_total / _iptables_last {table})
   */
  rulesByTable?: Record<string, { total: number; written: number }>;
  /** stale-object deletions that failed in this sync and are retried (nftables: upstream's nftables_cleanup_failures_total) */
  cleanupFailures?: number;
  /** the nftables mode: how many tables hold the Services (kproxy_nftables_tables) */
  tables?: number;
}

export interface Proxier {
  /**
   * Brings the host to the desired state of `input`. `changed` holds the service keys
   * ("ns/name") changed since the last successful sync; `full` asks for a complete rewrite
   * (first sync, after a failure, hourly). Throws on failure, leaving the old rules.
   */
  sync(input: PlanInput, changed: Set<string>, full: boolean): Promise<SyncStats>;
  /** the desired state last applied, as text (for /debug/rules) */
  dump(): string;
  /** stop background work (listeners, timers); does not remove kernel state */
  stop(): Promise<void>;
}

export interface ModeDeps {
  config: ProxyConfig;
  log: Logger;
  runner: CommandRunner;
  /**
   * the IP family this proxier serves (default 4). The controller makes one proxier per
   * family, as upstream's metaproxier; createProxier fails with KPROXY_EXEC_MISSING (or
   * KPROXY_FAMILY_UNAVAILABLE) when this family's tools are missing.
   */
  family?: 4 | 6;
}

export interface ModeModule {
  name: ModeName;
  /** dry run: the text that would be applied for this state (no root, no host access) */
  render(input: PlanInput): string;
  /** render's text in parts, each made when it is taken (the modes whose text runs to tens of MB) */
  renderParts?(input: PlanInput): Iterable<string>;
  /** checks prerequisites (binaries, kernel modules) and returns a proxier */
  createProxier(deps: ModeDeps): Promise<Proxier>;
  /** removes everything this mode may have left on the host; idempotent, ignores absence */
  cleanup(runner: CommandRunner, log: Logger): Promise<void>;
  trace?(req: TraceRequest, deps: { runner: CommandRunner }): Promise<TraceResult>;
}
