// Where a userspace proxy's busy CPU goes, from its .cpuprofile (bench/userspace-profile.ts
// --keep DIR): each sample's own frame put in one bucket, as a share of the samples that
// were not (idle):
//   syscalls        native binding calls (writeBuffer, close, connect via internalConnect or
//                   tcp-raw's dialTo, readStart, shutdown, getpeername, reset...): the work
//                   the kernel does
//   net/streams     node:net, node:internal/streams, stream_base_commons, events, timers,
//                   nextTick queues: the net.Socket and Duplex machinery
//   kproxy          kproxy's own code (src/, bench/)
//   V8 / libuv      (program) and (garbage collector): the engine and the event loop
//   other           the rest (the loader's worker, node's other internals)
//   node --import tsx bench/userspace-profile-split.ts A.cpuprofile [B.cpuprofile ...] [--cpu-us N,M,...]
// --cpu-us gives each profile's proxy CPU per request (µs, from the profile bench's table):
// the buckets are then printed in µs per request too.
import { readFileSync } from 'node:fs';
import { basename } from 'node:path';
import { parseArgs } from 'node:util';
import type { CpuProfile } from './flamegraph.ts';

export type Bucket = 'syscalls' | 'net/streams' | 'kproxy' | 'V8 / libuv' | 'other';
export const BUCKETS: Bucket[] = ['syscalls', 'net/streams', 'kproxy', 'V8 / libuv', 'other'];

const MACHINERY = /^node:(net|events|internal\/(streams\/|stream_base_commons|net|timers|process\/task_queues|async_hooks|dtrace|validators|errors|util))/;

/** The bucket of a frame (its own self time), null for (idle). */
export function bucketOf(f: { functionName: string; url: string }): Bucket | null {
  const name = f.functionName;
  if (name === '(idle)') return null;
  if (name === '(program)' || name === '(garbage collector)') return 'V8 / libuv';
  // internalConnect's (node:net) and dialTo's (tcp-raw.ts) own time is the connect(2) of the
  // native handle.connect they call: the profiler shows no frame of its own for that call.
  if (f.url === '' || name === 'internalConnect' || (name === 'dialTo' && f.url.endsWith('tcp-raw.ts'))) return 'syscalls';
  if (/\/(src|bench)\//.test(f.url)) return 'kproxy';
  if (MACHINERY.test(f.url)) return 'net/streams';
  return 'other';
}

/** Share (%) of busy samples per bucket. */
export function splitProfile(p: CpuProfile): Record<Bucket, number> {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const counts: Record<Bucket, number> = { syscalls: 0, 'net/streams': 0, kproxy: 0, 'V8 / libuv': 0, other: 0 };
  let busy = 0;
  for (const id of p.samples) {
    const b = bucketOf(byId.get(id)!.callFrame);
    if (!b) continue;
    counts[b]++;
    busy++;
  }
  for (const b of BUCKETS) counts[b] = busy ? (100 * counts[b]) / busy : 0;
  return counts;
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const { values, positionals } = parseArgs({ allowPositionals: true, options: { 'cpu-us': { type: 'string' } } });
  const cpu = values['cpu-us']?.split(',').map(Number) ?? [];
  console.log(`| profile | ${BUCKETS.join(' | ')} |`);
  console.log(`|---|${BUCKETS.map(() => '---:').join('|')}|`);
  positionals.forEach((file, i) => {
    const s = splitProfile(JSON.parse(readFileSync(file, 'utf8')) as CpuProfile);
    const us = cpu[i];
    const cell = (b: Bucket) => `${s[b].toFixed(1)} %${us ? ` (${((s[b] * us) / 100).toFixed(0)} µs)` : ''}`;
    console.log(`| ${basename(file, '.cpuprofile')}${us ? ` (${us} µs/req)` : ''} | ${BUCKETS.map(cell).join(' | ')} |`);
  });
}
