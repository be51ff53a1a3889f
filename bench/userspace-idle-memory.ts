// Where an idle spliced connection's memory goes, on the net.Socket path (src/modes/userspace/dataplane/tcp.ts):
// one TcpForwarder in THIS process (so its JS heap can be measured), a backend that accepts
// and holds connections and a client that opens N idle ones in two child processes, all on
// 127.0.0.1. After the N pairs are spliced and a full GC, prints per pair:
//   - process.memoryUsage() deltas: RSS, V8 heap used, external, array buffers;
//   - with --snapshot: the objects the N pairs added (two heap snapshots diffed by
//     constructor/type name: count per pair and bytes per pair), the largest first;
//   - the listeners per event of one client and one upstream socket, and the active handles
//     and timers (process.getActiveResourcesInfo()).
//
// With --churn M, then: M short connections (16 at a time: connect, one byte echoed, close)
// and this process's CPU time (user + system) per connection: a figure of the JS work per
// new connection that the machine's load moves less than a rate. --tree DIR takes
// TcpForwarder from another tree (e.g. main, unpacked with git archive), for a before/after
// with the same harness.
//
//   node --expose-gc --import tsx bench/userspace-idle-memory.ts [--n 5000] [--snapshot] [--churn 20000] [--tree DIR] [--json FILE]
//
// Bounded: each phase has a deadline (60 s), children are killed on exit.
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import net from 'node:net';
import { parseArgs } from 'node:util';
import v8 from 'node:v8';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { silentLogger } from '../src/log.ts';

const { values } = parseArgs({
  options: {
    n: { type: 'string', default: '5000' },
    snapshot: { type: 'boolean', default: false },
    churn: { type: 'string', default: '0' },
    tree: { type: 'string' },
    json: { type: 'string' },
  },
});
const tree = values.tree ? resolve(values.tree) : resolve(import.meta.dirname, '..');
const { TcpForwarder, newBudget, newCounters } = (await import(pathToFileURL(join(tree, 'src/modes/userspace/dataplane/tcp.ts')).href)) as typeof import('../src/modes/userspace/dataplane/tcp.ts');
const { RoundRobinBalancer } = (await import(pathToFileURL(join(tree, 'src/modes/userspace/dataplane/balancer.ts')).href)) as typeof import('../src/modes/userspace/dataplane/balancer.ts');
const N = Number(values.n);
const gc = (globalThis as { gc?: () => void }).gc;
if (!gc) throw new Error('run with node --expose-gc');

const children: ChildProcess[] = [];
process.on('exit', () => children.forEach((c) => c.kill('SIGKILL')));

/** A backend that accepts and holds connections and echoes what it reads (idle ones send nothing). */
const BACKEND = `
const net = require('node:net');
const held = new Set();
const s = net.createServer((c) => { c.on('error', () => {}); held.add(c); c.on('close', () => held.delete(c)); c.on('data', (d) => c.write(d)); });
s.listen(0, '127.0.0.1', () => process.stdout.write('port ' + s.address().port + '\\n'));
`;

function child(args: string[]): { proc: ChildProcess; out: () => string } {
  const proc = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(proc);
  let out = '';
  proc.stdout!.on('data', (b: Buffer) => (out += b.toString()));
  return { proc, out: () => out };
}

async function until(cond: () => boolean, what: string, ms = 60_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function settle(): NodeJS.MemoryUsage {
  for (let i = 0; i < 4; i++) gc!();
  return process.memoryUsage();
}

/** A heap snapshot's JSON text. */
function snapshotText(): Promise<string> {
  const chunks: string[] = [];
  const stream = v8.getHeapSnapshot();
  return new Promise<string>((resolve, reject) => {
    stream.on('data', (c: Buffer) => chunks.push(c.toString()));
    stream.on('end', () => resolve(chunks.join('')));
    stream.on('error', reject);
  });
}

/** Objects by "type:name" with count and self bytes, from a heap snapshot. */
async function census(): Promise<Map<string, { count: number; bytes: number }>> {
  settle();
  const snap = JSON.parse(await snapshotText()) as {
    snapshot: { meta: { node_fields: string[]; node_types: [string[]] } };
    nodes: number[];
    strings: string[];
  };
  const f = snap.snapshot.meta.node_fields;
  const types = snap.snapshot.meta.node_types[0];
  const width = f.length;
  const iType = f.indexOf('type');
  const iName = f.indexOf('name');
  const iSize = f.indexOf('self_size');
  const out = new Map<string, { count: number; bytes: number }>();
  for (let i = 0; i < snap.nodes.length; i += width) {
    const type = types[snap.nodes[i + iType]];
    let name = snap.strings[snap.nodes[i + iName]];
    // Strings, code and numbers by type only: their names are their contents.
    if (type === 'string' || type === 'number' || type === 'code' || type.includes('string') || type === 'regexp') name = '';
    const key = `${type}:${name.slice(0, 60)}`;
    const e = out.get(key) ?? { count: 0, bytes: 0 };
    e.count++;
    e.bytes += snap.nodes[i + iSize];
    out.set(key, e);
  }
  return out;
}

function listenerCounts(s: net.Socket): Record<string, number> {
  const r: Record<string, number> = {};
  for (const e of s.eventNames()) r[String(e)] = s.listenerCount(e);
  return r;
}

const backend = child(['-e', BACKEND]);
await until(() => /port \d+/.test(backend.out()), 'the backend');
const bePort = Number(/port (\d+)/.exec(backend.out())![1]);

const balancer = new RoundRobinBalancer({ stickyMaxAgeSeconds: 0 });
balancer.setEndpoints([{ key: `127.0.0.1:${bePort}`, ip: '127.0.0.1', port: bePort }]);
const counters = newCounters();
// The defaults kproxy runs with: a 24 h idle timeout (the sweep runs), a process budget.
const fwd = new TcpForwarder({ host: '127.0.0.1', port: 0, balancer, counters, log: silentLogger(), idleTimeoutMs: 24 * 3600_000, budget: newBudget(0) });
const port = await fwd.listen();

// Warm the paths (first connection allocates module-level state), then the baseline.
{
  const c = child(['--import', 'tsx', 'bench/userspace-idle-client.ts', '127.0.0.1', String(port), '10']);
  await until(() => c.out().includes('held') && counters.active === 10, 'the warm-up pairs');
  c.proc.kill('SIGKILL');
  await until(() => counters.active === 0, 'the warm-up pairs to close');
}
const resourcesBefore = process.getActiveResourcesInfo().length;
const before = settle();
const censusBefore = values.snapshot ? await census() : null;

const t0 = Date.now();
const idle = child(['--import', 'tsx', 'bench/userspace-idle-client.ts', '127.0.0.1', String(port), String(N)]);
await until(() => idle.out().includes('held'), `the client to hold ${N}`);
const clientHeld = Number(/held (\d+)/.exec(idle.out())![1]);
// A dial that fails (a loaded machine: the backend's accept queue full past every dial
// timeout) resets its client: per pair is then over the pairs actually spliced.
await until(() => counters.active + counters.failed >= clientHeld, `${clientHeld} spliced pairs (have ${JSON.stringify(counters)})`);
const held = counters.active;
if (counters.failed > 0) process.stderr.write(`${counters.failed} dials failed (${counters.retries} retries); measuring ${held} pairs\n`);
const openMs = Date.now() - t0;
// Before the GC: what the pairs kept plus the garbage their setup left (all of it when the
// young generation is large enough not to be collected meanwhile: --max-semi-space-size=256).
const unsettled = process.memoryUsage();
const after = settle();
const censusAfter = values.snapshot ? await census() : null;
const resourcesAfter = process.getActiveResourcesInfo();

// One client socket of the listener (its private set of clients) and its upstream (the
// client's peer: a symbol-keyed field, or its pair's upstream).
const internals = fwd as unknown as { clients?: Set<net.Socket>; open?: Set<net.Socket> };
const client0 = [...(internals.clients ?? internals.open ?? [])][0];
const field = (s: net.Socket | undefined, d: string): unknown => {
  const k = s && Object.getOwnPropertySymbols(s).find((x) => x.description === d);
  return k ? (s as unknown as Record<symbol, unknown>)[k] : undefined;
};
const upstream0 = (field(client0, 'kproxy.peer') ?? (field(client0, 'kproxy.pair') as { upstream?: net.Socket } | undefined)?.upstream) as net.Socket | undefined;
const per = (a: number, b: number) => Math.round((b - a) / held);
const report = {
  node: process.version,
  pairs: held,
  openMs,
  perPair: {
    rss: per(before.rss, after.rss),
    heapUsed: per(before.heapUsed, after.heapUsed),
    heapTotal: per(before.heapTotal, after.heapTotal),
    heapUsedBeforeGc: per(before.heapUsed, unsettled.heapUsed),
    external: per(before.external, after.external),
    arrayBuffers: per(before.arrayBuffers, after.arrayBuffers),
    activeResources: (resourcesAfter.length - resourcesBefore) / held,
  },
  resourceKinds: Object.fromEntries(
    [...new Set(resourcesAfter)].map((k) => [k, resourcesAfter.filter((x) => x === k).length]),
  ),
  listeners: { client: client0 ? listenerCounts(client0) : {}, upstream: upstream0 ? listenerCounts(upstream0) : {} },
  objects: [] as { what: string; perPair: number; bytesPerPair: number }[],
};
if (censusBefore && censusAfter) {
  for (const [k, a] of censusAfter) {
    const b = censusBefore.get(k) ?? { count: 0, bytes: 0 };
    const dc = (a.count - b.count) / held;
    const db = (a.bytes - b.bytes) / held;
    if (dc >= 0.5 || db >= 16) report.objects.push({ what: k, perPair: +dc.toFixed(2), bytesPerPair: Math.round(db) });
  }
  report.objects.sort((x, y) => y.bytesPerPair - x.bytesPerPair);
}

const lines = [
  `${tree}: node ${report.node}, ${held} idle spliced pairs (opened in ${openMs} ms), load ${(await import('node:os')).loadavg().map((x) => x.toFixed(2)).join(' ')}`,
  `per pair: RSS ${report.perPair.rss} B, V8 heap used ${report.perPair.heapUsed} B (committed ${report.perPair.heapTotal} B; before the GC ${report.perPair.heapUsedBeforeGc} B), external ${report.perPair.external} B, array buffers ${report.perPair.arrayBuffers} B, active resources ${report.perPair.activeResources}`,
  `active resources now: ${JSON.stringify(report.resourceKinds)}`,
  `listeners per event: ${JSON.stringify(report.listeners)}`,
];
if (report.objects.length) {
  lines.push('| object (heap snapshot type:name) | per pair | bytes per pair |', '|---|---:|---:|');
  for (const o of report.objects.slice(0, 30)) lines.push(`| ${o.what} | ${o.perPair} | ${o.bytesPerPair} |`);
  const total = report.objects.reduce((s, o) => s + o.bytesPerPair, 0);
  lines.push(`| total of the rows above (all rows) | | ${total} |`);
}
process.stdout.write(lines.join('\n') + '\n');
if (values.json) writeFileSync(values.json, JSON.stringify(report, null, 2));
idle.proc.kill('SIGKILL');

/** M connections, 16 at a time: connect, write one byte, close once it is echoed. */
const CHURN = `
const net = require('node:net');
const [port, total] = process.argv.slice(1).map(Number);
let started = 0, done = 0, failed = 0;
function one() {
  if (started >= total) return;
  started++;
  const c = net.connect({ host: '127.0.0.1', port });
  let ok = false;
  c.on('connect', () => c.write('x'));
  c.on('data', () => { ok = true; c.end(); });
  c.on('error', () => {});
  c.on('close', () => { done++; if (!ok) failed++; if (done === total) { process.stdout.write('done ' + failed + '\\n'); process.exit(0); } one(); });
}
for (let i = 0; i < 16; i++) one();
`;
const churnN = Number(values.churn);
if (churnN > 0) {
  await until(() => counters.active === 0, 'the idle pairs to close');
  const cpu0 = process.cpuUsage();
  const w0 = Date.now();
  const churn = child(['-e', CHURN, String(port), String(churnN)]);
  await until(() => churn.out().includes('done'), `${churnN} short connections`, 300_000);
  const cpu = process.cpuUsage(cpu0);
  const wallMs = Date.now() - w0;
  const failedChurn = Number(/done (\d+)/.exec(churn.out())![1]);
  const cpuUsPerConn = (cpu.user + cpu.system) / churnN;
  Object.assign(report, { churn: { connections: churnN, failed: failedChurn, cpuUsPerConn, userUsPerConn: cpu.user / churnN, systemUsPerConn: cpu.system / churnN, connPerSec: (churnN * 1000) / wallMs } });
  process.stdout.write(`churn: ${churnN} connections (${failedChurn} failed) in ${wallMs} ms: ${((churnN * 1000) / wallMs).toFixed(0)} conn/s; forwarder CPU ${cpuUsPerConn.toFixed(1)} µs per connection (user ${(cpu.user / churnN).toFixed(1)}, system ${(cpu.system / churnN).toFixed(1)})\n`);
  if (values.json) writeFileSync(values.json, JSON.stringify(report, null, 2));
}
fwd.destroy();
backend.proc.kill('SIGKILL');
process.exit(0);
