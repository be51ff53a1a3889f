// The manifests source's state file: what each Service holds (cluster IPs, node ports, health
// check node port), so that a restart, or an edit of another Service, never moves an address a
// client may have cached. JSON, written atomically (a temporary file, then rename), read once
// at start; `render` and `trace` read it and never write it.
//
// Where it lives, unless --manifests-state names it: one file per manifests directory, named
// after the directory's real path (its base name and a hash of the whole path), in the first
// of these that kproxy can write: /var/lib/kproxy (root, as upstream keeps its state under
// /var/lib), then $XDG_STATE_HOME/kproxy, or ~/.local/state/kproxy. Readers look in the same
// places in the same order and take the first file that exists, so a render run by another
// user still finds what `run` wrote.
import { accessSync, constants, readFileSync, realpathSync, statSync } from 'node:fs';
import { mkdir, rename, unlink, writeFile } from 'node:fs/promises';
import { createHash } from 'node:crypto';
import { homedir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import type { Logger } from '../log.ts';
import { coded } from '../errors.ts';
import type { AllocationState, AllocatorConfig, Holding } from './service-alloc.ts';

export const STATE_KIND = 'KproxyServiceAllocations';

/** The file as written: what it is, for which directory and ranges, then the holdings. */
export interface StateFileContent extends AllocationState {
  kind: typeof STATE_KIND;
  version: 1;
  /** the manifests directory's real path */
  manifests: string;
  serviceClusterIPRange: string[];
  serviceNodePortRange: string;
}

/** The directories a state file may live in, in order of preference. */
export function stateDirs(env: NodeJS.ProcessEnv = process.env): string[] {
  const xdg = env.XDG_STATE_HOME && env.XDG_STATE_HOME.startsWith('/') ? env.XDG_STATE_HOME : join(env.HOME || homedir(), '.local', 'state');
  return ['/var/lib/kproxy', join(xdg, 'kproxy')];
}

/** The state file's name for a manifests directory: its base name and a hash of its real path. */
export function stateFileName(manifestsDir: string): string {
  let real: string;
  try {
    real = realpathSync(manifestsDir);
  } catch {
    real = resolve(manifestsDir);
  }
  const base = basename(real).replace(/[^A-Za-z0-9._-]/g, '_').slice(0, 64) || 'root';
  return `manifests-${base}-${createHash('sha256').update(real).digest('hex').slice(0, 12)}.json`;
}

/** A directory kproxy can create its file in: writable, or creatable under a writable parent. */
function writableDir(dir: string): boolean {
  for (let d = dir; ; d = dirname(d)) {
    try {
      if (!statSync(d).isDirectory()) return false;
      accessSync(d, constants.W_OK | constants.X_OK);
      return true;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT' || dirname(d) === d) return false;
    }
  }
}

/** Where `run` keeps the state of a manifests directory (the first writable place). */
export function defaultStatePath(manifestsDir: string, env: NodeJS.ProcessEnv = process.env): string {
  const dirs = stateDirs(env);
  const name = stateFileName(manifestsDir);
  return join(dirs.find(writableDir) ?? dirs[dirs.length - 1], name);
}

/** Where a reader finds the state of a manifests directory: the first existing file, else where `run` would write it. */
export function findStatePath(manifestsDir: string, env: NodeJS.ProcessEnv = process.env): string {
  const name = stateFileName(manifestsDir);
  for (const d of stateDirs(env)) {
    const p = join(d, name);
    try {
      if (statSync(p).isFile()) return p;
    } catch {
      /* not there */
    }
  }
  return defaultStatePath(manifestsDir, env);
}

/**
 * Reads a state file. A missing file is no state; an unreadable or malformed one is no state
 * plus a problem to report (kproxy then allocates as on a first start, which the same
 * directory does the same way, and writes a good file).
 */
export function readStateFile(path: string): { state?: AllocationState; problem?: string } {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    const err = e as NodeJS.ErrnoException;
    return err.code === 'ENOENT' ? {} : { problem: coded('KPROXY_MANIFEST_STATE', `cannot read ${path}: ${err.message}; allocating afresh`) };
  }
  try {
    const v = JSON.parse(text) as Partial<StateFileContent>;
    if (typeof v !== 'object' || v === null || v.kind !== STATE_KIND || typeof v.services !== 'object' || v.services === null || Array.isArray(v.services)) {
      throw new Error(`not a ${STATE_KIND} document`);
    }
    return { state: { services: v.services as Record<string, Holding> } };
  } catch (e) {
    return { problem: coded('KPROXY_MANIFEST_STATE', `${path} is not a state file kproxy can read (${(e as Error).message}); allocating afresh and overwriting it`) };
  }
}

export function stateFileContent(manifestsDir: string, config: AllocatorConfig, state: AllocationState): StateFileContent {
  let real: string;
  try {
    real = realpathSync(manifestsDir);
  } catch {
    real = resolve(manifestsDir);
  }
  return {
    kind: STATE_KIND,
    version: 1,
    manifests: real,
    serviceClusterIPRange: config.ipRanges.map((r) => r.cidr),
    serviceNodePortRange: config.nodePorts.text,
    services: state.services,
  };
}

/**
 * Writes the state file whenever it is given new content: one write at a time, the latest
 * content last, each atomic (temporary file, then rename). A failure is logged once per
 * reason (KPROXY_MANIFEST_STATE) and the next change tries again; kproxy works on without it.
 */
export class StateFileWriter {
  private last = '';
  private pending: string | null = null;
  private writing: Promise<void> | null = null;
  private failed = '';

  constructor(
    readonly path: string,
    private readonly log: Logger,
  ) {}

  /** Schedules a write of content (nothing when it is what was written last). */
  save(content: StateFileContent): void {
    const text = JSON.stringify(content, null, 2) + '\n';
    if (text === this.last && this.pending === null) return;
    this.pending = text;
    this.writing ??= this.drain();
  }

  /** Resolves once every scheduled write is done. */
  async flush(): Promise<void> {
    while (this.writing) await this.writing;
  }

  private async drain(): Promise<void> {
    try {
      while (this.pending !== null) {
        const text = this.pending;
        this.pending = null;
        if (text === this.last) continue;
        const tmp = `${this.path}.tmp-${process.pid}`;
        try {
          await mkdir(dirname(this.path), { recursive: true, mode: 0o755 });
          await writeFile(tmp, text, { mode: 0o644 });
          await rename(tmp, this.path);
          this.last = text;
          if (this.failed) this.log.info({ file: this.path }, 'manifests state file written again');
          this.failed = '';
        } catch (e) {
          await unlink(tmp).catch(() => {});
          const msg = (e as Error).message;
          if (msg !== this.failed) {
            this.failed = msg;
            this.log.warn(
              { file: this.path, err: msg },
              coded('KPROXY_MANIFEST_STATE', 'cannot write the manifests state file; allocations stay in force but may move at the next restart; give --manifests-state FILE in a writable place'),
            );
          }
        }
      }
    } finally {
      this.writing = null;
    }
  }
}
