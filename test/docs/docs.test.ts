// The docs against the repository: every relative link in README.md and docs/*.md resolves
// (the file exists; a #anchor names a heading of the target, by GitHub's slug rules), the
// generated docs are what scripts/gen-docs.ts produces from the code, every figure in
// README.md sits in a paragraph or table that names the command measuring it, every
// `bench/…`, `scripts/…` or `npm run …` command the docs name exists, and README.md keeps its
// two set-up commands, the second being the test command .ci/run runs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { generated, ROOT } from '../../scripts/gen-docs.ts';

const README = join(ROOT, 'README.md');
const DOCS = readdirSync(join(ROOT, 'docs')).filter((f) => f.endsWith('.md')).map((f) => join(ROOT, 'docs', f));
const ALL = [README, ...DOCS];
/** docs/benchmarks.md's commands are checked with the benchmarks (test/bench). */
const COMMAND_DOCS = ALL.filter((f) => !f.endsWith(join('docs', 'benchmarks.md')));
const rel = (f: string) => relative(ROOT, f);

/** The text without fenced code blocks (their lines blanked, so line numbers stay). */
export function withoutFences(text: string): string {
  let inFence = false;
  return text
    .split('\n')
    .map((line) => {
      if (/^\s*(```|~~~)/.test(line)) {
        inFence = !inFence;
        return '';
      }
      return inFence ? '' : line;
    })
    .join('\n');
}

const withoutInlineCode = (s: string) => s.replace(/`[^`\n]*`/g, ' ');

/** GitHub's heading anchor (github-slugger): lower case, punctuation and symbols dropped, spaces to hyphens. */
export function slug(heading: string): string {
  const text = heading
    .replace(/!?\[([^\]]*)\]\([^)]*\)/g, '$1') // a link reads as its text
    .replace(/<[^>]+>/g, '')
    .trim()
    .toLowerCase();
  return text.replace(/[^\p{L}\p{M}\p{N}\p{Pc} -]/gu, '').replace(/ /g, '-');
}

/** Every anchor a Markdown file's headings define, with GitHub's -1, -2 suffixes for repeats. */
export function anchors(markdown: string): Set<string> {
  const out = new Set<string>();
  const seen = new Map<string, number>();
  for (const line of withoutFences(markdown).split('\n')) {
    const m = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line);
    if (!m) continue;
    const base = slug(m[1]);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  for (const m of markdown.matchAll(/<a\s+(?:name|id)="([^"]+)"/g)) out.add(m[1]);
  return out;
}

/** The relative link targets of a Markdown text (outside code), with their line numbers. */
export function relativeLinks(markdown: string): { target: string; line: number }[] {
  const out: { target: string; line: number }[] = [];
  withoutFences(markdown).split('\n').forEach((raw, i) => {
    const line = withoutInlineCode(raw);
    for (const m of line.matchAll(/\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
      const target = m[1];
      if (/^[a-z][a-z0-9+.-]*:/i.test(target)) continue; // http:, https:, mailto:
      out.push({ target, line: i + 1 });
    }
    for (const m of line.matchAll(/^\s*\[[^\]]+\]:\s+(\S+)/g)) {
      if (!/^[a-z][a-z0-9+.-]*:/i.test(m[1])) out.push({ target: m[1], line: i + 1 });
    }
  });
  return out;
}

/** What is wrong with one link of `file`, or null when it resolves. */
export function brokenLink(file: string, target: string): string | null {
  const [pathPart, anchor] = target.split('#', 2) as [string, string | undefined];
  const path = pathPart === '' ? file : resolve(dirname(file), decodeURIComponent(pathPart));
  if (!existsSync(path)) return `${target}: no such file`;
  if (anchor === undefined || anchor === '') return null;
  if (statSync(path).isDirectory() || !path.endsWith('.md')) return `${target}: an anchor into a file that is not Markdown`;
  const have = anchors(readFileSync(path, 'utf8'));
  return have.has(decodeURIComponent(anchor).toLowerCase()) ? null : `${target}: no heading with anchor #${anchor} in ${rel(path)}`;
}

/**
 * A figure: a number with a unit of time, size, rate or ratio (300 ms, 1.3 s, 187 MiB,
 * 1,184 MB/s, 46.0k req/s, 0.76×, 12 %). Counts, versions and addresses are not figures.
 */
const FIGURE = /(?<![\w.])\d[\d,]*(?:\.\d+)?k?\s?(?:µs|us|ms|s|min|h|[KMGT]i?B(?:\/s)?|B|×|%|req\/s|conn\/s|pps)(?![\w/])/gu;
/** A command that measures something: a bench/ or scripts/ file, or an npm script. */
const COMMAND = /(?:^|[\s`(])(?:(?:sudo\s+)?node\s+(?:--import\s+tsx\s+)?)?(?:bench|scripts)\/[\w./-]+\.(?:ts|js|mjs|sh|py)|npm run(?:\s+-s)?\s+[\w:-]+/;

/** The paragraphs (and tables, and list items) of a Markdown text that state a figure but name no command. */
export function figuresWithoutCommand(markdown: string): string[] {
  const blocks = withoutFences(markdown).split(/\n\s*\n/);
  const bad: string[] = [];
  for (const block of blocks) {
    if (/^\s*#/.test(block) && !block.trim().includes('\n')) continue; // a heading alone
    const prose = withoutInlineCode(block);
    const figures = [...prose.matchAll(FIGURE)].map((m) => m[0]);
    if (figures.length === 0) continue;
    if (!COMMAND.test(block)) bad.push(`${figures.join(', ')} in: ${block.trim().slice(0, 160)}`);
  }
  return bad;
}

/** The `bench/…`/`scripts/…` files and `npm run` scripts a Markdown text names. */
export function namedCommands(markdown: string): { files: string[]; scripts: string[] } {
  const files = [...markdown.matchAll(/(?<![\w/.-])((?:bench|scripts)\/[\w./-]+\.(?:ts|js|mjs|sh|py))\b/g)].map((m) => m[1]);
  const scripts = [...markdown.matchAll(/npm run(?:\s+-s)?\s+([\w:-]+)/g)].map((m) => m[1]);
  return { files: [...new Set(files)], scripts: [...new Set(scripts)] };
}

// ---- the checks' own rules, on small texts ------------------------------------------------

test('slugs follow GitHub: punctuation and symbols go, spaces become hyphens, repeats get -1', () => {
  assert.equal(slug('Step 2: sharding in the mode'), 'step-2-sharding-in-the-mode');
  assert.equal(slug('The scale bench (`bench/scale.ts`, 2 modes)'), 'the-scale-bench-benchscalets-2-modes');
  assert.equal(slug('The full run → Goals'), 'the-full-run--goals');
  assert.equal(slug("What cleanup removes (and what it never touches)"), 'what-cleanup-removes-and-what-it-never-touches');
  assert.deepEqual([...anchors('# A\n\n## A\n\n```\n# not a heading\n```\n')], ['a', 'a-1']);
});

test('a figure without a command is found; one with its command, or inside code, is not', () => {
  assert.equal(figuresWithoutCommand('A change takes 300 ms at 10,000 Services.').length, 1);
  assert.equal(figuresWithoutCommand('kproxy uses 187 MiB (1.3× less).').length, 1);
  assert.deepEqual(figuresWithoutCommand('A change takes 300 ms (`sudo node --import tsx bench/scale.ts`).'), []);
  assert.deepEqual(figuresWithoutCommand('It takes 2 s: `npm run bench`.'), []);
  assert.deepEqual(figuresWithoutCommand('10,000 Services, 9 rules, K ≤ 16, Node 20, `--sizes 100,1000` and `30s`.'), []);
  assert.deepEqual(figuresWithoutCommand('```\n300 ms\n```\n'), []);
});

test('a link to a missing file or heading is found', () => {
  const file = join(ROOT, 'docs', 'x.md');
  assert.equal(brokenLink(file, 'deploy.md'), null);
  assert.match(brokenLink(file, 'nowhere.md') ?? '', /no such file/);
  assert.match(brokenLink(file, 'deploy.md#no-such-heading') ?? '', /no heading/);
  assert.deepEqual(relativeLinks('[a](b.md) [c](https://x.y) `[d](e.md)`\n```\n[f](g.md)\n```\n').map((l) => l.target), ['b.md']);
});

// ---- the docs ---------------------------------------------------------------------------------

test('every relative link in README.md and docs/*.md resolves', () => {
  const broken: string[] = [];
  for (const file of ALL) {
    for (const { target, line } of relativeLinks(readFileSync(file, 'utf8'))) {
      const why = brokenLink(file, target);
      if (why) broken.push(`${rel(file)}:${line}: ${why}`);
    }
  }
  assert.deepEqual(broken, []);
});

test('the generated docs are what scripts/gen-docs.ts makes from the code (npm run docs:gen)', () => {
  for (const g of generated()) {
    assert.ok(g.current !== '', `${rel(g.path)} is missing`);
    assert.equal(g.current, g.wanted, `${rel(g.path)} is out of date: run npm run docs:gen`);
  }
});

test('docs/configuration.md lists every flag of the flag table and every config field', async () => {
  const { FLAGS } = await import('../../src/cli/flags.ts');
  const { configFields } = await import('../../src/config/fields.ts');
  const doc = readFileSync(join(ROOT, 'docs', 'configuration.md'), 'utf8');
  for (const f of FLAGS) assert.ok(doc.includes(`--${f.name}\``), `--${f.name} is listed`);
  for (const f of configFields()) assert.ok(doc.includes(`| \`${f.path}\` |`), `${f.path} is listed`);
  assert.ok(configFields().some((f) => f.path === 'userspace.tcpPath') && configFields().some((f) => f.path === 'conntrack.maxPerCore'));
});

test('every figure in README.md names the command that measures it', () => {
  assert.deepEqual(figuresWithoutCommand(readFileSync(README, 'utf8')), []);
});

test('every bench/, scripts/ and npm run command the docs name exists', () => {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
  const missing: string[] = [];
  for (const file of COMMAND_DOCS) {
    const { files, scripts } = namedCommands(readFileSync(file, 'utf8'));
    for (const f of files) if (!existsSync(join(ROOT, f))) missing.push(`${rel(file)}: ${f}`);
    for (const s of scripts) if (!(s in pkg.scripts)) missing.push(`${rel(file)}: npm run ${s}`);
  }
  assert.deepEqual(missing, []);
});

test('README.md keeps exactly two set-up commands: the demo, and the test command .ci/run runs', () => {
  const text = readFileSync(README, 'utf8');
  const start = text.indexOf('\n## Set-up commands\n');
  assert.ok(start >= 0, 'README.md has a "Set-up commands" section');
  const end = text.indexOf('\n## ', start + 1);
  const section = text.slice(start, end < 0 ? undefined : end);
  const blocks = [...section.matchAll(/```[^\n]*\n([\s\S]*?)```/g)].map((m) => m[1].trim());
  assert.deepEqual(blocks, ['npm ci && node bin/kproxy.js demo', 'npm ci && npm test']);
  const ci = readFileSync(join(ROOT, '.ci', 'run'), 'utf8');
  assert.match(ci, /^npm test$/m, '.ci/run runs the README\'s test command');
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { scripts: Record<string, string> };
  assert.match(pkg.scripts.demo, /bin\/kproxy\.js demo/);
});
