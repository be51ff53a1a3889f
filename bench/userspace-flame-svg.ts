// `perf script` text → folded stacks → a flame graph as one self-contained SVG (no script,
// a <title> per frame for its name, samples and share), and the share of the samples per
// kind of code. Used by bench/userspace-flame.ts; pure functions, no I/O.
//
// Folded stacks are Brendan Gregg's format ("root;caller;leaf COUNT" per line), so the
// .folded files also open in other flame graph tools (speedscope, inferno, flamegraph.pl).

/** Counts per stack, root first, frames joined by ';'. */
export type Folded = Map<string, number>;

/** Names an address of a process's JIT code; undefined when no code was there. */
export type Resolver = (addr: number) => string | undefined;

/**
 * A resolver over a /tmp/perf-PID.map (`start size name` per line, hex, in the order V8
 * wrote them). V8 reuses the addresses of freed code, so ranges overlap: the entry written
 * last wins (perf itself picks one of the overlapping ones at random, and a long-lived
 * process's hot functions come out named after start-up code that was once there).
 */
export function perfMapResolver(text: string): Resolver {
  const starts: number[] = [];
  const ends: number[] = [];
  const names: string[] = [];
  for (const line of text.split('\n')) {
    const m = /^([0-9a-fA-F]+) ([0-9a-fA-F]+) (.*)$/.exec(line);
    if (!m) continue;
    const start = parseInt(m[1], 16);
    starts.push(start);
    ends.push(start + parseInt(m[2], 16));
    names.push(m[3]);
  }
  // Entries sorted by start (ties: later written last); a lookup walks back from the last
  // entry starting at or below the address, as far as the longest entry reaches.
  const order = starts.map((_, i) => i).sort((a, b) => starts[a] - starts[b] || a - b);
  const sStart = order.map((i) => starts[i]);
  let maxLen = 0;
  for (let i = 0; i < starts.length; i++) maxLen = Math.max(maxLen, ends[i] - starts[i]);
  const cache = new Map<number, string | undefined>();
  return (addr) => {
    if (cache.has(addr)) return cache.get(addr);
    let lo = 0;
    let hi = sStart.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (sStart[mid] <= addr) lo = mid + 1;
      else hi = mid;
    }
    let best = -1;
    for (let j = lo - 1; j >= 0 && sStart[j] > addr - maxLen - 1; j--) {
      const i = order[j];
      if (addr < ends[i] && i > best) best = i;
    }
    const name = best >= 0 ? names[best] : undefined;
    cache.set(addr, name);
    return name;
  };
}

/**
 * Parses `perf script` output (the default fields: a header line per sample, then one
 * indented `addr symbol+off (dso)` line per frame, leaf first, a blank line after) into
 * folded stacks rooted at `root`. Frames in a process's JIT code are named by `jit` (its
 * perf map, by pid) when given; other unknown symbols are named by their DSO.
 */
export function foldPerfScript(text: string, root: string, jit: Map<number, Resolver> = new Map()): Folded {
  const out: Folded = new Map();
  let frames: string[] = [];
  let inSample = false;
  let resolve: Resolver | undefined;
  const flush = () => {
    if (inSample && frames.length) {
      const key = [root, ...frames.reverse()].join(';');
      out.set(key, (out.get(key) ?? 0) + 1);
    }
    frames = [];
    inSample = false;
  };
  for (const line of text.split('\n')) {
    if (line.trim() === '') {
      flush();
      continue;
    }
    if (!/^\s/.test(line)) {
      flush();
      inSample = true;
      resolve = jit.get(Number(/^\S.*?\s(\d+)(?:\/\d+)?\s/.exec(line)?.[1]));
      continue;
    }
    const m = /^\s*([0-9a-f]+)\s+(.*?)\s+\(([^)]*)\)\s*$/.exec(line);
    if (!m) continue;
    const dso = m[3];
    let sym = m[2].replace(/\+0x[0-9a-f]+$/, '');
    if (resolve && (/perf-\d+\.map$/.test(dso) || dso === '[unknown]')) sym = resolve(parseInt(m[1], 16)) ?? sym;
    if (sym === '[unknown]' || sym === '') sym = dso.startsWith('[') ? dso : `[${dso.split('/').pop() || 'unknown'}]`;
    if (dso === '[kernel.kallsyms]') sym += '_[k]';
    frames.push(sym.replace(/;/g, ':'));
  }
  flush();
  return out;
}

export function foldedText(f: Folded): string {
  return [...f].sort((a, b) => (a[0] < b[0] ? -1 : 1)).map(([k, n]) => `${k} ${n}`).join('\n') + '\n';
}

export function parseFolded(text: string): Folded {
  const out: Folded = new Map();
  for (const line of text.split('\n')) {
    const i = line.lastIndexOf(' ');
    if (i > 0) out.set(line.slice(0, i), (out.get(line.slice(0, i)) ?? 0) + Number(line.slice(i + 1)));
  }
  return out;
}

export type Kind = 'kernel' | 'js' | 'gc' | 'node/v8' | 'libuv' | 'libc' | 'other';

/**
 * The kind of a frame: the kernel's, JavaScript (--perf-basic-prof names: "JS:*name",
 * "LazyCompile:", "Builtin:", "Function:"...), V8's garbage collector, the rest of node's
 * binary (V8, bindings), libuv, libc.
 */
export function kindOf(frame: string): Kind {
  if (frame.endsWith('_[k]')) return 'kernel';
  if (/^(JS|LazyCompile|Function|Builtin|BytecodeHandler|Stub|Handler|InterpretedFunction|Script|RegExp|Baseline|Maglev|Turbofan|Sparkplug):/.test(frame)) return 'js';
  if (/Heap::|Scavenge|MarkCompact|MinorMC|Sweeper|ConcurrentMarking|GCTracer|MemoryAllocator|Evacuat|IncrementalMarking|MemoryReducer|\bGC\b/.test(frame)) return 'gc';
  if (/^uv_|^uv__/.test(frame)) return 'libuv';
  if (/^\[perf-\d+\.map\]$/.test(frame)) return 'js';
  if (/^\[libc|^__libc|^_?_?mem(cpy|move|set)|^malloc|^free$|^cfree|^_int_|^__GI_|^(read|write|writev|epoll_wait|epoll_pwait|epoll_ctl|syscall|accept4|__socket|__close|close|__getsockopt|__libc_connect|recv|send|clock_gettime)(@|$)|^__(write|read|close|accept|connect|send|recv|socket|setsockopt|getsockopt|shutdown)|^pthread_|^__pthread|^__GI___pthread/.test(frame)) return 'libc';
  if (/^\[node\]$|^node::|^v8::|^Builtins_|^non-virtual thunk to (node|v8)::|^std::|^cppgc::/.test(frame)) return 'node/v8';
  return 'other';
}

const COLORS: Record<Kind, [number, number, number]> = {
  kernel: [230, 140, 60],
  js: [90, 170, 90],
  gc: [200, 70, 160],
  'node/v8': [220, 200, 70],
  libuv: [80, 160, 220],
  libc: [240, 110, 100],
  other: [170, 170, 170],
};

/** Self samples per kind of leaf frame, as fractions of all samples. */
export function selfShares(f: Folded): Record<Kind, number> {
  const s: Record<Kind, number> = { kernel: 0, js: 0, gc: 0, 'node/v8': 0, libuv: 0, libc: 0, other: 0 };
  let total = 0;
  for (const [k, n] of f) {
    const frames = k.split(';');
    // GC: any sample under the collector counts as GC, whatever its leaf.
    const kind = frames.some((x) => kindOf(x) === 'gc') ? 'gc' : kindOf(frames[frames.length - 1]);
    s[kind] += n;
    total += n;
  }
  for (const k of Object.keys(s) as Kind[]) s[k] = total ? s[k] / total : 0;
  return s;
}

/** Share of the samples whose stack has a frame matching `re` (inclusive time). */
export function inclusiveShare(f: Folded, re: RegExp): number {
  let hit = 0;
  let total = 0;
  for (const [k, n] of f) {
    total += n;
    if (k.split(';').some((x) => re.test(x))) hit += n;
  }
  return total ? hit / total : 0;
}

interface Node { name: string; n: number; kids: Map<string, Node> }

function tree(f: Folded): Node {
  const top: Node = { name: 'all', n: 0, kids: new Map() };
  for (const [k, n] of f) {
    top.n += n;
    let at = top;
    for (const name of k.split(';')) {
      let next = at.kids.get(name);
      if (!next) at.kids.set(name, (next = { name, n: 0, kids: new Map() }));
      next.n += n;
      at = next;
    }
  }
  return top;
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

/** A flame graph (root at the bottom, children sorted by name as flamegraph.pl does). */
export function flameSvg(f: Folded, title: string, subtitle = ''): string {
  const W = 1200;
  const FH = 16;
  const pad = 10;
  const root = tree(f);
  let depth = 0;
  const rects: string[] = [];
  const minW = 0.3;
  const walk = (nd: Node, x: number, d: number) => {
    const w = ((W - 2 * pad) * nd.n) / root.n;
    if (w < minW) return;
    depth = Math.max(depth, d);
    rects.push(`${x.toFixed(2)}|${d}|${w.toFixed(2)}|${nd.name}|${nd.n}`);
    let cx = x;
    for (const k of [...nd.kids.values()].sort((a, b) => (a.name < b.name ? -1 : 1))) {
      walk(k, cx, d + 1);
      cx += ((W - 2 * pad) * k.n) / root.n;
    }
  };
  walk(root, pad, 0);
  const top = 56;
  const H = top + (depth + 1) * FH + 40;
  const shares = selfShares(f);
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="monospace" font-size="11">`,
    `<rect width="100%" height="100%" fill="#fdfdf6"/>`,
    `<text x="${W / 2}" y="20" text-anchor="middle" font-family="sans-serif" font-size="15" font-weight="bold">${esc(title)}</text>`,
    `<text x="${W / 2}" y="38" text-anchor="middle" font-family="sans-serif" fill="#555">${esc(subtitle)}</text>`,
  ];
  let lx = pad;
  for (const k of Object.keys(COLORS) as Kind[]) {
    const [r, g, b] = COLORS[k];
    out.push(`<rect x="${lx}" y="${H - 22}" width="12" height="12" fill="rgb(${r},${g},${b})"/><text x="${lx + 16}" y="${H - 12}" font-family="sans-serif">${k} ${(shares[k] * 100).toFixed(1)}% self</text>`);
    lx += 150;
  }
  for (const r of rects) {
    const [xs, ds, ws, name, ns] = r.split('|');
    const x = Number(xs);
    const d = Number(ds);
    const w = Number(ws);
    const y = H - 40 - (d + 1) * FH;
    const [cr, cg, cb] = COLORS[d === 0 ? 'other' : kindOf(name)];
    // A little variation per name so neighbours stay apart, stable across runs.
    let h = 0;
    for (let i = 0; i < name.length; i++) h = (h * 31 + name.charCodeAt(i)) >>> 0;
    const v = (h % 30) - 15;
    const c = (x: number) => Math.max(0, Math.min(255, x + v));
    const pct = ((100 * Number(ns)) / root.n).toFixed(2);
    const label = w > 30 ? name.slice(0, Math.floor((w - 4) / 6.6)) : '';
    out.push(`<g><title>${esc(name)} (${ns} samples, ${pct}%)</title><rect x="${x}" y="${y}" width="${w}" height="${FH - 1}" fill="rgb(${c(cr)},${c(cg)},${c(cb)})" rx="1"/>` +
      (label ? `<text x="${(x + 3).toFixed(2)}" y="${y + 11}">${esc(label)}</text>` : '') + '</g>');
  }
  out.push('</svg>');
  return out.join('\n') + '\n';
}
