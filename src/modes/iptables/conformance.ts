// The iptables conformance adapter: golden (a full render compared after upstream's
// normalisation), flows (render, then trace packets), steps (one stateful planner across
// syncs: each step's payload and nat rule counts). Format: ../shared/conformance/README.md.
import { applyObject, stateOf, trackerFor, type CaseOutcome, type ConformanceAdapter, type ConformanceCase } from '../../conformance/case.ts';
import { caseLocalIPs, caseOptions } from './case-options.ts';
import { diffLines, normalizeRestoreText, undeclaredJumps } from './normalize.ts';
import { planFull, withText } from './full.ts';
import { IptablesSyncState } from './sync-state.ts';
import { loadTracer } from './tracer-link.ts';
import { parseIptablesSave } from '../../kernel/iptables/parse.ts';

function runGolden(c: ConformanceCase): CaseOutcome {
  const opts = caseOptions(c.config);
  const plan = planFull({ state: stateOf(c.config, c.objects), opts, installedNatChains: new Set() });
  const jumps = undeclaredJumps(plan.payload);
  const diff = diffLines(normalizeRestoreText(c.expected ?? ''), normalizeRestoreText(plan.payload));
  if (!diff && !jumps.length) return { ok: true };
  return { ok: false, detail: [diff, ...jumps].filter(Boolean).join('\n') };
}

function runSteps(c: ConformanceCase): CaseOutcome {
  const opts = caseOptions(c.config);
  const tracker = trackerFor(c.config);
  // Upstream's payloads: every partial sync rewrites KUBE-SERVICES, KUBE-NODEPORTS and the
  // static chains (the production proxier leaves unchanged chains out; see partial.ts).
  const sync = new IptablesSyncState({ skipUnchangedChains: false });
  // The fake kernel starts with only built-in chains.
  sync.installedNatChains = new Set();
  const problems: string[] = [];
  for (const [i, step] of (c.steps ?? []).entries()) {
    for (const o of step.objects) applyObject(tracker, 'add', o);
    for (const ev of step.events) applyObject(tracker, ev.op, ev.object);
    const changed = tracker.apply();
    const plan = withText(sync.plan(tracker.state, opts, changed, i === 0));
    sync.commit(plan);
    if (step.expected !== undefined) {
      const diff = diffLines(normalizeRestoreText(step.expected), normalizeRestoreText(plan.payload));
      if (diff) problems.push(`step ${step.name}: payload differs`, diff);
      if (plan.full) problems.push(...undeclaredJumps(plan.payload).map((p) => `step ${step.name}: ${p}`));
    }
    const m = step.metrics;
    if (m?.natRulesWritten !== undefined && m.natRulesWritten !== plan.natRulesWritten) {
      problems.push(`step ${step.name}: natRulesWritten ${plan.natRulesWritten}, want ${m.natRulesWritten}`);
    }
    if (m?.natRulesTotal !== undefined && m.natRulesTotal !== plan.natRulesTotal) {
      problems.push(`step ${step.name}: natRulesTotal ${plan.natRulesTotal}, want ${m.natRulesTotal}`);
    }
  }
  return problems.length ? { ok: false, detail: problems.join('\n') } : { ok: true };
}

/**
 * The text a flows case traces: its static ruleset (rules.iptables-save, as upstream's
 * TestTracePacket), or the full render of its objects.
 */
function flowsRuleset(c: ConformanceCase): { text: string; problems: string[] } {
  if (!c.rules) {
    const plan = planFull({ state: stateOf(c.config, c.objects), opts: caseOptions(c.config), installedNatChains: new Set() });
    return { text: plan.payload, problems: [] };
  }
  if (c.rules.format !== 'iptables-save') return { text: '', problems: [`${c.rules.file}: an iptables case traces rules.iptables-save, not ${c.rules.format}`] };
  // Upstream's fake restores the text first and fails on what it cannot read: so does the case.
  const warnings = parseIptablesSave(c.rules.text).warnings;
  return { text: c.rules.text, problems: warnings.map((w) => `${c.rules!.file} ${w}`) };
}

async function runFlows(c: ConformanceCase): Promise<CaseOutcome> {
  const traceIptables = await loadTracer();
  const { text, problems } = flowsRuleset(c);
  if (problems.length) return { ok: false, detail: problems.join('\n') };
  const localIPs = caseLocalIPs(c.config);
  for (const f of c.flows ?? []) {
    const protocol = (f.protocol || 'TCP').toUpperCase();
    const got = traceIptables(text, { sourceIP: f.sourceIP, protocol, destIP: f.destIP, destPort: f.destPort }, { localIPs });
    if (got.output !== f.output || got.masq !== f.masq) {
      problems.push(`flow ${JSON.stringify(f.name)}: got output ${JSON.stringify(got.output)} masq ${got.masq}, want ${JSON.stringify(f.output)} masq ${f.masq}`);
      for (const r of got.rules.slice(0, 12)) problems.push(`    ${r}`);
    }
  }
  return problems.length ? { ok: false, detail: problems.join('\n') } : { ok: true, ...(c.rules ? { judgedBy: `flows through the static ${c.rules.format} ruleset` } : {}) };
}

export const iptablesConformance: ConformanceAdapter = {
  run(c: ConformanceCase) {
    if (c.kind === 'golden') return runGolden(c);
    if (c.kind === 'steps') return runSteps(c);
    return runFlows(c);
  },
};
