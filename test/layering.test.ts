// DESIGN.md: "A file's place says what it may touch: nothing under core/ or modes/ imports
// from exec/, dataplane/, sources/ or node:child_process". Planners stay pure; the host side
// of each mode lives in src/proxy/. The check follows runtime imports transitively through
// src/: a pure module that imports a helper that imports node:fs is as impure as one that
// imports node:fs itself. Type-only imports are erased and allowed.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { join, relative, resolve } from 'node:path';

const src = resolve(import.meta.dirname, '../src');
/** Host-side code: a pure module may not reach it, however indirectly. */
const FORBIDDEN_DIRS = /^(exec|dataplane|sources|proxy|server|sync|cli)\//;
const FORBIDDEN_BUILTINS = new Set(['fs', 'fs/promises', 'child_process', 'net', 'dgram', 'http', 'https', 'http2', 'tls', 'cluster', 'worker_threads']);
/** Packages that do I/O (logging to a stream, the API client). */
const FORBIDDEN_PACKAGES = new Set(['pino', '@kubernetes/client-node']);

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

/** What an import names: a file of src/ ("src:core/ip.ts"), a builtin ("node:fs") or a package. */
function target(fromFile: string, spec: string): string {
  if (spec.startsWith('.')) {
    const abs = resolve(fromFile, '..', spec);
    const file = existsSync(abs) ? abs : existsSync(abs + '.ts') ? abs + '.ts' : abs;
    return 'src:' + relative(src, file);
  }
  if (spec.startsWith('node:')) return spec;
  const bare = spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0];
  return FORBIDDEN_BUILTINS.has(spec) ? `node:${spec}` : bare;
}

function isForbidden(t: string): boolean {
  if (t.startsWith('src:')) return FORBIDDEN_DIRS.test(t.slice(4));
  if (t.startsWith('node:')) return FORBIDDEN_BUILTINS.has(t.slice(5));
  return FORBIDDEN_PACKAGES.has(t);
}

/** The import graph of src/: file ("src:...") → the targets it imports at run time. */
function importGraph(): Map<string, string[]> {
  const g = new Map<string, string[]>();
  for (const f of files(src)) g.set('src:' + relative(src, f), runtimeImports(readFileSync(f, 'utf8')).map((s) => target(f, s)));
  return g;
}

/** For each forbidden target reachable from `start`, the import chain that reaches it. */
export function forbiddenReach(graph: Map<string, string[]>, start: string, forbidden: (t: string) => boolean): string[][] {
  const chains: string[][] = [];
  const seen = new Set([start]);
  const queue: string[][] = [[start]];
  for (let i = 0; i < queue.length; i++) {
    const path = queue[i];
    for (const t of graph.get(path[path.length - 1]) ?? []) {
      if (forbidden(t)) chains.push([...path, t]);
      else if (!seen.has(t)) {
        seen.add(t);
        queue.push([...path, t]);
      }
    }
  }
  return chains;
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

test('the walk finds a forbidden import two modules away and names the chain', () => {
  const g = new Map([
    ['src:modes/a.ts', ['src:core/b.ts']],
    ['src:core/b.ts', ['src:core/c.ts', 'src:modes/a.ts']],
    ['src:core/c.ts', ['node:fs']],
  ]);
  assert.deepEqual(forbiddenReach(g, 'src:modes/a.ts', isForbidden), [['src:modes/a.ts', 'src:core/b.ts', 'src:core/c.ts', 'node:fs']]);
  assert.equal(isForbidden('src:exec/runner.ts'), true);
  assert.equal(isForbidden('src:iptables/save.ts'), false);
  assert.equal(isForbidden('node:path'), false);
  assert.equal(isForbidden('child_process') || isForbidden(target(join(src, 'x.ts'), 'child_process')), true);
});

test('nothing under src/core or src/modes reaches host code, however indirectly', () => {
  const graph = importGraph();
  const offences: string[] = [];
  for (const file of graph.keys()) {
    if (!/^src:(core|modes)\//.test(file)) continue;
    for (const chain of forbiddenReach(graph, file, isForbidden)) offences.push(chain.map((s) => s.replace(/^src:/, '')).join(' -> '));
  }
  assert.deepEqual(offences, []);
});

test('processes start only in src/exec (runner.ts: argument arrays, time limits, process groups)', () => {
  const offences: string[] = [];
  for (const [file, targets] of importGraph()) {
    if (file.startsWith('src:exec/')) continue;
    if (targets.includes('node:child_process')) offences.push(file.replace(/^src:/, ''));
  }
  assert.deepEqual(offences, [], 'start processes through src/exec/runner.ts (run, or forkNode for a Node child with IPC)');
});
