// test/support/apiserver-main.ts as a child process inside a network namespace, driven one
// JSON line per command (see that file for the protocol). Killed by kill(); it also exits by
// itself when the test's stdin goes away.
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { repoRoot, type Netns } from './netns.ts';
import type { KObject } from './apiserver.ts';

/** What the child's `status` command reports (see apiserver-main.ts). */
export interface ApiStatus {
  running: boolean;
  resourceVersion: number;
  watches: number;
  lists: Record<string, number>;
  watchRequests: Record<string, number>;
  firstRequestAfterStartMs: Record<string, number | null>;
}

/** One command of a batch: create or replace an object. */
export function applyOp(resource: string, object: KObject): Record<string, unknown> {
  return { op: 'apply', resource, object };
}

/** One command of a batch: delete an object. */
export function removeOp(resource: string, namespace: string, name: string): Record<string, unknown> {
  return { op: 'remove', resource, namespace, name };
}

interface Reply {
  id?: number;
  ok: boolean;
  result?: unknown;
  error?: string;
  event?: string;
}

export class ApiServerChild {
  private nextId = 1;
  private readonly pending = new Map<number, { resolve: (r: Reply) => void; timer: NodeJS.Timeout }>();
  private readyResolve?: () => void;
  readonly ready: Promise<void>;
  output = '';

  private constructor(readonly proc: ChildProcess) {
    this.ready = new Promise((r) => (this.readyResolve = r));
    createInterface({ input: proc.stdout! }).on('line', (line) => this.onLine(line));
    proc.stderr!.on('data', (d: Buffer) => (this.output = (this.output + d.toString()).slice(-4000)));
  }

  /** Starts it in `ns` on 127.0.0.1:port with TLS and a bearer token; it writes its own kubeconfig. */
  static start(ns: Netns, opts: { port: number; token: string; kubeconfig: string }): ApiServerChild {
    const proc = spawn(
      'ip',
      ['netns', 'exec', ns.name, process.execPath, '--import', 'tsx', join(repoRoot, 'test/support/apiserver-main.ts'),
        '--port', String(opts.port), '--tls', '--token', opts.token, '--kubeconfig', opts.kubeconfig],
      { stdio: ['pipe', 'pipe', 'pipe'], detached: true },
    );
    return new ApiServerChild(proc);
  }

  private onLine(line: string): void {
    let r: Reply;
    try {
      r = JSON.parse(line) as Reply;
    } catch {
      this.output += line + '\n';
      return;
    }
    if (r.event === 'ready') return this.readyResolve?.();
    const p = r.id !== undefined ? this.pending.get(r.id) : undefined;
    if (!p) return;
    clearTimeout(p.timer);
    this.pending.delete(r.id!);
    p.resolve(r);
  }

  async call(cmd: Record<string, unknown>): Promise<unknown> {
    const id = this.nextId++;
    const reply = await new Promise<Reply>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new Error(`API server child: no answer to ${JSON.stringify(cmd)} in 10 s\n${this.output}`));
      }, 10_000);
      this.pending.set(id, { resolve, timer });
      this.proc.stdin!.write(JSON.stringify({ ...cmd, id }) + '\n');
    });
    if (!reply.ok) throw new Error(`API server child: ${JSON.stringify(cmd)}: ${reply.error}`);
    return reply.result;
  }

  /** Creates or replaces objects, back to back. */
  apply(...items: Array<[resource: string, object: KObject]>): Promise<unknown> {
    return this.batch(...items.map(([resource, object]) => applyOp(resource, object)));
  }

  /** Runs commands (applyOp, removeOp, {op: 'dropWatches'}, ...) back to back; one result each. */
  batch(...ops: Array<Record<string, unknown>>): Promise<unknown[]> {
    return this.call({ op: 'batch', ops }) as Promise<unknown[]>;
  }

  status(): Promise<ApiStatus> {
    return this.call({ op: 'status' }) as Promise<ApiStatus>;
  }

  kill(): void {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    try {
      process.kill(-this.proc.pid!, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
}
