// hostRunner against real processes: spawn failures are rejections with a stable code (never a
// crash), every run has a time limit, and a limit kills the whole process group and returns
// at once even when a grandchild holds the pipes. The fd-exhaustion case runs in a child node
// process so that this test runner keeps its descriptors.
import { test, mock } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createHash } from 'node:crypto';
import { Writable } from 'node:stream';
import { DEFAULT_TIMEOUT_MS, effectiveTimeoutMs, ExecError, hostRunner, INPUT_CHUNK, inputText, writeInput } from '../../src/kernel/runner.ts';

const runnerUrl = new URL('../../src/kernel/runner.ts', import.meta.url).href;
const root = fileURLToPath(new URL('../..', import.meta.url));

function codeOf(e: unknown): string | undefined {
  return e instanceof ExecError ? e.code : undefined;
}

/** gone, or only a zombie for a moment: poll /proc until the pid has no entry at all. */
async function waitGone(pid: number, deadlineMs: number): Promise<string> {
  const until = Date.now() + deadlineMs;
  let state = '';
  while (Date.now() < until) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
    } catch {
      return 'gone';
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  return state;
}

test('a missing binary rejects with KPROXY_EXEC_MISSING', async () => {
  await assert.rejects(hostRunner.run('kproxy-no-such-binary-xyz', ['--version']), (e: unknown) => {
    assert.equal(codeOf(e), 'KPROXY_EXEC_MISSING');
    assert.match((e as Error).message, /^KPROXY_EXEC_MISSING: kproxy-no-such-binary-xyz not found/);
    return true;
  });
});

test('a non-executable file rejects with KPROXY_EXEC_SPAWN_FAILED naming the errno', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpc-runner-'));
  try {
    const f = join(dir, 'not-executable');
    writeFileSync(f, '#!/bin/sh\necho hi\n', { mode: 0o644 });
    const r = await hostRunner.run(f, []).then(
      () => 'resolved',
      (e: unknown) => e,
    );
    // root may execute a 0644 file? No: execve needs an x bit for everyone, root included.
    assert.equal(codeOf(r), 'KPROXY_EXEC_SPAWN_FAILED', String(r));
    assert.match((r as Error).message, /could not start .*not-executable \(EACCES/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('fd exhaustion (EMFILE) rejects with KPROXY_EXEC_SPAWN_FAILED and the process lives on', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpc-runner-'));
  try {
    const script = join(dir, 'emfile.mjs');
    writeFileSync(
      script,
      `import { openSync, closeSync } from 'node:fs';
import { hostRunner } from ${JSON.stringify(runnerUrl)};
const fds = [];
try { for (let i = 0; i < 100000; i++) fds.push(openSync('/dev/null', 'r')); } catch (e) { if (e.code !== 'EMFILE') throw e; }
let outcome;
try {
  await hostRunner.run('true', []);
  outcome = { resolved: true };
} catch (e) {
  outcome = { code: e.code, message: e.message };
}
for (const fd of fds) closeSync(fd);
// still alive, and the runner works again once descriptors are free
const again = await hostRunner.run('sh', ['-c', 'echo again']);
console.log(JSON.stringify({ outcome, again: again.stdout.trim(), opened: fds.length }));
`,
    );
    // a low limit keeps the exhaustion quick; the script itself needs ~30 descriptors to load
    const r = spawnSync('prlimit', ['--nofile=256:256', process.execPath, '--import', 'tsx', script], {
      cwd: root,
      encoding: 'utf8',
      timeout: 60_000,
    });
    assert.equal(r.status, 0, `child exited ${r.status} (signal ${r.signal}): ${r.stderr}`);
    const res = JSON.parse(r.stdout.trim().split('\n').pop()!);
    assert.ok(res.opened > 0, JSON.stringify(res));
    assert.equal(res.outcome.code, 'KPROXY_EXEC_SPAWN_FAILED', JSON.stringify(res));
    assert.match(res.outcome.message, /could not start true \(EMFILE.*too many open files/);
    assert.equal(res.again, 'again');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a time limit kills the whole process group and returns at once although a grandchild holds the pipes', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpc-runner-'));
  try {
    const pids = join(dir, 'pids');
    // sh forks a background sleep that inherits stdout/stderr, then sleeps itself
    const script = `echo $$ > ${pids}.tmp; sleep 30 & echo $! >> ${pids}.tmp; mv ${pids}.tmp ${pids}; sleep 30`;
    const t0 = Date.now();
    // 3 s: time enough for sh to write its pids on a loaded machine, far below the 30 s sleeps
    const e = await hostRunner.run('sh', ['-c', script], { timeoutMs: 3000 }).then(
      (r) => r,
      (err: unknown) => err,
    );
    const took = Date.now() - t0;
    assert.equal(codeOf(e), 'KPROXY_EXEC_TIMEOUT', `got ${JSON.stringify(e)} after ${took} ms`);
    assert.match((e as Error).message, /^KPROXY_EXEC_TIMEOUT: sh -c .* did not finish within 3000 ms; its process group was killed/);
    assert.ok(took < 20_000, `returned after ${took} ms (the sleeps last 30 s)`);
    assert.ok(existsSync(pids), 'the shell wrote its pid and its background child pid before the limit');
    const [shPid, sleepPid] = readFileSync(pids, 'utf8').trim().split('\n').map(Number);
    assert.ok(shPid > 1 && sleepPid > 1);
    assert.equal(await waitGone(shPid, 10_000), 'gone', `sh ${shPid} is gone, not left a zombie`);
    assert.equal(await waitGone(sleepPid, 10_000), 'gone', `background sleep ${sleepPid} is gone, not left a zombie`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('the child leads its own process group, so a group kill never reaches kproxy', async () => {
  const r = await hostRunner.run('sh', ['-c', 'echo $$; cut -d" " -f5 /proc/$$/stat'], { timeoutMs: 30_000 });
  const [pid, pgid] = r.stdout.trim().split('\n').map(Number);
  assert.equal(pgid, pid, 'the child is its own group leader');
  const ours = Number(readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' ')[2]);
  assert.notEqual(pgid, ours);
});

test('no run is unbounded: a missing, zero or non-finite limit means the default', async () => {
  for (const v of [undefined, 0, -1, Number.NaN, Number.POSITIVE_INFINITY]) assert.equal(effectiveTimeoutMs(v), DEFAULT_TIMEOUT_MS, String(v));
  assert.equal(effectiveTimeoutMs(1500), 1500);

  // A call without any limit (as the controller's leftover probes and the ipvs cleanup make)
  // is killed when the default passes: fake time, a real process.
  mock.timers.enable({ apis: ['setTimeout'] });
  try {
    const p = hostRunner.run('sleep', ['30']).then(
      (r) => r,
      (e: unknown) => e,
    );
    mock.timers.tick(DEFAULT_TIMEOUT_MS - 1);
    let early: unknown = 'pending';
    void p.then((v) => (early = v));
    await new Promise((r) => setImmediate(r));
    assert.equal(early, 'pending', 'still running just before the default limit');
    mock.timers.tick(1);
    const e = await p;
    assert.equal(codeOf(e), 'KPROXY_EXEC_TIMEOUT', JSON.stringify(e));
    assert.match((e as Error).message, new RegExp(`within ${DEFAULT_TIMEOUT_MS} ms`));
  } finally {
    mock.timers.reset();
  }
});

test('input to a command that exits without reading it (EPIPE) is no error', async () => {
  const r = await hostRunner.run('true', [], { input: 'x'.repeat(4 << 20), timeoutMs: 30_000 });
  assert.equal(r.code, 0);
});

test('a large input reaches the command byte for byte, surrogate pairs across slice boundaries included', async () => {
  // 'é' (2 bytes), '😀' (a surrogate pair, 4 bytes) placed so that some pairs straddle a slice end
  const unit = 'a'.repeat(INPUT_CHUNK - 1) + '😀' + 'é\n';
  const input = unit.repeat(40) + '-A KUBE-SERVICES -m comment --comment "ns/😀:p" -j ACCEPT\n';
  const r = await hostRunner.run('sha256sum', [], { input, timeoutMs: 30_000 });
  assert.equal(r.code, 0, r.stderr);
  assert.equal(r.stdout.split(' ')[0], createHash('sha256').update(input, 'utf8').digest('hex'));
});

test('writeInput hands the pipe one slice at a time, the next one after it drained, then ends it', async () => {
  const writes: number[] = [];
  let pendingCallbacks: Array<() => void> = [];
  const sink = new Writable({
    highWaterMark: 16,
    write(chunk: Buffer, _enc, cb) {
      writes.push(chunk.length);
      pendingCallbacks.push(cb); // the reader is slow: the buffer stays full until we release it
    },
  });
  const ended = new Promise<void>((r) => sink.on('finish', () => r()));
  writeInput(sink, 'x'.repeat(1000), 100);
  assert.deepEqual(writes, [100], 'one slice written, the rest waits for drain');
  for (let i = 0; i < 50 && pendingCallbacks.length; i++) {
    const cbs = pendingCallbacks;
    pendingCallbacks = [];
    for (const cb of cbs) cb();
    await new Promise((r) => setImmediate(r));
  }
  await ended;
  assert.deepEqual(writes, Array(10).fill(100));
});

test('writeInput takes an input in parts one part at a time, as the pipe drains, and writes them whole and in order', async () => {
  const written: string[] = [];
  let pendingCallbacks: Array<() => void> = [];
  const sink = new Writable({
    highWaterMark: 16,
    decodeStrings: false,
    write(chunk: string, _enc, cb) {
      written.push(chunk);
      pendingCallbacks.push(cb);
    },
  });
  const ended = new Promise<void>((r) => sink.on('finish', () => r()));
  let taken = 0;
  const parts = function* (): Iterable<string> {
    for (let i = 0; i < 5; i++) {
      taken++;
      yield `part ${i}\n`.repeat(30); // 210 chars: three slices of 100 or fewer
    }
  };
  writeInput(sink, parts, 100);
  assert.equal(taken, 1, 'only the first part is built before the pipe drains');
  for (let i = 0; i < 100 && pendingCallbacks.length; i++) {
    const cbs = pendingCallbacks;
    pendingCallbacks = [];
    for (const cb of cbs) cb();
    await new Promise((r) => setImmediate(r));
  }
  await ended;
  assert.equal(taken, 5);
  assert.equal(written.join(''), [...parts()].join(''));
  assert.ok(written.every((w) => w.length <= 100), 'every write is one slice');
});

test('hostRunner: an input whose parts cannot be built kills the command before it sees the end of its input', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-parts-'));
  try {
    const parts = function* (): Iterable<string> {
      yield 'first line\n';
      throw new Error('a part failed');
    };
    // the command marks having read its whole input; killed first, it never does
    const script = `cat > ${dir}/input; echo done > ${dir}/done`;
    await assert.rejects(hostRunner.run('sh', ['-c', script], { input: parts, timeoutMs: 30_000 }), (e: unknown) => {
      assert.ok(e instanceof ExecError);
      assert.equal(e.code, 'KPROXY_EXEC_FAILED');
      assert.match(e.message, /a part failed/);
      return true;
    });
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(existsSync(join(dir, 'done')), false, 'the command did not go on as if its input were whole');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('inputText: a string as it is, parts joined, nothing as empty', () => {
  assert.equal(inputText('a\nb\n'), 'a\nb\n');
  assert.equal(inputText(() => ['a\n', 'b\n']), 'a\nb\n');
  assert.equal(inputText(undefined), '');
});
