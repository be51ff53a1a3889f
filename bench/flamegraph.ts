// A V8 .cpuprofile (node --cpu-prof) drawn as a flame graph SVG: one box per call stack
// frame, its width the share of samples spent in it and below, the root at the bottom, the
// callers below their callees; (idle) and (program) are kept so the reader sees how busy
// the process was. No dependency: the profile's node tree already holds the stacks.
//   node --import tsx bench/flamegraph.ts PROFILE.cpuprofile OUT.svg [--title TEXT] [--min-pct 0.3]
import { readFileSync, writeFileSync } from 'node:fs';
import { parseArgs } from 'node:util';

export interface CpuProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
export interface CpuProfile {
  nodes: CpuProfileNode[];
  samples: number[];
  timeDeltas?: number[];
}

export interface Frame {
  name: string;
  /** samples in this frame and everything it called */
  total: number;
  self: number;
  children: Frame[];
}

/** "fn file:line" with node_modules/src/bench paths shortened and node internals as node:x. */
export function frameName(f: CpuProfileNode['callFrame']): string {
  const file = f.url.replace(/^file:\/\//, '').replace(/^.*\/(node_modules|src|bench|test)\//, '$1/');
  return `${f.functionName || '(anonymous)'}${file ? ` ${file}:${f.lineNumber + 1}` : ''}`;
}

/**
 * The profile's call tree with sample counts (children sorted by name, as flame graphs are).
 * busyOnly leaves out the (idle) samples, so widths are shares of the time the process worked.
 */
export function callTree(p: CpuProfile, busyOnly = false): Frame {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const selfCount = new Map<number, number>();
  for (const id of p.samples) selfCount.set(id, (selfCount.get(id) ?? 0) + 1);
  const hasParent = new Set<number>();
  for (const n of p.nodes) for (const c of n.children ?? []) hasParent.add(c);
  const root = p.nodes.find((n) => !hasParent.has(n.id));
  if (!root) throw new Error('profile without a root node');
  const build = (n: CpuProfileNode, depth: number): Frame => {
    const children = depth > 200 ? [] : (n.children ?? []).map((c) => build(byId.get(c)!, depth + 1)).filter((c) => c.total > 0);
    // Same-named siblings (one function reached from two call sites of one caller) merge.
    const merged = new Map<string, Frame>();
    for (const c of children) {
      const m = merged.get(c.name);
      if (!m) merged.set(c.name, c);
      else {
        m.total += c.total;
        m.self += c.self;
        m.children.push(...c.children);
      }
    }
    const self = busyOnly && n.callFrame.functionName === '(idle)' ? 0 : selfCount.get(n.id) ?? 0;
    const kids = [...merged.values()].sort((a, b) => (a.name < b.name ? -1 : 1));
    return { name: n.callFrame.functionName === '(root)' ? 'all' : frameName(n.callFrame), self, total: self + kids.reduce((s, c) => s + c.total, 0), children: kids };
  };
  return build(root, 0);
}

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');

function colour(name: string): string {
  if (name.startsWith('(')) return '#c8c8c8';
  if (name.includes(' src/')) return '#e15759';
  if (name.includes(' node:')) return '#f28e2b';
  if (name.includes(' node_modules/')) return '#76b7b2';
  return '#edc948';
}

/** The flame graph: frames narrower than minPct of all samples are left out. */
export function flameSvg(tree: Frame, opts: { title: string; subtitle?: string; width?: number; minPct?: number; busyNote?: boolean }): string {
  const W = opts.width ?? 1200;
  const rowH = 17;
  const minPct = opts.minPct ?? 0.3;
  const total = tree.total || 1;
  const boxes: { x: number; depth: number; w: number; f: Frame }[] = [];
  let maxDepth = 0;
  const place = (f: Frame, x: number, depth: number) => {
    const w = (f.total / total) * (W - 20);
    if ((100 * f.total) / total < minPct) return;
    boxes.push({ x, depth, w, f });
    maxDepth = Math.max(maxDepth, depth);
    let cx = x;
    for (const c of f.children) {
      place(c, cx, depth + 1);
      cx += (c.total / total) * (W - 20);
    }
  };
  place(tree, 10, 0);
  const top = 56;
  const H = top + (maxDepth + 1) * rowH + 30;
  const out = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" font-family="monospace" font-size="11">`,
    `<rect width="100%" height="100%" fill="white"/>`,
    `<text x="10" y="20" font-family="sans-serif" font-size="15" font-weight="bold">${esc(opts.title)}</text>`,
    `<text x="10" y="38" font-family="sans-serif" font-size="12" fill="#555">${esc(opts.subtitle ?? '')} ${total} samples${opts.busyNote ? ' (idle left out)' : ''}; width = share of samples; red = kproxy (src/), orange = node: internals, grey = native/idle; hover for names</text>`,
  ];
  for (const b of boxes) {
    const y = H - 30 - (b.depth + 1) * rowH;
    const pct = ((100 * b.f.total) / total).toFixed(1);
    const label = `${b.f.name} (${pct} %, self ${((100 * b.f.self) / total).toFixed(1)} %)`;
    out.push(`<g><title>${esc(label)}</title><rect x="${b.x.toFixed(1)}" y="${y}" width="${Math.max(0.5, b.w - 0.5).toFixed(1)}" height="${rowH - 1}" fill="${colour(b.f.name)}" rx="1"/>`);
    const chars = Math.floor((b.w - 6) / 6.6);
    if (chars >= 4) {
      const text = label.length > chars ? `${label.slice(0, chars - 1)}…` : label;
      out.push(`<text x="${(b.x + 3).toFixed(1)}" y="${y + 12}">${esc(text)}</text>`);
    }
    out.push('</g>');
  }
  out.push('</svg>');
  return out.join('\n');
}

async function main(): Promise<void> {
  const { values, positionals } = parseArgs({ allowPositionals: true, options: { title: { type: 'string' }, subtitle: { type: 'string' }, busy: { type: 'boolean', default: false }, 'min-pct': { type: 'string', default: '0.3' } } });
  const [input, output] = positionals;
  if (!input || !output) throw new Error('usage: bench/flamegraph.ts PROFILE.cpuprofile OUT.svg [--title TEXT]');
  const p = JSON.parse(readFileSync(input, 'utf8')) as CpuProfile;
  writeFileSync(output, flameSvg(callTree(p, values.busy), { title: values.title ?? input, subtitle: values.subtitle, busyNote: values.busy, minPct: Number(values['min-pct']) }));
}

if (process.argv[1]?.endsWith('bench/flamegraph.ts')) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
