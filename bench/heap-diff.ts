// Compares two V8 heap snapshots (.heapsnapshot, e.g. written by bench/soak.ts --snapshot-at):
// the objects in each by type and constructor, and the groups that grew most in count and in
// shallow size. A leak shows as a group that grows with the time between the snapshots; a heap
// that settles shows no such group.
//
//   node --import tsx bench/heap-diff.ts A.heapsnapshot B.heapsnapshot [--top 25] [--json]
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { parseArgs } from 'node:util';

export interface Group {
  key: string;
  count: number;
  bytes: number;
}

interface Snapshot {
  snapshot: { meta: { node_fields: string[]; node_types: [string[], ...unknown[]] } };
  nodes: number[];
  strings: string[];
}

/** Objects by "type: name" (name = the constructor for objects, the type alone for strings, code and the like). */
export function groups(s: Snapshot): Map<string, Group> {
  const f = s.snapshot.meta.node_fields;
  const width = f.length;
  const [iType, iName, iSize] = ['type', 'name', 'self_size'].map((k) => f.indexOf(k));
  const types = s.snapshot.meta.node_types[0];
  const out = new Map<string, Group>();
  for (let i = 0; i < s.nodes.length; i += width) {
    const type = types[s.nodes[i + iType]];
    // strings, code, numbers and arrays are named by content: group them by type only
    const named = type === 'object' || type === 'closure' || type === 'native' || type === 'hidden';
    const key = named ? `${type}: ${s.strings[s.nodes[i + iName]].slice(0, 80)}` : type;
    const g = out.get(key) ?? { key, count: 0, bytes: 0 };
    g.count++;
    g.bytes += s.nodes[i + iSize];
    out.set(key, g);
  }
  return out;
}

export interface Diff {
  key: string;
  countA: number;
  countB: number;
  bytesA: number;
  bytesB: number;
}

export function diff(a: Map<string, Group>, b: Map<string, Group>): Diff[] {
  const keys = new Set([...a.keys(), ...b.keys()]);
  return [...keys].map((key) => ({
    key, countA: a.get(key)?.count ?? 0, countB: b.get(key)?.count ?? 0, bytesA: a.get(key)?.bytes ?? 0, bytesB: b.get(key)?.bytes ?? 0,
  }));
}

function load(file: string): Map<string, Group> {
  return groups(JSON.parse(readFileSync(file, 'utf8')) as Snapshot);
}

if (process.argv[1] && resolve(process.argv[1]) === resolve(import.meta.filename)) {
  const { values, positionals } = parseArgs({ allowPositionals: true, options: { top: { type: 'string', default: '25' }, json: { type: 'boolean', default: false } } });
  if (positionals.length !== 2) throw new Error('usage: node --import tsx bench/heap-diff.ts A.heapsnapshot B.heapsnapshot [--top 25] [--json]');
  const [a, b] = positionals.map(load);
  const d = diff(a, b);
  const total = (m: Map<string, Group>) => [...m.values()].reduce((s, g) => ({ count: s.count + g.count, bytes: s.bytes + g.bytes }), { count: 0, bytes: 0 });
  const ta = total(a), tb = total(b);
  const top = Number(values.top);
  const byCount = [...d].sort((x, y) => y.countB - y.countA - (x.countB - x.countA)).slice(0, top);
  const byBytes = [...d].sort((x, y) => y.bytesB - y.bytesA - (x.bytesB - x.bytesA)).slice(0, top);
  if (values.json) {
    console.log(JSON.stringify({ totalA: ta, totalB: tb, byCount, byBytes }, null, 1));
  } else {
    const kib = (n: number) => (n / 1024).toFixed(1);
    console.log(`objects ${ta.count} → ${tb.count} (${tb.count - ta.count >= 0 ? '+' : ''}${tb.count - ta.count}), shallow ${kib(ta.bytes)} → ${kib(tb.bytes)} KiB`);
    const row = (x: Diff) => `| ${x.key} | ${x.countA} | ${x.countB} | ${x.countB - x.countA} | ${kib(x.bytesA)} | ${kib(x.bytesB)} | ${kib(x.bytesB - x.bytesA)} |`;
    const head = '| group | count A | count B | Δ | KiB A | KiB B | Δ KiB |\n|---|---:|---:|---:|---:|---:|---:|';
    console.log(`\nmost grown in count\n${head}\n${byCount.map(row).join('\n')}`);
    console.log(`\nmost grown in size\n${head}\n${byBytes.map(row).join('\n')}`);
  }
}
