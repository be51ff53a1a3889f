// iptables mode: KUBE-SERVICES → KUBE-SVC-* (statistic random) → KUBE-SEP-* (DNAT),
// applied atomically with iptables-restore, partial syncs as upstream kube-proxy.
import { type CommandRunner, ExecError } from '../../kernel/runner.ts';
import { IptablesExecutor, binaries } from '../../kernel/iptables/exec.ts';
import { KUBE_PROXY_OWNED } from '../../kernel/iptables/ownership.ts';
import { removeOwnedChains } from '../../kernel/iptables/cleanup.ts';
import { procSysctl } from '../../kernel/sysctl.ts';
import { Links } from '../../kernel/links.ts';
import type { Logger } from '../../log.ts';
import type { ConformanceAdapter } from '../../conformance/case.ts';
import { ipFamily } from '../../core/ip.ts';
import type { ModeDeps, ModeModule, Proxier } from '../types.ts';
import type { TraceRequest, TraceResult } from '../trace-types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import { iptablesConformance } from './conformance.ts';
import { optionsFromConfig, type RuntimeFacts } from './options.ts';
import { planFull, planFullStreamed } from './full.ts';
import { IptablesProxier } from './proxier.ts';
import { checkedFlow, loadTracer } from './tracer-link.ts';
import { traceLiveChains, type ChainReader } from './trace-live.ts';
import { indexSaveChains } from '../../kernel/iptables/save.ts';
import { skippedVIPNotes } from '../../core/vip.ts';
import { kproxyError } from '../../errors.ts';

/** Dry run: the restore payload of a full sync of this state. */
export function render(input: PlanInput): string {
  return planFull({ state: input.state, opts: optionsFromConfig(input.config, input.node) }).payload;
}

/** render's payload in parts, made as they are taken. */
function renderParts(input: PlanInput): Iterable<string> {
  return planFullStreamed({ state: input.state, opts: optionsFromConfig(input.config, input.node) }).restores![0].parts();
}

async function probeFacts(runner: CommandRunner, family: 4 | 6): Promise<RuntimeFacts> {
  const bin = binaries(family);
  let hasRandomFully = false;
  try {
    const v = await runner.run(bin.iptables, ['--version'], { timeoutMs: 10_000 });
    const m = /v(\d+)\.(\d+)\.(\d+)/.exec(v.stdout + v.stderr);
    // --random-fully arrived in iptables 1.6.2.
    if (m) hasRandomFully = Number(m[1]) * 1e6 + Number(m[2]) * 1e3 + Number(m[3]) >= 1_006_002;
  } catch {
    /* probed again by the restore itself */
  }
  let conntrackTCPLiberal = false;
  try {
    const r = await runner.run('sysctl', ['-n', 'net.netfilter.nf_conntrack_tcp_be_liberal'], { timeoutMs: 10_000 });
    conntrackTCPLiberal = r.code === 0 && r.stdout.trim() !== '' && r.stdout.trim() !== '0';
  } catch {
    /* no sysctl binary: assume the default (0) */
  }
  return { hasRandomFully, conntrackTCPLiberal, nfacctCounters: [] };
}

/** Fails with KPROXY_EXEC_MISSING when this family's iptables-restore cannot be run. */
async function requireRestore(runner: CommandRunner, family: 4 | 6): Promise<void> {
  const bin = binaries(family).restore;
  let code: number;
  try {
    code = (await runner.run(bin, ['--version'], { timeoutMs: 10_000 })).code;
  } catch (e) {
    if (e instanceof ExecError && e.code === 'KPROXY_EXEC_MISSING') code = 127;
    else throw e;
  }
  if (code === 127) throw new ExecError('KPROXY_EXEC_MISSING', `${bin} not found; install the iptables package (or choose another --mode)`);
}

/** One proxier per IP family (the controller makes one for each family the node runs). */
async function createProxier(deps: ModeDeps): Promise<Proxier> {
  const family = deps.family ?? 4;
  await requireRestore(deps.runner, family);
  const facts: Partial<Record<4 | 6, RuntimeFacts>> = { [family]: await probeFacts(deps.runner, family) };
  return new IptablesProxier({ runner: deps.runner, log: deps.log, config: deps.config, facts, sysctl: procSysctl() });
}

/**
 * Removes the iptables mode's chains (src/kernel/iptables/ownership.ts: what upstream kube-proxy's
 * CleanupLeftovers removes, never another program's chains), both families. Idempotent; a
 * missing binary or table is skipped.
 */
export async function cleanup(runner: CommandRunner, log: Logger): Promise<void> {
  await removeOwnedChains(runner, log, KUBE_PROXY_OWNED, 'iptables');
}

/** The host's addresses for a live trace's "destination is local" (loopback at least). */
async function localAddresses(runner: CommandRunner): Promise<string[]> {
  return [...new Set(['127.0.0.1', '::1', ...((await new Links(runner).hostAddresses()) ?? [])])];
}

/**
 * The live trace over the chains its walk reaches (trace-live.ts): on the nf_tables backend
 * read one by one, else (or when the nat table cannot be listed so) out of one iptables-save.
 */
async function traceLive(req: TraceRequest, runner: CommandRunner): Promise<TraceResult> {
  const exec = new IptablesExecutor(runner, ipFamily(req.to) === 6 ? 6 : 4);
  const [backend, localIPs] = await Promise.all([exec.backend(), localAddresses(runner)]);
  const perChain = backend === 'nf_tables' && (await exec.listChain('nat', 'PREROUTING')) !== null;
  const read: ChainReader = perChain ? (table, chain) => exec.listChain(table, chain) : indexSaveChains(await exec.saveAll());
  const flow = checkedFlow({ sourceIP: req.from, protocol: req.protocol, destIP: req.to, destPort: req.port });
  const r = await traceLiveChains(read, flow, { localIPs });
  return { output: r.output, masq: r.masq, rules: r.rules, notes: [...r.notes, ...skippedVIPNotes(req)] };
}

async function trace(req: TraceRequest, deps: { runner: CommandRunner }): Promise<TraceResult> {
  if (req.live) return traceLive(req, deps.runner);
  if (!req.input) throw kproxyError('KPROXY_TRACE_NO_INPUT', 'give --manifests (or --live) to trace');
  const traceIptables = await loadTracer();
  const localIPs = ['127.0.0.1', '::1', ...req.input.node.nodeIPs];
  const r = traceIptables(render(req.input), { sourceIP: req.from, protocol: req.protocol, destIP: req.to, destPort: req.port }, { localIPs });
  return { output: r.output, masq: r.masq, rules: r.rules, notes: [...(r.notes ?? []), ...skippedVIPNotes(req)] };
}

export const mode: ModeModule = { name: 'iptables', render, renderParts, createProxier, cleanup, trace };
export const conformance: ConformanceAdapter | undefined = iptablesConformance;
