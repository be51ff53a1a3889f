// Profiles the userspace TCP data path next to the naive Node pipe, like for like: every
// proxy is a plain process listening on its own loopback address of one fresh network
// namespace (no DNAT, no extra hop for any), forwarding to the same nginx / iperf3 backends:
//   naive       bench/userspace-naive-pipe.ts
//   fwd         kproxy's TcpForwarder alone (bench/userspace-forwarder-main.ts, 24 h idle timeout as kproxy's default)
//   raw         kproxy's RawTcpForwarder alone (the same with --tcp=raw: src/modes/userspace/dataplane/tcp-raw.ts)
//   kproxy      `node bin/kproxy.js run --mode userspace` (bench/userspace.ts's kproxy peer)
//   kproxy-mt   the same with glibc's heap trimming off (MALLOC_TRIM_THRESHOLD_, MALLOC_MMAP_THRESHOLD_)
//   --malloc 'LABEL:VAR=VAL+VAR=VAL;LABEL2:...'  one more `kproxy run` per LABEL with that
//               environment (e.g. 't16:MALLOC_TRIM_THRESHOLD_=16777216'; an empty list = none),
//               to find the smallest glibc malloc setting that removes the page faults
// One set of processes per load, so each profile holds one load:
//   iperf3   1 stream, -t D (client → backend bytes)
//   close    wrk -t1 -c16 -H 'Connection: close' (a new connection per request)
//   ka       wrk -t1 -c32 (keep-alive requests)
// The proxies are measured in turn (--repeat times); figures are medians, with each proxy's
// CPU (user + system, /proc/PID/stat) and minor page faults per MB or per request, which
// the machine's noise moves less than the rates. Each runs under `node --cpu-prof` unless
// --no-prof; the top frames by self time are printed, --svg-dir DIR writes kproxy's flame
// graph per load (userspace-flame-LOAD.svg, bench/flamegraph.ts, idle samples left out) and
// --keep DIR keeps the .cpuprofiles.
//   sudo node --import tsx bench/userspace-profile.ts [--duration 5] [--repeat 2] [--loads iperf3,close,ka]
//        [--only naive,fwd,kproxy,kproxy-mt] [--malloc SPEC] [--no-prof] [--svg-dir docs] [--keep DIR]
// Beside the rates: each proxy's RSS when started (idle, before any load) and after the last
// repetition of each load (the burst's freed memory that the process kept), in MiB.
import type { ChildProcess } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { Netns, repoRoot, uniqueName } from '../test/support/netns.ts';
import { callTree, flameSvg, frameName, type CpuProfile } from './flamegraph.ts';
import { BACKEND, HTTP_PORT, MALLOC_ENV, inNs, kproxyPeer, median, nginxBackendConf, parseIperfMBs, parseWrk, waitListening } from './userspace.ts';

const IPERF_PORT = 5201;

/** Self time per frame (function, file:line), in percent of all samples, largest first. */
export function topFrames(p: CpuProfile, n = 25): { frame: string; selfPct: number }[] {
  const byId = new Map(p.nodes.map((x) => [x.id, x]));
  const self = new Map<string, number>();
  for (const id of p.samples) {
    const key = frameName(byId.get(id)!.callFrame);
    self.set(key, (self.get(key) ?? 0) + 1);
  }
  const total = p.samples.length || 1;
  return [...self.entries()].map(([frame, c]) => ({ frame, selfPct: (100 * c) / total })).sort((a, b) => b.selfPct - a.selfPct).slice(0, n);
}

type Load = 'iperf3' | 'close' | 'ka';

interface Proc {
  key: string;
  name: string;
  host: string;
  start(ns: Netns, dir: string, nodeArgs: string[]): Promise<ChildProcess>;
}

/** A node program of bench/ listening on host:80 and host:5201 (to the backends). */
function benchNode(key: string, name: string, host: string, file: string, extra: string[] = []): Proc {
  return {
    key, name, host,
    async start(ns, _dir, nodeArgs) {
      const p = ns.spawn(process.execPath, [...nodeArgs, '--import', 'tsx', resolve(repoRoot, file), `${host}:80=${BACKEND}:${HTTP_PORT}`, `${host}:${IPERF_PORT}=${BACKEND}:${IPERF_PORT}`, ...extra]);
      await waitListening(ns, host, 80);
      await waitListening(ns, host, IPERF_PORT);
      return p;
    },
  };
}

const PROCS: Proc[] = [
  benchNode('naive', 'naive pipe', '127.0.0.3', 'bench/userspace-naive-pipe.ts'),
  benchNode('fwd', 'TcpForwarder alone', '127.0.0.8', 'bench/userspace-forwarder-main.ts', ['--tcp=net']),
  benchNode('raw', 'RawTcpForwarder alone', '127.0.0.9', 'bench/userspace-forwarder-main.ts', ['--tcp=raw']),
  {
    key: 'kproxy', name: 'kproxy run', host: '127.0.0.6',
    async start(ns, dir, nodeArgs) {
      const peer = kproxyPeer('kproxy', 'kproxy', '127.0.0.6', 0, { metrics: 10249, healthz: 10256 }, nodeArgs);
      await peer.start(ns, dir);
      return peer.procs[0];
    },
  },
  {
    key: 'kproxy-mt', name: 'kproxy run, MALLOC_TRIM_THRESHOLD_', host: '127.0.0.7',
    async start(ns, dir, nodeArgs) {
      const peer = kproxyPeer('kproxy-mt', 'kproxy-mt', '127.0.0.7', 0, { metrics: 10259, healthz: 10266 }, nodeArgs, MALLOC_ENV);
      await peer.start(ns, dir);
      return peer.procs[0];
    },
  },
];

/** Extra `kproxy run` variants from --malloc: 'LABEL:VAR=VAL+VAR=VAL;...', each on its own VIP and ports. */
export function mallocVariants(spec: string): { key: string; env: Record<string, string> }[] {
  return spec.split(';').map((s) => s.trim()).filter(Boolean).map((s) => {
    const [key, vars = ''] = s.split(':');
    const env: Record<string, string> = {};
    for (const kv of vars.split('+').filter(Boolean)) {
      const [k, v] = kv.split('=');
      env[k] = v;
    }
    return { key: key.trim(), env };
  });
}

function variantProcs(spec: string): Proc[] {
  return mallocVariants(spec).map(({ key, env }, i) => {
    const host = `127.0.1.${10 + i}`;
    const desc = Object.entries(env).map(([k, v]) => `${k}=${Number(v) >= 1 << 20 ? `${Number(v) / (1 << 20)}M` : v}`).join(' ') || 'no env';
    return {
      key, name: `kproxy run, ${desc}`, host,
      async start(ns, dir, nodeArgs) {
        const peer = kproxyPeer(key, key, host, 0, { metrics: 10300 + 2 * i, healthz: 10301 + 2 * i }, nodeArgs, env);
        await peer.start(ns, dir);
        return peer.procs[0];
      },
    };
  });
}

/** VmRSS of a process in MiB (NaN once gone). */
function rssMiB(pid: number): number {
  try {
    const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return m ? Number(m[1]) / 1024 : NaN;
  } catch {
    return NaN;
  }
}

async function runLoad(ns: Netns, load: Load, host: string, port: number, d: number): Promise<number> {
  const t = (d + 30) * 1000;
  if (load === 'iperf3') {
    const once = async () => parseIperfMBs(await inNs(ns, 'iperf3', ['-c', host, '-p', String(IPERF_PORT), '-t', String(d), '-J'], t));
    // iperf3 -s serves one test at a time and can still be busy with the last one for a moment.
    for (let i = 0; ; i++) {
      try {
        return await once();
      } catch (e) {
        if (i >= 2) throw e;
        await new Promise((r) => setTimeout(r, 1000));
      }
    }
  }
  const url = `http://${host}:${port}/`;
  const args = load === 'close' ? ['-t1', '-c16', `-d${d}s`, '-H', 'Connection: close', url] : ['-t1', '-c32', `-d${d}s`, url];
  return parseWrk(await inNs(ns, 'wrk', args, t)).rps;
}

/** user + system CPU seconds (utime + stime, clock ticks of 1/100 s) and minor page faults of a process. */
function usage(pid: number): { cpuS: number; minflt: number } {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return { cpuS: (Number(f[11]) + Number(f[12])) / 100, minflt: Number(f[7]) };
  } catch {
    return { cpuS: NaN, minflt: NaN };
  }
}

async function stopAndRead(p: ChildProcess, dir: string): Promise<CpuProfile> {
  const exited = new Promise((r) => p.once('exit', r));
  // SIGTERM to the node process (not `ip netns exec`): it exits normally and writes its profile.
  try {
    process.kill(-p.pid!, 'SIGTERM');
  } catch {
    /* gone */
  }
  await Promise.race([exited, new Promise((r) => setTimeout(r, 15_000))]);
  const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
  if (!file) throw new Error(`no .cpuprofile in ${dir}`);
  return JSON.parse(readFileSync(join(dir, file), 'utf8')) as CpuProfile;
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      duration: { type: 'string', default: '5' },
      repeat: { type: 'string', default: '2' },
      loads: { type: 'string', default: 'iperf3,close,ka' },
      'svg-dir': { type: 'string' },
      keep: { type: 'string' },
      'no-prof': { type: 'boolean', default: false },
      only: { type: 'string' },
      malloc: { type: 'string', default: '' },
    },
  });
  const d = Number(values.duration);
  const repeat = Number(values.repeat);
  const loads = values.loads!.split(',') as Load[];
  const all = [...PROCS, ...variantProcs(values.malloc!)];
  const procs = values.only ? all.filter((p) => values.only!.split(',').includes(p.key)) : all;
  const dir = mkdtempSync(join(tmpdir(), 'kproxy-prof-'));
  const ns = Netns.create(uniqueName('kpb-usprof'));
  const out: string[] = [];
  const frames: string[] = [];
  const onSignal = () => void ns.destroy().then(() => process.exit(130));
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  try {
    writeFileSync(join(dir, 'nginx-backend.conf'), nginxBackendConf(dir));
    ns.spawn('nginx', ['-c', join(dir, 'nginx-backend.conf'), '-p', dir]);
    ns.spawn('iperf3', ['-s', '-B', BACKEND, '-p', String(IPERF_PORT)]);
    await waitListening(ns, BACKEND, HTTP_PORT);
    await waitListening(ns, BACKEND, IPERF_PORT);
    out.push(`| load | ${procs.map((p) => p.name).join(' | ')} | load average |`, `|---|${procs.map(() => '---:').join('|')}|---|`);
    for (const load of loads) {
      const started = [];
      for (const p of procs) {
        const pdir = join(dir, `${p.key}-${load}`);
        mkdirSync(pdir);
        started.push({ ...p, pdir, proc: await p.start(ns, dir, !values['no-prof'] ? ['--cpu-prof', '--cpu-prof-dir', pdir] : []) });
      }
      // Settled, before any load: the RSS a user sees on an idle node.
      await new Promise((r) => setTimeout(r, 2000));
      const rssIdle = new Map(started.map((p) => [p.key, rssMiB(p.proc.pid!)]));
      // Warm-up, not measured.
      for (const p of started) await runLoad(ns, load, p.host, 80, 1).catch(() => 0);
      const fig = new Map<string, number[]>(procs.map((p) => [p.key, []]));
      const cpu = new Map<string, number[]>(procs.map((p) => [p.key, []]));
      const faults = new Map<string, number[]>(procs.map((p) => [p.key, []]));
      const loadAvg: string[] = [];
      for (let i = 0; i < repeat; i++) {
        loadAvg.push(readFileSync('/proc/loadavg', 'utf8').split(' ')[0]);
        for (const p of started) {
          const before = usage(p.proc.pid!);
          const v = await runLoad(ns, load, p.host, 80, d);
          const after = usage(p.proc.pid!);
          fig.get(p.key)!.push(v);
          // CPU (user + system: the syscalls are the proxy's work too) and page faults per unit of work.
          cpu.get(p.key)!.push(((after.cpuS - before.cpuS) * 1e6) / (v * d));
          faults.get(p.key)!.push((after.minflt - before.minflt) / (v * d));
        }
        process.stderr.write(`${load} ${i + 1}: ${started.map((p) => `${p.key} ${fig.get(p.key)!.at(-1)!.toFixed(0)} (${faults.get(p.key)!.at(-1)!.toFixed(1)} flt)`).join(', ')}\n`);
      }
      await new Promise((r) => setTimeout(r, 2000));
      const rssAfter = new Map(started.map((p) => [p.key, rssMiB(p.proc.pid!)]));
      const unit = load === 'iperf3' ? 'MB/s' : 'req/s';
      out.push(`| ${load} (${unit}) | ${procs.map((p) => median(fig.get(p.key)!).toFixed(0)).join(' | ')} | ${loadAvg.join(', ')} |`);
      const per = load === 'iperf3' ? 'MB' : 'request';
      out.push(`| ${load}: proxy CPU µs per ${per} | ${procs.map((p) => median(cpu.get(p.key)!).toFixed(1)).join(' | ')} | |`);
      out.push(`| ${load}: proxy minor page faults per ${per} | ${procs.map((p) => median(faults.get(p.key)!).toFixed(2)).join(' | ')} | |`);
      out.push(`| ${load}: RSS MiB idle (started, no load) | ${procs.map((p) => rssIdle.get(p.key)!.toFixed(1)).join(' | ')} | |`);
      out.push(`| ${load}: RSS MiB after the loads (+2 s) | ${procs.map((p) => rssAfter.get(p.key)!.toFixed(1)).join(' | ')} | |`);
      for (const p of started) {
        if (values['no-prof']) {
          await ns.kill(p.proc, 'SIGTERM');
          continue;
        }
        const prof = await stopAndRead(p.proc, p.pdir);
        frames.push('', `${p.name}, ${load}: top frames by self time`, '', '| self % | frame |', '|---:|---|');
        for (const t of topFrames(prof, 12)) frames.push(`| ${t.selfPct.toFixed(1)} | \`${t.frame}\` |`);
        if (values['svg-dir'] && p.key === 'kproxy') {
          const m = median(fig.get(p.key)!);
          writeFileSync(join(values['svg-dir'], `userspace-flame-${load}.svg`), flameSvg(callTree(prof, true), {
            busyNote: true,
            title: `kproxy run --mode userspace under ${load === 'iperf3' ? 'iperf3, 1 stream' : load === 'close' ? 'wrk -c16, Connection: close' : 'wrk -c32, keep-alive'}`,
            subtitle: `${new Date().toISOString().slice(0, 16)}Z, bench/userspace-profile.ts, ${repeat} × ${d}s, median ${m.toFixed(0)} ${unit} (naive pipe ${median(fig.get('naive') ?? []).toFixed(0)}), load avg ${loadAvg.join('/')};`,
          }));
        }
        if (values.keep) {
          const f = readdirSync(p.pdir).find((x) => x.endsWith('.cpuprofile'))!;
          cpSync(join(p.pdir, f), join(values.keep, `userspace-${p.key}-${load}.cpuprofile`));
        }
      }
    }
  } finally {
    await ns.destroy();
    rmSync(dir, { recursive: true, force: true });
  }
  // Printed after the clean-up: a reader that stops early (| head) cannot leave a namespace behind.
  process.stdout.on('error', () => {});
  console.log([...out, ...frames].join('\n'));
}

if (process.argv[1]?.endsWith('bench/userspace-profile.ts')) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
