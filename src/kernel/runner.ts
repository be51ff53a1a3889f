// The only way kproxy starts a process: an argument array (never a shell string), the
// payload on stdin, a time limit. Executors take a CommandRunner so tests can substitute a
// stateful fake that models the kernel.
import { fork, spawn, type ChildProcess } from 'node:child_process';
import type { Writable } from 'node:stream';
import { KproxyError, type ErrorCode } from '../errors.ts';

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * A command's input in parts, each built when the pipe is ready for it: a full nftables
 * transaction at 10,000 Services is 33 MB of text, which need not exist whole (one table's
 * part at a time). Called once per run; a fake reads it whole (inputText).
 */
export type InputParts = () => Iterable<string>;

export interface RunOptions {
  input?: string | InputParts;
  /**
   * Time limit in ms. Absent, zero, negative or not finite means DEFAULT_TIMEOUT_MS: no
   * command runs unbounded (a hung iptables lock or a stuck modprobe would otherwise hang
   * start-up or the sync loop forever).
   */
  timeoutMs?: number;
}

export interface CommandRunner {
  run(cmd: string, args: string[], opts?: RunOptions): Promise<RunResult>;
}

export class ExecError extends KproxyError {
  constructor(
    code: ErrorCode,
    message: string,
    readonly result?: RunResult,
  ) {
    super(code, message);
  }
}

/** The limit of a command whose caller gives none. */
export const DEFAULT_TIMEOUT_MS = 60_000;

/** The limit a run will actually get: callers cannot ask for "unlimited". */
export function effectiveTimeoutMs(timeoutMs: number | undefined): number {
  return typeof timeoutMs === 'number' && Number.isFinite(timeoutMs) && timeoutMs > 0 ? timeoutMs : DEFAULT_TIMEOUT_MS;
}

function errnoOf(e: unknown): string {
  const code = (e as NodeJS.ErrnoException | undefined)?.code;
  return typeof code === 'string' ? code : 'unknown error';
}

/** A process that could not be started: ENOENT keeps its own code, everything else names the errno. */
export function spawnError(cmd: string, e: unknown): ExecError {
  const errno = errnoOf(e);
  if (errno === 'ENOENT') return new ExecError('KPROXY_EXEC_MISSING', `${cmd} not found; install the package that provides it`);
  const hint =
    errno === 'EMFILE' || errno === 'ENFILE'
      ? 'too many open files: raise the file descriptor limit (ulimit -n / LimitNOFILE) or find what leaks descriptors'
      : errno === 'EAGAIN' || errno === 'ENOMEM'
        ? 'the host is out of processes or memory; the next sync retries'
        : errno === 'EACCES' || errno === 'EPERM'
          ? `${cmd} is not executable by this user; check its permissions`
          : 'the next sync retries';
  return new ExecError('KPROXY_EXEC_SPAWN_FAILED', `could not start ${cmd} (${errno}: ${(e as Error | undefined)?.message ?? String(e)}); ${hint}`);
}

/**
 * A signal (SIGKILL unless told) to the child's whole process group (it was spawned
 * detached, so it leads its own group): grandchildren that still hold the pipes die with it.
 * Never our own group.
 */
export function killGroup(child: ChildProcess, signal: NodeJS.Signals = 'SIGKILL'): void {
  const pid = child.pid;
  if (typeof pid !== 'number' || pid <= 1 || pid === process.pid) return;
  try {
    process.kill(-pid, signal);
  } catch {
    // the group is already gone; the direct child may still need its own kill
    try {
      child.kill(signal);
    } catch {
      // gone too
    }
  }
}

export const hostRunner: CommandRunner = {
  run(cmd, args, opts = {}) {
    const limitMs = effectiveTimeoutMs(opts.timeoutMs);
    return new Promise((resolve, reject) => {
      const out: Buffer[] = [];
      const err: Buffer[] = [];
      let timer: NodeJS.Timeout | undefined;
      let settled = false;
      const finish = (f: () => void) => {
        if (settled) return;
        settled = true;
        if (timer) clearTimeout(timer);
        f();
      };
      let child: ChildProcess;
      try {
        // detached: the child leads a new process group, so a time limit can kill what it forked
        child = spawn(cmd, args, { stdio: ['pipe', 'pipe', 'pipe'], detached: true });
      } catch (e) {
        // spawn throws synchronously for some errno values (and for bad arguments)
        reject(spawnError(cmd, e));
        return;
      }
      // On EMFILE/ENFILE node emits 'error' on the next tick and leaves the pipes null: the
      // listener below is attached in time, and nothing here may touch a null pipe.
      child.on('error', (e: NodeJS.ErrnoException) => {
        finish(() => reject(spawnError(cmd, e)));
        killGroup(child);
      });
      timer = setTimeout(() => {
        killGroup(child);
        // Resolve now: a grandchild that escaped the group could keep the pipes open forever.
        child.stdout?.destroy();
        child.stderr?.destroy();
        child.stdin?.destroy();
        const partial: RunResult = { code: 128, stdout: Buffer.concat(out).toString('utf8'), stderr: Buffer.concat(err).toString('utf8') };
        finish(() =>
          reject(new ExecError('KPROXY_EXEC_TIMEOUT', `${[cmd, ...args].join(' ')} did not finish within ${limitMs} ms; its process group was killed`, partial)),
        );
      }, limitMs);
      child.stdout?.on('data', (d: Buffer) => out.push(d));
      child.stderr?.on('data', (d: Buffer) => err.push(d));
      child.stdout?.on('error', () => {});
      child.stderr?.on('error', () => {});
      child.on('close', (code, signal) => {
        finish(() =>
          resolve({
            code: code ?? (signal ? 128 : 1),
            stdout: Buffer.concat(out).toString('utf8'),
            stderr: Buffer.concat(err).toString('utf8'),
          }),
        );
      });
      // EPIPE when the child exits without reading its input: its exit code tells the story
      child.stdin?.on('error', () => {});
      if (child.stdin) {
        writeInput(child.stdin, opts.input ?? '', INPUT_CHUNK, (e) => {
          // Input that could not be built whole must not reach the tool as a shorter input
          // (nft -f would apply what it read): the group dies before its stdin closes.
          killGroup(child);
          child.stdin?.destroy();
          finish(() => reject(new ExecError('KPROXY_EXEC_FAILED', `${[cmd, ...args].join(' ')}: its input could not be built: ${(e as Error).message}; the process was killed`)));
        });
      }
    });
  },
};

/** Characters of the input handed to the pipe at a time (64 KiB: four times the pipe's highWaterMark). */
export const INPUT_CHUNK = 64 * 1024;

/** The whole input, for a fake runner that reads it at once. */
export function inputText(input: string | InputParts | undefined): string {
  if (typeof input !== 'function') return input ?? '';
  let text = '';
  for (const part of input()) text += part;
  return text;
}

/**
 * Writes `input` to a child's stdin a slice at a time, the next slice when the pipe drains,
 * then ends it. One write of the whole string would encode all of it into one buffer beside
 * the string (a full sync's restore input at 10,000 Services is tens of MB; nft's up to
 * ~100 MB: measured as arrayBuffers in process.memoryUsage()) and hold it until the tool had
 * read it all; slices keep that copy to one slice. A slice never ends between the two halves
 * of a surrogate pair, so every slice encodes to valid UTF-8 on its own. Parts (InputParts)
 * are taken one at a time, when the last one is written; if taking one throws, `failed` gets
 * the error and stdin is neither written nor ended again.
 */
export function writeInput(stdin: Writable, input: string | InputParts, chunk = INPUT_CHUNK, failed: (e: unknown) => void = () => stdin.destroy()): void {
  let parts: Iterator<string>;
  try {
    parts = (typeof input === 'function' ? input() : [input])[Symbol.iterator]();
  } catch (e) {
    failed(e);
    return;
  }
  let part = '';
  let at = 0;
  const next = (): void => {
    for (;;) {
      // the child went away (EPIPE) or the time limit destroyed the pipe: nothing more to write
      if (stdin.destroyed || stdin.writableEnded) return;
      if (at >= part.length) {
        let r: IteratorResult<string>;
        try {
          r = parts.next();
        } catch (e) {
          failed(e);
          return;
        }
        if (r.done) break;
        part = r.value;
        at = 0;
        continue;
      }
      let end = Math.min(at + chunk, part.length);
      const last = part.charCodeAt(end - 1);
      if (end < part.length && last >= 0xd800 && last <= 0xdbff) end++;
      const slice = part.slice(at, end);
      at = end;
      if (!stdin.write(slice)) {
        stdin.once('drain', next);
        return;
      }
    }
    if (!stdin.destroyed && !stdin.writableEnded) stdin.end();
  };
  next();
}

/** Runs and throws ExecError on a non-zero exit, with the command's stderr. */
export async function runChecked(runner: CommandRunner, cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> {
  const r = await runner.run(cmd, args, opts);
  if (r.code !== 0) {
    throw new ExecError('KPROXY_EXEC_FAILED', `${cmd} ${args.join(' ')} exited ${r.code}: ${r.stderr.trim()}`, r);
  }
  return r;
}

export interface ForkOptions {
  /** node options of the child (e.g. ['--import', 'tsx'] for a TypeScript entry) */
  execArgv?: string[];
  env?: NodeJS.ProcessEnv;
}

/**
 * The one way kproxy starts a long-lived Node child with an IPC channel (userspace workers):
 * an argument array, stdio inherited for logs, JSON over IPC, and its own process group
 * (detached) so killGroup() also takes whatever it started. Nothing is waited for here: the
 * caller supervises the child (exit, restart). A fork the host refuses (EMFILE, EAGAIN,
 * ENOMEM) is an ExecError, thrown or emitted as 'error' on the returned child (node does
 * either, depending on the errno): never an uncaught exception.
 */
export function forkNode(entry: URL | string, args: string[], opts: ForkOptions = {}): ChildProcess {
  const name = typeof entry === 'string' ? entry : entry.pathname;
  let child: ChildProcess;
  try {
    child = fork(entry, args, { execArgv: opts.execArgv ?? [], env: opts.env, stdio: ['ignore', 'inherit', 'inherit', 'ipc'], serialization: 'json', detached: true });
  } catch (e) {
    throw spawnError(name, e);
  }
  return child;
}
