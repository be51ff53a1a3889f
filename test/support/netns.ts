// Network namespaces for kernel tests: created by the test, removed by the test (also on
// failure). Everything runs through argument arrays.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';

export const repoRoot = resolve(import.meta.dirname, '../..');

export function sh(cmd: string, args: string[], opts: { input?: string; allowFail?: boolean } = {}): string {
  try {
    return execFileSync(cmd, args, { encoding: 'utf8', input: opts.input, stdio: ['pipe', 'pipe', 'pipe'] });
  } catch (e) {
    if (opts.allowFail) return '';
    const err = e as { stderr?: string; message: string };
    throw new Error(`${cmd} ${args.join(' ')} failed: ${err.stderr || err.message}`);
  }
}

export class Netns {
  private procs: ChildProcess[] = [];
  constructor(readonly name: string) {}

  static create(name: string): Netns {
    sh('ip', ['netns', 'del', name], { allowFail: true });
    sh('ip', ['netns', 'add', name]);
    const ns = new Netns(name);
    ns.exec('ip', ['link', 'set', 'lo', 'up']);
    return ns;
  }

  exec(cmd: string, args: string[], opts: { input?: string; allowFail?: boolean } = {}): string {
    return sh('ip', ['netns', 'exec', this.name, cmd, ...args], opts);
  }

  /** Starts a long-running process in the namespace; killed by destroy(). */
  spawn(cmd: string, args: string[], opts: { env?: NodeJS.ProcessEnv; onOutput?: (s: string) => void } = {}): ChildProcess {
    const p = spawn('ip', ['netns', 'exec', this.name, cmd, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
      env: { ...process.env, ...opts.env },
      detached: true,
    });
    const out = (d: Buffer) => opts.onOutput?.(d.toString());
    p.stdout?.on('data', out);
    p.stderr?.on('data', out);
    this.procs.push(p);
    return p;
  }

  /** Starts `node bin/kproxy.js ARGS` in the namespace. */
  kproxy(args: string[], onOutput?: (s: string) => void): ChildProcess {
    return this.spawn(process.execPath, [resolve(repoRoot, 'bin/kproxy.js'), ...args], { onOutput });
  }

  /** node with the tsx loader running a TypeScript file of the repo. */
  node(file: string, args: string[], onOutput?: (s: string) => void): ChildProcess {
    return this.spawn(process.execPath, ['--import', 'tsx', resolve(repoRoot, file), ...args], { onOutput });
  }

  async kill(p: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
    if (p.exitCode !== null || p.signalCode !== null) return;
    const done = new Promise<void>((r) => p.once('exit', () => r()));
    try {
      process.kill(-p.pid!, signal);
    } catch {
      /* gone */
    }
    const t = setTimeout(() => {
      try {
        process.kill(-p.pid!, 'SIGKILL');
      } catch {
        /* gone */
      }
    }, 3000);
    await done;
    clearTimeout(t);
  }

  async destroy(): Promise<void> {
    for (const p of this.procs) await this.kill(p, 'SIGKILL');
    this.procs = [];
    sh('ip', ['netns', 'del', this.name], { allowFail: true });
  }
}

/** Connects two namespaces with a veth pair and addresses ("10.0.0.1/24"). */
export function vethPair(a: Netns, aIf: string, aAddr: string, b: Netns, bIf: string, bAddr: string): void {
  sh('ip', ['link', 'add', aIf, 'netns', a.name, 'type', 'veth', 'peer', 'name', bIf, 'netns', b.name]);
  a.exec('ip', ['addr', 'add', aAddr, 'dev', aIf]);
  b.exec('ip', ['addr', 'add', bAddr, 'dev', bIf]);
  a.exec('ip', ['link', 'set', aIf, 'up']);
  b.exec('ip', ['link', 'set', bIf, 'up']);
}

/** Re-exported for the tests that import it beside the namespace tools. */
export { waitFor } from './wait.ts';

export function uniqueName(prefix: string): string {
  return `${prefix}-${process.pid % 100000}-${Math.floor(Math.random() * 1e4)}`;
}
