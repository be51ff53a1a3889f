// The scale bench's `ipvs` phase, host side: boots the IPVS VM (../shared/ipvs-vm) once, with
// the repository shared at /project, and runs bench/ipvs-in-vm.sh inside (cold start, one-Service
// change and connect latency, IPVS beside iptables in the same VM). The VM runs under software
// emulation (TCG, one vCPU, no KVM here): every absolute time is many times a real machine's,
// and the host's load slows it further; compare within the VM only (ratios).
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { build } from 'esbuild';
import type { IpvsVmResult } from './ipvs-in-vm.ts';
import { ensureBundle } from './bundle.ts';

/** The VM runners this module started and that still run: killed on Ctrl-C (killVms) and at the time limit. */
const runners = new Set<ChildProcess>();

/** pid → [ppid, pgrp] of every process, from /proc */
function processTable(): Map<number, [number, number]> {
  const out = new Map<number, [number, number]>();
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue;
    try {
      // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
      const st = readFileSync(`/proc/${d}/stat`, 'utf8');
      const f = st.slice(st.lastIndexOf(')') + 2).split(' ');
      out.set(Number(d), [Number(f[1]), Number(f[2])]);
    } catch {
      /* gone meanwhile */
    }
  }
  return out;
}

/**
 * Kills a VM runner and everything under it. Killing the runner's group is not enough: it runs
 * qemu under `timeout`, which puts itself and qemu in a process group of their own.
 */
export async function killVm(p: ChildProcess): Promise<void> {
  if (p.pid === undefined || p.exitCode !== null || p.signalCode !== null) return;
  const groups = new Set<number>([p.pid]);
  const table = processTable();
  const pids = new Set<number>([p.pid]);
  for (let grew = true; grew; ) {
    grew = false;
    for (const [pid, [ppid, pgrp]] of table) {
      if (pids.has(ppid) && !pids.has(pid)) {
        pids.add(pid);
        groups.add(pgrp);
        grew = true;
      }
    }
  }
  const done = new Promise<void>((r) => p.once('exit', () => r()));
  const kill = (sig: NodeJS.Signals) => {
    for (const g of groups) {
      try {
        process.kill(-g, sig);
      } catch {
        /* gone */
      }
    }
  };
  kill('SIGTERM');
  const t = setTimeout(() => kill('SIGKILL'), 5000);
  await done;
  clearTimeout(t);
}

/** Kills every VM runner still running (the scale bench's SIGINT/SIGTERM handler). */
export async function killVms(): Promise<void> {
  await Promise.all([...runners].map((p) => killVm(p)));
}

export type { IpvsColdSample, IpvsConnectSample, IpvsTraceSample, IpvsVmResult } from './ipvs-in-vm.ts';

export interface IpvsPhaseOptions {
  coldSizes: number[];
  connectSizes: number[];
  endpoints: number;
  changes: number;
  connectCount: number;
  /** guest RAM, MiB */
  memMiB: number;
  /** the whole VM run is killed after this many seconds */
  timeoutS: number;
  /** the one-Service change by a full sync (which reads the kernel back; a comparison) only up to this many Services; all when absent */
  fullChangeMax?: number;
  /** the modes the connect sizes measure; both when absent */
  connectModes?: Array<'ipvs' | 'iptables'>;
  log: (line: string) => void;
}

export interface IpvsPhaseResult extends Partial<IpvsVmResult> {
  /** host wall time of the VM run, boot included, s */
  vmSeconds: number;
  exitCode: number;
  error?: string;
  options: Omit<IpvsPhaseOptions, 'log'>;
}

const repoRoot = resolve(import.meta.dirname, '..');
const vmRunner = resolve(repoRoot, '../shared/ipvs-vm/run-in-ipvs-vm.sh');

/** The VM's command line. node_modules may be a symlink (a git worktree): its target is shared at the same path. */
export function vmArgs(o: Omit<IpvsPhaseOptions, 'log'>, outGuestPath: string, root = repoRoot, bundleGuestPath?: string): string[] {
  const shares = ['--share', `${root}:/project`, '--share', '/usr/bin:/hostbin:ro'];
  const nm = join(root, 'node_modules');
  if (existsSync(nm) && lstatSync(nm).isSymbolicLink()) {
    const target = realpathSync(nm);
    shares.push('--share', `${target}:${target}:ro`);
  }
  return [
    '--timeout', String(o.timeoutS), '--mem', String(o.memMiB), ...shares, '--env', 'NODE=/hostbin/node',
    ...(bundleGuestPath ? ['--env', `BUNDLE=${bundleGuestPath}`] : []), '--cwd', '/project',
    'bench/ipvs-in-vm.sh', '--cold-sizes', o.coldSizes.join(','), '--connect-sizes', o.connectSizes.join(','),
    '--endpoints', String(o.endpoints), '--changes', String(o.changes), '--connect-count', String(o.connectCount),
    '--exec-timeout', String(o.timeoutS), ...(o.fullChangeMax !== undefined ? ['--full-change-max', String(o.fullChangeMax)] : []),
    ...(o.connectModes ? ['--connect-modes', o.connectModes.join(',')] : []), '--out', outGuestPath,
  ];
}

/** The result rebuilt from the VM's console: "IPVSBENCH {cold|connect: sample}" lines and the start line's kernel. */
export function fromLines(lines: string[]): Partial<IpvsVmResult> {
  const out: Partial<IpvsVmResult> = { cold: [], connect: [], trace: [] };
  for (const l of lines) {
    const k = /kernel (\S+),/.exec(l);
    if (l.startsWith('ipvs-bench: start') && k) out.kernel = k[1];
    if (!l.startsWith('IPVSBENCH ')) continue;
    try {
      const x = JSON.parse(l.slice('IPVSBENCH '.length)) as Partial<Record<'cold' | 'connect' | 'trace', never>>;
      if (x.cold) out.cold!.push(x.cold);
      if (x.connect) out.connect!.push(x.connect);
      if (x.trace) out.trace!.push(x.trace);
    } catch {
      /* a line cut by the console: left out */
    }
  }
  return out;
}

export async function ipvsPhase(o: IpvsPhaseOptions): Promise<IpvsPhaseResult> {
  const { log, ...options } = o;
  const res: IpvsPhaseResult = { vmSeconds: NaN, exitCode: -1, options };
  if (!existsSync(vmRunner)) return { ...res, error: `KPROXY_BENCH_IPVS_VM: ${vmRunner} not found (the IPVS VM runner lives in ../shared/ipvs-vm)` };
  const outDir = join(repoRoot, 'bench/out');
  mkdirSync(outDir, { recursive: true });
  const name = `ipvs-vm-${process.pid}-${Date.now()}.json`;
  const hostOut = join(outDir, name);
  const t0 = performance.now();
  // One bundled file for the guest: tsx compiling ~100 modules read over 9p takes minutes
  // under emulation on a loaded host; plain node on one file takes seconds.
  const bundle = join(outDir, `ipvs-in-vm-${process.pid}.bundle.mjs`);
  try {
    await build({
      entryPoints: [join(repoRoot, 'bench/ipvs-in-vm.ts')], bundle: true, platform: 'node', format: 'esm', target: 'node20', outfile: bundle, logLevel: 'silent',
      banner: { js: "import { createRequire as __cr } from 'node:module'; const require = __cr(import.meta.url);" },
    });
  } catch (e) {
    return { ...res, error: `KPROXY_BENCH_IPVS_VM: bundling bench/ipvs-in-vm.ts failed: ${(e as Error).message.slice(0, 300)}` };
  }
  // `kproxy trace --live` inside runs `node bin/kproxy.js`, which uses dist/ when it is at least
  // as new as src/ (else tsx: minutes under emulation): built here when it is not
  try {
    ensureBundle('ipvs-vm');
  } catch (e) {
    return { ...res, error: `KPROXY_BENCH_IPVS_VM: building dist/ (scripts/build.mjs) failed: ${(e as Error).message.slice(0, 300)}` };
  }
  // the VM runner needs no extra host tools for this script: an empty list reuses its own cached image
  const p = spawn(vmRunner, vmArgs(options, `/project/bench/out/${name}`, repoRoot, `/project/bench/out/${bundle.split('/').pop()}`), {
    stdio: ['ignore', 'pipe', 'pipe'], detached: true, env: { ...process.env, IPVS_VM_EXTRA_BINS: '' },
  });
  runners.add(p);
  p.once('exit', () => runners.delete(p));
  let tail = '';
  let errTail = '';
  const lines: string[] = [];
  p.stdout!.on('data', (d: Buffer) => {
    const ls = (tail + d.toString()).split('\n');
    tail = ls.pop() ?? '';
    for (const l of ls) {
      if (l.startsWith('ipvs-bench:')) log(`  vm ${l.slice(12)}`);
      if (l.startsWith('IPVSBENCH ') || l.startsWith('ipvs-bench: start')) lines.push(l);
    }
  });
  p.stderr!.on('data', (d: Buffer) => void (errTail = (errTail + d.toString()).slice(-2000)));
  const exited = new Promise<number>((r) => p.once('exit', (code) => r(code ?? -1)));
  const limit = (o.timeoutS + 120) * 1000;
  const code = await Promise.race([exited, new Promise<null>((r) => setTimeout(() => r(null), limit).unref())]);
  if (code === null) await killVm(p);
  res.vmSeconds = (performance.now() - t0) / 1000;
  rmSync(bundle, { force: true });
  res.exitCode = code ?? -1;
  try {
    Object.assign(res, JSON.parse(readFileSync(hostOut, 'utf8')) as IpvsVmResult);
  } catch {
    // no result file (a VM killed at its limit may not have flushed it): the samples it printed
    Object.assign(res, fromLines(lines));
  }
  if (code === null) res.error = `KPROXY_BENCH_IPVS_VM: the VM run did not end within ${limit / 1000} s`;
  else if (code === 124) res.error = `KPROXY_BENCH_IPVS_VM: the VM run hit its --timeout of ${o.timeoutS} s (raise --ipvs-timeout or lower --ipvs-sizes)`;
  else if (code !== 0 && !res.error) res.error = `KPROXY_BENCH_IPVS_VM: the VM run exited ${code}: ${errTail.trim().split('\n').slice(-3).join(' | ').slice(0, 300)}`;
  // kept: `bench/scale.ts --ipvs-from FILE` reports a VM run again without booting the VM
  writeFileSync(hostOut, JSON.stringify(res, null, 2) + '\n');
  log(`  ipvs VM run: ${res.vmSeconds.toFixed(0)} s, exit ${res.exitCode}${res.error ? `: ${res.error}` : ''}; result in ${hostOut}`);
  return res;
}
