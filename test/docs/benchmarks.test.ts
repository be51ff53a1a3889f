// docs/benchmarks.md is a report of measured figures: every figure in it (a number with a
// unit: ms, s, MB, MiB, ×, req/s, µs, …, in tables and in text) sits in a section that names
// the command that produces it; every command named exists (the bench file, the npm script,
// and each flag the command passes is one that file accepts); every link and image resolves
// to a file of the repository.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';

const repoRoot = resolve(import.meta.dirname, '../..');
const DOC = join(repoRoot, 'docs/benchmarks.md');

export interface Section {
  heading: string;
  line: number;
  text: string;
}

/** The document cut at its `#` and `##` headings (a `###` stays inside its `##` section). */
export function sections(md: string): Section[] {
  const out: Section[] = [];
  let cur: Section = { heading: '(before the first heading)', line: 1, text: '' };
  let fenced = false;
  md.split('\n').forEach((l, i) => {
    if (l.startsWith('```')) fenced = !fenced;
    if (!fenced && /^#{1,2} /.test(l)) {
      out.push(cur);
      cur = { heading: l.replace(/^#+ /, ''), line: i + 1, text: '' };
    }
    cur.text += l + '\n';
  });
  out.push(cur);
  return out.filter((s) => s.text.trim());
}

const UNIT = String.raw`(?:ms|µs|s|min|MiB|MB|GiB|GB|KiB|KB|B|req/s|conn/s|MB/s|%)`;
/** "1.22 s", "300 ms", "1,501 B", "46,045 req/s", "1.22×", "0.76× nginx"; not "10,000 × 5" (a product). */
const FIGURE = new RegExp(String.raw`(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s?${UNIT}(?![\w/])|×(?!\s*\d))`, 'g');

export function figures(text: string): string[] {
  // links' targets and inline code holding paths or flags are not figures
  const prose = text.replace(/\]\([^)]*\)/g, ']').replace(/`[^`]*`/g, (c) => (/^`(sudo |node |npm |bash )/.test(c) ? '' : c));
  return prose.match(FIGURE) ?? [];
}

export interface Command {
  text: string;
  /** the file that takes its flags: bench/x.ts, or the npm script's file */
  file: string;
  flags: string[];
  npmScript?: string;
}

/** The bench commands a section names: in inline code and in fenced blocks. */
export function commands(text: string): Command[] {
  const candidates: string[] = [];
  for (const m of text.matchAll(/`([^`\n]+)`/g)) candidates.push(m[1]);
  for (const m of text.matchAll(/```[^\n]*\n([\s\S]*?)```/g)) {
    // a line ending in a backslash continues on the next
    candidates.push(...m[1].replace(/\\\n\s*/g, ' ').split('\n'));
  }
  const out: Command[] = [];
  for (const raw of candidates) {
    const c = raw.replace(/\s+#.*$/, '').replace(/^(time\s+)?(sudo\s+)?(time\s+)?/, '').trim();
    const flags = [...c.matchAll(/(?:^|\s)--([a-z][\w-]*)/g)].map((m) => m[1]).filter((f) => f !== 'import');
    let m = /^npm run ([\w:-]+)/.exec(c);
    if (m) {
      out.push({ text: c, file: '', flags, npmScript: m[1] });
      continue;
    }
    m = /^node (?:--import tsx |--expose-gc )*(bench\/[\w.-]+\.ts)/.exec(c);
    if (m) {
      out.push({ text: c, file: m[1], flags });
      continue;
    }
    m = /^bash (bench\/[\w.-]+\.sh)/.exec(c);
    if (m) out.push({ text: c, file: m[1], flags: [] });
  }
  return out;
}

/** What is wrong with one command: a missing file or script, a flag its file does not know. */
export function commandProblems(c: Command, root = repoRoot): string[] {
  const problems: string[] = [];
  let file = c.file;
  if (c.npmScript) {
    const scripts = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: Record<string, string> }).scripts;
    const script = scripts[c.npmScript];
    if (!script) return [`npm script ${c.npmScript} is not in package.json`];
    file = /(bench\/[\w.-]+\.ts|scripts\/[\w.-]+)/.exec(script)?.[1] ?? '';
  }
  if (!file) return c.flags.length ? [`cannot tell which file takes the flags of ${c.text}`] : [];
  if (!existsSync(join(root, file))) return [`${file} does not exist`];
  const src = readFileSync(join(root, file), 'utf8');
  for (const f of c.flags) {
    if (!(src.includes(`--${f}`) || src.includes(`'${f}'`) || new RegExp(String.raw`(?<![\w-])${f}: \{`).test(src))) problems.push(`${file} does not accept --${f}`);
  }
  return problems;
}

export function links(md: string): string[] {
  return [...md.matchAll(/!?\[[^\]]*\]\(([^)\s]+)\)/g)].map((m) => m[1]).filter((l) => !/^(https?:|mailto:|#)/.test(l));
}

const doc = readFileSync(DOC, 'utf8');

test('the checker finds figures, commands and bad flags (it can fail)', () => {
  assert.deepEqual(figures('took 1.22 s, 300 ms and 1,501 B; 0.76× nginx; 46,045 req/s; 10,000 × 5 Services'), ['1.22 s', '300 ms', '1,501 B', '0.76×', '46,045 req/s']);
  assert.deepEqual(figures('see [x](bench/quick/a-1.5s.svg), run `bench/scale.ts --sizes 100`'), []);
  const cs = commands('run `sudo npm run bench -- --quick` or\n```\nsudo node --import tsx bench/scale.ts --sizes 1 \\\n  --no-such-flag\n```\n');
  assert.deepEqual(cs.map((c) => [c.npmScript ?? c.file, c.flags]), [['bench', ['quick']], ['bench/scale.ts', ['sizes', 'no-such-flag']]]);
  assert.deepEqual(commandProblems(cs[0]), []);
  assert.deepEqual(commandProblems(cs[1]), ['bench/scale.ts does not accept --no-such-flag']);
  assert.deepEqual(commandProblems({ text: 'node --import tsx bench/gone.ts', file: 'bench/gone.ts', flags: [] }), ['bench/gone.ts does not exist']);
  assert.deepEqual(commandProblems({ text: 'npm run nope', file: '', flags: [], npmScript: 'nope' }), ['npm script nope is not in package.json']);
  const s = sections('# T\n\nintro\n\n## A\n\n3 ms\n\n### A.1\n\n`npm run bench`\n\n## B\n\n4 s\n');
  assert.deepEqual(s.map((x) => [x.heading, figures(x.text).length, commands(x.text).length]), [['T', 0, 0], ['A', 1, 1], ['B', 1, 0]]);
});

test('every figure in docs/benchmarks.md is in a section that names the command producing it', () => {
  const bad: string[] = [];
  let count = 0;
  for (const s of sections(doc)) {
    const f = figures(s.text);
    count += f.length;
    if (f.length && !commands(s.text).length) bad.push(`"${s.heading}" (line ${s.line}): ${f.slice(0, 5).join(', ')} and no command`);
  }
  assert.ok(count >= 50, `only ${count} figures found: the checker or the document is wrong`);
  assert.deepEqual(bad, []);
});

test('every command docs/benchmarks.md names exists, with the flags it passes', () => {
  const all = sections(doc).flatMap((s) => commands(s.text));
  assert.ok(all.some((c) => c.npmScript === 'bench' && c.flags.includes('quick')), 'the report names `npm run bench -- --quick`');
  const problems = all.flatMap((c) => commandProblems(c).map((p) => `${c.text}: ${p}`));
  assert.deepEqual([...new Set(problems)], []);
});

test('every link and image in docs/benchmarks.md resolves to a file', () => {
  const ls = links(doc);
  assert.ok(ls.some((l) => l.endsWith('.svg')), 'the report shows its plots');
  const missing = ls.filter((l) => !existsSync(join(dirname(DOC), decodeURIComponent(l.split('#')[0]))));
  assert.deepEqual(missing, []);
});

test('docs/benchmarks.md stays a report: at most 400 lines, no run-by-run narration', () => {
  const lines = doc.split('\n');
  assert.ok(lines.length <= 400, `${lines.length} lines`);
  const narration = lines.filter((l) => /\b(round(?!-)|step \d|before the merge|after the merge|this round)\b/i.test(l));
  assert.deepEqual(narration, []);
});
