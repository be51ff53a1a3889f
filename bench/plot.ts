// A small hand-written SVG line plot for the scale bench: x = number of services (log),
// y = a time (log or linear), one line per series, dashed lines for references. Pure.

export interface Series {
  label: string;
  color: string;
  dash?: boolean;
  /** [N, value]; values that are not finite are left out */
  points: Array<[number, number]>;
}

export interface PlotOptions {
  title: string;
  subtitle: string;
  yLabel: string;
  logY?: boolean;
  /** linear axis only: its bottom (default 0), for values that sit far from 0 (ratios near 1) */
  yMin?: number;
  /** formats a y value for ticks and point labels */
  fmt?: (v: number) => string;
  /** x on a linear axis from 0 (a time series) instead of the log axis of N */
  linearX?: boolean;
  /** the x axis' label (default: services N) */
  xLabel?: string;
}

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

export function defaultFmt(ms: number): string {
  if (ms >= 10_000) return `${(ms / 1000).toFixed(0)} s`;
  if (ms >= 1_000) return `${(ms / 1000).toFixed(1)} s`;
  if (ms >= 10) return `${ms.toFixed(0)} ms`;
  if (ms >= 1) return `${ms.toFixed(1)} ms`;
  return `${ms.toFixed(2)} ms`;
}

function wrap(text: string, width: number): string[] {
  const out: string[] = [];
  let line = '';
  for (const w of text.split(' ')) {
    if (line && (line + ' ' + w).length > width) {
      out.push(line);
      line = w;
    } else line = line ? `${line} ${w}` : w;
  }
  if (line) out.push(line);
  return out;
}

/** A round step (1, 2 or 5 × 10^k) that cuts 0..max into at most 8 parts. */
function niceStep(max: number): number {
  const mag = 10 ** Math.floor(Math.log10(max));
  return [1, 2, 5, 10].map((m) => m * mag).find((s) => max / s <= 8) ?? 10 * mag;
}

export function linePlotSVG(series: Series[], o: PlotOptions): string {
  const fmt = o.fmt ?? defaultFmt;
  const W = 800, H = 460, L = 74, R = 210, T = 58, B = 56;
  const pw = W - L - R, ph = H - T - B;
  const live = series.map((s) => ({ ...s, points: s.points.filter((p) => Number.isFinite(p[1]) && p[1] > 0 && (o.linearX ? p[0] >= 0 : p[0] > 0)) })).filter((s) => s.points.length);
  const xs = live.flatMap((s) => s.points.map((p) => p[0]));
  const ys = live.flatMap((s) => s.points.map((p) => p[1]));
  let xlo = Math.log10(xs.length ? Math.min(...xs) : 10), xhi = Math.log10(xs.length ? Math.max(...xs) : 100);
  if (xhi - xlo < 1) { xlo -= 0.5; xhi += 0.5; }
  xlo -= 0.1; xhi += 0.1;
  const xmax = Math.max(1e-9, ...xs);
  const xstep = niceStep(xmax);
  const xend = Math.ceil(xmax / xstep) * xstep;
  const x = o.linearX ? (n: number) => L + (n / xend) * pw : (n: number) => L + ((Math.log10(n) - xlo) / (xhi - xlo)) * pw;
  let y: (v: number) => number;
  const yTicks: number[] = [];
  if (o.logY) {
    const lo = Math.floor(Math.log10(ys.length ? Math.min(...ys) : 1));
    const hi = Math.ceil(Math.log10(ys.length ? Math.max(...ys) : 10));
    const top = hi > lo ? hi : lo + 1;
    y = (v) => T + ph - ((Math.log10(v) - lo) / (top - lo)) * ph;
    for (let d = lo; d <= top; d++) yTicks.push(10 ** d);
  } else {
    const lo = Math.min(o.yMin ?? 0, ...ys);
    const ymaxRaw = Math.max(lo + 1e-9, ...ys) * 1.05;
    const mag = 10 ** Math.floor(Math.log10(ymaxRaw - lo));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => (ymaxRaw - lo) / s <= 6) ?? 10 * mag;
    const ymin = Math.floor(lo / step + 1e-9) * step;
    const ymax = Math.ceil(ymaxRaw / step) * step;
    y = (v) => T + ph - ((v - ymin) / (ymax - ymin)) * ph;
    for (let k = 0; ymin + k * step <= ymax + 1e-12; k++) yTicks.push(ymin + k * step);
  }
  const out: string[] = [];
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`);
  out.push(`<rect width="${W}" height="${H}" fill="white"/>`);
  out.push(`<text x="${L}" y="22" font-size="15" font-weight="bold">${esc(o.title)}</text>`);
  out.push(`<text x="${L}" y="40" fill="#555" font-size="11">${esc(o.subtitle)}</text>`);
  for (const v of yTicks) {
    const yy = y(v).toFixed(1);
    out.push(`<line x1="${L}" x2="${L + pw}" y1="${yy}" y2="${yy}" stroke="#e5e5e5"/>`);
    out.push(`<text x="${L - 6}" y="${(Number(yy) + 4).toFixed(1)}" text-anchor="end">${esc(fmt(v))}</text>`);
  }
  if (o.linearX) {
    for (let k = 0; k * xstep <= xend + 1e-9; k++) {
      const xx = x(k * xstep).toFixed(1);
      out.push(`<line x1="${xx}" x2="${xx}" y1="${T}" y2="${T + ph}" stroke="#e5e5e5"/>`);
      out.push(`<text x="${xx}" y="${T + ph + 16}" text-anchor="middle">${Number((k * xstep).toPrecision(6)).toLocaleString('en-US')}</text>`);
    }
  }
  for (let d = Math.ceil(xlo); !o.linearX && d <= Math.floor(xhi); d++) {
    for (const m of [1, 2, 5]) {
      const n = m * 10 ** d;
      if (Math.log10(n) < xlo || Math.log10(n) > xhi) continue;
      out.push(`<line x1="${x(n).toFixed(1)}" x2="${x(n).toFixed(1)}" y1="${T}" y2="${T + ph}" stroke="${m === 1 ? '#d0d0d0' : '#f0f0f0'}"/>`);
      out.push(`<text x="${x(n).toFixed(1)}" y="${T + ph + 16}" text-anchor="middle" fill="${m === 1 ? '#000' : '#888'}">${n.toLocaleString('en-US')}</text>`);
    }
  }
  out.push(`<rect x="${L}" y="${T}" width="${pw}" height="${ph}" fill="none" stroke="#333"/>`);
  out.push(`<text x="${L + pw / 2}" y="${H - 12}" text-anchor="middle">${esc(o.xLabel ?? 'services N (log scale)')}</text>`);
  out.push(`<text transform="translate(16 ${T + ph / 2}) rotate(-90)" text-anchor="middle">${esc(o.yLabel)}${o.logY ? ' (log scale)' : ''}</text>`);
  let ly = T + 8;
  for (const s of live) {
    const d = s.points.map((p, j) => `${j ? 'L' : 'M'}${x(p[0]).toFixed(1)} ${y(p[1]).toFixed(1)}`).join(' ');
    const dash = s.dash ? ' stroke-dasharray="6 4"' : '';
    out.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="2"${dash}/>`);
    for (const p of s.points) {
      out.push(`<circle cx="${x(p[0]).toFixed(1)}" cy="${y(p[1]).toFixed(1)}" r="3" fill="${s.color}"><title>${esc(`${s.label}: N=${p[0]}: ${fmt(p[1])}`)}</title></circle>`);
    }
    out.push(`<line x1="${L + pw + 12}" x2="${L + pw + 36}" y1="${ly}" y2="${ly}" stroke="${s.color}" stroke-width="2"${dash}/>`);
    const lines = wrap(s.label, 26);
    lines.forEach((line, k) => out.push(`<text x="${L + pw + 42}" y="${ly + 4 + 13 * k}">${esc(line)}</text>`));
    ly += 13 * lines.length + 10;
  }
  out.push('</svg>');
  return out.join('\n') + '\n';
}
