// Experiment: what would a one-Service change cost if it did not trigger
// the kernel's table validation? No mode change: this bench measures, side by side in one run,
//
//   kproxy's table (its own cold start, NftProxier.sync(full), into a fresh kpb-* namespace),
//   then interleaved, medians of --reps:
//     (a) kproxy's one-endpoint partial transaction (NftProxier.sync partial, wall time);
//     (b) the floor of the current shape: one rule with a jump in a chain nothing references;
//     (c) validation-free forms into the same table:
//         data-map-new   a new 5-element named DATA map keyed by numgen's integer
//                        (`typeof numgen random mod 65536 : ip daddr . th dport`, interval)
//         data-map-swap  the same map's endpoints replaced: `flush map` + re-declared with 6
//         set-add        one element added to a plain named set (cluster-ips, set body)
//         slots-add      5 ranges added to a table-wide concatenated interval data map
//                        (`ip daddr . meta l4proto . th dport . numgen random mod 65536` →
//                        `ip daddr . th dport`) that holds --endpoints ranges per Service
//                        (50,000 at 10k);
//   prototype shapes (--variants; per size up to --proto-max; 1k first: the bench stops growing
//   them when a size's cold start exceeds --proto-budget seconds), each in a fresh namespace:
//     (d) cold start (raw `nft -f` of the whole prototype table), beside raw `nft -f` of kproxy's
//         own table:
//         wide   ONE table-wide `dnat ip to ip daddr . meta l4proto . th dport . numgen random
//                mod 65536 map @endpoint-slots` (and the same for NodePorts) instead of
//                per-Service and per-endpoint chains;
//         slots  upstream's dispatch (verdict maps → service / external chains), no endpoint
//                chains: `dnat ip to numgen random mod E offset K map @endpoint-slots`, one
//                shared DATA map;
//         --per-service: one named 5-range data map per Service (cold start only);
//         one-Service changes in each: an endpoint added, a Service added, a Service deleted
//         (raw nft -f, medians);
//     (e) first-packet connect latency (bench/connect-client.ts, connect() → SYN-ACK) through
//         the prototype and through kproxy's table, same size, same run: first and last
//         Service's ClusterIP and a pod IP (non-service traffic); and a check that packets
//         really reach one of the Service's endpoints (conntrack's reply source), all of them.
//
//   sudo node --import tsx bench/nft-validation.ts [--sizes 100,1000,10000] [--endpoints 5]
//        [--reps 7] [--variants wide,slots] [--per-service] [--proto-max 10000] [--proto-budget 20]
//        [--connects 300] [--connect-min 1000] [--timeout 300]
// --quick: sizes 100,1000, 5 repetitions, 100 connects per target (under a minute).
//
// Hazard: at 10,000 the prototypes take 30-95 s of kernel time to create (docs/benchmarks.md,
// "A validation-free change"); they are data maps, no soft lockup was seen, but run 1,000 first.
//
// Prints the 1-minute load average beside every phase and markdown tables at the end.
import { spawn, type ChildProcess } from 'node:child_process';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';
import os from 'node:os';
import { silentLogger } from '../src/log.ts';
import { getMode } from '../src/modes/registry.ts';
import { killGroup } from './kproxy-run.ts';
import { Namespaces, podNetwork, TimedRunner } from './netns.ts';
import { fmtMs, median, percentile, pollUntil } from './stats.ts';
import { benchConfig, clusterIPOf, endpointIPOf, serviceObject, Workload } from './workload.ts';

const repoRoot = resolve(import.meta.dirname, '..');
/** Workload's default room for extra endpoints per Service: endpoint j of Service i is endpointIPOf(i * STRIDE + j). */
const EXTRA = 16;
const SLOTS = 65_536;
const load1 = () => os.loadavg()[0].toFixed(1);

/** The slot ranges [lo, hi] of `e` endpoints over numgen's 0..65535: each gets 1/e of them (±1/65536). */
export function slotRanges(e: number): Array<[number, number]> {
  const out: Array<[number, number]> = [];
  for (let k = 0; k < e; k++) out.push([Math.floor((k * SLOTS) / e), Math.floor(((k + 1) * SLOTS) / e) - 1]);
  return out;
}

function endpointsOf(i: number, e: number, stride: number): string[] {
  return Array.from({ length: e }, (_, k) => endpointIPOf(i * stride + k));
}

function nodePortOf(i: number): number | undefined {
  return serviceObject(i).spec!.ports![0].nodePort;
}

const SLOT_MAP_SPEC = 'typeof ip daddr . meta l4proto . th dport . numgen random mod 65536 : ip daddr . th dport ; flags interval ;';
const NODEPORT_SLOT_MAP_SPEC = 'typeof meta l4proto . th dport . numgen random mod 65536 : ip daddr . th dport ; flags interval ;';
const SERVICE_SLOT_MAP_SPEC = 'typeof numgen random mod 65536 : ip daddr . th dport ; flags interval ;';

/** The slot-map elements of Service i (ClusterIP, and NodePort when it has one). */
function slotElements(i: number, eps: string[]): { cluster: string[]; nodePort: string[]; hairpin: string[] } {
  const vip = clusterIPOf(i);
  const np = nodePortOf(i);
  const ranges = slotRanges(eps.length);
  return {
    cluster: ranges.map(([lo, hi], k) => `${vip} . tcp . 80 . ${lo}-${hi} : ${eps[k]} . 8080`),
    nodePort: np === undefined ? [] : ranges.map(([lo, hi], k) => `tcp . ${np} . ${lo}-${hi} : ${eps[k]} . 8080`),
    hairpin: eps.map((ep) => `${ep} . ${ep}`),
  };
}

/** `add set|map NAME { SPEC elements = { ... } ; }` in lines of at most `chunk` elements. */
function declare(kind: 'set' | 'map', name: string, spec: string, elements: string[], chunk = 2000): string[] {
  if (!elements.length) return [`add ${kind} ip kube-proxy ${name} { ${spec} }`];
  const out: string[] = [];
  for (let s = 0; s < elements.length; s += chunk) {
    out.push(`add ${kind} ip kube-proxy ${name} { ${spec} elements = { ${elements.slice(s, s + chunk).join(', ')} } ; }`);
  }
  return out;
}

/**
 * The prototype table for N Services × E endpoints (ClusterIP port 80 → 8080, a NodePort each
 * while the range lasts): no per-Service or per-endpoint chain. Packet semantics kept from
 * upstream's table (for this workload: Cluster policy, no affinity, endpoints everywhere):
 *   - off-cluster traffic to a ClusterIP and all NodePort traffic is marked for masquerade;
 *   - hairpin: a connection DNATed back to its own source is masqueraded (post-DNAT pair lookup,
 *     exactly upstream's `ip saddr <endpoint> jump mark-for-masquerade` in the endpoint's chain);
 *   - traffic that is no Service's passes untouched (a map miss ends the rule, NFT_BREAK).
 * `perService`: one named data map per Service, reached through a per-Service chain from the
 * service-ips vmap (upstream's dispatch) instead of the table-wide map.
 */
export function prototypeTable(n: number, e: number, stride: number, perService = false): string {
  const L: string[] = [
    'add table ip kube-proxy { comment "kproxy prototype: validation-free endpoint selection" ; }',
    'add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }',
    'add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }',
    'add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }',
    'add chain ip kube-proxy mark-for-masquerade { mark set mark or 0x00004000 ; }',
  ];
  const cluster: string[] = [];
  const nodePort: string[] = [];
  const hairpin: string[] = [];
  const ports: string[] = [];
  const nodePorts: string[] = [];
  const vmap: string[] = [];
  const perServiceLines: string[] = [];
  for (let i = 0; i < n; i++) {
    const el = slotElements(i, endpointsOf(i, e, stride));
    hairpin.push(...el.hairpin);
    ports.push(`${clusterIPOf(i)} . tcp . 80`);
    const np = nodePortOf(i);
    if (np !== undefined) nodePorts.push(`tcp . ${np}`);
    if (perService) {
      const eps = endpointsOf(i, e, stride);
      const els = slotRanges(e).map(([lo, hi], k) => `${lo}-${hi} : ${eps[k]} . 8080`);
      perServiceLines.push(...declare('map', `slots-${i}`, SERVICE_SLOT_MAP_SPEC, els));
      perServiceLines.push(`add chain ip kube-proxy service-${i} { meta l4proto tcp dnat ip to numgen random mod 65536 map @slots-${i} ; }`);
      vmap.push(`${clusterIPOf(i)} . tcp . 80 : goto service-${i}`);
    } else {
      cluster.push(...el.cluster);
      nodePort.push(...el.nodePort);
    }
  }
  L.push(...declare('set', 'hairpin', 'type ipv4_addr . ipv4_addr ;', hairpin));
  L.push(...declare('set', 'service-ports', 'type ipv4_addr . inet_proto . inet_service ;', ports));
  L.push(...declare('set', 'nodeport-ports', 'type inet_proto . inet_service ;', nodePorts));
  L.push(...declare('map', 'endpoint-slots', SLOT_MAP_SPEC, cluster));
  L.push(...declare('map', 'nodeport-slots', NODEPORT_SLOT_MAP_SPEC, nodePort));
  L.push('add chain ip kube-proxy masquerading { ct status dnat ip saddr . ip daddr @hairpin jump mark-for-masquerade ; mark and 0x00004000 == 0 return ; mark set mark xor 0x00004000 ; masquerade fully-random ; }');
  const dispatch = perService
    ? ['ip daddr . meta l4proto . th dport vmap @service-ips']
    : [
        'meta l4proto { tcp, udp, sctp } dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 65536 map @endpoint-slots',
        'fib daddr type local meta l4proto { tcp, udp, sctp } dnat ip to meta l4proto . th dport . numgen random mod 65536 map @nodeport-slots',
      ];
  if (perService) {
    L.push(...perServiceLines);
    L.push(...declare('map', 'service-ips', 'type ipv4_addr . inet_proto . inet_service : verdict ;', vmap));
  }
  L.push(
    'add chain ip kube-proxy services { ' +
      [
        'ip daddr . meta l4proto . th dport @service-ports ip saddr != 10.0.0.0/8 jump mark-for-masquerade',
        'fib daddr type local meta l4proto . th dport @nodeport-ports jump mark-for-masquerade',
        ...dispatch,
      ].join(' ; ') +
      ' ; }',
    'add rule ip kube-proxy nat-prerouting jump services',
    'add rule ip kube-proxy nat-output jump services',
    'add rule ip kube-proxy nat-postrouting jump masquerading',
  );
  return L.join('\n') + '\n';
}

/** The prototype's one-Service endpoint change: Service i's `from` endpoints become `to` (ranges deleted, new ones added). */
export function prototypeEndpointChange(i: number, from: string[], to: string[]): string {
  const a = slotElements(i, from);
  const b = slotElements(i, to);
  const L = [
    `delete element ip kube-proxy endpoint-slots { ${a.cluster.map((x) => x.split(' : ')[0]).join(', ')} }`,
    ...(a.nodePort.length ? [`delete element ip kube-proxy nodeport-slots { ${a.nodePort.map((x) => x.split(' : ')[0]).join(', ')} }`] : []),
    ...declare('map', 'endpoint-slots', SLOT_MAP_SPEC, b.cluster),
    ...(b.nodePort.length ? declare('map', 'nodeport-slots', NODEPORT_SLOT_MAP_SPEC, b.nodePort) : []),
    ...declare('set', 'hairpin', 'type ipv4_addr . ipv4_addr ;', b.hairpin.filter((h) => !a.hairpin.includes(h))),
  ];
  return L.join('\n') + '\n';
}

function prototypeServiceAdd(vip: string, eps: string[]): string {
  const ranges = slotRanges(eps.length);
  return [
    ...declare('set', 'service-ports', 'type ipv4_addr . inet_proto . inet_service ;', [`${vip} . tcp . 80`]),
    ...declare('map', 'endpoint-slots', SLOT_MAP_SPEC, ranges.map(([lo, hi], k) => `${vip} . tcp . 80 . ${lo}-${hi} : ${eps[k]} . 8080`)),
    ...declare('set', 'hairpin', 'type ipv4_addr . ipv4_addr ;', eps.map((x) => `${x} . ${x}`)),
  ].join('\n') + '\n';
}

function prototypeServiceDelete(vip: string, eps: string[]): string {
  const ranges = slotRanges(eps.length);
  return [
    `delete element ip kube-proxy service-ports { ${vip} . tcp . 80 }`,
    `delete element ip kube-proxy endpoint-slots { ${ranges.map(([lo, hi]) => `${vip} . tcp . 80 . ${lo}-${hi}`).join(', ')} }`,
    `delete element ip kube-proxy hairpin { ${eps.map((x) => `${x} . ${x}`).join(', ')} }`,
  ].join('\n') + '\n';
}

export async function timedNft(runner: TimedRunner, text: string, timeoutMs = 120_000): Promise<number> {
  const t0 = performance.now();
  const r = await runner.run('nft', ['-f', '-'], { input: text, timeoutMs });
  const ms = performance.now() - t0;
  if (r.code !== 0) throw new Error(`KPROXY_BENCH_NFT: nft -f refused: ${r.stderr.trim().slice(0, 400)}`);
  return ms;
}

export function spawnNode(ns: string, args: string[], onOut: (s: string) => void): ChildProcess {
  const p = spawn('ip', ['netns', 'exec', ns, process.execPath, '--import', 'tsx', resolve(repoRoot, 'bench/connect-client.ts'), ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
    cwd: repoRoot,
  });
  p.stdout!.on('data', (d: Buffer) => onOut(d.toString()));
  p.stderr!.on('data', (d: Buffer) => onOut(d.toString()));
  return p;
}

export interface Latency {
  p50Ms: number;
  p99Ms: number;
  failed: number;
}

export interface ConnectOutcome {
  loadMs: number;
  targets: Record<'first' | 'last' | 'pod', Latency>;
  /** per Service target: distinct endpoints conntrack saw answering, and answers from outside the Service's endpoints */
  reached: Record<'first' | 'last', { distinct: number; wrong: number; entries: number }>;
  load: string;
}

/** Loads `payload` with nft -f into a node namespace with a pod network, then times connects and checks where they went. */
export async function connectThrough(
  nss: Namespaces,
  label: string,
  payload: string,
  o: { n: number; e: number; stride: number; connects: number; timeoutS: number },
): Promise<ConnectOutcome> {
  const node = await nss.create(`${label}n`);
  const srv = await nss.create(`${label}s`);
  const procs: ChildProcess[] = [];
  try {
    await podNetwork(node, srv);
    let serverOut = '';
    procs.push(spawnNode(srv, ['serve', '8080'], (s) => void (serverOut += s)));
    const runner = new TimedRunner(node);
    const loadMs = await timedNft(runner, payload, o.timeoutS * 1000);
    if (!(await pollUntil(async () => (serverOut.includes('READY') ? true : undefined), 30_000, 20))) {
      throw new Error(`KPROXY_BENCH_CONNECT: the pod listener did not start: ${serverOut.slice(0, 300)}`);
    }
    let out = '';
    const client = spawnNode(node, ['connect', String(o.connects), '2000', `first=${clusterIPOf(0)}:80`, `last=${clusterIPOf(o.n - 1)}:80`, `pod=${endpointIPOf(0)}:8080`], (s) => void (out += s));
    procs.push(client);
    const exited = new Promise<void>((r) => client.once('exit', () => r()));
    const budget = o.connects * 3 * 2000 + 60_000;
    const done = await Promise.race([exited.then(() => true), new Promise<false>((r) => setTimeout(() => r(false), budget).unref())]);
    if (!done) throw new Error(`KPROXY_BENCH_CONNECT: the client did not finish within ${budget / 1000} s`);
    const line = out.split('\n').find((l) => l.startsWith('{'));
    if (!line) throw new Error(`KPROXY_BENCH_CONNECT: no result from the client: ${out.slice(0, 300)}`);
    const raw = JSON.parse(line) as Record<string, number[]>;
    const lat = (xs: number[]): Latency => {
      const ok = xs.filter(Number.isFinite);
      return { p50Ms: percentile(ok, 50), p99Ms: percentile(ok, 99), failed: xs.length - ok.length };
    };
    const reached = async (i: number) => {
      const r = await runner.run('conntrack', ['-L', '-p', 'tcp', '--orig-dst', clusterIPOf(i)], { timeoutMs: 30_000 });
      const eps = new Set(endpointsOf(i, o.e, o.stride));
      const seen = new Set<string>();
      let wrong = 0;
      let entries = 0;
      for (const l of r.stdout.split('\n')) {
        const srcs = [...l.matchAll(/src=(\S+)/g)].map((m) => m[1]);
        if (srcs.length < 2) continue;
        entries++;
        if (eps.has(srcs[1])) seen.add(srcs[1]);
        else wrong++;
      }
      return { distinct: seen.size, wrong, entries };
    };
    return {
      loadMs,
      targets: { first: lat(raw.first), last: lat(raw.last), pod: lat(raw.pod) },
      reached: { first: await reached(0), last: await reached(o.n - 1) },
      load: load1(),
    };
  } finally {
    for (const p of procs) await killGroup(p);
    await nss.delete(node);
    await nss.delete(srv);
  }
}

interface SizeResult {
  n: number;
  load: string[];
  kproxyColdMs: number;
  /** per measure: samples */
  samples: Record<string, number[]>;
  proto?: {
    /** per variant ("wide", "slots", "per-service") */
    coldMs: Record<string, number>;
    kproxyRawMs: number;
    samples: Record<string, number[]>;
    connect?: Record<string, ConnectOutcome>;
    error?: string;
  };
}

export interface ValidationOptions {
  sizes: number[];
  endpoints: number;
  reps: number;
  protoMax: number;
  protoBudgetS: number;
  connects: number;
  connectMin: number;
  perService: boolean;
  /** prototype variants to build: "wide", "slots" */
  variants: string[];
  timeoutS: number;
}

/** (a)–(c): kproxy's cold start, then the change forms interleaved in its namespace. */
async function kproxyTable(nss: Namespaces, n: number, o: ValidationOptions, res: SizeResult, log: (l: string) => void): Promise<void> {
  const w = new Workload(n, o.endpoints, benchConfig('nftables'), EXTRA);
  const stride = o.endpoints + EXTRA;
  const ns = await nss.create('kp');
  try {
    const runner = new TimedRunner(ns, {}, o.timeoutS * 1000);
    const proxier = await getMode('nftables').createProxier({ config: benchConfig('nftables'), runner, log: silentLogger(), family: 4 });
    const t0 = performance.now();
    await proxier.sync(w.input(), new Set(), true);
    res.kproxyColdMs = performance.now() - t0;
    res.load.push(load1());
    log(`N=${n}: kproxy cold start ${fmtMs(res.kproxyColdMs)} (load ${load1()})`);
    // the table-wide slot map, filled as the prototype would (E ranges per Service)
    const slots: string[] = [];
    for (let i = 0; i < n; i++) slots.push(...slotElements(i, endpointsOf(i, o.endpoints, stride)).cluster);
    const slotsMs = await timedNft(runner, declare('map', 'kpb-endpoint-slots', SLOT_MAP_SPEC, slots).join('\n') + '\n', o.timeoutS * 1000);
    log(`N=${n}: ${slots.length} ranges into a table-wide interval map in kproxy's table: ${fmtMs(slotsMs)}`);
    const s = res.samples;
    const push = (k: string, v: number) => (s[k] ??= []).push(v);
    for (let c = 0; c < o.reps; c++) {
      const i = Math.floor((n * (c + 1)) / (o.reps + 1));
      const changed = w.addEndpoint(i);
      const t1 = performance.now();
      await proxier.sync(w.input(), changed, false);
      push('a: kproxy partial sync, one endpoint added', performance.now() - t1);
      runner.take();
      push('b: floor, one jump rule', await timedNft(runner, `add chain ip kube-proxy kpb-scratch-${c}\nadd chain ip kube-proxy kpb-scratch-${c} { jump mark-for-masquerade ; }\n`));
      const eps5 = Array.from({ length: 5 }, (_, k) => `10.250.${c}.${k + 1}`);
      const mapEls = (eps: string[]) => slotRanges(eps.length).map(([lo, hi], k) => `${lo}-${hi} : ${eps[k]} . 8080`);
      push('c: new 5-element named data map', await timedNft(runner, declare('map', `kpb-slots-${c}`, SERVICE_SLOT_MAP_SPEC, mapEls(eps5)).join('\n') + '\n'));
      push(
        'c: same map, endpoints replaced (flush map + 6 elements)',
        await timedNft(runner, `flush map ip kube-proxy kpb-slots-${c}\n` + declare('map', `kpb-slots-${c}`, SERVICE_SLOT_MAP_SPEC, mapEls([...eps5, `10.250.${c}.6`])).join('\n') + '\n'),
      );
      push('c: one element added to a plain set (set body)', await timedNft(runner, `add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; elements = { 172.31.254.${c + 1} } ; }\n`));
      const vip = `172.31.253.${c + 1}`;
      push(
        'c: 5 ranges added to the table-wide interval map',
        await timedNft(runner, declare('map', 'kpb-endpoint-slots', SLOT_MAP_SPEC, slotRanges(5).map(([lo, hi], k) => `${vip} . tcp . 80 . ${lo}-${hi} : ${eps5[k]} . 8080`)).join('\n') + '\n'),
      );
    }
    res.load.push(load1());
    await proxier.stop();
  } finally {
    await nss.delete(ns);
  }
}

/** Slots each Service owns in the shared `endpoint-slots` data map of the "slots" variant (room to grow without moving). */
const SLOT_CAPACITY = 16;

/** The "slots" variant's service chain: off-cluster masquerade, then DNAT through the Service's slots of the shared data map. */
function slotsServiceChain(i: number, e: number): string {
  return `add chain ip kube-proxy service-${i} { ip daddr ${clusterIPOf(i)} ip saddr != 10.0.0.0/8 jump mark-for-masquerade ; meta l4proto tcp dnat ip to numgen random mod ${e} offset ${i * SLOT_CAPACITY} map @endpoint-slots ; }`;
}

/**
 * Variant "slots" (kubernetes PR #140362's shared map, but a DATA map: `numgen random mod E
 * offset K` → `ip daddr . th dport`, so no element is a verdict the validation would walk):
 * upstream's dispatch (service-ips / service-nodeports verdict maps → service-* / external-*
 * chains), no endpoint chains; hairpin by the post-DNAT pair set. Service i owns slots
 * [16i, 16i+16). An endpoint change adds slot elements (validation-free) and rewrites the
 * service chain's one dnat rule (validation, over a graph without endpoint chains).
 */
export function slotsTable(n: number, e: number, stride: number): string {
  const L: string[] = [
    'add table ip kube-proxy { comment "kproxy prototype: shared endpoint-slots data map" ; }',
    'add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }',
    'add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }',
    'add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }',
    'add chain ip kube-proxy mark-for-masquerade { mark set mark or 0x00004000 ; }',
  ];
  const hairpin: string[] = [];
  const slots: string[] = [];
  const vmap: string[] = [];
  const npmap: string[] = [];
  const chains: string[] = [];
  for (let i = 0; i < n; i++) {
    const eps = endpointsOf(i, e, stride);
    hairpin.push(...eps.map((x) => `${x} . ${x}`));
    slots.push(...eps.map((x, k) => `${i * SLOT_CAPACITY + k} : ${x} . 8080`));
    chains.push(slotsServiceChain(i, e));
    vmap.push(`${clusterIPOf(i)} . tcp . 80 : goto service-${i}`);
    const np = nodePortOf(i);
    if (np !== undefined) {
      chains.push(`add chain ip kube-proxy external-${i} { jump mark-for-masquerade ; goto service-${i} ; }`);
      npmap.push(`tcp . ${np} : goto external-${i}`);
    }
  }
  L.push(...declare('set', 'hairpin', 'type ipv4_addr . ipv4_addr ;', hairpin));
  L.push(...declare('map', 'endpoint-slots', SLOTS_SPEC, slots));
  L.push('add chain ip kube-proxy masquerading { ct status dnat ip saddr . ip daddr @hairpin jump mark-for-masquerade ; mark and 0x00004000 == 0 return ; mark set mark xor 0x00004000 ; masquerade fully-random ; }');
  L.push(...chains);
  L.push(...declare('map', 'service-ips', 'type ipv4_addr . inet_proto . inet_service : verdict ;', vmap));
  L.push(...declare('map', 'service-nodeports', 'type inet_proto . inet_service : verdict ;', npmap));
  L.push(
    'add chain ip kube-proxy services { ip daddr . meta l4proto . th dport vmap @service-ips ; fib daddr type local meta l4proto . th dport vmap @service-nodeports ; }',
    'add rule ip kube-proxy nat-prerouting jump services',
    'add rule ip kube-proxy nat-output jump services',
    'add rule ip kube-proxy nat-postrouting jump masquerading',
  );
  return L.join('\n') + '\n';
}

const SLOTS_SPEC = 'typeof numgen random mod 16 : ip daddr . th dport ;';

interface Variant {
  name: string;
  table(n: number, e: number, stride: number): string;
  endpointAdded(i: number, from: string[], to: string[]): string;
  serviceAdded(c: number, vip: string, eps: string[]): string;
  serviceDeleted(c: number, vip: string, eps: string[]): string;
}

const VARIANTS: Record<string, Variant> = {
  wide: {
    name: 'wide: one table-wide interval slot map (no per-Service chains)',
    table: (n, e, stride) => prototypeTable(n, e, stride),
    endpointAdded: prototypeEndpointChange,
    serviceAdded: (_c, vip, eps) => prototypeServiceAdd(vip, eps),
    serviceDeleted: (_c, vip, eps) => prototypeServiceDelete(vip, eps),
  },
  slots: {
    name: 'slots: shared numgen-offset data map, upstream dispatch, no endpoint chains',
    table: slotsTable,
    endpointAdded: (i, from, to) =>
      [
        ...declare('map', 'endpoint-slots', SLOTS_SPEC, to.slice(from.length).map((x, k) => `${i * SLOT_CAPACITY + from.length + k} : ${x} . 8080`)),
        ...declare('set', 'hairpin', 'type ipv4_addr . ipv4_addr ;', to.slice(from.length).map((x) => `${x} . ${x}`)),
        `flush chain ip kube-proxy service-${i}`,
        slotsServiceChain(i, to.length),
      ].join('\n') + '\n',
    // a new Service: slots past the workload's (the bench's sizes stay far below 60,000 Services)
    serviceAdded: (c, vip, eps) => {
      const id = 60_000 + c;
      return [
        ...declare('map', 'endpoint-slots', SLOTS_SPEC, eps.map((x, k) => `${id * SLOT_CAPACITY + k} : ${x} . 8080`)),
        ...declare('set', 'hairpin', 'type ipv4_addr . ipv4_addr ;', eps.map((x) => `${x} . ${x}`)),
        `add chain ip kube-proxy service-${id} { ip daddr ${vip} ip saddr != 10.0.0.0/8 jump mark-for-masquerade ; meta l4proto tcp dnat ip to numgen random mod ${eps.length} offset ${id * SLOT_CAPACITY} map @endpoint-slots ; }`,
        ...declare('map', 'service-ips', 'type ipv4_addr . inet_proto . inet_service : verdict ;', [`${vip} . tcp . 80 : goto service-${id}`]),
      ].join('\n') + '\n';
    },
    serviceDeleted: (c, vip, eps) => {
      const id = 60_000 + c;
      return [
        `delete element ip kube-proxy service-ips { ${vip} . tcp . 80 }`,
        `delete chain ip kube-proxy service-${id}`,
        `delete element ip kube-proxy endpoint-slots { ${eps.map((_, k) => id * SLOT_CAPACITY + k).join(', ')} }`,
        `delete element ip kube-proxy hairpin { ${eps.map((x) => `${x} . ${x}`).join(', ')} }`,
      ].join('\n') + '\n';
    },
  },
};

/** (d) and (e): the prototype tables' cold start and changes, beside kproxy's table; connect latency through each. */
async function prototype(nss: Namespaces, n: number, o: ValidationOptions, res: SizeResult, log: (l: string) => void): Promise<boolean> {
  const stride = o.endpoints + EXTRA;
  const kproxyText = getMode('nftables').render(new Workload(n, o.endpoints, benchConfig('nftables'), EXTRA).input());
  const p: NonNullable<SizeResult['proto']> = { coldMs: {}, kproxyRawMs: NaN, samples: {}, connect: {} };
  res.proto = p;
  const fresh = async <T>(f: (r: TimedRunner) => Promise<T>): Promise<T> => {
    const ns = await nss.create('pr');
    try {
      return await f(new TimedRunner(ns));
    } finally {
      await nss.delete(ns);
    }
  };
  p.kproxyRawMs = await fresh((r) => timedNft(r, kproxyText, o.timeoutS * 1000));
  log(`N=${n}: raw nft -f of kproxy's table ${fmtMs(p.kproxyRawMs)} (load ${load1()})`);
  let cheap = true;
  const opts = { n, e: o.endpoints, stride, connects: o.connects, timeoutS: o.timeoutS };
  for (const vn of o.variants) {
    const v = VARIANTS[vn];
    const text = v.table(n, o.endpoints, stride);
    await fresh(async (r) => {
      const cold = await timedNft(r, text, o.timeoutS * 1000);
      p.coldMs[vn] = cold;
      if (cold > o.protoBudgetS * 1000) cheap = false;
      log(`N=${n}: prototype ${vn} cold start (raw nft -f) ${fmtMs(cold)} (${text.length} bytes, load ${load1()})`);
      const push = (k: string, x: number) => (p.samples[`${vn}: ${k}`] ??= []).push(x);
      for (let c = 0; c < o.reps; c++) {
        const i = Math.floor((n * (c + 1)) / (o.reps + 1));
        const from = endpointsOf(i, o.endpoints, stride);
        const to = endpointsOf(i, o.endpoints + 1, stride);
        push('one endpoint added', await timedNft(r, v.endpointAdded(i, from, to)));
        push('floor, one jump rule', await timedNft(r, `add chain ip kube-proxy kpb-scratch-${c}\nadd chain ip kube-proxy kpb-scratch-${c} { jump mark-for-masquerade ; }\n`));
        const vip = `172.31.253.${c + 1}`;
        const eps = Array.from({ length: 5 }, (_, k) => `10.250.${c}.${k + 1}`);
        push('Service added (ClusterIP, 5 endpoints)', await timedNft(r, v.serviceAdded(c, vip, eps)));
        push('Service deleted', await timedNft(r, v.serviceDeleted(c, vip, eps)));
      }
    });
    if (n >= o.connectMin) p.connect![vn] = await connectThrough(nss, 'vp', text, opts);
  }
  if (o.perService) {
    p.coldMs['per-service'] = await fresh((r) => timedNft(r, prototypeTable(n, o.endpoints, stride, true), o.timeoutS * 1000));
    log(`N=${n}: per-Service named data maps, cold start ${fmtMs(p.coldMs['per-service'])} (load ${load1()})`);
  }
  if (n >= o.connectMin) p.connect!.kproxy = await connectThrough(nss, 'vk', kproxyText, opts);
  for (const [k, c] of Object.entries(p.connect ?? {})) {
    const t = c.targets;
    log(
      `N=${n} connect ${k}: first ${t.first.p50Ms.toFixed(3)}/${t.first.p99Ms.toFixed(3)}, last ${t.last.p50Ms.toFixed(3)}/${t.last.p99Ms.toFixed(3)}, pod ${t.pod.p50Ms.toFixed(3)}/${t.pod.p99Ms.toFixed(3)} ms; ` +
        `reached first ${JSON.stringify(c.reached.first)} last ${JSON.stringify(c.reached.last)}; load ${c.load}`,
    );
  }
  return cheap;
}

export async function nftValidation(o: ValidationOptions, log: (l: string) => void): Promise<SizeResult[]> {
  if (process.getuid?.() !== 0) throw new Error('KPROXY_BENCH_ROOT: run as root (rules are written in kpb-* namespaces)');
  const nss = new Namespaces(`${process.pid}v`);
  const out: SizeResult[] = [];
  let protoOk = true;
  try {
    for (const n of o.sizes) {
      const res: SizeResult = { n, load: [], kproxyColdMs: NaN, samples: {} };
      out.push(res);
      await kproxyTable(nss, n, o, res, log);
      if (n <= o.protoMax && protoOk) {
        try {
          protoOk = await prototype(nss, n, o, res, log);
        } catch (e) {
          res.proto!.error = (e as Error).message.split('\n')[0].slice(0, 300);
          log(`N=${n}: prototype failed: ${res.proto!.error}`);
          protoOk = false;
        }
        if (!protoOk) log(`N=${n}: the prototype's cold start exceeded ${o.protoBudgetS} s (or failed): larger sizes skip it`);
      }
      res.load.push(load1());
    }
  } finally {
    await nss.deleteAll();
  }
  return out;
}

export function validationTables(rows: SizeResult[]): string {
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r.samples)))];
  const m = (xs?: number[]) => (xs?.length ? fmtMs(median(xs)) : '–');
  const L = [
    `| measure (median of ${rows[0] ? Object.values(rows[0].samples)[0]?.length ?? 0 : 0}, ms) | ${rows.map((r) => r.n.toLocaleString('en-US')).join(' | ')} |`,
    `|---|${rows.map(() => '---:').join('|')}|`,
    `| kproxy cold start (NftProxier.sync full) | ${rows.map((r) => fmtMs(r.kproxyColdMs)).join(' | ')} |`,
    ...keys.map((k) => `| ${k} | ${rows.map((r) => m(r.samples[k])).join(' | ')} |`),
    `| load average (1 min) during the size | ${rows.map((r) => r.load.join(' / ')).join(' | ')} |`,
  ];
  const pr = rows.filter((r) => r.proto);
  if (pr.length) {
    const pk = [...new Set(pr.flatMap((r) => Object.keys(r.proto!.samples)))];
    L.push(
      '',
      `| prototype shape (ms) | ${pr.map((r) => r.n.toLocaleString('en-US')).join(' | ')} |`,
      `|---|${pr.map(() => '---:').join('|')}|`,
      `| raw nft -f, kproxy's table (cold) | ${pr.map((r) => fmtMs(r.proto!.kproxyRawMs)).join(' | ')} |`,
      ...['wide', 'slots', 'per-service'].map((v) => `| raw nft -f, prototype ${v} (cold) | ${pr.map((r) => fmtMs(r.proto!.coldMs[v])).join(' | ')} |`),
      ...pk.map((k) => `| ${k} | ${pr.map((r) => m(r.proto!.samples[k])).join(' | ')} |`),
    );
    const cr = pr.filter((r) => Object.keys(r.proto!.connect ?? {}).length);
    if (cr.length) {
      L.push('', '| services | table | first Service p50 / p99 (ms) | last Service p50 / p99 | pod (no Service) p50 / p99 | failed | endpoints reached (first / last) | answers not from the Service\'s endpoints | load |', '|---:|---|---:|---:|---:|---:|---:|---:|---:|');
      for (const r of cr) {
        for (const [name, c] of Object.entries(r.proto!.connect!)) {
          const t = c.targets;
          const f = (x: Latency) => `${x.p50Ms.toFixed(3)} / ${x.p99Ms.toFixed(3)}`;
          L.push(
            `| ${r.n.toLocaleString('en-US')} | ${name} | ${f(t.first)} | ${f(t.last)} | ${f(t.pod)} | ${t.first.failed + t.last.failed + t.pod.failed} | ${c.reached.first.distinct} / ${c.reached.last.distinct} | ${c.reached.first.wrong + c.reached.last.wrong} | ${c.load} |`,
          );
        }
      }
    }
    for (const r of pr) if (r.proto!.error) L.push('', `N=${r.n}: prototype error: ${r.proto!.error}`);
  }
  return L.join('\n');
}

async function main(): Promise<void> {
  const { values } = parseArgs({
    options: {
      quick: { type: 'boolean', default: false },
      sizes: { type: 'string' },
      endpoints: { type: 'string', default: '5' },
      reps: { type: 'string' },
      'proto-max': { type: 'string', default: '10000' },
      'proto-budget': { type: 'string', default: '20' },
      connects: { type: 'string' },
      'connect-min': { type: 'string', default: '1000' },
      'per-service': { type: 'boolean', default: false },
      variants: { type: 'string', default: 'wide,slots' },
      timeout: { type: 'string', default: '300' },
    },
  });
  const q = values.quick!;
  const o: ValidationOptions = {
    sizes: (values.sizes ?? (q ? '100,1000' : '100,1000,10000')).split(',').map(Number),
    endpoints: Number(values.endpoints),
    reps: Number(values.reps ?? (q ? 5 : 7)),
    protoMax: Number(values['proto-max']),
    protoBudgetS: Number(values['proto-budget']),
    connects: Number(values.connects ?? (q ? 100 : 300)),
    connectMin: Number(values['connect-min']),
    perService: values['per-service']!,
    variants: values.variants!.split(',').filter(Boolean),
    timeoutS: Number(values.timeout),
  };
  if (o.sizes.some((n) => !Number.isInteger(n) || n < 1 || n > 30_000)) throw new Error('KPROXY_BENCH_ARGS: --sizes wants integers 1..30000');
  if (o.variants.some((v) => !VARIANTS[v])) throw new Error(`KPROXY_BENCH_ARGS: --variants wants a list of ${Object.keys(VARIANTS).join(', ')}`);
  if (o.endpoints < 1 || o.endpoints > 15) throw new Error('KPROXY_BENCH_ARGS: --endpoints wants 1..15');
  const started = new Date().toISOString();
  const load = os.loadavg().map((x) => x.toFixed(1)).join(' ');
  const rows = await nftValidation(o, (l) => process.stderr.write(l + '\n'));
  process.stdout.write(`nft-validation, ${started}, ${os.cpus().length} CPUs, kernel ${os.release()}, load average at start ${load}, at end ${os.loadavg().map((x) => x.toFixed(1)).join(' ')}\n\n`);
  process.stdout.write(validationTables(rows) + '\n');
}

if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  main().catch((e: Error) => {
    process.stderr.write(`${e.message}\n`);
    process.exitCode = 1;
  });
}
