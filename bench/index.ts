// The benchmark suite's entry point (`npm run bench [-- --quick]`): runs every bench behind a
// figure of docs/benchmarks.md, prints their tables in the report's form, and writes their JSON
// and plots to --out (docs/bench):
//
//   scale       bench/scale.ts, host phases: rule programming (cold start, one change, a stream
//               of changes), memory and first-packet latency vs the number of Services, per
//               mode, beside the raw kernel floors (raw iptables-restore / nft -f)
//   ipvs        bench/scale.ts --phases ipvs: one boot of the IPVS VM (bench/ipvs-vm.ts), IPVS
//               beside a raw ipset/ipvsadm restore and beside iptables in the same VM
//   userspace   bench/userspace.ts: the userspace data plane beside nginx, haproxy and a naive
//               Node pipe
//   userspace-flame  bench/userspace-flame.ts: where the userspace worker's and nginx's CPU goes
//               under the same loads (perf flame graphs, CPU per request), 3 × 5 s per load
//               (--quick: 1 × 1 s)
//   trace       bench/trace-live.ts: `kproxy trace --live` end to end per kernel mode (iptables,
//               iptables-legacy, nftables) beside the raw read of the same rules, at 10,000
//               Services (--quick: 2,000)
//   soak        bench/soak.ts: memory over time, `kproxy run` at 2,000 Services with one
//               Service's endpoints changing 5 times a second, iptables and nftables side by
//               side: an hour (--quick: one minute)
//   render      bench/render.ts: `kproxy render` end to end (the process started until its payload
//               is written) per mode beside a raw restore of that payload (flushing
//               iptables-restore, nft -f), at 10,000 Services, medians of 3 (--quick: 1,000, once)
//   iptables-floor  bench/iptables-restore-floor.ts: the iptables one-Service change beside the
//               kernel's per-commit floor (its restore replayed) on the same loaded state,
//               nf_tables and legacy, at 100,000 Services (--quick: 1,000)
//
//   sudo npm run bench [-- --quick] [--only scale,ipvs,userspace,userspace-flame,trace,soak,render,iptables-floor] [--out docs/bench]
//
// The host benches run one after the other (each figure is measured beside its anchor in the
// same run; two benches at once would load each other). The VM runs under software emulation
// and is only compared within itself: with --quick it boots first and runs alongside the host
// benches (one busy core more for them), to keep the whole under 5 minutes; without it, after
// them. --quick is the sized-down run; without it, the full sizes (50,000 Services on the host,
// 10,000 in the VM: over an hour here; the soak one hour more). Outputs: OUT/{scale,ipvs,userspace,trace,soak,render,iptables-floor}-quick.json or
// OUT/{scale,ipvs,userspace,trace,soak,render,iptables-floor}-full.json, and the plots the report shows in OUT/quick/ or OUT/full/
// (with the flame graphs' figures, userspace-flame.json). Needs root (network
// namespaces) and the peers of bench/userspace.ts (scripts/setup-system.sh installs them).
import { spawn } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseArgs } from 'node:util';

export const BENCHES = ['scale', 'ipvs', 'userspace', 'userspace-flame', 'trace', 'soak', 'render', 'iptables-floor'] as const;
type Bench = (typeof BENCHES)[number];

const repoRoot = resolve(import.meta.dirname, '..');

const HELP = `usage: npm run bench [-- --quick] [--only ${BENCHES.join(',')}] [--out docs/bench]
  --quick         the sized-down run (under 5 minutes on 2 cores)
  --only LIST     run only these benches (${BENCHES.join(', ')})
  --out DIR       where the JSON and the plots go (default docs/bench)
  --help          this text`;

/** Runs `node --import tsx FILE ARGS` from the repository root; stdout (the tables) passes through. */
function node(file: string, args: string[]): Promise<number> {
  return new Promise((done, fail) => {
    const p = spawn(process.execPath, ['--import', 'tsx', join(repoRoot, file), ...args], { cwd: repoRoot, stdio: 'inherit' });
    // Ctrl-C reaches the child through the terminal's process group; each bench cleans up after itself.
    p.once('error', fail);
    p.once('exit', (code, signal) => done(code ?? (signal ? 128 : 1)));
  });
}

export function benchArgs(bench: Bench, quick: boolean, out: string, work: string): { file: string; args: string[] } {
  const q = quick ? ['--quick'] : [];
  const plots = join(out, quick ? 'quick' : 'full');
  // --quick: the phases the report's quick tables show (the run phase reports RSS per size; the
  // manifests source and the memory breakdown are full-run figures)
  const hostPhases = quick ? 'cold,run,connect' : 'manifests,memory,k8s,cold,run,connect';
  if (bench === 'scale') return { file: 'bench/scale.ts', args: [...q, '--phases', hostPhases, '--out', join(work, 'scale'), '--docs', plots] };
  if (bench === 'ipvs') return { file: 'bench/scale.ts', args: [...q, '--phases', 'ipvs', '--out', join(work, 'ipvs'), '--docs', plots] };
  if (bench === 'trace') return { file: 'bench/trace-live.ts', args: [...q, '--json', join(out, `trace-${quick ? 'quick' : 'full'}.json`)] };
  if (bench === 'render') return { file: 'bench/render.ts', args: [...q, '--json', join(out, `render-${quick ? 'quick' : 'full'}.json`)] };
  if (bench === 'iptables-floor') return { file: 'bench/iptables-restore-floor.ts', args: [...q, '--json', join(out, `iptables-floor-${quick ? 'quick' : 'full'}.json`)] };
  if (bench === 'userspace-flame') return { file: 'bench/userspace-flame.ts', args: [...(quick ? ['--duration', '1'] : ['--duration', '5', '--repeat', '3']), '--out', plots] };
  if (bench === 'soak') return { file: 'bench/soak.ts', args: [...q, '--json', join(out, `soak-${quick ? 'quick' : 'full'}.json`), '--svg', join(plots, 'soak.svg')] };
  // --quick: the peers the report compares (kproxy's net.Socket path and its workers only in the full run)
  const sized = quick ? ['--duration', '1', '--repeat', '1', '--idle', '2000', '--only', 'direct,naive,nginx,haproxy,kproxy'] : [];
  return { file: 'bench/userspace.ts', args: [...sized, '--json', join(out, `userspace-${quick ? 'quick' : 'full'}.json`), '--svg', join(plots, 'userspace.svg')] };
}

/** scale.ts names its JSON by date: the one a bench wrote, kept under a stable name the report links to. */
function keepJson(bench: Bench, quick: boolean, out: string, work: string): void {
  if (bench !== 'scale' && bench !== 'ipvs') return;
  const dir = join(work, bench);
  const json = readdirSync(dir, { withFileTypes: true }).map((d) => d.name).filter((f) => f.startsWith('scale-') && f.endsWith('.json')).sort().pop();
  if (json) copyFileSync(join(dir, json), join(out, `${bench}-${quick ? 'quick' : 'full'}.json`));
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      only: { type: 'string' },
      out: { type: 'string', default: 'docs/bench' },
      help: { type: 'boolean', default: false },
    },
  });
  if (values.help) {
    console.log(HELP);
    return;
  }
  const only = (values.only ?? BENCHES.join(',')).split(',').map((s) => s.trim()).filter(Boolean);
  for (const b of only) if (!(BENCHES as readonly string[]).includes(b)) throw new Error(`KPROXY_BENCH_ARGS: unknown bench ${JSON.stringify(b)} (want some of ${BENCHES.join(', ')})`);
  const quick = values.quick!;
  const out = resolve(repoRoot, values.out!);
  mkdirSync(join(out, quick ? 'quick' : 'full'), { recursive: true });
  const work = mkdtempSync(join(tmpdir(), 'kpb-suite-'));
  const t0 = performance.now();
  let failed = 0;
  const runOne = async (b: Bench): Promise<void> => {
    const { file, args } = benchArgs(b, quick, out, work);
    process.stderr.write(`\n== ${b}: node --import tsx ${file} ${args.join(' ')}\n`);
    const code = await node(file, args);
    if (code !== 0) {
      failed++;
      process.stderr.write(`== ${b}: exit ${code}\n`);
    }
    try {
      keepJson(b, quick, out, work);
    } catch (e) {
      process.stderr.write(`== ${b}: no JSON kept: ${(e as Error).message}\n`);
    }
  };
  try {
    const picked = only as Bench[];
    const vm = quick && picked.includes('ipvs') ? runOne('ipvs') : undefined;
    for (const b of picked) if (!(vm && b === 'ipvs')) await runOne(b);
    await vm;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
  const s = (performance.now() - t0) / 1000;
  process.stderr.write(`\nbench suite${quick ? ' (--quick)' : ''}: ${only.join(', ')} in ${s.toFixed(0)} s; outputs in ${out}${failed ? `; ${failed} failed` : ''}\n`);
  if (failed) process.exitCode = 1;
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
