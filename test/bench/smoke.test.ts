// A tiny run of the benchmark harness (N=10, one repetition) on the real kernel, inside
// kpb-* namespaces it creates and deletes: it must produce tables with sane numbers, raw
// JSON and the SVG plot, and leave no namespace behind.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { hostRunner } from '../../src/kernel/runner.ts';
import { getMode } from '../../src/modes/registry.ts';
import { changedServiceIndexes, oneServicePayload } from '../../bench/measure.ts';
import { runBench } from '../../bench/run.ts';
import { benchConfig, clusterIPOf, MAX_NODE_PORT_SERVICES, MAX_SERVICES, serviceObject, Workload } from '../../bench/workload.ts';

test('one-service payload holds exactly that service\'s chains', () => {
  const w = new Workload(3, 2, benchConfig('iptables'));
  const { payload, rules } = oneServicePayload(getMode('iptables').render(w.input()), clusterIPOf(1));
  const lines = payload.trim().split('\n');
  assert.equal(lines[0], '*nat');
  assert.equal(lines[lines.length - 1], 'COMMIT');
  // SVC (masq + 2 endpoint jumps), EXT (2), 2 SEPs (2 each)
  assert.equal(rules, 9);
  assert.ok(lines.filter((l) => l.startsWith('-A')).every((l) => /^-A KUBE-(SVC|EXT|SEP)-/.test(l)));
  assert.ok(payload.includes('172.30.0.2'));
  assert.ok(!payload.includes('172.30.0.1 '), 'no rule of another service');
});

test('the workload goes past the node ports: NodePort Services up to 35,535, ClusterIP only after (50,000 in the full scale run)', () => {
  const last = serviceObject(MAX_NODE_PORT_SERVICES - 1);
  assert.equal(last.spec!.type, 'NodePort');
  assert.equal(last.spec!.ports![0].nodePort, 65_534);
  const past = serviceObject(MAX_NODE_PORT_SERVICES);
  assert.equal(past.spec!.type, 'ClusterIP');
  assert.equal(past.spec!.ports![0].nodePort, undefined);
  assert.equal(past.spec!.ports![0].port, 80);
  const w = new Workload(MAX_NODE_PORT_SERVICES + 10, 1, benchConfig('iptables'));
  assert.equal(w.serviceKeys.size, MAX_NODE_PORT_SERVICES + 10, 'every Service accepted by the tracker');
  assert.throws(() => new Workload(MAX_SERVICES + 1, 1, benchConfig('iptables')), /KPROXY_BENCH_SIZE/);
});

test('changed services are distinct and in range', () => {
  const idx = changedServiceIndexes(10, 3, 2);
  assert.equal(new Set(idx).size, idx.length);
  assert.ok(idx.every((i) => i >= 0 && i < 10));
});

test('bench harness at N=10 prints tables with sane numbers', { timeout: 30_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kpb-smoke-'));
  try {
    const svgPath = join(dir, 'plot.svg');
    const r = await runBench({
      sizes: [10], endpoints: 3, modes: ['iptables', 'nftables'], repeat: 1, changes: 1, outDir: dir, svgPath,
      maxMinutes: 1, raw: true, rawTimeoutS: 20, execTimeoutS: 0, verify: true, log: () => {},
    });
    assert.equal(r.summary.length, 2);
    for (const s of r.summary) {
      assert.equal(s.error, undefined, `${s.mode}: ${s.error}`);
      assert.ok(s.renderMs > 0 && s.renderMs < 5_000, `${s.mode} render ${s.renderMs}`);
      assert.ok(s.fullWallMs > 0 && s.fullWallMs < 20_000, `${s.mode} full ${s.fullWallMs}`);
      assert.ok(s.fullWriteMs > 0 && s.fullWriteMs <= s.fullWallMs);
      assert.ok(s.changeWallMs > 0 && s.changeWallMs < 10_000, `${s.mode} change ${s.changeWallMs}`);
      assert.ok(s.rulesTotal >= 10 * 3, `${s.mode} rules ${s.rulesTotal}`);
      assert.ok(s.changeRulesWritten > 0 && s.changeRulesWritten < s.rulesTotal, `${s.mode} written ${s.changeRulesWritten}`);
      assert.equal(s.kernelOK, true, `${s.mode}: the change did not reach the kernel`);
      assert.ok(s.rawFullApplyMs! > 0 && Number.isFinite(s.rawFullApplyMs));
    }
    const ipt = r.summary.find((s) => s.mode === 'iptables')!;
    assert.ok(ipt.rawOneServiceApplyMs! > 0 && ipt.rawOneServiceRules! > 0);
    assert.match(r.markdown, /### One-service change \(ms\)/);
    assert.match(r.markdown, /\| services \(N\) \| iptables \| nftables \|/);
    assert.match(r.markdown, /\| 10 \| [0-9.]+ \| [0-9.]+ \|/);
    assert.equal(r.goals.length, 3);
    const json = JSON.parse(readFileSync(r.jsonPath, 'utf8')) as { samples: unknown[] };
    assert.equal(json.samples.length, 2);
    const svg = readFileSync(svgPath, 'utf8');
    assert.match(svg, /^<svg [^>]*xmlns="http:\/\/www.w3.org\/2000\/svg"/);
    assert.equal((svg.match(/<path /g) ?? []).length, 3, 'one line per mode plus the raw restore reference');
    const left = await hostRunner.run('ip', ['netns', 'list']);
    assert.ok(!left.stdout.split('\n').some((l) => l.startsWith(`kpb-${process.pid}-`)), 'namespaces left behind');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
  assert.ok(!existsSync(dir));
});
