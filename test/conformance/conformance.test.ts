// Runs the generic conformance runner over every case in ../shared/conformance whose mode is
// built, and checks the runner itself: unknown modes fail, the closing line is exact.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, writeFileSync, rmSync, cpSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { execFileSync } from 'node:child_process';
import { findCases, loadCase } from '../../src/conformance/load.ts';
import { runConformance } from '../../src/conformance/runner.ts';
import { conformanceAdapters } from '../../src/modes/registry.ts';

const repo = resolve(import.meta.dirname, '../..');
const shared = resolve(repo, '../shared/conformance');
const own = resolve(repo, 'conformance');

test('every shared case of a built mode passes', async () => {
  const all = findCases([shared]);
  assert.ok(all.length >= 10, `expected the shared cases, found ${all.length}`);
  const built = all.filter((d) => conformanceAdapters[loadCase(d).config.mode]);
  const lines: string[] = [];
  const res = await runConformance(built.length ? built : [], conformanceAdapters, (l) => lines.push(l));
  if (built.length === 0) return assert.fail('no mode with a conformance adapter is built');
  assert.equal(res.failed, 0, lines.join('\n'));
  assert.equal(res.passed, built.length);
  assert.equal(lines.at(-1), `${built.length} passed, 0 failed`);
});

test("kproxy's own cases (static rulesets of upstream's TestTracePacket tests) pass, and `kproxy conformance` runs them by default", () => {
  const cases = findCases([own]).map((d) => loadCase(d));
  const statics = cases.filter((c) => c.rules);
  assert.deepEqual(statics.map((c) => `${c.name} ${c.rules!.format}`).sort(), [
    'iptables-TestTracePacket iptables-save',
    'nftables-TestTracePacketV4 nft',
    'nftables-TestTracePacketV6 nft',
  ]);
  for (const c of statics) assert.deepEqual(c.objects, [], `${c.name}: a static case holds no objects`);
  const out = execFileSync(process.execPath, [join(repo, 'bin/kproxy.js'), 'conformance'], { encoding: 'utf8' });
  const lines = out.trim().split('\n');
  assert.equal(lines.at(-1), `${cases.length} passed, 0 failed`);
  for (const c of statics) assert.match(lines.find((l) => l.includes(`/${c.name} `)) ?? '', /^PASS .*judged by flows through the static (iptables-save|nft) ruleset/);
});

test('a static-ruleset case fails on a wrong expectation and on a line its fake would refuse', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kp-conf-'));
  try {
    for (const name of ['iptables-TestTracePacket', 'nftables-TestTracePacketV4']) {
      const src = join(own, 'flows', name);
      const flows = loadCase(src).flows!;
      // the expectation of one flow changed: the case fails, naming the flow
      cpSync(src, join(dir, 'wrong', name), { recursive: true });
      writeFileSync(join(dir, 'wrong', name, 'flows.json'), JSON.stringify(flows.map((f) => (f.name === 'single endpoint' ? { ...f, output: '10.180.0.9:80' } : f))));
      // one line of the ruleset garbled: the case fails, naming the line
      cpSync(src, join(dir, 'garbled', name), { recursive: true });
      const rulesFile = name.startsWith('iptables') ? 'rules.iptables-save' : 'rules.nft';
      const text = loadCase(src).rules!.text.split('\n');
      text.splice(3, 0, 'this is not a rule');
      writeFileSync(join(dir, 'garbled', name, rulesFile), text.join('\n'));
    }
    const wrong = await runConformance([join(dir, 'wrong')], conformanceAdapters);
    assert.equal(wrong.failed, 2, wrong.lines.join('\n'));
    assert.equal(wrong.lines.filter((l) => /flow "single endpoint"/.test(l)).length, 2, wrong.lines.join('\n'));
    const garbled = await runConformance([join(dir, 'garbled')], conformanceAdapters);
    assert.equal(garbled.failed, 2, garbled.lines.join('\n'));
    assert.equal(garbled.lines.filter((l) => /line 4: .*this is not a rule/.test(l)).length, 2, garbled.lines.join('\n'));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a case for a mode that is not built fails, never passes', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kp-conf-'));
  try {
    mkdirSync(join(dir, 'c1'));
    writeFileSync(join(dir, 'c1', 'config.json'), JSON.stringify({ mode: 'bogus-mode', nodeName: 'n' }));
    writeFileSync(join(dir, 'c1', 'input.yaml'), '');
    writeFileSync(join(dir, 'c1', 'expected.txt'), '');
    const res = await runConformance([dir], conformanceAdapters);
    assert.equal(res.passed, 0);
    assert.equal(res.failed, 1);
    assert.match(res.lines.join('\n'), /not built/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('an empty directory is a failure, not a silent pass', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'kp-conf-'));
  try {
    const res = await runConformance([dir], conformanceAdapters);
    assert.equal(res.failed, 1);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('kproxy conformance exits non-zero on a failed case and prints the closing line', () => {
  const dir = mkdtempSync(join(tmpdir(), 'kp-conf-'));
  try {
    // Copy a real case and break its expectation: the runner must notice.
    const golden = findCases([shared]).find((d) => {
      const c = loadCase(d);
      return c.kind === 'golden' && conformanceAdapters[c.config.mode];
    });
    if (!golden) return assert.fail('no golden case of a built mode');
    cpSync(golden, join(dir, 'broken'), { recursive: true });
    writeFileSync(join(dir, 'broken', 'expected.txt'), '*nat\n:KUBE-NOPE - [0:0]\nCOMMIT\n');
    let out = '';
    let code = 0;
    try {
      out = execFileSync(process.execPath, [join(repo, 'bin/kproxy.js'), 'conformance', dir], { encoding: 'utf8' });
    } catch (e) {
      const err = e as { status: number; stdout: string };
      code = err.status;
      out = err.stdout;
    }
    assert.equal(code, 1);
    assert.match(out, /^FAIL /m);
    assert.equal(out.trim().split('\n').at(-1), '0 passed, 1 failed');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('kproxy conformance --nft-shards 2,3 runs the flows and nftables cases through the sharded tables too', () => {
  const out = execFileSync(process.execPath, [join(repo, 'bin/kproxy.js'), 'conformance', '--nft-shards', '2,3', shared], { encoding: 'utf8' });
  const lines = out.trim().split('\n');
  const all = findCases([shared]).map((d) => loadCase(d));
  assert.equal(lines.at(-1), `${all.length} passed, 0 failed`);
  const sharded = all.filter((c) => c.kind === 'flows' || c.config.mode === 'nftables');
  assert.ok(sharded.length >= 8);
  for (const c of sharded) {
    const line = lines.find((l) => l.startsWith('PASS ') && l.includes(`/${c.name} `));
    assert.match(line ?? `no line for ${c.name}`, /and through nftables over K=2,3 tables \(7 spreads, \d+ packets\)/);
  }
  // a broken flow fails, naming the spread
  const dir = mkdtempSync(join(tmpdir(), 'kp-conf-'));
  try {
    const src = findCases([shared]).find((d) => loadCase(d).name === 'nftables-TestClusterIPGeneral')!;
    cpSync(src, join(dir, 'c'), { recursive: true });
    const flows = loadCase(src).flows!.map((f) => (f.name === 'packet to unallocated cluster ip' ? { ...f, output: 'REJECT' } : f));
    writeFileSync(join(dir, 'c', 'flows.json'), JSON.stringify(flows));
    let text = '';
    try {
      execFileSync(process.execPath, [join(repo, 'bin/kproxy.js'), 'conformance', '--nft-shards', '2', dir], { encoding: 'utf8' });
      assert.fail('a broken case passed');
    } catch (e) {
      text = (e as { stdout: string }).stdout;
    }
    assert.match(text, /K=2 rotation 0: flow "packet to unallocated cluster ip" .* want "REJECT" masq=false, got "DROP"/);
    assert.equal(text.trim().split('\n').at(-1), '0 passed, 1 failed');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
