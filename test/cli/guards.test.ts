// Process supervision of `kproxy run`: an error that escapes every handler (an unhandled
// rejection, an uncaught exception) is logged with its stack and kproxy keeps serving; only a
// storm of them (its state cannot be trusted) makes it exit 1, rules left in place.
// The end-to-end case runs the real command in a namespace of its own (kpc-guard-*), with a
// preload that injects both kinds of error on SIGUSR2.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import pino from 'pino';
import { createErrorGuard } from '../../src/cli/guards.ts';
import { Netns, repoRoot, uniqueName, waitFor } from '../support/netns.ts';

function memoryLogger(): { log: pino.Logger; lines: Array<Record<string, any>> } { // eslint-disable-line @typescript-eslint/no-explicit-any
  const lines: Array<Record<string, any>> = []; // eslint-disable-line @typescript-eslint/no-explicit-any
  const log = pino({ level: 'info' }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  return { log, lines };
}

test('an escaped error is logged with its stack and does not exit; a storm of them exits 1', () => {
  const { log, lines } = memoryLogger();
  const exits: number[] = [];
  let t = 0;
  const guard = createErrorGuard(log, { maxErrors: 3, windowMs: 10_000, exit: (c) => exits.push(c), now: () => t });
  guard.onError('KPROXY_UNHANDLED_REJECTION', new Error('boom'));
  guard.onError('KPROXY_UNCAUGHT_EXCEPTION', 'a string, not an Error');
  assert.equal(lines.length, 2);
  assert.equal(lines[0].code, 'KPROXY_UNHANDLED_REJECTION');
  assert.match(lines[0].err.stack, /Error: boom\n\s+at /);
  assert.match(lines[0].msg, /kproxy keeps running/);
  assert.match(lines[1].err.message, /non-Error value: a string, not an Error/);
  // spread out in time: never a storm
  for (let i = 0; i < 10; i++) {
    t += 5_000;
    guard.onError('KPROXY_UNCAUGHT_EXCEPTION', new Error(`slow ${i}`));
  }
  assert.deepEqual(exits, []);
  // four within the window: give up, once
  for (let i = 0; i < 6; i++) guard.onError('KPROXY_UNCAUGHT_EXCEPTION', new Error(`fast ${i}`));
  assert.deepEqual(exits, [1]);
  assert.ok(lines.some((l) => l.code === 'KPROXY_ERROR_STORM' && /rules stay in place/.test(l.msg)));
});

test('kproxy run: an unhandled rejection and an uncaught exception are logged with their stacks and it keeps running', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'kpc-guard-'));
  const ns = Netns.create(uniqueName('kpc-guard'));
  try {
    const manifests = join(dir, 'manifests');
    mkdirSync(manifests);
    const preload = join(dir, 'inject.mjs');
    writeFileSync(
      preload,
      `process.on('SIGUSR2', () => {
  Promise.reject(new Error('kpc injected rejection'));
  setTimeout(() => { throw new Error('kpc injected exception'); }, 10);
});
`,
    );
    let out = '';
    const p = ns.spawn(
      process.execPath,
      ['--import', pathToFileURL(preload).href, resolve(repoRoot, 'bin/kproxy.js'), 'run', '--mode', 'userspace', '--manifests', manifests,
        '--healthz-bind-address', '127.0.0.1:10256', '--metrics-bind-address', '127.0.0.1:10249'],
      { env: { KPROXY_NO_BUNDLE: '1' }, onOutput: (s) => (out += s) },
    );
    let exit: number | null = null;
    p.on('exit', (code) => (exit = code ?? 128));
    await waitFor('first sync', () => /"msg":"synced"/.test(out) || exit !== null, 60_000, 100);
    assert.equal(exit, null, `kproxy exited early: ${out}`);

    process.kill(p.pid!, 'SIGUSR2');
    const logged = () => {
      const recs = out.split('\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));
      return {
        rejection: recs.find((r) => r.code === 'KPROXY_UNHANDLED_REJECTION'),
        exception: recs.find((r) => r.code === 'KPROXY_UNCAUGHT_EXCEPTION'),
      };
    };
    await waitFor('both errors logged', () => (logged().rejection && logged().exception) || exit !== null, 30_000, 100);
    assert.equal(exit, null, `kproxy exited after the injected errors: ${out}`);
    const { rejection, exception } = logged();
    assert.match(rejection.err.stack, /kpc injected rejection\n\s+at /);
    assert.match(exception.err.stack, /kpc injected exception\n\s+at /);

    // still serving: health answers from inside the namespace
    const health = ns.exec('curl', ['-s', '-o', '/dev/null', '-w', '%{http_code}', '--max-time', '10', 'http://127.0.0.1:10256/healthz'], { allowFail: true });
    assert.match(health, /^(200|503)$/, `healthz answered ${health}`);
    assert.equal(exit, null);

    // SIGTERM handling is unchanged: a clean stop with code 0
    const stopped = new Promise<number | null>((r) => p.once('exit', (c) => r(c)));
    process.kill(p.pid!, 'SIGTERM');
    const code = await Promise.race([stopped, new Promise<string>((r) => setTimeout(() => r('timeout'), 15_000).unref())]);
    assert.equal(code, 0, out);
    t.diagnostic('both errors logged with stacks; kproxy kept running and stopped cleanly on SIGTERM');
  } finally {
    await ns.destroy();
    rmSync(dir, { recursive: true, force: true });
  }
});
