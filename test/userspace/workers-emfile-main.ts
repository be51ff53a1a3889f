// Helper of test/userspace/workers-emfile.test.ts, run under `prlimit --nofile=N`: takes every
// free fd, starts a WorkerPool of one worker (whose fork fails: EMFILE), waits, gives the fds
// back, waits for the worker to come up, and prints one JSON line:
//   {"held": fds taken, "during": pool health while out of fds, "after": health once up, "pid": worker pid}
// It must exit 0 by itself: a crash is what the test looks for.
import { openSync, closeSync } from 'node:fs';
import { resolveConfig } from '../../src/config/config.ts';
import { WorkerPool } from '../../src/modes/userspace/dataplane/workers.ts';
import { silentLogger } from '../../src/log.ts';
import { sleep, waitFor } from '../support/wait.ts';

const held: number[] = [];
for (let i = 0; i < 100_000; i++) {
  try {
    held.push(openSync('/dev/null', 'r'));
  } catch {
    break;
  }
}
const pool = new WorkerPool({ count: 1, settings: resolveConfig({ mode: 'userspace' }).userspace, log: silentLogger(), pick: () => null, restartDelayMs: 100 });
void pool.ensureStarted();
await sleep(700);
const during = pool.health();
const taken = held.length;
for (const fd of held.splice(0)) closeSync(fd);
// a worker that never comes up is reported as pid 0, for the test to assert on
await waitFor('the worker to start', () => pool.stats()[0]?.pid > 0, 30_000).catch(() => undefined);
const pid = pool.stats()[0]?.pid ?? 0;
process.stdout.write(`${JSON.stringify({ held: taken, during, after: pool.health(), pid })}\n`);
await pool.stop();
process.exit(0);
