// A worker fork refused for real (EMFILE: the process is out of fds) is counted and retried,
// never a crash: test/userspace/workers-emfile-main.ts under `prlimit --nofile=128` takes every
// free fd, starts a pool of one worker, then frees the fds; the worker comes up on a retry.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { resolve } from 'node:path';
import { repoRoot } from '../support/netns.ts';

test('out of fds, a worker fork fails with EMFILE: counted, retried, the worker comes up once fds are free; no crash', async () => {
  const child = spawn('prlimit', ['--nofile=128:128', process.execPath, '--import', 'tsx', resolve(repoRoot, 'test/userspace/workers-emfile-main.ts')], { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err = (err + d.toString()).slice(-4000)));
  const code = await new Promise<number | null>((r) => {
    const t = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('exit', (c) => {
      clearTimeout(t);
      r(c);
    });
  });
  assert.equal(code, 0, `the helper exited by itself, no crash\n${out}\n${err}`);
  const r = JSON.parse(out.trim().split('\n').pop()!) as { held: number; during: { restarts: number; forkErrors: number }; after: { restarts: number; forkErrors: number }; pid: number };
  assert.ok(r.held > 0, 'it took the free fds');
  assert.ok(r.during.forkErrors >= 1, `the refused fork counted: ${JSON.stringify(r)}`);
  assert.ok(r.pid > 0, `the worker came up once fds were free: ${JSON.stringify(r)}`);
  assert.ok(r.after.restarts >= 1, `by a retry: ${JSON.stringify(r)}`);
});
