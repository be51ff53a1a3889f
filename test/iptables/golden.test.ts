// Every iptables case of the shared upstream conformance set, through the mode's adapter.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { findCases, loadCase } from '../../src/conformance/load.ts';
import { conformance } from '../../src/modes/iptables/index.ts';

const repoRoot = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const root = path.resolve(repoRoot, '../shared/conformance');
const cases = findCases([root]).map((d) => loadCase(d)).filter((c) => c.config.mode === 'iptables');

test('the shared conformance set has iptables golden, steps and flows cases', () => {
  const kinds = new Set(cases.map((c) => c.kind));
  for (const k of ['golden', 'steps', 'flows']) assert.ok(kinds.has(k as 'golden'), `no ${k} case under ${root}`);
});

for (const c of cases) {
  test(`conformance ${c.kind} ${c.name}`, async () => {
    const r = await conformance!.run(c);
    assert.ok(r.ok, r.detail);
  });
}

// Upstream TestSyncProxyRulesRepeated's later steps (delete, no endpoints, endpoint change),
// kept with the tests: the shared set has only its first two steps.
test('conformance steps: upstream TestSyncProxyRulesRepeated steps 1-7', async () => {
  const c = loadCase(path.join(repoRoot, 'test/iptables/cases/repeated'));
  assert.equal(c.steps?.length, 7);
  const r = await conformance!.run(c);
  assert.ok(r.ok, r.detail);
});
