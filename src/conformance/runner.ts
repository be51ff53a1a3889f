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
  for (const dir of dirs) {
    let outcome: CaseOutcome;
    let mode = '?';
    try {
      const c = loadCase(dir);
      mode = c.config.mode;
      const adapter = adapters[mode];
      outcome = adapter ? await adapter.run(c) : { ok: false, detail: `mode ${JSON.stringify(mode)} is not built` };
    } catch (e) {
      outcome = { ok: false, detail: `error: ${(e as Error).stack ?? e}` };
    }
    if (outcome.ok) res.passed++;
    else res.failed++;
    emit(`${outcome.ok ? 'PASS' : 'FAIL'} ${mode} ${dir}`);
    if (!outcome.ok && outcome.detail) for (const l of outcome.detail.split('\n').slice(0, 60)) emit(`    ${l}`);
  }
  if (dirs.length === 0) {
    res.failed++;
    emit(`FAIL no cases found under ${roots.join(' ')}`);
  }
  emit(`${res.passed} passed, ${res.failed} failed`);
  return res;
}
