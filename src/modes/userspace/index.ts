// userspace mode: kproxy itself forwards every connection (src/modes/userspace/dataplane). This file is the
// registration point; the planner (plan.ts) and tracer (trace.ts) are pure, and the
// dataplane is loaded with a dynamic import only when a proxier or a cleanup is asked for,
// so rendering and tracing never load socket or process code.
import type { ConformanceAdapter } from '../../conformance/case.ts';
import type { CommandRunner } from '../../kernel/runner.ts';
import type { Logger } from '../../log.ts';
import type { ModeDeps, ModeModule, Proxier } from '../types.ts';
import type { TraceRequest, TraceResult } from '../trace-types.ts';
import type { PlanInput } from '../../core/nodeview.ts';
import { planUserspace, renderPlan } from './plan.ts';
import { traceUserspace } from './trace.ts';
import { coded } from '../../errors.ts';

/** Set to "0" to never program iptables (listen on local VIPs only), even as root. */
export const REDIRECT_ENV = 'KPROXY_USERSPACE_REDIRECT';

function render(input: PlanInput): string {
  // A dry run shows what kproxy would do as root: REDIRECT for every address it cannot bind.
  return renderPlan(planUserspace(input, { redirect: true }));
}

async function mayRedirect(deps: ModeDeps): Promise<boolean> {
  // IPv6 Service IPs are steered with ip6tables, IPv4 ones with iptables.
  const family = deps.family ?? 4;
  const restore = family === 6 ? 'ip6tables-restore' : 'iptables-restore';
  if (process.env[REDIRECT_ENV] === '0') return false;
  if (process.getuid?.() !== 0) {
    deps.log.info('userspace: not root, so no iptables REDIRECT; only local Service addresses (e.g. 127.0.0.0/8) are served');
    return false;
  }
  try {
    const r = await deps.runner.run(restore, ['--version'], { timeoutMs: 5000 });
    if (r.code === 0) return true;
  } catch {
    // missing binary: reported below
  }
  deps.log.warn(coded('KPROXY_USERSPACE_NO_REDIRECT', `${restore} not usable; only local IPv${family} Service addresses are served; install iptables`));
  return false;
}

async function createProxier(deps: ModeDeps): Promise<Proxier> {
  const { UserspaceProxier } = await import('./proxier.ts');
  const redirect = await mayRedirect(deps);
  return new UserspaceProxier({ config: deps.config, log: deps.log, runner: deps.runner, redirect });
}

async function cleanup(runner: CommandRunner, log: Logger): Promise<void> {
  const { removeRedirects } = await import('./dataplane/redirect.ts');
  await removeRedirects(runner, log);
}

async function trace(req: TraceRequest): Promise<TraceResult> {
  if (!req.input) {
    return { output: '', masq: false, rules: [], notes: ['userspace trace works on the planned state; pass --manifests'] };
  }
  return traceUserspace(req.input, req);
}

export const mode: ModeModule = { name: 'userspace', render, createProxier, cleanup, trace };
export const conformance: ConformanceAdapter | undefined = undefined;
