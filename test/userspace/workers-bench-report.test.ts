// bench/userspace-workers.ts's report: the table's ratios to 1 worker, per-CPU-second
// columns, '–' where a figure does not apply, and the SVG's bars (no process, no network).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { workersMarkdown, workersSvg, type WorkersReport } from '../../bench/userspace-workers.ts';

const report: WorkersReport = {
  date: '2026-12-03T14:00:00Z', host: { cpus: 2, node: 'v20', kernel: '6' }, durationS: 3, repeat: 3, loadBefore: '1 1 1', loadAfter: '2 2 2',
  variants: [
    { key: 'direct', name: 'direct', workers: 0, maxConnections: 0, runs: [{ connPerSec: 5000, keepAliveRps: 20000, load1: 1 }] },
    { key: 'w1', name: 'kproxy, 1 worker', workers: 1, maxConnections: 0, runs: [900, 1000, 1100].map((c) => ({ connPerSec: c, keepAliveRps: 10 * c, load1: 1, connPerCpuSec: 3000, keepAlivePerCpuSec: 30000 })) },
    { key: 'w2', name: 'kproxy, 2 workers', workers: 2, maxConnections: 0, runs: [1500, 1600, 9000].map((c) => ({ connPerSec: c, keepAliveRps: 10 * c, load1: 2, connPerCpuSec: 2800, keepAlivePerCpuSec: 29000 })) },
    { key: 'w3', name: 'kproxy, 3 workers', workers: 3, maxConnections: 0, runs: [], error: 'cannot start' },
  ],
};

test('workers bench table: medians, × 1 worker, per CPU-second, failed variants marked', () => {
  const rows = workersMarkdown(report).split('\n');
  assert.equal(rows.length, 2 + 4);
  assert.equal(rows[2], '| direct | 5,000 | – | – | 20,000 | – | – | 1 | 1.00 |');
  assert.equal(rows[3], '| kproxy, 1 worker | 1,000 | 1.00× | 3,000 | 10,000 | 1.00× | 30,000 | 3 | 1.00 |');
  // the median, not the mean: one outlier run (9,000) does not move it
  assert.equal(rows[4], '| kproxy, 2 workers | 1,600 | 1.60× | 2,800 | 16,000 | 1.60× | 29,000 | 3 | 2.00 |');
  assert.equal(rows[5], '| kproxy, 3 workers (failed) | n/a | – | – | n/a | – | – | 0 | n/a |');
});

test('workers bench SVG: four panels, one bar per variant, the load in the subtitle', () => {
  const svg = workersSvg(report);
  assert.equal((svg.match(/<rect x="260"/g) ?? []).length, 4 * 4);
  assert.match(svg, /load 1 1 1 → 2 2 2/);
  assert.match(svg, />1,600</);
});
