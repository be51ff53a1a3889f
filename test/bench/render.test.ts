// The render bench (bench/render.ts): its arguments and suite entry, and one small run on the
// real kernel: `kproxy render` per mode as a child process, its payload restored raw into a
// namespace the bench creates and removes (names start with kpb-r<pid>).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { benchArgs } from '../../bench/index.ts';
import { parseRenderArgs, renderBench, table } from '../../bench/render.ts';

test('npm run bench: --only render runs bench/render.ts, 1,000 Services once with --quick, and writes render-{quick,full}.json', () => {
  const q = benchArgs('render', true, '/out', '/work');
  assert.equal(q.file, 'bench/render.ts');
  assert.deepEqual(q.args, ['--quick', '--json', '/out/render-quick.json']);
  assert.deepEqual(benchArgs('render', false, '/out', '/work').args, ['--json', '/out/render-full.json']);
  const quick = parseRenderArgs(['--quick']);
  assert.deepEqual([quick.n, quick.runs, quick.modes], [1000, 1, ['iptables', 'nftables']]);
  const full = parseRenderArgs([]);
  assert.deepEqual([full.n, full.runs, full.endpoints], [10000, 3, 5]);
  assert.throws(() => parseRenderArgs(['--modes', 'ipvs']), /KPROXY_BENCH_ARGS/);
  assert.throws(() => parseRenderArgs(['--runs', '0']), /KPROXY_BENCH_ARGS/);
});

test('renderBench: each mode\'s payload is rendered by the CLI, restored raw, and the ratio is render / raw', async () => {
  const rows = await renderBench({ n: 20, endpoints: 2, runs: 1, modes: ['iptables', 'nftables'], timeoutMs: 120_000, log: () => {} });
  assert.deepEqual(rows.map((r) => r.mode), ['iptables', 'nftables']);
  for (const r of rows) {
    assert.ok(r.renderMedianMs > 0 && Number.isFinite(r.rawMedianMs) && r.rawMedianMs > 0, JSON.stringify(r));
    assert.equal(r.ratio, r.renderMedianMs / r.rawMedianMs);
    assert.ok(r.hwmMedianKiB > 10_000, `peak RSS of a node process: ${r.hwmMedianKiB} KiB`);
    assert.ok(r.payloadLines > 20 * 3, `${r.payloadLines} lines for 20 Services`);
  }
  assert.match(table(rows), /\| iptables \| 20 \| .* \| iptables-restore /);
  assert.match(table(rows), /\| nftables \| 20 \| .* \| nft -f /);
  const left = execFileSync('ip', ['netns', 'list'], { encoding: 'utf8' });
  assert.doesNotMatch(left, new RegExp(`kpb-r${process.pid}-`), 'the bench removes its namespaces');
});
