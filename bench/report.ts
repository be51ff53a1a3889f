// Turns samples into medians, markdown tables (rows = sizes, columns = modes) and a
// hand-written SVG line plot. Pure: no I/O.
import type { Sample, Variant } from './measure.ts';

export interface Summary {
  n: number;
  mode: Variant;
  samples: number;
  /** samples whose first full sync failed; when all failed, error holds the first message */
  failures: number;
  error?: string;
  /** time until the failed full sync gave up (ms) */
  failedAfterMs?: number;
  renderMs: number;
  fullWallMs: number;
  fullWriteMs: number;
  fullOtherExecMs: number;
  fullInProcessMs: number;
  changeWallMs: number;
  changeWriteMs: number;
  changeInProcessMs: number;
  changeOtherExecMs: number;
  rulesTotal: number;
  changeRulesWritten: number;
  changePayloadBytes: number;
  rawFullApplyMs?: number;
  rawOneServiceApplyMs?: number;
  rawOneServiceRules?: number;
  kernelOK?: boolean;
}

export function median(xs: number[]): number {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
}

function medianOf<T>(items: T[], f: (t: T) => number | undefined): number | undefined {
  const xs = items.map(f).filter((x): x is number => x !== undefined && !Number.isNaN(x));
  return xs.length ? median(xs) : undefined;
}

export function summarize(samples: Sample[]): Summary[] {
  const groups = new Map<string, Sample[]>();
  for (const s of samples) {
    const k = `${s.n}\0${s.mode}`;
    if (!groups.has(k)) groups.set(k, []);
    groups.get(k)!.push(s);
  }
  const out: Summary[] = [];
  for (const all of groups.values()) {
    const bad = all.filter((s) => s.error);
    const g = all.length > bad.length ? all.filter((s) => !s.error) : all;
    const changes = g.flatMap((s) => s.changes);
    const kernel = g.filter((s) => s.kernel);
    out.push({
      n: g[0].n,
      mode: g[0].mode,
      samples: all.length,
      failures: bad.length,
      error: bad.length === all.length ? bad[0].error : undefined,
      failedAfterMs: bad.length ? median(bad.map((s) => s.full.wallMs)) : undefined,
      renderMs: median(g.map((s) => s.renderMs)),
      fullWallMs: median(g.map((s) => s.full.wallMs)),
      fullWriteMs: median(g.map((s) => s.full.writeMs)),
      fullOtherExecMs: median(g.map((s) => s.full.otherExecMs)),
      fullInProcessMs: median(g.map((s) => s.full.inProcessMs)),
      changeWallMs: median(changes.map((c) => c.wallMs)),
      changeWriteMs: median(changes.map((c) => c.writeMs)),
      changeInProcessMs: median(changes.map((c) => c.inProcessMs)),
      changeOtherExecMs: median(changes.map((c) => c.otherExecMs)),
      rulesTotal: median(g.map((s) => s.full.rulesTotal)),
      changeRulesWritten: median(changes.map((c) => c.rulesWritten)),
      changePayloadBytes: median(changes.map((c) => c.payloadBytes)),
      rawFullApplyMs: medianOf(g, (s) => s.raw?.fullApplyMs),
      rawOneServiceApplyMs: medianOf(g, (s) => s.raw?.oneServiceApplyMs),
      rawOneServiceRules: medianOf(g, (s) => s.raw?.oneServiceRules),
      kernelOK: kernel.length ? kernel.every((s) => s.kernel!.changesPresent) : undefined,
    });
  }
  return out.sort((a, b) => a.n - b.n || a.mode.localeCompare(b.mode));
}

export function fmtMs(v: number | undefined): string {
  if (v === Number.POSITIVE_INFINITY) return 'timeout';
  if (v === undefined || !Number.isFinite(v)) return '–';
  if (v >= 100) return String(Math.round(v));
  if (v >= 10) return v.toFixed(1);
  return v.toFixed(2);
}

function fmtInt(v: number | undefined): string {
  return v === undefined || !Number.isFinite(v) ? '–' : Math.round(v).toLocaleString('en-US');
}

function fmtPct(v: number | undefined): string {
  return v === undefined || !Number.isFinite(v) ? '–' : `${v < 10 ? v.toFixed(1) : Math.round(v)} %`;
}

function pct(part: number | undefined, whole: number | undefined): number | undefined {
  return part === undefined || whole === undefined || !(whole > 0) ? undefined : (100 * part) / whole;
}

/** A markdown table: one row per size, one column per mode. */
function table(title: string, sums: Summary[], modes: Variant[], cell: (s: Summary) => string, note = '', evenIfFailed = false): string {
  const sizes = [...new Set(sums.map((s) => s.n))].sort((a, b) => a - b);
  const lines = [`### ${title}`, ''];
  if (note) lines.push(note, '');
  lines.push(`| services (N) | ${modes.join(' | ')} |`, `|---:|${modes.map(() => '---:').join('|')}|`);
  for (const n of sizes) {
    const row = modes.map((m) => {
      const s = sums.find((x) => x.n === n && x.mode === m);
      if (!s) return '–';
      if (s.error && !evenIfFailed) return `sync failed after ${fmtMs(s.failedAfterMs)} ms`;
      return cell(s) + (s.failures ? ` (${s.failures}/${s.samples} failed)` : '');
    });
    lines.push(`| ${n.toLocaleString('en-US')} | ${row.join(' | ')} |`);
  }
  return lines.join('\n');
}

/** A markdown table with named columns. */
function freeTable(title: string, sizes: number[], cols: Array<[string, (n: number) => string]>, note = ''): string {
  const lines = [`### ${title}`, ''];
  if (note) lines.push(note, '');
  lines.push(`| services (N) | ${cols.map((c) => c[0]).join(' | ')} |`, `|---:|${cols.map(() => '---:').join('|')}|`);
  for (const n of sizes) lines.push(`| ${n.toLocaleString('en-US')} | ${cols.map((c) => c[1](n)).join(' | ')} |`);
  return lines.join('\n');
}

export function markdownTables(sums: Summary[], modes: Variant[]): string {
  const get = (n: number, m: Variant) => sums.find((s) => s.n === n && s.mode === m);
  const sizes = [...new Set(sums.map((s) => s.n))].sort((a, b) => a - b);
  const parts = [
    table('Render (ms): mode.render(state), pure, full state → text', sums, modes, (s) => fmtMs(s.renderMs), '', true),
    table('First full sync (ms): Proxier.sync(all services, full=true) into an empty namespace', sums, modes, (s) => fmtMs(s.fullWallMs)),
    table('First full sync, split (ms): rule write / other commands / kproxy in-process', sums, modes,
      (s) => `${fmtMs(s.fullWriteMs)} / ${fmtMs(s.fullOtherExecMs)} / ${fmtMs(s.fullInProcessMs)}`,
      'rule write = iptables-restore or nft -f; other commands = probes, iptables -C/-I of the jump rules, iptables-save, nft list; in-process = wall − commands (planning: render + diff).'),
    table('One-service change (ms): one endpoint added to one service, Proxier.sync({that service}, full=false)', sums, modes, (s) => fmtMs(s.changeWallMs)),
    table('One-service change, split (ms): rule write / other commands / kproxy in-process', sums, modes,
      (s) => `${fmtMs(s.changeWriteMs)} / ${fmtMs(s.changeOtherExecMs)} / ${fmtMs(s.changeInProcessMs)}`),
    table('Rules / objects installed (SyncStats.rulesTotal)', sums, modes, (s) => fmtInt(s.rulesTotal),
      'iptables: nat rules; nftables: chains + rules + set/map elements. Not the same unit across modes.'),
    table('Rules / objects written by the one-service change (SyncStats.rulesWritten)', sums, modes,
      (s) => `${fmtInt(s.changeRulesWritten)} (${fmtInt(s.changePayloadBytes / 1024)} KiB)`),
  ];
  const cols: Array<[string, (n: number) => string]> = [];
  for (const v of modes.filter((m) => m === 'iptables' || m === 'iptables-legacy')) {
    const bin = v === 'iptables' ? 'iptables-restore' : 'iptables-legacy-restore';
    cols.push([`${bin}, full payload`, (n) => fmtMs(get(n, v)?.rawFullApplyMs)]);
    cols.push([`${bin}, one service's chains`, (n) => {
      const s = get(n, v);
      return s?.rawOneServiceApplyMs === undefined ? '–' : `${fmtMs(s.rawOneServiceApplyMs)} (${fmtInt(s.rawOneServiceRules)} rules)`;
    }]);
  }
  if (modes.includes('nftables')) cols.push(['nft -f, full payload', (n) => fmtMs(get(n, 'nftables')?.rawFullApplyMs)]);
  if (cols.length) {
    parts.push(freeTable('Raw references (ms): the binaries run directly on the rendered payload', sizes, cols,
      'Full payload (--noflush) into an empty namespace (as the first sync); one service\'s chains (its KUBE-SVC, KUBE-EXT and KUBE-SEP chains, --noflush) into the namespace already holding all N services. "timeout" = did not finish within the raw-apply limit.'));
  }
  parts.push(table("kproxy's own time as % of the rule write", sums, modes, (s) =>
    `full: ${fmtPct(pct(s.fullInProcessMs, s.fullWriteMs))}; render/raw: ${fmtPct(pct(s.renderMs, s.rawFullApplyMs))}; change: ${fmtPct(pct(s.changeInProcessMs, s.changeWriteMs))}`,
    'full = in-process time of the full sync / its restore (nft -f) time; render/raw = mode.render time / raw apply of the full payload; change = in-process / write time of the one-service change.'));
  return parts.join('\n\n');
}

export interface GoalResult {
  goal: string;
  measured: string;
  met: boolean | undefined;
}

/** The scale goals for iptables mode, judged at the largest and smallest sizes measured. */
export function iptablesGoals(sums: Summary[], variant: Variant = 'iptables'): GoalResult[] {
  const ipt = sums.filter((s) => s.mode === variant).sort((a, b) => a.n - b.n);
  if (!ipt.length) return [];
  const small = ipt[0];
  // The goals are stated for the largest size of the run; a variant given up earlier is judged by its failure.
  const targetN = Math.max(...sums.map((s) => s.n));
  const big = ipt.find((s) => s.n === targetN) ?? ipt[ipt.length - 1];
  const N = targetN.toLocaleString('en-US');
  const label = `${variant}: `;
  if (big.error) {
    const at = big.n === targetN ? '' : ` (already at ${big.n.toLocaleString('en-US')} services; ${N} was not tried)`;
    const why = `the first full sync failed after ${fmtMs(big.failedAfterMs)} ms${at}: ${big.error.slice(0, 90)}, so no change could be applied`;
    return [
      { goal: `${label}kproxy's own render + diff at ${N} services ≤ 10 % of the restore time`, measured: `render ${fmtMs(big.renderMs)} ms; ${why}`, met: false },
      { goal: `${label}one-service change applied in ≤ 0.4 s at ${N} services`, measured: why, met: false },
      { goal: `${label}one-service change at ${N} ≤ 3× its time at ${small.n.toLocaleString('en-US')} services`, measured: why, met: false },
    ];
  }
  const fullPct = pct(big.fullInProcessMs, big.fullWriteMs);
  const renderPct = pct(big.renderMs, big.rawFullApplyMs);
  const ratio = big.changeWallMs / small.changeWallMs;
  return [
    {
      goal: `${label}kproxy's own render + diff at ${N} services ≤ 10 % of the restore time`,
      measured: `full sync in-process ${fmtMs(big.fullInProcessMs)} ms = ${fmtPct(fullPct)} of its restore (${fmtMs(big.fullWriteMs)} ms); mode.render ${fmtMs(big.renderMs)} ms = ${fmtPct(renderPct)} of a raw full restore (${fmtMs(big.rawFullApplyMs)} ms); one-service change in-process ${fmtMs(big.changeInProcessMs)} ms = ${fmtPct(pct(big.changeInProcessMs, big.changeWriteMs))} of its restore`,
      met: fullPct === undefined ? undefined : fullPct <= 10,
    },
    {
      goal: `${label}one-service change applied in ≤ 0.4 s at ${N} services`,
      measured: `${fmtMs(big.changeWallMs)} ms`,
      met: big.changeWallMs <= 400,
    },
    {
      goal: `${label}one-service change at ${N} ≤ 3× its time at ${small.n.toLocaleString('en-US')} services`,
      measured: `${fmtMs(big.changeWallMs)} ms / ${fmtMs(small.changeWallMs)} ms = ${ratio.toFixed(2)}×`,
      met: big.n === small.n ? undefined : ratio <= 3,
    },
  ];
}

export function goalsTable(goals: GoalResult[]): string {
  if (!goals.length) return '';
  const lines = ['### Goals (iptables mode; judged at the largest and smallest N of this run)', '', '| goal | measured | met |', '|---|---|:---:|'];
  for (const g of goals) lines.push(`| ${g.goal} | ${g.measured} | ${g.met === undefined ? 'n/a' : g.met ? 'yes' : 'NO'} |`);
  return lines.join('\n');
}

const COLORS: Record<string, string> = { iptables: '#d62728', 'iptables-legacy': '#ff7f0e', nftables: '#1f77b4', ipvs: '#2ca02c', userspace: '#9467bd' };

function niceStep(max: number): number {
  const raw = max / 5;
  const p = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  for (const word of text.split(' ')) {
    const last = lines[lines.length - 1];
    if (last !== undefined && (last + ' ' + word).length <= width) lines[lines.length - 1] = `${last} ${word}`;
    else lines.push(word);
  }
  return lines;
}

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
}

/**
 * One-service-change latency vs N: a line per mode (log-x), plus the raw iptables-restore of
 * one service's chains as a dashed reference. Hand-written SVG, no dependencies.
 */
export function oneServiceChangeSVG(sums: Summary[], modes: Variant[], subtitle: string): string {
  const W = 760, H = 440, L = 70, R = 190, T = 56, B = 56;
  const pw = W - L - R, ph = H - T - B;
  const sizes = [...new Set(sums.map((s) => s.n))].sort((a, b) => a - b);
  const series: Array<{ label: string; color: string; dash: boolean; pts: Array<[number, number]> }> = [];
  for (const m of modes) {
    const pts = sizes.flatMap((n) => {
      const s = sums.find((x) => x.n === n && x.mode === m);
      return s && Number.isFinite(s.changeWallMs) ? [[n, s.changeWallMs] as [number, number]] : [];
    });
    const failedAt = sums.filter((x) => x.mode === m && x.error).map((x) => x.n);
    const suffix = failedAt.length ? ` (full sync failed at N=${Math.min(...failedAt).toLocaleString('en-US')})` : '';
    if (pts.length) series.push({ label: `${m} (kproxy sync)${suffix}`, color: COLORS[m] ?? '#333', dash: false, pts });
  }
  const rawPts = sizes.flatMap((n) => {
    const v = sums.find((x) => x.n === n && x.mode === 'iptables')?.rawOneServiceApplyMs;
    return v === undefined || !Number.isFinite(v) ? [] : [[n, v] as [number, number]];
  });
  if (rawPts.length) series.push({ label: "raw iptables-restore of one service's chains", color: '#7f7f7f', dash: true, pts: rawPts });

  const xs = sizes.length ? sizes : [1, 10];
  let lo = Math.log10(Math.min(...xs)), hi = Math.log10(Math.max(...xs));
  if (hi - lo < 1) { lo -= 0.5; hi += 0.5; }
  lo -= 0.1; hi += 0.1;
  const ymaxRaw = Math.max(1, ...series.flatMap((s) => s.pts.map((p) => p[1])));
  const step = niceStep(ymaxRaw * 1.05);
  const ymax = Math.ceil((ymaxRaw * 1.05) / step) * step;
  const x = (n: number) => L + ((Math.log10(n) - lo) / (hi - lo)) * pw;
  const y = (v: number) => T + ph - (v / ymax) * ph;

  const out: string[] = [];
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`);
  out.push(`<rect width="${W}" height="${H}" fill="white"/>`);
  out.push(`<text x="${L}" y="22" font-size="15" font-weight="bold">One-service change latency vs number of services</text>`);
  out.push(`<text x="${L}" y="40" fill="#555">${esc(subtitle)}</text>`);
  for (let v = 0; v <= ymax + 1e-9; v += step) {
    out.push(`<line x1="${L}" x2="${L + pw}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="#e5e5e5"/>`);
    out.push(`<text x="${L - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end">${fmtMs(v)}</text>`);
  }
  for (let d = Math.ceil(lo); d <= Math.floor(hi); d++) {
    for (const m of [1, 2, 5]) {
      const n = m * 10 ** d;
      if (Math.log10(n) < lo || Math.log10(n) > hi) continue;
      out.push(`<line x1="${x(n).toFixed(1)}" x2="${x(n).toFixed(1)}" y1="${T}" y2="${T + ph}" stroke="${m === 1 ? '#d0d0d0' : '#f0f0f0'}"/>`);
      out.push(`<text x="${x(n).toFixed(1)}" y="${T + ph + 16}" text-anchor="middle" fill="${m === 1 ? '#000' : '#888'}">${n.toLocaleString('en-US')}</text>`);
    }
  }
  out.push(`<rect x="${L}" y="${T}" width="${pw}" height="${ph}" fill="none" stroke="#333"/>`);
  out.push(`<text x="${L + pw / 2}" y="${H - 12}" text-anchor="middle">services N (log scale), ClusterIP + NodePort each</text>`);
  out.push(`<text transform="translate(18 ${T + ph / 2}) rotate(-90)" text-anchor="middle">median latency (ms)</text>`);
  series.forEach((s, i) => {
    const d = s.pts.map((p, j) => `${j ? 'L' : 'M'}${x(p[0]).toFixed(1)} ${y(p[1]).toFixed(1)}`).join(' ');
    out.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="2.2"${s.dash ? ' stroke-dasharray="6 4"' : ''}/>`);
    for (const p of s.pts) {
      out.push(`<circle cx="${x(p[0]).toFixed(1)}" cy="${y(p[1]).toFixed(1)}" r="3.5" fill="${s.color}"/>`);
      out.push(`<text x="${(x(p[0]) + 6).toFixed(1)}" y="${(y(p[1]) - 6).toFixed(1)}" fill="${s.color}" font-size="11">${fmtMs(p[1])}</text>`);
    }
    const ly = T + 10 + i * 62;
    out.push(`<line x1="${L + pw + 14}" x2="${L + pw + 40}" y1="${ly}" y2="${ly}" stroke="${s.color}" stroke-width="2.2"${s.dash ? ' stroke-dasharray="6 4"' : ''}/>`);
    wrap(s.label, 22).forEach((line, k) => out.push(`<text x="${L + pw + 46}" y="${ly + 4 + 14 * k}">${esc(line)}</text>`));
  });
  out.push('</svg>');
  return out.join('\n') + '\n';
}
