// The layers of DESIGN.md, held by dependency-cruiser (.dependency-cruiser.cjs) on every file
// of src/, type imports included: no cycles, no import that runs back up. The second test runs
// the same rules over a small tree that breaks each of them, so a rule that stopped matching
// would fail here rather than pass silently.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '..');
const CONFIG = join(root, '.dependency-cruiser.cjs');
const DEPCRUISE = join(root, 'node_modules/dependency-cruiser/bin/dependency-cruise.mjs');

interface Violation {
  rule: { name: string };
  from: string;
  to: string;
  cycle?: Array<{ name: string }>;
}

function violations(cwd: string): Violation[] {
  let out: string;
  try {
    out = execFileSync(process.execPath, [DEPCRUISE, 'src', '--config', CONFIG, '--output-type', 'json'], { cwd, encoding: 'utf8', maxBuffer: 64 << 20, timeout: 120_000 });
  } catch (e) {
    // a run that finds violations exits non-zero; its report is still on stdout
    out = (e as { stdout?: string }).stdout ?? '';
    if (!out) throw e;
  }
  return (JSON.parse(out) as { summary: { violations: Violation[] } }).summary.violations;
}

const describe = (v: Violation) => `${v.rule.name}: ${v.from} -> ${v.cycle ? v.cycle.map((c) => c.name).join(' -> ') : v.to}`;

test('src/ has no import cycle and no import that runs back up a layer', () => {
  assert.deepEqual(violations(root).map(describe), []);
});

test('the rules catch a cycle, a pure module reaching host code (types too), I/O in pure code, and a process outside src/kernel', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpa-layers-'));
  try {
    const files: Record<string, string> = {
      'tsconfig.json': JSON.stringify({ compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext', allowImportingTsExtensions: true, noEmit: true } }),
      'src/core/a.ts': "import type { B } from '../kernel/b.ts';\nexport type A = B;\n",
      'src/kernel/b.ts': "import { c } from './c.ts';\nexport type B = number;\nexport const b = c;\n",
      'src/kernel/c.ts': "import { b } from './b.ts';\nimport type { P } from '../modes/x/plan.ts';\nexport const c = 1;\nexport const d = b;\nexport type Q = P;\n",
      'src/modes/x/plan.ts': "import type { X } from './proxier.ts';\nexport type P = X;\n",
      'src/modes/x/proxier.ts': "export type X = number;\n",
      'src/modes/m.ts': "import { readFileSync } from 'node:fs';\nexport const m = readFileSync;\n",
      'src/sync/s.ts': "import { spawn } from 'node:child_process';\nexport const s = spawn;\n",
      'src/config/k.ts': "import { m } from '../modes/m.ts';\nexport const k = m;\n",
      'src/core/v.ts': "import { m } from '../modes/m.ts';\nexport const v = m;\n",
    };
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
    const found = new Set(violations(dir).map((v) => v.rule.name));
    for (const rule of ['no-circular', 'pure-reaches-host', 'core-reaches-modes', 'pure-uses-io', 'process-outside-kernel', 'config-reaches-up', 'kernel-reaches-modes']) {
      assert.ok(found.has(rule), `${rule} found (found: ${[...found].join(', ')})`);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
