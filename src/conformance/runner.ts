// The generic conformance runner: every case under the given directories, dispatched to the
// adapter of its mode. A case for a mode without an adapter fails, never passes.
import type { CaseOutcome, ConformanceAdapter } from './case.ts';
import { findCases, loadCase } from './load.ts';

export interface RunnerResult {
  passed: number;
  failed: number;
  lines: string[];
}

export async function runConformance(
  roots: string[],
  adapters: Record<string, ConformanceAdapter | undefined>,
  print: (line: string) => void = () => {},
): Promise<RunnerResult> {
  const res: RunnerResult = { passed: 0, failed: 0, lines: [] };
  const emit = (l: string) => {
    res.lines.push(l);
    print(l);
  };
  const dirs = findCases(roots);
  /** "mode kind" → how many cases an adapter judged otherwise (CaseOutcome.judgedBy) */
  const judged = new Map<string, number>();
  for (const dir of dirs) {
    let outcome: CaseOutcome;
    let mode = '?';
    let kind = '?';
    try {
      const c = loadCase(dir);
      mode = c.config.mode;
      kind = c.kind;
      const adapter = adapters[mode];
      outcome = adapter ? await adapter.run(c) : { ok: false, detail: `mode ${JSON.stringify(mode)} is not built` };
    } catch (e) {
      outcome = { ok: false, detail: `error: ${(e as Error).stack ?? e}` };
    }
    if (outcome.ok) res.passed++;
    else res.failed++;
    if (outcome.judgedBy) {
      const k = `${mode} ${kind} cases judged by ${outcome.judgedBy.replace(/ \(.*?\)/g, '')}`;
      judged.set(k, (judged.get(k) ?? 0) + 1);
    }
    emit(`${outcome.ok ? 'PASS' : 'FAIL'} ${mode} ${dir}${outcome.judgedBy ? ` (judged by ${outcome.judgedBy})` : ''}`);
    if (!outcome.ok && outcome.detail) for (const l of outcome.detail.split('\n').slice(0, 60)) emit(`    ${l}`);
  }
  if (dirs.length === 0) {
    res.failed++;
    emit(`FAIL no cases found under ${roots.join(' ')}`);
  }
  for (const [k, n] of judged) emit(`${n} ${k}`);
  emit(`${res.passed} passed, ${res.failed} failed`);
  return res;
}
