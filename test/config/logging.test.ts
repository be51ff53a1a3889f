// --logging-format: `text` gives klog-like single lines, `json` pino's JSON; -v still maps
// onto the log level in both.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createLogger, klogLine } from '../../src/log.ts';
import { invocationOf } from '../../src/cli/main.ts';
import type { ProxyInvocation } from '../../src/cli/flags.ts';

function inv(...args: string[]): ProxyInvocation {
  const r = invocationOf(args);
  assert.ok('cfg' in r);
  return r;
}

function capture(level: string, format: 'json' | 'text') {
  const lines: string[] = [];
  const log = createLogger({ level, format, dest: { write: (s: string) => lines.push(s) } });
  return { log, lines };
}

test('klogLine: severity, timestamp, pid, component, quoted message, key=value pairs', () => {
  const time = new Date(2026, 11, 3, 10, 0, 0, 123).getTime();
  const rec = { level: 40, time, app: 'kproxy', component: 'sync', msg: 'sync failed', family: 'IPv4', tries: 3, ok: false, err: { type: 'Error', message: 'boom\nline 2', stack: 'Error: boom\n  at x' }, ids: [1, 2] };
  assert.equal(klogLine(JSON.stringify(rec), 1234), 'W1203 10:00:00.123000    1234 sync] "sync failed" family="IPv4" tries=3 ok=false err="boom\\nline 2" ids=[1,2]\n');
  assert.match(klogLine(JSON.stringify({ level: 30, time, msg: 'x' }), 7), /^I1203 10:00:00\.123000       7 kproxy\] "x"\n$/);
  assert.match(klogLine(JSON.stringify({ level: 50, time, msg: 'x' })), /^E/);
  assert.match(klogLine(JSON.stringify({ level: 60, time, msg: 'x' })), /^F/);
  assert.match(klogLine(JSON.stringify({ level: 20, time, msg: 'x' })), /^I/, 'debug and trace are klog V(n) info lines');
  assert.equal(klogLine('not json'), 'not json\n');
});

test('createLogger text: one line per record, level filtered, children name the component', () => {
  const { log, lines } = capture('info', 'text');
  log.child({ component: 'source-kubernetes' }).warn({ resource: 'services', attempt: 2 }, 'cannot reach the API server');
  log.debug('hidden');
  log.info('synced');
  assert.equal(lines.length, 2, JSON.stringify(lines));
  assert.match(lines[0], new RegExp(`^W\\d{4} \\d\\d:\\d\\d:\\d\\d\\.\\d{6} +${process.pid} source-kubernetes\\] "cannot reach the API server" resource="services" attempt=2\\n$`));
  assert.match(lines[1], /^I\d{4} .* kproxy\] "synced"\n$/);
  for (const l of lines) assert.throws(() => JSON.parse(l), 'text lines are not JSON');
});

test('createLogger json: pino JSON lines as before', () => {
  const { log, lines } = capture('info', 'json');
  log.info({ n: 1 }, 'synced');
  const rec = JSON.parse(lines[0]) as Record<string, unknown>;
  assert.equal(rec.msg, 'synced');
  assert.equal(rec.n, 1);
  assert.equal(rec.level, 30);
});

test('--logging-format and logging.format pick the format; JSON when neither is set; -v maps onto the level', () => {
  assert.equal(inv().logFormat, 'json');
  assert.equal(inv('--logging-format=text').logFormat, 'text');
  assert.equal(inv('--logging-format=json').logFormat, 'json');
  const t = inv('--logging-format=text', '-v=4');
  assert.equal(t.logLevel, 'debug');
  assert.equal(inv('--logging-format=text', '-v=5').logLevel, 'trace');
  assert.equal(inv('--logging-format=text', '--log-level=warn').logLevel, 'warn');
  // -v 4 in text: debug lines appear, trace lines do not
  const { log, lines } = capture(t.logLevel, t.logFormat);
  log.debug('dbg');
  log.trace('trc');
  assert.deepEqual(lines.map((l) => l.replace(/^.*\] /, '')), ['"dbg"\n']);
  assert.throws(() => inv('--logging-format=xml'), /KPROXY_CONFIG_INVALID: .*logging\.format/);
  const dir = mkdtempSync(join(tmpdir(), 'kpt-logfmt-'));
  try {
    const file = join(dir, 'c.yaml');
    writeFileSync(file, 'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nlogging:\n  format: text\n  verbosity: 2\n');
    const f = inv(`--config=${file}`);
    assert.equal(f.logFormat, 'text');
    assert.equal(f.logLevel, 'debug');
    // the logging flags still override the file, as upstream
    assert.equal(inv(`--config=${file}`, '--logging-format=json').logFormat, 'json');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
