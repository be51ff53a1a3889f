// Experiment: does a one-Service change get flat in N if the Services are
// spread over K tables? No mode change. The kernel validates the chain graph per TABLE (6.18:
// `validate_state` in each `struct nft_table`), so a commit into one shard table should walk
// only ~1/K of the graph. This bench measures it with kproxy's own table shape:
//
//   the N Services (× E endpoints) are assigned to K shards by a hash of namespace/name (stable:
//   a Service never moves when others come and go); each shard is rendered by the nftables
//   planner from a state holding only its Services (so it is a complete copy of the base and
//   common chains, sets and maps plus its Services' chains and elements) and renamed
//   `ip kube-proxy-<s>`. For each N in --sizes and each K in --shards ("auto" = one table per
//   ~--per-table Services), in fresh kpb-* namespaces:
//     cold (one nft -f)     all K tables in one `nft -f` transaction;
//     cold (nft -f each)    one `nft -f` per table, in a row (sum of the wall times);
//   then, interleaved, --reps times, in the namespace of the one-transaction cold start, each
//   into the shard of a different Service:
//     floor                 one rule with a jump into a chain nothing references (as
//                           nft-validation.ts's "(b) floor"), in that Service's table;
//     one endpoint added    the realistic partial change in kproxy's forms: the new endpoint
//                           chain declared with its rules, the service chain flushed and
//                           re-declared with its rules (the planner's output before/after);
//   and (N ≥ --connect-min) packets: a node namespace with a pod network, all K tables loaded,
//   connects to the first and last Service's ClusterIP and to a pod IP (bench/connect-client.ts),
//   conntrack's reply source of every Service connection must be one of that Service's endpoints;
//   and (N ≥ --semantics-min) upstream's semantics across the tables, from the node namespace:
//   --semantics-connects connects to the first and last Service's ClusterIP and NodePort (conntrack:
//   answered by one of its endpoints, source-NATed by the masquerade rule), and one connect each
//   to an endpoint-less Service's ClusterIP and NodePort and to a ClusterIP's unknown port (REJECT:
//   ECONNREFUSED); and to a Service with ClientIP session affinity (all to one endpoint).
//
// Services past 35,534 have no NodePort (the port range is full); the semantics check needs
// them for Services n and n+1, so it runs below that.
//
//   node --import tsx bench/nft-shards.ts [--sizes 100,1000,10000] [--shards 1,4,16,auto]
//        [--per-table 500] [--endpoints 5] [--reps 7] [--connects 100] [--connect-min 1000]
//        [--semantics-min 100] [--semantics-connects 20] [--timeout 300]
//
// Prints the 1-minute load average beside every phase and a markdown table at the end.
import { createHash } from 'node:crypto';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { ProxyStateTracker } from '../src/core/tracker.ts';
import { getMode } from '../src/modes/registry.ts';
import type { ChildProcess } from 'node:child_process';
import { killGroup } from './kproxy-run.ts';
import { connectThrough, spawnNode, timedNft, type ConnectOutcome } from './nft-validation.ts';
import { Namespaces, podNetwork, TimedRunner } from './netns.ts';
import { fmtMs, median, pollUntil } from './stats.ts';
import type { K8sService } from '../src/core/api.ts';
import { benchConfig, clusterIPOf, endpointIPOf, MAX_NODE_PORT_SERVICES, NAMESPACE, NODE, serviceName, serviceObject, sliceObject } from './workload.ts';

/** Room for extra endpoints per Service, as nft-validation.ts (endpoint j of Service i is endpointIPOf(i * stride + j)). */
const EXTRA = 16;
const load1 = () => os.loadavg()[0].toFixed(1);

/** The shard of a Service: the first 4 bytes of sha256("namespace/name") modulo K. */
export function shardOf(key: string, k: number): number {
  if (k <= 1) return 0;
  return createHash('sha256').update(key).digest().readUInt32BE(0) % k;
}

export function tableName(s: number, k: number): string {
  return k <= 1 ? 'kube-proxy' : `kube-proxy-${s}`;
}

/** Renames the table of every command of a rendered `ip kube-proxy` text. */
export function renameTable(text: string, name: string): string {
  if (name === 'kube-proxy') return text;
  return text
    .split('\n')
    .map((l) => l.replace(/^((?:add|delete|flush) (?:table|chain|rule|set|map|element) ip) kube-proxy\b/, `$1 ${name}`))
    .join('\n');
}

/** Service i: a NodePort Service while the port range lasts, then ClusterIP only (as bench/nft-scale.ts). */
function serviceOf(i: number): K8sService {
  const s = serviceObject(i);
  if (i < MAX_NODE_PORT_SERVICES) return s;
  return { ...s, spec: { ...s.spec!, type: 'ClusterIP', ports: s.spec!.ports!.map(({ nodePort: _, ...p }) => p) } };
}

/** One shard: the tracker of its Services only, rendered by the nftables planner. */
class Shard {
  readonly tracker = new ProxyStateTracker(4, NODE.nodeName);
  readonly services: number[] = [];
  private readonly counts = new Map<number, number>();

  constructor(
    readonly table: string,
    private readonly e: number,
    private readonly stride: number,
  ) {}

  add(i: number, endpoints = this.e, sticky = false): void {
    this.services.push(i);
    this.counts.set(i, endpoints);
    const svc = serviceOf(i);
    this.tracker.services.update(null, sticky ? { ...svc, spec: { ...svc.spec!, sessionAffinity: 'ClientIP' } } : svc);
    this.tracker.endpoints.update(null, sliceObject(i, endpoints, this.stride));
  }

  render(): string {
    this.tracker.apply();
    return renameTable(getMode('nftables').render({ state: this.tracker.state, config: benchConfig('nftables'), node: NODE }), this.table);
  }

  /** Adds an endpoint to Service i (in this shard) and returns kproxy's partial-form transaction for it. */
  addEndpoint(i: number): string {
    const before = chainsOf(this.render(), i);
    const c = this.counts.get(i)!;
    this.tracker.endpoints.update(sliceObject(i, c, this.stride), sliceObject(i, c + 1, this.stride));
    this.counts.set(i, c + 1);
    const after = chainsOf(this.render(), i);
    const L: string[] = [];
    for (const [name, rules] of after) {
      const old = before.get(name);
      if (old && old.join('\n') === rules.join('\n')) continue;
      if (old) L.push(`flush chain ip ${this.table} ${name}`);
      L.push(`add chain ip ${this.table} ${name} { ${rules.join(' ; ')} ; }`);
    }
    if (!L.length) throw new Error(`KPROXY_BENCH_SHARDS: adding an endpoint to Service ${i} changed no chain`);
    return L.join('\n') + '\n';
  }
}

/** The rules of Service i's own chains (service-, external-, endpoint-…) in a rendered text, by chain. */
function chainsOf(text: string, i: number): Map<string, string[]> {
  const tag = `${NAMESPACE}/${serviceName(i)}/`;
  const out = new Map<string, string[]>();
  for (const l of text.split('\n')) {
    const m = /^add (chain|rule) ip \S+ (\S+)(?: (.*))?$/.exec(l);
    if (!m || !m[2].includes(tag)) continue;
    if (!out.has(m[2])) out.set(m[2], []);
    if (m[1] === 'rule') out.get(m[2])!.push(m[3]);
  }
  return out;
}

/**
 * The K shards of Services 0..n-1 (and, with `extra`, Service n without endpoints and Service
 * n+1 with ClientIP session affinity, for the semantics check).
 */
export function buildShards(n: number, e: number, k: number, extra = false): Shard[] {
  const stride = e + EXTRA;
  const shards = Array.from({ length: k }, (_, s) => new Shard(tableName(s, k), e, stride));
  for (let i = 0; i < n; i++) shards[shardOf(`${NAMESPACE}/${serviceName(i)}`, k)].add(i);
  if (extra) {
    shards[shardOf(`${NAMESPACE}/${serviceName(n)}`, k)].add(n, 0);
    shards[shardOf(`${NAMESPACE}/${serviceName(n + 1)}`, k)].add(n + 1, e, true);
  }
  return shards;
}

export function shardOfService(i: number, k: number): number {
  return shardOf(`${NAMESPACE}/${serviceName(i)}`, k);
}

interface Semantics {
  /** per target: connections conntrack saw, how many answered by one of the Service's endpoints, how many source-NATed */
  conntrack: Record<string, { entries: number; right: number; distinct: number; masqueraded: number }>;
  /** connects that failed, per target */
  failed: Record<string, number>;
  /** one connect each: the endpoint-less Service's ClusterIP and NodePort, a ClusterIP's unknown port */
  probes: Record<string, string>;
  /** the table of the first, last, endpoint-less and sticky Service */
  tables: string;
}

/**
 * Upstream's packet semantics across the shard tables, from the node namespace (source
 * 192.168.0.2, off-cluster): ClusterIP and NodePort of the first and last Service reach only
 * their endpoints and are masqueraded (a pod IP, the control, is not); the endpoint-less
 * Service (Service n) is REJECTed on its ClusterIP and NodePort; a ClusterIP's unknown port
 * is REJECTed; the sticky Service (n+1, ClientIP affinity) sends every connection to one endpoint.
 */
async function semanticsThrough(nss: Namespaces, n: number, k: number, e: number, connects: number, timeoutS: number): Promise<Semantics> {
  const node = await nss.create('smn');
  const srv = await nss.create('sms');
  const procs: ChildProcess[] = [];
  const stride = e + EXTRA;
  try {
    await podNetwork(node, srv);
    let serverOut = '';
    procs.push(spawnNode(srv, ['serve', '8080'], (x) => void (serverOut += x)));
    const runner = new TimedRunner(node);
    await timedNft(runner, buildShards(n, e, k, true).map((sh) => sh.render()).join(''), timeoutS * 1000);
    if (!(await pollUntil(async () => (serverOut.includes('READY') ? true : undefined), 30_000, 20))) {
      throw new Error(`KPROXY_BENCH_CONNECT: the pod listener did not start: ${serverOut.slice(0, 300)}`);
    }
    const np = (i: number) => serviceObject(i).spec!.ports![0].nodePort!;
    const targets: Record<string, { ip: string; port: number; service: number }> = {
      'ClusterIP, first': { ip: clusterIPOf(0), port: 80, service: 0 },
      'ClusterIP, last': { ip: clusterIPOf(n - 1), port: 80, service: n - 1 },
      'NodePort, first': { ip: NODE.nodeIPs[0], port: np(0), service: 0 },
      'NodePort, last': { ip: NODE.nodeIPs[0], port: np(n - 1), service: n - 1 },
      // the control: no Service, no NAT (its "endpoints" are Service 0's, of which it is one)
      'pod IP (no Service)': { ip: endpointIPOf(0), port: 8080, service: 0 },
      // ClientIP session affinity: every connection from the node must reach the same endpoint
      'ClusterIP, sticky Service': { ip: clusterIPOf(n + 1), port: 80, service: n + 1 },
    };
    const labels = Object.keys(targets);
    const run = async (args: string[]): Promise<string> => {
      let out = '';
      const p = spawnNode(node, args, (x) => void (out += x));
      procs.push(p);
      const exited = new Promise<void>((r) => p.once('exit', () => r()));
      const budget = connects * labels.length * 2000 + 60_000;
      const done = await Promise.race([exited.then(() => true), new Promise<false>((r) => setTimeout(() => r(false), budget).unref())]);
      if (!done) throw new Error(`KPROXY_BENCH_CONNECT: the client did not finish within ${budget / 1000} s`);
      const line = out.split('\n').find((l) => l.startsWith('{'));
      if (!line) throw new Error(`KPROXY_BENCH_CONNECT: no result from the client: ${out.slice(0, 300)}`);
      return line;
    };
    const lat = JSON.parse(await run(['connect', String(connects), '2000', ...labels.map((l, x) => `t${x}=${targets[l].ip}:${targets[l].port}`)])) as Record<string, number[]>;
    const probes = JSON.parse(
      await run(['probe', '2000', `noep=${clusterIPOf(n)}:80`, `noepnp=${NODE.nodeIPs[0]}:${np(n)}`, `wrongport=${clusterIPOf(n - 1)}:81`]),
    ) as Record<string, string>;
    const out: Semantics = {
      conntrack: {},
      failed: {},
      probes: {
        "endpoint-less Service's ClusterIP": probes.noep,
        "endpoint-less Service's NodePort": probes.noepnp,
        "last Service's ClusterIP, unknown port 81": probes.wrongport,
      },
      tables: [0, n - 1, n, n + 1].map((i) => tableName(shardOfService(i, k), k)).join(' / '),
    };
    for (const [x, label] of labels.entries()) {
      const t = targets[label];
      out.failed[label] = lat[`t${x}`].filter((v) => !Number.isFinite(v)).length;
      const list = async (extra: string[]) => {
        const r = await runner.run('conntrack', ['-L', '-p', 'tcp', '--orig-dst', t.ip, '--orig-port-dst', String(t.port), ...extra], { timeoutMs: 30_000 });
        return r.stdout.split('\n').filter((l) => /src=\S+.*src=\S+/.test(l));
      };
      const eps = new Set(Array.from({ length: e }, (_, j) => endpointIPOf(t.service * stride + j)));
      const all = await list([]);
      const answers = all.map((l) => [...l.matchAll(/src=(\S+)/g)][1][1]);
      out.conntrack[label] = {
        entries: all.length,
        right: answers.filter((a) => eps.has(a)).length,
        distinct: new Set(answers).size,
        masqueraded: (await list(['--src-nat'])).length,
      };
    }
    return out;
  } finally {
    for (const p of procs) await killGroup(p);
    await nss.delete(node);
    await nss.delete(srv);
  }
}

interface Row {
  n: number;
  k: number;
  sizes: string;
  coldOneMs: number;
  coldEachMs: number;
  floor: number[];
  change: number[];
  load: string[];
  connect?: ConnectOutcome;
  semantics?: Semantics;
}

export interface ShardOptions {
  sizes: number[];
  shards: string[];
  perTable: number;
  endpoints: number;
  reps: number;
  connects: number;
  connectMin: number;
  /** the semantics check (NodePort, masquerade, REJECTs) from this many Services; its connects per target */
  semanticsMin: number;
  semanticsConnects: number;
  timeoutS: number;
}

function kValues(n: number, o: ShardOptions): number[] {
  const ks = o.shards.map((s) => (s === 'auto' ? Math.max(1, Math.round(n / o.perTable)) : Number(s)));
  return [...new Set(ks)].filter((k) => k >= 1 && k <= n).sort((a, b) => a - b);
}

export async function nftShards(o: ShardOptions, log: (l: string) => void): Promise<Row[]> {
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const nss = new Namespaces(`${process.pid}h`);
  const rows: Row[] = [];
  const fresh = async <T>(f: (r: TimedRunner) => Promise<T>): Promise<T> => {
    const ns = await nss.create('sh');
    try {
      return await f(new TimedRunner(ns));
    } finally {
      await nss.delete(ns);
    }
  };
  try {
    for (const n of o.sizes) {
      for (const k of kValues(n, o)) {
        const shards = buildShards(n, o.endpoints, k);
        const texts = shards.map((s) => s.render());
        const counts = shards.map((s) => s.services.length);
        const row: Row = {
          n,
          k,
          sizes: `${Math.min(...counts)}–${Math.max(...counts)}`,
          coldOneMs: NaN,
          coldEachMs: NaN,
          floor: [],
          change: [],
          load: [load1()],
        };
        rows.push(row);
        row.coldEachMs = await fresh(async (r) => {
          let sum = 0;
          for (const t of texts) sum += await timedNft(r, t, o.timeoutS * 1000);
          return sum;
        });
        log(`N=${n} K=${k} (${row.sizes} Services per table): cold, nft -f per table ${fmtMs(row.coldEachMs)} (load ${load1()})`);
        await fresh(async (r) => {
          row.coldOneMs = await timedNft(r, texts.join(''), o.timeoutS * 1000);
          log(`N=${n} K=${k}: cold, one nft -f ${fmtMs(row.coldOneMs)} (load ${load1()})`);
          for (let c = 0; c < o.reps; c++) {
            const i = Math.floor((n * (c + 1)) / (o.reps + 1));
            const sh = shards[shardOf(`${NAMESPACE}/${serviceName(i)}`, k)];
            row.floor.push(await timedNft(r, `add chain ip ${sh.table} kpb-scratch-${c}\nadd chain ip ${sh.table} kpb-scratch-${c} { jump mark-for-masquerade ; }\n`));
            row.change.push(await timedNft(r, sh.addEndpoint(i)));
          }
          row.load.push(load1());
          log(`N=${n} K=${k}: floor ${fmtMs(median(row.floor))}, one endpoint added ${fmtMs(median(row.change))} (medians of ${o.reps}; load ${load1()})`);
        });
        if (n >= o.connectMin) {
          // the changes above touched the shards' state: render afresh for the packet check
          const payload = buildShards(n, o.endpoints, k).map((s) => s.render()).join('');
          row.connect = await connectThrough(nss, 'hc', payload, { n, e: o.endpoints, stride: o.endpoints + EXTRA, connects: o.connects, timeoutS: o.timeoutS });
          const c = row.connect;
          log(
            `N=${n} K=${k} connect: first ${c.targets.first.p50Ms.toFixed(3)}, last ${c.targets.last.p50Ms.toFixed(3)}, pod ${c.targets.pod.p50Ms.toFixed(3)} ms p50; ` +
              `reached first ${JSON.stringify(c.reached.first)} last ${JSON.stringify(c.reached.last)}; load ${c.load}`,
          );
        }
        // the endpoint-less Service n and the sticky n+1 need NodePorts too
        if (n >= o.semanticsMin && n + 1 < MAX_NODE_PORT_SERVICES) {
          row.semantics = await semanticsThrough(nss, n, k, o.endpoints, o.semanticsConnects, o.timeoutS);
          log(`N=${n} K=${k} semantics (${row.semantics.tables}): ${JSON.stringify(row.semantics)}`);
        }
      }
    }
  } finally {
    await nss.deleteAll();
  }
  return rows;
}

export function shardTables(rows: Row[], reps: number): string {
  const L = [
    `| Services | K tables | Services per table | cold, one nft -f | cold, nft -f per table (sum) | floor: one jump rule in one table (median of ${reps}) | one endpoint added in one table (median of ${reps}) | load (1 min) |`,
    '|---:|---:|---:|---:|---:|---:|---:|---:|',
    ...rows.map(
      (r) =>
        `| ${r.n.toLocaleString('en-US')} | ${r.k} | ${r.sizes} | ${fmtMs(r.coldOneMs)} | ${fmtMs(r.coldEachMs)} | ${fmtMs(median(r.floor))} | ${fmtMs(median(r.change))} | ${r.load.join(' / ')} |`,
    ),
  ];
  const cr = rows.filter((r) => r.connect);
  if (cr.length) {
    L.push(
      '',
      '| Services | K | first Service p50 / p99 (ms) | last Service p50 / p99 | pod (no Service) p50 / p99 | failed | endpoints reached (first / last) | answers not from the Service\'s endpoints | load |',
      '|---:|---:|---:|---:|---:|---:|---:|---:|---:|',
    );
    for (const r of cr) {
      const c = r.connect!;
      const t = c.targets;
      const f = (x: { p50Ms: number; p99Ms: number }) => `${x.p50Ms.toFixed(3)} / ${x.p99Ms.toFixed(3)}`;
      L.push(
        `| ${r.n.toLocaleString('en-US')} | ${r.k} | ${f(t.first)} | ${f(t.last)} | ${f(t.pod)} | ${t.first.failed + t.last.failed + t.pod.failed} | ${c.reached.first.distinct} / ${c.reached.last.distinct} | ${c.reached.first.wrong + c.reached.last.wrong} | ${c.load} |`,
      );
    }
  }
  const sr = rows.filter((r) => r.semantics);
  if (sr.length) {
    const labels = Object.keys(sr[0].semantics!.conntrack);
    const probes = Object.keys(sr[0].semantics!.probes);
    L.push(
      '',
      `| Services | K | tables of the first / last / endpoint-less / sticky Service | ${labels.map((l) => `${l}: failed, conntrack entries, to its endpoints, distinct endpoints, masqueraded`).join(' | ')} | ${probes.join(' | ')} |`,
      `|---:|---:|---|${labels.map(() => '---:').join('|')}|${probes.map(() => '---').join('|')}|`,
    );
    for (const r of sr) {
      const m = r.semantics!;
      L.push(
        `| ${r.n.toLocaleString('en-US')} | ${r.k} | ${m.tables} | ${labels.map((l) => `${m.failed[l]}, ${m.conntrack[l].entries}, ${m.conntrack[l].right}, ${m.conntrack[l].distinct}, ${m.conntrack[l].masqueraded}`).join(' | ')} | ${probes.map((p) => m.probes[p]).join(' | ')} |`,
      );
    }
  }
  return L.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      sizes: { type: 'string', default: '100,1000,10000' },
      shards: { type: 'string', default: '1,4,16,auto' },
      'per-table': { type: 'string', default: '500' },
      endpoints: { type: 'string', default: '5' },
      reps: { type: 'string', default: '7' },
      connects: { type: 'string', default: '100' },
      'connect-min': { type: 'string', default: '1000' },
      'semantics-min': { type: 'string', default: '100' },
      'semantics-connects': { type: 'string', default: '20' },
      timeout: { type: 'string', default: '300' },
    },
  });
  const o: ShardOptions = {
    sizes: values.sizes!.split(',').map(Number),
    shards: values.shards!.split(',').filter(Boolean),
    perTable: Number(values['per-table']),
    endpoints: Number(values.endpoints),
    reps: Number(values.reps),
    connects: Number(values.connects),
    connectMin: Number(values['connect-min']),
    semanticsMin: Number(values['semantics-min']),
    semanticsConnects: Number(values['semantics-connects']),
    timeoutS: Number(values.timeout),
  };
  if (o.sizes.some((n) => !Number.isInteger(n) || n < 1 || n > 60_000)) throw new Error('KPROXY_BENCH_ARGS: --sizes wants integers 1..60000');
  if (o.shards.some((s) => s !== 'auto' && !(Number.isInteger(Number(s)) && Number(s) >= 1 && Number(s) <= 256))) {
    throw new Error('KPROXY_BENCH_ARGS: --shards wants a list of 1..256 or "auto"');
  }
  if (!(o.perTable >= 1)) throw new Error('KPROXY_BENCH_ARGS: --per-table wants a positive number');
  if (o.endpoints < 1 || o.endpoints > 15) throw new Error('KPROXY_BENCH_ARGS: --endpoints wants 1..15');
  if (!(o.reps >= 1 && o.reps <= 100)) throw new Error('KPROXY_BENCH_ARGS: --reps wants 1..100');
  const started = new Date().toISOString();
  const load = os.loadavg().map((x) => x.toFixed(1)).join(' ');
  const rows = await nftShards(o, (l) => process.stderr.write(l + '\n'));
  process.stdout.write(
    `nft-shards, ${started}, ${os.cpus().length} CPUs, kernel ${os.release()}, load average at start ${load}, at end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}\n\n`,
  );
  process.stdout.write(shardTables(rows, o.reps) + '\n');
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
