import { runConformance } from '../conformance/runner.ts';
import { conformanceAdapters } from '../proxy/registry.ts';

export async function conformanceCommand(dirs: string[]): Promise<void> {
  const res = await runConformance(dirs, conformanceAdapters, (l) => process.stdout.write(l + '\n'));
  if (res.failed > 0) process.exitCode = 1;
}
