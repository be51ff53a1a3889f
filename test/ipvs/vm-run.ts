// Shared by the IPVS VM tests: boots ../shared/ipvs-vm once with the repository shared at
// /project, runs one script inside, and turns its result lines into one subtest per check.
import assert from 'node:assert/strict';
import { realpathSync } from 'node:fs';
import path from 'node:path';
import type { TestContext } from 'node:test';
import { fileURLToPath } from 'node:url';
import { hostRunner, type RunResult } from '../../src/kernel/runner.ts';

export const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const vmRunner = path.resolve(repoRoot, '../shared/ipvs-vm/run-in-ipvs-vm.sh');

/**
 * node_modules shared at the path it resolves to when it lies outside the repository (a git
 * worktree's is a link to the main checkout's): the VM sees the repository's link, and what it
 * points to.
 */
function dependencyShares(): string[] {
  let real: string;
  try {
    real = realpathSync(path.join(repoRoot, 'node_modules'));
  } catch {
    return [];
  }
  return real.startsWith(repoRoot + path.sep) ? [] : ['--share', `${real}:${real}:ro`];
}

/** Runs `script` (relative to the repository) in the VM, with socat and curl inside. */
export async function runInVm(script: string, vmTimeoutS: number): Promise<RunResult & { seconds: string }> {
  assert.equal(process.getuid?.(), 0, 'the IPVS VM tests must run as root (the VM runner needs it)');
  const started = Date.now();
  const prev = process.env.IPVS_VM_EXTRA_BINS;
  process.env.IPVS_VM_EXTRA_BINS = 'socat curl';
  try {
    const r = await hostRunner.run(
      vmRunner,
      ['--timeout', String(vmTimeoutS), '--share', `${repoRoot}:/project`, ...dependencyShares(), '--share', '/usr/bin:/hostbin:ro',
        '--env', 'NODE=/hostbin/node', '--cwd', '/project', script],
      { timeoutMs: (vmTimeoutS + 30) * 1000 },
    );
    return { ...r, seconds: ((Date.now() - started) / 1000).toFixed(1) };
  } finally {
    if (prev === undefined) delete process.env.IPVS_VM_EXTRA_BINS;
    else process.env.IPVS_VM_EXTRA_BINS = prev;
  }
}

/**
 * One subtest per expected check (a missing one fails), one per unexpected reported check,
 * then the script's exit status. `parse` maps a line to {name, ok, detail} or null.
 */
export async function reportChecks(
  t: TestContext,
  script: string,
  r: RunResult & { seconds: string },
  expected: string[],
  parse: (line: string) => { name: string; ok: boolean; detail: string } | null,
  diagnosticRe: RegExp,
): Promise<void> {
  const out = r.stdout;
  const results = new Map<string, { ok: boolean; detail: string }>();
  for (const line of out.split('\n')) {
    const m = parse(line.trim());
    if (m) results.set(m.name, { ok: m.ok, detail: m.detail });
  }
  t.diagnostic(`VM run took ${r.seconds}s, exit ${r.code}`);
  for (const line of out.split('\n')) if (diagnosticRe.test(line.trim())) t.diagnostic(line.trim());
  const tail = `${out.slice(-3000)}\n${r.stderr.slice(-2000)}`;
  for (const name of expected) {
    await t.test(name, () => {
      const res = results.get(name);
      assert.ok(res, `check ${name} did not report (VM exit ${r.code})\n${tail}`);
      assert.ok(res.ok, `${name}: ${res.detail}`);
    });
  }
  for (const [name, res] of results) {
    if (!expected.includes(name)) await t.test(name, () => assert.ok(res.ok, `${name}: ${res.detail}`));
  }
  assert.equal(r.code, 0, `${script} exited ${r.code}\n${tail}`);
}
