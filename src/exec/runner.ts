// The only way kproxy starts a process: an argument array (never a shell string), the
// payload on stdin, a time limit. Executors take a CommandRunner so tests can substitute a
// stateful fake that models the kernel.
import { spawn } from 'node:child_process';

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface RunOptions {
  input?: string;
  timeoutMs?: number;
}

export interface CommandRunner {
  run(cmd: string, args: string[], opts?: RunOptions): Promise<RunResult>;
}

export class ExecError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly result?: RunResult,
  ) {
    super(`${code}: ${message}`);
  }
}

export const hostRunner: CommandRunner = {
  run(cmd, args, opts = {}) {
    return new Promise((resolve, reject) => {
      const child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'] });
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      let timer: NodeJS.Timeout | undefined;
      if (opts.timeoutMs) timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs);
      child.stdout.on('data', (d: Buffer) => out.push(d));
      child.stderr.on('data', (d: Buffer) => err.push(d));
      child.on('error', (e: NodeJS.ErrnoException) => {
        if (timer) clearTimeout(timer);
        if (e.code === 'ENOENT') {
          reject(new ExecError('KPROXY_EXEC_MISSING', `${cmd} not found; install the package that provides it`));
        } else reject(e);
      });
      child.on('close', (code, signal) => {
        if (timer) clearTimeout(timer);
        resolve({
          code: code ?? (signal ? 128 : 1),
          stdout: Buffer.concat(out).toString('utf8'),
          stderr: Buffer.concat(err).toString('utf8'),
        });
      });
      child.stdin.on('error', () => {});
      child.stdin.end(opts.input ?? '');
    });
  },
};

/** Runs and throws ExecError on a non-zero exit, with the command's stderr. */
export async function runChecked(runner: CommandRunner, cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> {
  const r = await runner.run(cmd, args, opts);
  if (r.code !== 0) {
    throw new ExecError('KPROXY_EXEC_FAILED', `${cmd} ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`, r);
  }
  return r;
}
