// Kernel modules: is a module there (loaded, or built into the kernel), and load it with
// modprobe if not. The checks read /proc/modules, /sys/module/<m> and
// /lib/modules/<release>/modules.builtin, as upstream's kernel handler does.
import { readFile, stat } from 'node:fs/promises';
import { release } from 'node:os';
import { ExecError, type CommandRunner } from './runner.ts';

export interface ModuleFS {
  readFile(path: string): Promise<string | null>;
  exists(path: string): Promise<boolean>;
  release(): string;
}

export const hostModuleFS: ModuleFS = {
  async readFile(path) {
    try {
      return await readFile(path, 'utf8');
    } catch {
      return null;
    }
  },
  async exists(path) {
    try {
      await stat(path);
      return true;
    } catch {
      return false;
    }
  },
  release: () => release(),
};

/** kernel names use "_" where file names may use "-" */
function norm(m: string): string {
  return m.replace(/-/g, '_');
}

export async function moduleLoaded(name: string, fs: ModuleFS): Promise<boolean> {
  const m = norm(name);
  const procModules = (await fs.readFile('/proc/modules')) ?? '';
  if (procModules.split('\n').some((l) => norm(l.split(' ')[0] ?? '') === m)) return true;
  if (await fs.exists(`/sys/module/${m}`)) return true;
  const builtin = (await fs.readFile(`/lib/modules/${fs.release()}/modules.builtin`)) ?? '';
  return builtin.split('\n').some((l) => norm((l.split('/').pop() ?? '').replace(/\.ko(\..*)?$/, '')) === m);
}

export class ModuleMissingError extends ExecError {
  constructor(readonly module: string, stderr: string, hint: string) {
    super(
      'KPROXY_IPVS_MODULE_MISSING',
      `kernel module ${module} is not loaded and could not be loaded (modprobe ${module}: ${stderr || 'no output'}); load it with 'modprobe ${module}'${hint}`,
    );
  }
}

/**
 * Ensures every module is present, loading missing ones with modprobe. Throws
 * KPROXY_IPVS_MODULE_MISSING naming the first module that cannot be loaded: no fallback.
 * Returns the modules it loaded.
 */
export async function ensureModules(
  modules: string[],
  deps: { runner: CommandRunner; fs?: ModuleFS; hint?: (m: string) => string },
): Promise<string[]> {
  const fs = deps.fs ?? hostModuleFS;
  const loaded: string[] = [];
  for (const m of modules) {
    if (await moduleLoaded(m, fs)) continue;
    let stderr = '';
    try {
      const r = await deps.runner.run('modprobe', ['--', m], { timeoutMs: 30_000 });
      stderr = r.stderr.trim();
      if (r.code === 0 && (await moduleLoaded(m, fs))) {
        loaded.push(m);
        continue;
      }
      if (r.code === 0) stderr = stderr || 'modprobe succeeded but the module is not listed in /proc/modules';
    } catch (e) {
      stderr = (e as Error).message;
    }
    throw new ModuleMissingError(m, stderr, deps.hint?.(m) ?? '');
  }
  return loaded;
}
