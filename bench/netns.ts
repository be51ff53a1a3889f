// Network namespaces for the benchmarks (names start with `kpb-`; made by test/support/netns.ts)
// and a CommandRunner that runs every command inside one, timing each call so a sync's wall time can be split into
// kproxy's own work and the time spent in iptables-restore / nft.
import { hostRunner, type CommandRunner, type RunOptions, type RunResult } from '../src/kernel/runner.ts';
import { Netns, vethPair } from '../test/support/netns.ts';

export const NS_PREFIX = 'kpb-';

/** One command a TimedRunner ran, and how long it took (ms, wall clock). */
export interface ExecRecord {
  cmd: string;
  args: string[];
  ms: number;
  code: number;
  inputBytes: number;
}

/** Runs commands with `ip netns exec NS` in front (argument arrays, payload on stdin) and records them. */
export class TimedRunner implements CommandRunner {
  records: ExecRecord[] = [];

  /**
   * `rename` swaps binaries, as update-alternatives would on a node: the iptables-legacy
   * variant maps iptables-restore → iptables-legacy-restore and so on.
   */
  /**
   * `timeoutMs`, when set, replaces the time limit every caller asks for: the executors'
   * production limits (60 s iptables-restore, 30 s nft) would otherwise kill a slow apply
   * before the benchmark learns how slow it is.
   */
  constructor(
    readonly ns: string,
    private readonly rename: Record<string, string> = {},
    private readonly timeoutMs?: number,
  ) {}

  async run(cmd: string, args: string[], opts?: RunOptions): Promise<RunResult> {
    const t0 = performance.now();
    const o = this.timeoutMs ? { ...opts, timeoutMs: this.timeoutMs } : opts;
    const r = await hostRunner.run('ip', ['netns', 'exec', this.ns, this.rename[cmd] ?? cmd, ...args], o);
    this.records.push({ cmd, args, ms: performance.now() - t0, code: r.code, inputBytes: opts?.input?.length ?? 0 });
    return r;
  }

  /** Returns and forgets what ran since the last take(). */
  take(): ExecRecord[] {
    const out = this.records;
    this.records = [];
    return out;
  }
}

export function execMs(records: ExecRecord[], pick: (r: ExecRecord) => boolean = () => true): number {
  return records.filter(pick).reduce((s, r) => s + r.ms, 0);
}

/** The legacy (x_tables) binaries in place of the nf_tables-backed ones. */
export const LEGACY_IPTABLES: Record<string, string> = Object.fromEntries(
  ['iptables', 'iptables-save', 'iptables-restore', 'ip6tables', 'ip6tables-save', 'ip6tables-restore'].map((b) => [b, b.replace(/^(ip6?tables)/, '$1-legacy')]),
);

/** The commands that write rules (as opposed to probes and reads). */
export function isWrite(r: ExecRecord): boolean {
  return (r.cmd === 'iptables-restore' || r.cmd === 'ip6tables-restore' || (r.cmd === 'nft' && r.args.includes('-f')));
}

/** Creates and deletes the namespaces of one run (test/support/netns.ts's Netns); deleteAll() is safe to call twice. */
export class Namespaces {
  private readonly live = new Map<string, Netns>();
  private seq = 0;

  constructor(private readonly tag = `${process.pid}`) {}

  async create(label: string): Promise<string> {
    const name = `${NS_PREFIX}${this.tag}-${label}-${this.seq++}`.slice(0, 60);
    // lo up (Netns.create): the kernel treats 127.0.0.1 as local only then, as on a real node.
    this.live.set(name, Netns.create(name));
    return name;
  }

  async delete(name: string): Promise<void> {
    const ns = this.live.get(name);
    if (!ns) return;
    this.live.delete(name);
    await ns.destroy();
  }

  async deleteAll(): Promise<void> {
    for (const name of [...this.live.keys()]) await this.delete(name);
  }

  get names(): string[] {
    return [...this.live.keys()];
  }
}

/**
 * A "pods" namespace behind a node namespace: a veth pair that exists only inside them;
 * `srv` holds every address of 10.0.0.0/8 (`local` route on its loopback) and `node` routes
 * everything to it, as a node's default route does (a ClusterIP is routed before the nat
 * OUTPUT hook rewrites it). bench/connect.ts and bench/kproxy-run.ts's packet detection.
 */
export async function podNetwork(node: string, srv: string): Promise<void> {
  const n = new Netns(node);
  const s = new Netns(srv);
  vethPair(n, 'vn', '192.168.0.2/24', s, 'vs', '192.168.0.3/24');
  n.exec('ip', ['route', 'add', 'default', 'via', '192.168.0.3']);
  s.exec('ip', ['route', 'add', 'local', '10.0.0.0/8', 'dev', 'lo']);
}
