// DESIGN.md: "A file's place says what it may touch: nothing under core/ or modes/ imports
// from exec/, dataplane/, sources/ or node:child_process". Planners stay pure; the host side
// of each mode lives in src/proxy/. Type-only imports are erased and allowed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';

const src = resolve(import.meta.dirname, '../src');
const FORBIDDEN = [/\/(exec|dataplane|sources|proxy|server|sync|cli)\//, /^node:child_process$/, /^child_process$/];

function files(dir: string): string[] {
  return readdirSync(dir).flatMap((e) => {
    const p = join(dir, e);
    return statSync(p).isDirectory() ? files(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** Runtime imports of a file: static `import ... from 'x'` (not `import type`) and `import('x')`. */
export function runtimeImports(text: string): string[] {
  const out: string[] = [];
  for (const m of text.matchAll(/^\s*import\s+(?!type\s)(?:[^'";]*?\sfrom\s+)?['"]([^'"]+)['"]/gm)) out.push(m[1]);
  for (const m of text.matchAll(/^\s*export\s+(?!type\s)[^'";]*?\sfrom\s+['"]([^'"]+)['"]/gm)) out.push(m[1]);
  for (const m of text.matchAll(/\bimport\(\s*['"]([^'"]+)['"]\s*\)/g)) out.push(m[1]);
  return out;
}

test('the import scanner sees runtime imports and ignores type-only ones', () => {
  const sample = [
    "import type { A } from '../exec/runner.ts';",
    "import { B } from '../exec/iptables.ts';",
    "export { C } from '../dataplane/x.ts';",
    "const m = await import('../sources/kubernetes.ts');",
  ].join('\n');
  assert.deepEqual(runtimeImports(sample), ['../exec/iptables.ts', '../dataplane/x.ts', '../sources/kubernetes.ts']);
});

test('src/core and src/modes import no host code', () => {
  const offences: string[] = [];
  for (const dir of ['core', 'modes']) {
    for (const f of files(join(src, dir))) {
      for (const spec of runtimeImports(readFileSync(f, 'utf8'))) {
        const target = spec.startsWith('.') ? '/' + relative(src, resolve(f, '..', spec)) : spec;
        if (FORBIDDEN.some((re) => re.test(target))) offences.push(`${relative(src, f)} imports ${spec}`);
      }
    }
  }
  assert.deepEqual(offences, []);
});
