// Kernel settings through /proc/sys (no process needed). Behind an interface so unit tests
// use an in-memory fake.
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { ExecError } from './runner.ts';

export interface Sysctl {
  /** current value, trimmed; null when the setting does not exist */
  get(name: string): Promise<string | null>;
  set(name: string, value: string): Promise<void>;
}

/** "net.ipv4.vs.conntrack" → "<root>/net/ipv4/vs/conntrack" */
export function sysctlPath(root: string, name: string): string {
  return join(root, ...name.split('.'));
}

export function procSysctl(root = '/proc/sys'): Sysctl {
  return {
    async get(name) {
      try {
        return (await readFile(sysctlPath(root, name), 'utf8')).trim();
      } catch {
        return null;
      }
    },
    async set(name, value) {
      try {
        await writeFile(sysctlPath(root, name), value);
      } catch (e) {
        throw new ExecError('KPROXY_SYSCTL_FAILED', `cannot set ${name}=${value}: ${(e as Error).message}; run as root with /proc/sys writable`);
      }
    },
  };
}

/** sets a value only when it differs (upstream's EnsureSysctl); returns whether it changed */
export async function ensureSysctl(s: Sysctl, name: string, value: string): Promise<boolean> {
  const cur = await s.get(name);
  if (cur === value) return false;
  await s.set(name, value);
  return true;
}
