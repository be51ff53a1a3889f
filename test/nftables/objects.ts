// Shared by the nftables kernel tests: a runner into a test's namespace, and a server started
// there that says when it listens.
import { spawn, type ChildProcess } from 'node:child_process';
import { hostRunner, type CommandRunner } from '../../src/kernel/runner.ts';

/** Runs every command inside the network namespace `ns`. */
export function nsRunner(ns: string): CommandRunner {
  return { run: (cmd, args, opts) => hostRunner.run('ip', ['netns', 'exec', ns, cmd, ...args], opts) };
}

/** Starts `ip netns exec NS node SCRIPT ARGS...` (kept in `children` for the test's cleanup) and waits for it to print "ready" (10 s). */
export async function startReadyServer(children: ChildProcess[], ns: string, script: string, args: string[], what: string): Promise<void> {
  const child = spawn('ip', ['netns', 'exec', ns, 'node', script, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(child);
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${what} did not start`)), 10_000);
    child.stdout!.on('data', (d: Buffer) => {
      if (d.toString().includes('ready')) {
        clearTimeout(timer);
        resolve();
      }
    });
    child.on('exit', (code) => reject(new Error(`${what} exited ${code}`)));
  });
}
