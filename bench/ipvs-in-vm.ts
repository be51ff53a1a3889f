// Runs INSIDE the IPVS VM (bench/ipvs-in-vm.sh starts it; the host side is bench/ipvs-vm.ts).
// Measures, side by side in one VM (software emulation: absolute times are 10–50× a real
// machine's; the ratios are what the figures are for):
//   cold     per size (after each namespace's deletion the bench waits for an idle CPU: the
//            kernel's teardown would land on the next measurement): a raw reference (`ipset restore` + `iptables-restore` + `ipvsadm -R` +
//            `ip -batch` of the same content kproxy's plan holds, into an empty kernel) beside
//            kproxy's first full sync (IpvsProxier.sync), then one-Service changes (one endpoint
//            added to one Service, IpvsProxier.sync partial), median;
//   connect  per size: first-packet connect latency (connect() → SYN-ACK, p10 / p50 / p99) to
//            the FIRST and the LAST Service's ClusterIP and to a pod IP directly, with the ipvs
//            mode's rules (kproxy's first sync: the same one the cold start times, at a size
//            in both lists) and then with the iptables mode's rules (the rendered payload,
//            loaded raw with a flushing iptables-restore as bench/connect.ts does on the
//            host), in the same VM;
//   trace    per size: `kproxy trace --mode ipvs --live` to the last Service's ClusterIP (process
//            start → answer, `node bin/kproxy.js` in the node namespace, answer checked) beside the
//            raw reads of the same state (`ipvsadm -Sn`, `ipset save`, `ip -o addr show dev
//            kube-ipvs0`, `iptables-save -t nat`) and reads of one Service's share, median of
//            --trace-runs, after kproxy's first sync and changes.
// Sizes run smallest first, each once: raw reference, kproxy's first sync, changes, ipvs
// connects, then the iptables connects in a fresh namespace.
// The node is the VM's root namespace (192.168.0.2 on a veth, default route to the pods'
// namespace `srv`, where 10.0.0.0/8 is local and one listener answers on :8080), set up by
// bench/ipvs-in-vm.sh. Prints progress lines and "IPVSBENCH <json>" lines, and writes the whole
// result as JSON to --out. Every wait is bounded; the VM is thrown away afterwards.
import { connect } from 'node:net';
import { readFileSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';
import { hostRunner, type CommandRunner, type RunOptions, type RunResult } from '../src/kernel/runner.ts';
import type { Logger } from '../src/log.ts';
import { createIpvsProxier, type IpvsProxier } from '../src/modes/ipvs/proxier.ts';
import { cleanupIpvs } from '../src/modes/ipvs/cleanup.ts';
import type { Sysctl } from '../src/kernel/sysctl.ts';
import { plan } from '../src/modes/ipvs/planner.ts';
import { diffIPSets } from '../src/kernel/ipset/model.ts';
import { diffIpvs } from '../src/modes/ipvs/diff.ts';
import { getMode } from '../src/modes/registry.ts';
import { loadIptables } from './connect.ts';
import { benchConfig, clusterIPOf, endpointIPOf, Workload } from './workload.ts';
import { fmtMs, median, percentile } from './stats.ts';

export interface IpvsColdSample {
  n: number;
  /** raw reference parts, ms */
  raw: { ipset: number; iptables: number; ipvsadm: number; addresses: number; total: number; ipvsLines: number; setLines: number };
  /** kproxy's first full sync, ms, and the time its commands took */
  kproxyMs: number;
  kproxyExecMs: number;
  /** the commands of the first sync and of the last change, slowest first (where the time goes) */
  firstSyncCommands?: string;
  changeCommands?: string;
  /** one-Service changes (partial syncs), ms each */
  changeMs: number[];
  /**
   * the same kind of change applied by a full sync, ms (one sample): what every sync cost
   * before partial syncs stopped reading the kernel back (the ipvsadm -Ln / ipset save / ip
   * addr listing, the whole plan and diff), side by side in the same run
   */
  changeFullMs?: number;
  changeFullCommands?: string;
  /** virtual servers listed by the kernel after the first sync (sanity: 2 per Service) */
  virtualServers: number;
  error?: string;
}

export interface IpvsConnectSample {
  n: number;
  mode: 'ipvs' | 'iptables';
  loadMs: number;
  /** p10 too: under emulation the p50 is mostly the emulator's scheduling noise, the p10 is closer to the path's own cost */
  targets: Record<'first' | 'last' | 'pod', { p10Ms: number; p50Ms: number; p99Ms: number; count: number; failed: number }>;
  error?: string;
}

/** one timed command inside the node namespace: ms per run and what it printed */
export interface IpvsReadTiming {
  cmd: string;
  ms: number[];
  medianMs: number;
  /** exit status and output lines of the last run */
  code: number;
  lines: number;
  /** the start of the last run's output (stdout, then stderr): what a probe answered */
  head?: string;
}

/**
 * `kproxy trace --mode ipvs --live` (process start → answer, `node bin/kproxy.js` as users run
 * it, inside the node namespace) to the last Service's ClusterIP, beside the raw reads of the
 * same state in the same namespace, median of `runs` each.
 */
export interface IpvsTraceSample {
  n: number;
  from: string;
  to: string;
  runs: number;
  traceMs: number[];
  traceMedianMs: number;
  /** the whole-state reads: ipvsadm -Sn, ipset save, ip -o addr show dev kube-ipvs0, iptables-save -t nat */
  raw: IpvsReadTiming[];
  /** the sum of the raw reads' medians */
  rawTotalMs: number;
  /** trace ÷ raw total */
  ratio: number;
  /** reads of one Service's share of the state (one virtual server, one address, one set entry), for comparison */
  narrow: IpvsReadTiming[];
  /** the trace's answer (the Service's endpoints) and masquerade */
  output: string;
  masq: boolean;
  error?: string;
}

export interface IpvsVmResult {
  kernel: string;
  endpoints: number;
  cold: IpvsColdSample[];
  connect: IpvsConnectSample[];
  trace?: IpvsTraceSample[];
  seconds: number;
  error?: string;
}

const noop = () => {};
// a no-op logger: loading pino costs seconds under the VM's software emulation
const log = { info: noop, warn: noop, error: noop, debug: noop, trace: noop, fatal: noop, child: () => log } as unknown as Logger;

/**
 * hostRunner with one generous time limit for every command: the executors' production
 * limits (30 s for ipvsadm -R) would kill a 10k apply under emulation before the bench learns
 * how slow it is. Records the time spent in commands.
 */
class VmRunner implements CommandRunner {
  execMs = 0;
  /** "cmd first-arg" → [calls, ms] since the last take() */
  calls = new Map<string, [number, number]>();
  /** ns: run every command in this network namespace (`ip netns exec`) */
  constructor(readonly timeoutMs: number, readonly ns?: string) {}
  async run(cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> {
    const t0 = performance.now();
    try {
      const [c, a] = this.ns ? ['ip', ['netns', 'exec', this.ns, cmd, ...args]] : [cmd, args];
      return await hostRunner.run(c, a, { ...opts, timeoutMs: this.timeoutMs });
    } finally {
      const ms = performance.now() - t0;
      this.execMs += ms;
      const k = `${cmd} ${args.filter((a) => a.startsWith('-') || /^[a-z]+$/.test(a)).slice(0, 2).join(' ')}`.trim();
      const c = this.calls.get(k) ?? [0, 0];
      this.calls.set(k, [c[0] + 1, c[1] + ms]);
    }
  }
  /** the commands since the last call, slowest first: "ipvsadm -R ×1 34.8 s, ..." */
  take(): string {
    const out = [...this.calls].sort((a, b) => b[1][1] - a[1][1]).map(([k, [n, ms]]) => `${k} ×${n} ${(ms / 1000).toFixed(2)} s`).join(', ');
    this.calls.clear();
    this.execMs = 0;
    return out;
  }
}

/** /proc/sys/net as the namespace sees it: through `sysctl` run inside it */
function nsSysctl(runner: CommandRunner): Sysctl {
  return {
    async get(name) {
      const r = await runner.run('sysctl', ['-n', name]);
      return r.code === 0 ? r.stdout.trim() : null;
    },
    async set(name, value) {
      const r = await runner.run('sysctl', ['-w', `${name}=${value}`]);
      if (r.code !== 0) throw new Error(`sysctl -w ${name}=${value}: ${r.stderr.trim()}`);
    },
  };
}

/**
 * A fresh network namespace for one measured apply: IPVS keeps removed real servers in a
 * per-namespace trash list for a minute or two and scans it linearly for every real server
 * added, so an apply right after another one's cleanup in the same namespace pays for the
 * previous one (seen here: 13.5 s → 73.6 s for the same 12,000 ipvsadm lines).
 */
async function withNamespace<T>(name: string, timeoutMs: number, fn: (runner: VmRunner) => Promise<T>): Promise<T> {
  await must(hostRunner, 'ip', ['netns', 'add', name]);
  try {
    const runner = new VmRunner(timeoutMs, name);
    await must(runner, 'ip', ['link', 'set', 'lo', 'up']);
    runner.take();
    return await fn(runner);
  } finally {
    await hostRunner.run('ip', ['netns', 'del', name], { timeoutMs: 120_000 });
    // the kernel tears a namespace down later, in a work queue (its virtual servers, real servers,
    // rules, sets): on the one vCPU that would land on the next measurement (seen: the same 12,000
    // `ipvsadm -R` lines 8.5 s raw, then 22.9 s in kproxy's sync right after the raw namespace
    // was deleted)
    const ms = await quiesce();
    say(`namespace ${name} deleted; the CPU was idle again after ${(ms / 1000).toFixed(1)} s`);
  }
}

/** CPU time counters of /proc/stat: [idle + iowait, total] */
function cpuTimes(): [number, number] {
  const f = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
  return [f[3] + (f[4] ?? 0), f.reduce((a, b) => a + b, 0)];
}

/** Waits (at most maxMs) until the CPU was ≥ 85 % idle for two 1 s windows in a row; returns the time waited. */
async function quiesce(maxMs = 240_000): Promise<number> {
  const t0 = performance.now();
  for (let calm = 0; calm < 2 && performance.now() - t0 < maxMs; ) {
    const [i0, a0] = cpuTimes();
    await new Promise((r) => setTimeout(r, 1000));
    const [i1, a1] = cpuTimes();
    calm = (i1 - i0) / Math.max(1, a1 - a0) >= 0.85 ? calm + 1 : 0;
  }
  return performance.now() - t0;
}

function say(line: string): void {
  let up = '';
  try {
    up = `[${readFileSync('/proc/uptime', 'utf8').split(' ')[0]}s] `;
  } catch {
    /* not Linux */
  }
  process.stdout.write(`ipvs-bench: ${up}${line}\n`);
}

async function must(runner: CommandRunner, cmd: string, args: string[], input?: string): Promise<number> {
  const t0 = performance.now();
  const r = await runner.run(cmd, args, input === undefined ? {} : { input });
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.code}: ${(r.stderr || r.stdout).trim().slice(0, 300)}`);
  return performance.now() - t0;
}

/** Everything the ipvs and iptables modes leave: virtual servers, kube-ipvs0, KUBE-* chains and ipsets. */
async function clean(runner: CommandRunner): Promise<void> {
  await cleanupIpvs(runner, log);
  await runner.run('ipvsadm', ['-C']);
  for (const t of ['nat', 'filter']) await runner.run('iptables', ['-t', t, '-F']);
  for (const t of ['nat', 'filter']) await runner.run('iptables', ['-t', t, '-X']);
  await runner.run('ip', ['link', 'del', 'kube-ipvs0']);
  await runner.run('ipset', ['destroy']);
}

function timesOf(n: number, k: number): number[] {
  // k Services spread over the list (not the first, not the last)
  return Array.from({ length: k }, (_, j) => Math.floor(((j + 1) / (k + 1)) * n));
}

/**
 * One size: (cold sizes) the raw reference into an empty namespace; then a fresh node namespace
 * wired to the pods where kproxy's first full sync is timed, followed by (cold sizes) the
 * one-Service changes and the same change by a full sync (up to fullChangeMax Services), and
 * (connect sizes) the ipvs connect latency over the rules that first sync wrote (the proxier
 * stopped first: one first sync serves both, the 10,000-Service one costs minutes under emulation).
 */
async function sizeAt(n: number, o: { endpoints: number; changes: number; cold: boolean; connect: boolean; connectCount: number; fullChangeMax: number; traceRuns: number }, runner: VmRunner): Promise<{ cold?: IpvsColdSample; ipvsConnect?: IpvsConnectSample; trace?: IpvsTraceSample }> {
  const { endpoints, changes } = o;
  const w = new Workload(n, endpoints, benchConfig('ipvs'));
  const input = w.input();
  const out: IpvsColdSample = {
    n, kproxyMs: NaN, kproxyExecMs: NaN, changeMs: [], virtualServers: 0,
    raw: { ipset: NaN, iptables: NaN, ipvsadm: NaN, addresses: NaN, total: NaN, ipvsLines: 0, setLines: 0 },
  };
  if (o.cold) {
    const p = plan(input);
    const sets = diffIPSets(p.sets, new Map()).script;
    const ipvsLines = diffIpvs(p.table, new Map(), () => true).lines;
    const addrs = p.boundAddresses.map((a) => `addr add ${a}/${a.includes(':') ? 128 : 32} dev kube-ipvs0`).join('\n') + '\n';
    out.raw.ipvsLines = ipvsLines.length;
    out.raw.setLines = sets.split('\n').filter(Boolean).length;
    // raw: the same content, one tool call each, into an empty namespace (kube-ipvs0 created first, untimed)
    await withNamespace(`raw${n}`, runner.timeoutMs, async (r) => {
      await must(r, 'ip', ['link', 'add', 'kube-ipvs0', 'type', 'dummy']);
      out.raw.ipset = await must(r, 'ipset', ['restore'], sets);
      out.raw.iptables = await must(r, 'iptables-restore', ['--noflush'], p.iptables);
      out.raw.ipvsadm = await must(r, 'ipvsadm', ['-R'], ipvsLines.join('\n') + '\n');
      out.raw.addresses = await must(r, 'ip', ['-batch', '-'], addrs);
    });
    out.raw.total = out.raw.ipset + out.raw.iptables + out.raw.ipvsadm + out.raw.addresses;
    say(`cold N=${n}: raw ${(out.raw.total / 1000).toFixed(2)} s (ipset ${(out.raw.ipset / 1000).toFixed(2)}, iptables ${(out.raw.iptables / 1000).toFixed(2)}, ipvsadm -R ${(out.raw.ipvsadm / 1000).toFixed(2)} for ${ipvsLines.length} lines, ip -batch ${(out.raw.addresses / 1000).toFixed(2)})`);
  }
  let ipvsConnect: IpvsConnectSample | undefined;
  let trace: IpvsTraceSample | undefined;
  await withNamespace(`kproxy${n}`, runner.timeoutMs, async (r) => {
    // wired before the first sync: the node namespace the connect client runs in (the workload's
    // node IPs are fixed in its input, so the extra interface changes nothing kproxy writes)
    if (o.connect) await wireNode(r);
    r.take();
    const px = await createIpvsProxier({ config: input.config, runner: r, log, gracefulCheckMs: 0, family: 4, sysctl: nsSysctl(r) });
    try {
      r.take();
      const t0 = performance.now();
      await px.sync(input, w.serviceKeys, true);
      out.kproxyMs = performance.now() - t0;
      out.kproxyExecMs = r.execMs;
      out.firstSyncCommands = r.take();
      const listing = await r.run('ipvsadm', ['-Ln']);
      out.virtualServers = listing.stdout.split('\n').filter((l) => /^(TCP|UDP|SCTP)\s/.test(l)).length;
      say(`${o.cold ? 'cold' : 'first sync'} N=${n}: kproxy first sync ${(out.kproxyMs / 1000).toFixed(2)} s (commands ${(out.kproxyExecMs / 1000).toFixed(2)} s), ${out.virtualServers} virtual servers; its commands: ${out.firstSyncCommands}`);
      r.take();
      if (o.cold) {
        for (const i of timesOf(n, changes)) {
          const changed = w.addEndpoint(i);
          const t1 = performance.now();
          await px.sync(w.input(), changed, false);
          out.changeMs.push(performance.now() - t1);
          out.changeCommands = r.take();
        }
        say(`change N=${n}: ${out.changeMs.map((x) => x.toFixed(0)).join(' / ')} ms; the last one's commands: ${out.changeCommands}`);
        if (n <= o.fullChangeMax) {
          // the same change through a full sync (reads the whole kernel state back), for comparison
          const changed = w.addEndpoint(Math.min(n - 1, timesOf(n, 1)[0] + 1));
          const t2 = performance.now();
          await px.sync(w.input(), changed, true);
          out.changeFullMs = performance.now() - t2;
          out.changeFullCommands = r.take();
          say(`change N=${n} by a full sync: ${out.changeFullMs.toFixed(0)} ms; its commands: ${out.changeFullCommands}`);
        }
      }
    } finally {
      await px.stop();
    }
    if (o.traceRuns > 0) {
      // the changes only added endpoints to Services in the middle: the last Service is as the first sync wrote it
      trace = await measureTrace(r, w, o.traceRuns);
      say(`trace N=${n}: ${trace.error ? `FAILED ${trace.error}; ` : ''}${`kproxy trace --live ${fmtMs(trace.traceMedianMs)} (${trace.traceMs.map((x) => x.toFixed(0)).join(' / ')} ms) beside the raw reads ${fmtMs(trace.rawTotalMs)} (${trace.raw.map((x) => `${x.cmd} ${fmtMs(x.medianMs)}`).join(', ')}): ${trace.ratio.toFixed(2)}×; narrow reads: ${trace.narrow.map((x) => `${x.cmd} ${fmtMs(x.medianMs)} (exit ${x.code}, ${x.lines} lines)`).join(', ')}`}`);
    }
    if (o.connect) {
      // the changes only added endpoints to Services in the middle: the first and the last Service are as the first sync wrote them
      const s: IpvsConnectSample = { n, mode: 'ipvs', loadMs: out.kproxyMs, targets: {} as IpvsConnectSample['targets'] };
      try {
        s.targets = await measureConnects(r, n, o.connectCount);
        say(`connect ipvs N=${n}: ${fmtTargets(s.targets)} ms (p10/p50/p99; rules in ${(s.loadMs / 1000).toFixed(1)} s)`);
      } catch (e) {
        s.error = (e as Error).message.slice(0, 300);
        say(`connect ipvs N=${n}: FAILED ${s.error}`);
      }
      ipvsConnect = s;
    }
  });
  return { cold: o.cold ? out : undefined, ipvsConnect, trace };
}

/** Runs one command `runs` times in the namespace, timing each (process start → exit). */
async function timeRead(r: VmRunner, label: string, cmd: string, args: string[], runs: number, input?: string): Promise<IpvsReadTiming> {
  const ms: number[] = [];
  let last: RunResult = { code: -1, stdout: '', stderr: '' };
  for (let k = 0; k < runs; k++) {
    const t0 = performance.now();
    last = await r.run(cmd, args, input === undefined ? {} : { input });
    ms.push(performance.now() - t0);
  }
  const text = last.stdout + last.stderr;
  return { cmd: label, ms, medianMs: median(ms), code: last.code, lines: text.split('\n').filter(Boolean).length, head: text.slice(0, 240) };
}

/**
 * `kproxy trace --mode ipvs --live` from an outside client to the last Service's ClusterIP, as
 * users run it (`node bin/kproxy.js`, its esbuild bundle when fresh), beside the raw reads of the
 * whole state and reads of the one Service's share. The answer is checked: the Service's
 * endpoints, masqueraded (the source is outside the cluster CIDR).
 */
async function measureTrace(r: VmRunner, w: Workload, runs: number): Promise<IpvsTraceSample> {
  const n = w.services;
  const last = n - 1;
  const vip = clusterIPOf(last);
  const from = '203.0.113.9';
  // the workload's endpoint indexes: Service i owns [i × stride, i × stride + E), stride E + 16 (bench/workload.ts)
  const stride = w.endpointsPerService + 16;
  const want = Array.from({ length: w.endpointsPerService }, (_, k) => `${endpointIPOf(last * stride + k)}:8080`).sort().join(', ');
  const s: IpvsTraceSample = { n, from, to: `${vip}:80`, runs, traceMs: [], traceMedianMs: NaN, raw: [], rawTotalMs: NaN, ratio: NaN, narrow: [], output: '', masq: false };
  try {
    const bin = resolve('bin/kproxy.js');
    const args = [bin, 'trace', '--mode', 'ipvs', '--live', '--from', from, '--to', `${vip}:80`, '--json'];
    const raws: Array<[string, string, string[]]> = [
      ['ipvsadm -Sn', 'ipvsadm', ['-Sn']],
      ['ipset save', 'ipset', ['save']],
      ['ip -o addr show dev kube-ipvs0', 'ip', ['-o', 'addr', 'show', 'dev', 'kube-ipvs0']],
      ['iptables-save -t nat', 'iptables-save', ['-t', 'nat']],
    ];
    const rawMs = raws.map(() => [] as number[]);
    const rawLast: RunResult[] = [];
    for (let k = 0; k < runs; k++) {
      for (const [j, [, cmd, a]] of raws.entries()) {
        const t0 = performance.now();
        const res = await r.run(cmd, a);
        rawMs[j].push(performance.now() - t0);
        if (res.code !== 0) throw new Error(`${cmd} ${a.join(' ')} exited ${res.code}: ${res.stderr.trim().slice(0, 200)}`);
        rawLast[j] = res;
      }
      // a failed trace (e.g. a read past its time limit) is recorded and the runs go on: the raw reads still count
      const t0 = performance.now();
      const t = await r.run(process.execPath, args);
      s.traceMs.push(performance.now() - t0);
      if (t.code !== 0) {
        s.error ??= `kproxy trace exited ${t.code} after ${fmtMs(s.traceMs.at(-1))}: ${(t.stderr || t.stdout).trim().slice(0, 300)}`;
        continue;
      }
      const got = JSON.parse(t.stdout) as { output: string; masq: boolean };
      s.output = got.output;
      s.masq = got.masq;
      if (got.output !== want || got.masq !== true) throw new Error(`kproxy trace answered ${JSON.stringify(got.output)} masq ${got.masq}, want ${want} masq true`);
    }
    s.raw = raws.map(([label], j) => ({ cmd: label, ms: rawMs[j], medianMs: median(rawMs[j]), code: rawLast[j].code, lines: rawLast[j].stdout.split('\n').filter(Boolean).length }));
    s.rawTotalMs = s.raw.reduce((a, x) => a + x.medianMs, 0);
    // a trace time only when every run answered
    s.traceMedianMs = s.error ? NaN : median(s.traceMs);
    s.ratio = s.traceMedianMs / s.rawTotalMs;
    // one Service's share, each its own process: what a narrowed trace may read instead
    const vp = `${vip},tcp:80`;
    s.narrow = [
      await timeRead(r, 'node -e 0', process.execPath, ['-e', '0'], runs),
      await timeRead(r, 'ipvsadm -Ln -t VIP:80', 'ipvsadm', ['-Ln', '-t', `${vip}:80`], runs),
      await timeRead(r, 'ip -o addr show dev kube-ipvs0 to VIP/32', 'ip', ['-o', 'addr', 'show', 'dev', 'kube-ipvs0', 'to', `${vip}/32`], runs),
      await timeRead(r, 'ipset test KUBE-CLUSTER-IP VIP,tcp:80', 'ipset', ['test', 'KUBE-CLUSTER-IP', vp], runs),
      await timeRead(r, 'ipset test KUBE-CLUSTER-IP (absent)', 'ipset', ['test', 'KUBE-CLUSTER-IP', `${from},tcp:80`], runs),
      await timeRead(r, 'ipset save KUBE-CLUSTER-IP', 'ipset', ['save', 'KUBE-CLUSTER-IP'], runs),
      await timeRead(r, 'ipset save KUBE-LOAD-BALANCER-FW', 'ipset', ['save', 'KUBE-LOAD-BALANCER-FW'], runs),
      // `ipset -` (interactive mode) answers every `test` line in one process, as the live trace asks them
      await timeRead(r, 'ipset - (12 test lines)', 'ipset', ['-'], runs, [
        `KUBE-LOAD-BALANCER-FW ${vp}`, `KUBE-LOAD-BALANCER ${vp}`, `KUBE-CLUSTER-IP ${vp}`, `KUBE-EXTERNAL-IP ${vp}`, `KUBE-IPVS-IPS ${vip}`,
        'KUBE-NODE-PORT-LOCAL-TCP 80', 'KUBE-NODE-PORT-TCP 80', ...Array.from({ length: 5 }, (_, k) => `KUBE-LOOP-BACK ${endpointIPOf(last * stride + k)},tcp:8080,${from}`),
      ].map((q) => `test ${q}\n`).join('') + 'quit\n'),
      // the CLI's own start (bin/kproxy.js and its bundle, no kernel read): the floor of any trace
      await timeRead(r, 'node bin/kproxy.js --version', process.execPath, [bin, '--version'], runs),
    ];
  } catch (e) {
    s.error = (e as Error).message.slice(0, 300);
  }
  return s;
}

/**
 * The client, plain JavaScript for `node -e` (tsx costs seconds to start under emulation):
 * argv COUNT label=ip:port...; COUNT sequential connects per target, round-robin, after one
 * warm-up each; prints {"label": [ms | null, ...]} (connect() → SYN-ACK).
 */
const CLIENT = `
const net = require('net');
const once = (h, p) => new Promise((res) => {
  const t0 = process.hrtime.bigint();
  const s = net.connect({ host: h, port: p });
  const timer = setTimeout(() => { s.destroy(); res(null); }, 3000);
  s.once('connect', () => { clearTimeout(timer); res(Number(process.hrtime.bigint() - t0) / 1e6); s.destroy(); });
  s.once('error', () => { clearTimeout(timer); res(null); });
});
(async () => {
  const [count, ...ts] = process.argv.slice(1);
  const targets = ts.map((t) => { const [l, a] = t.split('='); const i = a.lastIndexOf(':'); return [l, a.slice(0, i), Number(a.slice(i + 1))]; });
  const out = Object.fromEntries(targets.map((t) => [t[0], []]));
  for (const [, h, p] of targets) await once(h, p);
  for (let k = 0; k < Number(count); k++) for (const [l, h, p] of targets) out[l].push(await once(h, p));
  console.log(JSON.stringify(out));
})();
`;

/** A node namespace joined to the pods' namespace `srv` by a veth pair (192.168.0.2 ↔ .3), default route to the pods. */
async function wireNode(r: VmRunner): Promise<void> {
  await must(r, 'ip', ['link', 'add', 'vn', 'type', 'veth', 'peer', 'name', 'vs', 'netns', 'srv']);
  await must(r, 'ip', ['addr', 'add', '192.168.0.2/24', 'dev', 'vn']);
  await must(r, 'ip', ['link', 'set', 'vn', 'up']);
  await must(hostRunner, 'ip', ['-n', 'srv', 'addr', 'add', '192.168.0.3/24', 'dev', 'vs']);
  await must(hostRunner, 'ip', ['-n', 'srv', 'link', 'set', 'vs', 'up']);
  // a default route, as on a node: ClusterIPs are routed before the nat OUTPUT hook rewrites them
  await must(r, 'ip', ['route', 'add', 'default', 'via', '192.168.0.3']);
}

async function measureConnects(r: VmRunner, n: number, count: number): Promise<IpvsConnectSample['targets']> {
  const res = await r.run(process.execPath, ['-e', CLIENT, String(count), `first=${clusterIPOf(0)}:80`, `last=${clusterIPOf(n - 1)}:80`, `pod=${endpointIPOf(0)}:8080`]);
  const line = res.stdout.split('\n').find((l) => l.startsWith('{'));
  if (res.code !== 0 || !line) throw new Error(`the connect client failed (${res.code}): ${(res.stderr || res.stdout).trim().slice(0, 300)}`);
  const raw = JSON.parse(line) as Record<string, Array<number | null>>;
  const out = {} as IpvsConnectSample['targets'];
  for (const k of ['first', 'last', 'pod'] as const) {
    const ok = raw[k].filter((x): x is number => x !== null && Number.isFinite(x));
    out[k] = { p10Ms: percentile(ok, 10), p50Ms: percentile(ok, 50), p99Ms: percentile(ok, 99), count: ok.length, failed: raw[k].length - ok.length };
  }
  return out;
}

function fmtTargets(t: IpvsConnectSample['targets']): string {
  return (['first', 'last', 'pod'] as const).map((k) => `${k} ${t[k].p10Ms.toFixed(2)}/${t[k].p50Ms.toFixed(2)}/${t[k].p99Ms.toFixed(2)}${t[k].failed ? ` (${t[k].failed} failed)` : ''}`).join(', ');
}

/** The iptables mode in a fresh node namespace: its first full sync (the mode's Proxier), then the client. */
async function iptablesConnectAt(n: number, endpoints: number, count: number, timeoutMs: number): Promise<IpvsConnectSample> {
  const s: IpvsConnectSample = { n, mode: 'iptables', loadMs: NaN, targets: {} as IpvsConnectSample['targets'] };
  try {
    await withNamespace(`ciptables${n}`, timeoutMs, async (r) => {
      await wireNode(r);
      const w = new Workload(n, endpoints, benchConfig('iptables'));
      const t0 = performance.now();
      await loadIptables(r, w.input());
      s.loadMs = performance.now() - t0;
      s.targets = await measureConnects(r, n, count);
    });
    say(`connect iptables N=${n}: ${fmtTargets(s.targets)} ms (p10/p50/p99; rules in ${(s.loadMs / 1000).toFixed(1)} s)`);
  } catch (e) {
    s.error = (e as Error).message.slice(0, 300);
    say(`connect iptables N=${n}: FAILED ${s.error}`);
  }
  return s;
}

function ints(text: string): number[] {
  return text.split(',').map((x) => x.trim()).filter(Boolean).map(Number).filter((x) => Number.isInteger(x) && x > 0);
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    args: process.argv.slice(2),
    strict: true,
    options: {
      'cold-sizes': { type: 'string', default: '100,1000' }, 'connect-sizes': { type: 'string', default: '100,1000' },
      // which modes the connect sizes measure (a second boot can measure one mode only)
      'connect-modes': { type: 'string', default: 'ipvs,iptables' },
      endpoints: { type: 'string', default: '5' }, changes: { type: 'string', default: '3' }, 'connect-count': { type: 'string', default: '100' },
      'exec-timeout': { type: 'string', default: '600' }, out: { type: 'string' },
      // the one-Service change by a full sync (which reads the kernel back; for comparison) only up to this size
      'full-change-max': { type: 'string', default: '1000000' },
      // `kproxy trace --live` beside the raw reads after each first sync: runs per size (0: not measured)
      'trace-runs': { type: 'string', default: '3' },
    },
  });
  const started = performance.now();
  const kernel = (await hostRunner.run('uname', ['-r'])).stdout.trim();
  const res: IpvsVmResult = { kernel, endpoints: Number(values.endpoints), cold: [], connect: [], trace: [], seconds: 0 };
  const runner = new VmRunner(Number(values['exec-timeout']) * 1000);
  const save = () => {
    res.seconds = (performance.now() - started) / 1000;
    if (values.out) writeFileSync(values.out, JSON.stringify(res, null, 2) + '\n');
  };
  try {
    // warm-up, not recorded: the first apply loads the kernel modules (ip_vs, nf_tables, ip_set,
    // ...) and the tools' libraries, seconds under emulation, which would land on whichever
    // of raw and kproxy goes first
    await sizeAt(10, { endpoints: res.endpoints, changes: 1, cold: true, connect: false, connectCount: 0, fullChangeMax: 0, traceRuns: 0 }, runner);
    say('warm-up done');
    // by size, smallest first: a VM killed at its time limit still reports what it finished
    // (each sample is also printed as an IPVSBENCH line)
    const coldSizes = ints(values['cold-sizes']!);
    const connectSizes = ints(values['connect-sizes']!);
    const modes = values['connect-modes']!.split(',').map((x) => x.trim());
    const emit = (x: { cold: IpvsColdSample } | { connect: IpvsConnectSample } | { trace: IpvsTraceSample }) => process.stdout.write(`IPVSBENCH ${JSON.stringify(x)}\n`);
    for (const n of [...new Set([...coldSizes, ...connectSizes])].sort((x, y) => x - y)) {
      const cold = coldSizes.includes(n);
      const con = connectSizes.includes(n) && modes.includes('ipvs');
      const conIptables = connectSizes.includes(n) && modes.includes('iptables');
      say(`N=${n}: ${[cold ? 'cold start + changes' : '', con ? 'connect ipvs' : '', conIptables ? 'connect iptables' : ''].filter(Boolean).join(', ')}`);
      if (cold || con) {
        try {
          // partial syncs do not list the whole IPVS table: as many changes at 10k as at 100
          const r = await sizeAt(n, { endpoints: res.endpoints, changes: Number(values.changes), cold, connect: con, connectCount: Number(values['connect-count']), fullChangeMax: Number(values['full-change-max']), traceRuns: Number(values['trace-runs']) }, runner);
          if (r.cold) {
            res.cold.push(r.cold);
            emit({ cold: r.cold });
          }
          if (r.ipvsConnect) {
            res.connect.push(r.ipvsConnect);
            emit({ connect: r.ipvsConnect });
          }
          if (r.trace) {
            res.trace!.push(r.trace);
            emit({ trace: r.trace });
          }
        } catch (e) {
          const error = (e as Error).message.slice(0, 300);
          say(`N=${n}: FAILED ${error}`);
          if (cold) {
            const c: IpvsColdSample = { n, raw: { ipset: NaN, iptables: NaN, ipvsadm: NaN, addresses: NaN, total: NaN, ipvsLines: 0, setLines: 0 }, kproxyMs: NaN, kproxyExecMs: NaN, changeMs: [], virtualServers: 0, error };
            res.cold.push(c);
            emit({ cold: c });
          }
          if (con) {
            const c: IpvsConnectSample = { n, mode: 'ipvs', loadMs: NaN, targets: {} as IpvsConnectSample['targets'], error };
            res.connect.push(c);
            emit({ connect: c });
          }
        }
      }
      save();
      if (conIptables) {
        const c = await iptablesConnectAt(n, res.endpoints, Number(values['connect-count']), runner.timeoutMs);
        res.connect.push(c);
        emit({ connect: c });
        save();
      }
    }
  } catch (e) {
    res.error = (e as Error).message.slice(0, 400);
    say(`FAILED: ${res.error}`);
  } finally {
    await clean(runner).catch(() => {});
    save();
  }
  say(`done in ${res.seconds.toFixed(0)} s`);
  process.exitCode = res.error ? 1 : 0;
}

void main();
