// Generates the parts of the docs that the code defines, so they cannot drift from it:
//   docs/configuration.md  from scripts/configuration.template.md, the flag table (FLAGS in
//                          src/cli/flags.ts), the config decoder's fields (SPEC in
//                          src/config/config.ts, described in src/config/fields.ts), the
//                          defaults resolveConfig fills in, per mode, and ENV_VARS;
//   docs/troubleshooting.md's error-code table, from ERROR_CODES in src/errors.ts.
// `npm run docs:gen` writes them; `npm run docs:gen -- --check` exits 1 when a committed file
// differs. test/docs/docs.test.ts checks the same.
import { readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { FLAGS } from '../src/cli/flags.ts';
import { MODES, formatDuration, resolveConfig } from '../src/config/config.ts';
import { FIELD_DOCS, configFields } from '../src/config/fields.ts';
import { ENV_VARS, ERROR_CODES } from '../src/errors.ts';

export const ROOT = fileURLToPath(new URL('..', import.meta.url));
export const CONFIGURATION = join(ROOT, 'docs/configuration.md');
export const TROUBLESHOOTING = join(ROOT, 'docs/troubleshooting.md');
const TEMPLATE = join(ROOT, 'scripts/configuration.template.md');

const cell = (s: string) => s.replace(/\|/g, '\\|').replace(/\n/g, ' ');
const code = (s: string) => '`' + s + '`';

function scopeText(scope: string): string {
  if (scope === 'config') return 'ignored (warning)';
  if (scope === 'logging') return 'wins over the file';
  return 'applies';
}

/** The flag table: every entry of FLAGS, in its order. */
export function flagTable(): string {
  const rows = FLAGS.map((f) => {
    const name = (f.short && f.short !== f.name ? `-${f.short}, ` : '') + `--${f.name}`;
    const type = f.type === 'bool' ? 'bool' : f.type === 'level' ? 'int' : f.type;
    const notes = [
      f.kproxy ? '**kproxy\'s own.**' : '',
      f.deprecated ? `**Deprecated:** ${f.deprecated}.` : '',
      f.note ? `**kproxy:** ${f.note}.` : '',
    ].filter(Boolean).join(' ');
    return `| ${code(name)} | ${type} | ${f.dflt !== undefined ? code(f.dflt) : ''} | ${scopeText(f.scope)} | ${cell(f.help)}${notes ? ' ' + cell(notes) : ''} |`;
  });
  return ['| flag | type | default | with `--config` | meaning |', '|---|---|---|---|---|', ...rows].join('\n');
}

function at(obj: unknown, path: string): unknown {
  return path.split('.').reduce<unknown>((o, k) => (o !== null && typeof o === 'object' ? (o as Record<string, unknown>)[k] : undefined), obj);
}

function show(v: unknown): string {
  if (v === undefined) return '';
  if (typeof v === 'string') return v === '' ? '`""`' : code(v);
  return code(JSON.stringify(v));
}

/** The userspace block's defaults, in the file's units. */
function userspaceDefaults(): Record<string, unknown> {
  const u = resolveConfig({ mode: 'userspace' }).userspace;
  return { workers: u.workers, maxConnections: u.maxConnections, idleTimeout: formatDuration(u.idleTimeoutMs), udpMaxSessions: u.udpMaxSessions, udpMaxSessionsPerClient: u.udpMaxSessionsPerClient, tcpPath: u.tcpPath };
}

/** A field's default: one value, or the value per mode where the modes differ. */
function defaultOf(path: string, perMode: Record<string, Record<string, unknown>>): string {
  const doc = FIELD_DOCS[path];
  if (doc.dflt !== undefined) return doc.dflt;
  if (path.startsWith('userspace.')) return show(userspaceDefaults()[path.slice('userspace.'.length)]);
  const values = MODES.map((m) => [m, show(at(perMode[m], path))] as const);
  const distinct = [...new Set(values.map(([, v]) => v))];
  if (distinct.length === 1) return distinct[0];
  return distinct.map((v) => `${values.filter(([, w]) => w === v).map(([m]) => m).join(', ')}: ${v || 'none'}`).join('; ');
}

/** The config field table: every leaf of SPEC, with its type, default and meaning. */
export function fieldTable(): string {
  const fields = configFields();
  const paths = new Set(fields.map((f) => f.path));
  const undocumented = fields.filter((f) => !FIELD_DOCS[f.path]).map((f) => f.path);
  const stale = Object.keys(FIELD_DOCS).filter((p) => !paths.has(p));
  if (undocumented.length || stale.length) {
    throw new Error(`src/config/fields.ts FIELD_DOCS: describe ${undocumented.join(', ') || '-'}; remove ${stale.join(', ') || '-'}`);
  }
  const perMode = Object.fromEntries(MODES.map((m) => [m, resolveConfig({ mode: m }).v1alpha1]));
  const rows = fields.map((f) => {
    const doc = FIELD_DOCS[f.path];
    const help = (doc.kproxy ? '**kproxy\'s own.** ' : '') + doc.help;
    return `| ${code(f.path)} | ${f.type} | ${cell(defaultOf(f.path, perMode))} | ${cell(help)} |`;
  });
  return ['| field | type | default | meaning |', '|---|---|---|---|', ...rows].join('\n');
}

/** The environment variables kproxy reads (ENV_VARS in src/errors.ts). */
export function envTable(): string {
  const rows = Object.entries(ENV_VARS).map(([name, help]) => `| ${code(name)} | ${cell(help)} |`);
  return ['| variable | meaning |', '|---|---|', ...rows].join('\n');
}

/** docs/configuration.md as the template and the flag, field and environment tables make it. */
export function configurationDoc(): string {
  const template = readFileSync(TEMPLATE, 'utf8');
  const parts: [string, () => string][] = [['<!-- FLAGS -->', flagTable], ['<!-- FIELDS -->', fieldTable], ['<!-- ENV -->', envTable]];
  let out = template;
  for (const [mark, make] of parts) {
    if (!out.includes(mark)) throw new Error(`${TEMPLATE} lacks ${mark}`);
    out = out.replace(mark, make());
  }
  return out;
}

export const ERRORS_BEGIN = '<!-- error-codes: generated from src/errors.ts by scripts/gen-docs.ts (npm run docs:gen) -->';
export const ERRORS_END = '<!-- /error-codes -->';

/** The error-code table of docs/troubleshooting.md, markers included. */
export function errorCodesSection(): string {
  const rows = Object.entries(ERROR_CODES).map(([c, m]) => `| \`${c}\` | ${m.replace(/\|/g, '\\|')} |`);
  return [ERRORS_BEGIN, '', '| code | meaning, and what to do |', '|---|---|', ...rows, '', ERRORS_END].join('\n');
}

/** `text` (docs/troubleshooting.md) with its error-code section regenerated. */
export function withErrorCodes(text: string): string {
  const start = text.indexOf(ERRORS_BEGIN);
  const end = text.indexOf(ERRORS_END);
  if (start < 0 || end < start) throw new Error(`docs/troubleshooting.md needs the markers ${ERRORS_BEGIN} and ${ERRORS_END}`);
  return text.slice(0, start) + errorCodesSection() + text.slice(end + ERRORS_END.length);
}

/** Each generated file with its current and its generated text. */
export function generated(): { path: string; current: string; wanted: string }[] {
  const read = (p: string) => {
    try {
      return readFileSync(p, 'utf8');
    } catch {
      return '';
    }
  };
  const trouble = read(TROUBLESHOOTING);
  return [
    { path: CONFIGURATION, current: read(CONFIGURATION), wanted: configurationDoc() },
    { path: TROUBLESHOOTING, current: trouble, wanted: withErrorCodes(trouble) },
  ];
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const check = process.argv.includes('--check');
  let stale = 0;
  for (const g of generated()) {
    if (g.current === g.wanted) continue;
    if (check) {
      stale++;
      process.stderr.write(`${g.path} is out of date: run npm run docs:gen\n`);
    } else {
      writeFileSync(g.path, g.wanted);
      process.stdout.write(`wrote ${g.path}\n`);
    }
  }
  process.exit(stale ? 1 : 0);
}
